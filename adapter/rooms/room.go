package rooms

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"agentmesh.dev/mesh/adapter/node"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// Create makes a room: builds and signs its descriptor, provisions it when
// it is durable (the mesh keeps its record, drive and board), remembers it,
// and posts its genesis message.
func (c *Client) Create(ctx context.Context, spec NewRoom) (Held, error) {
	r, err := NewDescriptor(c.cfg.Key, spec, c.cfg.Now())
	if err != nil {
		return Held{}, err
	}
	if r.Durable() {
		if err := c.roomCall(ctx, protocol.RoomVerbSubject("provision"), r, nil, nil); err != nil {
			return Held{}, fmt.Errorf("provision the room: %w", err)
		}
	}
	h, err := c.cfg.Store.Add(r, RoleCreator, "", "")
	if err != nil {
		return Held{}, err
	}
	// The genesis message opens the record; the room exists without it,
	// so a failure is reported but does not undo the room.
	if _, err := c.post(ctx, r, r.FirstChannel(), map[string]any{"type": "genesis", "descriptor": json.RawMessage(r.Raw)}); err != nil {
		return h, fmt.Errorf("room %s was created, but its genesis message was not posted: %w", r.RoomID, err)
	}
	if err := c.cfg.Store.MarkJoined(r.RoomID); err != nil {
		return h, err
	}
	h.Joined = true
	return h, nil
}

// InviteOffering is the reserved offering an invite is sent to.
const InviteOffering = node.OfferingRoomsInvite

// InviteInput is the input of a rooms.invite request (upstream-notes §7).
type InviteInput struct {
	Rooms      string          `json:"rooms"`
	Descriptor json.RawMessage `json:"descriptor"`
	Token      string          `json:"token"`
	SealedKey  json.RawMessage `json:"sealed_key"`
	Note       *string         `json:"note"`
}

// Invited is the outcome of an invite.
type Invited struct {
	RoomID string `json:"room_id"`
	To     string `json:"to"`
	// Queued: the invitee's inbox held the invite (it screens its
	// messages) and answered with a queued acknowledgement.
	Queued bool `json:"queued,omitempty"`
	// NoAnswer: nothing answered within InviteTimeout. A live runtime
	// answers an invite at once, so the invitee's adapter is not running;
	// its mailbox keeps the invite, and its answer, when it runs, is
	// recognised (Store.TakeInvite).
	NoAnswer bool `json:"no_answer,omitempty"`
}

// InviteTimeout is how long Invite waits for the invitee's answer: its
// runtime answers an invite itself, without a person, so a running
// invitee answers in far less.
const InviteTimeout = 10 * time.Second

// Invite sends agent the room: an acl room admits it first (creator only),
// then a pairwise rooms.invite request carries the descriptor and its
// token, with context_id the room id. A queued acknowledgement counts as
// success.
func (c *Client) Invite(ctx context.Context, ref, agent, note string) (Invited, error) {
	if c.cfg.Agent == nil {
		return Invited{}, errs.New(errs.Unavailable, "this client has no hosted agent to send invites with")
	}
	if !keys.IsUserPublicKey(agent) {
		return Invited{}, errs.Newf(errs.InputInvalid, "%q is not an agent id", agent)
	}
	_, r, err := c.room(ref)
	if err != nil {
		return Invited{}, err
	}
	if r.ACL() {
		if err := c.roomCall(ctx, protocol.RoomVerbSubject("admit"), r, map[string]any{"agent_id": agent}, nil); err != nil {
			return Invited{}, fmt.Errorf("admit %s to the room: %w", agent, err)
		}
	}
	in := InviteInput{Rooms: "v1", Descriptor: r.Raw, Token: r.Token(), SealedKey: json.RawMessage("null")}
	if note != "" {
		in.Note = &note
	}
	// Noted before it is sent: its answer may come after Request gave up,
	// even after a restart.
	id := protocol.NewID()
	if err := c.cfg.Store.NoteInvite(SentInvite{ID: id, To: agent, RoomID: r.RoomID, At: protocol.FormatTime(c.cfg.Now())}); err != nil {
		return Invited{}, fmt.Errorf("nothing was sent: %w", err)
	}
	out := Invited{RoomID: r.RoomID, To: agent}
	res, err := c.cfg.Agent.Request(ctx, agent, InviteOffering, in, node.RequestOptions{ContextID: r.RoomID, Timeout: min(InviteTimeout, c.cfg.Timeout), ID: id})
	switch {
	case errs.CodeOf(err) == errs.TransportTimeout && res == nil:
		out.NoAnswer = true
		return out, nil
	case res != nil && res.Queued:
		// The answer, if the person behind a screened inbox lets it
		// through, comes later.
		out.Queued = true
		return out, nil
	}
	if _, _, terr := c.cfg.Store.TakeInvite(id, agent); terr != nil {
		c.log.Warn("an answered invite stays noted", "err", terr)
	}
	if err != nil {
		return Invited{}, fmt.Errorf("invite %s: %w", agent, err)
	}
	return out, nil
}

// InviteAnswer recognises a late answer to an invite this agent sent (the
// invitee's runtime took it from its mailbox): it returns the invite and
// forgets it. Anything else is not an invite's answer (ok false).
func (c *Client) InviteAnswer(r *node.Result) (inv SentInvite, ok bool) {
	inv, ok, err := c.cfg.Store.TakeInvite(r.RequestID, r.From)
	if err != nil {
		c.log.Warn("the invites sent could not be read", "err", err)
	}
	return inv, ok
}

// AcceptInvite answers the reserved rooms.invite offering for the runtime
// (node.AgentConfig.RoomInvite): the descriptor must verify (and its token,
// when both come, must be the same room), and the room is remembered as
// one this agent is a member of. Nothing is posted to the room.
func (s *Store) AcceptInvite(_ context.Context, call *node.Call) (any, error) {
	var p struct {
		Input json.RawMessage `json:"input"`
	}
	if err := call.Env.DecodePayload(&p); err != nil {
		return nil, errs.Wrap(errs.InputInvalid, "the invite's payload is not readable", err)
	}
	r, note, err := ParseInvite(p.Input, call.Env.ContextID)
	if err != nil {
		return nil, err
	}
	h, err := s.Add(r, RoleMember, call.Env.From, note)
	if err != nil {
		return nil, err
	}
	return map[string]any{"accepted": true, "room_id": h.RoomID}, nil
}

// ParseInvite reads a rooms.invite input (untrusted: anyone may send one)
// and returns the room it offers and the inviter's note. contextID is the
// envelope's context_id, which names the room when set.
func ParseInvite(input []byte, contextID string) (Room, string, error) {
	var in InviteInput
	if err := json.Unmarshal(input, &in); err != nil {
		return Room{}, "", errs.Wrap(errs.InputInvalid, "the invite's input does not have the rooms.invite shape", err)
	}
	if in.Rooms != "v1" {
		return Room{}, "", errs.Newf(errs.InputInvalid, "invite rooms is %q; this agent reads \"v1\"", in.Rooms)
	}
	hasDescriptor := len(in.Descriptor) > 0 && string(in.Descriptor) != "null"
	raw := []byte(in.Descriptor)
	if !hasDescriptor {
		if in.Token == "" {
			return Room{}, "", errs.New(errs.InputInvalid, "the invite carries neither a descriptor nor a token")
		}
		raw, _ = json.Marshal(in.Token)
	}
	r, err := ParseRoom(raw)
	if err != nil {
		return Room{}, "", err
	}
	if hasDescriptor && in.Token != "" {
		t, err := ParseRoom([]byte(in.Token))
		if err != nil || !sameSig(t.Raw, r.Raw) {
			return Room{}, "", errs.New(errs.InputInvalid, "the invite's token is not the descriptor it carries")
		}
	}
	if contextID != "" && contextID != r.RoomID {
		return Room{}, "", errs.Newf(errs.InputInvalid, "the invite's context_id is not its room %s", r.RoomID)
	}
	if r.Privacy == GradeSealed {
		return Room{}, "", errs.New(errs.InputInvalid, "this agent cannot hold sealed rooms: it does not manage room keys")
	}
	note := ""
	if in.Note != nil {
		note = *in.Note
	}
	return r, note, nil
}

// Message is one room message as this client reads it.
type Message struct {
	// Seq is the record position (0 for a live message).
	Seq  uint64 `json:"seq,omitempty"`
	ID   string `json:"id"`
	From string `json:"from"`
	TS   string `json:"ts"`
	// Type is payload.type: genesis, join, say, artifact, leave, expel,
	// phase, close, or a board event.
	Type    string         `json:"type"`
	Payload map[string]any `json:"payload"`
}

// post signs a room message (an emit whose context_id is the room id) and
// publishes it on the room's traffic subject: the node's connection for a
// capability room, the acl connection for an acl room.
func (c *Client) post(ctx context.Context, r Room, channel string, payload map[string]any) (string, error) {
	if !r.HasChannel(channel) {
		return "", errs.Newf(errs.InputInvalid, "room %s has no channel %q (it has %v)", r.RoomID, channel, r.Channels)
	}
	e, err := protocol.New(protocol.TypeEmit, c.AgentID(), payload)
	if err != nil {
		return "", errs.Wrap(errs.InputInvalid, "the room message cannot be encoded", err)
	}
	e.ContextID = r.RoomID
	if err := e.Sign(c.cfg.Key); err != nil {
		return "", err
	}
	b, err := e.Marshal()
	if err != nil {
		return "", err
	}
	if r.ACL() {
		a, err := c.ACL(ctx, r)
		if err != nil {
			return "", err
		}
		return e.ID, a.Publish(ctx, protocol.ACLRoomSubject(r.RoomID, channel), b)
	}
	if err := protocol.CheckEnvelopeSize(len(b), int(c.cfg.Conn.MaxPayload())); err != nil {
		return "", err
	}
	if err := c.cfg.Conn.Publish(protocol.RoomEventSubject(r.RoomID, channel), b); err != nil {
		return "", errs.Wrap(errs.TransportTimeout, "the room message was not published", err)
	}
	return e.ID, flush(ctx, c.cfg.Conn.FlushWithContext)
}

func flush(ctx context.Context, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := f(ctx); err != nil {
		return errs.Wrap(errs.TransportTimeout, "the broker did not confirm the room message", err)
	}
	return nil
}

// Join posts this agent's join message (first person: member is itself).
func (c *Client) Join(ctx context.Context, ref string) (Held, error) {
	h, r, err := c.room(ref)
	if err != nil {
		return Held{}, err
	}
	if err := c.join(ctx, r); err != nil {
		return Held{}, err
	}
	h.Joined = true
	return h, nil
}

func (c *Client) join(ctx context.Context, r Room) error {
	if err := c.present(ctx, r); err != nil {
		return fmt.Errorf("join room %s: %w", r.RoomID, err)
	}
	p := map[string]any{"type": "join", "member": c.AgentID()}
	if c.cfg.Handle != "" {
		p["handle"] = c.cfg.Handle
	}
	if _, err := c.post(ctx, r, r.FirstChannel(), p); err != nil {
		return fmt.Errorf("join room %s: %w", r.RoomID, err)
	}
	return c.cfg.Store.MarkJoined(r.RoomID)
}

// present shows the rooms service the descriptor of a durable capability
// or sealed room this agent did not create, with a read of its cursor:
// the record takes such a room's messages only from agents that have
// presented its descriptor to a rooms or board verb (docs/bus-rooms.md),
// and a join is a member's first message. The creator (who provisioned
// it) and acl members (on the admit list) need not.
func (c *Client) present(ctx context.Context, r Room) error {
	if !r.Durable() || r.ACL() || r.Creator == c.AgentID() {
		return nil
	}
	if _, done := c.presented.Load(r.RoomID); done {
		return nil
	}
	if err := c.roomCall(ctx, protocol.RoomVerbSubject("cursor"), r, nil, nil); err != nil {
		return err
	}
	c.presented.Store(r.RoomID, true)
	return nil
}

// ensureJoined posts the join message before a member's first message,
// and presents the descriptor once per process before a message of a room
// joined earlier.
func (c *Client) ensureJoined(ctx context.Context, h Held, r Room) error {
	if h.Joined {
		if err := c.present(ctx, r); err != nil {
			return fmt.Errorf("room %s: %w", r.RoomID, err)
		}
		return nil
	}
	return c.join(ctx, r)
}

// Said is a posted message.
type Said struct {
	RoomID  string `json:"room_id"`
	Channel string `json:"channel"`
	ID      string `json:"id"`
}

// Say posts {type:"say", channel, in_reply_to, body} on channel (the room's
// first when empty). A member's first message is preceded by its join.
func (c *Client) Say(ctx context.Context, ref, channel, body, inReplyTo string) (Said, error) {
	h, r, err := c.room(ref)
	if err != nil {
		return Said{}, err
	}
	if body == "" {
		return Said{}, errs.New(errs.InputInvalid, "say something: the body is empty")
	}
	if channel == "" {
		channel = r.FirstChannel()
	}
	if err := c.ensureJoined(ctx, h, r); err != nil {
		return Said{}, err
	}
	var reply any
	if inReplyTo != "" {
		reply = inReplyTo
	}
	id, err := c.post(ctx, r, channel, map[string]any{"type": "say", "channel": channel, "in_reply_to": reply, "body": body})
	if err != nil {
		return Said{}, err
	}
	return Said{RoomID: r.RoomID, Channel: channel, ID: id}, nil
}

// Leave posts this agent's leave message and, for an acl room, leaves it at
// the rooms service (which revokes its room credentials).
func (c *Client) Leave(ctx context.Context, ref string) error {
	_, r, err := c.room(ref)
	if err != nil {
		return err
	}
	if r.Creator == c.AgentID() {
		return errs.New(errs.Forbidden, "the creator does not leave a room: reclaim it instead")
	}
	if _, err := c.post(ctx, r, r.FirstChannel(), map[string]any{"type": "leave", "member": c.AgentID()}); err != nil {
		return err
	}
	if r.ACL() {
		c.dropACL(r.RoomID)
		if err := c.roomCall(ctx, protocol.RoomVerbSubject("leave"), r, nil, nil); err != nil {
			return err
		}
	}
	_, err = c.cfg.Store.Forget(r.RoomID)
	return err
}

// Severities of an expel (upstream-notes §7); the service reads an
// unknown one as conduct.
var severities = map[string]bool{"timeout": true, "conduct": true, "safety": true}

// Expelled is the outcome of an expel.
type Expelled struct {
	RoomID   string `json:"room_id"`
	Member   string `json:"member"`
	Severity string `json:"severity"`
}

// Expel removes a member from an acl room (creator only): the rooms service
// drops it from the admit list and revokes its room credentials at the
// broker, and the expel message tells the room.
func (c *Client) Expel(ctx context.Context, ref, member, severity, note string) (Expelled, error) {
	_, r, err := c.room(ref)
	if err != nil {
		return Expelled{}, err
	}
	if !r.ACL() {
		return Expelled{}, errs.Newf(errs.InputInvalid, "room %s is of the %s grade: its members are whoever holds its descriptor, so nobody can be expelled", r.RoomID, r.Privacy)
	}
	if severity == "" {
		severity = "conduct"
	}
	if !severities[severity] {
		return Expelled{}, errs.Newf(errs.InputInvalid, "severity %q is not timeout, conduct or safety", severity)
	}
	if !keys.IsUserPublicKey(member) {
		return Expelled{}, errs.Newf(errs.InputInvalid, "%q is not an agent id", member)
	}
	if err := c.roomCall(ctx, protocol.RoomVerbSubject("expel"), r, map[string]any{"member": member, "severity": severity}, nil); err != nil {
		return Expelled{}, err
	}
	msg := map[string]any{"type": "expel", "member": member, "severity": severity}
	if note != "" {
		msg["note"] = note
	}
	out := Expelled{RoomID: r.RoomID, Member: member, Severity: severity}
	if _, err := c.post(ctx, r, r.FirstChannel(), msg); err != nil {
		return out, fmt.Errorf("%s is expelled, but the expel message was not posted: %w", member, err)
	}
	return out, nil
}

// Page is one page of a room's record.
type Page struct {
	RoomID   string    `json:"room_id"`
	Messages []Message `json:"messages"`
	// NextSeq is where the next page starts; Done says the record has no
	// more now.
	NextSeq uint64 `json:"next_seq"`
	Done    bool   `json:"done"`
	// Unreadable counts positions whose envelope was gone or did not
	// verify (they are left out of Messages).
	Unreadable int `json:"unreadable,omitempty"`
}

// maxReplayPages bounds the pages one unbounded Replay reads.
const maxReplayPages = 200

// Replay reads the room's record from fromSeq (1 when 0): at most limit
// messages, or with limit 0 every page up to the end of the record. Every
// envelope is verified here again: the record is the service's, the
// signatures are the members'.
func (c *Client) Replay(ctx context.Context, ref string, fromSeq uint64, limit int) (Page, error) {
	_, r, err := c.room(ref)
	if err != nil {
		return Page{}, err
	}
	if err := durable(r, "record"); err != nil {
		return Page{}, err
	}
	p := Page{RoomID: r.RoomID, Messages: []Message{}, NextSeq: max(fromSeq, 1)}
	for range maxReplayPages {
		extra := map[string]any{"from_seq": p.NextSeq}
		if limit > 0 {
			extra["limit"] = limit - len(p.Messages) - p.Unreadable
		}
		var out struct {
			Messages []struct {
				Seq      uint64          `json:"seq"`
				Envelope json.RawMessage `json:"envelope"`
			} `json:"messages"`
			NextSeq uint64 `json:"next_seq"`
			Done    bool   `json:"done"`
		}
		if err := c.roomCall(ctx, protocol.RoomVerbSubject("replay"), r, extra, &out); err != nil {
			return Page{}, err
		}
		for _, m := range out.Messages {
			msg, ok := readMessage(r, m.Envelope)
			if !ok {
				p.Unreadable++
				continue
			}
			msg.Seq = m.Seq
			p.Messages = append(p.Messages, msg)
		}
		p.Done = out.Done
		if out.NextSeq > p.NextSeq {
			p.NextSeq = out.NextSeq
		}
		if out.Done || len(out.Messages) == 0 || out.NextSeq <= extra["from_seq"].(uint64) ||
			(limit > 0 && len(p.Messages)+p.Unreadable >= limit) {
			break
		}
	}
	return p, nil
}

// readMessage verifies one recorded envelope (an object, or a string
// holding one) and reads it as a message of room r.
func readMessage(r Room, raw json.RawMessage) (Message, bool) {
	if len(raw) == 0 || string(raw) == "null" {
		return Message{}, false
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		raw = json.RawMessage(s)
	}
	e, err := protocol.Decode(raw)
	if err != nil || e.Type != protocol.TypeEmit || (e.ContextID != "" && e.ContextID != r.RoomID) {
		return Message{}, false
	}
	var p map[string]any
	if err := e.DecodePayload(&p); err != nil {
		return Message{}, false
	}
	t, _ := p["type"].(string)
	if t == "" {
		t, _ = p["event_type"].(string)
	}
	return Message{ID: e.ID, From: e.From, TS: e.TS, Type: t, Payload: p}, true
}

// Status is the service's view of a room (record and drive usage, limits,
// the drive's files).
func (c *Client) Status(ctx context.Context, ref string) (map[string]any, error) {
	_, r, err := c.room(ref)
	if err != nil {
		return nil, err
	}
	if err := durable(r, "status"); err != nil {
		return nil, err
	}
	var out map[string]any
	err = c.roomCall(ctx, protocol.RoomVerbSubject("status"), r, nil, &out)
	return out, err
}

// Mine asks the rooms service for the rooms this agent created or was
// admitted to (capability rooms merely held are not among them): every
// page, as one {rooms}.
func (c *Client) Mine(ctx context.Context) (json.RawMessage, error) {
	all := []json.RawMessage{}
	after := ""
	for range maxReplayPages {
		p := map[string]any{}
		if after != "" {
			p["after"] = after
		}
		var out struct {
			Rooms []json.RawMessage `json:"rooms"`
			Next  string            `json:"next"`
		}
		if err := c.call(ctx, protocol.RoomVerbSubject("mine"), p, &out); err != nil {
			return nil, err
		}
		all = append(all, out.Rooms...)
		if out.Next == "" || out.Next == after {
			break
		}
		after = out.Next
	}
	return json.Marshal(map[string]any{"rooms": all})
}
