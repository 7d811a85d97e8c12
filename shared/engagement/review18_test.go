package engagement_test

// Regressions of the issue 18 review of the engagement service
// (helpers/review18/engagements.md): each test failed before its fix.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/engagement"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/sow"
)

// formBytes is form() returning the fully signed bytes as well.
func (w *world) formBytes(tmpl map[string]any) (map[string]any, []byte) {
	w.t.Helper()
	ctx := context.Background()
	if _, err := w.svc.FileProposal(ctx, w.sign(clone(w.t, tmpl), sow.RoleProvider, w.pOwner)); err != nil {
		w.t.Fatalf("file: %v", err)
	}
	inst := w.instance(tmpl)
	if _, err := w.svc.Countersign(ctx, w.sign(inst, sow.RoleClient, w.cOwner), nil); err != nil {
		w.t.Fatalf("countersign: %v", err)
	}
	raw := w.sign(inst, sow.RoleProvider, w.pOwner)
	if _, err := w.svc.Sign(ctx, raw); err != nil {
		w.t.Fatalf("sign: %v", err)
	}
	return inst, raw
}

func hexSum(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Finding 1: an ended engagement's formation bytes (public) replayed to
// Sign never re-mirror its terms over its live successor's.
func TestStaleMirrorReplay(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	key := commerce.EngagementKey(w.provider.Public(), w.client.Public(), "summarize")
	_, rawA := w.formBytes(w.template())
	if _, err := w.svc.Terminate(ctx, w.act(engagement.TagTerminate, w.cOwner, map[string]any{"version": 1, "for_cause": true, "reason": "Moving on."})); err != nil {
		t.Fatal(err)
	}
	second := w.template()
	second["id"] = "sow_test0000000002"
	w.formBytes(second)
	if got := w.terms.terms(t, key); got.SowID != "sow_test0000000002" || !got.InForce(w.clock.Now()) {
		t.Fatalf("B not mirrored: %+v", got)
	}
	// The same formation again answers the record and writes nothing.
	if _, err := w.svc.Sign(ctx, rawA); err != nil {
		t.Fatalf("A's own formation again: %v", err)
	}
	// Even a direct mirror of A (the job) leaves B's key alone.
	if err := w.svc.Mirror(ctx, engagement.RecordID(w.client.Public(), w.provider.Public(), "sow_test0000000001")); err != nil {
		t.Fatal(err)
	}
	if got := w.terms.terms(t, key); got.SowID != "sow_test0000000002" || !got.InForce(w.clock.Now()) {
		t.Fatalf("the live engagement's terms were replaced: %+v", got)
	}
	// Other agreed bytes under a formed record are refused.
	v2 := amended(t, w.instance(w.template()), 2, nil)
	w.sign(v2, sow.RoleClient, w.cOwner)
	_, err := w.svc.Sign(ctx, w.sign(v2, sow.RoleProvider, w.pOwner))
	refused(t, err, errs.Conflict, "other agreed bytes under a formed record")
}

// Finding 3: an amendment cannot be approved once the engagement is
// terminated or lapsed; the open proposal closes.
func TestApproveOnlyInForce(t *testing.T) {
	ctx := context.Background()
	t.Run("after a termination", func(t *testing.T) {
		w := newWorld(t)
		agreed := w.form(w.template())
		v2 := amended(t, agreed, 2, func(d map[string]any) { d["ends_at"] = "2030-01-01T00:00:00Z" })
		if _, err := w.svc.Propose(ctx, w.sign(v2, sow.RoleClient, w.cOwner)); err != nil {
			t.Fatal(err)
		}
		rec, err := w.svc.Terminate(ctx, w.act(engagement.TagTerminate, w.pOwner, map[string]any{"version": 1, "for_cause": true, "reason": "Abuse."}))
		if err != nil || rec.Open != nil {
			t.Fatalf("terminate: %v, open %+v", err, rec)
		}
		_, err = w.svc.Approve(ctx, w.sign(v2, sow.RoleProvider, w.pOwner))
		refused(t, err, errs.Conflict, "approval after a termination")
		if v := w.view(); v.Version != 1 || v.Open != nil || v.State != sow.StateTerminated {
			t.Fatalf("record: v%d %s open %+v", v.Version, v.State, v.Open)
		}
	})
	t.Run("after the lapse", func(t *testing.T) {
		w := newWorld(t)
		tmpl := w.template()
		if _, err := w.svc.FileProposal(ctx, w.sign(clone(t, tmpl), sow.RoleProvider, w.pOwner)); err != nil {
			t.Fatal(err)
		}
		inst := w.instance(tmpl)
		inst["ends_at"] = w.clock.Now().Add(48 * time.Hour).Format(time.RFC3339)
		if _, err := w.svc.Countersign(ctx, w.sign(inst, sow.RoleClient, w.cOwner), nil); err != nil {
			t.Fatal(err)
		}
		if _, err := w.svc.Sign(ctx, w.sign(inst, sow.RoleProvider, w.pOwner)); err != nil {
			t.Fatal(err)
		}
		w.clock.Advance(24 * time.Hour)
		v2 := amended(t, inst, 2, func(d map[string]any) { d["ends_at"] = "2030-01-01T00:00:00Z" })
		if _, err := w.svc.Propose(ctx, w.sign(v2, sow.RoleClient, w.cOwner)); err != nil {
			t.Fatal(err)
		}
		w.clock.Advance(72 * time.Hour) // ended at +48h, inside the window
		_, err := w.svc.Approve(ctx, w.sign(v2, sow.RoleProvider, w.pOwner))
		refused(t, err, errs.Conflict, "approval after the end")
		v := w.view()
		if v.State != sow.StateLapsed || v.Open != nil {
			t.Fatalf("state %s open %+v", v.State, v.Open)
		}
		last := v.History[len(v.History)-1]
		if last.Kind != engagement.EventLapsed || !strings.Contains(last.Reason, "ended") || last.At != "2026-09-03T12:00:00.000000000Z" {
			t.Fatalf("the proposal did not close at the end: %+v", last)
		}
	})
}

// Finding 4: a denial is bound to the exact proposal it answers; replayed
// against another proposal at the same version it is refused.
func TestResolutionBoundToProposal(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	agreed := w.form(w.template())
	p1 := w.sign(amended(t, agreed, 2, func(d map[string]any) { d["ends_at"] = "2030-01-01T00:00:00Z" }), sow.RoleProvider, w.pOwner)
	if _, err := w.svc.Propose(ctx, p1); err != nil {
		t.Fatal(err)
	}
	deny := w.act(engagement.TagAmendment, w.cOwner, map[string]any{"version": 2, "act": "deny", "reason": "Too long."})
	if _, err := w.svc.Resolve(ctx, deny); err != nil {
		t.Fatal(err)
	}
	w.clock.Advance(5 * time.Minute)
	p2 := amended(t, agreed, 2, func(d map[string]any) { d["ends_at"] = "2027-01-01T00:00:00Z" })
	if _, err := w.svc.Propose(ctx, w.sign(p2, sow.RoleProvider, w.pOwner)); err != nil {
		t.Fatal(err)
	}
	_, err := w.svc.Resolve(ctx, deny)
	refused(t, err, errs.Conflict, "the old denial replayed against a new proposal")
	if v := w.view(); v.Open == nil {
		t.Fatal("the new proposal was closed by the replay")
	}
	// The proposer withdraws p2, then proposes p1's exact bytes again: the
	// first denial (bound to those bytes) still answers once only.
	if _, err := w.svc.Resolve(ctx, w.act(engagement.TagAmendment, w.pOwner, map[string]any{"version": 2, "act": "withdraw"})); err != nil {
		t.Fatal(err)
	}
	if _, err := w.svc.Propose(ctx, p1); err != nil {
		t.Fatal(err)
	}
	_, err = w.svc.Resolve(ctx, deny)
	refused(t, err, errs.Conflict, "a denial recorded once, replayed")
	_, err = w.svc.Resolve(ctx, w.act(engagement.TagAmendment, w.cOwner, map[string]any{"version": 2, "act": "deny", "reason": "x", "proposal_sha256": hexSum([]byte("other"))}))
	refused(t, err, errs.Conflict, "a denial of other bytes")
}

// Finding 2: terminations and lapses are always recorded; the acts a party
// can repeat are bounded instead, and the record stays readable.
func TestTerminationNeverRefusedByQuota(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	agreed := w.form(w.template())
	p := w.sign(amended(t, agreed, 2, nil), sow.RoleProvider, w.pOwner)
	n := 0
	for ; ; n++ {
		_, err := w.svc.Propose(ctx, p)
		if errs.CodeOf(err) == errs.QuotaExceeded {
			break
		}
		if err != nil {
			t.Fatalf("propose %d: %v", n, err)
		}
		w.clock.Advance(time.Second) // a new withdrawal is a new signature
		if _, err := w.svc.Resolve(ctx, w.act(engagement.TagAmendment, w.pOwner, map[string]any{"version": 2, "act": "withdraw"})); err != nil {
			t.Fatalf("withdraw %d: %v", n, err)
		}
	}
	if n != engagement.MaxProposals {
		t.Fatalf("%d proposals before QUOTA_EXCEEDED, want %d", n, engagement.MaxProposals)
	}
	// The record stays readable, a page at a time.
	v := w.view()
	if len(v.History) != engagement.DefaultPage || v.HistoryTotal != 2+2*engagement.MaxProposals || v.HistoryNext != engagement.DefaultPage {
		t.Fatalf("history page: %d entries of %d, next %d", len(v.History), v.HistoryTotal, v.HistoryNext)
	}
	if f := v.History[1]; f.Kind != engagement.EventFormed || f.Signed != "" || f.SignedSHA256 != hexSum([]byte(v.Document)) || !strings.HasSuffix(f.Link, "/summarize?event=2") {
		t.Fatalf("a document event is given by digest and link: %+v", f)
	}
	if wd := v.History[3]; wd.Kind != engagement.EventWithdrawn || wd.Signed == "" {
		t.Fatalf("a signed act is given inline: %+v", wd)
	}
	last, err := w.svc.EngagementPage(ctx, w.client.Public(), w.provider.Public(), "summarize", engagement.Page{HistoryAfter: 400, HistoryLimit: 10})
	if err != nil || len(last.History) != 2 || last.History[0].Seq != 401 || last.HistoryNext != 0 {
		t.Fatalf("the last page: %v %+v", err, last)
	}
	ev, err := w.svc.EventOf(ctx, w.client.Public(), w.provider.Public(), "summarize", 2)
	if err != nil || ev.Signed != v.Document || ev.Link != "" {
		t.Fatalf("event 2: %v %+v", err, ev)
	}
	_, err = w.svc.EventOf(ctx, w.client.Public(), w.provider.Public(), "summarize", 999)
	refused(t, err, errs.NotFound, "an event past the history")
	if _, err := w.svc.Terminate(ctx, w.act(engagement.TagTerminate, w.cOwner, map[string]any{"version": 1, "for_cause": true, "reason": "Fraud."})); err != nil {
		t.Fatalf("the client cannot terminate: %v", err)
	}
	if v := w.view(); v.InForce || v.State != sow.StateTerminated {
		t.Fatalf("after the termination: %s %v", v.State, v.InForce)
	}
}

// Finding 2: re-countersigns are bounded per record.
func TestCountersignQuota(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	tmpl := w.template()
	if _, err := w.svc.FileProposal(ctx, w.sign(clone(t, tmpl), sow.RoleProvider, w.pOwner)); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < engagement.MaxRequests; i++ {
		w.clock.Advance(time.Second) // another signed_at: other bytes
		if _, err := w.svc.Countersign(ctx, w.sign(w.instance(tmpl), sow.RoleClient, w.cOwner), nil); err != nil {
			t.Fatalf("countersign %d: %v", i, err)
		}
	}
	w.clock.Advance(time.Second)
	_, err := w.svc.Countersign(ctx, w.sign(w.instance(tmpl), sow.RoleClient, w.cOwner), nil)
	refused(t, err, errs.QuotaExceeded, "a countersign past the bound")
}

// Finding 10: a countersign that never forms does not hide the previous
// engagement's record (its for-cause termination included).
func TestCountersignKeepsPublicRecord(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	w.form(w.template())
	if _, err := w.svc.Terminate(ctx, w.act(engagement.TagTerminate, w.pOwner, map[string]any{"version": 1, "for_cause": true, "reason": "Client abused the service."})); err != nil {
		t.Fatal(err)
	}
	second := w.template()
	second["id"] = "sow_test0000000002"
	if _, err := w.svc.FileProposal(ctx, w.sign(clone(t, second), sow.RoleProvider, w.pOwner)); err != nil {
		t.Fatal(err)
	}
	inst := w.instance(second)
	if _, err := w.svc.Countersign(ctx, w.sign(inst, sow.RoleClient, w.cOwner), nil); err != nil {
		t.Fatal(err)
	}
	if v := w.view(); v.SowID != "sow_test0000000001" || v.Termination == nil {
		t.Fatalf("the record now shows %s (%s)", v.SowID, v.State)
	}
	// Formation re-points it.
	if _, err := w.svc.Sign(ctx, w.sign(inst, sow.RoleProvider, w.pOwner)); err != nil {
		t.Fatal(err)
	}
	if v := w.view(); v.SowID != "sow_test0000000002" || v.State != sow.StateActive {
		t.Fatalf("after formation: %s %s", v.SowID, v.State)
	}
}

// Finding 11: a request to form lapses after the review window, and the
// client can withdraw it (signed, bound to its bytes).
func TestRequestLapsesAndWithdraws(t *testing.T) {
	ctx := context.Background()
	t.Run("lapse", func(t *testing.T) {
		w := newWorld(t)
		tmpl := w.template()
		if _, err := w.svc.FileProposal(ctx, w.sign(clone(t, tmpl), sow.RoleProvider, w.pOwner)); err != nil {
			t.Fatal(err)
		}
		inst := w.instance(tmpl)
		if _, err := w.svc.Countersign(ctx, w.sign(inst, sow.RoleClient, w.cOwner), nil); err != nil {
			t.Fatal(err)
		}
		if v := w.view(); v.State != engagement.StateRequested {
			t.Fatalf("state before formation: %s", v.State)
		}
		w.clock.Advance(7 * 24 * time.Hour)
		if v := w.view(); v.State != engagement.StateRequestLapsed {
			t.Fatalf("state after the window: %s", v.State)
		}
		_, err := w.svc.Sign(ctx, w.sign(inst, sow.RoleProvider, w.pOwner))
		refused(t, err, errs.Conflict, "forming from a lapsed request")
	})
	t.Run("withdraw", func(t *testing.T) {
		w := newWorld(t)
		tmpl := w.template()
		if _, err := w.svc.FileProposal(ctx, w.sign(clone(t, tmpl), sow.RoleProvider, w.pOwner)); err != nil {
			t.Fatal(err)
		}
		inst := w.instance(tmpl)
		req := w.sign(inst, sow.RoleClient, w.cOwner)
		if _, err := w.svc.Countersign(ctx, req, nil); err != nil {
			t.Fatal(err)
		}
		_, err := w.svc.WithdrawRequest(ctx, w.act(engagement.TagRequestWithdraw, w.pOwner, map[string]any{"request_sha256": hexSum(req)}))
		refused(t, err, errs.Forbidden, "the provider withdrawing the client's request")
		_, err = w.svc.WithdrawRequest(ctx, w.act(engagement.TagRequestWithdraw, w.cOwner, map[string]any{"request_sha256": hexSum([]byte("x"))}))
		refused(t, err, errs.Conflict, "a withdrawal of other bytes")
		wd := w.act(engagement.TagRequestWithdraw, w.cOwner, map[string]any{"request_sha256": hexSum(req)})
		if _, err := w.svc.WithdrawRequest(ctx, wd); err != nil {
			t.Fatal(err)
		}
		if _, err := w.svc.WithdrawRequest(ctx, wd); err != nil {
			t.Fatalf("the same withdrawal again: %v", err)
		}
		if v := w.view(); v.State != engagement.StateRequestWithdrawn {
			t.Fatalf("state: %s", v.State)
		}
		_, err = w.svc.Sign(ctx, w.sign(inst, sow.RoleProvider, w.pOwner))
		refused(t, err, errs.Conflict, "forming from a withdrawn request")
		// A new countersign asks anew, and forms.
		w.clock.Advance(time.Second)
		inst = w.instance(tmpl)
		if _, err := w.svc.Countersign(ctx, w.sign(inst, sow.RoleClient, w.cOwner), nil); err != nil {
			t.Fatal(err)
		}
		if _, err := w.svc.Sign(ctx, w.sign(inst, sow.RoleProvider, w.pOwner)); err != nil {
			t.Fatal(err)
		}
	})
}

// Finding 8: the clauses the service computes instants from are bounded.
func TestClockClauseBounds(t *testing.T) {
	ctx := context.Background()
	for name, change := range map[string]func(d map[string]any){
		"notice": func(d map[string]any) {
			d["termination"] = map[string]any{"convenience_notice_hours": 3000000, "grade": "recorded"}
		},
		"window":  func(d map[string]any) { d["change_control"].(map[string]any)["review_window_days"] = 200000 },
		"term":    func(d map[string]any) { d["term_months"] = 100000 },
		"at most": nil,
	} {
		t.Run(name, func(t *testing.T) {
			w := newWorld(t)
			d := w.template()
			if change == nil {
				d["termination"] = map[string]any{"convenience_notice_hours": engagement.MaxNoticeHours, "grade": "recorded"}
				w.form(d)
				rec, err := w.svc.Terminate(ctx, w.act(engagement.TagTerminate, w.cOwner, map[string]any{"version": 1, "for_cause": false}))
				if err != nil || rec.Termination.EffectiveAt <= rec.Termination.RecordedAt {
					t.Fatalf("the longest notice: %v %+v", err, rec.Termination)
				}
				if v := w.view(); !v.InForce {
					t.Fatal("the longest notice took effect at once")
				}
				return
			}
			change(d)
			_, err := w.svc.FileProposal(ctx, w.sign(d, sow.RoleProvider, w.pOwner))
			refused(t, err, errs.InvalidRequest, name)
		})
	}
}

// Findings 5, 6, 7: what this runtime grades enforced is what it does.
func TestEnforcedSetTruthful(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		skus   bool
		change func(d map[string]any)
		bad    string // the clause refused, "" accepted
	}{
		{name: "price no_charge enforced", skus: true, change: func(d map[string]any) { d["price"].(map[string]any)["grade"] = "enforced" }, bad: "price"},
		{name: "termination enforced", skus: true, change: func(d map[string]any) { d["termination"].(map[string]any)["grade"] = "enforced" }, bad: "termination"},
		{name: "scope enforced, no SKU", change: func(d map[string]any) { d["scope"].(map[string]any)["grade"] = "enforced" }, bad: "scope"},
		{name: "scope enforced, a SKU", skus: true, change: func(d map[string]any) { d["scope"].(map[string]any)["grade"] = "enforced" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			w.dir.set(w.provider.Public(), engagement.AgentInfo{Owner: w.pOwner.Public(), Offerings: []string{"summarize", "translate"}, SKUs: tc.skus})
			d := w.template()
			tc.change(d)
			_, err := w.svc.FileProposal(ctx, w.sign(d, sow.RoleProvider, w.pOwner))
			if tc.bad == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			refused(t, err, errs.Forbidden, tc.name)
			if e, _ := err.(*errs.Error); e == nil || !strings.Contains(e.Message, tc.bad) {
				t.Fatalf("refusal does not name %s: %v", tc.bad, err)
			}
		})
	}
	// Approval judges the enforced set again: the provider dropped its SKUs.
	w := newWorld(t)
	w.dir.set(w.provider.Public(), engagement.AgentInfo{Owner: w.pOwner.Public(), Offerings: []string{"summarize"}, SKUs: true})
	agreed := w.form(w.template())
	v2 := amended(t, agreed, 2, func(d map[string]any) { d["volume"] = map[string]any{"per_hour": 5, "grade": "enforced"} })
	if _, err := w.svc.Propose(ctx, w.sign(v2, sow.RoleProvider, w.pOwner)); err != nil {
		t.Fatal(err)
	}
	w.dir.set(w.provider.Public(), engagement.AgentInfo{Owner: w.pOwner.Public(), Offerings: []string{"summarize"}})
	_, err := w.svc.Approve(ctx, w.sign(v2, sow.RoleClient, w.cOwner))
	refused(t, err, errs.Forbidden, "approving volume enforced once the provider has no SKU")
}

// Finding 7: the scopes graded enforced are mirrored for admission, and
// leave the list when the engagement ends.
func TestScopeMirrored(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	w.dir.set(w.provider.Public(), engagement.AgentInfo{Owner: w.pOwner.Public(), Offerings: []string{"summarize", "translate"}, SKUs: true})
	d := w.template()
	d["scope"].(map[string]any)["grade"] = "enforced"
	w.form(d)
	key := commerce.EngagementScopeKey(w.provider.Public(), w.client.Public())
	var list []commerce.EngagementTerms
	w.terms.mu.Lock()
	raw := w.terms.vals[key]
	w.terms.mu.Unlock()
	if err := json.Unmarshal(raw, &list); err != nil || len(list) != 1 || list[0].SowID != "sow_test0000000001" || len(list[0].Offerings) != 1 || list[0].Offerings[0] != "summarize" {
		t.Fatalf("scope list: %s %v", raw, err)
	}
	if _, err := w.svc.Terminate(ctx, w.act(engagement.TagTerminate, w.cOwner, map[string]any{"version": 1, "for_cause": true, "reason": "Done."})); err != nil {
		t.Fatal(err)
	}
	w.terms.mu.Lock()
	_, still := w.terms.vals[key]
	w.terms.mu.Unlock()
	if still {
		t.Fatal("an ended engagement's scope is still mirrored")
	}
	// Graded evidence, the scope is not mirrored at all.
	w2 := newWorld(t)
	w2.form(w2.template())
	w2.terms.mu.Lock()
	_, there := w2.terms.vals[commerce.EngagementScopeKey(w2.provider.Public(), w2.client.Public())]
	w2.terms.mu.Unlock()
	if there {
		t.Fatal("a scope graded evidence is mirrored")
	}
}

// Finding 9: reviews are read a page at a time, in the order stored.
func TestReviewsPaged(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	w.form(w.template())
	for i := 0; i < 3; i++ {
		w.clock.Advance(time.Second)
		if _, _, err := w.svc.AddReview(ctx, w.act(engagement.TagReview, w.cOwner, map[string]any{"verdict": "accepted", "task_id": "t-" + string(rune('a'+i))})); err != nil {
			t.Fatal(err)
		}
	}
	page := func(after int) *engagement.View {
		v, err := w.svc.EngagementPage(ctx, w.client.Public(), w.provider.Public(), "summarize", engagement.Page{ReviewsAfter: after, ReviewsLimit: 2})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	first := page(0)
	if len(first.Reviews) != 2 || first.Reviews[0].TaskID != "t-a" || first.ReviewsTotal != 3 || first.ReviewsNext != 2 {
		t.Fatalf("first page: %+v next %d", first.Reviews, first.ReviewsNext)
	}
	if second := page(first.ReviewsNext); len(second.Reviews) != 1 || second.Reviews[0].TaskID != "t-c" || second.ReviewsNext != 0 {
		t.Fatalf("second page: %+v next %d", second.Reviews, second.ReviewsNext)
	}
}
