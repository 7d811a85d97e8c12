package feeds_test

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/feeds"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

type historyReply struct {
	History []struct {
		Seq      uint64          `json:"seq"`
		Envelope json.RawMessage `json:"envelope"`
	} `json:"history"`
	Last uint64 `json:"last"`
	More bool   `json:"more"`
}

// history reads a page of a feed's history with one mesh.feed.get.
func (h *harness) history(q map[string]any) (historyReply, error) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(h.t.Context(), 5*time.Second)
	defer cancel()
	rep, err := bus.Call(ctx, h.client, h.caller, protocol.SubjFeedGet, protocol.TypeRequest, "", q)
	if err != nil {
		return historyReply{}, err
	}
	if rep.From != h.svcKey {
		h.t.Fatalf("answer signed by %s", rep.From)
	}
	var out historyReply
	if err := json.Unmarshal(rep.Payload, &out); err != nil || out.History == nil {
		h.t.Fatalf("answer %s: %v", rep.Payload, err)
	}
	return out, nil
}

// stored waits until the history stream holds n messages on a feed's
// subject: the broker stores a publish on its own time.
func (h *harness) stored(agent, topic string, n uint64) {
	h.t.Helper()
	js, err := jetstream.New(h.client)
	if err != nil {
		h.t.Fatal(err)
	}
	subj := protocol.FeedSubject(agent, topic)
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := js.Stream(h.t.Context(), feeds.Stream)
		if err != nil {
			h.t.Fatal(err)
		}
		info, err := st.Info(h.t.Context(), jetstream.WithSubjectFilter(subj))
		if err != nil {
			h.t.Fatal(err)
		}
		if got := info.State.Subjects[subj]; got == n {
			return
		} else if time.Now().After(deadline) {
			h.t.Fatalf("%s holds %d messages, want %d", subj, got, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// streamEmits publishes n stream-kind envelopes on agent's feed topic, with
// increasing timestamps, waiting until a copy stored each as the latest.
func streamEmits(h *harness, owner keys.Signer, topic string, n int) [][]byte {
	h.t.Helper()
	base := time.Now().Add(-time.Second)
	wires := make([][]byte, n)
	for i := range n {
		wires[i], _ = emit(h.t, owner, map[string]any{"topic": topic, "kind": "stream", "data": map[string]any{"n": i}}, func(e *protocol.Envelope) {
			e.TS = protocol.FormatTime(base.Add(time.Duration(i) * time.Millisecond))
		})
		h.publish(owner.Public(), topic, wires[i], "stored")
	}
	return wires
}

// TestFeedHistoryInOrderAcrossRestart: a stream feed's envelopes come back
// in the order they were published, in one request, after every copy of
// the worker has restarted.
func TestFeedHistoryInOrderAcrossRestart(t *testing.T) {
	h := start(t)
	owner, other := bustest.Agent(t), bustest.Agent(t)
	a := owner.Public()

	wires := streamEmits(h, owner, "log", 50)
	// In between, on the same subject, what the broker stores but the
	// history must not answer: another agent's envelope (a credential
	// cannot publish it; a service connection can) and a state emit.
	foreign, _ := emit(t, other, map[string]any{"topic": "log", "kind": "stream", "data": 0}, nil)
	h.publish(a, "log", foreign, "dropped")
	state, _ := emit(t, owner, map[string]any{"topic": "log", "kind": "state", "data": 0}, func(e *protocol.Envelope) {
		e.TS = protocol.FormatTime(time.Now().Add(-2 * time.Second))
	})
	h.publish(a, "log", state, "superseded")
	wires = append(wires, streamEmits(h, owner, "log", 50)...)
	// Another feed of the same agent is not this one's history.
	streamEmits(h, owner, "other", 3)
	h.stored(a, "log", 102)

	h.restart(feeds.Config{})

	r, err := h.history(map[string]any{"agent": a, "topic": "log", "since": 0, "limit": 1000})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.History) != 100 || r.More {
		t.Fatalf("history of %d envelopes, more %v; want 100, false", len(r.History), r.More)
	}
	var prev uint64
	for i, e := range r.History {
		if !bytes.Equal(e.Envelope, wires[i]) {
			t.Fatalf("entry %d:\n%s\nwant\n%s", i, e.Envelope, wires[i])
		}
		if e.Seq <= prev {
			t.Fatalf("entry %d has sequence %d after %d", i, e.Seq, prev)
		}
		prev = e.Seq
	}
	if r.Last != prev {
		t.Fatalf("last %d, want %d", r.Last, prev)
	}

	// Paged: since is the last sequence of the page before.
	var paged [][]byte
	since := uint64(0)
	for range 10 {
		p, err := h.history(map[string]any{"agent": a, "topic": "log", "since": since, "limit": 30})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range p.History {
			paged = append(paged, e.Envelope)
		}
		since = p.Last
		if !p.More {
			break
		}
	}
	if len(paged) != 100 || !bytes.Equal(paged[0], wires[0]) || !bytes.Equal(paged[99], wires[99]) {
		t.Fatalf("paged history of %d envelopes", len(paged))
	}
	// Read from a time: all of it from before the first, none from later.
	if p, _ := h.history(map[string]any{"agent": a, "topic": "log", "since": protocol.FormatTime(time.Now().Add(-time.Hour)), "limit": 1000}); len(p.History) != 100 {
		t.Fatalf("history since an hour ago: %d envelopes", len(p.History))
	}
	// The default limit counts stored messages, skipped ones included.
	if p, _ := h.history(map[string]any{"agent": a, "topic": "log", "since": 0}); len(p.History) != feeds.DefaultHistoryLimit-2 || !p.More {
		t.Fatalf("history with the default limit: %d envelopes, more %v", len(p.History), p.More)
	}
	if p, _ := h.history(map[string]any{"agent": a, "topic": "log", "since": protocol.FormatTime(time.Now().Add(time.Hour))}); len(p.History) != 0 || p.More {
		t.Fatalf("history since an hour ahead: %+v", p)
	}
	// Without since or limit the answer is the latest envelope, as before.
	h.latest(a, "log", wires[99])
	// A feed with no history.
	if p, _ := h.history(map[string]any{"agent": other.Public(), "topic": "log", "limit": 10}); len(p.History) != 0 || p.More || p.Last != 0 {
		t.Fatalf("history of an empty feed: %+v", p)
	}

	for _, q := range []map[string]any{
		{"agent": a, "topic": "log", "since": -1},
		{"agent": a, "topic": "log", "since": 1.5},
		{"agent": a, "topic": "log", "since": "yesterday"},
		{"agent": a, "topic": "log", "since": true},
		{"agent": a, "topic": "log", "limit": 0},
		{"agent": a, "topic": "log", "limit": "10"},
	} {
		if _, err := h.history(q); errs.CodeOf(err) != errs.InvalidQuery {
			t.Errorf("query %v: %v, want INVALID_QUERY", q, err)
		}
	}
}

// TestFeedHistoryBound: a feed keeps its newest History.PerFeed envelopes.
func TestFeedHistoryBound(t *testing.T) {
	cfg := feeds.Config{History: feeds.History{PerFeed: 5}}
	h := startWith(t, cfg)
	owner := bustest.Agent(t)
	wires := streamEmits(h, owner, "log", 8)
	h.stored(owner.Public(), "log", 5)
	r, err := h.history(map[string]any{"agent": owner.Public(), "topic": "log", "limit": 100})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.History) != 5 {
		t.Fatalf("%d envelopes kept, want 5", len(r.History))
	}
	for i, e := range r.History {
		if !bytes.Equal(e.Envelope, wires[3+i]) {
			t.Fatalf("entry %d is not emit %d", i, 3+i)
		}
	}
}
