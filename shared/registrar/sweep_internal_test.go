package registrar

import (
	"path/filepath"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/secret"
	"agentmesh.dev/mesh/shared/store"
	"agentmesh.dev/mesh/shared/store/boltstore"
)

// An address's codes written before the document carried its id and
// deadline are still swept: the id comes from the address, the deadline
// from the codes. Other documents without an id are left alone.
func TestSweepOlderDocuments(t *testing.T) {
	ctx := t.Context()
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "control.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	now := time.Date(2026, 8, 1, 12, 0, 0, 0, time.UTC)
	s := New(Config{Store: st, Now: func() time.Time { return now }})
	type oldCodes struct {
		Email string        `json:"email"`
		Codes []secret.Code `json:"codes"`
	}
	if err := st.RunTx(ctx, func(tx store.Tx) error {
		for _, a := range []string{"old@example.org", "live@example.org"} {
			exp := now.Add(-time.Minute)
			if a == "live@example.org" {
				exp = now.Add(time.Minute)
			}
			if err := tx.Set(CollCodes, codesID(a), oldCodes{Email: a, Codes: []secret.Code{{CodeHash: "x", ExpiresAt: exp.UnixMilli(), AttemptsLeft: 5}}}); err != nil {
				return err
			}
		}
		return tx.Set(CollSessions, "some-hash", map[string]any{"email": "a@example.org", "expires_at": now.Add(-time.Hour).UnixMilli()})
	}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Sweep(ctx); err != nil || n != 1 {
		t.Fatalf("swept %d (%v), want 1", n, err)
	}
	var left oldCodes
	if err := store.Get(ctx, st, CollCodes, codesID("live@example.org"), &left); err != nil {
		t.Fatalf("the live codes: %v", err)
	}
}
