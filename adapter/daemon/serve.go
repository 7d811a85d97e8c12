package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"agentmesh.dev/mesh/adapter/allowance"
	"agentmesh.dev/mesh/adapter/control"
	"agentmesh.dev/mesh/adapter/inbox"
	"agentmesh.dev/mesh/adapter/node"
	"agentmesh.dev/mesh/adapter/registrar"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// maxOutput bounds what a command may answer: above it the answer would
// not fit in one envelope on the default transport.
const maxOutput = 512 << 10

// admit runs before the accept. Inbox mode keeps every admitted request in
// the local queue and holds it: the sender gets the queued acknowledgement
// now and the answer when someone replies.
//
// Command mode runs the owner's allowance first (spec §4.2 "Allowance
// rules"): work that does not fit the tightest remaining ceiling is refused
// with BUDGET_INSUFFICIENT quoting its price, or, under ask-owner, held in
// the queue for the owner like an inbox message.
func (a *adapter) admit(ctx context.Context, c *node.Call, _ *protocol.Budget) error {
	if c.Offering != Offering {
		return nil
	}
	if a.cfg.Mode == ModeCmd {
		in, _ := a.input(c)
		d := a.allow.Admit(c.Env.TaskID, c.Env.ContextID, len([]rune(in)), time.Now())
		switch {
		case d.Admit:
			return nil
		case !d.Hold:
			return d.Decline()
		}
		a.log.Info("held for the owner: over the allowance", "from", c.Env.From)
	}
	m, err := a.keep(c)
	if err != nil {
		return errs.Wrap(errs.InternalError, "the message could not be kept", err)
	}
	return node.Hold(m.ID)
}

// input is what the command reads for c: the framed text, or with --raw
// the bare sender text.
func (a *adapter) input(c *node.Call) (string, bool) {
	if a.cfg.Raw {
		return c.SenderText, true
	}
	return textOf(c.Input)
}

// keep stores c in the local queue (once, however often it arrives).
func (a *adapter) keep(c *node.Call) (inbox.Message, error) {
	framed, _ := textOf(c.Input)
	m := inbox.Message{ID: c.Env.ID, From: c.Env.From, Offering: c.Offering, Text: c.SenderText, Framed: framed,
		TraceID: c.Env.Trace.TraceID, BudgetLine: c.BudgetLine, ReceivedAt: protocol.FormatTime(time.Now()),
		Envelope: json.RawMessage(c.Env.Raw())}
	if c.Budget != nil {
		if b, err := json.Marshal(c.Budget); err == nil {
			m.Budget = b
		}
	}
	stored, added, err := a.queue.Put(m)
	if err == nil && added {
		a.log.Info("message kept", "seq", stored.Seq, "from", stored.From)
	}
	return stored, err
}

// textOf is the text member of an input or output ({text} or a string).
func textOf(v any) (string, bool) {
	switch x := v.(type) {
	case string:
		return x, true
	case map[string]any:
		s, ok := x["text"].(string)
		return s, ok
	}
	return "", false
}

// handle runs command mode's command on one admitted request.
func (a *adapter) handle(ctx context.Context, c *node.Call) error {
	if a.cfg.Mode != ModeCmd {
		return errs.New(errs.InternalError, "this adapter holds messages for its owner; it has no handler")
	}
	in, ok := a.input(c)
	if !ok {
		return errs.New(errs.InputInvalid, "send {\"text\": \"...\"}: this agent answers text messages")
	}
	out, err := a.run(ctx, in)
	// Every invocation is metered, a failed one too: it may have spent.
	if _, merr := a.allow.Meter(c.Env.TaskID, c.Env.ContextID, len([]rune(in)), len([]rune(out)), time.Now()); merr != nil && !errors.Is(merr, allowance.ErrFailsClosed) {
		a.log.Warn("allowance: the invocation was not metered", "err", merr)
	}
	if err != nil {
		return err
	}
	return c.Reply(map[string]any{"text": out})
}

// errOutputLimit cancels a command whose stdout went over maxOutput.
var errOutputLimit = errors.New("the command's output went over the limit")

// run pipes in to a fresh run of the command and returns its stdout. A
// command that fails, times out or prints too much is an error answer the
// sender can read, never silence.
//
// The command runs in a process group of its own, and is stopped by
// SIGKILL to the whole group: on the timeout, as soon as its stdout goes
// over maxOutput, and (best effort) once the shell has exited, so nothing
// it started (a model harness, a background job) keeps running and
// spending after the run is answered and metered. A process that leaves
// the group (setsid) is beyond this. WaitDelay bounds the wait for pipes
// that something else still holds.
func (a *adapter) run(ctx context.Context, in string) (string, error) {
	ctx, cancelTimeout := context.WithTimeout(ctx, a.cfg.CommandTimeout)
	defer cancelTimeout()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", a.cfg.Command)
	ownGroup(cmd)
	cmd.Stdin = strings.NewReader(in)
	var stdout, stderr limitedBuffer
	stdout.max, stderr.max = maxOutput, 4<<10
	stdout.onOver = func() { cancel(errOutputLimit) }
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if cmd.Process != nil {
		_ = killGroup(cmd) // whatever the shell left behind
	}
	switch {
	case stdout.over:
		return "", errs.Newf(errs.InternalError, "the agent's command printed more than %d bytes", maxOutput)
	case errors.Is(context.Cause(ctx), context.DeadlineExceeded):
		return "", errs.Newf(errs.InternalError, "the agent's command did not finish within %s", a.cfg.CommandTimeout)
	case err != nil:
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			msg = "no error output"
		}
		a.log.Warn("command failed", "err", err)
		return "", errs.Newf(errs.InternalError, "the agent's command failed (%v): %s", err, msg)
	case !utf8.Valid(stdout.Bytes()):
		return "", errs.New(errs.InternalError, "the agent's command printed something that is not UTF-8 text")
	}
	return stdout.String(), nil
}

// limitedBuffer keeps the first max bytes and notes whether more came,
// calling onOver (when set) the first time. os/exec writes to it from one
// goroutine, and over is read after Wait.
//
// The buffer is a field, not embedded: an embedded bytes.Buffer would lend
// the type its ReadFrom, and io.Copy (which os/exec uses) would call that
// instead of Write, reading a command's whole output into memory with no
// limit at all.
type limitedBuffer struct {
	buf    bytes.Buffer
	max    int
	over   bool
	onOver func()
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.buf.Len(); len(p) > room {
		if !b.over && b.onOver != nil {
			b.onOver()
		}
		b.over = true
		if room > 0 {
			b.buf.Write(p[:room])
		}
		return len(p), nil
	}
	return b.buf.Write(p)
}

func (b *limitedBuffer) Bytes() []byte  { return b.buf.Bytes() }
func (b *limitedBuffer) String() string { return b.buf.String() }

// onReply receives answers no Request waits for any more: answers to held
// requests (after a queued ack), late ones, and anything else signed and
// addressed to this agent. Anyone may publish to an agent's inbox, so an
// answer is taken as a reply only when its in_reply_to names a request
// this agent sent (the record in the queue, which survives restarts) to
// the answer's signer; any other is kept as unsolicited, and says so.
func (a *adapter) onReply(r *node.Result) {
	if a.inviteAnswered(r) {
		return
	}
	to, sent, err := a.queue.SentTo(r.RequestID)
	if err != nil {
		a.log.Warn("the record of sent requests could not be read; the answer is kept as unsolicited", "request", r.RequestID, "err", err)
	}
	solicited := sent && to == r.From
	if solicited {
		a.repMu.Lock()
		ch := a.replies[r.RequestID]
		a.repMu.Unlock()
		if ch != nil {
			select {
			case ch <- r:
			default:
			}
			return
		}
	}
	// Nobody waits any more (the send gave up, or the adapter restarted),
	// or nobody asked: keep it in the inbox so the person sees it, framed
	// like any sender content.
	text, _ := textOf(r.Output)
	if e := answerError(r); e != nil {
		text = Describe(e).Error()
	}
	kind := inbox.KindReply
	if !solicited {
		kind = inbox.KindUnsolicited
		a.log.Info("an unsolicited answer", "from", r.From, "in_reply_to", r.RequestID)
	}
	now := time.Now()
	m := inbox.Message{Kind: kind, ID: r.Env.ID, InReplyTo: r.RequestID, From: r.From, Text: text,
		Framed:  protocol.FrameText(text, protocol.Provenance{From: r.From, ReceivedAt: now, TraceID: r.Env.Trace.TraceID}),
		TraceID: r.Env.Trace.TraceID, ReceivedAt: protocol.FormatTime(now), Envelope: json.RawMessage(r.Env.Raw())}
	if _, _, err := a.queue.Put(m); err != nil {
		a.log.Warn("a late answer could not be kept", "request", r.RequestID, "err", err)
	}
}

// SendResult is the outcome of a send that went out: the answer, the
// recipient's error answer, a queued acknowledgement, or no answer in time.
type SendResult struct {
	RequestID string `json:"request_id"`
	// To is the agent the message went to (a handle resolved); From the
	// signer of the answer: the recipient, or for a queued acknowledgement
	// the mesh's admission service when it holds the message instead.
	To     string `json:"to"`
	From   string `json:"from"`
	Status string `json:"status"`
	Text   string `json:"text"`
	// Queued is set when the recipient holds the message for a person
	// (inbox mode) and its answer did not come within the send: it arrives
	// later, at this agent's inbox.
	Queued bool `json:"queued,omitempty"`
	// Error is the recipient's error answer (status "failed").
	Error *errs.Error `json:"error,omitempty"`
	// NoAnswer is set when nothing answered within the wait.
	NoAnswer bool `json:"no_answer,omitempty"`
}

// SendOptions tune a send.
type SendOptions struct {
	// AcceptNewBinding sends to a handle whose agent changed since it was
	// pinned, and pins the new agent (`send --accept-new-binding`).
	AcceptNewBinding bool
	// WaitHeld waits, up to the send's wait, for the answer to a message
	// the recipient holds for a person; without it the queued
	// acknowledgement ends the send.
	WaitHeld bool
	// RegistrarURL resolves handles instead of the adapter's own.
	RegistrarURL string
}

// send sends text to an agent (its id or a handle) and waits up to wait
// for the answer.
func (a *adapter) send(ctx context.Context, to, text string, wait time.Duration, opt SendOptions) (*SendResult, error) {
	cfg := a.cfg
	cfg.RegistrarURL = firstNonEmpty(opt.RegistrarURL, cfg.RegistrarURL)
	agentID, err := resolveRecipient(ctx, cfg, to, opt)
	if err != nil {
		return nil, err
	}
	return a.deliver(ctx, agentID, to, text, wait, opt)
}

// deliver sends text to agentID (named to for people) and waits up to wait
// for the answer. Errors are failures to send; what the recipient did
// (answered, refused, queued, said nothing) is in the result.
func (a *adapter) deliver(ctx context.Context, agentID, to, text string, wait time.Duration, opt SendOptions) (*SendResult, error) {
	if wait <= 0 {
		wait = 30 * time.Second
	}
	if err := a.notConnected(ctx); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(wait)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	// The request is recorded before it is published, so its answer,
	// however late (after a restart too), is recognised as a reply.
	id := protocol.NewID()
	if err := a.queue.NoteRequest(id, agentID, time.Now()); err != nil {
		return nil, fmt.Errorf("nothing was sent: %w", err)
	}
	ch := make(chan *node.Result, 1)
	a.repMu.Lock()
	a.replies[id] = ch
	a.repMu.Unlock()
	defer func() {
		a.repMu.Lock()
		delete(a.replies, id)
		a.repMu.Unlock()
	}()
	res, err := a.agent.Request(ctx, agentID, Offering, map[string]any{"text": text}, node.RequestOptions{Timeout: wait, ID: id})
	if res != nil || errs.CodeOf(err) == errs.TransportTimeout {
		// Sent (answered or not): agentID is someone this agent has
		// exchanged messages with, for `contacts export`.
		if nerr := a.queue.NoteSent(agentID, time.Now()); nerr != nil {
			a.log.Warn("the send was not recorded for contacts", "to", agentID, "err", nerr)
		}
	}
	if err != nil && res == nil {
		if errs.CodeOf(err) == errs.TransportTimeout {
			// Silence from a mesh this node lost is not the recipient's.
			// (Bounded: the command waits 15 s beyond the wait, no more.)
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			cerr := a.notConnected(cctx)
			cancel()
			if cerr != nil {
				return nil, cerr
			}
			return &SendResult{RequestID: id, To: agentID, NoAnswer: true}, nil
		}
		return nil, err
	}
	if res.Queued {
		// Held by the recipient (inbox mode): the answer comes to this
		// agent's inbox when a person replies.
		if !opt.WaitHeld {
			return &SendResult{RequestID: id, To: agentID, From: res.From, Status: "queued", Queued: true}, nil
		}
		select {
		case r := <-ch:
			res = r
		case <-ctx.Done():
			return &SendResult{RequestID: id, To: agentID, From: res.From, Status: "queued", Queued: true}, nil
		}
	}
	out := &SendResult{RequestID: id, To: agentID, From: res.From, Status: res.Status, Error: answerError(res)}
	out.Text, _ = textOf(res.Output)
	return out, nil
}

// resolveRecipient turns an agent id or a handle into an agent id. A
// handle's card is verified with the registrar key pinned in pins.json,
// and its agent checked against the handle's pin there: a changed binding
// is refused with a loud warning on cfg.Out unless the user accepted it
// (SendOptions.AcceptNewBinding), which re-pins it.
func resolveRecipient(ctx context.Context, cfg Config, to string, opt SendOptions) (string, error) {
	if keys.IsUserPublicKey(to) {
		return to, nil
	}
	if !strings.Contains(to, ".") || !strings.Contains(to, "@") {
		return "", fmt.Errorf("%q is neither an agent id (U…, 56 characters) nor a handle (<name>.<email>)", to)
	}
	if cfg.RegistrarURL == "" {
		return "", fmt.Errorf("resolving the handle %s needs the registrar: pass --registrar-url or set MESH_REGISTRAR_URL, or send to the agent id", to)
	}
	rc := registrar.New(cfg.RegistrarURL)
	if cfg.HTTP != nil {
		rc.HTTP = cfg.HTTP
	}
	rc.Pins = registrar.OpenPins(cfg.Dir.File(registrar.PinsFile))
	out := cfg.Out
	if out == nil {
		out = io.Discard
	}
	r, err := rc.Resolve(ctx, to, registrar.ResolveOptions{AcceptNewBinding: opt.AcceptNewBinding})
	var changed *registrar.BindingChangedError
	if errors.As(err, &changed) {
		fmt.Fprint(out, changed.Warning())
	}
	if err != nil {
		return "", err
	}
	if r.Previous != "" {
		fmt.Fprintf(out, "note: %s is now pinned to agent %s (was %s), as --accept-new-binding asked\n", to, r.AgentID, r.Previous)
	}
	return r.AgentID, nil
}

// serveControl executes the short commands.
func (a *adapter) serveControl(ctx context.Context, r control.Request) (any, error) {
	switch r.Op {
	case "status":
		return map[string]any{"agent_id": a.id.AgentID, "name": a.id.Name, "mode": a.cfg.Mode, "node_id": a.node.ID(), "health": a.node.Health(),
			"guarded": a.agent.Guarded()}, nil
	case "guard":
		return a.guard(ctx, r.Roster)
	case "unguard":
		return a.unguard(ctx)
	case "inbox":
		return a.queue.List(r.All)
	case "reply":
		return a.reply(ctx, r.Ref, inbox.Replied, func(raw []byte) error { return a.agent.AnswerHeld(raw, map[string]any{"text": r.Text}) })
	case "refuse":
		est, err := allowance.ParseEstimate(r.Estimate, time.Now())
		if err != nil {
			return nil, err
		}
		refusal := est.Refusal(r.Text)
		return a.reply(ctx, r.Ref, inbox.Refused, func(raw []byte) error { return a.agent.RefuseHeld(raw, refusal) })
	case "contacts":
		return a.queue.Contacts()
	case "ack":
		var acked []inbox.Message
		for _, ref := range r.Refs {
			m, err := a.ack(ref)
			if err != nil {
				return nil, err
			}
			acked = append(acked, m)
		}
		return acked, nil
	case "send":
		if !(r.WaitSeconds >= 0 && r.WaitSeconds <= 3600) {
			return nil, fmt.Errorf("wait_seconds must be between 0 and 3600, not %g", r.WaitSeconds)
		}
		return a.send(ctx, r.To, r.Text, time.Duration(r.WaitSeconds*float64(time.Second)),
			SendOptions{AcceptNewBinding: r.AcceptNewBinding, WaitHeld: r.WaitHeld, RegistrarURL: r.RegistrarURL})
	case "room":
		return a.room(ctx, r)
	case "registration":
		return a.registration(ctx, r)
	case "commerce":
		return a.commerce(ctx, r)
	case "credits":
		return a.credits(ctx)
	}
	return nil, fmt.Errorf("unknown operation %q", r.Op)
}

// reply answers the held message ref with answer and marks it state
// (Replied, or Refused for a refusal). The
// answer goes out first: if the adapter stops between the two, the message
// is still unread, and replying again finds the runtime's journal already
// holding the answer; that reply then says the earlier answer stands and
// sends nothing. The control socket serves connections concurrently, so
// the whole of it (read, check, send, mark) holds the message's lock: of
// two replies to one message only the first sends.
func (a *adapter) reply(_ context.Context, ref, state string, answer func(raw []byte) error) (inbox.Message, error) {
	m, err := a.queue.Get(ref)
	if err != nil {
		return inbox.Message{}, err
	}
	defer a.msgLocks.lock(m.Seq)()
	num := "#" + strconv.FormatUint(m.Seq, 10)
	if m, err = a.queue.Get(num); err != nil { // as it is now, under the lock
		return inbox.Message{}, err
	}
	switch m.Kind {
	case inbox.KindReply:
		return inbox.Message{}, fmt.Errorf("message #%d is a reply to what this agent sent; there is nothing to answer (ack it)", m.Seq)
	case inbox.KindUnsolicited:
		return inbox.Message{}, fmt.Errorf("message #%d is an unsolicited answer, not a request; there is nothing to answer (ack it)", m.Seq)
	}
	if m.State != inbox.Unread {
		return inbox.Message{}, fmt.Errorf("message #%d is already %s", m.Seq, m.State)
	}
	if err := answer(m.Envelope); errors.Is(err, node.ErrAlreadyAnswered) {
		// Answered before the adapter last stopped, and not marked: mark
		// it now, and say that this answer did not go out.
		if _, terr := a.queue.Transition(num, state, time.Now(), nil); terr != nil {
			return inbox.Message{}, fmt.Errorf("message #%d: %w", m.Seq, terr)
		}
		return inbox.Message{}, fmt.Errorf("message #%d was already answered (the answer went out before the adapter last stopped, and is in its journal): "+
			"that earlier answer stands, and this one was NOT sent; it is now marked %s", m.Seq, state)
	} else if err != nil {
		return inbox.Message{}, fmt.Errorf("message #%d: %w", m.Seq, err)
	}
	return a.queue.Transition(num, state, time.Now(), nil)
}

// ack marks the message ref acknowledged, under its lock (see reply).
func (a *adapter) ack(ref string) (inbox.Message, error) {
	m, err := a.queue.Get(ref)
	if err != nil {
		return inbox.Message{}, err
	}
	defer a.msgLocks.lock(m.Seq)()
	return a.queue.Transition("#"+strconv.FormatUint(m.Seq, 10), inbox.Acked, time.Now(), nil)
}

// seqLocks is one mutex per message number, held while a reply or an ack
// is under way; an entry lives while someone holds or waits for it.
type seqLocks struct {
	mu sync.Mutex
	m  map[uint64]*seqLock
}

type seqLock struct {
	sync.Mutex
	users int
}

// lock takes message seq's lock and returns its release.
func (l *seqLocks) lock(seq uint64) (unlock func()) {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[uint64]*seqLock{}
	}
	e := l.m[seq]
	if e == nil {
		e = &seqLock{}
		l.m[seq] = e
	}
	e.users++
	l.mu.Unlock()
	e.Lock()
	return func() {
		e.Unlock()
		l.mu.Lock()
		if e.users--; e.users == 0 {
			delete(l.m, seq)
		}
		l.mu.Unlock()
	}
}
