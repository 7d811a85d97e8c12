package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// worker is agent b's handler for the tests: a few offerings and counters.
type worker struct {
	calls    atomic.Int64
	release  chan struct{} // "task-wait" waits for it
	canceled chan error    // "long" reports its context's end
	lastCall atomic.Pointer[Call]
}

func newWorker() *worker {
	return &worker{release: make(chan struct{}), canceled: make(chan error, 4)}
}

var workerOfferings = []Offering{
	{ID: "echo", Name: "Echo"}, {ID: "task"}, {ID: "task-wait"}, {ID: "stream"}, {ID: "long"}, {ID: "quick-task"}, {ID: "echo-wait"},
}

func (w *worker) handle(ctx context.Context, c *Call) error {
	w.calls.Add(1)
	w.lastCall.Store(c)
	switch c.Offering {
	case "echo":
		return c.Reply(map[string]any{"echo": c.RawInput()})
	case "echo-wait":
		<-w.release
		return c.Reply(map[string]any{"echo": c.RawInput()})
	case "task":
		t, err := c.StartTask()
		if err != nil {
			return err
		}
		if err := t.Progress("half way"); err != nil {
			return err
		}
		return t.Complete(map[string]any{"done": true})
	case "task-wait":
		t, err := c.StartTask()
		if err != nil {
			return err
		}
		<-w.release
		if err := t.Progress("half way"); err != nil {
			return err
		}
		return t.Complete(map[string]any{"done": true})
	case "stream":
		t, err := c.StartTask()
		if err != nil {
			return err
		}
		for i := range 3 {
			if err := t.Chunk(fmt.Sprintf("part %d", i)); err != nil {
				return err
			}
		}
		return t.Complete(map[string]any{"parts": 3})
	case "long":
		t, err := c.StartTask()
		if err != nil {
			return err
		}
		<-t.Context().Done()
		w.canceled <- ctx.Err()
		return nil
	case "quick-task":
		t, err := c.StartTask()
		if err != nil {
			return err
		}
		return t.Complete("done")
	}
	return errs.New(errs.InputInvalid, "unexpected offering")
}

func newWorkerPair(t *testing.T, edit func(*AgentConfig)) (*pair, *worker) {
	t.Helper()
	tm := newMesh(t)
	w := newWorker()
	cfg := AgentConfig{Name: "worker", Offerings: workerOfferings, Handler: w.handle}
	if edit != nil {
		edit(&cfg)
	}
	return newPair(t, tm, cfg, nil), w
}

func TestRequestAcceptThenBareReply(t *testing.T) {
	p, w := newWorkerPair(t, nil)
	out := p.tm.collect(t, protocol.OutboxSubject(p.b.ID()))

	res, err := p.a.Request(t.Context(), p.b.ID(), "echo", map[string]any{"text": "hello --- there"}, RequestOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Accepted || res.Status != "completed" || res.TaskID != "" || res.From != p.b.ID() {
		t.Fatalf("result: %+v", res)
	}
	if echo := res.Output.(map[string]any)["echo"].(map[string]any); echo["text"] != "hello --- there" {
		t.Fatalf("output: %v", res.Output)
	}
	c := w.lastCall.Load()
	if c.Sender() != p.a.ID() || c.SenderText != "hello --- there" || c.Source != protocol.SourceLive {
		t.Fatalf("call: sender %s text %q source %v", c.Sender(), c.SenderText, c.Source)
	}
	if framed, _ := c.Input.(map[string]any)["text"].(string); !strings.Contains(framed, "--- BEGIN SENDER MESSAGE ---") || !strings.Contains(framed, " hello --- there") {
		t.Fatalf("handler input is not framed and fenced: %q", framed)
	}

	// On the wire: the accept first, then the bare completed reply, signed
	// by b, in reply to the request. The outbox has a copy of each answer;
	// an accept is copied there only when no answer follows within
	// AcceptCopyDelay (the activity worker learns the request from the
	// answer's copy).
	raw := p.tm.rawRequest(t, protocol.InboxSubject(p.b.ID()), requestEnv(t, p.kA, p.b.ID(), "echo", "again"))
	eventually(t, "two answers", func() bool { return raw.len() == 2 })
	envs := raw.envelopes(t)
	if got := statuses(envs); got[0] != "accepted" || got[1] != "completed" {
		t.Fatalf("reply order %v", got)
	}
	if envs[0].TaskID != "" || !protocol.IsAccepted(envs[0]) || envs[0].To != p.a.ID() {
		t.Fatalf("accept: %+v", envs[0])
	}
	eventually(t, "outbox copies", func() bool { return out.len() == 2 })
	time.Sleep(AcceptCopyDelay + 500*time.Millisecond) // no accept copy comes later
	for _, e := range out.envelopes(t) {
		if e.From != p.b.ID() || e.Type != protocol.TypeRespond || e.InReplyTo == "" {
			t.Fatalf("outbox copy: %+v", e)
		}
	}
	if got := statuses(out.envelopes(t)); strings.Join(got, ",") != "completed,completed" {
		t.Fatalf("outbox statuses %v", got)
	}
	// A handler still working when the delay ends: the accept's copy goes
	// out then, and the answer's after it.
	done := make(chan error, 1)
	go func() {
		_, err := p.a.Request(t.Context(), p.b.ID(), "echo-wait", map[string]any{"text": "slow"}, RequestOptions{})
		done <- err
	}()
	eventually(t, "the accept's copy", func() bool { return out.len() == 3 })
	if got := statuses(out.envelopes(t)); got[2] != "accepted" {
		t.Fatalf("outbox statuses while the handler works %v", got)
	}
	close(w.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	eventually(t, "the answer's copy", func() bool { return out.len() == 4 })
	if got := statuses(out.envelopes(t)); got[3] != "completed" {
		t.Fatalf("outbox statuses %v", got)
	}

	// The registry stored the manifest with the vouch by node B.
	man := p.tm.registered(t, p.kA, p.b.ID())
	node, _ := man["node"].(map[string]any)
	att, _ := node["attestation"].(map[string]any)
	if man["endpoint"] != protocol.InboxSubject(p.b.ID()) || node["id"] != p.nB.ID() || att["sig"] != p.b.Vouch().Sig {
		t.Fatalf("registration: %v", man)
	}
	if offs, _ := man["offerings"].([]any); len(offs) != len(workerOfferings) {
		t.Fatalf("offerings: %v", man["offerings"])
	}
	v := p.b.Vouch()
	exp, _ := protocol.ParseTime(v.ExpiresAt)
	iss, _ := protocol.ParseTime(v.IssuedAt)
	if exp.Sub(iss) != VouchLifetimeUndeclared || v.Node != p.nB.ID() {
		t.Fatalf("vouch without availability class: %+v", v)
	}
}

// An accept whose call is still unanswered when its node closes has its
// outbox copy published at the close, not lost with the delay's timer.
func TestCloseSendsWaitingAcceptCopies(t *testing.T) {
	p, w := newWorkerPair(t, nil)
	out := p.tm.collect(t, protocol.OutboxSubject(p.b.ID()))
	raw := p.tm.rawRequest(t, protocol.InboxSubject(p.b.ID()), requestEnv(t, p.kA, p.b.ID(), "echo-wait", "slow"))
	eventually(t, "the accept", func() bool { return raw.len() == 1 })
	if out.len() != 0 {
		t.Fatalf("an accept copied before its delay: %d copies", out.len())
	}
	done := make(chan error, 1)
	go func() { done <- p.nB.Close() }()
	eventually(t, "the accept's copy at the close", func() bool { return out.len() == 1 })
	if got := statuses(out.envelopes(t)); got[0] != "accepted" {
		t.Fatalf("outbox %v", got)
	}
	close(w.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestTaskModeWithProgress(t *testing.T) {
	p, w := newWorkerPair(t, nil)
	// Follow: subscribed before the request, so nothing is missed.
	res, err := p.a.Request(t.Context(), p.b.ID(), "task", nil, RequestOptions{Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != "working" || res.Task == nil || res.TaskID == "" || res.Env.TaskID != res.TaskID {
		t.Fatalf("result: %+v", res)
	}
	defer res.Task.Close()
	var seq []string
	for {
		u, err := res.Task.NextUpdate(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		seq = append(seq, u.Status+":"+u.Message)
		if protocol.Terminal(u.Status) {
			if u.Output.(map[string]any)["done"] != true || u.Env.From != p.b.ID() || u.Env.To != p.a.ID() {
				t.Fatalf("final update: %+v", u)
			}
			break
		}
	}
	if strings.Join(seq, ",") != "submitted:,working:,working:half way,completed:" {
		t.Fatalf("updates %v", seq)
	}
	u, err := res.Task.Wait(t.Context())
	if err != nil || u.Status != "completed" {
		t.Fatalf("wait: %+v %v", u, err)
	}

	// Subscribing after the answer: Wait still sees the end of a task that
	// is still running (and asks the task record first).
	res, err = p.a.Request(t.Context(), p.b.ID(), "task-wait", nil, RequestOptions{})
	if err != nil {
		t.Fatal(err)
	}
	close(w.release)
	u, err = res.Task.Wait(t.Context())
	if err != nil || u.Status != "completed" || u.Output.(map[string]any)["done"] != true {
		t.Fatalf("late wait: %+v %v", u, err)
	}
}

func TestStreamingIsCountVerified(t *testing.T) {
	p, _ := newWorkerPair(t, nil)
	res, err := p.a.Request(t.Context(), p.b.ID(), "stream", nil, RequestOptions{Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	r := res.Task.Stream()
	var parts []string
	for {
		c, err := r.Next(t.Context())
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !c.Signed || c.Index != len(parts) {
			t.Fatalf("chunk %+v", c)
		}
		parts = append(parts, c.Data.(string))
	}
	if strings.Join(parts, "|") != "part 0|part 1|part 2" {
		t.Fatalf("parts %v", parts)
	}
	u, err := res.Task.Wait(t.Context())
	if err != nil || u.Output.(map[string]any)["parts"] != float64(3) {
		t.Fatalf("wait %+v %v", u, err)
	}

	// Hand-made streams from b's key, to check the reader's verdicts.
	other := agentKey(t)
	frame := func(signer *keys.Agent, task string, payload map[string]any, signed bool) []byte {
		e, err := protocol.New(protocol.TypeRespond, signer.Public(), payload)
		if err != nil {
			t.Fatal(err)
		}
		e.TaskID, e.To = task, p.a.ID()
		if !signed {
			b, err := e.CanonicalUnsigned()
			if err != nil {
				t.Fatal(err)
			}
			return b
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
	chunk := func(i int, data any) map[string]any {
		return map[string]any{"status": "working", "chunk_index": i, "final": false, "data": data}
	}
	final := func(i, count int, data any) map[string]any {
		return map[string]any{"status": "completed", "chunk_index": i, "final": true, "chunk_count": count, "data": data}
	}
	read := func(task string, frames ...[]byte) ([]*Chunk, error) {
		h, err := p.a.TaskFrom(p.b.ID(), task)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		for _, f := range frames {
			if err := p.tm.svc.Publish(protocol.TaskStreamSubject(task), f); err != nil {
				t.Fatal(err)
			}
		}
		r := h.Stream()
		var got []*Chunk
		for {
			ctx, cancel := context.WithTimeout(t.Context(), asyncWait)
			c, err := r.Next(ctx)
			cancel()
			if errors.Is(err, io.EOF) {
				return got, nil
			}
			if err != nil {
				return got, err
			}
			got = append(got, c)
		}
	}

	// A frame from another key is dropped uncounted; an unsigned
	// intermediate chunk from the performer counts (unverified).
	got, err := read("t-good",
		frame(p.kB, "t-good", chunk(0, "a"), true),
		frame(other, "t-good", chunk(1, "intruder"), true),
		frame(p.kB, "t-good", chunk(1, "b"), false),
		frame(p.kB, "t-good", final(2, 3, "c"), true))
	if err != nil || len(got) != 3 || got[1].Signed || got[1].Data != "b" || !got[2].Final || got[2].Data != "c" {
		t.Fatalf("good stream: %v %v", got, err)
	}
	// A count that does not match what arrived.
	_, err = read("t-tampered",
		frame(p.kB, "t-tampered", chunk(0, "a"), true),
		frame(p.kB, "t-tampered", chunk(1, "b"), true),
		frame(p.kB, "t-tampered", final(2, 5, nil), true))
	mustCode(t, err, errs.InvalidEnvelope)
	// An unsigned final chunk.
	_, err = read("t-unsigned",
		frame(p.kB, "t-unsigned", chunk(0, "a"), true),
		frame(p.kB, "t-unsigned", final(1, 2, nil), false))
	mustCode(t, err, errs.IdentityMismatch)
}

func TestUnknownOfferingFailsAfterAccept(t *testing.T) {
	p, w := newWorkerPair(t, nil)
	res, err := p.a.Request(t.Context(), p.b.ID(), "no-such-offering", "hi", RequestOptions{})
	mustCode(t, err, errs.OfferingNotFound)
	if res == nil || !res.Accepted || res.Status != "failed" {
		t.Fatalf("result %+v", res)
	}
	if w.calls.Load() != 0 {
		t.Fatal("the handler saw an undeclared offering")
	}
}

func TestBudgetRefusalReplacesAccept(t *testing.T) {
	p, w := newWorkerPair(t, func(c *AgentConfig) {
		c.Admit = func(ctx context.Context, call *Call, b *protocol.Budget) error {
			if b == nil || b.CostCeiling == nil || b.CostCeiling.AmountMicro < 5_000_000 {
				return protocol.BudgetInsufficient(protocol.Money{AmountMicro: 5_000_000, Currency: "USD"}, "")
			}
			return nil
		}
	})
	low := &protocol.Budget{Revision: 0, CostCeiling: &protocol.Money{AmountMicro: 1_000_000, Currency: "USD"}}

	// On the wire: the refusal is the first and only reply.
	env, err := protocol.New(protocol.TypeRequest, p.kA.Public(), map[string]any{"offering": "echo", "input": "x"})
	if err != nil {
		t.Fatal(err)
	}
	env.V, env.To, env.Budget = "0.2.0", p.b.ID(), low // a peer reading answers on the reply subject
	if err := env.Sign(p.kA); err != nil {
		t.Fatal(err)
	}
	raw := p.tm.rawRequest(t, protocol.InboxSubject(p.b.ID()), env)
	eventually(t, "the refusal", func() bool { return raw.len() >= 1 })
	time.Sleep(200 * time.Millisecond)
	envs := raw.envelopes(t)
	if len(envs) != 1 || protocol.ResponseStatus(envs[0]) != "failed" {
		t.Fatalf("replies %v", statuses(envs))
	}
	var p0 struct {
		Error struct {
			Code    string         `json:"code"`
			Details map[string]any `json:"details"`
		} `json:"error"`
	}
	if err := envs[0].DecodePayload(&p0); err != nil || p0.Error.Code != "BUDGET_INSUFFICIENT" || p0.Error.Details["estimate"] == nil {
		t.Fatalf("refusal %s", envs[0].Payload)
	}

	// Through the API: no accept, the refusal's estimate.
	res, err := p.a.Request(t.Context(), p.b.ID(), "echo", "x", RequestOptions{Budget: low})
	mustCode(t, err, errs.BudgetInsufficient)
	if res.Accepted {
		t.Fatal("an accept preceded the budget refusal")
	}
	// A deadline already past is refused at admission by the runtime.
	past := &protocol.Budget{Revision: 0, Deadline: protocol.FormatTime(time.Now().Add(-time.Hour)), CostCeiling: &protocol.Money{AmountMicro: 9_000_000, Currency: "USD"}}
	_, err = p.a.Request(t.Context(), p.b.ID(), "echo", "x", RequestOptions{Budget: past})
	mustCode(t, err, errs.DeadlineUnmeetable)
	// Enough budget: admitted; the handler sees the budget line.
	ok := &protocol.Budget{Revision: 0, CostCeiling: &protocol.Money{AmountMicro: 6_000_000, Currency: "USD"}}
	if _, err := p.a.Request(t.Context(), p.b.ID(), "echo", "x", RequestOptions{Budget: ok}); err != nil {
		t.Fatal(err)
	}
	if w.calls.Load() != 1 || !strings.HasPrefix(w.lastCall.Load().BudgetLine, "budget: ceiling 6.00 USD") {
		t.Fatalf("calls %d, line %q", w.calls.Load(), w.lastCall.Load().BudgetLine)
	}
}

func TestOversizeRefusedLocallyAndByReceiver(t *testing.T) {
	limit := 10
	p, w := newWorkerPair(t, func(c *AgentConfig) { c.Limits.MaxInboundChars = &limit })
	inbox := p.tm.collect(t, protocol.InboxSubject(p.b.ID()))
	big := map[string]any{"text": strings.Repeat("x", 11)}

	_, err := p.a.Request(t.Context(), p.b.ID(), "echo", big, RequestOptions{Limits: &protocol.RecipientLimits{MaxInboundChars: &limit}})
	mustCode(t, err, errs.ContextTooLarge)
	if err := p.tm.svc.Flush(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if inbox.len() != 0 {
		t.Fatalf("pre-flight published %d messages", inbox.len())
	}

	// Bypassing pre-flight: the receiver refuses, in reply to the request.
	env := requestEnv(t, p.kA, p.b.ID(), "echo", big)
	raw := p.tm.rawRequest(t, protocol.InboxSubject(p.b.ID()), env)
	eventually(t, "the refusal", func() bool { return raw.len() == 1 })
	rep := raw.envelopes(t)[0]
	if rep.InReplyTo != env.ID || rep.To != p.a.ID() || protocol.ResponseStatus(rep) != "failed" || !strings.Contains(string(rep.Payload), "CONTEXT_TOO_LARGE") {
		t.Fatalf("refusal %+v %s", rep, rep.Payload)
	}
	eventually(t, "the inbound_oversize warning", func() bool { return p.warnB.has("inbound_oversize") })
	time.Sleep(100 * time.Millisecond)
	if raw.len() != 1 || w.calls.Load() != 0 {
		t.Fatalf("replies %d, handler calls %d", raw.len(), w.calls.Load())
	}
	// Exactly at the limit is fine.
	if _, err := p.a.Request(t.Context(), p.b.ID(), "echo", strings.Repeat("y", 10), RequestOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestUnverifiedInboundNeverReachesTheHandler(t *testing.T) {
	p, w := newWorkerPair(t, nil)
	subject := protocol.InboxSubject(p.b.ID())
	idMismatch := func(c *collector) {
		t.Helper()
		eventually(t, "the refusal", func() bool { return c.len() == 1 })
		rep := c.envelopes(t)[0]
		if rep.From != p.b.ID() || rep.To != "" || rep.InReplyTo != "" || !strings.Contains(string(rep.Payload), "IDENTITY_MISMATCH") {
			t.Fatalf("refusal %+v %s", rep, rep.Payload)
		}
	}

	// Unsigned.
	e, _ := protocol.New(protocol.TypeRequest, p.kA.Public(), map[string]any{"offering": "echo", "input": "x"})
	e.To = p.b.ID()
	unsigned, _ := e.CanonicalUnsigned()
	idMismatch(p.tm.rawPublish(t, subject, unsigned))

	// Mis-attributed: signed by one key, claiming another.
	mallory := agentKey(t)
	e = requestEnv(t, mallory, p.b.ID(), "echo", "x")
	e.From = p.kA.Public()
	idMismatch(p.tm.rawRequest(t, subject, e))

	// Stale and misaddressed: silent, with a local warning.
	e, _ = protocol.New(protocol.TypeRequest, p.kA.Public(), map[string]any{"offering": "echo", "input": "x"})
	e.To, e.TS = p.b.ID(), protocol.FormatTime(time.Now().Add(-time.Hour))
	_ = e.Sign(p.kA)
	stale := p.tm.rawRequest(t, subject, e)
	misaddressed := p.tm.rawRequest(t, subject, requestEnv(t, p.kA, mallory.Public(), "echo", "x"))
	eventually(t, "warnings", func() bool { return p.warnB.has("inbound_freshness") && p.warnB.has("inbound_address") })
	time.Sleep(100 * time.Millisecond)
	if stale.len() != 0 || misaddressed.len() != 0 || w.calls.Load() != 0 {
		t.Fatalf("stale %d misaddressed %d handler %d", stale.len(), misaddressed.len(), w.calls.Load())
	}
}

func TestCancel(t *testing.T) {
	p, w := newWorkerPair(t, nil)
	res, err := p.a.Request(t.Context(), p.b.ID(), "long", nil, RequestOptions{Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	cres, err := res.Task.Cancel(t.Context(), protocol.CancelUserRequested, "enough")
	if err != nil || cres.Status != "canceled" || cres.Accepted {
		t.Fatalf("cancel: %+v %v", cres, err)
	}
	select {
	case err := <-w.canceled:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("handler context: %v", err)
		}
	case <-time.After(asyncWait):
		t.Fatal("the handler's context was not canceled")
	}
	u, err := res.Task.Wait(t.Context())
	if err != nil || u.Status != "canceled" || u.Reason != "user_requested" || u.Note != "enough" || u.Env.From != p.b.ID() {
		t.Fatalf("canceled update: %+v %v", u, err)
	}
	_, err = res.Task.Cancel(t.Context(), protocol.CancelUserRequested, "")
	mustCode(t, err, errs.TaskNotCancelable)

	// A finished task.
	res, err = p.a.Request(t.Context(), p.b.ID(), "quick-task", nil, RequestOptions{Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := res.Task.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	_, err = res.Task.Cancel(t.Context(), protocol.CancelSuperseded, "")
	mustCode(t, err, errs.TaskNotCancelable)

	// Unknown task, and a bad reason.
	h, _ := p.a.TaskFrom(p.b.ID(), "no-such-task")
	_, err = h.Cancel(t.Context(), protocol.CancelPolicy, "")
	mustCode(t, err, errs.TaskNotFound)
	_, err = p.a.Request(t.Context(), p.b.ID(), protocol.OfferingTaskCancel, map[string]any{"task_id": res.TaskID, "reason": "USER_REQUESTED"}, RequestOptions{})
	mustCode(t, err, errs.InvalidEnvelope)
}

// TestCancelAfterRestart: TASK_NOT_CANCELABLE comes from the task record,
// so it holds once the performer's process, which ran the task, is gone.
func TestCancelAfterRestart(t *testing.T) {
	p, w := newWorkerPair(t, nil)
	// One completed task, one canceled task, both recorded.
	done, err := p.a.Request(t.Context(), p.b.ID(), "quick-task", nil, RequestOptions{Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := done.Task.Wait(t.Context()); err != nil {
		t.Fatal(err)
	}
	canceled, err := p.a.Request(t.Context(), p.b.ID(), "long", nil, RequestOptions{Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := canceled.Task.Cancel(t.Context(), protocol.CancelUserRequested, ""); err != nil {
		t.Fatal(err)
	}
	<-w.canceled
	for _, h := range []*TaskHandle{done.Task, canceled.Task} {
		eventually(t, "the terminal record of "+h.ID, func() bool {
			rec, err := h.Get(t.Context())
			return err == nil && protocol.Terminal(rec["state"].(string))
		})
	}

	// The performer's process ends and a new one hosts the same agent:
	// nothing of the tasks is left in memory.
	if err := p.nB.Close(); err != nil {
		t.Fatal(err)
	}
	nB := p.tm.startNode(t, p.nkB, []*keys.Agent{p.kB}, nil)
	p.tm.host(t, nB, AgentConfig{Key: p.kB, Name: "worker", Offerings: workerOfferings, Handler: w.handle})

	_, err = done.Task.Cancel(t.Context(), protocol.CancelSuperseded, "")
	mustCode(t, err, errs.TaskNotCancelable)
	_, err = canceled.Task.Cancel(t.Context(), protocol.CancelUserRequested, "again")
	mustCode(t, err, errs.TaskNotCancelable)

	// Anyone but the requester is told the task does not exist, as is the
	// requester of a task that has no record.
	kC, nkC := agentKey(t), nodeKey(t)
	nC := p.tm.startNode(t, nkC, []*keys.Agent{kC}, nil)
	c := p.tm.host(t, nC, AgentConfig{Key: kC, Name: "stranger", Handler: refuseAll})
	h, err := c.TaskFrom(p.b.ID(), done.TaskID)
	if err != nil {
		t.Fatal(err)
	}
	_, err = h.Cancel(t.Context(), protocol.CancelPolicy, "")
	mustCode(t, err, errs.TaskNotFound)
	h, _ = p.a.TaskFrom(p.b.ID(), "no-such-task")
	_, err = h.Cancel(t.Context(), protocol.CancelPolicy, "")
	mustCode(t, err, errs.TaskNotFound)
}

func TestNoAnswerAndNoResponders(t *testing.T) {
	tm := newMesh(t)
	ka := agentKey(t)
	n := tm.startNode(t, nodeKey(t), []*keys.Agent{ka}, nil)
	a := tm.host(t, n, AgentConfig{Key: ka, Name: "a", Handler: refuseAll})
	nobody := agentKey(t).Public()

	// On a full mesh something always listens on every inbox — the mailbox
	// stream, the admission worker's queue subscription, the activity tap —
	// so a request to an agent nobody serves is not "no responders": it
	// waits and times out.
	start := time.Now()
	_, err := a.Request(t.Context(), nobody, "echo", "x", RequestOptions{Timeout: 300 * time.Millisecond})
	mustCode(t, err, errs.TransportTimeout)
	if time.Since(start) < 300*time.Millisecond || !strings.Contains(err.Error(), "may not be running") {
		t.Fatalf("timeout: %v after %s", err, time.Since(start))
	}
	if e := errs.As(err); e.Details["request_id"] == nil {
		t.Fatalf("no request id: %v", e.Details)
	}
	// With none of them, the broker says so at once: AGENT_UNAVAILABLE.
	for _, w := range tm.m.Workers().Admission {
		_ = w.Stop()
	}
	for _, w := range tm.m.Workers().Activity {
		_ = w.Stop()
	}
	if err := tm.js.DeleteStream(t.Context(), protocol.MailboxStream); err != nil {
		t.Fatal(err)
	}
	_, err = a.Request(t.Context(), nobody, "echo", "x", RequestOptions{Timeout: asyncWait})
	mustCode(t, err, errs.AgentUnavailable)
}

func TestHeartbeatFeedsAndEvents(t *testing.T) {
	tm := newMesh(t)
	kb, nk := agentKey(t), nodeKey(t)
	beats := tm.collect(t, protocol.HeartbeatSubject(nk.Public()))
	n := tm.startNode(t, nk, []*keys.Agent{kb}, func(c *Config) { c.HeartbeatEvery = 50 * time.Millisecond })
	b := tm.host(t, n, AgentConfig{Key: kb, Name: "b", Handler: refuseAll, AvailabilityClass: "always_on"})
	eventually(t, "heartbeats", func() bool { return beats.len() >= 3 })
	last := beats.envelopes(t)
	hb := last[len(last)-1]
	var pl struct {
		Availability string   `json:"availability"`
		Agents       []string `json:"agents"`
	}
	if err := hb.DecodePayload(&pl); err != nil || hb.From != nk.Public() || hb.Type != protocol.TypeEmit ||
		pl.Availability != "online" || len(pl.Agents) != 1 || pl.Agents[0] != kb.Public() {
		t.Fatalf("heartbeat %+v %s", hb, hb.Payload)
	}
	v := b.Vouch()
	exp, _ := protocol.ParseTime(v.ExpiresAt)
	iss, _ := protocol.ParseTime(v.IssuedAt)
	if exp.Sub(iss) != VouchLifetime {
		t.Fatalf("vouch lifetime %s", exp.Sub(iss))
	}

	feed := tm.collect(t, protocol.FeedSubject(kb.Public(), "*"))
	events := tm.collect(t, protocol.EventSubject("demo.>"))
	if err := b.PublishFeed("status", FeedState, map[string]any{"ok": true}); err != nil {
		t.Fatal(err)
	}
	if err := b.Emit("demo.happened", 42); err != nil {
		t.Fatal(err)
	}
	if err := b.PublishFeed("a.b", FeedState, 1); codeOf(err) != errs.InvalidRequest {
		t.Fatalf("a dotted topic: %v", err)
	}
	eventually(t, "feed and event", func() bool { return feed.len() == 1 && events.len() == 1 })
	f := feed.envelopes(t)[0]
	if f.From != kb.Public() || string(f.Payload) != `{"data":{"ok":true},"kind":"state","topic":"status"}` {
		t.Fatalf("feed %s", f.Payload)
	}
	ev := events.envelopes(t)[0]
	if string(ev.Payload) != `{"data":42,"domain":"demo","event_type":"happened"}` {
		t.Fatalf("event %s", ev.Payload)
	}

	// Closing says offline.
	before := beats.len()
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the offline beat", func() bool { return beats.len() > before })
	envs := beats.envelopes(t)
	if err := envs[len(envs)-1].DecodePayload(&pl); err != nil || pl.Availability != "offline" {
		t.Fatalf("last beat %s", envs[len(envs)-1].Payload)
	}
}

// A busy agent's box does not fill with what it already took live: every
// drainAfterLive messages at its inbox (requests it served, and the accepts
// and answers of its own calls, which protocol 0.3 sends there) ask for a
// drain, long before the timed one (a minute). Without it both boxes would
// sit at the per-agent cap (256) and the stream would refuse the mail of
// the agents' next absence.
func TestBusyBoxesAreDrainedByVolume(t *testing.T) {
	p, _ := newWorkerPair(t, nil)
	const calls = 400 // 800 messages at A's inbox, 400 at B's
	for i := range calls {
		if _, err := p.a.Request(t.Context(), p.b.ID(), "echo", map[string]any{"text": "busy"}, RequestOptions{}); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	for _, ag := range []*Agent{p.a, p.b} {
		eventually(t, "the box of "+ag.ID()+" to be drained below the cap", func() bool {
			return p.tm.mailboxStored(t, ag.ID()) < 2*drainAfterLive
		})
	}
}
