package rooms

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/protocol"
)

// The room messages (upstream-notes §7): payload.type of a room's traffic.
const (
	MsgGenesis  = "genesis"
	MsgJoin     = "join"
	MsgSay      = "say"
	MsgArtifact = "artifact"
	MsgLeave    = "leave"
	MsgExpel    = "expel"
	MsgPhase    = "phase"
	MsgClose    = "close"
)

// BoardEventPrefix starts the type of the work board's events (board.posted,
// board.claimed, ...), which ride the room's traffic signed by the services
// key: the record takes them from that key only.
const BoardEventPrefix = "board."

// startIngest subscribes the room traffic the record keeps, in the
// worker's queue group so each message is recorded by one copy: capability
// and sealed rooms on mesh.event.room.<id>.<channel>, acl rooms on
// mesh.aclroom.<id>.<channel>.
func (w *Worker) startIngest(ctx context.Context) error {
	for _, subject := range []string{protocol.RoomEventSubject("*", "*"), protocol.ACLRoomSubject("*", "*")} {
		sub, err := w.svc.NC.QueueSubscribe(subject, bus.QueueGroup(Name), w.onTraffic)
		if err != nil {
			return fmt.Errorf("%s: subscribe %s: %w", Name, subject, err)
		}
		w.onStop(sub.Unsubscribe)
	}
	return nil
}

// ingestTimeout bounds the recording of one message.
const ingestTimeout = 10 * time.Second

func (w *Worker) onTraffic(msg *nats.Msg) {
	ctx, cancel := context.WithTimeout(context.Background(), ingestTimeout)
	defer cancel()
	out, reason, err := w.record(ctx, msg.Subject, msg.Data)
	switch {
	case err != nil:
		w.core.dropped.Add(1)
		w.svc.Log.Warn("room message not recorded", "subject", msg.Subject, "err", err)
	case reason != "":
		w.core.dropped.Add(1)
		w.svc.Log.Debug("room message dropped", "subject", msg.Subject, "reason", reason)
	case out == outDuplicate:
		w.core.duplicates.Add(1)
	default:
		w.core.recorded.Add(1)
	}
}

type outcome int

const (
	outRecorded outcome = iota
	outDuplicate
)

// record checks one message of a room's traffic and appends it to the
// room's record. A message the record does not take comes back with the
// reason (a drop, logged at debug); err is the bus failing.
func (w *Worker) record(ctx context.Context, subject string, data []byte) (outcome, string, error) {
	roomID, channel, acl, ok := parseTrafficSubject(subject)
	if !ok {
		return 0, "not a room subject", nil
	}
	room, found, err := bus.GetJSON[Room](ctx, w.kv, RoomKey(roomID))
	switch {
	case err != nil:
		return 0, "", fmt.Errorf("read room %s: %w", roomID, err)
	case !found:
		return 0, "unknown or ephemeral room", nil
	case room.ClosedAt != nil:
		return 0, "room closed", nil
	case (room.Privacy == GradeACL) != acl:
		return 0, "traffic on the other grade's subject", nil
	case !hasChannel(room.Channels, channel):
		return 0, "channel not in the descriptor", nil
	}
	env, err := protocol.Decode(data)
	if err != nil {
		return 0, "envelope does not verify: " + err.Error(), nil
	}
	switch {
	case protocol.CheckFreshness(env.TS, w.now(), protocol.SourceLive) != nil:
		return 0, "stale or future envelope", nil
	case env.Type != protocol.TypeEmit:
		return 0, "not an emit", nil
	case env.ContextID != roomID:
		return 0, "context_id is not the room", nil
	}
	var payload map[string]any
	if env.DecodePayload(&payload) != nil {
		return 0, "payload is not an object", nil
	}
	services := env.From == w.svc.Key.Public()
	if !services && !room.IsMember(env.From) {
		return 0, "sender is not a member", nil
	}
	if !services {
		switch holds, err := w.gate.Holds(ctx, &room, env.From); {
		case err != nil:
			return 0, "", err
		case !holds:
			return 0, "sender has not presented the room's descriptor to a rooms or board verb", nil
		}
	}
	if reason := senderRule(&room, facilitatorOf(room.Descriptor), env.From, services, payload); reason != "" {
		return 0, reason, nil
	}
	// A member's own verified leave takes it out of an acl room whether or
	// not the record has room for the message: leaving never depends on
	// it (and a repeated leave changes nothing).
	if t, _ := payload["type"].(string); t == MsgLeave && room.Privacy == GradeACL {
		if err := w.memberLeft(ctx, roomID, env.From); err != nil {
			w.svc.Log.Warn("acl member's leave message not applied", "room", roomID, "member", env.From, "err", err)
		}
	}
	return w.appendRecord(ctx, &room, env.From+":"+env.ID, data)
}

// parseTrafficSubject reads mesh.event.room.<id>.<channel> and
// mesh.aclroom.<id>.<channel>.
func parseTrafficSubject(subject string) (roomID, channel string, acl, ok bool) {
	rest, found := strings.CutPrefix(subject, "mesh.event.room.")
	if !found {
		if rest, found = strings.CutPrefix(subject, "mesh.aclroom."); !found {
			return "", "", false, false
		}
		acl = true
	}
	roomID, channel, ok = strings.Cut(rest, ".")
	return roomID, channel, acl, ok && protocol.ValidToken(roomID) && protocol.ValidToken(channel)
}

func hasChannel(channels []string, c string) bool {
	for _, x := range channels {
		if x == c {
			return true
		}
	}
	return false
}

// senderRule applies the room messages' sender rules (upstream-notes §7):
// genesis, expel and close only from the creator; join and leave only in
// the first person (member == from); phase only from the facilitator (the
// creator unless the playbook names one). A message of the services key
// (the board's events) is never one of these, and board events come from
// it alone. It returns why a message breaks them, or "".
func senderRule(room *Room, facilitator, from string, services bool, payload map[string]any) string {
	typ, _ := payload["type"].(string)
	if typ == "" {
		return "not a room message: no payload.type"
	}
	switch typ {
	case MsgGenesis, MsgExpel, MsgClose:
		if services || from != room.Creator {
			return typ + " from someone other than the creator"
		}
	case MsgJoin, MsgLeave:
		if member, _ := payload["member"].(string); services || member != from {
			return typ + " not in the first person (member is not the sender)"
		}
	case MsgPhase:
		if facilitator == "" {
			facilitator = room.Creator
		}
		if services || from != facilitator {
			return "phase from someone other than the facilitator"
		}
	default:
		if strings.HasPrefix(typ, BoardEventPrefix) && !services {
			return "a board event not signed by the services key"
		}
	}
	return ""
}

// facilitatorOf is the playbook's facilitator of a descriptor, "" when it
// names none.
func facilitatorOf(descriptor json.RawMessage) string {
	var d struct {
		Playbook struct {
			Facilitator string `json:"facilitator"`
		} `json:"playbook"`
	}
	_ = json.Unmarshal(descriptor, &d)
	return d.Playbook.Facilitator
}

// appendRecord appends one verified message to the room's record. Its
// bytes are first counted against the record's byte limit by
// compare-and-set (which also notes the room's activity); the count is
// given back when the stream refuses the message (its per-room message
// cap: the server refuses the 10,001st, whatever copy appends it) or
// already holds it (msgID is <from>:<id>, deduplicated by the stream). So
// copies racing never count a message twice and the record never passes
// its byte limit.
func (w *Worker) appendRecord(ctx context.Context, room *Room, msgID string, data []byte) (outcome, string, error) {
	n := int64(len(data))
	now := w.now()
	var full string
	_, _, err := bus.CAS(ctx, w.kv, RoomKey(room.ID), func(cur *Room, exists bool) (*Room, error) {
		switch {
		case !exists || cur.ClosedAt != nil:
			full = "room closed"
			return nil, bus.ErrNoChange
		case cur.RecordBytes+n > w.limits.RecordBytes:
			full = fmt.Sprintf("record full: %d of %d bytes", cur.RecordBytes, w.limits.RecordBytes)
			return nil, bus.ErrNoChange
		}
		cur.RecordMsgs++
		cur.RecordBytes += n
		cur.LastActive = now
		return cur, nil
	})
	if err != nil {
		return 0, "", fmt.Errorf("count record of room %s: %w", room.ID, err)
	}
	if full != "" {
		return 0, full, nil
	}
	ack, err := w.js.Publish(ctx, RecordSubject(room.ID), data, jetstream.WithMsgID(msgID))
	var apiErr *jetstream.APIError
	switch {
	case err == nil && !ack.Duplicate:
		return outRecorded, "", nil
	case err == nil:
		w.uncountRecord(ctx, room.ID, n)
		return outDuplicate, "", nil
	case errors.As(err, &apiErr):
		// Refused by the stream (its per-room message cap): not stored.
		w.uncountRecord(ctx, room.ID, n)
		return 0, "record refused it: " + apiErr.Description, nil
	default:
		// Perhaps stored, perhaps not: the count stays, erring on the
		// side of a record that fills a little early.
		return 0, "", fmt.Errorf("append to the record of room %s: %w", room.ID, err)
	}
}

// uncountRecord gives back one message of n bytes counted by appendRecord.
func (w *Worker) uncountRecord(ctx context.Context, roomID string, n int64) {
	_, _, err := bus.CAS(ctx, w.kv, RoomKey(roomID), func(cur *Room, exists bool) (*Room, error) {
		if !exists {
			return nil, bus.ErrNoChange
		}
		cur.RecordMsgs = max(cur.RecordMsgs-1, 0)
		cur.RecordBytes = max(cur.RecordBytes-n, 0)
		return cur, nil
	})
	if err != nil {
		w.svc.Log.Warn("record count not given back", "room", roomID, "err", err)
	}
}
