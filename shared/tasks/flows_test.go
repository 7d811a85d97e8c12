package tasks_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/tasks"
)

// step is one update of a table case: who signs it, to whom, what it says,
// and an optional change to the envelope before it is signed.
type step struct {
	from    func(*harness) *keys.Agent
	to      func(*harness) string
	payload map[string]any
	edit    func(*protocol.Envelope)
}

func requester(h *harness) *keys.Agent { return h.requester }
func responder(h *harness) *keys.Agent { return h.responder }
func other(h *harness) *keys.Agent     { return h.other }
func toRequester(h *harness) string    { return h.requester.Public() }
func toResponder(h *harness) string    { return h.responder.Public() }
func toOther(h *harness) string        { return h.other.Public() }

// by is a step from the performer to the requester.
func by(payload map[string]any) step { return step{responder, toRequester, payload, nil} }

// byRequester is a step from the requester to the performer.
func byRequester(payload map[string]any) step { return step{requester, toResponder, payload, nil} }

// sentAt signs the envelope as sent at now+d.
func sentAt(d time.Duration) func(*protocol.Envelope) {
	return func(e *protocol.Envelope) { e.TS = protocol.FormatTime(time.Now().Add(d)) }
}

// play publishes s on the task's update subject and returns its envelope id.
func (h *harness) play(task string, s step) string {
	h.t.Helper()
	b := envelope(h.t, s.from(h), s.to(h), s.payload, s.edit)
	h.raw(task, b)
	e, err := protocol.Decode(b)
	if err != nil {
		h.t.Fatal(err)
	}
	return e.ID
}

// chunk publishes one stream frame of the performer's on the task's stream
// subject, which the task manager does not record.
func (h *harness) chunk(task string, payload map[string]any) {
	h.t.Helper()
	b := envelope(h.t, h.responder, h.requester.Public(), payload, func(e *protocol.Envelope) { e.TaskID = task })
	if err := h.nc.Publish(protocol.TaskStreamSubject(task), b); err != nil {
		h.t.Fatal(err)
	}
}

var errorObject = map[string]any{"code": "INTERNAL_ERROR", "message": "the model went away", "retryable": true}

// envelopeError puts the protocol 0.3 error member beside the payload.
func envelopeError(e *protocol.Envelope) {
	e.Extra = map[string]any{"error": errorObject}
}

func sameJSON(t *testing.T, got json.RawMessage, want any) {
	t.Helper()
	w, err := protocol.Canonical(want)
	if err != nil {
		t.Fatal(err)
	}
	var g any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("stored %q: %v", got, err)
	}
	gc, err := protocol.Canonical(g)
	if err != nil {
		t.Fatal(err)
	}
	if string(gc) != string(w) {
		t.Fatalf("stored %s, want %s", gc, w)
	}
}

// The flows of a protocol 0.3 peer (upstream-notes §15), and the older ones
// beside them: each ends in the record the table names, which
// mesh.task.get answers to both parties, in full, and to nobody else.
func TestTaskFlows(t *testing.T) {
	h, parent := newHarness(t), t
	type want struct {
		state              string
		requester          func(*harness) *keys.Agent
		history            string // states, comma separated
		fromOne            bool   // every history entry carries the first step's envelope
		output, error      any    // canonical JSON of the stored member; nil: absent
		reason, note       string
		duplicates, chunks int
	}
	cases := []struct {
		name   string
		steps  []step
		chunks []map[string]any // published on .stream before the steps
		want   want
	}{
		{
			name:  "deferred performer: the completed answer is the first update",
			steps: []step{by(map[string]any{"status": "completed", "output": map[string]any{"text": "done"}})},
			want: want{state: "completed", requester: requester, history: "submitted,working,completed", fromOne: true,
				output: map[string]any{"text": "done"}},
		},
		{
			name:  "deferred performer: failed first, the error an envelope member",
			steps: []step{{responder, toRequester, map[string]any{"status": "failed"}, envelopeError}},
			want: want{state: "failed", requester: requester, history: "submitted,working,failed", fromOne: true,
				error: errorObject},
		},
		{
			name:  "deferred performer: failed first, the error in the payload",
			steps: []step{by(map[string]any{"status": "failed", "error": errorObject})},
			want: want{state: "failed", requester: requester, history: "submitted,working,failed", fromOne: true,
				error: errorObject},
		},
		{
			name: "stream: the final completed is the only update",
			chunks: []map[string]any{
				{"status": "working", "chunk_index": 0, "final": false, "data": "a"},
				{"status": "working", "chunk_index": 1, "final": false, "data": "b"},
				{"status": "completed", "chunk_index": 2, "final": true, "data": nil, "chunk_count": 3},
			},
			steps: []step{by(map[string]any{"status": "completed", "output": "ab"})},
			want: want{state: "completed", requester: requester, history: "submitted,working,completed", fromOne: true,
				output: "ab"},
		},
		{
			name:  "the requester's cancel is the first update",
			steps: []step{byRequester(protocol.CanceledUpdatePayload(protocol.CancelUserRequested, "not needed"))},
			want: want{state: "canceled", requester: requester, history: "submitted,canceled", fromOne: true,
				reason: "user_requested", note: "not needed"},
		},
		{
			// A 0.3 performer that stops on its own (its policy, a
			// deadline) publishes canceled before anything else: the
			// reason says it is the performer's, and the roles are not
			// swapped.
			name:  "the performer's own cancel is the first update",
			steps: []step{by(protocol.CanceledUpdatePayload(protocol.CancelPolicy, "quota"))},
			want: want{state: "canceled", requester: requester, history: "submitted,canceled", fromOne: true,
				reason: "policy", note: "quota"},
		},
		{
			name:  "the performer's deadline cancel is the first update",
			steps: []step{by(protocol.CanceledUpdatePayload(protocol.CancelDeadlineExceeded, ""))},
			want: want{state: "canceled", requester: requester, history: "submitted,canceled", fromOne: true,
				reason: "deadline_exceeded"},
		},
		{
			name:  "the requester's budget cancel is the first update",
			steps: []step{byRequester(protocol.CanceledUpdatePayload(protocol.CancelBudgetExhausted, ""))},
			want: want{state: "canceled", requester: requester, history: "submitted,canceled", fromOne: true,
				reason: "budget_exhausted"},
		},
		{
			name: "the requester cancels a recorded task; the performer's cancel agrees",
			steps: []step{
				by(map[string]any{"status": "working"}),
				byRequester(protocol.CanceledUpdatePayload(protocol.CancelSuperseded, "")),
				by(protocol.CanceledUpdatePayload(protocol.CancelUserRequested, "")),
			},
			want: want{state: "canceled", requester: requester, history: "submitted,working,canceled",
				reason: "superseded", duplicates: 1},
		},
		{
			name: "the performer cancels; the requester's cancel agrees",
			steps: []step{
				by(map[string]any{"status": "submitted"}),
				by(protocol.CanceledUpdatePayload(protocol.CancelPolicy, "quota")),
				byRequester(protocol.CanceledUpdatePayload(protocol.CancelUserRequested, "")),
			},
			want: want{state: "canceled", requester: requester, history: "submitted,canceled",
				reason: "policy", note: "quota", duplicates: 1},
		},
		{
			name: "earlier peers: submitted, working, completed",
			steps: []step{
				by(map[string]any{"status": "submitted"}),
				by(map[string]any{"status": "working"}),
				by(map[string]any{"status": "completed", "output": 1}),
			},
			want: want{state: "completed", requester: requester, history: "submitted,working,completed", output: 1},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h.t = t
			defer func() { h.t = parent }()
			id := protocol.NewID()
			for _, ch := range c.chunks {
				h.chunk(id, ch)
			}
			before := h.settle()
			var first string
			for i, s := range c.steps {
				eid := h.play(id, s)
				if i == 0 {
					first = eid
				}
				// Each step waits for the previous one's outcome: the
				// table is about what is recorded, not about reordering.
				h.settle()
			}
			tk := h.waitFor(id, func(tk *tasks.Task) bool { return tk.State == c.want.state })
			after := h.settle()
			if got := after.Duplicates - before.Duplicates; got != uint64(c.want.duplicates) {
				t.Fatalf("%d duplicates, want %d (%+v)", got, c.want.duplicates, after)
			}
			if after.NotParty != before.NotParty || after.Illegal != before.Illegal || after.Refused != before.Refused {
				t.Fatalf("an update was refused: before %+v after %+v", before, after)
			}
			if after.Received-before.Received != uint64(len(c.steps)) {
				t.Fatalf("the manager received %d updates for %d steps: stream chunks are not updates",
					after.Received-before.Received, len(c.steps))
			}
			w := c.want
			if tk.Requester != w.requester(h).Public() || tk.Responder != h.responder.Public() || tk.ID != id {
				t.Fatalf("parties: requester %s responder %s", tk.Requester, tk.Responder)
			}
			if got := strings.Join(states(tk), ","); got != w.history {
				t.Fatalf("history %s, want %s", got, w.history)
			}
			for _, e := range tk.History {
				if e.At == "" || e.TS == "" || (w.fromOne && e.EnvelopeID != first) {
					t.Fatalf("history entry %+v (first envelope %s)", e, first)
				}
			}
			for name, m := range map[string]struct {
				got  json.RawMessage
				want any
			}{"output": {tk.Output, w.output}, "error": {tk.Error, w.error}} {
				if m.want == nil {
					if m.got != nil {
						t.Fatalf("%s %s, want none", name, m.got)
					}
					continue
				}
				sameJSON(t, m.got, m.want)
			}
			if tk.Reason != w.reason || tk.Note != w.note {
				t.Fatalf("reason %q note %q", tk.Reason, tk.Note)
			}
			// mesh.task.get answers both parties the same record, and
			// nobody else.
			byResponder, err := h.get(h.responder, id)
			if err != nil {
				t.Fatal(err)
			}
			a, _ := json.Marshal(tk)
			b, _ := json.Marshal(byResponder)
			if string(a) != string(b) {
				t.Fatalf("the parties read different records:\n%s\n%s", a, b)
			}
			_, err = h.get(h.other, id)
			wantCode(t, err, errs.Unauthorized)
		})
	}
}

// What the task manager refuses: an update from a third party, one from the
// requester that is not a cancel, a misaddressed one, and any move out of a
// terminal state, whoever writes it. Nothing refused changes the record;
// the illegal ones raise task.invalid_transition, once each.
func TestTaskRefusals(t *testing.T) {
	h, parent := newHarness(t), t
	ev := h.events()
	type outcome int
	const (
		notParty outcome = iota
		refused
		illegal
	)
	completedBefore := step{responder, toRequester, map[string]any{"status": "completed", "output": "x"}, sentAt(-time.Second)}
	cases := []struct {
		name  string
		setup []step
		bad   step
		want  outcome
	}{
		{"a third party completes", []step{by(map[string]any{"status": "working"})},
			step{other, toRequester, map[string]any{"status": "completed", "output": "forged"}, nil}, notParty},
		{"a third party cancels", []step{by(map[string]any{"status": "working"})},
			step{other, toResponder, protocol.CanceledUpdatePayload(protocol.CancelUserRequested, ""), nil}, notParty},
		{"a third party writes a finished task", []step{completedBefore},
			step{other, toRequester, map[string]any{"status": "working"}, nil}, notParty},
		{"the requester sends working", []step{by(map[string]any{"status": "working"})},
			byRequester(map[string]any{"status": "working"}), notParty},
		{"the requester completes", []step{by(map[string]any{"status": "working"})},
			byRequester(map[string]any{"status": "completed", "output": "mine"}), notParty},
		{"the requester fails the task", []step{by(map[string]any{"status": "working"})},
			byRequester(map[string]any{"status": "failed", "error": errorObject}), notParty},
		{"the requester pauses the task", []step{by(map[string]any{"status": "working"})},
			byRequester(map[string]any{"status": "input_required"}), notParty},
		{"the requester rejects the task", []step{by(map[string]any{"status": "submitted"})},
			byRequester(map[string]any{"status": "rejected"}), notParty},
		{"the requester writes a task it canceled first", []step{byRequester(protocol.CanceledUpdatePayload(protocol.CancelUserRequested, ""))},
			byRequester(map[string]any{"status": "working"}), notParty},
		{"the performer writes a task it canceled first", []step{by(protocol.CanceledUpdatePayload(protocol.CancelPolicy, ""))},
			by(map[string]any{"status": "working"}), illegal},
		{"a third party writes a task canceled first", []step{byRequester(protocol.CanceledUpdatePayload(protocol.CancelUserRequested, ""))},
			step{other, toRequester, map[string]any{"status": "working"}, sentAt(-time.Second)}, notParty},
		{"a third party cancels a task canceled first", []step{byRequester(protocol.CanceledUpdatePayload(protocol.CancelUserRequested, ""))},
			step{other, toResponder, protocol.CanceledUpdatePayload(protocol.CancelPolicy, ""), nil}, notParty},
		{"the requester's cancel addressed to a third party", []step{by(map[string]any{"status": "working"})},
			step{requester, toOther, protocol.CanceledUpdatePayload(protocol.CancelUserRequested, ""), nil}, refused},
		{"the performer's update addressed to a third party", []step{by(map[string]any{"status": "working"})},
			step{responder, toOther, map[string]any{"status": "completed"}, nil}, refused},
		{"the requester's cancel without a valid reason", []step{by(map[string]any{"status": "working"})},
			byRequester(map[string]any{"status": "canceled", "reason": "bored"}), refused},
		{"working after completed", []step{by(map[string]any{"status": "working"}), by(map[string]any{"status": "completed"})},
			by(map[string]any{"status": "working"}), illegal},
		{"working signed after a first completed", []step{completedBefore},
			by(map[string]any{"status": "working"}), illegal},
		{"paused after a first completed", []step{completedBefore},
			by(map[string]any{"status": "input_required"}), illegal},
		{"completed again", []step{completedBefore},
			by(map[string]any{"status": "completed", "output": "y"}), illegal},
		{"the requester cancels a completed task", []step{completedBefore},
			byRequester(protocol.CanceledUpdatePayload(protocol.CancelUserRequested, "")), illegal},
		{"the requester cancels a failed task", []step{by(map[string]any{"status": "failed", "error": errorObject})},
			byRequester(protocol.CanceledUpdatePayload(protocol.CancelUserRequested, "")), illegal},
		{"the performer completes a task the requester canceled first", []step{byRequester(protocol.CanceledUpdatePayload(protocol.CancelUserRequested, ""))},
			by(map[string]any{"status": "completed", "output": "late"}), illegal},
		{"the performer fails a task the requester canceled", []step{by(map[string]any{"status": "working"}), byRequester(protocol.CanceledUpdatePayload(protocol.CancelSuperseded, ""))},
			by(map[string]any{"status": "failed", "error": errorObject}), illegal},
	}
	wantEvents := map[string]map[string]any{}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h.t = t
			defer func() { h.t = parent }()
			id := protocol.NewID()
			for _, s := range c.setup {
				h.play(id, s)
				h.settle()
			}
			last := c.setup[len(c.setup)-1]
			wantState, _ := last.payload["status"].(string)
			before := h.waitFor(id, func(tk *tasks.Task) bool { return tk.State == wantState })
			s0 := h.settle()
			h.play(id, c.bad)
			s1 := h.settle()
			delta := map[outcome]uint64{notParty: s1.NotParty - s0.NotParty, refused: s1.Refused - s0.Refused, illegal: s1.Illegal - s0.Illegal}
			for o, n := range delta {
				if want := map[bool]uint64{true: 1, false: 0}[o == c.want]; n != want {
					t.Fatalf("outcomes %v, want one of kind %d (stats %+v)", delta, c.want, s1)
				}
			}
			if s1.Recorded != s0.Recorded || s1.Duplicates != s0.Duplicates {
				t.Fatalf("recorded: before %+v after %+v", s0, s1)
			}
			after := h.mustGet(id)
			a, _ := json.Marshal(before)
			b, _ := json.Marshal(after)
			if string(a) != string(b) {
				t.Fatalf("a refused update changed the record:\n%s\n%s", a, b)
			}
			if c.want == illegal {
				wantEvents[id] = map[string]any{"task_id": id, "from": before.State, "to": c.bad.payload["status"], "by": c.bad.from(h).Public()}
			}
		})
	}
	// Every illegal update raised its event once; nothing else raised one.
	got := map[string][]map[string]any{}
	n := 0
	for deadline := time.Now().Add(5 * time.Second); n < len(wantEvents) && time.Now().Before(deadline); {
		for _, e := range ev.drain(50 * time.Millisecond) {
			id, _ := e["task_id"].(string)
			got[id] = append(got[id], e)
			n++
		}
	}
	for _, e := range ev.drain(200 * time.Millisecond) {
		id, _ := e["task_id"].(string)
		got[id] = append(got[id], e)
		n++
	}
	if n != len(wantEvents) {
		t.Fatalf("%d events, want %d: %v", n, len(wantEvents), got)
	}
	for id, want := range wantEvents {
		if len(got[id]) != 1 {
			t.Fatalf("events for %s: %v", id, got[id])
		}
		for k, v := range want {
			if got[id][0][k] != v {
				t.Fatalf("event for %s: %v, want %v", id, got[id][0], want)
			}
		}
	}
}

// A performer of an earlier protocol whose completed overtook its submitted
// and working (three copies, any order): the completed creates the record
// at once, and the two late updates, signed before it, take the entries it
// implied; nothing is refused. The window is long so that a slow machine
// cannot turn this into the refusal below.
func TestOvertakenByTheFirstTerminal(t *testing.T) {
	h := newHarnessWith(t, tasks.Config{ReorderWindow: time.Minute})
	id := protocol.NewID()
	done := h.play(id, step{responder, toRequester, map[string]any{"status": "completed", "output": "x"}, sentAt(-time.Second)})
	h.waitFor(id, func(tk *tasks.Task) bool { return tk.State == "completed" })
	working := h.play(id, step{responder, toRequester, map[string]any{"status": "working"}, sentAt(-2 * time.Second)})
	submitted := h.play(id, step{responder, toRequester, map[string]any{"status": "submitted"}, sentAt(-3 * time.Second)})
	if s := h.settle(); s.Recorded != 3 || s.Illegal != 0 {
		t.Fatalf("stats %+v", s)
	}
	tk := h.mustGet(id)
	wantHistory(t, tk, "submitted,working,completed", submitted, working, done)
	// A third one finds no implied entry left: a move out of completed.
	h.play(id, step{responder, toRequester, map[string]any{"status": "working"}, sentAt(-4 * time.Second)})
	if s := h.settle(); s.Illegal != 1 {
		t.Fatalf("stats %+v", s)
	}
}

// Past the reorder window, an implied entry is not taken any more: an
// update in its state is a move out of the terminal state.
func TestImpliedEntryAfterTheWindow(t *testing.T) {
	const window = 50 * time.Millisecond
	h := newHarnessWith(t, tasks.Config{ReorderWindow: window})
	ev := h.events()
	id := protocol.NewID()
	h.play(id, step{responder, toRequester, map[string]any{"status": "completed", "output": "x"}, sentAt(-time.Second)})
	tk := h.waitFor(id, func(tk *tasks.Task) bool { return tk.State == "completed" })
	end, err := protocol.ParseTime(tk.History[len(tk.History)-1].At)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(end.Add(2 * window)))
	h.play(id, step{responder, toRequester, map[string]any{"status": "working"}, sentAt(-2 * time.Second)})
	if s := h.settle(); s.Illegal != 1 || s.Recorded != 1 {
		t.Fatalf("stats %+v", s)
	}
	if got := ev.drain(300 * time.Millisecond); len(got) != 1 || got[0]["from"] != "completed" || got[0]["to"] != "working" {
		t.Fatalf("events %v", got)
	}
}

// Three copies record each task once: the same first update published
// several times reaches several copies, and only one creates the record;
// the others find their envelope in it (a first cancel too: it is never
// held).
func TestFirstUpdateRecordedOnce(t *testing.T) {
	h := newHarness(t)
	for _, first := range []step{
		by(map[string]any{"status": "completed", "output": "x"}),
		{responder, toRequester, map[string]any{"status": "failed"}, envelopeError},
		byRequester(protocol.CanceledUpdatePayload(protocol.CancelUserRequested, "")),
	} {
		id := protocol.NewID()
		b := envelope(t, first.from(h), first.to(h), first.payload, first.edit)
		for range 6 {
			h.raw(id, b)
		}
		h.settle()
		tk := h.mustGet(id)
		if tk.Requester != h.requester.Public() || tk.Responder != h.responder.Public() {
			t.Fatalf("parties %s %s", tk.Requester, tk.Responder)
		}
		if !protocol.Terminal(tk.State) || len(tk.History) != len(strings.Split(map[string]string{
			"completed": "submitted,working,completed", "failed": "submitted,working,failed", "canceled": "submitted,canceled",
		}[tk.State], ",")) {
			t.Fatalf("record %+v", tk)
		}
	}
	if s := h.settle(); s.Recorded != 3 || s.Duplicates != 15 || s.Illegal != 0 {
		t.Fatalf("stats %+v", s)
	}
}
