package tasks_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/tasks"
)

// harness is a mesh with three copies of the task manager, each on its own
// connection, a client connection, and the three parties of a task.
type harness struct {
	t                           *testing.T
	m                           *bustest.Bus
	workers                     []*tasks.Worker
	nc                          *nats.Conn
	requester, responder, other *keys.Agent
	published                   uint64 // updates sent, for settle
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	return newHarnessWith(t, tasks.Config{})
}

func newHarnessWith(t *testing.T, cfg tasks.Config) *harness {
	t.Helper()
	m := bustest.Start(t)
	h := &harness{t: t, m: m, nc: bustest.Client(t, m),
		requester: bustest.Agent(t), responder: bustest.Agent(t), other: bustest.Agent(t)}
	for i := range 3 {
		env := bustest.Env(t, m, fmt.Sprintf("tasks-%d", i), nil)
		if testing.Verbose() {
			env.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
		}
		w, err := tasks.Start(t.Context(), env, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Stop() })
		h.workers = append(h.workers, w)
	}
	return h
}

// envelope builds a signed respond from signer to `to` with payload.
func envelope(t testing.TB, signer keys.Signer, to string, payload any, edit func(*protocol.Envelope)) []byte {
	t.Helper()
	e, err := protocol.New(protocol.TypeRespond, signer.Public(), payload)
	if err != nil {
		t.Fatal(err)
	}
	e.To = to
	if edit != nil {
		edit(e)
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

// send publishes a signed update on the task's update subject and returns
// the envelope id.
func (h *harness) send(task string, from *keys.Agent, to string, payload any) string {
	h.t.Helper()
	b := envelope(h.t, from, to, payload, nil)
	h.raw(task, b)
	e, err := protocol.Decode(b)
	if err != nil {
		h.t.Fatal(err)
	}
	return e.ID
}

// update is send from the responder to the requester.
func (h *harness) update(task string, payload any) string {
	h.t.Helper()
	return h.send(task, h.responder, h.requester.Public(), payload)
}

func (h *harness) raw(task string, b []byte) {
	h.t.Helper()
	h.published++
	if err := h.nc.Publish(protocol.TaskUpdateSubject(task), b); err != nil {
		h.t.Fatal(err)
	}
}

// stats sums the three copies' counters.
func (h *harness) stats() tasks.Stats {
	var s tasks.Stats
	for _, w := range h.workers {
		x := w.Stats()
		s.Received += x.Received
		s.Recorded += x.Recorded
		s.Duplicates += x.Duplicates
		s.Refused += x.Refused
		s.NotParty += x.NotParty
		s.Illegal += x.Illegal
		s.RevisionsApplied += x.RevisionsApplied
		s.RevisionsRefused += x.RevisionsRefused
		s.Failed += x.Failed
	}
	return s
}

// settle waits until every update published so far reached an outcome.
func (h *harness) settle() tasks.Stats {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s := h.stats()
		if s.Done() == h.published {
			if s.Failed != 0 {
				h.t.Fatalf("store failures: %+v", s)
			}
			return s
		}
		if s.Done() > h.published || time.Now().After(deadline) {
			h.t.Fatalf("published %d updates, outcomes %+v", h.published, s)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (h *harness) get(caller keys.Signer, task string) (*tasks.Task, error) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(h.t.Context(), 3*time.Second)
	defer cancel()
	rep, err := bus.Call(ctx, h.nc, caller, protocol.TaskGetSubject(task), protocol.TypeRequest, "mesh.service.task-manager", map[string]any{})
	if err != nil {
		return nil, err
	}
	if rep.From != h.m.ServicesKey().Public() {
		h.t.Fatalf("answer signed by %s, not the services key", rep.From)
	}
	var out struct {
		Task *tasks.Task `json:"task"`
	}
	if err := rep.DecodePayload(&out); err != nil {
		h.t.Fatal(err)
	}
	if out.Task == nil {
		h.t.Fatalf("answer has no task: %s", rep.Payload)
	}
	return out.Task, nil
}

func (h *harness) mustGet(task string) *tasks.Task {
	h.t.Helper()
	tk, err := h.get(h.requester, task)
	if err != nil {
		h.t.Fatal(err)
	}
	return tk
}

// waitFor polls the record until cond holds.
func (h *harness) waitFor(task string, cond func(*tasks.Task) bool) *tasks.Task {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		tk, err := h.get(h.requester, task)
		if err == nil && cond(tk) {
			return tk
		}
		if err != nil && !(errs.CodeOf(err) == errs.TaskNotFound) {
			h.t.Fatal(err)
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("task %s never reached the expected state; last %+v (%v)", task, tk, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func states(tk *tasks.Task) []string {
	var s []string
	for _, e := range tk.History {
		s = append(s, e.State)
	}
	return s
}

// wantHistory checks the record's states (joined by commas), its final
// state, and the envelope each entry came from.
func wantHistory(t *testing.T, tk *tasks.Task, want string, ids ...string) {
	t.Helper()
	if got := strings.Join(states(tk), ","); got != want || tk.State != tk.History[len(tk.History)-1].State {
		t.Fatalf("history %s state %s, want %s", got, tk.State, want)
	}
	for i, e := range tk.History {
		if e.EnvelopeID != ids[i] || e.At == "" {
			t.Fatalf("history[%d] = %+v, want envelope %s", i, e, ids[i])
		}
	}
}

func wantCode(t *testing.T, err error, code errs.Code) {
	t.Helper()
	if errs.CodeOf(err) != code {
		t.Fatalf("want %s, got %v", code, err)
	}
}

// events collects task.invalid_transition events, checking each is a
// signed emit from the services key.
type events struct {
	t   *testing.T
	sub *nats.Subscription
	svc string
}

func (h *harness) events() *events {
	sub, err := h.nc.SubscribeSync(protocol.EventSubject("task.invalid_transition"))
	if err != nil {
		h.t.Fatal(err)
	}
	if err := h.nc.Flush(); err != nil {
		h.t.Fatal(err)
	}
	return &events{t: h.t, sub: sub, svc: h.m.ServicesKey().Public()}
}

// drain returns the events that arrive within d.
func (ev *events) drain(d time.Duration) []map[string]any {
	ev.t.Helper()
	var out []map[string]any
	deadline := time.Now().Add(d)
	for {
		msg, err := ev.sub.NextMsg(time.Until(deadline))
		if err != nil {
			return out
		}
		e, err := protocol.Decode(msg.Data)
		if err != nil || e.From != ev.svc || e.Type != protocol.TypeEmit {
			ev.t.Fatalf("event not a services-signed emit: %v %s", err, msg.Data)
		}
		var p struct {
			Domain    string         `json:"domain"`
			EventType string         `json:"event_type"`
			Data      map[string]any `json:"data"`
		}
		if err := e.DecodePayload(&p); err != nil || p.Domain != "task" || p.EventType != "invalid_transition" {
			ev.t.Fatalf("event payload %s", e.Payload)
		}
		out = append(out, p.Data)
	}
}

// The lifecycle: created by a first "working" (recorded as submitted then
// working), progress, completed with its output; readable by both parties
// only; an update after completion is not recorded and raises one
// invalid_transition event.
func TestLifecycle(t *testing.T) {
	h := newHarness(t)
	id := protocol.NewID()
	e1 := h.update(id, map[string]any{"status": "working", "task_id": id, "offering": "summarise"})
	h.waitFor(id, func(tk *tasks.Task) bool { return true })
	e2 := h.update(id, map[string]any{"status": "working", "message": "half way", "output": map[string]any{"partial": "a"}})
	e3 := h.update(id, map[string]any{"status": "working", "message": "nearly"})
	h.waitFor(id, func(tk *tasks.Task) bool { return len(tk.History) == 4 })
	e4 := h.update(id, map[string]any{"status": "completed", "output": map[string]any{"text": "done", "n": 9007199254740991}, "message": "ok"})
	tk := h.waitFor(id, func(tk *tasks.Task) bool { return tk.State == "completed" })

	if tk.ID != id || tk.Requester != h.requester.Public() || tk.Responder != h.responder.Public() || tk.Offering != "summarise" {
		t.Fatalf("parties: %+v", tk)
	}
	if got := strings.Join(states(tk), ","); got != "submitted,working,working,working,completed" {
		t.Fatalf("history %s", got)
	}
	// The two progress updates went out back to back and may have been
	// recorded in either order.
	if tk.History[2].EnvelopeID == e3 {
		e2, e3 = e3, e2
	}
	wantHistory(t, tk, "submitted,working,working,working,completed", e1, e1, e2, e3, e4)
	if string(tk.Output) != `{"n":9007199254740991,"text":"done"}` || tk.Message != "ok" {
		t.Fatalf("output %s message %q", tk.Output, tk.Message)
	}
	if tk.CreatedAt == "" || tk.UpdatedAt < tk.CreatedAt || tk.Reason != "" || tk.Error != nil {
		t.Fatalf("record %+v", tk)
	}

	// Both parties read it; nobody else does; unknown ids are not found.
	if byResponder, err := h.get(h.responder, id); err != nil || byResponder.State != "completed" {
		t.Fatalf("responder get: %v %+v", err, byResponder)
	}
	_, err := h.get(h.other, id)
	wantCode(t, err, errs.Unauthorized)
	_, err = h.get(h.requester, protocol.NewID())
	wantCode(t, err, errs.TaskNotFound)

	// completed -> working: refused, one event, the record untouched.
	ev := h.events()
	h.settle()
	h.update(id, map[string]any{"status": "working"})
	s := h.settle()
	got := ev.drain(300 * time.Millisecond)
	if len(got) != 1 || s.Illegal != 1 {
		t.Fatalf("want exactly one invalid_transition event, got %v (stats %+v)", got, s)
	}
	want := map[string]any{"task_id": id, "from": "completed", "to": "working", "by": h.responder.Public()}
	for k, v := range want {
		if got[0][k] != v {
			t.Fatalf("event data %v, want %v", got[0], want)
		}
	}
	after := h.mustGet(id)
	if len(after.History) != 5 || after.State != "completed" || after.UpdatedAt != tk.UpdatedAt {
		t.Fatalf("illegal update was recorded: %+v", after)
	}
}

// A performer that publishes working and completed back to back: the two
// may reach different copies in either order; the record still ends
// completed, with nothing refused.
func TestBackToBackUpdates(t *testing.T) {
	h := newHarness(t)
	for range 5 {
		id := protocol.NewID()
		h.update(id, map[string]any{"status": "submitted"})
		h.update(id, map[string]any{"status": "working"})
		h.update(id, map[string]any{"status": "completed", "output": "x"})
		tk := h.waitFor(id, func(tk *tasks.Task) bool { return tk.State == "completed" })
		if got := strings.Join(states(tk), ","); got != "submitted,working,completed" {
			t.Fatalf("history %s", got)
		}
	}
	if s := h.settle(); s.Recorded != 15 || s.Illegal != 0 {
		t.Fatalf("stats %+v", s)
	}
}

// Cancel: a canceled update needs a reason from the closed enum (and a
// string note); a valid one is recorded with its reason and note.
func TestCancel(t *testing.T) {
	h := newHarness(t)
	id := protocol.NewID()
	h.update(id, map[string]any{"status": "working"})
	h.settle()
	for _, bad := range []map[string]any{
		{"status": "canceled", "reason": "bored"},
		{"status": "canceled"},
		{"status": "canceled", "reason": nil},
		{"status": "canceled", "reason": "User_Requested"},
		{"status": "canceled", "reason": "policy", "note": 42},
	} {
		h.update(id, bad)
	}
	if s := h.settle(); s.Refused != 5 {
		t.Fatalf("stats %+v", s)
	}
	if tk := h.mustGet(id); tk.State != "working" || len(tk.History) != 2 {
		t.Fatalf("invalid cancel recorded: %+v", tk)
	}
	h.update(id, protocol.CanceledUpdatePayload(protocol.CancelUserRequested, "operator clicked stop"))
	tk := h.waitFor(id, func(tk *tasks.Task) bool { return tk.State == "canceled" })
	if tk.Reason != "user_requested" || tk.Note != "operator clicked stop" || states(tk)[2] != "canceled" {
		t.Fatalf("cancel record %+v", tk)
	}
	// The fixture's no-note shape on another task; the note stays absent.
	id2 := protocol.NewID()
	h.update(id2, map[string]any{"status": "submitted"})
	h.waitFor(id2, func(*tasks.Task) bool { return true })
	h.update(id2, map[string]any{"status": "canceled", "reason": "deadline_exceeded"})
	tk = h.waitFor(id2, func(tk *tasks.Task) bool { return tk.State == "canceled" })
	if tk.Reason != "deadline_exceeded" || tk.Note != "" {
		t.Fatalf("cancel record %+v", tk)
	}
}

// History keeps the newest 50 entries.
func TestHistoryCap(t *testing.T) {
	h := newHarness(t)
	id := protocol.NewID()
	h.update(id, map[string]any{"status": "working"})
	h.waitFor(id, func(*tasks.Task) bool { return true })
	sent := map[string]bool{}
	for i := range 60 {
		sent[h.update(id, map[string]any{"status": "working", "message": fmt.Sprint("step ", i)})] = true
	}
	if s := h.settle(); s.Recorded != 61 {
		t.Fatalf("stats %+v", s)
	}
	tk := h.mustGet(id)
	if len(tk.History) != 50 {
		t.Fatalf("history has %d entries", len(tk.History))
	}
	seen := map[string]bool{}
	for _, e := range tk.History {
		if e.State != "working" || !sent[e.EnvelopeID] || seen[e.EnvelopeID] {
			t.Fatalf("history entry %+v", e)
		}
		seen[e.EnvelopeID] = true
	}
}

// Twenty goroutines update one task through three copies at once: the
// compare-and-set serialises them and no update is lost.
func TestConcurrentUpdates(t *testing.T) {
	h := newHarness(t)
	id := protocol.NewID()
	h.update(id, map[string]any{"status": "working"})
	h.waitFor(id, func(*tasks.Task) bool { return true })
	const goroutines, each = 20, 2
	msgs := make(chan []byte, goroutines*each)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				b := envelope(t, h.responder, h.requester.Public(), map[string]any{"status": "working", "message": fmt.Sprint(g, "/", i)}, nil)
				if err := h.nc.Publish(protocol.TaskUpdateSubject(id), b); err != nil {
					t.Error(err)
				}
				msgs <- b
			}
		})
	}
	wg.Wait()
	close(msgs)
	h.published += goroutines * each
	if s := h.settle(); s.Recorded != 1+goroutines*each {
		t.Fatalf("stats %+v", s)
	}
	tk := h.mustGet(id)
	if len(tk.History) != 2+goroutines*each {
		t.Fatalf("history has %d entries, want %d", len(tk.History), 2+goroutines*each)
	}
	ids := map[string]bool{}
	for _, e := range tk.History[2:] {
		ids[e.EnvelopeID] = true
	}
	for b := range msgs {
		e, _ := protocol.Decode(b)
		if !ids[e.ID] {
			t.Fatalf("update %s lost", e.ID)
		}
	}
}

// Budget revisions come from the requester alone; a newer one is applied,
// one that is not newer, retroactive or for a finished task is refused and
// recorded nowhere.
func TestBudgetRevision(t *testing.T) {
	h := newHarness(t)
	id := protocol.NewID()
	h.send(id, h.responder, h.requester.Public(), map[string]any{"status": "working"})
	h.waitFor(id, func(*tasks.Task) bool { return true })
	ceiling := func(rev, amount int) map[string]any {
		return map[string]any{"budget": map[string]any{"revision": rev,
			"cost_ceiling": map[string]any{"amount_micro": amount, "currency": "USD"}}}
	}
	h.send(id, h.requester, h.responder.Public(), ceiling(2, 5_000_000))
	if s := h.settle(); s.RevisionsApplied != 1 {
		t.Fatalf("stats %+v", s)
	}
	before := h.mustGet(id)
	if before.Budget == nil || before.Budget.Revision != 2 || before.Budget.CostCeiling.AmountMicro != 5_000_000 {
		t.Fatalf("budget %+v", before.Budget)
	}
	h.send(id, h.requester, h.responder.Public(), ceiling(1, 9_000_000)) // older
	h.send(id, h.requester, h.responder.Public(), ceiling(2, 7_000_000)) // tie: first writer wins
	h.send(id, h.requester, h.responder.Public(), map[string]any{"budget": map[string]any{"revision": 3,
		"deadline": protocol.FormatTime(time.Now().Add(-time.Hour))}}) // retroactive
	h.send(id, h.other, h.responder.Public(), ceiling(4, 1)) // not the requester
	h.send(id, h.responder, h.requester.Public(), ceiling(5, 1))
	s := h.settle()
	if s.RevisionsApplied != 1 || s.RevisionsRefused != 3 || s.NotParty != 2 {
		t.Fatalf("stats %+v", s)
	}
	if tk := h.mustGet(id); tk.Budget.Revision != 2 || tk.Budget.CostCeiling.AmountMicro != 5_000_000 || tk.UpdatedAt != before.UpdatedAt {
		t.Fatalf("refused revision left a trace: %+v", tk)
	}

	// A pause reports the spend; a ceiling below it is retroactive.
	h.update(id, map[string]any{"status": "input_required", "error": map[string]any{"code": "BUDGET_EXHAUSTED",
		"message": "ceiling", "retryable": false, "details": map[string]any{
			"spent":              map[string]any{"amount_micro": 5_000_000, "currency": "USD"},
			"estimate_to_finish": map[string]any{"amount_micro": 2_000_000, "currency": "USD"}}}})
	h.waitFor(id, func(tk *tasks.Task) bool { return tk.State == "input_required" })
	h.send(id, h.requester, h.responder.Public(), ceiling(3, 4_000_000))
	h.send(id, h.requester, h.responder.Public(), ceiling(4, 8_000_000))
	s = h.settle()
	if s.RevisionsApplied != 2 || s.RevisionsRefused != 4 {
		t.Fatalf("stats %+v", s)
	}
	tk := h.mustGet(id)
	if tk.Budget.Revision != 4 || tk.Spent == nil || tk.Spent.AmountMicro != 5_000_000 {
		t.Fatalf("record %+v", tk)
	}
	// Finished tasks take no revision.
	h.update(id, map[string]any{"status": "working"})
	h.waitFor(id, func(tk *tasks.Task) bool { return tk.State == "working" })
	h.update(id, map[string]any{"status": "completed"})
	h.waitFor(id, func(tk *tasks.Task) bool { return tk.State == "completed" })
	h.send(id, h.requester, h.responder.Public(), ceiling(9, 9_000_000))
	if s := h.settle(); s.RevisionsRefused != 5 {
		t.Fatalf("stats %+v", s)
	}
	if tk := h.mustGet(id); tk.Budget.Revision != 4 {
		t.Fatalf("revision applied to a finished task: %+v", tk.Budget)
	}
}

// Updates that fail the receiver's checks create nothing.
func TestRefusedUpdates(t *testing.T) {
	h := newHarness(t)
	id := protocol.NewID()
	signed := envelope(t, h.responder, h.requester.Public(), map[string]any{"status": "working"}, nil)
	var m map[string]any
	if err := json.Unmarshal(signed, &m); err != nil {
		t.Fatal(err)
	}
	delete(m, "sig")
	unsigned, _ := json.Marshal(m)
	h.raw(id, unsigned)
	m["sig"] = strings.Repeat("A", 86)
	badSig, _ := json.Marshal(m)
	h.raw(id, badSig)
	h.raw(id, envelope(t, h.responder, h.requester.Public(), map[string]any{"status": "working"}, func(e *protocol.Envelope) {
		e.Type = protocol.TypeRequest
	}))
	h.raw(id, envelope(t, h.responder, h.requester.Public(), map[string]any{"status": "working"}, func(e *protocol.Envelope) {
		e.TS = protocol.FormatTime(time.Now().Add(-11 * time.Minute))
	}))
	h.raw(id, envelope(t, h.responder, h.requester.Public(), map[string]any{"status": "working"}, func(e *protocol.Envelope) {
		e.TaskID = protocol.NewID()
	}))
	h.raw(id, envelope(t, h.responder, "", map[string]any{"status": "working"}, nil))                      // no requester
	h.raw(id, envelope(t, h.responder, h.requester.Public(), map[string]any{}, nil))                       // neither status nor budget
	h.raw(id, envelope(t, h.responder, h.requester.Public(), []any{"working"}, nil))                       // not an object
	h.raw("get", envelope(t, h.responder, h.requester.Public(), map[string]any{"status": "working"}, nil)) // mesh.task.get.update
	s := h.settle()
	if s.Refused != 9 || s.Recorded != 0 {
		t.Fatalf("stats %+v", s)
	}
	_, err := h.get(h.requester, id)
	wantCode(t, err, errs.TaskNotFound)

	// The same envelope twice is recorded once, whichever copy gets it.
	ok := envelope(t, h.responder, h.requester.Public(), map[string]any{"status": "working"}, nil)
	h.raw(id, ok)
	h.waitFor(id, func(*tasks.Task) bool { return true })
	for range 3 {
		h.raw(id, ok)
	}
	if s := h.settle(); s.Recorded != 1 || s.Duplicates != 3 {
		t.Fatalf("stats %+v", s)
	}
	if tk := h.mustGet(id); len(tk.History) != 2 {
		t.Fatalf("duplicate recorded: %+v", tk.History)
	}
}

// A first update in a paused state (input_required, auth_required) creates
// nothing: it is held for the reorder window in case the creating update is
// late, then refused with one event (from null). So is a state nobody
// knows, at once.
func TestIllegalFirstUpdate(t *testing.T) {
	h := newHarness(t)
	ev := h.events()
	id := protocol.NewID()
	h.update(id, map[string]any{"status": "input_required"})
	h.update(protocol.NewID(), map[string]any{"status": "paused"})
	s := h.settle()
	if s.Illegal != 2 {
		t.Fatalf("stats %+v", s)
	}
	got := ev.drain(200 * time.Millisecond)
	if len(got) != 2 {
		t.Fatalf("events %v", got)
	}
	if got[0]["task_id"] != id {
		got[0], got[1] = got[1], got[0]
	}
	if got[0]["task_id"] != id || got[0]["from"] != nil || got[0]["to"] != "input_required" || got[1]["to"] != "paused" {
		t.Fatalf("events %v", got)
	}
	_, err := h.get(h.requester, id)
	wantCode(t, err, errs.TaskNotFound)
}

// The get endpoint takes request envelopes only.
func TestGetNeedsRequest(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	_, err := bus.Call(ctx, h.nc, h.requester, protocol.TaskGetSubject(protocol.NewID()), protocol.TypeEmit, "", map[string]any{})
	wantCode(t, err, errs.InvalidEnvelope)
}

// The bucket: mesh_tasks, records kept 7 days after their last write.
func TestBucket(t *testing.T) {
	h := newHarness(t)
	js, err := jetstream.New(h.nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(t.Context(), "mesh_tasks")
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.TTL() != 7*24*time.Hour || st.History() != 1 {
		t.Fatalf("bucket ttl %v history %d", st.TTL(), st.History())
	}
}

// Updates that are ahead of their record wait on goroutines of their own,
// and anyone may publish them, so each copy holds at most MaxHeld: with two
// per copy and three copies, of twelve early "auth_required" updates at least
// six are refused at once, long before the reorder window ends; the rest
// are refused when it does. Each raises the event once.
// (A first terminal update is not held: it creates the task; see
// TestTaskFlows.)
func TestHeldUpdatesBounded(t *testing.T) {
	const window, perCopy, sent = 1500 * time.Millisecond, 2, 12
	h := newHarnessWith(t, tasks.Config{ReorderWindow: window, MaxHeld: perCopy})
	ev := h.events()
	start := time.Now()
	for range sent {
		h.update(protocol.NewID(), map[string]any{"status": "auth_required"})
	}
	atOnce := uint64(sent - perCopy*len(h.workers))
	deadline := time.Now().Add(window / 2)
	for h.stats().Illegal < atOnce {
		if time.Now().After(deadline) {
			t.Fatalf("after %v only %+v refused; want at least %d at once", time.Since(start), h.stats(), atOnce)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if s := h.stats(); s.Illegal == sent {
		t.Fatalf("all %d refused at once: nothing was held (%+v)", sent, s)
	}
	time.Sleep(window - time.Since(start))
	if s := h.settle(); s.Illegal != sent {
		t.Fatalf("stats %+v, want %d illegal", s, sent)
	}
	if got := ev.drain(300 * time.Millisecond); len(got) != sent {
		t.Fatalf("%d invalid_transition events, want %d", len(got), sent)
	}
}
