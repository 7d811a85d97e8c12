package registrar_test

import (
	"fmt"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/ratelimit"
	"agentmesh.dev/mesh/shared/registrar"
	"agentmesh.dev/mesh/shared/store"
)

// Sweep deletes what expired and nothing else: email codes once the last
// code of the address lapsed, pairing codes after 10 minutes, sessions
// after 8 hours, rate-limit counters two windows after their last count,
// in batches larger collections need several of.
func TestSweep(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t)
	sweep := func(want int) {
		t.Helper()
		n, err := e.svc.Sweep(ctx)
		if err != nil || n != want {
			t.Fatalf("sweep deleted %d (%v), want %d", n, err, want)
		}
	}
	tok := e.session("ana@example.org")
	h := e.claim(tok, "coder", "Ana")
	if _, err := e.svc.StartEmail(ctx, "pending@example.org", "192.0.2.1"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.StartPairing(ctx, tok, h); err != nil {
		t.Fatal(err)
	}
	// Counters from many clients, more than one batch of them.
	var limits []ratelimit.Limit
	for i := range 2*registrar.SweepBatch + 10 {
		limits = append(limits, ratelimit.Limit{Name: "pair-per-ip", Key: fmt.Sprintf("2001:db8:%x::/64", i), Max: 60, Window: time.Hour})
	}
	if err := e.st.RunTx(ctx, func(tx store.Tx) error {
		return ratelimit.Take(tx, registrar.CollRateLimits, e.clock.Now(), limits...)
	}); err != nil {
		t.Fatal(err)
	}
	sweep(0)

	// A code mailed later keeps its address's document alive.
	e.clock.Advance(10 * time.Minute)
	if _, err := e.svc.StartEmail(ctx, "later@example.org", "192.0.2.1"); err != nil {
		t.Fatal(err)
	}
	counters := e.count(registrar.CollRateLimits)
	e.clock.Advance(6 * time.Minute)
	sweep(2) // pending@'s codes and the pairing code
	if e.count(registrar.CollCodes) != 1 || e.count(registrar.CollPairing) != 0 || e.count(registrar.CollSessions) != 1 ||
		e.count(registrar.CollRateLimits) != counters {
		t.Fatalf("the sweep deleted a live document: codes %d, pairing %d, sessions %d, counters %d of %d", e.count(registrar.CollCodes), e.count(registrar.CollPairing), e.count(registrar.CollSessions), e.count(registrar.CollRateLimits), counters)
	}
	e.clock.Advance(8 * time.Hour)
	sweep(1 + 1 + counters) // later@'s codes, the session, every counter
	for _, coll := range []string{registrar.CollCodes, registrar.CollSessions, registrar.CollPairing, registrar.CollRateLimits} {
		if n := e.count(coll); n != 0 {
			t.Errorf("%s: %d documents left", coll, n)
		}
	}
	// Handles and operator names (on the address's account) never expire.
	if e.count(account.CollHandles) != 1 || e.count(account.CollAccounts) != 1 {
		t.Fatal("the sweep touched handles or accounts")
	}
	if _, err := e.svc.Resolve(ctx, h, ""); err != nil {
		t.Fatalf("the handle after the sweep: %v", err)
	}
}
