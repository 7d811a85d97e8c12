package account_test

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/ratelimit"
	"agentmesh.dev/mesh/shared/store"
	"agentmesh.dev/mesh/shared/store/boltstore"
	"agentmesh.dev/mesh/shared/testclock"
)

// A request to one of the limited routes: sign-up, sign-in or connect by
// mail, from a client address, for a code to email.
type limited struct{ op, from, email string }

func (f *limitFixture) do(r limited) error {
	ctx := context.Background()
	switch r.op {
	case "signup":
		_, err := f.svc.StartLogin(ctx, r.email, true, r.from)
		return err
	case "login":
		_, err := f.svc.StartLogin(ctx, r.email, false, r.from)
		return err
	case "connect":
		_, err := f.svc.StartConnect(ctx, r.email, "dashboard", "", r.from, &issuer{})
		return err
	}
	panic("no op " + r.op)
}

type limitFixture struct {
	svc   *account.Service
	st    store.Store
	mail  *mailbox
	clock *testclock.Clock
}

// Every limit of the account routes, one row each: the requests that fit,
// the one that does not (429 with retry_after_ms and the limit's name,
// nothing mailed, no account made), requests that the limit does not
// touch, and the refused request fitting again once the window has passed.
func TestAccountLimits(t *testing.T) {
	r := func(n int) ratelimit.Rate { return ratelimit.Rate{Max: n, Window: time.Hour} }
	const known = "known@example.org" // has an account; every other address has none
	tests := []struct {
		name   string
		limits account.Limits
		fit    []limited
		refuse limited
		limit  string
		others []limited
	}{
		{
			name:   "sign-ups per address",
			limits: account.Limits{SignUp: account.Rates{PerAddress: r(2)}},
			fit:    []limited{{"signup", "192.0.2.1", "a@example.org"}, {"signup", "192.0.2.1", "b@example.org"}},
			refuse: limited{"signup", "192.0.2.1", "c@example.org"}, limit: "signup-per-address",
			others: []limited{{"signup", "192.0.2.2", "c@example.org"}, {"login", "192.0.2.1", known}},
		},
		{
			name:   "sign-ups per IPv6 address count its /64",
			limits: account.Limits{SignUp: account.Rates{PerAddress: r(1)}},
			fit:    []limited{{"signup", "2001:db8:1:2::1", "a@example.org"}},
			refuse: limited{"signup", "2001:db8:1:2::ffff", "b@example.org"}, limit: "signup-per-address",
			others: []limited{{"signup", "2001:db8:1:3::1", "b@example.org"}},
		},
		{
			name:   "sign-ups per /24",
			limits: account.Limits{SignUp: account.Rates{PerNetwork: r(2)}},
			fit:    []limited{{"signup", "192.0.2.1", "a@example.org"}, {"signup", "192.0.2.2", "b@example.org"}},
			refuse: limited{"signup", "192.0.2.3", "c@example.org"}, limit: "signup-per-network",
			others: []limited{{"signup", "198.51.100.1", "c@example.org"}},
		},
		{
			name:   "sign-ups per /48",
			limits: account.Limits{SignUp: account.Rates{PerNetwork: r(2)}},
			fit:    []limited{{"signup", "2001:db8:1:1::1", "a@example.org"}, {"signup", "2001:db8:1:2::1", "b@example.org"}},
			refuse: limited{"signup", "2001:db8:1:ffff::1", "c@example.org"}, limit: "signup-per-network",
			others: []limited{{"signup", "2001:db8:2::1", "c@example.org"}},
		},
		{
			name:   "sign-ups overall",
			limits: account.Limits{SignUp: account.Rates{Overall: r(2)}},
			fit:    []limited{{"signup", "192.0.2.1", "a@example.org"}, {"signup", "198.51.100.1", "b@example.org"}},
			refuse: limited{"signup", "203.0.113.1", "c@example.org"}, limit: "signup-overall",
			others: []limited{{"login", "203.0.113.1", known}, {"connect", "203.0.113.1", "c@example.org"}},
		},
		{
			// An unknown address gets no mail, but counts: the limit tells
			// nobody who has an account.
			name:   "sign-in requests per address, unknown addresses included",
			limits: account.Limits{SignIn: account.Rates{PerAddress: r(2)}},
			fit:    []limited{{"login", "192.0.2.1", known}, {"login", "192.0.2.1", "nobody@example.org"}},
			refuse: limited{"login", "192.0.2.1", known}, limit: "login-per-address",
			others: []limited{{"login", "192.0.2.2", known}, {"signup", "192.0.2.1", "a@example.org"}},
		},
		{
			name:   "sign-in requests per /24",
			limits: account.Limits{SignIn: account.Rates{PerNetwork: r(2)}},
			fit:    []limited{{"login", "192.0.2.1", known}, {"login", "192.0.2.2", "nobody@example.org"}},
			refuse: limited{"login", "192.0.2.3", known}, limit: "login-per-network",
			others: []limited{{"login", "198.51.100.1", known}},
		},
		{
			name:   "sign-in requests overall",
			limits: account.Limits{SignIn: account.Rates{Overall: r(2)}},
			fit:    []limited{{"login", "192.0.2.1", known}, {"login", "198.51.100.1", "nobody@example.org"}},
			refuse: limited{"login", "203.0.113.1", known}, limit: "login-overall",
			others: []limited{{"signup", "203.0.113.1", known}},
		},
		{
			name:   "connect requests per address",
			limits: account.Limits{Connect: account.Rates{PerAddress: r(2)}},
			fit:    []limited{{"connect", "192.0.2.1", "a@example.org"}, {"connect", "192.0.2.1", known}},
			refuse: limited{"connect", "192.0.2.1", "b@example.org"}, limit: "connect-per-address",
			others: []limited{{"connect", "192.0.2.2", "b@example.org"}, {"signup", "192.0.2.1", "b@example.org"}},
		},
		{
			name:   "connect requests per /24",
			limits: account.Limits{Connect: account.Rates{PerNetwork: r(2)}},
			fit:    []limited{{"connect", "192.0.2.1", "a@example.org"}, {"connect", "192.0.2.2", "b@example.org"}},
			refuse: limited{"connect", "192.0.2.3", "c@example.org"}, limit: "connect-per-network",
			others: []limited{{"connect", "198.51.100.1", "c@example.org"}},
		},
		{
			name:   "connect requests overall",
			limits: account.Limits{Connect: account.Rates{Overall: r(2)}},
			fit:    []limited{{"connect", "192.0.2.1", "a@example.org"}, {"connect", "198.51.100.1", "b@example.org"}},
			refuse: limited{"connect", "203.0.113.1", "c@example.org"}, limit: "connect-overall",
			others: []limited{{"signup", "203.0.113.1", "c@example.org"}},
		},
		{
			// Every route that mails a code counts toward the recipient,
			// whoever asks.
			name:   "codes mailed to one address",
			limits: account.Limits{MailPerRecipient: r(3)},
			fit: []limited{{"signup", "192.0.2.1", "victim@example.org"}, {"login", "198.51.100.1", "victim@example.org"},
				{"connect", "203.0.113.1", "victim@example.org"}},
			refuse: limited{"signup", "2001:db8::1", "victim@example.org"}, limit: "mail-per-recipient",
			others: []limited{{"signup", "2001:db8::1", "other@example.org"}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newLimitFixture(t, tc.limits)
			ctx := context.Background()
			if _, _, err := f.svc.CreateAccount(ctx, known); err != nil { // the operator's path: not limited
				t.Fatal(err)
			}
			for i, r := range tc.fit {
				if err := f.do(r); err != nil {
					t.Fatalf("request %d %v: %v", i, r, err)
				}
			}
			mailed := f.mail.count()
			_, before := f.svc.AccountByEmail(ctx, tc.refuse.email)
			err := f.do(tc.refuse)
			e := errs.As(err)
			if err == nil || e.Code != errs.RateLimited || e.HTTPStatus() != http.StatusTooManyRequests || e.RetryAfterMS <= 0 ||
				e.RetryAfterMS > time.Hour.Milliseconds() || e.Details["limit"] != tc.limit {
				t.Fatalf("over the limit: %v (details %v, retry %d ms), want 429 %s", err, e.Details, e.RetryAfterMS, tc.limit)
			}
			if f.mail.count() != mailed {
				t.Error("the refused request mailed a code")
			}
			if _, err := f.svc.AccountByEmail(ctx, tc.refuse.email); errs.CodeOf(before) == errs.NotFound && errs.CodeOf(err) != errs.NotFound {
				t.Errorf("the refused request made an account: %v", err)
			}
			for i, r := range tc.others {
				if err := f.do(r); err != nil {
					t.Errorf("another request %d %v: %v", i, r, err)
				}
			}
			// Two windows later the refused request fits again.
			f.clock.Advance(2 * time.Hour)
			if err := f.do(tc.refuse); err != nil {
				t.Errorf("after the window: %v", err)
			}
		})
	}
}

// Defaults: one address makes at most 10 accounts an hour by sign-up; no
// address is mailed a sixth code in an hour.
func TestAccountDefaultLimits(t *testing.T) {
	f := newLimitFixture(t, account.Limits{})
	for i := range 10 {
		if err := f.do(limited{"signup", "192.0.2.1", "user" + string(rune('a'+i)) + "@example.org"}); err != nil {
			t.Fatalf("sign-up %d: %v", i+1, err)
		}
	}
	if err := f.do(limited{"signup", "192.0.2.1", "eleven@example.org"}); errs.CodeOf(err) != errs.RateLimited {
		t.Fatalf("11th sign-up from one address: %v", err)
	}
	for i := range 4 { // the sign-up mailed the first
		if err := f.do(limited{"login", "198.51.100." + string(rune('1'+i)), "usera@example.org"}); err != nil {
			t.Fatalf("code %d: %v", i+2, err)
		}
	}
	if err := f.do(limited{"login", "203.0.113.1", "usera@example.org"}); errs.CodeOf(err) != errs.RateLimited {
		t.Fatalf("6th code to one address: %v", err)
	}
	// The counters outlive nothing: two windows after the last count the
	// sweep deletes them all.
	if n, err := f.svc.Sweep(context.Background()); err != nil || n != 0 {
		t.Fatalf("sweep within the window: %d %v", n, err)
	}
	f.clock.Advance(2*time.Hour + time.Minute)
	if n, err := f.svc.Sweep(context.Background()); err != nil || n == 0 {
		t.Fatalf("sweep after two windows: %d %v", n, err)
	}
	var left []map[string]any
	if err := store.List(context.Background(), f.st, account.CollRateLimits, store.Query{}, &left); err != nil || len(left) != 0 {
		t.Fatalf("%d counters left, %v", len(left), err)
	}
}

func newLimitFixture(t *testing.T, l account.Limits) *limitFixture {
	t.Helper()
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "control.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	f := &limitFixture{st: st, mail: &mailbox{}, clock: &testclock.Clock{}}
	f.svc = account.New(account.Config{Store: st, Mail: f.mail, Now: f.clock.Now, Limits: l})
	return f
}

// The limits hold across copies of the control plane (Cloud Functions
// scale out): two services on one store, raced by 30 requests, let
// exactly the limit through, and mail exactly that many codes.
func TestAccountLimitsHoldAcrossCopies(t *testing.T) {
	a := newLimitFixture(t, account.Limits{})
	b := &limitFixture{st: a.st, mail: a.mail, clock: a.clock}
	b.svc = account.New(account.Config{Store: a.st, Mail: a.mail, Now: a.clock.Now})
	for _, tc := range []struct {
		name string
		req  func(i int) limited
		want int
	}{
		{"sign-ups from one address", func(i int) limited { return limited{"signup", "192.0.2.1", fmt.Sprintf("u%d@example.org", i)} }, 10},
		// v0 signs up first (one code mailed), so four more go.
		{"codes to one recipient", func(i int) limited { return limited{"login", fmt.Sprintf("10.%d.0.1", i), "v0@example.org"} }, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "codes to one recipient" {
				if err := a.do(limited{"signup", "203.0.113.9", "v0@example.org"}); err != nil {
					t.Fatal(err)
				}
			}
			mailed := a.mail.count()
			var wg sync.WaitGroup
			var mu sync.Mutex
			ok, limitedN := 0, 0
			for i := range 30 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					f := a
					if i%2 == 1 {
						f = b
					}
					err := f.do(tc.req(i))
					mu.Lock()
					defer mu.Unlock()
					switch errs.CodeOf(err) {
					case "":
						ok++
					case errs.RateLimited:
						limitedN++
					default:
						t.Errorf("request %d: %v", i, err)
					}
				}()
			}
			wg.Wait()
			if ok != tc.want || limitedN != 30-tc.want || a.mail.count()-mailed != tc.want {
				t.Fatalf("%d through, %d refused, %d mailed; want %d through", ok, limitedN, a.mail.count()-mailed, tc.want)
			}
		})
	}
}
