package grant

import (
	"path/filepath"
	"strings"
	"testing"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/store"
	"agentmesh.dev/mesh/shared/store/boltstore"
)

// lower reports whether it wrote, and its answer states the state the
// grant actually has: revoked when it lowered it; otherwise the state of
// the record as it is (left alone), or that it was deleted.
func TestLowerSaysWhatItDid(t *testing.T) {
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "control.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	s, err := New(Config{Store: st, Deployer: "mesh-deployer@mesh-prod.iam.gserviceaccount.com", ControlURL: "https://mesh.example.org"})
	if err != nil {
		t.Fatal(err)
	}
	g := Grant{ID: "g1", AccountID: "acct_1", Provider: ProviderGCP, ProjectID: "acme-agents", State: Verified}
	put := func(g Grant) {
		t.Helper()
		if err := st.RunTx(t.Context(), func(tx store.Tx) error { return tx.Set(CollGrants, docID(g.AccountID, g.Provider), g) }); err != nil {
			t.Fatal(err)
		}
	}
	put(g)
	for _, tc := range []struct {
		name    string
		arrange func()
		wrote   bool
		now     State
		state   string // the answer's grant_state ("" when none)
		words   string
	}{
		{"verified: lowered", func() {}, true, Revoked, "revoked", "the grant is now revoked"},
		{"already revoked: left alone", func() {}, false, Revoked, "revoked", "is revoked, so it was left as it is"},
		{"replaced by a verified record", func() { r := g; r.ID = "g2"; put(r) }, false, Verified, "verified", "is verified, so it was left as it is"},
		{"deleted", func() {
			_ = st.RunTx(t.Context(), func(tx store.Tx) error { return tx.Delete(CollGrants, docID(g.AccountID, g.Provider)) })
		}, false, "", "", "deleted meanwhile"},
	} {
		tc.arrange()
		wrote, now, err := s.lowerRecord(t.Context(), g, "why")
		if err != nil || wrote != tc.wrote || now != tc.now {
			t.Errorf("%s: lowerRecord wrote %v, now %q, %v; want %v, %q", tc.name, wrote, now, err, tc.wrote, tc.now)
		}
		// The answer, from the record as it now is (lowering again never
		// writes: the first case's record is revoked by now).
		if tc.wrote {
			r := g
			put(r)
		}
		e := errs.As(s.lower(t.Context(), g, "why"))
		if got, _ := e.Details["grant_state"].(string); got != tc.state || !strings.Contains(e.Message, tc.words) || e.Retryable {
			t.Errorf("%s: answer %q (grant_state %q), want %q saying %q", tc.name, e.Message, got, tc.state, tc.words)
		}
	}
}
