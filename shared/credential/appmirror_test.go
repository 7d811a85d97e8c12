package credential

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"testing"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/store"
)

// fakeMirror keeps the app records in memory, as the bus would, or fails.
type fakeMirror struct {
	mu   sync.Mutex
	recs map[string][]string
	fail error
}

func (m *fakeMirror) Sync(ctx context.Context, appKeys []string, answer func(context.Context) (map[string][]string, error)) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return 0, m.fail
	}
	want, err := answer(ctx)
	if err != nil {
		return 0, err
	}
	for _, k := range appKeys {
		if v, ok := want[k]; ok {
			m.recs[k] = v
		} else {
			delete(m.recs, k)
		}
	}
	return len(appKeys), nil
}

func (m *fakeMirror) Resync(ctx context.Context, answer func(context.Context) (map[string][]string, error)) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return 0, m.fail
	}
	want, err := answer(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for k, v := range want {
		if cur, ok := m.recs[k]; !ok || !slices.Equal(cur, v) {
			n++
		}
	}
	for k := range m.recs {
		if _, ok := want[k]; !ok {
			n++
		}
	}
	m.recs = maps.Clone(want)
	return n, nil
}

func (m *fakeMirror) get(key string) ([]string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.recs[key]
	return v, ok
}

// The control plane writes an app's record when the app is created and
// deletes it when it is revoked or its account disabled; a record a failed
// write left out (the request still succeeds) comes with the resync, and
// so does an agent bound behind the service's back; every record is what
// AppAgents says.
func TestAppRecordsFollowTheStore(t *testing.T) {
	ctx := context.Background()
	s, cs, _ := newTestService(t)
	mirror := &fakeMirror{recs: map[string][]string{}}
	s.cfg.Apps = mirror
	if err := cs.RunTx(ctx, func(tx store.Tx) error {
		for _, id := range []string{"acct-a", "acct-b"} {
			if err := tx.Create(account.CollAccounts, id, account.Account{ID: id, Email: id + "@example.org", Verified: true}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	check := func(key string, want bool) {
		t.Helper()
		got, ok := mirror.get(key)
		fromStore, err := s.AppAgents(ctx, key)
		switch {
		case ok != want:
			t.Errorf("record of %s…: present %v, want %v (%v)", key[:8], ok, want, got)
		case want && (err != nil || !slices.Equal(got, fromStore)):
			t.Errorf("record of %s… is %v, AppAgents %v (%v)", key[:8], got, fromStore, err)
		case !want && err == nil:
			t.Errorf("AppAgents answers a key with no record: %v", fromStore)
		}
	}

	a1, err := s.CreateApp(ctx, "acct-a", "one")
	if err != nil {
		t.Fatal(err)
	}
	check(a1.PublicKey, true)
	if got, _ := mirror.get(a1.PublicKey); !slices.Equal(got, []string{a1.PublicKey}) {
		t.Errorf("a new app of an account without agents reads about itself only: %v", got)
	}
	// The bus is down: the app is made all the same, its record comes
	// with the resync.
	mirror.fail = errors.New("bus down")
	a2, err := s.CreateApp(ctx, "acct-a", "two")
	if err != nil {
		t.Fatalf("an app made while the bus is down: %v", err)
	}
	if _, ok := mirror.get(a2.PublicKey); ok {
		t.Fatal("a failed mirror wrote a record")
	}
	if _, err := s.ResyncApps(ctx); err == nil {
		t.Error("a resync with the bus down reported no error")
	}
	mirror.fail = nil
	// An agent bound directly in the store (as a restore would).
	agent := mustGen[keys.AgentRole](t).Public()
	if err := cs.RunTx(ctx, func(tx store.Tx) error {
		return tx.Set(CollAgents, agent, Agent{ID: agent, AccountID: "acct-a", Enabled: true})
	}); err != nil {
		t.Fatal(err)
	}
	if n, err := s.ResyncApps(ctx); err != nil || n != 2 {
		t.Errorf("resync: %d corrections, %v; want 2", n, err)
	}
	check(a1.PublicKey, true)
	check(a2.PublicKey, true)
	if got, _ := mirror.get(a2.PublicKey); !slices.Contains(got, agent) || !slices.Contains(got, a1.PublicKey) {
		t.Errorf("record %v lacks the agent or the other app", got)
	}
	if n, err := s.ResyncApps(ctx); err != nil || n != 0 {
		t.Errorf("resync with nothing to correct: %d, %v", n, err)
	}

	b1, err := s.CreateApp(ctx, "acct-b", "theirs")
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := mirror.get(b1.PublicKey); slices.Contains(got, agent) {
		t.Errorf("another account's app reads about this account's agent: %v", got)
	}
	if err := s.RevokeApp(ctx, "acct-a", a1.AppID); err != nil {
		t.Fatal(err)
	}
	check(a1.PublicKey, false)
	check(a2.PublicKey, true)
	if got, _ := mirror.get(a2.PublicKey); !slices.Contains(got, a1.PublicKey) {
		t.Errorf("a revoked app's key left its account's records (it stays readable): %v", got)
	}
	if err := s.DisableAccount(ctx, "acct-a", "terms"); err != nil {
		t.Fatal(err)
	}
	check(a2.PublicKey, false)
	check(b1.PublicKey, true)
	if n, err := s.ResyncApps(ctx); err != nil || n != 0 {
		t.Errorf("resync after the changes: %d, %v", n, err)
	}
}
