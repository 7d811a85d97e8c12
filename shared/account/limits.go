package account

import (
	"context"
	"errors"
	"fmt"
	"time"

	"agentmesh.dev/mesh/shared/httpx"
	"agentmesh.dev/mesh/shared/ratelimit"
	"agentmesh.dev/mesh/shared/store"
)

// CollRateLimits holds the counters of the account routes' rate limits
// (shared/ratelimit), so every copy of the control plane counts against
// the same numbers. Sweep deletes the ones that no longer matter.
const CollRateLimits = "account_rate_limits"

// Rates are the limits of one route: per client address (httpx.LimitKey:
// an IPv4 address, the /64 of an IPv6 one), per network (httpx.NetworkKey:
// the /24, the /48) and for the whole service, each a sliding window.
type Rates struct {
	PerAddress ratelimit.Rate
	PerNetwork ratelimit.Rate
	Overall    ratelimit.Rate
}

// Limits bound the routes that anyone may call without signing in and that
// make the service mail a code (and, for sign-up and connect, make an
// account): POST /v1/accounts (and the console's sign-in form, which
// signs up too), POST /v1/login, and POST /v1/connect when it mails a code
// (the session fast path mails nothing and is not counted). Every request
// counts, whether or not the address had an account, so a limit tells
// nobody who has one. MailPerRecipient bounds the codes mailed to one
// address by all three together.
//
// Everything is counted in the store, in the transaction that records the
// code, before the mail is sent; a refused request mails nothing and
// counts nothing. Zero fields take DefaultLimits.
type Limits struct {
	SignUp           Rates
	SignIn           Rates
	Connect          Rates
	MailPerRecipient ratelimit.Rate
}

// DefaultLimits are the limits of a service that sets none. One address
// makes at most 10 sign-up and 10 connect requests an hour (so at most 20
// new accounts), a /24 30 of each; no address is mailed more than 5 codes
// an hour. The console's sign-in form is a sign-up request, and a session
// lasts 30 days, so a person meets these only when many share one address.
func DefaultLimits() Limits {
	h := func(n int) ratelimit.Rate { return ratelimit.Rate{Max: n, Window: time.Hour} }
	return Limits{
		SignUp:           Rates{PerAddress: h(10), PerNetwork: h(30), Overall: h(300)},
		SignIn:           Rates{PerAddress: h(20), PerNetwork: h(60), Overall: h(1000)},
		Connect:          Rates{PerAddress: h(10), PerNetwork: h(30), Overall: h(300)},
		MailPerRecipient: h(5),
	}
}

func (r Rates) or(d Rates) Rates {
	return Rates{PerAddress: r.PerAddress.Or(d.PerAddress), PerNetwork: r.PerNetwork.Or(d.PerNetwork), Overall: r.Overall.Or(d.Overall)}
}

// withDefaults fills the zero fields from DefaultLimits.
func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	return Limits{SignUp: l.SignUp.or(d.SignUp), SignIn: l.SignIn.or(d.SignIn), Connect: l.Connect.or(d.Connect),
		MailPerRecipient: l.MailPerRecipient.Or(d.MailPerRecipient)}
}

// Check reports a limit that cannot be counted.
func (l Limits) Check() error {
	l = l.withDefaults()
	for _, r := range []ratelimit.Rate{l.SignUp.PerAddress, l.SignUp.PerNetwork, l.SignUp.Overall,
		l.SignIn.PerAddress, l.SignIn.PerNetwork, l.SignIn.Overall,
		l.Connect.PerAddress, l.Connect.PerNetwork, l.Connect.Overall, l.MailPerRecipient} {
		if !r.Valid() {
			return fmt.Errorf("account rate %s needs a positive count and window", r)
		}
	}
	return nil
}

// Knobs are the operator settings of l (meshd flags, and the same
// environment variables for meshd and the Cloud Functions); each sets its
// field of l, and its default is the field's value when Knobs is called.
func (l *Limits) Knobs() []ratelimit.Knob {
	var out []ratelimit.Knob
	for _, op := range []struct {
		name, what string
		r          *Rates
	}{
		{"signup", "sign-ups (POST /v1/accounts, the console's sign-in form)", &l.SignUp},
		{"login", "sign-in code requests (POST /v1/login)", &l.SignIn},
		{"connect", "connect requests that mail a code (POST /v1/connect)", &l.Connect},
	} {
		out = append(out,
			ratelimit.RateKnob("limit-"+op.name+"-per-address", op.what+" per client address per window", &op.r.PerAddress),
			ratelimit.RateKnob("limit-"+op.name+"-per-network", op.what+" per /24 (IPv6: /48) per window", &op.r.PerNetwork),
			ratelimit.RateKnob("limit-"+op.name+"-overall", op.what+" on the whole service per window", &op.r.Overall))
	}
	return append(out, ratelimit.RateKnob("limit-mail-per-recipient",
		"codes mailed to one email address per window (sign-up, sign-in and connect together)", &l.MailPerRecipient))
}

// route is one limited route: its name in counters and refusals.
type route struct {
	name  string // "signup", "login", "connect"
	rates func(Limits) Rates
}

var (
	routeSignUp  = route{"signup", func(l Limits) Rates { return l.SignUp }}
	routeSignIn  = route{"login", func(l Limits) Rates { return l.SignIn }}
	routeConnect = route{"connect", func(l Limits) Rates { return l.Connect }}
)

// limitMailRecipient names the per-recipient limit.
const limitMailRecipient = "mail-per-recipient"

// take counts one request of rt from the client from, for a code to email,
// inside tx at now: the route's three limits and the recipient's. It
// reads, then writes; the caller must not have written before it nor read
// after it. Over a limit it writes nothing and returns the 429.
func (s *Service) take(tx store.Tx, rt route, from, email string, now time.Time) error {
	r := rt.rates(s.cfg.Limits)
	from = httpx.LimitKey(from)
	net := httpx.NetworkKey(from)
	err := ratelimit.Take(tx, CollRateLimits, now,
		r.PerAddress.Limit(rt.name+"-per-address", from),
		r.PerNetwork.Limit(rt.name+"-per-network", net),
		r.Overall.Limit(rt.name+"-overall", ""),
		s.cfg.Limits.MailPerRecipient.Limit(limitMailRecipient, email))
	var ex *ratelimit.Exceeded
	if !errors.As(err, &ex) {
		return err
	}
	what := map[string]string{"signup": "sign-ups", "login": "sign-in requests", "connect": "connect requests"}[rt.name]
	switch ex.Limit.Name {
	case limitMailRecipient:
		what = "codes mailed to this address"
	case rt.name + "-per-address":
		what += " from your address"
	case rt.name + "-per-network":
		what += " from your network (" + net + ")"
	default:
		what += " on this service"
	}
	return ratelimit.Refusal(ex, what)
}

// Sweep deletes the rate-limit counters that no longer matter (two windows
// after their last count), so a flood from many addresses leaves nothing
// behind. It is a scheduled row run every SweepInterval. It returns how
// many it deleted.
func (s *Service) Sweep(ctx context.Context) (int, error) {
	n, err := ratelimit.Sweep(ctx, s.st, CollRateLimits, s.now())
	return n, txErr(err)
}

// SweepInterval is how often Sweep runs (Cloud Scheduler in the cloud, a
// ticker in meshd).
const SweepInterval = 10 * time.Minute
