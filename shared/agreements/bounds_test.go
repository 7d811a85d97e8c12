package agreements_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/agreements"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// revocation signs owner's revocation of its agreement agreed at agreed.
func revocation(t *testing.T, owner keys.Signer, seller, agreed string, at time.Time) agreements.Revocation {
	t.Helper()
	rv := agreements.Revocation{SellerAgent: seller, SKU: "paid-flat", AgreedAt: agreed, RevokedAt: protocol.FormatTime(at)}
	if err := agreements.SignRevocation(&rv, owner); err != nil {
		t.Fatal(err)
	}
	return rv
}

// A revocation names the agreement it revokes (its agreed_at), and may not
// be dated ahead: an old revocation replayed never revokes a later
// agreement (review finding 3), and the answer is about the record on file.
func TestRevocationBoundToAgreement(t *testing.T) {
	s := newStand(t, 1)
	seller := s.seller.Public()
	paid := sku(t, flatSKU(250000))
	s.balance(s.owner.Public(), 1_000_000)
	now := time.Now()
	a1 := agreement(t, s.owner, seller, "paid-flat", paid.Digest(), now, "")
	if e := s.file(a1); e != nil {
		t.Fatal(e)
	}
	revoke := func(rv agreements.Revocation) (map[string]any, *errs.Error) {
		return s.call(s.requester, protocol.AgreementVerbSubject("revoke"), rv)
	}
	// Dated minutes ahead: refused.
	if _, e := revoke(revocation(t, s.owner, seller, a1.AgreedAt, now.Add(4*time.Minute))); e == nil || e.Code != errs.InvalidRequest {
		t.Fatalf("a future-dated revocation: %v", e)
	}
	// Naming an agreement that is not the one on file: refused.
	if _, e := revoke(revocation(t, s.owner, seller, protocol.FormatTime(now.Add(-time.Hour)), now.Add(time.Second))); e == nil ||
		e.Code != errs.Conflict || e.Details["agreed_at"] != a1.AgreedAt {
		t.Fatalf("a revocation of another agreement: %v", e)
	}
	rv1 := revocation(t, s.owner, seller, a1.AgreedAt, now.Add(time.Second))
	if out, e := revoke(rv1); e != nil || out["status"] != "revoked" {
		t.Fatalf("revoke: %v %v", out, e)
	}
	// The same revocation again answers revoked (it is that agreement's).
	if out, e := revoke(rv1); e != nil || out["status"] != "revoked" {
		t.Fatalf("revoke again: %v %v", out, e)
	}
	// A later agreement; the earlier revocation replayed does not touch it.
	a2 := agreement(t, s.owner, seller, "paid-flat", paid.Digest(), now.Add(2*time.Second), "")
	if e := s.file(a2); e != nil {
		t.Fatal(e)
	}
	if _, e := revoke(rv1); e == nil || e.Code != errs.Conflict {
		t.Fatalf("the earlier revocation replayed: %v", e)
	}
	if _, e := s.admit("paid", nil); e != nil {
		t.Fatalf("the later agreement after the replay: %v", e)
	}
}

// Filing is bounded: only a registered, non-sandbox agent of the
// agreement's owner files it (or the services key), and an owner keeps at
// most MaxPerOwner agreements (review finding 4).
func TestFileBounded(t *testing.T) {
	b := bustest.Start(t)
	w, err := agreements.Start(t.Context(), bustest.Env(t, b, "agreements-0", nil), agreements.Config{ConsoleURL: console, MaxPerOwner: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop() })
	s := standOn(t, b)
	seller := s.seller.Public()
	skus := []map[string]any{flatSKU(1), namedSKU("b"), namedSKU("c")}
	s.register(seller, bustest.Agent(t).Public(), "", skus...)
	now := time.Now()
	sign := func(owner keys.Signer, id string, v map[string]any) commerce.Agreement {
		return agreement(t, owner, seller, id, sku(t, v).Digest(), now, "")
	}
	fileAs := func(from keys.Signer, a commerce.Agreement) *errs.Error {
		_, e := s.call(from, protocol.AgreementVerbSubject("file"), a)
		return e
	}
	// A throwaway key, registered nowhere, files for itself: refused.
	throwaway := bustest.Agent(t)
	if e := fileAs(throwaway, sign(throwaway, "paid-flat", flatSKU(1))); e == nil || e.Code != errs.Forbidden {
		t.Fatalf("an unregistered filer: %v", e)
	}
	// A registered agent files for an owner other than its own: refused.
	if e := fileAs(s.requester, sign(throwaway, "paid-flat", flatSKU(1))); e == nil || e.Code != errs.Forbidden {
		t.Fatalf("another owner's agreement: %v", e)
	}
	// A sandbox registration files nothing, even for its own owner.
	guest := bustest.Agent(t)
	rec, _ := json.Marshal(map[string]any{"id": guest.Public(), "name": "g", "node": map[string]any{"id": s.owner.Public()}, "sandbox": true})
	if _, err := s.reg.Put(t.Context(), guest.Public(), rec); err != nil {
		t.Fatal(err)
	}
	if e := fileAs(guest, sign(s.owner, "paid-flat", flatSKU(1))); e == nil || e.Code != errs.Forbidden {
		t.Fatalf("a sandbox filer: %v", e)
	}
	// The owner's own agent files, up to the quota; agreeing again to a
	// SKU already on file replaces it and is not refused.
	if e := fileAs(s.requester, sign(s.owner, "paid-flat", flatSKU(1))); e != nil {
		t.Fatal(e)
	}
	if e := fileAs(s.requester, sign(s.owner, "b", namedSKU("b"))); e != nil {
		t.Fatal(e)
	}
	if e := fileAs(s.requester, sign(s.owner, "c", namedSKU("c"))); e == nil || e.Code != errs.QuotaExceeded {
		t.Fatalf("past the quota: %v", e)
	}
	again := agreement(t, s.owner, seller, "b", sku(t, namedSKU("b")).Digest(), now.Add(time.Second), "")
	if e := fileAs(s.requester, again); e != nil {
		t.Fatalf("a newer agreement to a SKU on file: %v", e)
	}
	// The services key files for anyone (the console).
	if e := fileAs(b.ServicesKey(), sign(throwaway, "paid-flat", flatSKU(1))); e != nil {
		t.Fatalf("the services key: %v", e)
	}
}

// list pages in key order with limit and next, reading only the page.
func TestListPaged(t *testing.T) {
	s := newStand(t, 1)
	seller := s.seller.Public()
	var all []map[string]any
	for i := range 5 {
		all = append(all, namedSKU(fmt.Sprintf("s%d", i)))
	}
	s.register(seller, bustest.Agent(t).Public(), "", all...)
	now := time.Now()
	for i := range 5 {
		id := fmt.Sprintf("s%d", i)
		if e := s.file(agreement(t, s.owner, seller, id, sku(t, all[i]).Digest(), now, "")); e != nil {
			t.Fatal(e)
		}
	}
	var got []string
	after := ""
	for pages := 0; ; pages++ {
		if pages > 5 {
			t.Fatal("paging does not end")
		}
		q := map[string]any{"limit": 2}
		if after != "" {
			q["after"] = after
		}
		out, e := s.call(s.seller, protocol.AgreementVerbSubject("list"), q)
		if e != nil {
			t.Fatal(e)
		}
		list, _ := out["agreements"].([]any)
		if len(list) > 2 {
			t.Fatalf("a page of %d", len(list))
		}
		for _, v := range list {
			got = append(got, v.(map[string]any)["sku"].(string))
		}
		next, _ := out["next"].(string)
		if next == "" {
			break
		}
		after = next
	}
	if fmt.Sprint(got) != "[s0 s1 s2 s3 s4]" {
		t.Fatalf("listed %v", got)
	}
	if _, e := s.call(s.seller, protocol.AgreementVerbSubject("list"), map[string]any{"limit": 0}); e == nil || e.Code != errs.InvalidRequest {
		t.Fatalf("limit 0: %v", e)
	}
	if _, e := s.call(s.seller, protocol.AgreementVerbSubject("list"), map[string]any{"after": "bal.x"}); e == nil || e.Code != errs.InvalidRequest {
		t.Fatalf("a cursor not given: %v", e)
	}
}

// Two engagements between the same pair count apart (review finding 6).
func TestVolumePerEngagement(t *testing.T) {
	s := newStand(t, 1)
	start := time.Now().Add(-time.Hour)
	for _, c := range []struct{ sow, offering string }{{"sow-a", "x"}, {"sow-b", "y"}} {
		s.engagement(commerce.EngagementTerms{SowID: c.sow, Version: 1, Seller: s.seller.Public(), Client: s.requester.Public(),
			Offerings: []string{c.offering}, StartsAt: start, Volume: &commerce.Volume{PerHour: 2}}, c.offering)
	}
	for range 2 {
		if _, e := s.admit("x", nil); e != nil {
			t.Fatal(e)
		}
	}
	if _, e := s.admit("x", nil); e == nil || e.Code != errs.RateLimited {
		t.Fatalf("x past its limit: %v", e)
	}
	if out, e := s.admit("y", nil); e != nil || out["sow_id"] != "sow-b" {
		t.Fatalf("y under its own engagement: %v %v", out, e)
	}
}

// The sweep removes counters of windows that ended more than a day ago
// and keeps the rest (review finding 8).
func TestSweepVolumeCounters(t *testing.T) {
	b := bustest.Start(t)
	w, err := agreements.Start(t.Context(), bustest.Env(t, b, "agreements-0", nil), agreements.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop() })
	s := standOn(t, b)
	now := time.Now().UTC()
	seller, client := s.seller.Public(), s.requester.Public()
	old := []string{
		agreements.VolumeKey(seller, client, "sow", 1, agreements.WindowHour, now.Add(-26*time.Hour).Truncate(time.Hour)),
		agreements.VolumeKey(seller, client, "sow", 1, agreements.WindowDay, now.AddDate(0, 0, -3)),
	}
	keep := []string{
		agreements.VolumeKey(seller, client, "sow", 1, agreements.WindowHour, now.Truncate(time.Hour)),
		agreements.VolumeKey(seller, client, "sow", 1, agreements.WindowHour, now.Add(-20*time.Hour).Truncate(time.Hour)),
		agreements.VolumeKey(seller, client, "sow", 1, agreements.WindowDay, now.AddDate(0, 0, -1)),
		commerce.AgreementKey(seller, client, "paid-flat"),
	}
	for _, k := range append(append([]string{}, old...), keep...) {
		if _, err := s.comm.Put(t.Context(), k, []byte(`{"count":1}`)); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 { // a second sweep (another copy's) finds nothing left
		if _, err := w.Sweep(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range old {
		if _, err := s.comm.Get(t.Context(), k); err == nil {
			t.Errorf("%s was not swept", k)
		}
	}
	for _, k := range keep {
		if _, err := s.comm.Get(t.Context(), k); err != nil {
			t.Errorf("%s: %v", k, err)
		}
	}
}

// namedSKU is a paid SKU id covering the offering of the same name.
func namedSKU(id string) map[string]any {
	return map[string]any{"sku": id, "covers": map[string]any{"offerings": []any{id}},
		"price":    map[string]any{"model": "flat", "currency": "XCR", "amount_micro": 1},
		"provider": map[string]any{"id": "internal"}}
}
