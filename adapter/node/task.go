package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// TaskUpdate is one verified update of a task.
type TaskUpdate struct {
	Env     *protocol.Envelope // nil when read from the task record
	Status  string
	Output  any
	Message string
	Error   *errs.Error
	Reason  string
	Note    string
}

// Chunk is one stream frame.
type Chunk struct {
	Index       int
	Data        any
	ContentType string
	Final       bool
	// Signed is false for an intermediate chunk sent without a signature
	// (allowed by the protocol); its sender is then unverified until the
	// signed final chunk vouches for the count.
	Signed bool
	Env    *protocol.Envelope // nil when unsigned
}

// Stream timeouts (upstream-notes §3.6).
const (
	ChunkTimeout  = 30 * time.Second
	StreamTimeout = 5 * time.Minute
)

// TaskHandle follows a task this agent requested: its updates on
// mesh.task.<id>.update, its stream on mesh.task.<id>.stream, its record
// (mesh.task.get.<id>) and its cancel. It subscribes when it is made; frames
// published before that are only there if the request used Follow (for
// updates, Wait falls back on the task record). Close it when done; it
// also unsubscribes by itself a few seconds after the task ends.
type TaskHandle struct {
	ID        string
	Performer string
	RequestID string

	a    *Agent
	late bool // subscribed after the request was answered

	pump *framePump

	mu       sync.Mutex
	seen     map[string]bool
	updates  []*TaskUpdate
	chunks   []*nats.Msg
	notify   chan struct{}
	terminal *TaskUpdate
	closed   bool
}

// Task returns a handle on a task this agent requested. The performer is
// known for tasks requested through Request in this process; for others it
// is read first from the task record (mesh.task.get.<id>, answered by the
// tasks worker), since until the performer is known there is no telling a
// real update from one signed by anybody. A task with no readable record
// is refused (TASK_NOT_FOUND, or the error of the read).
func (a *Agent) Task(taskID string) (*TaskHandle, error) {
	a.mu.Lock()
	performer := a.known[taskID]
	a.mu.Unlock()
	return a.TaskFrom(performer, taskID)
}

// TaskFrom returns a handle on a task performed by performer: only frames
// signed by that key are accepted. An empty performer is read from the task
// record, as Task does.
func (a *Agent) TaskFrom(performer, taskID string) (*TaskHandle, error) {
	if !protocol.ValidToken(taskID) {
		return nil, errs.Newf(errs.InvalidEnvelope, "task id %q is not a subject token", taskID)
	}
	if performer == "" {
		var err error
		if performer, err = a.performerOf(taskID); err != nil {
			return nil, err
		}
	}
	return a.newTaskHandle(taskID, performer, "", nil)
}

// performerOf reads a task's performer (the record's responder).
func (a *Agent) performerOf(taskID string) (string, error) {
	ctx, cancel := context.WithTimeout(a.ctx, a.n.cfg.RequestTimeout)
	defer cancel()
	rec, err := a.taskRecord(ctx, taskID)
	if err != nil {
		return "", fmt.Errorf("node: the performer of task %s is not known and its record could not be read: %w", taskID, err)
	}
	performer, _ := rec["responder"].(string)
	if !keys.IsUserPublicKey(performer) {
		return "", errs.Newf(errs.TaskNotFound, "the record of task %s names no performer", taskID)
	}
	return performer, nil
}

// newTaskHandle subscribes to the task's subjects: through the follower's
// pump when the request was followed, else on its own. performer is never
// empty: every frame is checked against it.
func (a *Agent) newTaskHandle(taskID, performer, reqID string, f *follower) (*TaskHandle, error) {
	if !protocol.ValidToken(taskID) {
		return nil, errs.Newf(errs.InvalidEnvelope, "task id %q is not a subject token", taskID)
	}
	if performer == "" {
		return nil, errs.Newf(errs.InvalidRequest, "task %s: the performer is not known", taskID)
	}
	h := &TaskHandle{ID: taskID, Performer: performer, RequestID: reqID, a: a, late: f == nil,
		seen: map[string]bool{}, notify: make(chan struct{})}
	if f != nil {
		if err := f.attach(h); err != nil {
			h.Close()
			return nil, err
		}
	} else {
		h.pump = newPump(a.n.nc, h.ingest)
		if err := h.pump.subscribe(protocol.TaskUpdateSubject(taskID), protocol.TaskStreamSubject(taskID)); err != nil {
			h.Close()
			return nil, err
		}
	}
	a.mu.Lock()
	a.handles[h] = struct{}{}
	a.mu.Unlock()
	a.rememberPerformer(taskID, performer)
	return h, nil
}

// maxKnownTasks bounds the performers remembered for Task(id): past it the
// oldest are forgotten, and Task reads them from the task record again.
const maxKnownTasks = 1024

func (a *Agent) rememberPerformer(taskID, performer string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.known[taskID]; !ok {
		a.knownOrder = append(a.knownOrder, taskID)
	}
	a.known[taskID] = performer
	for len(a.knownOrder) > maxKnownTasks {
		delete(a.known, a.knownOrder[0])
		a.knownOrder = a.knownOrder[1:]
	}
}

// owns reports whether subject is one of the task's.
func (h *TaskHandle) owns(subject string) bool {
	return subject == protocol.TaskUpdateSubject(h.ID) || subject == protocol.TaskStreamSubject(h.ID)
}

// frameKey is (from, id) read without verification, for dropping the
// second copy of a frame (Follow buffer and subscription overlap).
func frameKey(data []byte) string {
	var lite struct {
		From string `json:"from"`
		ID   string `json:"id"`
	}
	_ = json.Unmarshal(data, &lite)
	return lite.From + "\x00" + lite.ID
}

func (h *TaskHandle) ingest(m *nats.Msg) {
	k := frameKey(m.Data)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.seen[k] {
		return
	}
	h.seen[k] = true
	if strings.HasSuffix(m.Subject, ".stream") {
		h.chunks = append(h.chunks, m)
		h.wake()
		return
	}
	u := h.readUpdate(m.Data)
	if u == nil {
		return
	}
	h.updates = append(h.updates, u)
	if protocol.Terminal(u.Status) && h.terminal == nil {
		h.terminal = u
		// Chunks already published are delivered first or nearly so;
		// leave the subscriptions a moment, then let go of them.
		time.AfterFunc(5*time.Second, h.Close)
	}
	h.wake()
}

func (h *TaskHandle) wake() {
	close(h.notify)
	h.notify = make(chan struct{})
}

// readUpdate verifies one update: signed by the performer, for this task.
func (h *TaskHandle) readUpdate(data []byte) *TaskUpdate {
	env, err := protocol.DefaultDecoder.Decode(data)
	if err != nil || env.Type != protocol.TypeRespond {
		return nil
	}
	if env.From != h.Performer && !(env.From == h.a.id && protocol.ResponseStatus(env) == protocol.StateCanceled) {
		// The performer's updates, and this requester's own cancel.
		return nil
	}
	if env.TaskID != "" && env.TaskID != h.ID {
		return nil
	}
	v, err := env.PayloadValue()
	if err != nil {
		return nil
	}
	p, _ := v.(map[string]any)
	u := &TaskUpdate{Env: env, Output: p["output"], Error: bus.ErrorOf(env)}
	u.Status, _ = p["status"].(string)
	u.Message, _ = p["message"].(string)
	u.Reason, _ = p["reason"].(string)
	u.Note, _ = p["note"].(string)
	if u.Status == "" {
		return nil
	}
	return u
}

// NextUpdate returns the next update, in arrival order.
func (h *TaskHandle) NextUpdate(ctx context.Context) (*TaskUpdate, error) {
	for {
		h.mu.Lock()
		if len(h.updates) > 0 {
			u := h.updates[0]
			h.updates = h.updates[1:]
			h.mu.Unlock()
			return u, nil
		}
		ch, closed := h.notify, h.closed
		h.mu.Unlock()
		if closed {
			return nil, errHandleClosed
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctxErr(ctx, "no task update")
		}
	}
}

// Wait returns the task's terminal update (completed, failed, canceled,
// rejected, exhausted); a failed one also returns its error. A handle made
// after the answer first asks the task record, in case the task ended
// before the subscription.
func (h *TaskHandle) Wait(ctx context.Context) (*TaskUpdate, error) {
	h.mu.Lock()
	t, late := h.terminal, h.late
	h.mu.Unlock()
	if t == nil && late {
		gctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		rec, err := h.Get(gctx)
		cancel()
		if err == nil {
			t = h.terminalOf(rec)
		}
	}
	for t == nil {
		h.mu.Lock()
		t = h.terminal
		ch, closed := h.notify, h.closed
		h.mu.Unlock()
		if t != nil {
			break
		}
		if closed {
			return nil, errHandleClosed
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctxErr(ctx, "the task did not end")
		}
	}
	if t.Error != nil {
		return t, t.Error
	}
	return t, nil
}

// terminalOf is the terminal update a task record describes, or nil: the
// state, output, message, error, reason and note of the terminal update,
// as the tasks worker recorded them. A record naming another performer is
// not this handle's task.
func (h *TaskHandle) terminalOf(rec map[string]any) *TaskUpdate {
	st, _ := rec["state"].(string)
	if !protocol.Terminal(st) || rec["responder"] != h.Performer {
		return nil
	}
	t := &TaskUpdate{Status: st, Output: rec["output"]}
	t.Message, _ = rec["message"].(string)
	t.Reason, _ = rec["reason"].(string)
	t.Note, _ = rec["note"].(string)
	if rec["error"] != nil {
		t.Error = errs.FromWire(rec["error"])
	}
	return t
}

// Get reads the task record from the task store (mesh.task.get.<id>).
func (h *TaskHandle) Get(ctx context.Context) (map[string]any, error) {
	return h.a.taskRecord(ctx, h.ID)
}

// taskRecord reads a task record. With Config.ServicesKey set, an answer
// signed by any other key is refused, as for the registry: anyone on the
// mesh may subscribe to mesh.task.>, and a record decides whose updates a
// handle believes.
func (a *Agent) taskRecord(ctx context.Context, taskID string) (map[string]any, error) {
	rep, err := bus.Call(ctx, a.n.nc, a.key, protocol.TaskGetSubject(taskID), protocol.TypeRequest, "", map[string]any{})
	if err != nil {
		return nil, err
	}
	if pin := a.n.cfg.ServicesKey; pin != "" && rep.From != pin {
		return nil, errs.Newf(errs.IdentityMismatch, "node: the task record is signed by %s, not the services key", rep.From)
	}
	var out struct {
		Task map[string]any `json:"task"`
	}
	if err := rep.DecodePayload(&out); err != nil {
		return nil, err
	}
	if out.Task == nil {
		return nil, errs.New(errs.TaskNotFound, "the task store has no record")
	}
	return out.Task, nil
}

// Cancel asks the performer to cancel the task (a task.cancel request with
// {task_id, reason, note?}); reason is one of protocol.CancelReasons.
func (h *TaskHandle) Cancel(ctx context.Context, reason, note string) (*Result, error) {
	in := protocol.CancelInput{TaskID: h.ID, Reason: reason, Note: note}
	if err := in.Validate(); err != nil {
		return nil, err
	}
	input := map[string]any{"task_id": in.TaskID, "reason": in.Reason}
	if note != "" {
		input["note"] = note
	}
	res, err := h.a.Request(ctx, h.Performer, protocol.OfferingTaskCancel, input, RequestOptions{})
	if err != nil || res.Queued {
		return res, err
	}
	// The requester is a party to the task and publishes the canceled
	// update itself: a protocol 0.3 performer leaves it to the requester
	// (upstream-notes §15), and the tasks worker takes a second canceled
	// from the other party as the same outcome.
	if perr := h.publishCanceled(reason, note); perr != nil {
		h.a.n.log.Warn("task: the canceled update was not published", "task", h.ID, "err", perr)
	}
	return res, nil
}

// publishCanceled publishes this requester's canceled update on the task's
// update subject, addressed to the performer.
func (h *TaskHandle) publishCanceled(reason, note string) error {
	env, err := protocol.New(protocol.TypeRespond, h.a.id, protocol.CanceledUpdatePayload(reason, note))
	if err != nil {
		return err
	}
	env.To, env.TaskID, env.InReplyTo = h.Performer, h.ID, h.RequestID
	return h.a.sendRespond(protocol.TaskUpdateSubject(h.ID), env, nil)
}

// Close unsubscribes. NextUpdate and Wait then return what had arrived,
// and STREAM_CLOSED once nothing is left.
func (h *TaskHandle) Close() {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	h.closed = true
	if h.pump != nil {
		h.pump.close()
	}
	h.wake()
	h.mu.Unlock()
	h.a.mu.Lock()
	delete(h.a.handles, h)
	h.a.mu.Unlock()
}

// errHandleClosed is what a closed handle answers once it has nothing left.
var errHandleClosed = errs.New(errs.StreamClosed, "the task handle is closed")

// Stream reads the task's stream.
func (h *TaskHandle) Stream() *StreamReader {
	return &StreamReader{h: h, start: time.Now()}
}

// StreamReader reads one task's chunks and verifies the count.
type StreamReader struct {
	h     *TaskHandle
	start time.Time
	count int
	done  bool
}

// Next returns the next chunk, or io.EOF after the signed final chunk has
// confirmed the count (a final chunk with null data is not returned).
// Frames that do not decode, come from another key, name another task or
// are not chunks are dropped without being counted. An unsigned final chunk
// is IDENTITY_MISMATCH; a chunk_count that is not the number of frames
// received, the final included, is INVALID_ENVELOPE. A task that fails or
// is canceled ends the stream with its error.
func (r *StreamReader) Next(ctx context.Context) (*Chunk, error) {
	h := r.h
	grace := time.Time{}
	for {
		if r.done {
			return nil, io.EOF
		}
		h.mu.Lock()
		if len(h.chunks) > 0 {
			m := h.chunks[0]
			h.chunks = h.chunks[1:]
			h.mu.Unlock()
			c, err := r.read(m)
			if c == nil && err == nil {
				continue
			}
			return c, err
		}
		t, ch, closed := h.terminal, h.notify, h.closed
		h.mu.Unlock()
		if t == nil && closed {
			return nil, errHandleClosed
		}
		if t != nil && t.Status != protocol.StateCompleted {
			if t.Error != nil {
				return nil, t.Error
			}
			return nil, errs.Newf(errs.StreamClosed, "the task ended %s before its stream did", t.Status)
		}
		wait := ChunkTimeout
		if t != nil {
			// Completed: the final chunk is published before the completed
			// update, so it is at most a moment behind.
			if grace.IsZero() {
				grace = time.Now().Add(2 * time.Second)
			}
			wait = time.Until(grace)
			if wait <= 0 {
				return nil, errs.New(errs.StreamClosed, "the task completed without closing its stream")
			}
		}
		if left := StreamTimeout - time.Since(r.start); left < wait {
			wait = left
		}
		timer := time.NewTimer(wait)
		select {
		case <-ch:
			timer.Stop()
		case <-timer.C:
			if t == nil {
				return nil, errs.New(errs.TransportTimeout, "no stream chunk in time")
			}
		case <-ctx.Done():
			timer.Stop()
			return nil, ctxErr(ctx, "no stream chunk")
		}
	}
}

// read classifies one stream frame: (nil, nil) drops it uncounted.
func (r *StreamReader) read(m *nats.Msg) (*Chunk, error) {
	h := r.h
	var lite struct {
		Type    string          `json:"type"`
		From    string          `json:"from"`
		TaskID  *string         `json:"task_id"`
		Sig     *string         `json:"sig"`
		Payload json.RawMessage `json:"payload"`
	}
	if json.Unmarshal(m.Data, &lite) != nil {
		return nil, nil
	}
	var env *protocol.Envelope
	var payload map[string]any
	if lite.Sig != nil {
		e, err := protocol.DefaultDecoder.Decode(m.Data)
		if err != nil {
			return nil, nil
		}
		env = e
		v, err := e.PayloadValue()
		if err != nil {
			return nil, nil
		}
		payload, _ = v.(map[string]any)
	} else {
		v, err := protocol.ParseJSON(lite.Payload)
		if err != nil {
			return nil, nil
		}
		payload, _ = v.(map[string]any)
	}
	from, taskID := lite.From, ""
	if lite.TaskID != nil {
		taskID = *lite.TaskID
	}
	if env != nil {
		from, taskID = env.From, env.TaskID
	}
	if from != h.Performer {
		return nil, nil
	}
	if taskID != "" && taskID != h.ID {
		return nil, nil
	}
	idx, okIdx := payload["chunk_index"].(float64)
	final, okFinal := payload["final"].(bool)
	if !okIdx || !okFinal {
		return nil, nil
	}
	r.count++
	c := &Chunk{Index: int(idx), Data: payload["data"], Final: final, Signed: env != nil, Env: env}
	c.ContentType, _ = payload["content_type"].(string)
	if !final {
		return c, nil
	}
	r.done = true
	if env == nil {
		return nil, errs.New(errs.IdentityMismatch, "the final stream chunk is not signed")
	}
	n, ok := payload["chunk_count"].(float64)
	if !ok || int(n) != r.count {
		return nil, errs.Newf(errs.InvalidEnvelope, "the final stream chunk counts %v frames; %d arrived", payload["chunk_count"], r.count).
			WithDetails(map[string]any{"chunk_count": payload["chunk_count"], "received": r.count})
	}
	if c.Data == nil {
		return nil, io.EOF
	}
	return c, nil
}

func ctxErr(ctx context.Context, what string) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return errs.New(errs.TransportTimeout, what+" before the deadline")
	}
	return ctx.Err()
}
