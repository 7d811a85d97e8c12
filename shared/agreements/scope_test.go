package agreements_test

import (
	"encoding/json"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/errs"
)

// An engagement grading scope enforced, in force: the client's request
// naming an offering outside its scope is refused with FORBIDDEN and the
// engagement's scope (Agent SoW §5.2); one inside is admitted; once the
// engagement has ended, general admission applies again.
func TestAdmitScope(t *testing.T) {
	s := newStand(t, 1)
	seller, client := s.seller.Public(), s.requester.Public()
	now := time.Now()
	scopes := func(list ...commerce.EngagementTerms) {
		t.Helper()
		b, _ := json.Marshal(list)
		if _, err := s.comm.Put(t.Context(), commerce.EngagementScopeKey(seller, client), b); err != nil {
			t.Fatal(err)
		}
	}
	ended := now.Add(-time.Hour)
	scopes(commerce.EngagementTerms{SowID: "sow_old", Seller: seller, Client: client, Offerings: []string{"other"}, StartsAt: now.Add(-48 * time.Hour), EndsAt: &ended},
		commerce.EngagementTerms{SowID: "sow_scope", Seller: seller, Client: client, Offerings: []string{"summarize", "free"}, StartsAt: now.Add(-time.Hour)})
	if out, e := s.admit("free", nil); e != nil || out["admitted"] != true {
		t.Fatalf("in scope: %v %v", out, e)
	}
	_, e := s.admit("uncovered", nil)
	if e == nil || e.Code != errs.Forbidden || e.Details["sow_id"] != "sow_scope" {
		t.Fatalf("out of scope: %v", e)
	}
	got, _ := e.Details["offerings"].([]any)
	if len(got) != 2 || got[0] != "free" || got[1] != "summarize" {
		t.Fatalf("details offerings %v", e.Details["offerings"])
	}
	// Only the ended engagement lists "other": it is out of scope now.
	if _, e := s.admit("other", nil); e == nil || e.Code != errs.Forbidden {
		t.Fatalf("an ended engagement's offering: %v", e)
	}
	// The engagement ended: general admission.
	scopes(commerce.EngagementTerms{SowID: "sow_scope", Seller: seller, Client: client, Offerings: []string{"summarize"}, StartsAt: now.Add(-2 * time.Hour), EndsAt: &ended})
	if out, e := s.admit("uncovered", nil); e != nil || out["admitted"] != true {
		t.Fatalf("after the end: %v %v", out, e)
	}
}
