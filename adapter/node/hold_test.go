package node

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// An attended inbox holds a request: the sender gets the queued
// acknowledgement (never an accept) and no handler runs; the answer given
// later goes to the sender's inbox in reply to the request, once; a
// refusal given later carries its code. The accept-signal fixture's
// "attended_inbox" case.
func TestHeldRequestsAreAnsweredLater(t *testing.T) {
	tm := newMesh(t)
	var handled atomic.Bool
	p, held := attendedPair(t, tm, func(context.Context, *Call) error { handled.Store(true); return nil })
	outbox := tm.collect(t, protocol.OutboxSubject(p.kB.Public()))

	ask := func() *Result {
		t.Helper()
		res, err := p.a.Request(t.Context(), p.kB.Public(), "chat", map[string]any{"text": "are you there?"}, RequestOptions{Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if !res.Queued || res.Accepted || res.InboxID != "entry-"+res.RequestID {
			t.Fatalf("first answer %+v, want the queued acknowledgement without an accept", res)
		}
		return res
	}
	r1, r2 := ask(), ask()
	if handled.Load() {
		t.Fatal("a handler ran on a held request")
	}
	raw1, raw2 := held(r1.RequestID), held(r2.RequestID)

	if err := p.b.AnswerHeld(raw1, map[string]any{"text": "yes, now"}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-p.repliesToA:
		if r.RequestID != r1.RequestID || r.Status != protocol.StateCompleted || r.Output.(map[string]any)["text"] != "yes, now" {
			t.Fatalf("later answer %+v", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the later answer never reached the sender's inbox")
	}
	if err := p.b.AnswerHeld(raw1, map[string]any{"text": "again"}); !errors.Is(err, ErrAlreadyAnswered) {
		t.Fatalf("second answer: %v", err)
	}

	if err := p.b.RefuseHeld(raw2, protocol.BudgetInsufficient(protocol.Money{AmountMicro: 5_000_000, Currency: "USD"}, "too big")); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-p.repliesToA:
		if r.RequestID != r2.RequestID || r.Error == nil || r.Error.Code != errs.BudgetInsufficient {
			t.Fatalf("later refusal %+v", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the later refusal never reached the sender's inbox")
	}
	// Every answer, the acknowledgements too, has its outbox copy; the
	// later answers, which end their requests, state it in their audit
	// headers, and the acknowledgements do not.
	eventually(t, "outbox copies", func() bool { return outbox.len() == 4 })
	outbox.mu.Lock()
	for _, m := range outbox.msgs {
		e, err := protocol.Decode(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		queued := protocol.ResponseStatus(e) == "" && e.Type == protocol.TypeRespond
		if stated := m.Header.Get(protocol.HdrAuditInput) != ""; stated == queued || (stated && m.Header.Get(protocol.HdrAuditOffering) != "chat") {
			t.Errorf("outbox copy of %s (%s): headers %v", e.InReplyTo, protocol.ResponseStatus(e), m.Header)
		}
	}
	outbox.mu.Unlock()

	// Only a request to this agent, as received, can be answered.
	other := requestEnv(t, agentKey(t), p.kA.Public(), "chat", nil)
	b, _ := other.Marshal()
	if err := p.b.AnswerHeld(b, nil); err == nil {
		t.Fatal("answered a request addressed to someone else")
	}
	if err := p.b.AnswerHeld(append([]byte{}, raw2[:len(raw2)-2]...), nil); err == nil {
		t.Fatal("answered a damaged request")
	}
}

// attendedPair is a pair whose agent b holds every request for its
// attended inbox (entry id "entry-<request id>") and runs handler for
// none; held returns a held request's raw envelope by id.
func attendedPair(t *testing.T, tm *testMesh, handler Handler) (p *pair, held func(id string) []byte) {
	t.Helper()
	var mu sync.Mutex
	raws := map[string][]byte{}
	p = newPair(t, tm, AgentConfig{Name: "inbox", Offerings: []Offering{{ID: "chat", Name: "Chat"}},
		Admit: func(_ context.Context, c *Call, _ *protocol.Budget) error {
			mu.Lock()
			defer mu.Unlock()
			raws[c.Env.ID] = c.Env.Raw()
			return Hold("entry-" + c.Env.ID)
		},
		Handler: handler}, nil)
	return p, func(id string) []byte {
		mu.Lock()
		defer mu.Unlock()
		return raws[id]
	}
}
