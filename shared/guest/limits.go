package guest

import (
	"errors"
	"fmt"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/httpx"
	"agentmesh.dev/mesh/shared/ratelimit"
	"agentmesh.dev/mesh/shared/store"
)

// CollRateLimits holds the counters of the lease rate limits
// (shared/ratelimit), so every copy of the control plane counts against
// the same numbers. Sweep deletes the ones that no longer matter.
const CollRateLimits = "guest_rate_limits"

// Limits bound what one client, one network and everyone together can take
// from the guest pool. A client is its address as httpx.LimitKey keys it
// (an IPv4 address, or the /64 of an IPv6 one); its network is
// httpx.NetworkKey of that (the IPv4 /24, the IPv6 /48).
//
// Two kinds of limit apply to POST /v1/guest, in this order:
//
//   - Live leases: a client holds at most LivePerAddress at once, a network
//     at most LivePerNetwork; the pool has Pool in all; and the last Reserve
//     free leases go only to networks holding none, so one party owning many
//     networks still leaves room for newcomers and a single network never
//     holds more than LivePerNetwork (a tenth of the default pool).
//   - Leases issued per window (sliding): per client, per network and
//     overall. They bound churn (issue, release, issue), and every lease
//     that ends adds its key to the account JWT's revocations.
//
// Over a limit the answer is 429 RATE_LIMITED with retry_after_ms and
// details.limit naming it; 503 with details.reason "pool_exhausted" only
// when every lease of the pool is taken. Zero fields take DefaultLimits.
type Limits struct {
	Pool           int
	LivePerAddress int
	LivePerNetwork int
	Reserve        int
	PerAddress     ratelimit.Rate
	PerNetwork     ratelimit.Rate
	Overall        ratelimit.Rate
}

// DefaultLimits are the limits of a mesh that sets none: one address can
// run three sandboxes at once and start twenty an hour; a /24 ten and sixty;
// everyone together six hundred an hour from a pool of a hundred, ten of
// which are kept for networks that hold no lease.
func DefaultLimits() Limits {
	return Limits{
		Pool:           DefaultPoolSize,
		LivePerAddress: DefaultPerIP,
		LivePerNetwork: 10,
		Reserve:        10,
		PerAddress:     ratelimit.Rate{Max: 20, Window: time.Hour},
		PerNetwork:     ratelimit.Rate{Max: 60, Window: time.Hour},
		Overall:        ratelimit.Rate{Max: 600, Window: time.Hour},
	}
}

// withDefaults fills the zero fields from DefaultLimits.
func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	def := func(v *int, dv int) {
		if *v <= 0 {
			*v = dv
		}
	}
	def(&l.Pool, d.Pool)
	def(&l.LivePerAddress, d.LivePerAddress)
	def(&l.LivePerNetwork, d.LivePerNetwork)
	def(&l.Reserve, d.Reserve)
	l.PerAddress = l.PerAddress.Or(d.PerAddress)
	l.PerNetwork = l.PerNetwork.Or(d.PerNetwork)
	l.Overall = l.Overall.Or(d.Overall)
	return l
}

// Check reports settings that cannot work together: a reserve that leaves
// no lease for anyone who already holds one.
func (l Limits) Check() error {
	l = l.withDefaults()
	if l.Reserve >= l.Pool {
		return fmt.Errorf("the guest reserve (%d) must be smaller than the pool (%d)", l.Reserve, l.Pool)
	}
	for _, r := range []ratelimit.Rate{l.PerAddress, l.PerNetwork, l.Overall} {
		if !r.Valid() {
			return fmt.Errorf("guest lease rate %s needs a positive count and window", r)
		}
	}
	return nil
}

// Knobs are the operator settings of l (meshd flags, and the same
// environment variables for meshd and the Cloud Functions); each sets its
// field of l, and its default is the field's value when Knobs is called.
func (l *Limits) Knobs() []ratelimit.Knob {
	return []ratelimit.Knob{
		ratelimit.CountKnob("limit-guest-pool", "guest leases live at once on the whole mesh", 1, &l.Pool),
		ratelimit.CountKnob("limit-guest-live-per-address", "guest leases one client address holds at once (IPv6: per /64)", 1, &l.LivePerAddress),
		ratelimit.CountKnob("limit-guest-live-per-network", "guest leases one /24 (IPv6: /48) holds at once", 1, &l.LivePerNetwork),
		ratelimit.CountKnob("limit-guest-reserve", "last free guest leases kept for networks that hold none", 1, &l.Reserve),
		ratelimit.RateKnob("limit-guest-per-address", "guest leases issued per client address per window", &l.PerAddress),
		ratelimit.RateKnob("limit-guest-per-network", "guest leases issued per /24 (IPv6: /48) per window", &l.PerNetwork),
		ratelimit.RateKnob("limit-guest-overall", "guest leases issued on the whole mesh per window", &l.Overall),
	}
}

// Names of the limits, in counters and in details.limit of a refusal.
const (
	limitLiveAddress = "guest-live-per-address"
	limitLiveNetwork = "guest-live-per-network"
	limitReserve     = "guest-reserve"
	limitAddress     = "guest-per-address"
	limitNetwork     = "guest-per-network"
	limitOverall     = "guest-overall"
)

// admit decides inside tx whether the client ip may lease one more guest
// credential at now, given the live leases of the pool. It reads only,
// and counts the lease against the rate limits when it admits it: the
// caller must not write before it, and must not read after it.
func (s *Service) admit(tx store.Tx, live []Lease, ip string, now time.Time) error {
	l := s.cfg.Limits
	net := httpx.NetworkKey(ip)
	var fromIP, fromNet []Lease
	for _, x := range live {
		if x.IP == ip {
			fromIP = append(fromIP, x)
		}
		if httpx.NetworkKey(x.IP) == net {
			fromNet = append(fromNet, x)
		}
	}
	switch {
	case len(fromIP) >= l.LivePerAddress:
		return liveRefusal(limitLiveAddress, fromIP, now,
			fmt.Sprintf("this address already holds %d guest leases; release one or wait for one to lapse", l.LivePerAddress))
	case len(fromNet) >= l.LivePerNetwork:
		return liveRefusal(limitLiveNetwork, fromNet, now,
			fmt.Sprintf("your network (%s) already holds %d guest leases; release one or wait for one to lapse", net, l.LivePerNetwork))
	case len(live) >= l.Pool:
		return errs.New(errs.Unavailable, "pool_exhausted: every guest credential is leased; retry later").
			WithDetail("reason", "pool_exhausted").WithRetryAfter(60_000)
	case l.Pool-len(live) <= l.Reserve && len(fromNet) > 0:
		return liveRefusal(limitReserve, live, now,
			"the guest pool is nearly full and its last leases are kept for networks that hold none; release one of your network's leases or retry later")
	}
	err := ratelimit.Take(tx, CollRateLimits, now,
		l.PerAddress.Limit(limitAddress, ip),
		l.PerNetwork.Limit(limitNetwork, net),
		l.Overall.Limit(limitOverall, ""))
	var ex *ratelimit.Exceeded
	if errors.As(err, &ex) {
		what := map[string]string{
			limitAddress: "guest credentials from your address",
			limitNetwork: "guest credentials from your network (" + net + ")",
			limitOverall: "guest credentials on this mesh",
		}[ex.Limit.Name]
		return ratelimit.Refusal(ex, what)
	}
	return err
}

// liveRefusal is the 429 of a cap on live leases: retry when the first of
// the leases that fill it lapses (a release or a lapse may come sooner).
func liveRefusal(name string, holding []Lease, now time.Time, msg string) error {
	first := int64(0)
	for _, x := range holding {
		if first == 0 || x.LeaseUntil < first {
			first = x.LeaseUntil
		}
	}
	after := max(first-now.UnixMilli(), 1)
	return errs.New(errs.RateLimited, msg).WithRetryAfter(after).WithDetail("limit", name)
}
