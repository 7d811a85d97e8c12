package rooms_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/rooms"
)

// owners is the registrar's test double: agents bound to handles by the
// test, everything else NOT_NAMED; down makes it answer UNAVAILABLE.
type owners struct {
	mu    sync.Mutex
	bound map[string]rooms.Owner
	down  bool
}

func (o *owners) Owner(_ context.Context, agent string) (rooms.Owner, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.down {
		return rooms.Owner{}, errors.New("registrar unreachable")
	}
	ow, ok := o.bound[agent]
	if !ok {
		return rooms.Owner{}, errs.Newf(errs.NotNamed, "agent %s is bound to no handle", agent)
	}
	return ow, nil
}

func (o *owners) bind(agent, name, email string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.bound[agent] = rooms.Owner{Handle: name + "." + email, Operator: email}
}

// clock is a test clock whose offset from real time the test sets.
type clock struct{ off atomic.Int64 }

func (c *clock) Now() time.Time        { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *clock) Set(d time.Duration)   { c.off.Store(int64(d)) }
func (c *clock) Offset() time.Duration { return time.Duration(c.off.Load()) }

type harness struct {
	t       *testing.T
	bus     *bustest.Bus
	nc      *nats.Conn
	js      jetstream.JetStream
	kv      jetstream.KeyValue
	workers []*rooms.Worker
	owners  *owners
	clock   *clock
}

// start runs copies of the rooms worker with cfg (Owners: the test double
// unless cfg names one) on a fresh broker.
func start(t *testing.T, cfg rooms.Config, copies int) *harness {
	t.Helper()
	h := &harness{t: t, bus: bustest.Start(t), owners: &owners{bound: map[string]rooms.Owner{}}, clock: &clock{}}
	if cfg.Owners == nil {
		cfg.Owners = h.owners
	}
	h.nc = bustest.Client(t, h.bus)
	for range copies {
		w, err := rooms.Start(t.Context(), bustest.Env(t, h.bus, "rooms", h.clock.Now), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Stop() })
		h.workers = append(h.workers, w)
	}
	var err error
	if h.js, err = jetstream.New(h.nc); err != nil {
		t.Fatal(err)
	}
	if copies == 0 {
		return h // the test starts its own copies
	}
	if h.kv, err = h.js.KeyValue(t.Context(), rooms.Bucket); err != nil {
		t.Fatal(err)
	}
	return h
}

// agent is a fresh agent bound to a handle of email.
func (h *harness) agent(email string) *keys.Agent {
	a := bustest.Agent(h.t)
	h.owners.bind(a.Public(), "bot", email)
	return a
}

// call signs payload from signer to mesh.rooms.<verb> and returns the
// answer's payload.
func (h *harness) call(signer keys.Signer, verb string, payload any) (map[string]any, error) {
	h.t.Helper()
	return h.callSubject(signer, protocol.RoomVerbSubject(verb), payload)
}

func (h *harness) callSubject(signer keys.Signer, subject string, payload any) (map[string]any, error) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(h.t.Context(), 10*time.Second)
	defer cancel()
	rep, err := bus.Call(ctx, h.nc, signer, subject, protocol.TypeRequest, "", payload)
	if err != nil {
		return nil, err
	}
	if rep.From != h.bus.ServicesKey().Public() {
		h.t.Fatalf("answer signed by %s", rep.From)
	}
	v, err := rep.PayloadValue()
	if err != nil {
		h.t.Fatal(err)
	}
	m, _ := v.(map[string]any)
	return m, nil
}

// must is call that fails the test on an error.
func (h *harness) must(signer keys.Signer, verb string, payload any) map[string]any {
	h.t.Helper()
	out, err := h.call(signer, verb, payload)
	if err != nil {
		h.t.Fatalf("%s: %v", verb, err)
	}
	return out
}

// refused is call that expects the refusal code.
func (h *harness) refused(signer keys.Signer, verb string, payload any, code errs.Code) *errs.Error {
	h.t.Helper()
	out, err := h.call(signer, verb, payload)
	if errs.CodeOf(err) != code {
		h.t.Fatalf("%s: %v %v, want %s", verb, out, err, code)
	}
	return errs.As(err)
}

// newRoomID is a fresh room id.
func newRoomID() string { return "room-" + protocol.RandomToken()[:12] }

// descriptor signs a room descriptor by creator: durable unless
// ephemeral, channels main and side; edit changes it before signing.
func descriptor(t *testing.T, creator keys.Signer, roomID, privacy string, edit func(map[string]any)) json.RawMessage {
	t.Helper()
	d := map[string]any{"rooms": "v1", "room_id": roomID, "name": "room " + roomID, "channels": []any{"main", "side"},
		"record": rooms.DurableRecord(roomID), "policy": map[string]any{}, "privacy": privacy, "creator": creator.Public(),
		"created_at": protocol.FormatTime(time.Now())}
	if edit != nil {
		edit(d)
	}
	sig, err := protocol.SignRoomDescriptor(d, creator)
	if err != nil {
		t.Fatal(err)
	}
	d["sig"] = sig
	b, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// provision provisions a fresh durable room of privacy created by
// creator and returns its descriptor.
func (h *harness) provision(creator keys.Signer, privacy string) (string, json.RawMessage) {
	h.t.Helper()
	id := newRoomID()
	d := descriptor(h.t, creator, id, privacy, nil)
	if out := h.must(creator, "provision", map[string]any{"descriptor": d}); out["created"] != true {
		h.t.Fatalf("provision: %v", out)
	}
	return id, d
}

// emit is a room message from signer for roomID; edit may change the
// envelope before signing.
func emit(t *testing.T, signer keys.Signer, roomID string, payload map[string]any, edit func(*protocol.Envelope)) []byte {
	t.Helper()
	e, err := protocol.New(protocol.TypeEmit, signer.Public(), payload)
	if err != nil {
		t.Fatal(err)
	}
	e.ContextID = roomID
	if edit != nil {
		edit(e)
	}
	if err := e.Sign(signer); err != nil {
		t.Fatal(err)
	}
	b, err := e.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func say(text string) map[string]any {
	return map[string]any{"type": "say", "channel": "main", "in_reply_to": nil, "body": text}
}

// stats sums the ingest counters of every copy.
func (h *harness) stats() rooms.Stats {
	var s rooms.Stats
	for _, w := range h.workers {
		st := w.Stats()
		s.Recorded += st.Recorded
		s.Duplicates += st.Duplicates
		s.Dropped += st.Dropped
	}
	return s
}

func handled(s rooms.Stats) uint64 { return s.Recorded + s.Duplicates + s.Dropped }

// waitHandled waits until the copies have handled n messages in all.
func (h *harness) waitHandled(n uint64) rooms.Stats {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s := h.stats()
		if handled(s) >= n {
			return s
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("only %d of %d room messages handled: %+v", handled(s), n, s)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// publish sends data on subject and reports whether the record took it
// ("recorded", "duplicate" or "dropped"), once a copy has handled it.
func (h *harness) publish(subject string, data []byte) string {
	h.t.Helper()
	before := h.stats()
	if err := h.nc.Publish(subject, data); err != nil {
		h.t.Fatal(err)
	}
	after := h.waitHandled(handled(before) + 1)
	switch {
	case after.Recorded > before.Recorded:
		return "recorded"
	case after.Duplicates > before.Duplicates:
		return "duplicate"
	}
	return "dropped"
}

// say publishes a say from signer in a capability or sealed room and
// expects it recorded.
func (h *harness) say(signer keys.Signer, roomID, text string) []byte {
	h.t.Helper()
	b := emit(h.t, signer, roomID, say(text), nil)
	if got := h.publish(protocol.RoomEventSubject(roomID, "main"), b); got != "recorded" {
		h.t.Fatalf("say %q: %s", text, got)
	}
	return b
}

// room reads a room's record from the bucket.
func (h *harness) room(roomID string) (rooms.Room, bool) {
	h.t.Helper()
	r, found, err := bus.GetJSON[rooms.Room](h.t.Context(), h.kv, rooms.RoomKey(roomID))
	if err != nil {
		h.t.Fatal(err)
	}
	return r, found
}

// quota reads an operator's quota.
func (h *harness) quota(operator string) rooms.Quota {
	h.t.Helper()
	q, _, err := bus.GetJSON[rooms.Quota](h.t.Context(), h.kv, rooms.QuotaKey(operator))
	if err != nil {
		h.t.Fatal(err)
	}
	return q
}

// replayAll reads a room's whole record through mesh.rooms.replay.
func (h *harness) replayAll(signer keys.Signer, d json.RawMessage) []map[string]any {
	h.t.Helper()
	var all []map[string]any
	from := 1.0
	for {
		out := h.must(signer, "replay", map[string]any{"descriptor": d, "from_seq": from, "limit": 1000})
		for _, m := range out["messages"].([]any) {
			all = append(all, m.(map[string]any))
		}
		if out["done"] == true {
			return all
		}
		from = out["next_seq"].(float64)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
