package tasks_test

import (
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/tasks"
)

// Who can make the record of a task whose first update is a cancel. Every
// client may subscribe mesh.task.> and publish on any mesh.task.<id>.update
// (shared/creds NodePermissions, GuestPermissions), so whoever watches sees
// a cancel as it is published, and may publish one of its own, signed by
// itself.

// waitStats polls the summed counters until cond holds (the harness's
// settle would wait for held updates too).
func (h *harness) waitStats(what string, cond func(tasks.Stats) bool) tasks.Stats {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s := h.stats()
		if cond(s) {
			return s
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out waiting for %s: %+v", what, s)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// An observer that sees the requester's first cancel, fills the copies'
// holds and publishes a cancel of its own naming the performer does not
// become the task's requester: the genuine cancel was recorded on arrival,
// and the observer's is a third party's. (A first cancel used to be held
// for the reorder window and taken as the requester's at once when the
// holds were full: the observer's was recorded first.)
func TestObserverCannotTakeOverAFirstCancel(t *testing.T) {
	h := newHarnessWith(t, tasks.Config{ReorderWindow: 3 * time.Second, MaxHeld: 1})
	id := protocol.NewID()
	h.play(id, byRequester(protocol.CanceledUpdatePayload(protocol.CancelUserRequested, "")))
	// The flood: updates that are ahead of their record, held for the
	// window, one per copy at most; thirty leave no copy a free hold.
	for range 30 {
		h.update(protocol.NewID(), map[string]any{"status": "auth_required"})
	}
	h.waitStats("the holds to fill", func(s tasks.Stats) bool { return s.Received == 31 })
	h.play(id, step{other, toResponder, protocol.CanceledUpdatePayload(protocol.CancelUserRequested, "mine now"), nil})
	// Both cancels reach an outcome (the flood's end as illegal only when
	// the window does).
	h.waitStats("both cancels", func(s tasks.Stats) bool { return s.Recorded+s.NotParty == 2 })

	// Read by the performer, a party whoever won.
	tk, err := h.get(h.responder, id)
	if err != nil {
		t.Fatal(err)
	}
	if tk.Requester != h.requester.Public() || tk.Responder != h.responder.Public() || tk.CanceledBy != h.requester.Public() || tk.Note != "" {
		t.Fatalf("the record is %+v: the observer took it over", tk)
	}
	if !tk.RolesGuessed || strings.Join(states(tk), ",") != "submitted,canceled" {
		t.Fatalf("record %+v", tk)
	}
	if s := h.stats(); s.NotParty != 1 || s.Recorded != 1 {
		t.Fatalf("the observer's cancel was not refused as a third party's: %+v", s)
	}
	_, err = h.get(h.other, id)
	wantCode(t, err, errs.Unauthorized)
	if _, err := h.get(h.requester, id); err != nil {
		t.Fatal(err)
	}
}

// An observer that learnt a task id before anything was recorded (a stream
// chunk, a get, a revision) and published the first cancel itself named one
// of the two parties: that party's own word, naming its real counterpart,
// makes the record again from its update; nobody else's does.
func TestNamedPartyUndoesAForgedFirstCancel(t *testing.T) {
	h := newHarness(t)
	t.Run("the forged cancel named the performer", func(t *testing.T) {
		h.t = t
		id := protocol.NewID()
		h.play(id, step{other, toResponder, protocol.CanceledUpdatePayload(protocol.CancelUserRequested, "forged"), nil})
		h.settle()
		// The requester is not a party of that record; its reads are
		// refused until the performer speaks.
		if _, err := h.get(h.requester, id); errs.CodeOf(err) != errs.Unauthorized {
			t.Fatalf("get by the requester: %v", err)
		}
		h.play(id, by(map[string]any{"status": "working"}))
		s := h.settle()
		tk := h.waitFor(id, func(tk *tasks.Task) bool { return tk.State == "working" })
		if tk.Requester != h.requester.Public() || tk.Responder != h.responder.Public() || tk.RolesGuessed || tk.CanceledBy != "" || tk.Reason != "" {
			t.Fatalf("record %+v", tk)
		}
		if got := strings.Join(states(tk), ","); got != "submitted,working" {
			t.Fatalf("history %s", got)
		}
		_, err := h.get(h.other, id)
		wantCode(t, err, errs.Unauthorized)
		// The performer goes on as usual.
		h.play(id, by(map[string]any{"status": "completed", "output": "done"}))
		if s2 := h.settle(); s2.Recorded != s.Recorded+1 {
			t.Fatalf("stats %+v", s2)
		}
	})
	t.Run("the forged cancel named the requester", func(t *testing.T) {
		h.t = t
		id := protocol.NewID()
		h.play(id, step{other, toRequester, protocol.CanceledUpdatePayload(protocol.CancelPolicy, "forged"), nil})
		h.settle()
		// The performer is not a party: its updates are a third party's.
		h.play(id, by(map[string]any{"status": "completed", "output": "x"}))
		if s := h.settle(); s.NotParty == 0 {
			t.Fatalf("stats %+v", s)
		}
		// The requester's own cancel names the performer: the record is
		// made again from it.
		h.play(id, byRequester(protocol.CanceledUpdatePayload(protocol.CancelUserRequested, "mine")))
		h.settle()
		tk := h.waitFor(id, func(tk *tasks.Task) bool { return tk.CanceledBy == h.requester.Public() })
		if tk.Requester != h.requester.Public() || tk.Responder != h.responder.Public() || tk.Note != "mine" || !tk.RolesGuessed {
			t.Fatalf("record %+v", tk)
		}
		_, err := h.get(h.other, id)
		wantCode(t, err, errs.Unauthorized)
	})
	t.Run("a third party cannot undo a genuine first cancel", func(t *testing.T) {
		h.t = t
		id := protocol.NewID()
		h.play(id, byRequester(protocol.CanceledUpdatePayload(protocol.CancelUserRequested, "")))
		h.settle()
		want := h.mustGet(id)
		s0 := h.stats()
		for _, s := range []step{
			{other, toResponder, map[string]any{"status": "working"}, sentAt(-time.Second)},
			{other, toRequester, map[string]any{"status": "working"}, sentAt(-time.Second)},
			{other, toRequester, protocol.CanceledUpdatePayload(protocol.CancelPolicy, ""), nil},
		} {
			h.play(id, s)
		}
		if s := h.settle(); s.NotParty != s0.NotParty+3 {
			t.Fatalf("stats %+v", s)
		}
		if got := h.mustGet(id); got.UpdatedAt != want.UpdatedAt || got.Requester != want.Requester || len(got.History) != 2 {
			t.Fatalf("record changed: %+v", got)
		}
	})
}

// The performer's states overtaken by a first cancel (published before it,
// recorded after it on another copy) are placed before it, as if they had
// arrived in order, and they settle the roles when the cancel's reason had
// them the wrong way round. The window is long so that a slow machine
// cannot turn this into a refusal.
func TestCancelOvertakesThePerformer(t *testing.T) {
	h := newHarnessWith(t, tasks.Config{ReorderWindow: time.Minute})
	t.Run("the requester's cancel", func(t *testing.T) {
		h.t = t
		id := protocol.NewID()
		cancelID := h.play(id, byRequester(protocol.CanceledUpdatePayload(protocol.CancelSuperseded, "")))
		h.waitFor(id, func(tk *tasks.Task) bool { return tk.State == "canceled" })
		working := h.play(id, step{responder, toRequester, map[string]any{"status": "working", "offering": "chat"}, sentAt(-time.Second)})
		h.settle()
		submitted := h.play(id, step{responder, toRequester, map[string]any{"status": "submitted"}, sentAt(-2 * time.Second)})
		if s := h.settle(); s.Recorded != 3 || s.Illegal != 0 || s.NotParty != 0 {
			t.Fatalf("stats %+v", s)
		}
		tk := h.mustGet(id)
		wantHistory(t, tk, "submitted,working,canceled", submitted, working, cancelID)
		if tk.Requester != h.requester.Public() || tk.Responder != h.responder.Public() || tk.RolesGuessed || tk.Offering != "chat" || tk.Reason != "superseded" {
			t.Fatalf("record %+v", tk)
		}
	})
	t.Run("the performer's cancel with a requester's reason", func(t *testing.T) {
		h.t = t
		id := protocol.NewID()
		h.play(id, by(protocol.CanceledUpdatePayload(protocol.CancelUserRequested, "")))
		tk := h.waitFor(id, func(tk *tasks.Task) bool { return tk.State == "canceled" })
		if !tk.RolesGuessed || tk.Requester != h.responder.Public() {
			t.Fatalf("the reason should have labelled the performer requester: %+v", tk)
		}
		s0 := h.settle()
		h.play(id, step{responder, toRequester, map[string]any{"status": "working"}, sentAt(-time.Second)})
		if s := h.settle(); s.Recorded != s0.Recorded+1 {
			t.Fatalf("stats %+v", s)
		}
		tk = h.mustGet(id)
		if tk.Requester != h.requester.Public() || tk.Responder != h.responder.Public() || tk.RolesGuessed || tk.CanceledBy != h.responder.Public() {
			t.Fatalf("record %+v", tk)
		}
		if got := strings.Join(states(tk), ","); got != "submitted,working,canceled" {
			t.Fatalf("history %s", got)
		}
	})
	t.Run("a state signed after the cancel is not placed", func(t *testing.T) {
		h.t = t
		id := protocol.NewID()
		h.play(id, byRequester(protocol.CanceledUpdatePayload(protocol.CancelUserRequested, "")))
		h.waitFor(id, func(tk *tasks.Task) bool { return tk.State == "canceled" })
		s0 := h.settle()
		h.play(id, step{responder, toRequester, map[string]any{"status": "working"}, sentAt(time.Second)})
		if s := h.settle(); s.Illegal != s0.Illegal+1 {
			t.Fatalf("stats %+v", s)
		}
		if tk := h.mustGet(id); !tk.RolesGuessed || len(tk.History) != 2 {
			t.Fatalf("record %+v", tk)
		}
	})
}
