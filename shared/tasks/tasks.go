// Package tasks is the task manager (docs/bus.md "Tasks", upstream-notes
// §3.4–3.5, §4.1, §15): it records what the two parties of a task publish
// on mesh.task.<id>.update in the KV bucket mesh_tasks and answers
// mesh.task.get.<id> for them. The performer writes states; the requester
// writes only its cancel (a protocol 0.3 requester publishes the canceled
// update itself) and budget revisions. A record created by a canceled update
// alone does not know which of its two parties is which (create).
//
// Updates are plain publishes taken in the worker's queue group, so each
// reaches one copy; every write is a compare-and-set, so two copies handling
// two updates of one task at once serialise on the record and neither is
// lost. The copy that handled an illegal update is the one that emits
// task.invalid_transition, so the event goes out once.
package tasks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// Defaults (upstream-notes §13: task history 50 entries, KV TTL 7 days).
const (
	DefaultName          = "tasks"
	DefaultBucket        = "mesh_tasks"
	DefaultTTL           = 7 * 24 * time.Hour
	DefaultHistoryLimit  = 50
	DefaultReorderWindow = 500 * time.Millisecond
	DefaultMaxHeld       = 1024

	// UpdateSubjects is what the manager subscribes: every task's updates.
	UpdateSubjects = "mesh.task.*.update"
	// EventDomain and EventInvalidTransition name the platform event of an
	// illegal update: mesh.event.task.invalid_transition.
	EventDomain            = "task"
	EventInvalidTransition = "invalid_transition"
)

// Config tunes the manager; the zero value gives the defaults (a
// single-replica bucket: set Replicas on a cluster).
type Config struct {
	// Name is the worker name (queue group mesh-<name>); "tasks".
	Name string
	// Bucket is the KV bucket; "mesh_tasks".
	Bucket string
	// TTL is how long a task record lives after its last write; 7 days.
	TTL time.Duration
	// Replicas of the bucket (bus.Replicas: 0 is 1, one server; the cloud's
	// cluster runs 3, set by the workers table).
	Replicas int
	// HistoryLimit caps a record's history (oldest dropped); 50.
	HistoryLimit int
	// ReorderWindow is how long an update that is ahead of the record (a
	// task not created yet, or a move the record's non-terminal state does
	// not allow yet) is held and retried before it is refused: two updates
	// published back to back may reach two copies and land in either
	// order. A predecessor overtaken by the update that ended the task
	// (the performer's working overtaken by the requester's cancel, say)
	// is placed before it when it arrives within this long of the end.
	// 500 ms; negative refuses at once and places nothing.
	ReorderWindow time.Duration
	// MaxHeld bounds the updates one copy holds for ReorderWindow at once
	// (each waits on a goroutine of its own); past it, an update that is
	// ahead of the record is refused at once. A cancel is never held. 1024.
	MaxHeld int
}

func (c Config) withDefaults() Config {
	if c.Name == "" {
		c.Name = DefaultName
	}
	if c.Bucket == "" {
		c.Bucket = DefaultBucket
	}
	if c.TTL <= 0 {
		c.TTL = DefaultTTL
	}
	c.Replicas = bus.Replicas(c.Replicas)
	if c.HistoryLimit <= 0 {
		c.HistoryLimit = DefaultHistoryLimit
	}
	if c.ReorderWindow == 0 {
		c.ReorderWindow = DefaultReorderWindow
	}
	if c.MaxHeld <= 0 {
		c.MaxHeld = DefaultMaxHeld
	}
	return c
}

// Task is the record kept in mesh_tasks under the task id, and what
// mesh.task.get.<id> answers as payload.task.
type Task struct {
	ID        string  `json:"id"`
	Requester string  `json:"requester"`
	Responder string  `json:"responder"`
	Offering  string  `json:"offering,omitempty"`
	State     string  `json:"state"`
	CreatedAt string  `json:"created_at"`
	UpdatedAt string  `json:"updated_at"`
	History   []Entry `json:"history"`
	// Output, Message and Error are those of the terminal update.
	Output  json.RawMessage `json:"output,omitempty"`
	Message string          `json:"message,omitempty"`
	Error   json.RawMessage `json:"error,omitempty"`
	// Reason and Note are those of the canceled update, CanceledBy its
	// sender.
	Reason     string `json:"reason,omitempty"`
	Note       string `json:"note,omitempty"`
	CanceledBy string `json:"canceled_by,omitempty"`
	// RolesGuessed marks a record created by a canceled update alone:
	// Requester and Responder are its two parties, which is which read
	// from the cancel's reason (create). Both read and write it as either
	// party; the performer's first placeable state settles the roles.
	RolesGuessed bool `json:"roles_guessed,omitempty"`
	// Budget is the standing budget: the envelope budget of the creating
	// update, then the newest accepted revision.
	Budget *protocol.Budget `json:"budget,omitempty"`
	// Spent is the latest spend the responder reported (details.spent of a
	// BUDGET_EXHAUSTED pause, or payload.cost); revisions whose ceiling is
	// below it are refused.
	Spent *protocol.Money `json:"spent,omitempty"`
}

// Entry is one recorded update: the state it left the task in, when it was
// recorded, and the envelope that carried it (its id, and the time its
// sender signed in it).
type Entry struct {
	State      string `json:"state"`
	At         string `json:"at"`
	EnvelopeID string `json:"envelope_id"`
	TS         string `json:"ts,omitempty"`
}

// Stats counts what one copy did with the updates it received. Every
// received update ends in exactly one of the outcome counters.
type Stats struct {
	Received uint64
	// Recorded: created a task, moved it, or added a progress entry.
	Recorded uint64
	// Duplicates: an envelope already recorded (or seen by this copy), or
	// a cancel of a task already canceled (both parties may publish one).
	Duplicates uint64
	// Refused: not decodable, unsigned, not a respond, stale, on an
	// invalid task id, malformed payload, no other party in `to` on the
	// creating update, canceled without a valid reason, misaddressed.
	Refused uint64
	// NotParty: a state update from neither party, one from the
	// requester that is not a cancel, a revision not from the requester.
	NotParty uint64
	// Illegal: a transition the state table does not allow (an
	// invalid_transition event was emitted for each).
	Illegal uint64
	// RevisionsApplied and RevisionsRefused count budget revisions.
	RevisionsApplied uint64
	RevisionsRefused uint64
	// Failed: the store could not be read or written.
	Failed uint64
}

// Done is the number of updates that reached an outcome.
func (s Stats) Done() uint64 {
	return s.Recorded + s.Duplicates + s.Refused + s.NotParty + s.Illegal +
		s.RevisionsApplied + s.RevisionsRefused + s.Failed
}

type counters struct {
	received, recorded, duplicates, refused, notParty, illegal, revApplied, revRefused, failed atomic.Uint64
}

// Worker is one copy of the task manager.
type Worker struct {
	cfg   Config
	svc   *bus.Service
	kv    jetstream.KeyValue
	sub   *nats.Subscription
	dedup *protocol.DedupMemory
	n     counters
	holds chan struct{} // one slot per update held for reordering

	ctx    context.Context // canceled by Stop
	cancel context.CancelFunc
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// Start binds (creating if needed) the mesh_tasks bucket, subscribes the
// task updates in the worker's queue group and adds the get endpoint. ctx
// bounds the start only; the worker runs until Stop.
func Start(ctx context.Context, env bus.Env, cfg Config) (*Worker, error) {
	cfg = cfg.withDefaults()
	svc, err := bus.NewServiceIn(env, cfg.Name, "task manager: records task updates, answers mesh.task.get")
	if err != nil {
		return nil, err
	}
	kv, err := bus.Bucket(ctx, svc.JS, jetstream.KeyValueConfig{
		Bucket:      cfg.Bucket,
		Description: "task records (docs/bus.md Tasks)",
		TTL:         cfg.TTL,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		_ = svc.Stop()
		return nil, err
	}
	wctx, cancel := context.WithCancel(context.Background())
	w := &Worker{cfg: cfg, svc: svc, kv: kv, dedup: protocol.NewDedupMemory(0), holds: make(chan struct{}, cfg.MaxHeld),
		ctx: wctx, cancel: cancel}
	if err := svc.Endpoint("get", protocol.SubjTaskGetPfx+"*", w.get); err != nil {
		cancel()
		_ = svc.Stop()
		return nil, fmt.Errorf("%s: get endpoint: %w", cfg.Name, err)
	}
	w.sub, err = env.NC.QueueSubscribe(UpdateSubjects, UpdateQueueGroup(cfg.Name), w.onUpdate)
	if err == nil {
		err = env.NC.Flush()
	}
	if err != nil {
		cancel()
		_ = svc.Stop()
		return nil, fmt.Errorf("%s: subscribe %s: %w", cfg.Name, UpdateSubjects, err)
	}
	return w, nil
}

// UpdateQueueGroup is the queue group of the update subscription. It is not
// the endpoints' group (mesh-<name>): the server balances one queue group
// across every subscription in it that matches a subject, so sharing the
// name would let the get endpoint (mesh.task.get.*) take the updates of a
// task named "get" (mesh.task.get.update) away from this subscription.
func UpdateQueueGroup(name string) string { return bus.QueueGroup(name) + "-updates" }

// Stop unsubscribes, waits for updates in hand (held ones are dropped) and
// stops the endpoint. Stopping twice is harmless.
func (w *Worker) Stop() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	w.mu.Unlock()
	err := w.sub.Unsubscribe()
	w.cancel()
	w.wg.Wait()
	return errors.Join(err, w.svc.Stop())
}

// Stats is a snapshot of this copy's counters.
func (w *Worker) Stats() Stats {
	return Stats{
		Received: w.n.received.Load(), Recorded: w.n.recorded.Load(), Duplicates: w.n.duplicates.Load(),
		Refused: w.n.refused.Load(), NotParty: w.n.notParty.Load(), Illegal: w.n.illegal.Load(),
		RevisionsApplied: w.n.revApplied.Load(), RevisionsRefused: w.n.revRefused.Load(), Failed: w.n.failed.Load(),
	}
}

// enter registers work in hand unless the worker is stopping.
func (w *Worker) enter() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return false
	}
	w.wg.Add(1)
	return true
}

func (w *Worker) now() time.Time { return w.svc.Now() }

// get answers mesh.task.get.<id> (payload {}) with {task:{…}}, to the
// requester or the responder only.
func (w *Worker) get(ctx context.Context, r *bus.Request) (any, error) {
	if r.Env.Type != protocol.TypeRequest {
		return nil, errs.Newf(errs.InvalidEnvelope, "mesh.task.get takes a request envelope, not %s", r.Env.Type)
	}
	id := strings.TrimPrefix(r.Subject, protocol.SubjTaskGetPfx)
	if !protocol.ValidToken(id) {
		return nil, errs.New(errs.TaskNotFound, "no such task")
	}
	t, found, err := bus.GetJSON[Task](ctx, w.kv, id)
	if err != nil {
		return nil, fmt.Errorf("read task %s: %w", id, err)
	}
	if !found {
		return nil, errs.Newf(errs.TaskNotFound, "no task %s", id)
	}
	if r.Env.From != t.Requester && r.Env.From != t.Responder {
		return nil, errs.New(errs.Unauthorized, "only the requester or the responder of a task may read it")
	}
	if !r.PrivateReply() {
		// The shared _INBOX. is readable by every credential holding the
		// shared grant: there the answer is the task's state, not what the
		// parties said (docs/security.md).
		return map[string]any{"task": t.redacted(), "redacted": true}, nil
	}
	return map[string]any{"task": t}, nil
}

// redacted is what a task record says on a shared reply subject: its
// parties, offering, state and times; not its output, message, error,
// cancel note, budget or history.
func (t Task) redacted() Task {
	return Task{ID: t.ID, Requester: t.Requester, Responder: t.Responder, Offering: t.Offering, State: t.State,
		CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt, History: []Entry{}, RolesGuessed: t.RolesGuessed}
}

// update is one decoded, verified task update.
type update struct {
	task string
	env  *protocol.Envelope

	// A state update (status != "").
	status   string
	offering string
	output   json.RawMessage
	message  string
	errObj   json.RawMessage
	reason   string
	note     string
	spent    *protocol.Money
	budget   *protocol.Budget // the envelope budget, kept on creation

	// A budget revision (status == "").
	revision *protocol.Budget
}

func (w *Worker) onUpdate(msg *nats.Msg) {
	if !w.enter() {
		return
	}
	defer w.wg.Done()
	w.n.received.Add(1)
	u, err := w.parse(msg)
	if err != nil {
		if errors.Is(err, errDuplicate) {
			w.n.duplicates.Add(1)
			return
		}
		w.n.refused.Add(1)
		// Warn and refuse: nothing is stored, nothing is published.
		w.svc.Log.Warn("task update refused", "subject", msg.Subject, "err", err)
		return
	}
	if u.status == "" {
		w.revise(u)
		return
	}
	w.apply(u)
}

var errDuplicate = errors.New("duplicate")

func refuse(format string, args ...any) error {
	return errs.Newf(errs.InvalidEnvelope, format, args...)
}

// parse runs the receiver's checks on an update and reads its payload.
func (w *Worker) parse(msg *nats.Msg) (*update, error) {
	tok := strings.Split(msg.Subject, ".")
	if len(tok) != 4 || !protocol.ValidToken(tok[2]) || tok[2] == "get" {
		return nil, refuse("%s is not a task update subject", msg.Subject)
	}
	u := &update{task: tok[2]}
	env, err := protocol.Decode(msg.Data)
	if err != nil {
		return nil, err
	}
	if env.Type != protocol.TypeRespond {
		return nil, refuse("a task update is a respond, not %s", env.Type)
	}
	if err := protocol.CheckFreshness(env.TS, w.now(), protocol.SourceLive); err != nil {
		return nil, err
	}
	if env.TaskID != "" && env.TaskID != u.task {
		return nil, refuse("envelope task_id %s does not match the subject's task %s", env.TaskID, u.task)
	}
	if w.dedup.Seen(env.From, env.ID) {
		return nil, errDuplicate
	}
	u.env = env
	v, err := env.PayloadValue()
	if err != nil {
		return nil, refuse("payload is not JSON")
	}
	p, ok := v.(map[string]any)
	if !ok {
		return nil, refuse("payload must be an object")
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(env.Payload, &raw); err != nil {
		return nil, refuse("payload must be an object")
	}

	sv, hasStatus := p["status"]
	if !hasStatus {
		bv, ok := p["budget"]
		switch {
		case ok && bv != nil:
			b, err := protocol.BudgetFromValue(bv)
			if err != nil {
				return nil, err
			}
			u.revision = &b
		case env.Budget != nil:
			u.revision = env.Budget
		default:
			return nil, refuse("a task update carries status, or budget alone (a revision)")
		}
		return u, nil
	}
	if u.status, ok = sv.(string); !ok || u.status == "" {
		return nil, refuse("status must be a non-empty string")
	}
	u.offering = protocol.OfferingOf(p)
	if r, ok := raw["output"]; ok && string(r) != "null" {
		u.output = r
	}
	u.message, _ = p["message"].(string)
	if r, ok := raw["error"]; ok && string(r) != "null" {
		u.errObj = r
	} else if e := env.Extra["error"]; e != nil {
		// Protocol 0.3 carries the error as an envelope member beside the
		// payload (upstream-notes §15).
		if b, err := protocol.Canonical(e); err == nil {
			u.errObj = b
		}
	}
	if u.status == protocol.StateCanceled {
		in := map[string]any{"task_id": u.task}
		for _, k := range []string{"reason", "note"} {
			if x, ok := p[k]; ok {
				in[k] = x
			}
		}
		ci, err := protocol.ParseCancelInput(in)
		if err != nil {
			return nil, err
		}
		u.reason, u.note = ci.Reason, ci.Note
	}
	u.spent = spentOf(p, env)
	u.budget = env.Budget
	return u, nil
}

// spentOf reads a reported spend: payload.cost, or details.spent of a
// BUDGET_EXHAUSTED error (in the payload, or the envelope member).
func spentOf(p map[string]any, env *protocol.Envelope) *protocol.Money {
	if c, ok := p["cost"]; ok {
		if m, err := protocol.MoneyFromValue(c); err == nil {
			return &m
		}
	}
	e, _ := p["error"].(map[string]any)
	if e == nil {
		e, _ = env.Extra["error"].(map[string]any)
	}
	if code, _ := e["code"].(string); code == string(errs.BudgetExhausted) {
		d, _ := e["details"].(map[string]any)
		if m, err := protocol.MoneyFromValue(d["spent"]); err == nil {
			return &m
		}
	}
	return nil
}

// knownState reports whether s is a task state of this version.
func knownState(s string) bool {
	return s == protocol.StateSubmitted || s == protocol.StateWorking || protocol.Cancelable(s) || protocol.Terminal(s)
}

type outcome int

const (
	recorded outcome = iota
	duplicate
	refused
	notParty
	illegal
	ahead // illegal now, but a predecessor may still be on its way
)

// apply records a state update with a compare-and-set. An update that is
// ahead of the record is held and tried again (see hold) until its
// predecessor has been recorded or ReorderWindow has passed, or refused at
// once when it cannot be held.
func (w *Worker) apply(u *update) {
	out, from, err := w.record(u)
	if err == nil && out == ahead && w.ctx.Err() == nil && w.cfg.ReorderWindow > 0 && w.hold(u, from) {
		return
	}
	w.settle(u, out, from, err)
}

// record makes one compare-and-set attempt at recording u; from is the state
// the record was in ("" when the task did not exist). bus.CAS retries lost
// races itself, with jitter, so several copies updating one task serialise.
func (w *Worker) record(u *update) (out outcome, from string, err error) {
	ctx, cancel := context.WithTimeout(w.ctx, 10*time.Second)
	defer cancel()
	_, _, err = bus.CAS(ctx, w.kv, u.task, func(cur *Task, exists bool) (*Task, error) {
		out, from = recorded, ""
		if !exists {
			return w.create(u, &out)
		}
		from = cur.State
		return w.advance(cur, u, &out)
	})
	return out, from, err
}

// settle counts the outcome of u and, for an illegal one (an update still
// ahead when its wait ended counts as illegal), emits invalid_transition.
func (w *Worker) settle(u *update, out outcome, from string, err error) {
	if err != nil {
		w.n.failed.Add(1)
		w.svc.Log.Error("task update not stored", "task", u.task, "envelope", u.env.ID, "err", err)
		return
	}
	switch out {
	case recorded:
		w.n.recorded.Add(1)
	case duplicate:
		w.n.duplicates.Add(1)
	case refused:
		w.n.refused.Add(1)
	case notParty:
		w.n.notParty.Add(1)
		w.svc.Log.Info("task update from someone who may not write it ignored", "task", u.task, "from", u.env.From, "status", u.status)
	case illegal, ahead:
		w.n.illegal.Add(1)
		var fromState any = from
		if from == "" {
			fromState = nil // no task yet
		}
		w.svc.Log.Info("illegal task transition", "task", u.task, "from", from, "to", u.status, "by", u.env.From)
		if err := w.svc.Emit(EventDomain, EventInvalidTransition, map[string]any{
			"task_id": u.task, "from": fromState, "to": u.status, "by": u.env.From,
		}); err != nil {
			w.svc.Log.Error("emit invalid_transition", "task", u.task, "err", err)
		}
	}
}

// hold tries an update that is ahead of the record again on a goroutine of
// its own, after pauses of 25, 50, 100 … ms, until it is no longer ahead or
// ReorderWindow has passed, when it has its last try. Anyone may publish
// updates, so the holds are bounded: with MaxHeld updates already held on
// this copy, hold returns false and the update is refused at once, as if
// its window had passed. Only states are held, never a cancel (create), so
// filling the holds refuses updates and decides nothing.
func (w *Worker) hold(u *update, from string) bool {
	select {
	case w.holds <- struct{}{}:
	default:
		w.svc.Log.Warn("too many task updates held for reordering; this one is not held", "task", u.task, "held", cap(w.holds))
		return false
	}
	if !w.enter() {
		<-w.holds
		return true // stopping: held updates are dropped, so is this one
	}
	first := w.now()
	go func() {
		defer w.wg.Done()
		defer func() { <-w.holds }()
		for attempt := 0; ; attempt++ {
			wait := w.cfg.ReorderWindow - w.now().Sub(first)
			if wait <= 0 {
				break
			}
			select {
			case <-time.After(min(wait, 25*time.Millisecond<<attempt)):
			case <-w.ctx.Done():
				return // stopping: a held update is dropped
			}
			out, from, err := w.record(u)
			if err != nil || out != ahead {
				w.settle(u, out, from, err)
				return
			}
		}
		if w.ctx.Err() != nil {
			return
		}
		out, from, err := w.record(u)
		w.settle(u, out, from, err)
	}()
	return true
}

// create builds the record from the first update of a task.
//
// Any state but canceled comes from the performer: the requester is the
// envelope's `to`, the responder its `from`. A first submitted starts the
// history; any other first state is recorded after the states it implies
// (impliedPath), each carrying its envelope id: a first working after
// submitted, and a first terminal state after submitted, and working where
// submitted cannot lead to it directly. A first terminal state is the
// protocol 0.3 flow (upstream-notes §15): a performer that defers sends
// working to the requester's inbox only, and a stream's only update is its
// final completed. A paused first state (input_required, auth_required) is
// ahead: its creating update may still be on its way.
//
// A first canceled may be either party's: the requester's own (protocol
// 0.3) names the performer in `to`, a performer cancelling on its own
// (policy, a deadline) names the requester, and nothing in the envelope
// says which. It is recorded at once, never held: its sender and its `to`
// are the task's two parties, CanceledBy is its sender, and RolesGuessed
// is set, with the roles read from its reason (cancelerPerforms). The
// roles are only a label: both parties read the record and may publish
// their own cancel, anyone else neither. The performer's word settles them
// later (settleGuessed).
//
// Why at once: anybody may subscribe mesh.task.> and so sees a cancel the
// moment it is published. A first cancel used to wait ReorderWindow for a
// performer update and was then taken as the requester's; an observer
// could publish a cancel of its own (signed by itself, naming the
// performer) meanwhile, fill the copy's holds so that its cancel was taken
// at once, and become the task's requester, locking the real one out.
// Recorded on arrival, the genuine cancel is there before the observer can
// have learnt the id from it, and a later cancel of the observer's is a
// third party's. What waiting was for, the performer's states that the
// cancel overtook, is placed before it when they arrive (advance).
func (w *Worker) create(u *update, out *outcome) (*Task, error) {
	requester, responder := u.env.To, u.env.From
	guessed := false
	switch {
	case u.status == protocol.StateCanceled:
		guessed = true
		if !cancelerPerforms(u.reason) {
			requester, responder = u.env.From, u.env.To
		}
	case u.status == protocol.StateSubmitted, u.status == protocol.StateWorking, protocol.Terminal(u.status):
	case knownState(u.status):
		*out = ahead // its creating update may still be on its way
		return nil, bus.ErrNoChange
	default:
		*out = illegal
		return nil, bus.ErrNoChange
	}
	if !keys.IsUserPublicKey(u.env.To) {
		*out = refused
		w.svc.Log.Info("first task update without the other party in to", "task", u.task, "from", u.env.From, "status", u.status)
		return nil, bus.ErrNoChange
	}
	at := protocol.FormatTime(w.now())
	t := &Task{
		ID: u.task, Requester: requester, Responder: responder, Offering: u.offering,
		State: u.status, CreatedAt: at, UpdatedAt: at, Budget: u.budget, RolesGuessed: guessed,
	}
	if u.env.From == responder {
		t.Spent = u.spent
	}
	for _, s := range impliedPath(u.status) {
		t.History = append(t.History, Entry{State: s, At: at, EnvelopeID: u.env.ID, TS: u.env.TS})
	}
	t.History = append(t.History, Entry{State: u.status, At: at, EnvelopeID: u.env.ID, TS: u.env.TS})
	t.finish(u)
	return t, nil
}

// cancelerPerforms reads from a cancel's reason whether its sender is more
// likely the performer, stopping the work on its own: policy (its policy
// forbids going on) and deadline_exceeded (it ran out of time). The other
// reasons are a requester's: user_requested, superseded, upstream_cancelled
// (its own task was canceled) and budget_exhausted (it will not raise the
// budget at a pause). It is a guess (either party may give any reason),
// used only to label a record made by a cancel alone (RolesGuessed).
func cancelerPerforms(reason string) bool {
	return reason == protocol.CancelPolicy || reason == protocol.CancelDeadlineExceeded
}

// impliedPath is the states a task must have passed through before state
// when state is the first thing recorded of it: submitted, then working
// when submitted cannot lead to state directly.
func impliedPath(state string) []string {
	if state == protocol.StateSubmitted {
		return nil
	}
	p := []string{protocol.StateSubmitted}
	if state != protocol.StateWorking && !protocol.LegalTransition(protocol.StateSubmitted, state) {
		p = append(p, protocol.StateWorking)
	}
	return p
}

// advance applies a later state update to the record. The responder
// writes any state; the requester only its own cancel; nobody else
// anything. A record made by a cancel alone is settled first
// (settleGuessed).
func (w *Worker) advance(t *Task, u *update, out *outcome) (*Task, error) {
	if t.RolesGuessed {
		if next, err, done := w.settleGuessed(t, u, out); done {
			return next, err
		}
	}
	byResponder := u.env.From == t.Responder
	switch {
	case byResponder:
		if u.env.To != "" && u.env.To != t.Requester {
			*out = refused
			w.svc.Log.Warn("task update addressed to someone other than the requester", "task", u.task, "to", u.env.To)
			return nil, bus.ErrNoChange
		}
	case u.env.From == t.Requester && u.status == protocol.StateCanceled:
		if u.env.To != "" && u.env.To != t.Responder {
			*out = refused
			w.svc.Log.Warn("requester's cancel addressed to someone other than the responder", "task", u.task, "to", u.env.To)
			return nil, bus.ErrNoChange
		}
	default:
		*out = notParty
		return nil, bus.ErrNoChange
	}
	for _, e := range t.History {
		if e.EnvelopeID == u.env.ID {
			*out = duplicate
			return nil, bus.ErrNoChange
		}
	}
	if byResponder {
		if i, replace := w.overtaken(t, u); i >= 0 {
			// An update overtaken by the one that ended (or created) the
			// task takes the place of the entry implied for it, or its
			// place before the end, as if the two had arrived in order.
			e := Entry{State: u.status, At: protocol.FormatTime(w.now()), EnvelopeID: u.env.ID, TS: u.env.TS}
			if replace {
				t.History[i].EnvelopeID, t.History[i].TS = u.env.ID, u.env.TS
			} else {
				t.History = slices.Insert(t.History, i, e)
				w.trim(t)
			}
			t.UpdatedAt = e.At
			if t.Offering == "" {
				t.Offering = u.offering
			}
			return t, nil
		}
	}
	switch {
	case u.status == t.State && t.State == protocol.StateCanceled:
		// Both parties may publish the cancel (a 0.3 requester does, and
		// the performer it asked may too): the second finds it recorded.
		*out = duplicate
		return nil, bus.ErrNoChange
	case u.status == t.State && !protocol.Terminal(t.State):
		// progress within the state: history only
	case protocol.LegalTransition(t.State, u.status):
		t.State = u.status
	case !protocol.Terminal(t.State) && knownState(u.status):
		*out = ahead
		return nil, bus.ErrNoChange
	default:
		*out = illegal
		return nil, bus.ErrNoChange
	}
	at := protocol.FormatTime(w.now())
	t.UpdatedAt = at
	t.History = append(t.History, Entry{State: u.status, At: at, EnvelopeID: u.env.ID, TS: u.env.TS})
	w.trim(t)
	if byResponder {
		if t.Offering == "" {
			t.Offering = u.offering
		}
		if u.spent != nil {
			t.Spent = u.spent
		}
	}
	t.finish(u)
	return t, nil
}

// settleGuessed handles an update of a record made by a cancel alone
// (RolesGuessed), whose parties are the cancel's sender (CanceledBy) and
// the party it named. Only the named party, and the performer's own
// states, can change what the cancel said; done is false when the update
// is then judged like any other (advance).
//
//   - The named party's update naming someone other than the canceler:
//     the named party says who its counterpart is, and the cancel's sender
//     is not. The cancel is a third party's (one that learnt the task id
//     before any record existed: from a stream chunk, a get, a revision),
//     and the record is made again from the named party's update, as if
//     it came first. Nobody else can do this: a cancel names its target,
//     so only the party a forged cancel named can undo it.
//   - A state (not a cancel) from either party, naming the other: its
//     sender says it performs the task. It is tried with the roles set that
//     way; when it is recorded (a predecessor the cancel overtook, placed
//     before it: advance), the roles stand and are no longer guessed.
//     Otherwise it is judged with the roles as they were (a requester that
//     is not the responder writes no state).
func (w *Worker) settleGuessed(t *Task, u *update, out *outcome) (*Task, error, bool) {
	canceler := t.CanceledBy
	named := t.Requester
	if named == canceler {
		named = t.Responder
	}
	switch {
	case u.env.From == named && u.env.To != "" && u.env.To != canceler:
		w.svc.Log.Info("the party a first cancel named names another counterpart; the record is made again from its update",
			"task", u.task, "canceler", canceler, "named", named, "counterpart", u.env.To)
		next, err := w.create(u, out)
		return next, err, true
	case u.status == protocol.StateCanceled || (u.env.From != canceler && u.env.From != named):
		return nil, nil, false
	case u.env.To != "" && u.env.To != canceler && u.env.To != named:
		return nil, nil, false // misaddressed: refused as usual
	}
	trial := *t
	trial.History = slices.Clone(t.History)
	trial.Responder, trial.Requester = u.env.From, canceler
	if u.env.From == canceler {
		trial.Requester = named
	}
	trial.RolesGuessed = false
	o := recorded
	if next, err := w.advance(&trial, u, &o); err == nil && o == recorded {
		*out = recorded
		return next, nil, true
	}
	return nil, nil, false
}

// trim drops the oldest history entries past HistoryLimit.
func (w *Worker) trim(t *Task) {
	if n := len(t.History) - w.cfg.HistoryLimit; n > 0 {
		t.History = append([]Entry(nil), t.History[n:]...)
	}
}

// finish keeps what the update that ended the task said: output, message
// and error, and the reason and note of a cancel and who sent it. A record
// that is not terminal is left alone.
func (t *Task) finish(u *update) {
	if !protocol.Terminal(t.State) {
		return
	}
	t.Output, t.Message, t.Error = u.output, u.message, u.errObj
	if t.State == protocol.StateCanceled {
		t.Reason, t.Note, t.CanceledBy = u.reason, u.note, u.env.From
	}
}

// overtaken finds the place of a responder's update that an update already
// recorded overtook: the index of the history entry in u's state implied by
// the update that created the task (a later entry carries the same
// envelope), to be replaced (replace true); else, on a task that has ended,
// the index of its last entry, before which u is inserted when the
// sequence stays legal: the entry before it leads to u's state (or is in
// it) and u's state leads to the end, and u was signed no earlier than
// that entry unless that entry was implied. -1 when u has no such place.
// Once the task has ended either is taken only by an update signed no
// later than the one that ended it and arriving within ReorderWindow of
// the end: otherwise it is a move out of a terminal state.
func (w *Worker) overtaken(t *Task, u *update) (int, bool) {
	h := t.History
	if len(h) == 0 {
		return -1, false
	}
	end := h[len(h)-1]
	sent, errSent := protocol.ParseTime(u.env.TS)
	if protocol.Terminal(t.State) {
		at, errAt := protocol.ParseTime(end.At)
		ended, errEnd := protocol.ParseTime(end.TS)
		if w.cfg.ReorderWindow <= 0 || errAt != nil || errEnd != nil || errSent != nil ||
			sent.After(ended) || w.now().Sub(at) > w.cfg.ReorderWindow {
			return -1, false
		}
	}
	for i := range h {
		if h[i].State != u.status {
			continue
		}
		for _, later := range h[i+1:] {
			if later.EnvelopeID == h[i].EnvelopeID {
				return i, true
			}
		}
	}
	if !protocol.Terminal(t.State) || protocol.Terminal(u.status) || !knownState(u.status) || len(h) < 2 {
		return -1, false
	}
	prev := h[len(h)-2]
	if prev.State != u.status && !protocol.LegalTransition(prev.State, u.status) {
		return -1, false
	}
	if !protocol.LegalTransition(u.status, t.State) {
		return -1, false
	}
	if prev.EnvelopeID != end.EnvelopeID {
		if before, err := protocol.ParseTime(prev.TS); err != nil || sent.Before(before) {
			return -1, false
		}
	}
	return len(h) - 1, false
}

// revise applies a budget revision from the requester (upstream-notes
// §4.1): absolute, strictly newer wins; one that is not newer, arrives for
// a terminal task, or is retroactive (deadline past, ceiling below the
// spend) is refused — counted and logged, recorded nowhere.
func (w *Worker) revise(u *update) {
	ctx, cancel := context.WithTimeout(w.ctx, 10*time.Second)
	defer cancel()
	var out outcome
	var why error
	_, _, err := bus.CAS(ctx, w.kv, u.task, func(t *Task, exists bool) (*Task, error) {
		out, why = recorded, nil
		switch {
		case !exists:
			out, why = refused, errs.New(errs.TaskNotFound, "no such task")
		case u.env.From != t.Requester:
			out = notParty
		case protocol.Terminal(t.State):
			out, why = refused, errs.Newf(errs.TaskInvalidTransition, "task is already %s", t.State)
		default:
			if why = protocol.CheckRevision(t.Budget, *u.revision, w.now(), t.Spent); why != nil {
				out = refused
			}
		}
		if out != recorded {
			return nil, bus.ErrNoChange
		}
		b := *u.revision
		t.Budget = &b
		t.UpdatedAt = protocol.FormatTime(w.now())
		return t, nil
	})
	switch {
	case err != nil:
		w.n.failed.Add(1)
		w.svc.Log.Error("budget revision not stored", "task", u.task, "err", err)
	case out == recorded:
		w.n.revApplied.Add(1)
	case out == notParty:
		w.n.notParty.Add(1)
		w.svc.Log.Info("budget revision from a non-requester ignored", "task", u.task, "from", u.env.From)
	default:
		w.n.revRefused.Add(1)
		w.svc.Log.Info("budget revision refused", "task", u.task, "revision", u.revision.Revision, "err", why)
	}
}
