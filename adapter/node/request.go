package node

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// RequestOptions tune one request.
type RequestOptions struct {
	// Budget is the envelope budget (revision 0 on a first request).
	Budget *protocol.Budget
	// Config is payload.config.
	Config map[string]any
	// Limits are the recipient's declared limits for pre-flight; nil is the
	// protocol default (65,536 UTF-16 code units of sender text).
	Limits *protocol.RecipientLimits
	// Timeout is how long to wait for an answer (Config.RequestTimeout);
	// an accept restarts it.
	Timeout time.Duration
	// Follow subscribes to task updates and stream chunks before the
	// request is published, so that a Task-mode answer's first updates and
	// chunks cannot be missed. It listens to mesh.task.*.update|stream until
	// the answer arrives (keeping only frames in reply to this request), so
	// use it for requests that may stream, not for every call.
	Follow bool
	// ContextID is the envelope context_id.
	ContextID string
	// ID is the envelope id to send under (a fresh UUIDv7 when empty), so
	// a caller can record what it sends before it is published: an answer
	// may arrive before Request returns, and one that arrives after it
	// gave up goes to OnReply, which can then check it against the record.
	ID string
}

// Result is the answer to a request: the first respond whose status is not
// "accepted", or a queued ack.
type Result struct {
	RequestID string
	// From is the verified signer of the answer.
	From string
	// Env is the answer envelope; Delivery is what the receive order made
	// of it (Delivery.Input frames the sender text of the payload).
	Env      *protocol.Envelope
	Delivery *protocol.Delivery
	Status   string
	// Output is payload.output, verified and unframed.
	Output  any
	Message string
	Error   *errs.Error
	// Accepted reports that an accept came first. An accept is verified
	// only when the wait would otherwise end (it extends the wait, nothing
	// more); when the callee's verified answer comes first it stands for
	// its accept, which is then reported unverified.
	Accepted bool
	// TaskID is set when the responder chose Task mode; Task follows it.
	TaskID string
	Task   *TaskHandle
	// Queued is the node-level queued ack: a mailbox holds the request
	// (or the admission service held or refused it; the two look alike on
	// purpose). The real answer, if any, arrives later at this agent's
	// inbox, through OnReply.
	Queued  bool
	InboxID string
}

// waiter is a request waiting for its answers.
type waiter struct {
	a  *Agent
	id string
	to string
	ch chan inbound

	// Accepts set aside unverified (setAside), at most maxHeldAccepts.
	mu      sync.Mutex
	accepts []heldAccept
}

// An accept only extends a call's wait, so it is verified only when the
// wait would otherwise end: most answers arrive first, and the Ed25519
// verification of their accept, a third of the caller's cost of a call,
// is never needed (docs/performance.md).
type heldAccept struct {
	u  *protocol.Unverified
	at time.Time
}

// maxHeldAccepts bounds the accepts a waiting call keeps unverified; one
// more is verified on arrival, as every accept used to be, so a flood of
// forged accepts costs memory no one else's and cannot push the
// performer's own accept out.
const maxHeldAccepts = 4

// setAside keeps an unverified accept for a call of this agent that waits
// on it, and reports whether the accept needs nothing more now: it is
// kept, or it is dropped because no call of this agent waits for it or it
// names a signer other than the callee (verified, it would be dropped the
// same way by routeReply). A full set is the one case left to the caller,
// which verifies the accept and routes it.
func (a *Agent) setAside(u *protocol.Unverified, src protocol.Source) bool {
	w := a.n.waiterFor(u.InReplyTo())
	if w == nil || w.a != a || u.From() != w.to || (u.To() != "" && u.To() != a.id) {
		return true
	}
	// Judged now, on arrival, as verification on arrival would: one
	// verified later must not turn stale while it waited.
	if protocol.CheckFreshness(u.TS(), a.n.now(), src) != nil {
		return true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.accepts) >= maxHeldAccepts {
		return false
	}
	w.accepts = append(w.accepts, heldAccept{u: u, at: time.Now()})
	return true
}

// heldAccepts reports whether any accept was set aside.
func (w *waiter) heldAccepts() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.accepts) > 0
}

// verifyHeld verifies the accepts set aside, newest first, and returns
// when the newest good one arrived: every accept restarts the wait, so the
// latest that verifies is the one that counts (and the older ones need no
// verification). Those tried are verified once: the set is emptied. Their
// freshness and addressing were checked on arrival (setAside).
func (w *waiter) verifyHeld() (time.Time, bool) {
	w.mu.Lock()
	held := w.accepts
	w.accepts = nil
	w.mu.Unlock()
	a := w.a
	for i := len(held) - 1; i >= 0; i-- {
		h := held[i]
		if _, err := protocol.DefaultDecoder.Verify(h.u); err != nil {
			e := errs.As(err)
			a.n.warn(Warning{Code: "inbound_decode", Agent: a.id, Message: e.Message, Err: err})
			continue
		}
		return h.at, true
	}
	return time.Time{}, false
}

type inbound struct {
	dl           *protocol.Delivery
	noResponders bool
}

func (w *waiter) deliver(in inbound) {
	select {
	case w.ch <- in:
	default: // a flood of answers to one request: keep the first ones
	}
}

func (n *Node) addWaiter(w *waiter) {
	n.pendMu.Lock()
	n.pending[w.id] = w
	n.pendMu.Unlock()
}

func (n *Node) removeWaiter(id string) {
	n.pendMu.Lock()
	delete(n.pending, id)
	n.pendMu.Unlock()
}

func (n *Node) waiterFor(id string) *waiter {
	n.pendMu.Lock()
	defer n.pendMu.Unlock()
	return n.pending[id]
}

// onReplyMsg receives everything on this node's reply subjects.
func (n *Node) onReplyMsg(m *nats.Msg) {
	token := strings.TrimPrefix(m.Subject, n.respPrefix)
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
		if w := n.waiterFor(token); w != nil {
			w.deliver(inbound{noResponders: true})
		}
		return
	}
	env, err := protocol.DefaultDecoder.Decode(m.Data)
	if err != nil || env.Type != protocol.TypeRespond {
		n.log.Debug("reply: dropped an undecodable answer", "err", err)
		return
	}
	a := n.Agent(env.To)
	if a == nil {
		if w := n.waiterFor(token); w != nil && env.To == "" {
			a = w.a
		}
	}
	if a == nil {
		return
	}
	if n.journal.Answered(env.From, env.ID) {
		return
	}
	dl, err := a.replies.Check(env, protocol.SourceLive)
	if err != nil {
		return
	}
	a.routeReply(dl)
}

// awaits reports whether a call of this agent, request id, still waits
// for an answer from signer.
func (a *Agent) awaits(id, signer string) bool {
	w := a.n.waiterFor(id)
	return w != nil && w.a == a && w.to == signer
}

// routeReply hands a verified respond addressed to this agent to the
// request waiting for it, or, when none waits, to OnReply. Accepts only
// ever go to a waiting request.
func (a *Agent) routeReply(dl *protocol.Delivery) {
	env := dl.Env
	if w := a.n.waiterFor(env.InReplyTo); w != nil && w.a == a {
		_, queued := protocol.QueuedAckOf(env)
		if env.From == w.to || queued {
			w.deliver(inbound{dl: dl})
			return
		}
		a.n.log.Debug("reply: dropped an answer from someone else", "agent", a.id, "from", env.From)
		return
	}
	if protocol.IsAccepted(env) {
		return
	}
	if err := a.n.journal.Record(env.From, env.ID); err != nil {
		a.n.log.Error("journal", "err", err)
	}
	if a.cfg.OnReply != nil {
		a.cfg.OnReply(a.resultOf(dl))
	}
}

// resultOf reads an answer.
func (a *Agent) resultOf(dl *protocol.Delivery) *Result {
	env := dl.Env
	r := &Result{RequestID: env.InReplyTo, From: env.From, Env: env, Delivery: dl, TaskID: env.TaskID}
	// Read through the kept parse; only the output, the caller's to keep
	// and change, is copied.
	if v, err := env.PayloadView(); err == nil {
		if p, ok := v.(map[string]any); ok {
			r.Status, _ = p["status"].(string)
			r.Output = protocol.CloneValue(p["output"])
			r.Message, _ = p["message"].(string)
			if r.TaskID == "" {
				r.TaskID, _ = p["task_id"].(string)
			}
			if isLateAnswer(env) {
				// A protocol 0.3 late answer is a request: what it
				// offers back is its input (hold.go heldAnswer).
				r.Output = protocol.CloneValue(p["input"])
			}
		}
	}
	r.Error = bus.ErrorOf(env)
	if r.Status == "" && isLateAnswer(env) {
		r.Status = protocol.StateCompleted
		if r.Error != nil {
			r.Status = protocol.StateFailed
		}
	}
	if ack, ok := protocol.QueuedAckOf(env); ok {
		r.Queued, r.InboxID = true, ack.InboxID
	}
	return r
}

// Request sends a request to another agent's inbox and waits for its answer
// (spec §4.3 call steps): build, pre-flight (a refusal publishes nothing),
// sign, publish with a reply subject, treat an accept as "keep waiting"
// (the timeout restarts), and resolve on the first respond whose status is
// not "accepted". An answer carrying an error returns both the Result and
// that *errs.Error. A Task-mode answer returns Result.Task. No answer in
// time is TRANSPORT_TIMEOUT (details.request_id names the request, whose
// late answer then reaches OnReply); nobody listening and no mailbox is
// AGENT_UNAVAILABLE.
func (a *Agent) Request(ctx context.Context, to, offering string, input any, opts RequestOptions) (*Result, error) {
	if !keys.IsUserPublicKey(to) {
		return nil, errs.Newf(errs.InvalidRequest, "recipient %q is not an agent id", to)
	}
	payload := map[string]any{"offering": offering, "input": input}
	if opts.Config != nil {
		payload["config"] = opts.Config
	}
	env, err := protocol.New(protocol.TypeRequest, a.id, payload)
	if err != nil {
		return nil, errs.Wrap(errs.InvalidRequest, "the request cannot be encoded", err)
	}
	env.To, env.ContextID = to, opts.ContextID
	if opts.ID != "" {
		env.ID = opts.ID
	}
	if opts.Budget != nil {
		if err := opts.Budget.Validate(); err != nil {
			return nil, err
		}
		b := *opts.Budget
		env.Budget = &b
	}
	var lim protocol.RecipientLimits
	if opts.Limits != nil {
		lim = *opts.Limits
	}
	if err := protocol.Preflight(env, lim, a.n.maxPayload()); err != nil {
		return nil, err
	}
	if err := env.Sign(a.key); err != nil {
		return nil, err
	}
	data, err := env.Marshal()
	if err != nil {
		return nil, err
	}
	w := &waiter{a: a, id: env.ID, to: to, ch: make(chan inbound, 16)}
	a.n.addWaiter(w)
	defer a.n.removeWaiter(env.ID)
	var f *follower
	if opts.Follow {
		if f, err = a.follow(env.ID); err != nil {
			return nil, err
		}
		defer f.close()
	}
	// Nats-Msg-Id: the mailbox's dedupe of a retried publish.
	msg := &nats.Msg{Subject: protocol.InboxSubject(to), Reply: a.n.respPrefix + env.ID, Data: data,
		Header: nats.Header{nats.MsgIdHdr: []string{env.ID}}}
	if err := a.n.publishMsg(msg); err != nil {
		return nil, err
	}
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = a.n.cfg.RequestTimeout
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	accepted := false
	for {
		select {
		case in := <-w.ch:
			if in.noResponders {
				return nil, errs.Newf(errs.AgentUnavailable, "nothing serves agent %s and it has no mailbox", to).
					WithDetail("request_id", env.ID)
			}
			if protocol.IsAccepted(in.dl.Env) {
				accepted = true
				timer.Reset(timeout)
				continue
			}
			if err := a.n.journal.Record(in.dl.Env.From, in.dl.Env.ID); err != nil {
				a.n.log.Error("journal", "err", err)
			}
			res := a.resultOf(in.dl)
			res.RequestID, res.Accepted = env.ID, accepted || w.heldAccepts()
			if res.TaskID != "" && !protocol.Terminal(res.Status) && res.Error == nil {
				h, err := a.newTaskHandle(res.TaskID, to, env.ID, f)
				if err != nil {
					return res, err
				}
				res.Task = h
			}
			if res.Error != nil {
				return res, res.Error
			}
			return res, nil
		case <-timer.C:
			if at, ok := w.verifyHeld(); ok {
				// The wait an accept verified on arrival would have given.
				accepted = true
				timer.Reset(max(timeout-time.Since(at), 0))
				continue
			}
			return nil, errs.Newf(errs.TransportTimeout, "no answer from %s within %s; the recipient's node may not be running (a mailbox keeps the request, and a late answer arrives through OnReply)", to, timeout).
				WithDetail("request_id", env.ID)
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil, errs.Newf(errs.TransportTimeout, "no answer from %s before the deadline", to).WithDetail("request_id", env.ID)
			}
			return nil, ctx.Err()
		}
	}
}

// framePump delivers frames in the order the broker sent them: every
// subscription involved in following one task (the follower's wildcards,
// then the handle's own) feeds one channel, read by one goroutine. Separate
// async subscriptions would each have their own goroutine, and a handoff
// between them could reorder a task's updates.
type framePump struct {
	nc   *nats.Conn
	ch   chan *nats.Msg
	stop chan struct{}
	once sync.Once
	mu   sync.Mutex
	subs map[string]*nats.Subscription
}

func newPump(nc *nats.Conn, sink func(*nats.Msg)) *framePump {
	p := &framePump{nc: nc, ch: make(chan *nats.Msg, 4096), stop: make(chan struct{}), subs: map[string]*nats.Subscription{}}
	go func() {
		for {
			select {
			case m := <-p.ch:
				sink(m)
			case <-p.stop:
				return
			}
		}
	}()
	return p
}

// subscribe adds subjects and waits until the broker has them.
func (p *framePump) subscribe(subjects ...string) error {
	p.mu.Lock()
	for _, s := range subjects {
		sub, err := p.nc.ChanSubscribe(s, p.ch)
		if err != nil {
			p.mu.Unlock()
			return err
		}
		p.subs[s] = sub
	}
	p.mu.Unlock()
	return p.nc.Flush()
}

func (p *framePump) unsubscribe(subjects ...string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range subjects {
		if sub := p.subs[s]; sub != nil {
			_ = sub.Unsubscribe()
			delete(p.subs, s)
		}
	}
}

func (p *framePump) close() {
	p.mu.Lock()
	for s, sub := range p.subs {
		_ = sub.Unsubscribe()
		delete(p.subs, s)
	}
	p.mu.Unlock()
	p.once.Do(func() { close(p.stop) })
}

var wildcardTaskSubjects = []string{protocol.TaskUpdateSubject("*"), protocol.TaskStreamSubject("*")}

// follower listens to every task update and chunk while a request is
// outstanding, keeping those in reply to it until the answer names the
// task; then it hands them, in order, to the task's handle.
type follower struct {
	reqID string
	pump  *framePump
	mu    sync.Mutex
	msgs  []*nats.Msg
	h     *TaskHandle
}

func (a *Agent) follow(reqID string) (*follower, error) {
	f := &follower{reqID: reqID}
	f.pump = newPump(a.n.nc, f.on)
	if err := f.pump.subscribe(wildcardTaskSubjects...); err != nil {
		f.pump.close()
		return nil, err
	}
	return f, nil
}

func (f *follower) on(m *nats.Msg) {
	f.mu.Lock()
	h := f.h
	if h == nil {
		var lite struct {
			InReplyTo string `json:"in_reply_to"`
		}
		if json.Unmarshal(m.Data, &lite) == nil && lite.InReplyTo == f.reqID {
			f.msgs = append(f.msgs, m)
		}
	}
	f.mu.Unlock()
	if h != nil && h.owns(m.Subject) {
		h.ingest(m)
	}
}

// attach hands the frames kept for h's task to h, then moves the pump from
// the wildcards to the task's own subjects.
func (f *follower) attach(h *TaskHandle) error {
	f.mu.Lock()
	for _, m := range f.msgs {
		if h.owns(m.Subject) {
			h.ingest(m)
		}
	}
	f.msgs, f.h = nil, h
	f.mu.Unlock()
	h.pump = f.pump
	if err := f.pump.subscribe(protocol.TaskUpdateSubject(h.ID), protocol.TaskStreamSubject(h.ID)); err != nil {
		return err
	}
	f.pump.unsubscribe(wildcardTaskSubjects...)
	return nil
}

// close stops following, unless a handle took the pump over.
func (f *follower) close() {
	f.mu.Lock()
	attached := f.h != nil
	f.mu.Unlock()
	if !attached {
		f.pump.close()
	}
}
