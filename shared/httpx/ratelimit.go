package httpx

import (
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"agentmesh.dev/mesh/shared/errs"
)

// Limiter is a sliding-window rate limit keyed by a string (a client IP, an
// email address). It counts the current fixed window fully and the previous
// one weighted by how much of it still overlaps the sliding window — the
// usual two-counter approximation, exact enough for abuse limits and O(1)
// in memory per key.
//
// State is per process. Each Cloud Function instance limits on its own; a
// determined client spread over instances gets at most instances × limit.
type Limiter struct {
	max    int
	window time.Duration
	now    func() time.Time

	mu      sync.Mutex
	buckets map[string]*bucket
	swept   time.Time
}

type bucket struct {
	start     time.Time // start of the current fixed window
	cur, prev int
}

// NewLimiter allows max events per window per key. now may be nil.
func NewLimiter(max int, window time.Duration, now func() time.Time) *Limiter {
	if now == nil {
		now = time.Now
	}
	return &Limiter{max: max, window: window, now: now, buckets: map[string]*bucket{}}
}

// Allow records an event for key and reports whether it is within the
// limit; when it is not, retryAfter says how long until it would be.
func (l *Limiter) Allow(key string) (ok bool, retryAfter time.Duration) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sweep(now)
	b := l.buckets[key]
	if b == nil {
		b = &bucket{start: now.Truncate(l.window)}
		l.buckets[key] = b
	}
	l.roll(b, now)
	elapsed := now.Sub(b.start)
	weight := float64(l.window-elapsed) / float64(l.window)
	if float64(b.prev)*weight+float64(b.cur) >= float64(l.max) {
		// The earliest relief is the end of the current window, when the
		// previous window's weight drops out.
		return false, l.window - elapsed
	}
	b.cur++
	return true, 0
}

func (l *Limiter) roll(b *bucket, now time.Time) {
	start := now.Truncate(l.window)
	switch {
	case start.Equal(b.start):
	case start.Sub(b.start) == l.window:
		b.prev, b.cur, b.start = b.cur, 0, start
	default:
		b.prev, b.cur, b.start = 0, 0, start
	}
}

// sweep drops idle keys once per window so the map stays bounded by the
// number of keys active in the last two windows.
func (l *Limiter) sweep(now time.Time) {
	if now.Sub(l.swept) < l.window {
		return
	}
	l.swept = now
	for k, b := range l.buckets {
		if now.Sub(b.start) >= 2*l.window {
			delete(l.buckets, k)
		}
	}
}

// RateLimited is the 429 refusal with retry_after_ms.
func RateLimited(retryAfter time.Duration, what string) *errs.Error {
	ms := retryAfter.Milliseconds()
	if ms < 1 {
		ms = 1
	}
	return errs.Newf(errs.RateLimited, "too many requests%s; retry in %d ms", what, ms).WithRetryAfter(ms)
}

// ClientIP picks the address a limit is keyed on. Behind a trusted proxy
// (Cloud Functions' front end, a load balancer) the client is the
// right-most address the proxies did not add; trustedHops says how many
// proxies append to X-Forwarded-For. With 0 the socket address is used and
// the header is ignored, since anyone can write it.
func ClientIP(r *http.Request, trustedHops int) string {
	if trustedHops > 0 {
		if xff := r.Header.Get("X-Forwarded-For"); xff != "" {
			parts := strings.Split(xff, ",")
			if i := len(parts) - trustedHops; i >= 0 && i < len(parts) {
				if ip := strings.TrimSpace(parts[i]); net.ParseIP(ip) != nil {
					return ip
				}
			}
		}
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// LimitKey is what a per-client-IP limit counts under for the address ip.
// The address is canonicalised (no zone; an IPv4-mapped IPv6 address is
// its IPv4 address), and an IPv6 address counts as its /64 ("2001:db8::/64"):
// one subscriber is usually handed a whole /64, so a limit keyed on single
// IPv6 addresses would let one client walk around it. LimitKey of its own
// result is that result; a string that is not an IP address is returned
// unchanged. Every per-IP limit keys on this (httpx.PerIP, the registrar's
// store-kept limits, the guest leases per address).
func LimitKey(ip string) string {
	s := strings.TrimSpace(ip)
	if p, err := netip.ParsePrefix(s); err == nil && p.Bits() == 64 && p.Addr().Is6() && !p.Addr().Is4In6() && p.Addr().Zone() == "" {
		return p.Masked().String()
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return ip
	}
	a = a.WithZone("").Unmap()
	if a.Is4() {
		return a.String()
	}
	p, _ := a.Prefix(64)
	return p.String()
}

// NetworkKey is what a per-network limit counts under for the address ip
// (an address, or a LimitKey result): its IPv4 /24 ("192.0.2.0/24") or
// its IPv6 /48 ("2001:db8:1::/48"). A /24 is the smallest block one
// customer is usually routed, and a /48 the usual IPv6 site: a limit per
// network bounds what one party gets by walking the addresses it holds.
// A string that is neither an address nor a LimitKey prefix is returned
// unchanged, like LimitKey does; NetworkKey of its own result is that
// result.
func NetworkKey(ip string) string {
	k := LimitKey(ip)
	if p, err := netip.ParsePrefix(k); err == nil && p.Addr().Zone() == "" && !p.Addr().Is4In6() {
		switch a := p.Addr(); {
		case a.Is6() && p.Bits() >= 48:
			n, _ := a.Prefix(48)
			return n.String()
		case a.Is4() && p.Bits() >= 24:
			n, _ := a.Prefix(24)
			return n.String()
		}
		return ip
	}
	a, err := netip.ParseAddr(k)
	if err != nil || !a.Is4() {
		return ip
	}
	n, _ := a.Prefix(24)
	return n.String()
}

// ClientKey is LimitKey(ClientIP(r, trustedHops)): the key of the request's
// client for a per-IP limit.
func ClientKey(r *http.Request, trustedHops int) string {
	return LimitKey(ClientIP(r, trustedHops))
}

// PerIP wraps h with a per-client-IP limit (keyed by ClientKey); over it
// the request is answered 429 with retry_after_ms before h runs (and logged
// at debug on log, as every refusal is).
func PerIP(l *Limiter, trustedHops int, log *slog.Logger, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ok, after := l.Allow(ClientKey(r, trustedHops)); !ok {
			Fail(w, r, log, RateLimited(after, " from this address"))
			return
		}
		h.ServeHTTP(w, r)
	})
}
