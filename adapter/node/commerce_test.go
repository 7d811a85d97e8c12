package node

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

const freeEcho = `{"sku":"echo-free","covers":{"offerings":["echo"]},"price":{"model":"free"},"provider":{"id":"internal"}}`

// admitFunc is how the test's agreements service answers.
type admitFunc func() (any, error)

// fake is the test's stand-in for the agreements service, signing with
// its own key; it starts answering at the first set.
type fake struct {
	t      *testing.T
	tm     *testMesh
	key    keys.Signer
	answer atomic.Pointer[admitFunc]
	svc    *bus.Service
}

// fakeAgreements stops the mesh's agreements service and returns a
// stand-in signing with key, not answering yet (no responders).
func (tm *testMesh) fakeAgreements(t *testing.T, key keys.Signer) *fake {
	t.Helper()
	for _, w := range tm.m.Workers().Agreements {
		if err := w.Stop(); err != nil {
			t.Fatal(err)
		}
	}
	f := &fake{t: t, tm: tm, key: key}
	t.Cleanup(f.stop)
	return f
}

// set makes f answer with a, starting it when it was not answering.
func (f *fake) set(a admitFunc) {
	f.t.Helper()
	f.answer.Store(&a)
	if f.svc != nil {
		return
	}
	svc, err := bus.NewServiceIn(bus.Env{NC: f.tm.svc, Key: f.key}, "test-agreements", "the test's agreements service")
	if err != nil {
		f.t.Fatal(err)
	}
	f.svc = svc
	if err := svc.Endpoint("admit", protocol.SubjCommerceAdmit, func(context.Context, *bus.Request) (any, error) {
		return (*f.answer.Load())()
	}); err != nil {
		f.t.Fatal(err)
	}
	if err := f.tm.svc.Flush(); err != nil {
		f.t.Fatal(err)
	}
}

// stop ends f's answers.
func (f *fake) stop() {
	if f.svc != nil {
		_ = f.svc.Stop()
		f.svc = nil
	}
}

func admitted() (any, error) { return map[string]any{"admitted": true}, nil }

// An agent that publishes SKUs, free ones only, fails closed when the
// agreements service cannot decide (review finding 5): no answer, an
// answer that is no commerce refusal (finding 13: passed on as the same
// UNAVAILABLE, the cause never told), or an answer signed by a key other
// than the pinned services key. A commerce refusal is passed on as the
// service worded it.
func TestCommerceAdmissionFailsClosed(t *testing.T) {
	tm := newMesh(t)
	ka, kb := agentKey(t), agentKey(t)
	nA := tm.startNode(t, nodeKey(t), []*keys.Agent{ka}, nil)
	a := tm.host(t, nA, AgentConfig{Key: ka, Name: "caller", Handler: refuseAll})
	nB := tm.startNode(t, nodeKey(t), []*keys.Agent{kb}, func(c *Config) { c.ServicesKey = tm.m.ServicesKey().Public() })
	var served atomic.Int32
	tm.host(t, nB, AgentConfig{Key: kb, Name: "seller", Offerings: []Offering{{ID: "echo"}}, SKUs: []commerce.SKU{mustSKU(t, freeEcho)},
		Handler: func(_ context.Context, c *Call) error { served.Add(1); return c.Reply("echo") }})
	ask := func() error {
		_, err := a.Request(t.Context(), kb.Public(), "echo", "hi", RequestOptions{Timeout: 15 * time.Second})
		return err
	}
	undecided := func(what string, err error) {
		t.Helper()
		e := errs.As(err)
		if err == nil || e.Code != errs.Unavailable || !e.Retryable || e.RetryAfterMS <= 0 || strings.Contains(e.Message, "registered") {
			t.Fatalf("%s: %v, want a retryable UNAVAILABLE with retry_after_ms", what, err)
		}
	}

	f := tm.fakeAgreements(t, tm.m.ServicesKey())
	undecided("no agreements service", ask())
	f.set(func() (any, error) {
		return nil, errs.Newf(errs.NotFound, "agent %s is not registered: it sells nothing here", kb.Public())
	})
	undecided("a NOT_FOUND from the service", ask())
	f.set(func() (any, error) {
		return nil, errs.New(errs.InvalidRequest, "admit: offering must be the requested offering id")
	})
	undecided("an INVALID_REQUEST from the service", ask())
	f.set(func() (any, error) {
		return nil, errs.New(errs.RateLimited, "the engagement sow-1 admits 1 request per hour").WithRetryAfter(60_000).WithDetail("sow_id", "sow-1")
	})
	if err := ask(); errs.CodeOf(err) != errs.RateLimited || errs.As(err).Details["sow_id"] != "sow-1" {
		t.Fatalf("a commerce refusal: %v", err)
	}
	f.set(func() (any, error) {
		return nil, errs.New(errs.Forbidden, "the engagement sow-1 covers only other").WithDetails(map[string]any{"sow_id": "sow-1", "offerings": []string{"other"}})
	})
	if err := ask(); errs.CodeOf(err) != errs.Forbidden || errs.As(err).Details["sow_id"] != "sow-1" {
		t.Fatalf("an engagement's scope refusal: %v", err)
	}
	f.set(func() (any, error) { return nil, errs.New(errs.Forbidden, "only the mesh's services may call this") })
	undecided("a FORBIDDEN that is no scope refusal", ask())
	if served.Load() != 0 {
		t.Fatalf("the handler ran %d times", served.Load())
	}
	f.set(admitted)
	if err := ask(); err != nil || served.Load() != 1 {
		t.Fatalf("admitted: %v (served %d)", err, served.Load())
	}

	// Admitted by a key other than the pinned services key: not trusted.
	f.stop()
	impostor := tm.fakeAgreements(t, agentKey(t))
	impostor.set(admitted)
	undecided("an answer signed by another key", ask())
	if served.Load() != 1 {
		t.Fatalf("the handler ran on an impostor's word")
	}
}

// A drained request to a commerce seller during an outage of the
// agreements service is not consumed: it stays in the mailbox, unanswered
// and not journaled, and a later drain serves it (review finding 12).
func TestDrainedRequestWaitsOutAnOutage(t *testing.T) {
	tm := newMesh(t)
	ka, kb, nkb := agentKey(t), agentKey(t), nodeKey(t)
	late := make(chan *Result, 8)
	nA := tm.startNode(t, nodeKey(t), []*keys.Agent{ka}, nil)
	a := tm.host(t, nA, AgentConfig{Key: ka, Name: "a", Handler: refuseAll, OnReply: func(r *Result) { late <- r }})
	cfg := AgentConfig{Key: kb, Name: "seller", Offerings: []Offering{{ID: "echo"}}, SKUs: []commerce.SKU{mustSKU(t, freeEcho)},
		Handler: func(_ context.Context, c *Call) error { return c.Reply("echo") }}

	// The seller registers once (so it has a mailbox) and goes offline.
	nB := tm.startNode(t, nkb, []*keys.Agent{kb}, nil)
	tm.host(t, nB, cfg)
	if err := nB.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := a.Request(t.Context(), kb.Public(), "echo", "while you were out", RequestOptions{Timeout: 300 * time.Millisecond})
	mustCode(t, err, errs.TransportTimeout)
	id := errs.As(err).Details["request_id"].(string)

	f := tm.fakeAgreements(t, tm.m.ServicesKey()) // the outage
	nB = tm.startNode(t, nkb, []*keys.Agent{kb}, nil)
	b := tm.host(t, nB, cfg)
	b.DrainNow()
	if got := tm.mailboxStored(t, kb.Public()); got != 1 {
		t.Fatalf("the mailbox holds %d messages after the drain in the outage, want the request", got)
	}
	if nB.journal.Answered(ka.Public(), id) {
		t.Fatal("the request was journaled")
	}
	select {
	case r := <-late:
		t.Fatalf("answered during the outage: %+v", r)
	case <-time.After(200 * time.Millisecond):
	}

	f.set(admitted) // the service is back
	b.DrainNow()
	select {
	case r := <-late:
		if r.RequestID != id || r.Status != protocol.StateCompleted {
			t.Fatalf("late answer %+v", r)
		}
	case <-time.After(asyncWait):
		t.Fatal("the kept request was not served by the next drain")
	}
	eventually(t, "the served request acknowledged", func() bool { return tm.mailboxStored(t, kb.Public()) == 0 })
}
