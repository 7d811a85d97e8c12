package guest_test

import (
	"net/http"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/guest"
	"agentmesh.dev/mesh/shared/ratelimit"
	"agentmesh.dev/mesh/shared/store"
	"agentmesh.dev/mesh/shared/store/boltstore"
	"agentmesh.dev/mesh/shared/testclock"
)

func newGuests(t *testing.T, l guest.Limits) (*guest.Service, *testclock.Clock, store.Store) {
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
	clk := &testclock.Clock{}
	return guest.New(guest.Config{Store: st, Trust: trust, Limits: l, Now: clk.Now}), clk, st
}

// Every limit on guest leases, one row each: the leases that fit, the one
// that does not (429 with retry_after_ms and the limit's name, or 503
// pool_exhausted when the pool is really empty; no lease made), leases the
// limit does not touch, and the refused client getting a lease again once
// the leases have lapsed and the window has passed.
func TestGuestLimits(t *testing.T) {
	// roomy leaves every limit but the one under test out of the way.
	roomy := func(f func(*guest.Limits)) guest.Limits {
		big := ratelimit.Rate{Max: 1000, Window: time.Hour}
		l := guest.Limits{Pool: 100, LivePerAddress: 100, LivePerNetwork: 100, Reserve: 1, PerAddress: big, PerNetwork: big, Overall: big}
		f(&l)
		return l
	}
	rate := func(n int) ratelimit.Rate { return ratelimit.Rate{Max: n, Window: time.Hour} }
	tests := []struct {
		name   string
		limits guest.Limits
		fit    []string
		refuse string
		status int
		limit  string // details.limit of a 429; details.reason of the 503
		others []string
	}{
		{
			name:   "live leases per address",
			limits: roomy(func(l *guest.Limits) { l.LivePerAddress = 2 }),
			fit:    []string{"192.0.2.1", "192.0.2.1"},
			refuse: "192.0.2.1", status: 429, limit: "guest-live-per-address",
			others: []string{"192.0.2.2"},
		},
		{
			name:   "live leases per IPv6 address count its /64",
			limits: roomy(func(l *guest.Limits) { l.LivePerAddress = 2 }),
			fit:    []string{"2001:db8:1:2::1", "2001:db8:1:2::2"},
			refuse: "2001:db8:1:2::ffff", status: 429, limit: "guest-live-per-address",
			others: []string{"2001:db8:1:3::1"},
		},
		{
			name:   "live leases per /24",
			limits: roomy(func(l *guest.Limits) { l.LivePerNetwork = 3 }),
			fit:    []string{"192.0.2.1", "192.0.2.2", "192.0.2.2"},
			refuse: "192.0.2.3", status: 429, limit: "guest-live-per-network",
			others: []string{"192.0.3.1"},
		},
		{
			name:   "live leases per /48",
			limits: roomy(func(l *guest.Limits) { l.LivePerNetwork = 2 }),
			fit:    []string{"2001:db8:1:1::1", "2001:db8:1:2::1"},
			refuse: "2001:db8:1:ffff::1", status: 429, limit: "guest-live-per-network",
			others: []string{"2001:db8:2::1"},
		},
		{
			// The last Reserve free leases go only to networks that hold none.
			name:   "reserve",
			limits: roomy(func(l *guest.Limits) { l.Pool, l.Reserve = 5, 2 }),
			fit:    []string{"192.0.2.1", "192.0.2.2", "192.0.2.3"},
			refuse: "192.0.2.4", status: 429, limit: "guest-reserve",
			others: []string{"198.51.100.1", "203.0.113.1"},
		},
		{
			name:   "pool exhausted",
			limits: roomy(func(l *guest.Limits) { l.Pool, l.Reserve = 3, 1 }),
			fit:    []string{"192.0.2.1", "192.0.2.2", "198.51.100.1"},
			refuse: "203.0.113.1", status: 503, limit: "pool_exhausted",
		},
		{
			name:   "leases issued per address",
			limits: roomy(func(l *guest.Limits) { l.PerAddress = rate(3) }),
			fit:    []string{"192.0.2.1", "192.0.2.1", "192.0.2.1"},
			refuse: "192.0.2.1", status: 429, limit: "guest-per-address",
			others: []string{"192.0.2.2"},
		},
		{
			name:   "leases issued per /24",
			limits: roomy(func(l *guest.Limits) { l.PerNetwork = rate(3) }),
			fit:    []string{"192.0.2.1", "192.0.2.2", "192.0.2.3"},
			refuse: "192.0.2.4", status: 429, limit: "guest-per-network",
			others: []string{"192.0.3.1"},
		},
		{
			name:   "leases issued overall",
			limits: roomy(func(l *guest.Limits) { l.Overall = rate(3) }),
			fit:    []string{"192.0.2.1", "198.51.100.1", "203.0.113.1"},
			refuse: "2001:db8::1", status: 429, limit: "guest-overall",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, clk, _ := newGuests(t, tc.limits)
			ctx := t.Context()
			for i, ip := range tc.fit {
				if _, err := s.Issue(ctx, ip); err != nil {
					t.Fatalf("lease %d from %s: %v", i+1, ip, err)
				}
			}
			_, err := s.Issue(ctx, tc.refuse)
			e := errs.As(err)
			got := e.Details["limit"]
			if tc.status == http.StatusServiceUnavailable {
				got = e.Details["reason"]
			}
			if err == nil || e.HTTPStatus() != tc.status || got != tc.limit || e.RetryAfterMS <= 0 || e.RetryAfterMS > time.Hour.Milliseconds() {
				t.Fatalf("over the limit: %v (details %v, retry %d ms), want %d %s", err, e.Details, e.RetryAfterMS, tc.status, tc.limit)
			}
			if _, issued, _ := s.Status(ctx); issued != len(tc.fit) {
				t.Errorf("%d leases after the refusal, want %d", issued, len(tc.fit))
			}
			for _, ip := range tc.others {
				if _, err := s.Issue(ctx, ip); err != nil {
					t.Errorf("a lease from %s: %v", ip, err)
				}
			}
			// Leases lapse after ten idle minutes; two windows later every
			// counter has room again.
			clk.Advance(2*time.Hour + time.Minute)
			if _, err := s.Issue(ctx, tc.refuse); err != nil {
				t.Errorf("later: %v", err)
			}
		})
	}
}

// With the defaults, 34 addresses of one /24 hold 10 leases, and 34 /24s
// leave the pool's reserve to networks that hold none: nobody meets a 503.
func TestGuestDefaultLimits(t *testing.T) {
	s, clk, st := newGuests(t, guest.Limits{})
	ctx := t.Context()
	leased := 0
	for i := range 34 {
		for range 3 {
			_, err := s.Issue(ctx, "198.51.100."+strconv.Itoa(i+1))
			if err == nil {
				leased++
			} else if errs.CodeOf(err) != errs.RateLimited {
				t.Fatalf("from 198.51.100.%d: %v", i+1, err)
			}
		}
	}
	if leased != 10 {
		t.Fatalf("one /24 holds %d leases, want 10", leased)
	}
	for i := range 34 {
		for range 3 {
			_, err := s.Issue(ctx, "10."+strconv.Itoa(i)+".0.1")
			if err == nil {
				leased++
			} else if errs.CodeOf(err) != errs.RateLimited {
				t.Fatalf("from 10.%d.0.1: %v", i, err)
			}
		}
	}
	// 26 networks take 3 each (88 leased, 12 free); the 27th takes 2, down
	// to the reserve of 10; the other 7 one each from the reserve: 97.
	if avail, issued, _ := s.Status(ctx); leased != 97 || issued != 97 || avail != 3 {
		t.Fatalf("%d leased, %d issued, %d available; want 97, 97, 3", leased, issued, avail)
	}
	if _, err := s.Issue(ctx, "203.0.113.1"); err != nil {
		t.Fatalf("a newcomer after the flood: %v", err)
	}
	// Sweeping after the leases lapse and the windows pass leaves no counter.
	clk.Advance(2*time.Hour + time.Minute)
	if _, err := s.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	var left []map[string]any
	if err := store.List(ctx, st, guest.CollRateLimits, store.Query{}, &left); err != nil || len(left) != 0 {
		t.Fatalf("%d counters left, %v", len(left), err)
	}
}

// The limits hold across copies of the control plane (Cloud Functions
// scale out): two services on one store, raced by 30 requests of one /24,
// lease exactly what the limits allow.
func TestGuestLimitsHoldAcrossCopies(t *testing.T) {
	a, clk, st := newGuests(t, guest.Limits{})
	trust, err := creds.Generate()
	if err != nil {
		t.Fatal(err)
	}
	b := guest.New(guest.Config{Store: st, Trust: trust, Now: clk.Now})
	for _, tc := range []struct {
		name string
		ip   func(i int) string
		want int
	}{
		{"one address", func(int) string { return "192.0.2.1" }, 3},
		{"one /24", func(i int) string { return "198.51.100." + strconv.Itoa(i+1) }, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var wg sync.WaitGroup
			var mu sync.Mutex
			ok := 0
			for i := range 30 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s := a
					if i%2 == 1 {
						s = b
					}
					_, err := s.Issue(t.Context(), tc.ip(i))
					mu.Lock()
					defer mu.Unlock()
					switch errs.CodeOf(err) {
					case "":
						ok++
					case errs.RateLimited:
					default:
						t.Errorf("lease %d: %v", i, err)
					}
				}()
			}
			wg.Wait()
			if ok != tc.want {
				t.Fatalf("%d leases, want %d", ok, tc.want)
			}
		})
	}
}
