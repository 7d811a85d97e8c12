package engagement_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/engagement"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/sow"
)

// amended is the agreed value at the next version with change applied,
// signatures removed.
func amended(t *testing.T, agreed map[string]any, version int, change func(d map[string]any)) map[string]any {
	d := clone(t, agreed)
	delete(d, "signatures")
	d["version"] = version
	if change != nil {
		change(d)
	}
	return d
}

// Amendments (§5.8): a full replacement at version + 1 with the proposer's
// one signature; at most one open; approval countersigns the exact bytes;
// a denial needs its reason; a withdrawal is the proposer's; an unanswered
// proposal lapses after the review window, derived from the clock and
// recorded; a version not above the highest countersigned is refused.
func TestAmendments(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	tmpl := w.template()
	tmpl["scope"].(map[string]any)["offerings"] = []any{"summarize", "translate"}
	agreed := w.form(tmpl)
	key := func(o string) string { return commerce.EngagementKey(w.provider.Public(), w.client.Public(), o) }

	// v2 by the client: translate leaves the scope, the notice shortens.
	v2 := amended(t, agreed, 2, func(d map[string]any) {
		d["scope"].(map[string]any)["offerings"] = []any{"summarize"}
		d["termination"] = map[string]any{"convenience_notice_hours": 12, "grade": "recorded"}
	})
	proposal := w.sign(v2, sow.RoleClient, w.cOwner)
	rec, err := w.svc.Propose(ctx, proposal)
	if err != nil || rec.Open == nil || rec.Open.Version != 2 {
		t.Fatalf("propose v2: %v", err)
	}
	if v := w.view(); v.State != sow.StateAmendmentProposed || v.Version != 1 || v.Open == nil || v.Open.LapsesAt != "2026-09-08T12:00:00.000000000Z" {
		t.Fatalf("while open: %s v%d %+v", v.State, v.Version, v.Open)
	}
	// A second proposal while one is open.
	_, err = w.svc.Propose(ctx, w.sign(amended(t, agreed, 2, nil), sow.RoleProvider, w.pOwner))
	refused(t, err, errs.Conflict, "a second open proposal")
	// Approval countersigns the exact bytes, by the other seat.
	_, err = w.svc.Approve(ctx, w.sign(clone(t, v2), sow.RoleProvider, w.sOwner))
	refused(t, err, errs.Forbidden, "approved by a stranger")
	approval := w.sign(v2, sow.RoleProvider, w.pOwner)
	if rec, err = w.svc.Approve(ctx, approval); err != nil || rec.Version != 2 || rec.Open != nil || rec.MirrorPending {
		t.Fatalf("approve: %v", err)
	}
	if got := w.terms.terms(t, key("summarize")); got == nil || got.Version != 2 {
		t.Fatalf("terms after approval: %+v", got)
	}
	if got := w.terms.terms(t, key("translate")); got != nil {
		t.Fatalf("the offering taken out of scope keeps terms: %+v", got)
	}
	v := w.view()
	if v.State != sow.StateAmended || v.Document != string(approval) || len(v.Amendments) != 2 {
		t.Fatalf("after approval: %s %d amendments", v.State, len(v.Amendments))
	}
	// Replaying an old version.
	_, err = w.svc.Propose(ctx, w.sign(amended(t, agreed, 2, nil), sow.RoleClient, w.cOwner))
	refused(t, err, errs.Conflict, "a version not above the highest countersigned")
	// v3 by the provider: denied without a reason (refused), then with one.
	v3 := amended(t, agreed, 3, func(d map[string]any) { d["scope"].(map[string]any)["offerings"] = []any{"summarize"} })
	if _, err := w.svc.Propose(ctx, w.sign(v3, sow.RoleProvider, w.pOwner)); err != nil {
		t.Fatal(err)
	}
	_, err = w.svc.Resolve(ctx, w.act(engagement.TagAmendment, w.cOwner, map[string]any{"version": 3, "act": "deny"}))
	refused(t, err, errs.InvalidRequest, "a denial without a reason")
	_, err = w.svc.Resolve(ctx, w.act(engagement.TagAmendment, w.pOwner, map[string]any{"version": 3, "act": "deny", "reason": "mine"}))
	refused(t, err, errs.Forbidden, "the proposer denying its own proposal")
	_, err = w.svc.Resolve(ctx, w.act(engagement.TagAmendment, w.cOwner, map[string]any{"version": 3, "act": "withdraw"}))
	refused(t, err, errs.Forbidden, "the counterparty withdrawing")
	if _, err := w.svc.Resolve(ctx, w.act(engagement.TagAmendment, w.cOwner, map[string]any{"version": 3, "act": "deny", "reason": "The scope stays as agreed."})); err != nil {
		t.Fatalf("deny: %v", err)
	}
	// v3 again, withdrawn by its proposer.
	v3b := amended(t, agreed, 3, func(d map[string]any) {
		d["scope"].(map[string]any)["offerings"] = []any{"summarize"}
		d["ends_at"] = "2027-01-01T00:00:00Z"
	})
	if _, err := w.svc.Propose(ctx, w.sign(v3b, sow.RoleProvider, w.pOwner)); err != nil {
		t.Fatal(err)
	}
	if _, err := w.svc.Resolve(ctx, w.act(engagement.TagAmendment, w.pOwner, map[string]any{"version": 3, "act": "withdraw"})); err != nil {
		t.Fatalf("withdraw: %v", err)
	}
	// v3 once more, left unanswered: it lapses when the window closes.
	v3c := amended(t, agreed, 3, func(d map[string]any) {
		d["scope"].(map[string]any)["offerings"] = []any{"summarize"}
		d["ends_at"] = "2027-02-01T00:00:00Z"
	})
	if _, err := w.svc.Propose(ctx, w.sign(v3c, sow.RoleClient, w.cOwner)); err != nil {
		t.Fatal(err)
	}
	w.clock.Advance(7*24*time.Hour - time.Second)
	if v := w.view(); v.Open == nil {
		t.Fatal("lapsed before the window closed")
	}
	w.clock.Advance(time.Second)
	v = w.view()
	if v.Open != nil || v.Version != 2 {
		t.Fatalf("after the window: open %+v version %d", v.Open, v.Version)
	}
	_, err = w.svc.Approve(ctx, w.sign(v3c, sow.RoleProvider, w.pOwner))
	refused(t, err, errs.Conflict, "approving a lapsed proposal")
	var kinds, reasons []string
	for _, h := range v.Amendments {
		kinds = append(kinds, h.Kind)
		reasons = append(reasons, h.Reason)
	}
	want := []string{engagement.EventProposed, engagement.EventApproved, engagement.EventProposed, engagement.EventDenied,
		engagement.EventProposed, engagement.EventWithdrawn, engagement.EventProposed, engagement.EventLapsed}
	if !slices.Equal(kinds, want) || reasons[3] != "The scope stays as agreed." || !strings.Contains(reasons[7], "review window") {
		t.Fatalf("history %v reasons %q", kinds, reasons)
	}
	if v.Amendments[7].At != "2026-09-08T12:00:00.000000000Z" {
		t.Fatalf("the lapse is recorded at the window's close: %s", v.Amendments[7].At)
	}
	// Parties are fixed.
	_, err = w.svc.Propose(ctx, w.sign(amended(t, agreed, 3, func(d map[string]any) {
		d["parties"].(map[string]any)["client"].(map[string]any)["owner"] = "Someone Else"
	}), sow.RoleClient, w.cOwner))
	refused(t, err, errs.InvalidRequest, "an amendment changing the parties")
	// An amendment grading enforced what this runtime cannot enforce.
	_, err = w.svc.Propose(ctx, w.sign(amended(t, agreed, 3, func(d map[string]any) {
		d["scope"].(map[string]any)["offerings"] = []any{"summarize"}
		d["volume"] = map[string]any{"per_day": 3, "grade": "enforced"}
	}), sow.RoleClient, w.cOwner))
	refused(t, err, errs.Forbidden, "an unenforceable amendment")
}

// Termination (§5.9): without cause the notice runs and the engagement
// stays in force until it expires; with cause it ends at once and the
// reason is on the record; the mirrored terms say when.
func TestTermination(t *testing.T) {
	ctx := context.Background()
	t.Run("convenience, then cause", func(t *testing.T) {
		w := newWorld(t)
		w.form(w.template())
		_, err := w.svc.Terminate(ctx, w.act(engagement.TagTerminate, w.sOwner, map[string]any{"version": 1, "for_cause": false}))
		refused(t, err, errs.Forbidden, "a stranger terminating")
		_, err = w.svc.Terminate(ctx, w.act(engagement.TagTerminate, w.cOwner, map[string]any{"version": 2, "for_cause": false}))
		refused(t, err, errs.Conflict, "the wrong version")
		_, err = w.svc.Terminate(ctx, w.act(engagement.TagTerminate, w.cOwner, map[string]any{"version": 1, "for_cause": true}))
		refused(t, err, errs.InvalidRequest, "for cause without a reason")
		_, err = w.svc.Terminate(ctx, w.act(engagement.TagTerminate, w.cOwner, map[string]any{"version": 1, "for_cause": false, "at": epoch.Add(-time.Hour).Format(time.RFC3339)}))
		refused(t, err, errs.InvalidRequest, "a notice dated an hour ago")
		notice := w.act(engagement.TagTerminate, w.cOwner, map[string]any{"version": 1, "for_cause": false})
		rec, err := w.svc.Terminate(ctx, notice)
		if err != nil || rec.Termination == nil || rec.Termination.EffectiveAt != "2026-09-02T12:00:00.000000000Z" {
			t.Fatalf("terminate: %v %+v", err, rec)
		}
		if _, err := w.svc.Terminate(ctx, append([]byte("\n"), notice...)); err != nil {
			t.Fatalf("the same notice again: %v", err)
		}
		key := commerce.EngagementKey(w.provider.Public(), w.client.Public(), "summarize")
		terms := w.terms.terms(t, key)
		if terms.EffectiveUntil == nil || !terms.InForce(w.clock.Now()) || terms.InForce(w.clock.Now().Add(24*time.Hour)) {
			t.Fatalf("terms in notice: %+v", terms)
		}
		if v := w.view(); !v.InForce || v.State != sow.StateActive || v.Termination == nil || !v.Termination.InNotice || v.Termination.Notice != string(notice) {
			t.Fatalf("in notice: %s %v %+v", v.State, v.InForce, v.Termination)
		}
		w.clock.Advance(2 * time.Hour)
		// Cause may cut a running notice short.
		rec, err = w.svc.Terminate(ctx, w.act(engagement.TagTerminate, w.pOwner, map[string]any{"version": 1, "for_cause": true, "reason": "Missed every deadline."}))
		if err != nil || !rec.Termination.ForCause || rec.Termination.EffectiveAt != "2026-09-01T14:00:00.000000000Z" {
			t.Fatalf("for cause during notice: %v", err)
		}
		v := w.view()
		if v.InForce || v.State != sow.StateTerminated || v.Termination.Reason != "Missed every deadline." || v.Termination.Role != sow.RoleProvider {
			t.Fatalf("for cause: %s %v %+v", v.State, v.InForce, v.Termination)
		}
		if terms := w.terms.terms(t, key); !terms.ForCause || terms.InForce(w.clock.Now()) {
			t.Fatalf("terms after cause: %+v", terms)
		}
		_, err = w.svc.Terminate(ctx, w.act(engagement.TagTerminate, w.cOwner, map[string]any{"version": 1, "for_cause": true, "reason": "Again."}))
		refused(t, err, errs.Conflict, "terminating twice")
	})
	t.Run("convenience runs out", func(t *testing.T) {
		w := newWorld(t)
		agreed := w.form(w.template())
		if _, err := w.svc.Terminate(ctx, w.act(engagement.TagTerminate, w.pOwner, map[string]any{"version": 1, "for_cause": false})); err != nil {
			t.Fatal(err)
		}
		w.clock.Advance(24*time.Hour - time.Second)
		if v := w.view(); !v.InForce {
			t.Fatal("out of force before the notice expired")
		}
		w.clock.Advance(time.Second)
		if v := w.view(); v.InForce || v.State != sow.StateTerminated || v.Termination.InNotice {
			t.Fatalf("after the notice: %s %v", v.State, v.InForce)
		}
		_, err := w.svc.Propose(ctx, w.sign(amended(t, agreed, 2, nil), sow.RoleClient, w.cOwner))
		refused(t, err, errs.Conflict, "amending a terminated engagement")
	})
}

// Reviews (§15): by the buyer only, a rejection needs a reason, append
// only, the same signed review stored once.
func TestReviews(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	w.form(w.template())
	_, _, err := w.svc.AddReview(ctx, w.act(engagement.TagReview, w.cOwner, map[string]any{"verdict": "rejected"}))
	refused(t, err, errs.InvalidRequest, "a rejection without a reason")
	_, _, err = w.svc.AddReview(ctx, w.act(engagement.TagReview, w.sOwner, map[string]any{"verdict": "accepted"}))
	refused(t, err, errs.Forbidden, "a non-party's review")
	_, _, err = w.svc.AddReview(ctx, w.act(engagement.TagReview, w.pOwner, map[string]any{"verdict": "accepted"}))
	refused(t, err, errs.Forbidden, "the seller's owner reviewing")
	_, _, err = w.svc.AddReview(ctx, w.act(engagement.TagReview, w.cOwner, map[string]any{"verdict": "great"}))
	refused(t, err, errs.InvalidRequest, "an invented verdict")
	rejection := w.act(engagement.TagReview, w.cOwner, map[string]any{"verdict": "rejected", "reason": "The summary missed the totals.", "task_id": "task-1"})
	first, dup, err := w.svc.AddReview(ctx, rejection)
	if err != nil || dup {
		t.Fatalf("review: %v dup %v", err, dup)
	}
	// The same signed review, re-spaced and sent a day later: stored once.
	w.clock.Advance(24 * time.Hour)
	respaced := append([]byte(" "), rejection...)
	again, dup, err := w.svc.AddReview(ctx, respaced)
	if err != nil || !dup || again.Digest != first.Digest {
		t.Fatalf("the same review again: %v dup %v", err, dup)
	}
	// A changed mind is a second review.
	if _, dup, err := w.svc.AddReview(ctx, w.act(engagement.TagReview, w.cOwner, map[string]any{"verdict": "accepted", "task_id": "task-1"})); err != nil || dup {
		t.Fatalf("second review: %v", err)
	}
	v := w.view()
	if len(v.Reviews) != 2 || v.Reviews[0].Verdict != "rejected" || v.Reviews[0].Reason != "The summary missed the totals." ||
		v.Reviews[0].Review != string(rejection) || v.Reviews[1].Verdict != "accepted" {
		t.Fatalf("reviews: %+v", v.Reviews)
	}
}

// A change recorded while the bus is down is mirrored by the job.
func TestMirrorPending(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	w.terms.fail = errBus
	w.form(w.template())
	if v := w.view(); !v.MirrorPending {
		t.Fatal("the record does not say its terms are not on the bus")
	}
	w.terms.fail = nil
	if n, err := w.svc.SyncPending(ctx); err != nil || n != 1 {
		t.Fatalf("sync: %d %v", n, err)
	}
	if v := w.view(); v.MirrorPending {
		t.Fatal("still pending after the job")
	}
	if w.terms.terms(t, commerce.EngagementKey(w.provider.Public(), w.client.Public(), "summarize")) == nil {
		t.Fatal("no terms after the job")
	}
	if n, err := w.svc.SyncPending(ctx); err != nil || n != 0 {
		t.Fatalf("second sync: %d %v", n, err)
	}
}

// Another engagement in force for the same (client, seller, offering) is
// a conflict; once it ended, a new one forms.
func TestOneEngagementPerOffering(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	w.form(w.template())
	second := w.template()
	second["id"] = "sow_test0000000002"
	if _, err := w.svc.FileProposal(ctx, w.sign(clone(t, second), sow.RoleProvider, w.pOwner)); err != nil {
		t.Fatal(err)
	}
	in := w.instance(second)
	_, err := w.svc.Countersign(ctx, w.sign(in, sow.RoleClient, w.cOwner), nil)
	refused(t, err, errs.Conflict, "a second engagement for the same offering")
	if _, err := w.svc.Terminate(ctx, w.act(engagement.TagTerminate, w.cOwner, map[string]any{"version": 1, "for_cause": true, "reason": "Moving on."})); err != nil {
		t.Fatal(err)
	}
	delete(in, "signatures")
	if _, err := w.svc.Countersign(ctx, w.sign(in, sow.RoleClient, w.cOwner), nil); err != nil {
		t.Fatalf("after the first ended: %v", err)
	}
	if _, err := w.svc.Sign(ctx, w.sign(in, sow.RoleProvider, w.pOwner)); err != nil {
		t.Fatal(err)
	}
	if v := w.view(); v.SowID != "sow_test0000000002" || !v.InForce {
		t.Fatalf("the record under the offering: %s", v.SowID)
	}
}
