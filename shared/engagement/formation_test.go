package engagement_test

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/engagement"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/sow"
)

// Formation is two steps (§12.1): the client's countersign over the
// completed instance, then the provider's fresh instance signature. Only
// then is it agreed, its bytes kept exactly, and its terms mirrored under
// every offering in scope.
func TestFormation(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	tmpl := w.template()
	tmpl["scope"].(map[string]any)["offerings"] = []any{"summarize", "translate"}
	if _, err := w.svc.FileProposal(ctx, w.sign(clone(t, tmpl), sow.RoleProvider, w.pOwner)); err != nil {
		t.Fatal(err)
	}
	inst := w.instance(tmpl)
	countersigned := w.sign(inst, sow.RoleClient, w.cOwner)
	rec, err := w.svc.Countersign(ctx, countersigned, nil)
	if err != nil || rec.Formed() {
		t.Fatalf("countersign: %v", err)
	}
	if v := w.view(); v.State != engagement.StateRequested || v.InForce || v.Requested != string(countersigned) || v.Document != "" {
		t.Fatalf("after the countersign: %+v", v)
	}
	if w.terms.terms(t, commerce.EngagementKey(w.provider.Public(), w.client.Public(), "summarize")) != nil {
		t.Fatal("terms mirrored before the provider's instance signature")
	}
	// The countersign again is the same request.
	if _, err := w.svc.Countersign(ctx, countersigned, nil); err != nil {
		t.Fatalf("the same countersign again: %v", err)
	}
	agreed := w.sign(inst, sow.RoleProvider, w.pOwner)
	if rec, err = w.svc.Sign(ctx, agreed); err != nil || !rec.Formed() || rec.MirrorPending {
		t.Fatalf("sign: %v formed %v pending %v", err, rec.Formed(), rec.MirrorPending)
	}
	v := w.view()
	if v.State != sow.StateActive || !v.InForce || v.Document != string(agreed) || v.Version != 1 || v.Requested != "" {
		t.Fatalf("formed: %+v", v)
	}
	if v.Owners.Provider != w.pOwner.Public() || v.Owners.Client != w.cOwner.Public() {
		t.Fatalf("owners: %+v", v.Owners)
	}
	for _, o := range []string{"summarize", "translate"} {
		got := w.terms.terms(t, commerce.EngagementKey(w.provider.Public(), w.client.Public(), o))
		if got == nil || got.SowID != "sow_test0000000001" || got.Version != 1 || got.ClientOwner != w.cOwner.Public() ||
			!slices.Equal(got.Offerings, []string{"summarize", "translate"}) || got.Volume != nil || !got.InForce(w.clock.Now()) {
			t.Fatalf("terms under %s: %+v", o, got)
		}
		if _, err := w.svc.Engagement(ctx, w.client.Public(), w.provider.Public(), o); err != nil {
			t.Fatalf("the record under %s: %v", o, err)
		}
	}
	// Signing again is idempotent; a second countersign is refused.
	if _, err := w.svc.Sign(ctx, agreed); err != nil {
		t.Fatalf("the same instance signature again: %v", err)
	}
	_, err = w.svc.Countersign(ctx, countersigned, nil)
	refused(t, err, errs.Conflict, "a countersign after formation")
	// Before starts_at it is agreed, not active.
	w2 := newWorld(t)
	tm := w2.template()
	_, _ = w2.svc.FileProposal(ctx, w2.sign(clone(t, tm), sow.RoleProvider, w2.pOwner))
	in := w2.instance(tm)
	in["starts_at"] = w2.clock.Now().Add(48 * time.Hour).Format(time.RFC3339)
	_, _ = w2.svc.Countersign(ctx, w2.sign(in, sow.RoleClient, w2.cOwner), nil)
	if _, err := w2.svc.Sign(ctx, w2.sign(in, sow.RoleProvider, w2.pOwner)); err != nil {
		t.Fatal(err)
	}
	if v := w2.view(); v.State != sow.StateAgreed || v.InForce {
		t.Fatalf("before starts_at: %s in force %v", v.State, v.InForce)
	}
}

// Filing a standing proposal: a template signed by the provider seat's
// owner, naming only offerings the provider publishes, grading enforced
// only what this runtime enforces.
func TestFileProposalRefusals(t *testing.T) {
	for _, tc := range []struct {
		name    string
		change  func(w *world, d map[string]any)
		signer  func(w *world) *keyed
		code    errs.Code
		detail  string
		message string
	}{
		{name: "the client seat filled", change: func(w *world, d map[string]any) {
			d["parties"].(map[string]any)["client"] = map[string]any{"agent": w.client.Public(), "owner": "C"}
			d["starts_at"], d["ends_at"] = epoch.Format(time.RFC3339), epoch.AddDate(0, 1, 0).Format(time.RFC3339)
		}, code: errs.InvalidRequest},
		{name: "signed by someone not the provider's owner", signer: func(w *world) *keyed { return &keyed{w.sOwner, sow.RoleProvider} }, code: errs.Forbidden},
		{name: "signed as client", signer: func(w *world) *keyed { return &keyed{w.pOwner, sow.RoleClient} }, code: errs.InvalidRequest},
		{name: "an offering the provider does not publish", change: func(w *world, d map[string]any) {
			d["scope"].(map[string]any)["offerings"] = []any{"summarize", "forge"}
		}, code: errs.InvalidRequest},
		{name: "an offering id that is no bus token", change: func(w *world, d map[string]any) {
			w.dir.set(w.provider.Public(), engagement.AgentInfo{Owner: w.pOwner.Public(), Offerings: []string{"summarize.all"}})
			d["scope"].(map[string]any)["offerings"] = []any{"summarize.all"}
		}, code: errs.InvalidRequest, message: "letters, digits"},
		{name: "price fixed_fee enforced", change: func(w *world, d map[string]any) {
			d["price"] = map[string]any{"arrangement": "fixed_fee", "currency": "XCR", "rates": []any{map[string]any{"offering": "summarize", "per_task": 100}}, "grade": "enforced"}
		}, code: errs.Forbidden, detail: "price"},
		{name: "volume enforced, no SKU", change: func(w *world, d map[string]any) {
			d["volume"] = map[string]any{"per_hour": 5, "grade": "enforced"}
		}, code: errs.Forbidden, detail: "volume"},
		{name: "sealed transport enforced", change: func(w *world, d map[string]any) {
			d["confidentiality"] = map[string]any{"transport": map[string]any{"sealed": true, "grade": "enforced"}}
		}, code: errs.Forbidden, detail: "confidentiality.transport"},
		{name: "retention enforced", change: func(w *world, d map[string]any) {
			d["confidentiality"] = map[string]any{"retention": map[string]any{"max_days": 30, "grade": "enforced"}}
		}, code: errs.Forbidden, detail: "confidentiality.retention"},
		{name: "amendments by a person", change: func(w *world, d map[string]any) {
			d["change_control"] = map[string]any{"review_window_days": 7, "grade": "enforced"}
		}, code: errs.Forbidden, detail: "change_control"},
		{name: "inputs (enforced by definition)", change: func(w *world, d map[string]any) {
			d["inputs"] = []any{map[string]any{"name": "filing", "media_type": "application/pdf", "when": "per_task"}}
		}, code: errs.Forbidden, detail: "inputs"},
		{name: "the provider unregistered", change: func(w *world, d map[string]any) {
			w.dir.mu.Lock()
			delete(w.dir.agents, w.provider.Public())
			w.dir.mu.Unlock()
		}, code: errs.Forbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			d := w.template()
			if tc.change != nil {
				tc.change(w, d)
			}
			k := &keyed{w.pOwner, sow.RoleProvider}
			if tc.signer != nil {
				k = tc.signer(w)
			}
			_, err := w.svc.FileProposal(context.Background(), w.sign(d, k.role, k.key))
			refused(t, err, tc.code, tc.name)
			if !strings.Contains(err.Error(), tc.message) {
				t.Fatalf("refusal %q does not say %q", err, tc.message)
			}
			if tc.detail != "" {
				got, _ := errs.As(err).Details["unenforceable"].([]string)
				if !slices.Contains(got, tc.detail) {
					t.Fatalf("unenforceable %v, want %s named", got, tc.detail)
				}
			}
		})
	}
}

type keyed struct {
	key interface {
		Public() string
		Sign([]byte) []byte
	}
	role string
}

// Volume graded enforced is enforceable once the provider publishes a
// SKU (its node then asks admission, which counts it), and mirrored.
func TestVolumeWithSKU(t *testing.T) {
	w := newWorld(t)
	w.dir.set(w.provider.Public(), engagement.AgentInfo{Owner: w.pOwner.Public(), Offerings: []string{"summarize"}, SKUs: true})
	d := w.template()
	d["volume"] = map[string]any{"per_hour": 5, "per_day": 20, "grade": "enforced"}
	w.form(d)
	got := w.terms.terms(t, commerce.EngagementKey(w.provider.Public(), w.client.Public(), "summarize"))
	if got == nil || got.Volume == nil || got.Volume.PerHour != 5 || got.Volume.PerDay != 20 {
		t.Fatalf("terms: %+v", got)
	}
	// Graded evidence, volume is no refusal and not mirrored as a limit.
	w2 := newWorld(t)
	d2 := w2.template()
	d2["volume"] = map[string]any{"per_hour": 5, "grade": "evidence"}
	w2.form(d2)
	if got := w2.terms.terms(t, commerce.EngagementKey(w2.provider.Public(), w2.client.Public(), "summarize")); got.Volume != nil {
		t.Fatalf("an evidence-graded volume mirrored as a limit: %+v", got.Volume)
	}
}

// The countersign's gates.
func TestCountersignRefusals(t *testing.T) {
	for _, tc := range []struct {
		name  string
		tmpl  func(w *world, d map[string]any)
		inst  func(w *world, d map[string]any)
		as    []string
		owner func(w *world) *keyed
		code  errs.Code
		qual  string
	}{
		{name: "a changed term", inst: func(w *world, d map[string]any) {
			d["termination"] = map[string]any{"convenience_notice_hours": 0, "grade": "recorded"}
		}, code: errs.InvalidRequest},
		{name: "starts in the past", inst: func(w *world, d map[string]any) {
			d["starts_at"] = epoch.Add(-24 * time.Hour).Format(time.RFC3339)
		}, code: errs.InvalidRequest},
		{name: "signed by someone not the client's owner", owner: func(w *world) *keyed { return &keyed{w.sOwner, sow.RoleClient} }, code: errs.Forbidden},
		{name: "directed to another agent", tmpl: func(w *world, d map[string]any) {
			d["parties"].(map[string]any)["offered_to"] = map[string]any{"agent": w.stranger.Public(), "owner": "S", "expires_at": epoch.Add(time.Hour).Format(time.RFC3339), "grade": "enforced"}
		}, code: errs.Forbidden},
		{name: "directed, lapsed", tmpl: func(w *world, d map[string]any) {
			d["parties"].(map[string]any)["offered_to"] = map[string]any{"agent": w.client.Public(), "owner": "C", "expires_at": epoch.Format(time.RFC3339), "grade": "enforced"}
		}, code: errs.Forbidden},
		{name: "publishes_offering unmet", tmpl: func(w *world, d map[string]any) {
			d["qualifications"] = []any{map[string]any{"id": "sells-books", "kind": "publishes_offering", "offering": "books", "statement": "You sell books.", "grade": "enforced"}}
		}, code: errs.Forbidden, qual: "sells-books"},
		{name: "platform_account unmet", tmpl: func(w *world, d map[string]any) {
			d["qualifications"] = []any{map[string]any{"id": "has-account", "kind": "platform_account", "statement": "Your agent belongs to an account here.", "grade": "enforced"}}
		}, code: errs.Forbidden, qual: "has-account"},
		{name: "an assertion missing", tmpl: func(w *world, d map[string]any) {
			d["qualifications"] = []any{map[string]any{"id": "licensed", "kind": "asserted", "statement": "You hold a licence.", "grade": "evidence"}}
		}, code: errs.Forbidden, qual: "licensed"},
		{name: "an assertion the offer does not ask", as: []string{"anything"}, code: errs.InvalidRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			ctx := context.Background()
			d := w.template()
			if tc.tmpl != nil {
				tc.tmpl(w, d)
			}
			if _, err := w.svc.FileProposal(ctx, w.sign(clone(t, d), sow.RoleProvider, w.pOwner)); err != nil {
				t.Fatal(err)
			}
			in := w.instance(d)
			if tc.inst != nil {
				tc.inst(w, in)
			}
			k := &keyed{w.cOwner, sow.RoleClient}
			if tc.owner != nil {
				k = tc.owner(w)
			}
			_, err := w.svc.Countersign(ctx, w.sign(in, k.role, k.key), tc.as)
			refused(t, err, tc.code, tc.name)
			if tc.qual != "" && errs.As(err).Details["qualification"] != tc.qual {
				t.Fatalf("refusal names %v, want %s", errs.As(err).Details, tc.qual)
			}
		})
	}
}

// The gates pass when met: the named counterparty forms once, the
// conditions hold, the assertion is made.
func TestCountersignGatesMet(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	w.accounts[w.client.Public()] = true
	d := w.template()
	d["parties"].(map[string]any)["offered_to"] = map[string]any{"agent": w.client.Public(), "owner": "C", "expires_at": epoch.Add(time.Hour).Format(time.RFC3339), "grade": "enforced"}
	d["qualifications"] = []any{
		map[string]any{"id": "registered", "kind": "mesh_registration", "statement": "Registered here.", "grade": "enforced"},
		map[string]any{"id": "buys", "kind": "publishes_offering", "offering": "buy", "statement": "You publish buy.", "grade": "enforced"},
		map[string]any{"id": "has-account", "kind": "platform_account", "statement": "An account here.", "grade": "enforced"},
		map[string]any{"id": "licensed", "kind": "asserted", "statement": "You hold a licence.", "grade": "evidence"},
	}
	if _, err := w.svc.FileProposal(ctx, w.sign(clone(t, d), sow.RoleProvider, w.pOwner)); err != nil {
		t.Fatal(err)
	}
	in := w.instance(d)
	if _, err := w.svc.Countersign(ctx, w.sign(in, sow.RoleClient, w.cOwner), []string{"licensed"}); err != nil {
		t.Fatal(err)
	}
	agreed := w.sign(in, sow.RoleProvider, w.pOwner)
	if _, err := w.svc.Sign(ctx, agreed); err != nil {
		t.Fatal(err)
	}
	if v := w.view(); !v.InForce || !bytes.Equal([]byte(v.Document), agreed) {
		t.Fatalf("formed: %+v", v)
	}
}

// The provider's instance signature must be over the bytes countersigned,
// by the provider's owner.
func TestSignRefusals(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	d := w.template()
	if _, err := w.svc.FileProposal(ctx, w.sign(clone(t, d), sow.RoleProvider, w.pOwner)); err != nil {
		t.Fatal(err)
	}
	in := w.instance(d)
	_, err := w.svc.Sign(ctx, w.sign(clone(t, w.instance(d)), sow.RoleProvider, w.pOwner))
	refused(t, err, errs.InvalidRequest, "one signature only")
	in2 := clone(t, in)
	w.sign(in2, sow.RoleClient, w.cOwner)
	_, err = w.svc.Sign(ctx, w.sign(in2, sow.RoleProvider, w.pOwner))
	refused(t, err, errs.NotFound, "no countersign on file")
	if _, err := w.svc.Countersign(ctx, w.sign(in, sow.RoleClient, w.cOwner), nil); err != nil {
		t.Fatal(err)
	}
	other := clone(t, in)
	delete(other, "signatures")
	other["ends_at"] = epoch.AddDate(0, 2, 0).Format(time.RFC3339)
	w.sign(other, sow.RoleClient, w.cOwner)
	_, err = w.svc.Sign(ctx, w.sign(other, sow.RoleProvider, w.pOwner))
	refused(t, err, errs.InvalidRequest, "other bytes than countersigned")
	_, err = w.svc.Sign(ctx, w.sign(clone(t, in), sow.RoleProvider, w.sOwner))
	refused(t, err, errs.Forbidden, "signed by a stranger")
}

// A standing proposal withdrawn by the owner key that signed it forms
// nothing more: neither a new countersign nor one awaiting the provider's
// signature; the engagement formed before stands.
func TestWithdrawProposal(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	tmpl := w.template()
	w.form(tmpl)
	// A second client countersigns; then the provider withdraws.
	other, otherOwner := newKey(t), newKey(t)
	w.dir.set(other.Public(), engagement.AgentInfo{Owner: otherOwner.Public()})
	in := w.instance(tmpl)
	in["parties"].(map[string]any)["client"] = map[string]any{"agent": other.Public(), "owner": "Other"}
	if _, err := w.svc.Countersign(ctx, w.sign(in, sow.RoleClient, otherOwner), nil); err != nil {
		t.Fatal(err)
	}
	withdrawal := func(k keyed) []byte {
		obj := map[string]any{"v": 1, "provider": w.provider.Public(), "sow_id": "sow_test0000000001", "at": w.clock.Now().Format(time.RFC3339)}
		if err := engagement.SignAct(engagement.TagWithdraw, obj, k.key.(*keys.Agent)); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(obj)
		return b
	}
	_, err := w.svc.WithdrawProposal(ctx, withdrawal(keyed{key: w.sOwner}))
	refused(t, err, errs.Forbidden, "withdrawn by a stranger")
	o, err := w.svc.WithdrawProposal(ctx, withdrawal(keyed{key: w.pOwner}))
	if err != nil || o.WithdrawnAt == "" {
		t.Fatalf("withdraw: %v", err)
	}
	if _, err := w.svc.WithdrawProposal(ctx, withdrawal(keyed{key: w.pOwner})); err != nil {
		t.Fatalf("withdrawn again: %v", err)
	}
	_, err = w.svc.Sign(ctx, w.sign(in, sow.RoleProvider, w.pOwner))
	refused(t, err, errs.Conflict, "forming a withdrawn proposal")
	if v := w.view(); !v.InForce {
		t.Fatal("the engagement formed before the withdrawal no longer stands")
	}
}
