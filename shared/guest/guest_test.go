package guest_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/guest"
	"agentmesh.dev/mesh/shared/store"
	"agentmesh.dev/mesh/shared/store/boltstore"
)

// evictor records what it was asked to clear and fails while down is set,
// standing in for a bus the control plane cannot reach.
type evictor struct {
	mu      sync.Mutex
	down    bool
	cleared []string
}

func (e *evictor) EvictGuests(_ context.Context, keys []string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.down {
		return errors.New("no responders")
	}
	e.cleared = append(e.cleared, keys...)
	return nil
}

// A lease whose clearing fails stays pending and is cleared by a later
// sweep; a cleared lease is not cleared again.
func TestClearingIsRetriedUntilItSucceeds(t *testing.T) {
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "cp.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	trust, err := creds.Generate()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	ev := &evictor{down: true}
	s := guest.New(guest.Config{Store: st, Trust: trust, Evictor: ev, IdleTTL: time.Minute, Now: func() time.Time { return now }})
	g, err := s.Issue(t.Context(), "192.0.2.1")
	if err != nil {
		t.Fatal(err)
	}
	now = now.Add(2 * time.Minute)
	if n, err := s.Sweep(t.Context()); err != nil || n != 1 {
		t.Fatalf("sweep: %d %v", n, err)
	}
	var l guest.Lease
	if err := store.Get(t.Context(), st, guest.CollLeases, g.PublicKey, &l); err != nil || l.Active || !l.PendingClear {
		t.Fatalf("after a failed clearing: %+v %v", l, err)
	}
	ev.mu.Lock()
	ev.down = false
	ev.mu.Unlock()
	if n, err := s.Sweep(t.Context()); err != nil || n != 0 {
		t.Fatalf("second sweep: %d %v", n, err)
	}
	if err := store.Get(t.Context(), st, guest.CollLeases, g.PublicKey, &l); err != nil || l.PendingClear {
		t.Fatalf("after the retry: %+v %v", l, err)
	}
	if _, err := s.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ev.cleared, []string{g.PublicKey}) {
		t.Fatalf("cleared %v, want the lapsed key once", ev.cleared)
	}
}
