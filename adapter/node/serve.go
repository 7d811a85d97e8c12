package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// origin is where an inbound message came from.
type origin struct {
	src protocol.Source
	// reply is the NATS reply subject of a live request; answers to a
	// request without one (a drained request) go to the sender's inbox.
	reply string
	// answersOnly marks the public inbox of a guarded agent, where only
	// answers to its own requests are taken (Agent.subscribe).
	answersOnly bool
	// lastTry marks a drained message's last drain (maxTries): it is
	// answered even when its admission cannot be decided.
	lastTry bool
}

func (a *Agent) onInboxMsg(m *nats.Msg) {
	_ = a.receive(m.Data, origin{src: protocol.SourceLive, reply: replySubject(m.Reply)})
}

func (a *Agent) onAnswerMsg(m *nats.Msg) {
	_ = a.receive(m.Data, origin{src: protocol.SourceLive, answersOnly: true})
}

// isLateAnswer reports whether env is a protocol 0.3 late answer: a request
// whose in_reply_to names an earlier request (upstream-notes §15).
func isLateAnswer(env *protocol.Envelope) bool {
	return env.Type == protocol.TypeRequest && env.InReplyTo != ""
}

// replySubject keeps the reply subject a sender named only when it lies in
// a reply namespace (protocol.IsReplySubject: the shared _INBOX.…, a private
// _MESH_INBOX.<key>.…, the admission relay's _MESH_RELAY.…). Anything else — mesh.task.<id>.update, mesh.event.…, another agent's
// inbox — would have this agent's signed accept and answer published where
// the sender chose, as if the agent had sent them there. Such a request is
// served as one without a reply subject: no accept, and the answer goes to
// the verified sender's own inbox, like a drained request's.
func replySubject(reply string) string {
	if protocol.IsReplySubject(reply) && !strings.HasPrefix(reply, protocol.ServiceInboxPrefix+".") {
		return reply
	}
	return ""
}

// receive runs the receive order on one inbound message and dispatches it:
// requests to the handler (live ones in their own goroutine, drained ones
// here), responds to the request waiting on them or to OnReply. It returns
// an error only when a drained message must stay in the mailbox (its answer
// could not be published).
func (a *Agent) receive(data []byte, o origin) error {
	if o.src == protocol.SourceLive && !o.answersOnly {
		a.countCaptured()
	}
	u, err := protocol.Parse(data)
	if o.answersOnly && (err != nil || !u.IsAnswer() || !a.awaits(u.InReplyTo(), u.From())) {
		// The public inbox of a guarded agent takes anyone's publish, and
		// its requests come through the admission service: only an answer
		// to a call of this agent that waits for it, claimed by that
		// call's callee, is worth a verification. Anything else is
		// dropped unverified and without a warning, so a flood there costs
		// a parse per message (and past the guard no sender the roster
		// keeps out reaches OnReply).
		return nil
	}
	if err == nil && o.src == protocol.SourceMailbox && a.n.journal.Answered(u.From(), u.ID()) {
		// The mailbox stream holds every live request too (DESIGN.md §5),
		// and one answered live is journaled. Refusing it as a duplicate
		// before verification is the outcome verification would reach,
		// without a second Ed25519 verification of every live request.
		return nil
	}
	if err == nil && u.IsAccept() && a.setAside(u, o.src) {
		return nil
	}
	var env *protocol.Envelope
	if err == nil {
		env, err = protocol.DefaultDecoder.Verify(u)
	}
	if err != nil {
		e := errs.As(err)
		a.n.warn(Warning{Code: "inbound_decode", Agent: a.id, Message: e.Message, Err: err})
		if o.reply != "" {
			// Never to the unverified from: only on the reply subject, with
			// no addressing taken from the envelope.
			if env, err := protocol.New(protocol.TypeRespond, a.id, e.BusPayload()); err == nil {
				_ = a.sendRespond(o.reply, env, nil)
			}
		}
		return nil
	}
	// A journaled envelope was handled before (by an earlier process): it
	// is a duplicate, refused silently, and remembered as one.
	if a.n.journal.Answered(env.From, env.ID) {
		a.inbox.Dedup.Seen(env.From, env.ID)
		return nil
	}
	switch {
	case env.Type == protocol.TypeRespond, isLateAnswer(env):
		// An answer, or a protocol 0.3 late answer (a fresh request whose
		// in_reply_to names a request: hold.go), is never handled as work.
		dl, err := a.replies.Check(env, o.src)
		if err != nil {
			return nil
		}
		a.routeReply(dl)
		return nil
	case env.Type == protocol.TypeRequest:
	default:
		a.n.log.Debug("inbox: ignoring a non-request", "agent", a.id, "type", env.Type)
		return nil
	}
	dl, err := a.inbox.Check(env, o.src)
	if err != nil {
		var r *protocol.Refusal
		if !errors.As(err, &r) || r.Silent || r.Env == nil {
			return nil
		}
		// Oversize (CONTEXT_TOO_LARGE) or an unreadable request payload:
		// answered in reply to the verified request; admission refusals
		// never carry an accept.
		c := a.newCall(&protocol.Delivery{Env: r.Env, Source: o.src}, o)
		defer c.cancel()
		return c.fail(r.Err)
	}
	c := a.newCall(dl, o)
	if o.src == protocol.SourceLive {
		select {
		case a.sem <- struct{}{}:
		default:
			defer c.cancel()
			return c.fail(errs.Newf(errs.AgentOverloaded, "agent is handling %d requests; retry later", cap(a.sem)).WithRetryAfter(1000))
		}
		a.dispatch(c)
		return nil
	}
	return a.serve(c)
}

// serveIdle is how long a serving goroutine waits for the next live request
// before it ends.
const serveIdle = 10 * time.Second

// dispatch hands a live request to an idle serving goroutine, or starts
// one. They are kept for serveIdle rather than started per request: a
// request's signatures grow a new goroutine's stack every time, a few
// percent of the mesh's CPU per call (docs/performance.md). There are never
// more than the agent's MaxConcurrent of them (a.sem, taken before).
func (a *Agent) dispatch(c *Call) {
	select {
	case a.work <- c:
	default:
		go a.serveLoop(c)
	}
}

// serveLoop serves c, then whatever dispatch hands it, until it has been
// idle for serveIdle or the agent stops.
func (a *Agent) serveLoop(c *Call) {
	idle := time.NewTimer(serveIdle)
	defer idle.Stop()
	for {
		a.serveLive(c)
		c = nil // not kept alive while idle
		idle.Reset(serveIdle)
		select {
		case c = <-a.work:
		case <-idle.C:
			return
		case <-a.ctx.Done():
			return
		}
	}
}

// serveLive serves one live request and frees its slot.
func (a *Agent) serveLive(c *Call) {
	defer func() { <-a.sem }()
	if err := a.serve(c); err != nil {
		a.n.log.Warn("no answer could be sent", "agent", a.id, "request", c.Env.ID, "err", err)
	}
}

// Call is one admitted request as a handler sees it.
type Call struct {
	// Env is the verified request envelope.
	Env *protocol.Envelope
	// Delivery is what the receive order produced.
	Delivery *protocol.Delivery
	// Input is payload.input, with its sender text framed (Delivery.Input).
	Input any
	// SenderText is the sender's text before framing ("" when none).
	SenderText string
	// Offering is the requested offering.
	Offering string
	// Config is payload.config, when present.
	Config map[string]any
	// Budget is the envelope budget, when present, and BudgetLine its
	// provenance line (shown outside the sender-content fence).
	Budget     *protocol.Budget
	BudgetLine string
	// Source says whether the request arrived live or from the mailbox.
	Source protocol.Source

	a      *Agent
	o      origin
	ctx    context.Context
	cancel context.CancelFunc
	// started is when the runtime took the request: the audit duration
	// of its answer counts from it.
	started time.Time
	// undecided is set when the agreements service could not decide the
	// request's admission (commerceAdmit).
	undecided bool

	mu       sync.Mutex
	answered bool  // a substantive answer was sent (or a task started)
	recorded bool  // the request is in the journal
	lost     error // why the handler's last answer was not published
	task     *Task
}

func (a *Agent) newCall(dl *protocol.Delivery, o origin) *Call {
	c := &Call{Env: dl.Env, Delivery: dl, Input: dl.Input, SenderText: dl.SenderText, Source: o.src, Budget: dl.Env.Budget, a: a, o: o,
		started: a.n.now()}
	// Read through the kept parse; only the config, the handler's to keep
	// and change, is copied.
	if v, err := dl.Env.PayloadView(); err == nil {
		if p, ok := v.(map[string]any); ok {
			c.Offering = protocol.OfferingOf(p)
			if cfg, ok := p["config"].(map[string]any); ok {
				c.Config = protocol.CloneValue(cfg).(map[string]any)
			}
		}
	}
	if c.Budget != nil {
		c.BudgetLine = c.Budget.Line(a.n.now())
	}
	c.ctx, c.cancel = context.WithCancel(a.ctx)
	return c
}

// Agent is the agent serving the call.
func (c *Call) Agent() *Agent { return c.a }

// Sender is the verified sender's public key.
func (c *Call) Sender() string { return c.Env.From }

// Context is the call's context: canceled when the handler returns (bare
// mode), when the task ends or is canceled (Task mode), or when the node
// closes.
func (c *Call) Context() context.Context { return c.ctx }

// RawInput is payload.input exactly as signed, unframed.
func (c *Call) RawInput() any {
	in, _ := protocol.HandlerInput(c.Env)
	return in
}

// DecodeInput unmarshals payload.input (unframed) into dst.
func (c *Call) DecodeInput(dst any) error {
	var p struct {
		Input json.RawMessage `json:"input"`
	}
	if err := c.Env.DecodePayload(&p); err != nil {
		return err
	}
	if len(p.Input) == 0 {
		p.Input = json.RawMessage("null")
	}
	if err := json.Unmarshal(p.Input, dst); err != nil {
		return errs.Wrap(errs.InputInvalid, "input does not have the expected shape", err)
	}
	return nil
}

// target is where answers go (the accept and every respond): the sender's
// inbox, with in_reply_to, for a protocol 0.3 request (upstream-notes §15:
// a 0.3 requester reads answers only there) and for a drained one; the
// reply subject of a live request from an earlier requester. The queued
// ack alone always goes on the reply subject (hold).
func (c *Call) target() string {
	if c.o.reply != "" && !protocol.AnswersAtInbox(c.Env.V) {
		return c.o.reply
	}
	return protocol.InboxSubject(c.Env.From)
}

// publishAnswer signs and publishes one answer (an accept or a respond) at
// target. A relayed protocol 0.3 request (the admission service's
// _MESH_RELAY reply) also gets it on the relay subject: the relay takes
// the first answer there as the sign that the agent is online (else it
// tells the sender "queued") and passes it to the sender's reply subject,
// which a 0.3 requester ignores.
func (c *Call) publishAnswer(env *protocol.Envelope) ([]byte, error) {
	to := c.target()
	var also []string
	if to != c.o.reply && strings.HasPrefix(c.o.reply, protocol.RelayReplyPrefix+".") {
		also = []string{c.o.reply}
	}
	return c.a.publishRespond(to, env, also...)
}

// answer publishes one respond (publishAnswer) and its outbox copy; the
// copy of the answer that ends the request (final) carries the audit
// headers.
func (c *Call) answer(env *protocol.Envelope, final bool) error {
	b, err := c.publishAnswer(env)
	if err != nil {
		return err
	}
	var hdr nats.Header
	if final {
		hdr = c.a.auditHeader(c.Env, c.Offering, c.started)
	}
	if c.a.outboxCopy(b, hdr) {
		c.copied()
	}
	return nil
}

// send publishes one respond in reply to the request and journals the
// request on its first answer; the caller has claimed the call. The journal
// is written only once the answer is out. An answer too large for the
// transport will never go out: the caller is sent a CONTEXT_TOO_LARGE
// failure instead (a terminal answer rather than a timeout), and the
// handler is told. Any other failed publish releases the claim, so serve
// still answers the request, or — drained — leaves it in the mailbox.
func (c *Call) send(payload any, taskID string) error {
	env, err := protocol.NewReply(c.Env, c.a.id, payload)
	if err == nil {
		env.TaskID = taskID
		// An answer with a task id starts the task: the task's terminal
		// update ends the request (Task.publishLocked).
		err = c.answer(env, taskID == "")
	}
	if errs.CodeOf(err) == errs.ContextTooLarge {
		if ferr := c.sendError(errs.As(err)); ferr != nil {
			err = ferr
		} else {
			c.a.n.log.Warn("answer too large for the transport; sent CONTEXT_TOO_LARGE instead", "agent", c.a.id, "request", c.Env.ID, "err", err)
			c.record()
			return err
		}
	}
	if err != nil {
		c.release(err)
		return err
	}
	c.record()
	return nil
}

// sendError publishes e as the terminal answer, bypassing send: it is the
// small answer sent when the real one cannot be.
func (c *Call) sendError(e *errs.Error) error {
	env, err := protocol.NewReply(c.Env, c.a.id, e.BusPayload())
	if err != nil {
		return err
	}
	return c.answer(env, true)
}

func (c *Call) record() {
	c.mu.Lock()
	done := c.recorded
	c.recorded = true
	c.mu.Unlock()
	if !done {
		if err := c.a.n.journal.Record(c.Env.From, c.Env.ID); err != nil {
			c.a.n.log.Error("journal", "err", err)
		}
	}
}

// ErrAnswered is returned by a second substantive answer to one call.
var ErrAnswered = errors.New("node: the request was already answered")

func (c *Call) claim() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.answered {
		return ErrAnswered
	}
	c.answered = true
	return nil
}

// release undoes a claim whose answer was not published.
func (c *Call) release(why error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.answered, c.lost = false, why
}

// Reply answers in bare mode: a terminal {status:"completed", output}.
func (c *Call) Reply(output any) error {
	if err := c.claim(); err != nil {
		return err
	}
	p := map[string]any{"status": protocol.StateCompleted}
	if output != nil {
		p["output"] = output
	}
	return c.send(p, "")
}

// Fail answers in bare mode with a terminal {status:"failed", error}. A
// non-protocol error is sent as INTERNAL_ERROR with a generic message.
func (c *Call) Fail(err error) error {
	if e := c.claim(); e != nil {
		return e
	}
	return c.send(errs.As(err).BusPayload(), "")
}

// fail is Fail for the runtime's own refusals.
func (c *Call) fail(e *errs.Error) error { return c.Fail(e) }

// StartTask switches the call to Task mode: the task is created (updates
// submitted, then working, on mesh.task.<id>.update) and the request is
// answered {status:"working", task_id}. The task's context is the call's.
func (c *Call) StartTask() (*Task, error) {
	if err := c.claim(); err != nil {
		return nil, err
	}
	t := &Task{ID: protocol.NewID(), a: c.a, call: c, ctx: c.ctx, cancel: c.cancel}
	c.mu.Lock()
	c.task = t
	c.mu.Unlock()
	c.a.addTask(t)
	err := t.publish(map[string]any{"status": protocol.StateSubmitted}, protocol.StateSubmitted)
	if err == nil {
		err = t.publish(map[string]any{"status": protocol.StateWorking}, protocol.StateWorking)
	}
	if err != nil {
		c.abandon(t, err)
		c.release(err)
		return nil, err
	}
	// send releases the claim itself when the answer does not go out.
	if err := c.send(map[string]any{"status": protocol.StateWorking, "task_id": t.ID}, t.ID); err != nil {
		c.abandon(t, err)
		return nil, err
	}
	return t, nil
}

// abandon gives up a task whose start did not reach the caller: it ends
// (failed, if its updates had begun) and the call forgets it, so serve
// answers the request in bare mode.
func (c *Call) abandon(t *Task, why error) {
	if t.State() != "" {
		_ = t.Fail(why)
	}
	t.mu.Lock()
	if !protocol.Terminal(t.state) {
		t.state = protocol.StateFailed
		c.a.taskEnded(t)
	}
	t.mu.Unlock()
	c.mu.Lock()
	c.task = nil
	c.mu.Unlock()
}

// sendRespond signs env, publishes it on subject (and on each of also,
// whose failures are only logged) and a copy on the agent's outbox, with
// hdr (the audit headers of an answer that ends a request, else nil).
func (a *Agent) sendRespond(subject string, env *protocol.Envelope, hdr nats.Header, also ...string) error {
	b, err := a.publishRespond(subject, env, also...)
	if err != nil {
		return err
	}
	a.outboxCopy(b, hdr)
	return nil
}

// publishRespond signs env and publishes it on subject (and on each of
// also, whose failures are only logged), returning what it published.
func (a *Agent) publishRespond(subject string, env *protocol.Envelope, also ...string) ([]byte, error) {
	if err := env.Sign(a.key); err != nil {
		return nil, err
	}
	b, err := env.Marshal()
	if err != nil {
		return nil, err
	}
	// Checked here rather than left to the client, whose refusal would
	// look like any other failed publish: this one will never succeed.
	if err := protocol.CheckEnvelopeSize(len(b), a.n.maxPayload()); err != nil {
		return nil, err
	}
	// A respond carries no Nats-Msg-Id: the mailbox's dedupe is for
	// requests. An answer stored twice (republished after a forced
	// reconnect) is dropped by its receiver's (from, id) memory and
	// journal, and leaving the header off saves every answer a header to
	// write, to parse at the broker and at the receiver, and a slot in the
	// stream's duplicate window. A protocol 0.3 late answer is a request
	// (hold.go) and keeps it.
	m := &nats.Msg{Subject: subject, Data: b}
	if env.Type == protocol.TypeRequest {
		m.Header = nats.Header{nats.MsgIdHdr: []string{env.ID}}
	}
	if err := a.n.publishMsg(m); err != nil {
		return nil, err
	}
	for _, s := range also {
		if err := a.n.publish(s, b); err != nil {
			a.n.log.Warn("answer copy", "agent", a.id, "subject", s, "err", err)
		}
	}
	return b, nil
}

// outboxCopy publishes a sent respond on the agent's outbox, where the
// activity worker attributes it (a failure is only logged: the answer
// itself is out), with hdr when not nil. It reports whether the copy went
// out.
func (a *Agent) outboxCopy(b []byte, hdr nats.Header) bool {
	if err := a.n.publishMsg(&nats.Msg{Subject: protocol.OutboxSubject(a.id), Data: b, Header: hdr}); err != nil {
		a.n.log.Warn("outbox copy", "agent", a.id, "err", err)
		return false
	}
	return true
}

// auditHeader is the outbox copy's statement that it carries the answer
// ending the request req (protocol.HdrAudit*): the offering asked for, the
// input's digest and how long the answer took since started. The activity
// worker records them in the audit rows of both parties (docs/audit.md).
func (a *Agent) auditHeader(req *protocol.Envelope, offering string, started time.Time) nats.Header {
	h := nats.Header{}
	h.Set(protocol.HdrAuditInput, protocol.InputSHA256(req))
	if headerSafe(offering) {
		h.Set(protocol.HdrAuditOffering, offering)
	}
	h.Set(protocol.HdrAuditDuration, strconv.FormatInt(max(a.n.now().Sub(started).Milliseconds(), 0), 10))
	return h
}

// headerSafe reports whether s can be a header value as it is: 1 to 256
// bytes without control characters (a header line ends at a line break).
func headerSafe(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

// AcceptCopyDelay is how long the outbox copy of an accept waits for the
// call's first answer. The activity worker learns a request from the
// outbox copy of any respond to it, and an accept is no record of its own
// (shared/activity), so the accept's copy matters only for a request not
// yet answered: a call answered within the delay sends one copy, not two
// (about a tenth of the mesh's CPU per call: docs/performance.md). A call
// still unanswered when the delay ends has its request recorded then, and
// so does one still unanswered when its agent stops (stop publishes the
// waiting copies); one whose node dies within the delay, before any
// answer, is not recorded.
const AcceptCopyDelay = time.Second

// answerAccept publishes the accept at target, and its outbox copy only
// if no answer's copy has gone out within AcceptCopyDelay.
func (c *Call) answerAccept(env *protocol.Envelope) error {
	b, err := c.publishAnswer(env)
	if err != nil {
		return err
	}
	a := c.a
	a.copyMu.Lock()
	defer a.copyMu.Unlock()
	if a.copies == nil {
		a.outboxCopy(b, nil) // the agent is stopping: no later
		return nil
	}
	a.copies[c] = acceptCopy{b: b, t: time.AfterFunc(AcceptCopyDelay, func() {
		if c.takeCopy() {
			a.outboxCopy(b, nil)
		}
	})}
	return nil
}

// acceptCopy is the outbox copy of an accept, waiting for AcceptCopyDelay.
type acceptCopy struct {
	b []byte
	t *time.Timer
}

// takeCopy removes the call's waiting accept copy and reports whether there
// was one.
func (c *Call) takeCopy() bool {
	a := c.a
	a.copyMu.Lock()
	defer a.copyMu.Unlock()
	ac, ok := a.copies[c]
	if ok {
		delete(a.copies, c)
		ac.t.Stop()
	}
	return ok
}

// copied is called once an answer's outbox copy is out: the accept's is
// no longer needed.
func (c *Call) copied() { c.takeCopy() }

// flushCopies publishes every accept copy still waiting, as the agent
// stops (its connection still open), and takes no more.
func (a *Agent) flushCopies() {
	a.copyMu.Lock()
	waiting := a.copies
	a.copies = nil
	a.copyMu.Unlock()
	// Each one here was taken by no timer (a timer's takeCopy finds the
	// map empty from now on), so each goes out once.
	for _, ac := range waiting {
		ac.t.Stop()
		a.outboxCopy(ac.b, nil)
	}
}

// errAdmissionUndecided is serve's error for a drained request whose
// admission could not be decided: the drain leaves it in the mailbox.
var errAdmissionUndecided = errors.New("admission could not be decided: the agreements service did not answer")

// serve runs admission, the accept, and the handler for one request.
func (a *Agent) serve(c *Call) (err error) {
	switch c.Offering {
	case protocol.OfferingTaskCancel:
		defer c.cancel()
		return a.serveCancel(c)
	case protocol.OfferingDescribe:
		defer c.cancel()
		return c.Reply(a.Manifest())
	case OfferingRoomsInvite:
		defer c.cancel()
		return a.serveRoomInvite(c)
	}
	held, e := a.admit(c)
	if e != nil {
		defer c.cancel()
		if c.undecided && c.o.src == protocol.SourceMailbox && !c.o.lastTry {
			// Offline mail is not consumed by an outage of the agreements
			// service: unanswered and not journaled, it stays in the
			// mailbox, and the next drain takes it again.
			a.inbox.Dedup.Forget(c.Env.From, c.Env.ID)
			return errAdmissionUndecided
		}
		return c.fail(e)
	}
	if held != nil {
		defer c.cancel()
		return a.hold(c, held.InboxID)
	}
	live := c.o.src == protocol.SourceLive && c.o.reply != ""
	if live {
		acc, err := protocol.NewAccept(c.Env, a.id)
		if err == nil {
			err = c.answerAccept(acc)
		}
		if err != nil {
			c.cancel()
			return err
		}
		c.record()
	}
	if _, ok := a.offering(c.Offering); !ok {
		defer c.cancel()
		return c.fail(errs.Newf(errs.OfferingNotFound, "agent %s has no offering %q", a.id, c.Offering))
	}
	herr := a.runHandler(c)
	c.mu.Lock()
	task, answered, lost := c.task, c.answered, c.lost
	c.mu.Unlock()
	if !answered && herr == nil && lost != nil {
		herr = lost // the handler's answer did not go out and it let that pass
	}
	switch {
	case !answered && herr != nil:
		err = c.Fail(herr)
	case !answered:
		a.n.log.Error("handler returned without answering", "agent", a.id, "offering", c.Offering)
		err = c.Fail(errs.New(errs.InternalError, "the handler returned without answering"))
	case task != nil && herr != nil && !protocol.Terminal(task.State()):
		err = task.Fail(herr)
	}
	if task == nil {
		c.cancel()
	}
	return err
}

// runHandler calls the handler, turning a panic into an error.
func (a *Agent) runHandler(c *Call) (err error) {
	defer func() {
		if r := recover(); r != nil {
			a.n.log.Error("handler panicked", "agent", a.id, "offering", c.Offering, "panic", r)
			err = errs.Wrap(errs.InternalError, "internal error", fmt.Errorf("panic: %v", r))
		}
	}()
	return a.cfg.Handler(c.ctx, c)
}

// admit is admission before the accept: a deadline already past (under the
// protocol's skew tolerance) cannot be met; then the terms the agent sells
// on (commerceAdmit); then the agent's AdmitFunc.
func (a *Agent) admit(c *Call) (*HeldError, *errs.Error) {
	if c.Budget != nil {
		if d, ok := c.Budget.DeadlineTime(); ok && protocol.DeadlinePast(d, a.n.now()) {
			return nil, protocol.DeadlineUnmeetable(a.n.now(), "the deadline has already passed")
		}
	}
	if e := a.commerceAdmit(c); e != nil {
		return nil, e
	}
	if a.cfg.Admit == nil {
		return nil, nil
	}
	err := a.cfg.Admit(c.ctx, c, c.Budget)
	if err == nil {
		return nil, nil
	}
	var held *HeldError
	if errors.As(err, &held) {
		return held, nil
	}
	return nil, errs.As(err)
}

// serveCancel answers a task.cancel request (spec §3.4, bus.md "Cancel").
// Only the task's requester may cancel it; to anyone else the task does not
// exist.
func (a *Agent) serveCancel(c *Call) error {
	in, err := protocol.ParseCancelInput(c.RawInput())
	if err != nil {
		return c.fail(errs.As(err))
	}
	t := a.taskByID(in.TaskID)
	if t == nil {
		return c.fail(a.cancelFromRecord(c, in.TaskID))
	}
	if t.call.Env.From != c.Env.From {
		return c.fail(errs.Newf(errs.TaskNotFound, "no task %s", in.TaskID))
	}
	if err := t.cancelFor(in); err != nil {
		return c.fail(errs.As(err))
	}
	return c.replyPayload(map[string]any{"status": protocol.StateCanceled})
}

// serveRoomInvite answers a rooms.invite request through the agent's
// RoomInvite hook. A panic there is an error answer, as in a handler.
func (a *Agent) serveRoomInvite(c *Call) (err error) {
	if a.cfg.RoomInvite == nil {
		return c.fail(errs.Newf(errs.OfferingNotFound, "agent %s does not take room invites", a.id))
	}
	var out any
	func() {
		defer func() {
			if r := recover(); r != nil {
				a.n.log.Error("room invite hook panicked", "agent", a.id, "panic", r)
				err = errs.Wrap(errs.InternalError, "internal error", fmt.Errorf("panic: %v", r))
			}
		}()
		out, err = a.cfg.RoomInvite(c.ctx, c)
	}()
	if err != nil {
		return c.fail(errs.As(err))
	}
	return c.Reply(out)
}

// cancelFromRecord answers the cancel of a task this process does not run:
// one that ended before the process started, or longer ago than
// endedTaskMemory. The task record (mesh.task.get.<id>, kept by the tasks
// worker for 7 days) decides: a terminal task this agent performed for the
// sender is TASK_NOT_CANCELABLE, as it was before any restart. Anything
// else is TASK_NOT_FOUND, the same answer a stranger gets, so the record's
// existence does not leak; that includes a task the record still shows
// running, which no longer runs here (it was lost with an earlier process).
func (a *Agent) cancelFromRecord(c *Call, taskID string) *errs.Error {
	notFound := errs.Newf(errs.TaskNotFound, "no task %s", taskID)
	ctx, cancel := context.WithTimeout(c.ctx, a.n.cfg.RequestTimeout)
	defer cancel()
	rec, err := a.taskRecord(ctx, taskID)
	if err != nil {
		if e := errs.As(err); e.Code == errs.TaskNotFound || e.Code == errs.Unauthorized {
			return notFound
		}
		a.n.log.Warn("cancel: read the task record", "task", taskID, "err", err)
		return errs.Newf(errs.Unavailable, "could not read the record of task %s; try again", taskID)
	}
	state, _ := rec["state"].(string)
	if rec["responder"] != a.id || rec["requester"] != c.Env.From || !protocol.Terminal(state) {
		return notFound
	}
	return errs.Newf(errs.TaskNotCancelable, "task %s is already %s", taskID, state)
}

// replyPayload sends a bare terminal payload as is (the runtime's own
// answers).
func (c *Call) replyPayload(payload map[string]any) error {
	if err := c.claim(); err != nil {
		return err
	}
	return c.send(payload, "")
}

// Task is a Task-mode request on the performer's side.
type Task struct {
	ID string

	a      *Agent
	call   *Call
	ctx    context.Context
	cancel context.CancelFunc

	mu           sync.Mutex
	state        string
	chunks       int
	streamOpen   bool
	streamClosed bool
}

// ErrTaskFinished is returned by updates to a task already terminal.
var ErrTaskFinished = errs.New(errs.TaskInvalidTransition, "the task has already ended")

// Context is canceled when the task ends or is canceled.
func (t *Task) Context() context.Context { return t.ctx }

// State is the task's current state.
func (t *Task) State() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.state
}

// Requester is the verified sender of the request.
func (t *Task) Requester() string { return t.call.Env.From }

// publish sends a respond on the task's update subject and moves the local
// state; the caller holds no lock.
func (t *Task) publish(payload map[string]any, state string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.publishLocked(payload, state)
}

func (t *Task) publishLocked(payload map[string]any, state string) error {
	if protocol.Terminal(t.state) {
		return ErrTaskFinished
	}
	if state != t.state {
		if err := protocol.CheckTransition(t.state, state); err != nil {
			return err
		}
	}
	env, err := protocol.NewReply(t.call.Env, t.a.id, payload)
	if err != nil {
		return err
	}
	env.TaskID = t.ID
	var hdr nats.Header
	if protocol.Terminal(state) {
		// The task's terminal update is the answer that ends its request.
		hdr = t.a.auditHeader(t.call.Env, t.call.Offering, t.call.started)
	}
	if err := t.a.sendRespond(protocol.TaskUpdateSubject(t.ID), env, hdr); err != nil {
		return err
	}
	t.state = state
	if protocol.Terminal(state) {
		t.a.taskEnded(t)
		t.cancel()
	}
	return nil
}

// Update publishes a state change (or, with the current state, a progress
// update) with an optional output.
func (t *Task) Update(state string, output any) error {
	p := map[string]any{"status": state}
	if output != nil {
		p["output"] = output
	}
	return t.publish(p, state)
}

// Progress publishes {status:"working", message}: progress in the working
// state, not a transition.
func (t *Task) Progress(message string) error {
	return t.publish(map[string]any{"status": protocol.StateWorking, "message": message}, protocol.StateWorking)
}

// Chunk publishes the next stream chunk on mesh.task.<id>.stream:
// {status:"working", chunk_index, final:false, data}.
func (t *Task) Chunk(data any) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if protocol.Terminal(t.state) || t.streamClosed {
		return ErrTaskFinished
	}
	p := map[string]any{"status": protocol.StateWorking, "chunk_index": t.chunks, "final": false, "data": data}
	if err := t.sendChunkLocked(p); err != nil {
		return err
	}
	t.chunks++
	t.streamOpen = true
	return nil
}

// CloseStream publishes the signed final chunk: {status:"completed",
// chunk_index, final:true, chunk_count, data} where chunk_count counts every
// frame including this one. Complete calls it (with null data) when a
// stream is open.
func (t *Task) CloseStream(data any) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closeStreamLocked(data)
}

func (t *Task) closeStreamLocked(data any) error {
	if protocol.Terminal(t.state) || t.streamClosed {
		return ErrTaskFinished
	}
	p := map[string]any{"status": protocol.StateCompleted, "chunk_index": t.chunks, "final": true, "chunk_count": t.chunks + 1, "data": data}
	if err := t.sendChunkLocked(p); err != nil {
		return err
	}
	t.chunks++
	t.streamOpen, t.streamClosed = true, true
	return nil
}

func (t *Task) sendChunkLocked(p map[string]any) error {
	env, err := protocol.NewReply(t.call.Env, t.a.id, p)
	if err != nil {
		return err
	}
	env.TaskID = t.ID
	return t.a.sendRespond(protocol.TaskStreamSubject(t.ID), env, nil)
}

// Complete ends the task: the final chunk if a stream is open, then the
// update {status:"completed", output}.
func (t *Task) Complete(output any) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.streamOpen && !t.streamClosed {
		if err := t.closeStreamLocked(nil); err != nil {
			return err
		}
	}
	p := map[string]any{"status": protocol.StateCompleted}
	if output != nil {
		p["output"] = output
	}
	return t.publishLocked(p, protocol.StateCompleted)
}

// Fail ends the task with {status:"failed", error}.
func (t *Task) Fail(err error) error {
	return t.publish(errs.As(err).BusPayload(), protocol.StateFailed)
}

// cancelFor cancels the running task: its context first, then the canceled
// update {status:"canceled", reason, note?}.
func (t *Task) cancelFor(in protocol.CancelInput) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := protocol.CancelTask(t.state); err != nil {
		return err
	}
	t.cancel()
	return t.publishLocked(protocol.CanceledUpdatePayload(in.Reason, in.Note), protocol.StateCanceled)
}

// endedTaskMemory is how long an ended task stays in memory. It covers the
// moment between the terminal update and the tasks worker recording it;
// after that (and after a restart) a late cancel is answered from the task
// record (cancelFromRecord).
const endedTaskMemory = time.Minute

func (a *Agent) addTask(t *Task) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.n.now()
	for id, at := range a.finished {
		if now.Sub(at) > endedTaskMemory {
			delete(a.finished, id)
			delete(a.tasks, id)
		}
	}
	a.tasks[t.ID] = t
}

func (a *Agent) taskEnded(t *Task) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.finished[t.ID] = a.n.now()
}

func (a *Agent) taskByID(id string) *Task {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.tasks[id]
}
