package feeds_test

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/feeds"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

type harness struct {
	t       *testing.T
	m       *bustest.Bus
	workers []*feeds.Worker
	client  *nats.Conn
	caller  keys.Signer
	svcKey  string
}

// start runs three copies of the worker, each on its own connection.
func start(t *testing.T) *harness { return startWith(t, feeds.Config{}) }

func startWith(t *testing.T, cfg feeds.Config) *harness {
	m := bustest.Start(t)
	h := &harness{t: t, m: m, client: bustest.Client(t, m), caller: bustest.Agent(t), svcKey: m.ServicesKey().Public()}
	h.startCopies(cfg)
	return h
}

func (h *harness) startCopies(cfg feeds.Config) {
	h.t.Helper()
	for range 3 {
		w, err := feeds.Start(h.t.Context(), bustest.Env(h.t, h.m, "feeds", nil), cfg)
		if err != nil {
			h.t.Fatal(err)
		}
		h.t.Cleanup(func() { _ = w.Stop() })
		h.workers = append(h.workers, w)
	}
}

// restart stops every copy and starts three new ones.
func (h *harness) restart(cfg feeds.Config) {
	h.t.Helper()
	for _, w := range h.workers {
		if err := w.Stop(); err != nil {
			h.t.Fatal(err)
		}
	}
	h.workers = nil
	h.startCopies(cfg)
}

func (h *harness) stats() feeds.Stats {
	var s feeds.Stats
	for _, w := range h.workers {
		st := w.Stats()
		s.Stored += st.Stored
		s.Superseded += st.Superseded
		s.Dropped += st.Dropped
	}
	return s
}

// publish sends data on the feed subject and waits until a copy has
// handled it as want says (stored, superseded or dropped).
func (h *harness) publish(agent, topic string, data []byte, want string) {
	h.t.Helper()
	before := h.stats()
	if err := h.client.Publish(protocol.FeedSubject(agent, topic), data); err != nil {
		h.t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		s := h.stats()
		if s != before {
			got := "dropped"
			switch {
			case s.Stored > before.Stored:
				got = "stored"
			case s.Superseded > before.Superseded:
				got = "superseded"
			}
			if got != want {
				h.t.Fatalf("publish on %s: %s, want %s", protocol.FeedSubject(agent, topic), got, want)
			}
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("publish on %s never handled", protocol.FeedSubject(agent, topic))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// emit builds a feed publish signed by signer; edit may change it before
// signing.
func emit(t *testing.T, signer keys.Signer, payload any, edit func(*protocol.Envelope)) ([]byte, *protocol.Envelope) {
	t.Helper()
	e, err := protocol.New(protocol.TypeEmit, signer.Public(), payload)
	if err != nil {
		t.Fatal(err)
	}
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
	return b, e
}

type getReply struct {
	Found    bool            `json:"found"`
	Envelope json.RawMessage `json:"envelope"`
}

func (h *harness) get(q map[string]any) (getReply, error) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(h.t.Context(), 5*time.Second)
	defer cancel()
	rep, err := bus.Call(ctx, h.client, h.caller, protocol.SubjFeedGet, protocol.TypeRequest, "", q)
	if err != nil {
		return getReply{}, err
	}
	if rep.From != h.svcKey {
		h.t.Fatalf("answer signed by %s", rep.From)
	}
	var out getReply
	if err := json.Unmarshal(rep.Payload, &out); err != nil || out.Envelope == nil {
		h.t.Fatalf("answer %s: %v", rep.Payload, err)
	}
	return out, nil
}

// latest returns the stored envelope of a feed and checks it is the one
// published as want, byte for byte, and still verifies.
func (h *harness) latest(agent, topic string, want []byte) {
	h.t.Helper()
	r, err := h.get(map[string]any{"agent": agent, "topic": topic})
	if err != nil {
		h.t.Fatal(err)
	}
	if !r.Found {
		h.t.Fatalf("feed %s.%s not found", agent, topic)
	}
	if !bytes.Equal(r.Envelope, want) {
		h.t.Fatalf("stored envelope\n%s\nwant\n%s", r.Envelope, want)
	}
	got, err := protocol.Decode(r.Envelope)
	if err != nil {
		h.t.Fatalf("stored envelope does not verify: %v", err)
	}
	exp, _ := protocol.Decode(want)
	if got.ID != exp.ID || got.Sig != exp.Sig || got.From != agent {
		h.t.Fatalf("stored envelope %s/%s, want %s/%s", got.ID, got.Sig, exp.ID, exp.Sig)
	}
}

func TestFeeds(t *testing.T) {
	h := start(t)
	owner, other := bustest.Agent(t), bustest.Agent(t)
	a := owner.Public()
	state := func(v int) map[string]any {
		return map[string]any{"topic": "status", "kind": "state", "data": map[string]any{"v": v, "note": "<b>&"}}
	}

	// Unknown feed.
	r, err := h.get(map[string]any{"agent": a, "topic": "status"})
	if err != nil || r.Found || string(r.Envelope) != "null" {
		t.Fatalf("unknown feed: %+v %v", r, err)
	}

	// State: the latest envelope comes back exactly as published.
	first, _ := emit(t, owner, state(1), nil)
	h.publish(a, "status", first, "stored")
	h.latest(a, "status", first)
	newer, _ := emit(t, owner, state(2), func(e *protocol.Envelope) { e.TS = protocol.FormatTime(time.Now().Add(time.Second)) })
	h.publish(a, "status", newer, "stored")
	h.latest(a, "status", newer)

	// An older envelope arriving later does not replace it; nor does a
	// repeat of the current one.
	older, _ := emit(t, owner, state(0), func(e *protocol.Envelope) { e.TS = protocol.FormatTime(time.Now().Add(-30 * time.Second)) })
	h.publish(a, "status", older, "superseded")
	h.publish(a, "status", newer, "superseded")
	h.latest(a, "status", newer)

	// Refused: another agent's envelope on the owner's feed, a topic that
	// is not the subject's, a bad kind, no data, not an emit, unsigned,
	// stale, a subject agent that is not a key.
	foreign, _ := emit(t, other, state(9), func(e *protocol.Envelope) { e.TS = protocol.FormatTime(time.Now().Add(2 * time.Second)) })
	h.publish(a, "status", foreign, "dropped")
	mismatch, _ := emit(t, owner, map[string]any{"topic": "other", "kind": "state", "data": 1}, nil)
	h.publish(a, "status", mismatch, "dropped")
	badKind, _ := emit(t, owner, map[string]any{"topic": "status", "kind": "log", "data": 1}, nil)
	h.publish(a, "status", badKind, "dropped")
	noData, _ := emit(t, owner, map[string]any{"topic": "status", "kind": "state"}, nil)
	h.publish(a, "status", noData, "dropped")
	req, _ := emit(t, owner, state(3), func(e *protocol.Envelope) { e.Type = protocol.TypeRequest })
	h.publish(a, "status", req, "dropped")
	e, _ := protocol.New(protocol.TypeEmit, a, state(4))
	unsigned, _ := e.CanonicalUnsigned()
	h.publish(a, "status", unsigned, "dropped")
	stale, _ := emit(t, owner, state(5), func(e *protocol.Envelope) { e.TS = protocol.FormatTime(time.Now().Add(-11 * time.Minute)) })
	h.publish(a, "status", stale, "dropped")
	h.publish("nobody", "status", first, "dropped")
	h.latest(a, "status", newer)
	if r, _ := h.get(map[string]any{"agent": a, "topic": "other"}); r.Found {
		t.Error("a topic-mismatched publish was stored under its payload topic")
	}
	if r, _ := h.get(map[string]any{"agent": other.Public(), "topic": "status"}); r.Found {
		t.Error("a foreign publish was stored under its signer")
	}

	// Stream feeds keep their latest envelope too.
	ev := func(n int) map[string]any { return map[string]any{"topic": "log", "kind": "stream", "data": n} }
	s1, _ := emit(t, owner, ev(1), nil)
	h.publish(a, "log", s1, "stored")
	s2, _ := emit(t, owner, ev(2), func(e *protocol.Envelope) { e.TS = protocol.FormatTime(time.Now().Add(time.Second)) })
	h.publish(a, "log", s2, "stored")
	h.latest(a, "log", s2)

	// Bad queries.
	for _, q := range []map[string]any{{"agent": "x", "topic": "status"}, {"agent": a, "topic": "a.b"}, {"agent": a}, {"topic": "status"}, {"agent": a, "topic": 1}} {
		if _, err := h.get(q); errs.CodeOf(err) != errs.InvalidQuery {
			t.Errorf("query %v: %v, want INVALID_QUERY", q, err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, err := bus.Call(ctx, h.client, h.caller, protocol.SubjFeedGet, protocol.TypeDiscover, "", map[string]any{"agent": a, "topic": "log"}); err != nil {
		t.Errorf("discover type: %v", err)
	}
}

// Copies racing on one feed end with the newest envelope, whatever the
// order they write in.
func TestFeedsRaceKeepsNewest(t *testing.T) {
	h := start(t)
	owner := bustest.Agent(t)
	a := owner.Public()
	base := time.Now().Add(-time.Minute)
	var wires [][]byte
	for i := range 30 {
		b, _ := emit(t, owner, map[string]any{"topic": "t", "kind": "state", "data": i}, func(e *protocol.Envelope) {
			e.TS = protocol.FormatTime(base.Add(time.Duration(i) * time.Second))
		})
		wires = append(wires, b)
	}
	// Publish newest first, then the rest in descending order.
	for i := len(wires) - 1; i >= 0; i-- {
		if err := h.client.Publish(protocol.FeedSubject(a, "t"), wires[i]); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for s := h.stats(); s.Stored+s.Superseded+s.Dropped < 30; s = h.stats() {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v", s)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if s := h.stats(); s.Dropped != 0 || s.Stored < 1 {
		t.Fatalf("stats %+v", s)
	}
	h.latest(a, "t", wires[len(wires)-1])
}

func TestLookupShapes(t *testing.T) {
	req := feeds.LookupRequest("UA", "status")
	if len(req) != 2 || req["agent"] != "UA" || req["topic"] != "status" {
		t.Fatalf("request %v", req)
	}
	if a := feeds.LookupAnswer(false, []byte("ignored")); a["found"] != false || a["envelope"] != nil {
		t.Fatalf("not found %v", a)
	}
	if a := feeds.LookupAnswer(true, []byte(`{"id":"x"}`)); a["found"] != true || string(a["envelope"].(json.RawMessage)) != `{"id":"x"}` {
		t.Fatalf("found %v", a)
	}
}
