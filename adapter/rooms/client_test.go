package rooms

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/adapter/node"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// These tests run the client against a stand-in rooms and board service on
// a real broker: they check what the client sends and how it reads the
// answers (the wire shapes of upstream-notes §7, §8). The services
// themselves are tested in shared/rooms and shared/board, and the whole
// path end to end in adapter/cli.

const wait = 5 * time.Second

// fakeMesh answers mesh.rooms.* and mesh.board.* with what the test says.
type fakeMesh struct {
	t   *testing.T
	b   *bustest.Bus
	svc *bus.Service
	obs *nats.Conn

	mu      sync.Mutex
	calls   []fakeCall
	answers map[string]func(r *bus.Request) (any, error)
}

type fakeCall struct {
	Verb    string
	From    string
	Payload map[string]any
}

func newFakeMesh(t *testing.T) *fakeMesh {
	t.Helper()
	b := bustest.Start(t)
	svc, err := bus.NewServiceIn(bustest.Env(t, b, "fake-rooms", nil), "fake-rooms", "rooms and board stand-in")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	f := &fakeMesh{t: t, b: b, svc: svc, obs: bustest.Client(t, b), answers: map[string]func(*bus.Request) (any, error){}}
	for name, subj := range map[string]string{"rooms": "mesh.rooms.*", "board": "mesh.board.*"} {
		if err := svc.Endpoint(name, subj, f.serve); err != nil {
			t.Fatal(err)
		}
	}
	// The endpoints' subscriptions reach the broker before any client asks
	// (without the flush a loaded machine answered the first request with
	// no responders).
	if err := svc.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fakeMesh) serve(ctx context.Context, r *bus.Request) (any, error) {
	verb := strings.TrimPrefix(strings.TrimPrefix(r.Subject, "mesh.rooms."), "mesh.")
	f.mu.Lock()
	f.calls = append(f.calls, fakeCall{Verb: verb, From: r.Env.From, Payload: r.Object()})
	h := f.answers[verb]
	f.mu.Unlock()
	if h == nil {
		return map[string]any{"ok": true}, nil
	}
	return h(r)
}

func (f *fakeMesh) answer(verb string, h func(r *bus.Request) (any, error)) {
	f.mu.Lock()
	f.answers[verb] = h
	f.mu.Unlock()
}

// called returns the calls of verb so far.
func (f *fakeMesh) called(verb string) []fakeCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []fakeCall
	for _, c := range f.calls {
		if c.Verb == verb {
			out = append(out, c)
		}
	}
	return out
}

func (f *fakeMesh) verbs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]string, len(f.calls))
	for i, c := range f.calls {
		out[i] = c.Verb
	}
	return out
}

// fakeAgent records invites instead of sending them.
type fakeAgent struct {
	mu     sync.Mutex
	sent   []sentInvite
	queued bool
	err    error // answered with this instead
}

type sentInvite struct {
	To, Offering string
	Input        InviteInput
	Opts         node.RequestOptions
}

func (a *fakeAgent) Request(_ context.Context, to, offering string, input any, opts node.RequestOptions) (*node.Result, error) {
	b, _ := json.Marshal(input)
	var in InviteInput
	_ = json.Unmarshal(b, &in)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.sent = append(a.sent, sentInvite{To: to, Offering: offering, Input: in, Opts: opts})
	if a.err != nil {
		return nil, a.err
	}
	return &node.Result{Status: "completed", Queued: a.queued}, nil
}

func (f *fakeMesh) client(t *testing.T, key *keys.Agent, edit func(*Config)) *Client {
	t.Helper()
	cfg := Config{Conn: bustest.Client(t, f.b), Key: key, Store: OpenStore(filepath.Join(t.TempDir(), StoreFile), nil),
		Agent: &fakeAgent{}, Handle: "helper.ana@example.org", Timeout: wait}
	if edit != nil {
		edit(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// traffic collects room messages.
type traffic struct {
	mu   sync.Mutex
	msgs []*nats.Msg
}

func (f *fakeMesh) watch(t *testing.T, subject string) *traffic {
	t.Helper()
	tr := &traffic{}
	sub, err := f.obs.Subscribe(subject, func(m *nats.Msg) {
		tr.mu.Lock()
		tr.msgs = append(tr.msgs, m)
		tr.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := f.obs.Flush(); err != nil {
		t.Fatal(err)
	}
	return tr
}

// await waits for n messages and returns them decoded (verified).
func (tr *traffic) await(t *testing.T, n int) []*protocol.Envelope {
	t.Helper()
	eventually(t, "room messages", func() bool {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		return len(tr.msgs) >= n
	})
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var out []*protocol.Envelope
	for _, m := range tr.msgs {
		e, err := protocol.Decode(m.Data)
		if err != nil {
			t.Fatalf("a room message does not verify: %v", err)
		}
		out = append(out, e)
	}
	return out
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func payloadOf(t *testing.T, e *protocol.Envelope) map[string]any {
	t.Helper()
	var p map[string]any
	if err := e.DecodePayload(&p); err != nil {
		t.Fatal(err)
	}
	return p
}

// descriptorOf checks that a call carried the room's signed descriptor.
func descriptorOf(t *testing.T, c fakeCall, r Room) {
	t.Helper()
	b, _ := json.Marshal(c.Payload["descriptor"])
	got, err := ParseRoom(b)
	if err != nil || got.Sig != r.Sig {
		t.Fatalf("%s carried descriptor %s: %v", c.Verb, b, err)
	}
}

func TestCreateProvisionsAndOpensTheRecord(t *testing.T) {
	f := newFakeMesh(t)
	ana := bustest.Agent(t)
	c := f.client(t, ana, nil)
	tr := f.watch(t, "mesh.event.room.*.*")

	h, err := c.Create(t.Context(), NewRoom{Name: "design review"})
	if err != nil {
		t.Fatal(err)
	}
	if h.Role != RoleCreator || !h.Durable || !h.Joined || h.Name != "design review" {
		t.Fatalf("held %+v", h)
	}
	r, _ := h.Room()
	prov := f.called("provision")
	if len(prov) != 1 || prov[0].From != ana.Public() {
		t.Fatalf("provision calls %+v", prov)
	}
	descriptorOf(t, prov[0], r)
	envs := tr.await(t, 1)
	if p := payloadOf(t, envs[0]); p["type"] != "genesis" || envs[0].ContextID != r.RoomID || envs[0].From != ana.Public() {
		t.Fatalf("genesis %+v %v", envs[0], p)
	}
	// An ephemeral room is not provisioned.
	if _, err := c.Create(t.Context(), NewRoom{Ephemeral: true}); err != nil {
		t.Fatal(err)
	}
	if n := len(f.called("provision")); n != 1 {
		t.Fatalf("%d provisions", n)
	}
	// A refusal from the service is the create's, and nothing is kept.
	f.answer("provision", func(*bus.Request) (any, error) {
		return nil, errs.New(errs.NotNamed, "the creator must be bound to a handle")
	})
	if _, err := c.Create(t.Context(), NewRoom{Name: "x"}); errs.CodeOf(err) != errs.NotNamed {
		t.Fatalf("refused provision: %v", err)
	}
	if list, _ := c.Store().List(); len(list) != 2 {
		t.Fatalf("held after a refused provision: %+v", list)
	}
}

func TestInvite(t *testing.T) {
	f := newFakeMesh(t)
	ana, bob := bustest.Agent(t), bustest.Agent(t).Public()
	ag := &fakeAgent{queued: true}
	c := f.client(t, ana, func(cfg *Config) { cfg.Agent = ag })
	open, err := c.Create(t.Context(), NewRoom{Name: "open"})
	if err != nil {
		t.Fatal(err)
	}
	inv, err := c.Invite(t.Context(), "open", bob, "the draft is in")
	if err != nil || !inv.Queued || inv.To != bob || inv.RoomID != open.RoomID {
		t.Fatalf("invite: %+v %v", inv, err)
	}
	s := ag.sent[0]
	r, _ := open.Room()
	if s.To != bob || s.Offering != "rooms.invite" || s.Opts.ContextID != open.RoomID || s.Input.Rooms != "v1" ||
		s.Input.Token != r.Token() || string(s.Input.SealedKey) != "null" || s.Input.Note == nil || *s.Input.Note != "the draft is in" {
		t.Fatalf("invite sent %+v", s)
	}
	if got, err := ParseRoom(s.Input.Descriptor); err != nil || got.Sig != r.Sig || string(r.Raw) != string(got.Raw) {
		t.Fatalf("invite descriptor: %v", err)
	}
	if len(f.called("admit")) != 0 {
		t.Fatal("a capability room was admitted to")
	}
	// An acl room admits the invitee first.
	f.answer("credential", func(*bus.Request) (any, error) { return nil, errs.New(errs.Unavailable, "not in this test") })
	acl, err := c.Create(t.Context(), NewRoom{Name: "closed", Privacy: GradeACL})
	if err == nil || acl.RoomID == "" {
		t.Fatalf("acl create without credentials: %+v %v", acl, err)
	}
	if _, err := c.Invite(t.Context(), acl.RoomID, bob, ""); err != nil {
		t.Fatal(err)
	}
	admit := f.called("admit")
	if len(admit) != 1 || admit[0].Payload["agent_id"] != bob || len(ag.sent) != 2 || ag.sent[1].Input.Note != nil {
		t.Fatalf("acl invite: admits %+v, sent %d", admit, len(ag.sent))
	}
	// A refused admit sends nothing.
	f.answer("admit", func(*bus.Request) (any, error) { return nil, errs.New(errs.Forbidden, "only the creator admits") })
	if _, err := c.Invite(t.Context(), acl.RoomID, bob, ""); errs.CodeOf(err) != errs.Forbidden || len(ag.sent) != 2 {
		t.Fatalf("refused admit: %v, sent %d", err, len(ag.sent))
	}
	if _, err := c.Invite(t.Context(), "open", "not-an-agent", ""); errs.CodeOf(err) != errs.InputInvalid {
		t.Fatalf("invite a non-agent: %v", err)
	}

	// No answer in time: the invitee's mailbox keeps it, and its late
	// answer is recognised once, from the invitee only.
	ag.queued, ag.err = false, errs.New(errs.TransportTimeout, "no answer")
	inv, err = c.Invite(t.Context(), "open", bob, "")
	if err != nil || !inv.NoAnswer || inv.Queued {
		t.Fatalf("unanswered invite: %+v %v", inv, err)
	}
	last := ag.sent[len(ag.sent)-1]
	if last.Opts.ID == "" || last.Opts.Timeout != min(InviteTimeout, wait) {
		t.Fatalf("invite options %+v", last.Opts)
	}
	if _, ok := c.InviteAnswer(&node.Result{RequestID: last.Opts.ID, From: ana.Public()}); ok {
		t.Fatal("an answer from someone else passed for the invitee's")
	}
	if got, ok := c.InviteAnswer(&node.Result{RequestID: last.Opts.ID, From: bob}); !ok || got.RoomID != open.RoomID || got.To != bob {
		t.Fatalf("the late answer: %+v %v", got, ok)
	}
	if _, ok := c.InviteAnswer(&node.Result{RequestID: last.Opts.ID, From: bob}); ok {
		t.Fatal("a late answer was taken twice")
	}
	// An answered invite is not kept; a refusal is the invite's error.
	ag.err = nil
	if _, err := c.Invite(t.Context(), "open", bob, ""); err != nil {
		t.Fatal(err)
	}
	if _, ok := c.InviteAnswer(&node.Result{RequestID: ag.sent[len(ag.sent)-1].Opts.ID, From: bob}); ok {
		t.Fatal("an invite answered at once stayed pending")
	}
	ag.err = errs.New(errs.InputInvalid, "this agent cannot hold sealed rooms")
	if _, err := c.Invite(t.Context(), "open", bob, ""); errs.CodeOf(err) != errs.InputInvalid {
		t.Fatalf("refused invite: %v", err)
	}
}

func TestSayJoinsFirst(t *testing.T) {
	f := newFakeMesh(t)
	ana, bob := bustest.Agent(t), bustest.Agent(t)
	r := newRoom(t, ana, NewRoom{Name: "r", Channels: []string{"main", "side"}})
	cb := f.client(t, bob, nil)
	if _, err := cb.Store().Add(r, RoleMember, ana.Public(), ""); err != nil {
		t.Fatal(err)
	}
	tr := f.watch(t, protocol.RoomEventSubject(r.RoomID, "*"))
	s, err := cb.Say(t.Context(), r.RoomID, "side", "hello", "")
	if err != nil || s.Channel != "side" {
		t.Fatalf("say: %+v %v", s, err)
	}
	envs := tr.await(t, 2)
	// The join presented the descriptor first, so the record takes bob's
	// messages.
	if calls := f.called("cursor"); len(calls) != 1 || calls[0].From != bob.Public() || calls[0].Payload["seq"] != nil {
		t.Fatalf("the join presented the descriptor by %+v", calls)
	} else {
		descriptorOf(t, calls[0], r)
	}
	join, say := payloadOf(t, envs[0]), payloadOf(t, envs[1])
	if join["type"] != "join" || join["member"] != bob.Public() || join["handle"] != "helper.ana@example.org" {
		t.Fatalf("join %v", join)
	}
	if say["type"] != "say" || say["channel"] != "side" || say["body"] != "hello" || say["in_reply_to"] != nil || envs[1].ID != s.ID ||
		envs[1].ContextID != r.RoomID || envs[1].Type != protocol.TypeEmit {
		t.Fatalf("say %v", say)
	}
	// Once joined, a say is a say.
	if _, err := cb.Say(t.Context(), r.RoomID, "", "again", s.ID); err != nil {
		t.Fatal(err)
	}
	envs = tr.await(t, 3)
	if p := payloadOf(t, envs[2]); p["channel"] != "main" || p["in_reply_to"] != s.ID {
		t.Fatalf("reply %v", p)
	}
	if calls := f.called("cursor"); len(calls) != 1 {
		t.Fatalf("the same process presented the descriptor again: %d cursor calls", len(calls))
	}
	// Another process with the room already joined in its store (a joined
	// room from before, or one provisioned again under the same id, whose
	// holders were forgotten) presents the descriptor once before its
	// first message, without joining again.
	cb2 := f.client(t, bob, func(c *Config) { c.Store = cb.Store() })
	if _, err := cb2.Say(t.Context(), r.RoomID, "", "from another process", ""); err != nil {
		t.Fatal(err)
	}
	if calls := f.called("cursor"); len(calls) != 2 || calls[1].From != bob.Public() {
		t.Fatalf("a new process did not present the descriptor before its first message: %+v", calls)
	}
	if p := payloadOf(t, tr.await(t, 4)[3]); p["type"] != "say" {
		t.Fatalf("a joined member joined again: %v", p)
	}
	if _, err := cb.Say(t.Context(), r.RoomID, "nope", "x", ""); errs.CodeOf(err) != errs.InputInvalid {
		t.Fatalf("unknown channel: %v", err)
	}
	if _, err := cb.Say(t.Context(), r.RoomID, "", "", ""); errs.CodeOf(err) != errs.InputInvalid {
		t.Fatalf("empty say: %v", err)
	}
}

// emitFor signs a room message.
func emitFor(t *testing.T, k *keys.Agent, room string, payload map[string]any) json.RawMessage {
	t.Helper()
	e, err := protocol.New(protocol.TypeEmit, k.Public(), payload)
	if err != nil {
		t.Fatal(err)
	}
	e.ContextID = room
	if err := e.Sign(k); err != nil {
		t.Fatal(err)
	}
	b, err := e.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestReplayVerifiesEveryEnvelope(t *testing.T) {
	f := newFakeMesh(t)
	ana := bustest.Agent(t)
	c := f.client(t, ana, nil)
	h, err := c.Create(t.Context(), NewRoom{Name: "r"})
	if err != nil {
		t.Fatal(err)
	}
	good := emitFor(t, ana, h.RoomID, map[string]any{"type": "say", "channel": "main", "in_reply_to": nil, "body": "hi"})
	forged := json.RawMessage(strings.Replace(string(good), `"hi"`, `"ho"`, 1))
	otherRoom := emitFor(t, ana, "elsewhere", map[string]any{"type": "say", "body": "x"})
	asString, _ := json.Marshal(string(good))
	f.answer("replay", func(r *bus.Request) (any, error) {
		if r.Object()["from_seq"] == float64(12) {
			// The second page, read when no limit is set.
			return map[string]any{"messages": []any{map[string]any{"seq": 12, "envelope": good}}, "next_seq": 13, "done": true}, nil
		}
		return map[string]any{"messages": []any{
			map[string]any{"seq": 7, "envelope": good},
			map[string]any{"seq": 8, "envelope": forged},
			map[string]any{"seq": 9, "envelope": nil},
			map[string]any{"seq": 10, "envelope": otherRoom},
			map[string]any{"seq": 11, "envelope": json.RawMessage(asString)},
		}, "next_seq": 12, "done": false}, nil
	})
	p, err := c.Replay(t.Context(), "r", 5, 5)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Messages) != 2 || p.Messages[0].Seq != 7 || p.Messages[1].Seq != 11 || p.Unreadable != 3 || p.NextSeq != 12 || p.Done ||
		p.Messages[0].Type != "say" || p.Messages[0].Payload["body"] != "hi" || p.Messages[0].From != ana.Public() {
		t.Fatalf("page %+v", p)
	}
	call := f.called("replay")[0]
	if call.Payload["from_seq"] != float64(5) || call.Payload["limit"] != float64(5) || len(f.called("replay")) != 1 {
		t.Fatalf("replay asked %v", call.Payload)
	}
	// Without a limit, every page to the end.
	p, err = c.Replay(t.Context(), "r", 0, 0)
	if err != nil || len(p.Messages) != 3 || !p.Done || p.NextSeq != 13 || f.called("replay")[1].Payload["from_seq"] != float64(1) {
		t.Fatalf("the whole record: %+v %v", p, err)
	}
	eph, err := c.Create(t.Context(), NewRoom{Ephemeral: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Replay(t.Context(), eph.RoomID, 0, 0); errs.CodeOf(err) != errs.InputInvalid || len(f.called("replay")) != 3 {
		t.Fatalf("replay of an ephemeral room: %v", err)
	}
}

func TestDriveAttachFetchNotes(t *testing.T) {
	f := newFakeMesh(t)
	ana := bustest.Agent(t)
	c := f.client(t, ana, nil)
	h, err := c.Create(t.Context(), NewRoom{Name: "r"})
	if err != nil {
		t.Fatal(err)
	}
	tr := f.watch(t, protocol.RoomEventSubject(h.RoomID, "*"))
	data := []byte("# the draft\n")
	sum := sha256.Sum256(data)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	f.answer("attach", func(r *bus.Request) (any, error) {
		return map[string]any{"ref": "drive:" + hex.EncodeToString(sum[:]), "digest": digest, "size": len(data), "media_type": r.Object()["media_type"]}, nil
	})
	a, err := c.Attach(t.Context(), "r", Attach{Name: "draft.md", Data: data, MediaType: "text/markdown", Role: "input"})
	if err != nil {
		t.Fatal(err)
	}
	call := f.called("attach")[0]
	if call.Payload["name"] != "draft.md" || call.Payload["data_b64"] != base64.StdEncoding.EncodeToString(data) || call.Payload["version"] != "1" || call.Payload["role"] != "input" {
		t.Fatalf("attach asked %v", call.Payload)
	}
	envs := tr.await(t, 1)
	art := payloadOf(t, envs[0])
	if art["type"] != "artifact" || art["ref"] != a.Ref || art["digest"] != digest || art["role"] != "input" || art["media_type"] != "text/markdown" ||
		art["name"] != "draft.md" || art["size"] != float64(len(data)) || a.MessageID != envs[0].ID {
		t.Fatalf("artifact message %v", art)
	}
	// The drive is checked: a digest that is not the bytes' is refused.
	f.answer("attach", func(*bus.Request) (any, error) {
		return map[string]any{"ref": "x", "digest": "sha256:" + strings.Repeat("0", 64), "size": 1}, nil
	})
	if _, err := c.Attach(t.Context(), "r", Attach{Name: "x", Data: data}); errs.CodeOf(err) != errs.IdentityMismatch {
		t.Fatalf("wrong digest: %v", err)
	}
	// Too large or an unknown role: refused here, nothing sent.
	before := len(f.called("attach"))
	if _, err := c.Attach(t.Context(), "r", Attach{Name: "big", Data: make([]byte, MaxFile+1)}); errs.CodeOf(err) != errs.PayloadTooLarge {
		t.Fatalf("a file over 512 KB: %v", err)
	}
	if _, err := c.Attach(t.Context(), "r", Attach{Name: "x", Data: data, Role: "final"}); errs.CodeOf(err) != errs.InputInvalid {
		t.Fatalf("unknown role: %v", err)
	}
	if len(f.called("attach")) != before {
		t.Fatal("a refused attach was sent")
	}

	f.answer("fetch", func(r *bus.Request) (any, error) {
		return map[string]any{"ref": r.Object()["ref"], "name": "draft.md", "version": 1, "digest": digest, "media_type": "text/markdown",
			"size": len(data), "data_b64": base64.StdEncoding.EncodeToString(data)}, nil
	})
	got, err := c.Fetch(t.Context(), "r", a.Ref)
	if err != nil || string(got.Data) != string(data) || got.Name != "draft.md" || got.MediaType != "text/markdown" || got.Version != "1" {
		t.Fatalf("fetch: %+v %v", got, err)
	}
	// By digest: the room's file of that digest.
	if _, err := c.Fetch(t.Context(), "r", digest); err != nil {
		t.Fatal(err)
	}
	if ref := f.called("fetch")[1].Payload["ref"]; ref != "mesh:rooms:"+h.RoomID+"/drive/"+hex.EncodeToString(sum[:]) {
		t.Fatalf("fetch by digest asked for %v", ref)
	}
	f.answer("fetch", func(r *bus.Request) (any, error) {
		return map[string]any{"ref": "x", "digest": digest, "data_b64": base64.StdEncoding.EncodeToString([]byte("tampered"))}, nil
	})
	if _, err := c.Fetch(t.Context(), "r", a.Ref); errs.CodeOf(err) != errs.IdentityMismatch {
		t.Fatalf("fetch of bytes that are not the digest's: %v", err)
	}

	f.answer("note", func(r *bus.Request) (any, error) {
		p := r.Object()
		return map[string]any{"noted": true, "digest": p["digest"], "notes_on_file": 1,
			"note": map[string]any{"note": "screening/v1", "digest": p["digest"], "verdict": p["verdict"], "reason": p["reason"], "by": r.Env.From, "at": "2026-05-01T12:00:00.000Z"}}, nil
	})
	n, err := c.Note(t.Context(), "r", digest, "flag", "needs a source", &NoteSource{ID: "reviewer"})
	if err != nil || !n.Noted || n.Note.By != ana.Public() || n.Note.Verdict != "flag" || n.NotesOnFile != 1 {
		t.Fatalf("note: %+v %v", n, err)
	}
	if p := f.called("note")[0].Payload; p["verdict"] != "flag" || p["reason"] != "needs a source" || p["by"] != nil ||
		p["source"].(map[string]any)["id"] != "reviewer" {
		t.Fatalf("note asked %v", p)
	}
	if _, err := c.Note(t.Context(), "r", digest, "approve", "", nil); errs.CodeOf(err) != errs.InputInvalid {
		t.Fatalf("unknown verdict: %v", err)
	}
	f.answer("notes", func(r *bus.Request) (any, error) { return map[string]any{"notes": nil}, nil })
	if notes, err := c.Notes(t.Context(), "r", ""); err != nil || notes == nil || len(notes) != 0 {
		t.Fatalf("no notes: %v %v", notes, err)
	}
	if p := f.called("notes")[0].Payload; p["digest"] != nil {
		t.Fatalf("notes of every file asked %v", p)
	}
	// Every page is read: next names where the next one starts.
	f.answer("notes", func(r *bus.Request) (any, error) {
		if r.Object()["after"] == "p1" {
			return map[string]any{"notes": []any{map[string]any{"digest": digest, "verdict": "hold", "by": "b"}}}, nil
		}
		return map[string]any{"notes": []any{map[string]any{"digest": digest, "verdict": "pass", "by": "a"}}, "next": "p1"}, nil
	})
	if notes, err := c.Notes(t.Context(), "r", digest); err != nil || len(notes) != 2 || notes[0].By != "a" || notes[1].By != "b" {
		t.Fatalf("paged notes: %+v %v", notes, err)
	}
	if calls := f.called("notes"); len(calls) != 3 || calls[1].Payload["after"] != nil || calls[2].Payload["after"] != "p1" ||
		calls[2].Payload["digest"] != digest {
		t.Fatalf("pages asked %+v", calls)
	}
}

func TestBoardVerbs(t *testing.T) {
	f := newFakeMesh(t)
	ana := bustest.Agent(t)
	c := f.client(t, ana, nil)
	h, err := c.Create(t.Context(), NewRoom{Name: "r"})
	if err != nil {
		t.Fatal(err)
	}
	item := func(r *bus.Request) (any, error) {
		p := r.Object()
		return map[string]any{"item": map[string]any{"item_id": "i1", "room_id": h.RoomID, "title": p["title"], "state": "open", "posted_by": r.Env.From}}, nil
	}
	for _, v := range []string{"board.post", "board.claim", "board.complete", "board.abandon", "board.withdraw"} {
		f.answer(v, item)
	}
	it, err := c.Post(t.Context(), "r", NewItem{Title: "summarise", Detail: "all of it", Offering: "chat", Lease: 2 * time.Hour})
	if err != nil || it.ItemID != "i1" || it.Title != "summarise" || it.PostedBy != ana.Public() {
		t.Fatalf("post: %+v %v", it, err)
	}
	if p := f.called("board.post")[0].Payload; p["lease_ms"] != float64(7_200_000) || p["detail"] != "all of it" || p["offering"] != "chat" {
		t.Fatalf("post asked %v", p)
	}
	// Two pages: the second follows next_after.
	f.answer("board.list", func(r *bus.Request) (any, error) {
		if r.Object()["after"] == "i1" {
			return map[string]any{"items": []any{map[string]any{"item_id": "i2", "state": "claimed"}}, "open": 1, "claimed": 1, "done": 0}, nil
		}
		return map[string]any{"items": []any{map[string]any{"item_id": "i1", "state": "open"}}, "open": 1, "claimed": 1, "done": 0, "next_after": "i1"}, nil
	})
	if b, err := c.List(t.Context(), "r"); err != nil || len(b.Items) != 2 || b.Items[1].ItemID != "i2" || b.Open != 1 || b.Claimed != 1 || b.RoomID != h.RoomID {
		t.Fatalf("list: %+v %v", b, err)
	}
	if _, err := c.ClaimItem(t.Context(), "r", "i1", 0); err != nil {
		t.Fatal(err)
	}
	if p := f.called("board.claim")[0].Payload; p["item_id"] != "i1" || p["lease_ms"] != nil {
		t.Fatalf("claim asked %v", p)
	}
	if _, err := c.Complete(t.Context(), "r", "i1", "done", []string{"drive:abc"}); err != nil {
		t.Fatal(err)
	}
	if p := f.called("board.complete")[0].Payload; p["note"] != "done" || p["artifacts"].([]any)[0] != "drive:abc" {
		t.Fatalf("complete asked %v", p)
	}
	if _, err := c.Abandon(t.Context(), "r", "i1"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Withdraw(t.Context(), "r", "i1"); err != nil {
		t.Fatal(err)
	}
	// The loser of a claim hears who holds the item, with the code.
	f.answer("board.claim", func(*bus.Request) (any, error) {
		return nil, errs.New(errs.BoardItemTaken, "item i1 is held by U… until 13:00").WithDetail("claimed_by", "U…")
	})
	if _, err := c.ClaimItem(t.Context(), "r", "i1", time.Minute); errs.CodeOf(err) != errs.BoardItemTaken || errs.As(err).Details["claimed_by"] != "U…" {
		t.Fatalf("lost claim: %v", err)
	}
	for _, bad := range []error{
		func() error { _, err := c.Post(t.Context(), "r", NewItem{}); return err }(),
		func() error {
			_, err := c.Post(t.Context(), "r", NewItem{Title: strings.Repeat("t", maxTitle+1)})
			return err
		}(),
		func() error { _, err := c.ClaimItem(t.Context(), "r", " ", 0); return err }(),
	} {
		if errs.CodeOf(bad) != errs.InputInvalid {
			t.Errorf("refused locally: %v", bad)
		}
	}
	eph, _ := c.Create(t.Context(), NewRoom{Ephemeral: true})
	if _, err := c.List(t.Context(), eph.RoomID); errs.CodeOf(err) != errs.InputInvalid {
		t.Fatalf("board of an ephemeral room: %v", err)
	}
}

func TestNoServiceAndThePin(t *testing.T) {
	b := bustest.Start(t)
	ana := bustest.Agent(t)
	c, err := New(Config{Conn: bustest.Client(t, b), Key: ana, Store: OpenStore(filepath.Join(t.TempDir(), StoreFile), nil), Timeout: wait})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Create(t.Context(), NewRoom{Name: "r"})
	if errs.CodeOf(err) != errs.TransportNoResponders || !strings.Contains(err.Error(), "runs no rooms service") {
		t.Fatalf("create with no rooms service: %v", err)
	}
	r := newRoom(t, ana, NewRoom{})
	if _, err := c.Store().Add(r, RoleCreator, "", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := c.List(t.Context(), r.RoomID); !strings.Contains(err.Error(), "runs no work board service") {
		t.Fatalf("board with no board service: %v", err)
	}

	f := newFakeMesh(t)
	pinned := f.client(t, ana, func(cfg *Config) { cfg.ServicesKey = bustest.Agent(t).Public() })
	if _, err := pinned.Create(t.Context(), NewRoom{Name: "r"}); errs.CodeOf(err) != errs.IdentityMismatch {
		t.Fatalf("an answer from another key: %v", err)
	}
	right := f.client(t, ana, func(cfg *Config) { cfg.ServicesKey = f.b.ServicesKey().Public() })
	if _, err := right.Create(t.Context(), NewRoom{Name: "r"}); err != nil {
		t.Fatalf("an answer from the services key: %v", err)
	}
}

// Mine reads every page of mesh.rooms.mine (next names where the next
// starts).
func TestMineReadsEveryPage(t *testing.T) {
	f := newFakeMesh(t)
	c := f.client(t, bustest.Agent(t), nil)
	f.answer("mine", func(r *bus.Request) (any, error) {
		if r.Object()["after"] == "k1" {
			return map[string]any{"rooms": []any{map[string]any{"room_id": "b"}}}, nil
		}
		return map[string]any{"rooms": []any{map[string]any{"room_id": "a"}}, "next": "k1"}, nil
	})
	raw, err := c.Mine(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var out struct {
		Rooms []struct {
			RoomID string `json:"room_id"`
		} `json:"rooms"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || len(out.Rooms) != 2 || out.Rooms[0].RoomID != "a" || out.Rooms[1].RoomID != "b" {
		t.Fatalf("mine: %s %v", raw, err)
	}
	if calls := f.called("mine"); len(calls) != 2 || calls[1].Payload["after"] != "k1" {
		t.Fatalf("pages asked %+v", calls)
	}
}
