package node

import (
	"context"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// scriptedCallee is a callee without a runtime: the test reads the
// caller's request at the callee's inbox and answers at the caller's
// inbox (protocol 0.3) exactly when and how each case says.
type scriptedCallee struct {
	tm     *testMesh
	key    *keys.Agent
	inbox  *collector
	caller string
}

func (s *scriptedCallee) request(t *testing.T) *protocol.Envelope {
	t.Helper()
	eventually(t, "the request at the callee's inbox", func() bool { return s.inbox.len() > 0 })
	envs := s.inbox.envelopes(t)
	s.inbox.mu.Lock()
	s.inbox.msgs = nil
	s.inbox.mu.Unlock()
	return envs[len(envs)-1]
}

// send signs env with the callee's key, or, forged, with another key
// while it still claims the callee, and publishes it at the caller's inbox.
func (s *scriptedCallee) send(t *testing.T, env *protocol.Envelope, forged bool) {
	t.Helper()
	if !forged {
		s.publish(t, env, s.key)
		return
	}
	signer := agentKey(t)
	env.From = signer.Public()
	if err := env.Sign(signer); err != nil {
		t.Fatal(err)
	}
	env.From = s.key.Public()
	s.publishRaw(t, env)
}

// publish signs env with signer and publishes it at the caller's inbox.
func (s *scriptedCallee) publish(t *testing.T, env *protocol.Envelope, signer *keys.Agent) {
	t.Helper()
	if err := env.Sign(signer); err != nil {
		t.Fatal(err)
	}
	s.publishRaw(t, env)
}

func (s *scriptedCallee) publishRaw(t *testing.T, env *protocol.Envelope) {
	t.Helper()
	data, err := env.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.tm.svc.Publish(protocol.InboxSubject(s.caller), data); err != nil {
		t.Fatal(err)
	}
}

func (s *scriptedCallee) accept(t *testing.T, req *protocol.Envelope, forged bool) {
	t.Helper()
	acc, err := protocol.NewAccept(req, s.key.Public())
	if err != nil {
		t.Fatal(err)
	}
	s.send(t, acc, forged)
}

func (s *scriptedCallee) answer(t *testing.T, req *protocol.Envelope) {
	t.Helper()
	done, err := protocol.NewReply(req, s.key.Public(), map[string]any{"status": "completed", "output": map[string]any{"text": "done"}})
	if err != nil {
		t.Fatal(err)
	}
	s.send(t, done, false)
}

// outcome is what a call returned.
type outcome struct {
	res *Result
	err error
}

// completed checks a call answered "completed", with or without an accept
// reported first.
func completed(t *testing.T, o outcome, accepted bool) {
	t.Helper()
	if o.err != nil || o.res.Status != "completed" || o.res.Accepted != accepted {
		t.Fatalf("result %+v, error %v; want completed, accepted %v", o.res, o.err, accepted)
	}
}

// An accept only extends a call's wait, so the caller verifies it only
// when the wait would otherwise end: an answer that comes first makes its
// verification unnecessary (a forged accept before it is never even
// looked at), a good accept still extends the wait from its arrival, a
// forged one does not, and a flood of forged accepts cannot crowd out the
// callee's own.
func TestAcceptsAreVerifiedWhenTheyMatter(t *testing.T) {
	tm := newMesh(t)
	warned := &warnings{}
	ka, kb := agentKey(t), agentKey(t)
	n := tm.startNode(t, nodeKey(t), []*keys.Agent{ka}, func(c *Config) { c.Warn = warned.add })
	a := tm.host(t, n, AgentConfig{Key: ka, Name: "caller", Handler: refuseAll})
	callee := &scriptedCallee{tm: tm, key: kb, inbox: tm.collect(t, protocol.InboxSubject(kb.Public())), caller: ka.Public()}

	// The wait is 600 ms; a late accept comes at 400 ms and the answer at
	// 800 ms: inside the wait an accept gives (until 1,000 ms), outside
	// the first one, each by 200 ms.
	const wait = 600 * time.Millisecond
	const lateAccept, lateAnswer = 400 * time.Millisecond, 800 * time.Millisecond
	call := func(t *testing.T) (chan outcome, *protocol.Envelope, time.Time) {
		out := make(chan outcome, 1)
		go func() {
			res, err := a.Request(t.Context(), kb.Public(), "work", "hi", RequestOptions{Timeout: wait})
			out <- outcome{res, err}
		}()
		req := callee.request(t)
		return out, req, time.Now()
	}
	at := func(t0 time.Time, d time.Duration) { time.Sleep(time.Until(t0.Add(d))) }
	decodeWarnings := func() int {
		n := 0
		for _, c := range warned.codes() {
			if c == "inbound_decode" {
				n++
			}
		}
		return n
	}

	t.Run("answer first", func(t *testing.T) {
		before := decodeWarnings()
		out, req, _ := call(t)
		callee.accept(t, req, true)
		callee.answer(t, req)
		completed(t, <-out, true)
		// The forged accept was set aside and never verified.
		if got := decodeWarnings(); got != before {
			t.Fatalf("%d accepts were verified", got-before)
		}
	})

	t.Run("a late accept extends the wait", func(t *testing.T) {
		out, req, t0 := call(t)
		at(t0, lateAccept)
		callee.accept(t, req, false)
		at(t0, lateAnswer)
		callee.answer(t, req)
		completed(t, <-out, true)
	})

	t.Run("the latest accept counts", func(t *testing.T) {
		// Two good accepts, set aside: the wait runs from the later one
		// (until 1,000 ms), as it did when each restarted the wait.
		out, req, t0 := call(t)
		at(t0, 100*time.Millisecond)
		callee.accept(t, req, false)
		at(t0, lateAccept)
		callee.accept(t, req, false)
		at(t0, lateAnswer)
		callee.answer(t, req)
		completed(t, <-out, true)
	})

	t.Run("a forged accept does not", func(t *testing.T) {
		before := decodeWarnings()
		out, req, t0 := call(t)
		at(t0, lateAccept)
		callee.accept(t, req, true)
		o := <-out
		mustCode(t, o.err, errs.TransportTimeout)
		// Verified when the wait ran out, and refused.
		if got := decodeWarnings(); got != before+1 {
			t.Fatalf("%d decode warnings, want 1", got-before)
		}
		callee.answer(t, req) // too late: nobody waits
	})

	t.Run("a flood of forged accepts", func(t *testing.T) {
		out, req, t0 := call(t)
		for range maxHeldAccepts {
			callee.accept(t, req, true)
		}
		at(t0, lateAccept)
		callee.accept(t, req, false) // one past the set: verified on arrival
		at(t0, lateAnswer)
		callee.answer(t, req)
		completed(t, <-out, true)
	})

	t.Run("an accept for someone else's call", func(t *testing.T) {
		// Claimed by a signer other than the callee: dropped unverified.
		before := decodeWarnings()
		out, req, _ := call(t)
		acc, _ := protocol.NewAccept(req, kb.Public())
		other := agentKey(t)
		acc.From = other.Public()
		_ = acc.Sign(other)
		data, _ := acc.Marshal()
		if err := tm.svc.Publish(protocol.InboxSubject(ka.Public()), data); err != nil {
			t.Fatal(err)
		}
		callee.answer(t, req)
		completed(t, <-out, false)
		if got := decodeWarnings(); got != before {
			t.Fatalf("%d accepts were verified", got-before)
		}
	})
}

// The public inbox of a guarded agent takes anyone's publish; the agent
// takes only answers to its own waiting calls there, from their callees.
// Everything else is dropped before any verification and without a
// warning, so junk there costs a parse, not an Ed25519 verification and a
// log line each; the answer a call waits for still gets through.
func TestGuardedPublicInboxTakesOnlyAwaitedAnswers(t *testing.T) {
	tm := newMesh(t)
	warned := &warnings{}
	ka, kb := agentKey(t), agentKey(t)
	handled := make(chan string, 8)
	n := tm.startNode(t, nodeKey(t), []*keys.Agent{ka}, func(c *Config) { c.Warn = warned.add })
	a := tm.host(t, n, AgentConfig{Key: ka, Name: "guarded", Guarded: true,
		Handler: func(ctx context.Context, c *Call) error { handled <- c.Env.ID; return c.Reply(nil) },
		OnReply: func(r *Result) { handled <- "reply " + r.RequestID }})
	callee := &scriptedCallee{tm: tm, key: kb, inbox: tm.collect(t, protocol.InboxSubject(kb.Public())), caller: ka.Public()}
	out := make(chan error, 1)
	go func() {
		_, err := a.Request(t.Context(), kb.Public(), "work", "hi", RequestOptions{Timeout: asyncWait})
		out <- err
	}()
	req := callee.request(t)

	stranger := agentKey(t)
	if err := tm.svc.Publish(protocol.InboxSubject(ka.Public()), []byte(`{"not":"an envelope"`)); err != nil {
		t.Fatal(err)
	}
	callee.publish(t, requestEnv03(t, stranger, ka.Public(), "work", "a request past the guard"), stranger)
	other, _ := protocol.NewReply(req, stranger.Public(), map[string]any{"status": "completed"})
	callee.publish(t, other, stranger) // an answer to the waiting call from someone else
	unknown, _ := protocol.New(protocol.TypeRespond, kb.Public(), map[string]any{"status": "completed"})
	unknown.To, unknown.InReplyTo = ka.Public(), protocol.NewID()
	callee.publish(t, unknown, kb) // the callee, but no call waits for it
	forged, _ := protocol.NewReply(req, kb.Public(), map[string]any{"status": "completed"})
	callee.send(t, forged, true) // claims the callee, does not verify

	callee.answer(t, req)
	if err := <-out; err != nil {
		t.Fatalf("the awaited answer did not get through: %v", err)
	}
	// Only the forgery claiming the awaited callee was worth verifying.
	time.Sleep(100 * time.Millisecond)
	if got := warned.codes(); len(got) != 1 || got[0] != "inbound_decode" {
		t.Fatalf("warnings %v, want one inbound_decode (the forged answer)", got)
	}
	select {
	case h := <-handled:
		t.Fatalf("something past the guard was handled: %s", h)
	default:
	}
}
