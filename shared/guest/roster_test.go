package guest_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"

	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/guest"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/store"
	"agentmesh.dev/mesh/shared/store/boltstore"
	"agentmesh.dev/mesh/shared/testclock"
)

// roster is the registry's guest roster as the guest service sees it; it
// fails while down is set.
type roster struct {
	mu      sync.Mutex
	down    bool
	live    map[string]time.Time
	records int
}

func (r *roster) Record(_ context.Context, key string, expires time.Time) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.down {
		return errors.New("no responders")
	}
	if r.live == nil {
		r.live = map[string]time.Time{}
	}
	r.live[key] = expires
	r.records++
	return nil
}

func (r *roster) Forget(_ context.Context, keys []string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.down {
		return errors.New("no responders")
	}
	for _, k := range keys {
		delete(r.live, k)
	}
	return nil
}

func (r *roster) has(key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.live[key]
	return ok
}

// revoker is the broker's revocation; it fails while down is set.
type revoker struct {
	mu      sync.Mutex
	down    bool
	revoked []string
}

func (r *revoker) Revoke(_ context.Context, keys []string, _ time.Time) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.down {
		return errors.New("claims update timed out")
	}
	r.revoked = append(r.revoked, keys...)
	return nil
}

func (r *revoker) set(down bool) { r.mu.Lock(); r.down = down; r.mu.Unlock() }
func (r *roster) set(down bool)  { r.mu.Lock(); r.down = down; r.mu.Unlock() }

type rosterHarness struct {
	s   *guest.Service
	st  store.Store
	clk *testclock.Clock
	ros *roster
	rev *revoker
	ev  *evictor
}

func newRosterHarness(t *testing.T, withRoster bool) *rosterHarness {
	t.Helper()
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "cp.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	trust, err := creds.Generate()
	if err != nil {
		t.Fatal(err)
	}
	h := &rosterHarness{st: st, clk: &testclock.Clock{}, rev: &revoker{}, ev: &evictor{}}
	cfg := guest.Config{Store: st, Trust: trust, Revoker: h.rev, Evictor: h.ev, IdleTTL: time.Minute, Now: h.clk.Now}
	if withRoster {
		h.ros = &roster{}
		cfg.Roster = h.ros
	}
	h.s = guest.New(cfg)
	return h
}

func (h *rosterHarness) lease(t *testing.T, key string) guest.Lease {
	t.Helper()
	var l guest.Lease
	if err := store.Get(t.Context(), h.st, guest.CollLeases, key, &l); err != nil {
		t.Fatal(err)
	}
	return l
}

func (h *rosterHarness) release(t *testing.T, g guest.Grant) {
	t.Helper()
	k, err := keys.FromSeed[keys.AgentRole]([]byte(g.Seed))
	if err != nil {
		t.Fatal(err)
	}
	ts := h.clk.Now().Unix()
	if err := h.s.Release(t.Context(), guest.Signed{PublicKey: k.Public(), TS: &ts, Sig: protocol.SignGuestRelease(k, ts)}); err != nil {
		t.Fatal(err)
	}
}

func pubAllow(t *testing.T, g guest.Grant) []string {
	t.Helper()
	uc, err := jwt.DecodeUserClaims(g.JWT)
	if err != nil {
		t.Fatal(err)
	}
	return uc.Pub.Allow
}

// A guest's key is on the roster before its credential is handed out, for
// as long as the credential lives, and only then does the credential reach
// the plain register subject. A control plane with no roster issues the
// pinned set: its guests' one register subject is their own bound one.
func TestIssueRecordsTheKeyBeforeAnswering(t *testing.T) {
	h := newRosterHarness(t, true)
	g, err := h.s.Issue(t.Context(), "192.0.2.1")
	if err != nil {
		t.Fatal(err)
	}
	if !h.ros.has(g.PublicKey) {
		t.Fatal("a guest credential was handed out before its key was recorded")
	}
	uc, _ := jwt.DecodeUserClaims(g.JWT)
	if got := h.ros.live[g.PublicKey]; got.Unix() != uc.Expires {
		t.Fatalf("recorded until %v, the credential expires at %v", got, time.Unix(uc.Expires, 0))
	}
	if pub := pubAllow(t, g); !slices.Contains(pub, protocol.SubjRegister) || !slices.Contains(pub, protocol.SubjRegister+"."+g.PublicKey) {
		t.Fatalf("recorded guest's publish allow %q lacks a register subject", pub)
	}

	pinned := newRosterHarness(t, false)
	g, err = pinned.s.Issue(t.Context(), "192.0.2.1")
	if err != nil {
		t.Fatal(err)
	}
	if pub := pubAllow(t, g); slices.Contains(pub, protocol.SubjRegister) || !slices.Contains(pub, protocol.SubjRegister+"."+g.PublicKey) {
		t.Fatalf("unrecorded guest's publish allow %q: want its bound register subject only", pub)
	}
}

// A key that cannot be recorded gets no credential: 503, and the lease is
// ended at once so it does not hold a place in the pool.
func TestUnrecordedGuestGetsNoCredential(t *testing.T) {
	h := newRosterHarness(t, true)
	h.ros.set(true)
	g, err := h.s.Issue(t.Context(), "192.0.2.1")
	if errs.CodeOf(err) != errs.Unavailable || g.JWT != "" || g.Seed != "" {
		t.Fatalf("Issue with the roster down: %v %+v, want UNAVAILABLE and no credential", err, g)
	}
	var leases []guest.Lease
	if err := store.List(t.Context(), h.st, guest.CollLeases, store.Query{}, &leases); err != nil || len(leases) != 1 {
		t.Fatalf("leases %v %v", leases, err)
	}
	if l := leases[0]; l.Active || l.EndReason != "unrecorded" || l.PendingClear {
		t.Fatalf("the unrecorded lease %+v", l)
	}
	if _, issued, err := h.s.Status(t.Context()); err != nil || issued != 0 {
		t.Fatalf("status: issued %d %v", issued, err)
	}
}

// An ended lease leaves the roster only once its credential is revoked: a
// credential the broker still accepts stays in the sandbox. A failed
// revocation leaves the lease pending; the next sweep revokes again and
// then forgets the key.
func TestRosterForgetsOnlyRevokedGuests(t *testing.T) {
	h := newRosterHarness(t, true)

	// Released, revoked: forgotten at once.
	a, err := h.s.Issue(t.Context(), "192.0.2.1")
	if err != nil {
		t.Fatal(err)
	}
	h.release(t, a)
	if h.ros.has(a.PublicKey) || h.lease(t, a.PublicKey).PendingClear {
		t.Fatalf("released and revoked, still on the roster (%v) or pending (%+v)", h.ros.has(a.PublicKey), h.lease(t, a.PublicKey))
	}

	// Released, the revocation fails: kept on the roster, pending.
	b, err := h.s.Issue(t.Context(), "192.0.2.1")
	if err != nil {
		t.Fatal(err)
	}
	h.rev.set(true)
	h.release(t, b)
	if !h.ros.has(b.PublicKey) || !h.lease(t, b.PublicKey).PendingClear {
		t.Fatalf("revocation failed: on the roster %v, lease %+v; want kept and pending", h.ros.has(b.PublicKey), h.lease(t, b.PublicKey))
	}
	// A sweep with the broker still refusing changes nothing.
	if _, err := h.s.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !h.ros.has(b.PublicKey) {
		t.Fatal("forgotten while its credential is still accepted")
	}
	// Once the broker takes the revocation, the sweep forgets the key.
	h.rev.set(false)
	if _, err := h.s.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	if h.ros.has(b.PublicKey) || h.lease(t, b.PublicKey).PendingClear {
		t.Fatalf("after the retry: on the roster %v, lease %+v", h.ros.has(b.PublicKey), h.lease(t, b.PublicKey))
	}
	if !slices.Contains(h.rev.revoked, b.PublicKey) {
		t.Fatal("the sweep did not revoke the key again")
	}

	// An idle lease lapses at a sweep: revoked, evicted, forgotten.
	c, err := h.s.Issue(t.Context(), "192.0.2.1")
	if err != nil {
		t.Fatal(err)
	}
	h.clk.Advance(2 * time.Minute)
	if n, err := h.s.Sweep(t.Context()); err != nil || n != 1 {
		t.Fatalf("sweep: %d %v", n, err)
	}
	if h.ros.has(c.PublicKey) || h.lease(t, c.PublicKey).PendingClear || !slices.Contains(h.ev.cleared, c.PublicKey) {
		t.Fatalf("lapsed: on the roster %v, lease %+v, evicted %v", h.ros.has(c.PublicKey), h.lease(t, c.PublicKey), h.ev.cleared)
	}
}
