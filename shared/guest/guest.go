// Package guest leases sandbox credentials (spec §4.4, §5 "Rules on
// credentials"): no account, a fresh key per lease, a lease kept alive by
// heartbeats and ended early by a signed release, caps on concurrent leases
// per client address and per network, rate limits, and a pool capacity for
// the whole instance (limits.go).
//
// The pool is a capacity, not a stock of pre-minted keys: a key handed back
// to a pool could be reused by whoever held it before, so every lease gets a
// fresh key and a lapsed or released one is revoked at the broker.
package guest

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"agentmesh.dev/mesh/shared/credential"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/httpx"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/ratelimit"
	"agentmesh.dev/mesh/shared/store"
)

// CollLeases holds one document per lease, keyed by the guest public key.
const CollLeases = "guest_leases"

// Defaults (spec §8: 10-minute idle lease on the reference deployment;
// upstream: 3 leases per address).
const (
	DefaultIdleTTL  = 10 * time.Minute
	DefaultPerIP    = 3
	DefaultPoolSize = 100
	// DefaultCredentialTTL is the JWT's own expiry, later than any lease:
	// the lease, not the JWT, is what ends a guest (by revocation).
	DefaultCredentialTTL = 24 * time.Hour
	// SweepInterval is how often lapsed leases are ended (Sweep): a
	// scheduled row, so Cloud Scheduler in the cloud, a ticker in meshd.
	SweepInterval   = time.Minute
	signatureWindow = 5 * time.Minute
)

// Config is what the service needs.
type Config struct {
	Store   store.Store
	Trust   *creds.Trust // nil: guests are not configured (501)
	Revoker credential.Revoker
	// Evictor clears what an ended lease left on the bus; nil when the
	// control plane has no bus connection (the registry's sandbox sweep
	// then removes the registration an hour later, spec §3.3).
	Evictor Evictor
	// Roster records every leased key where the registry reads it, so a
	// guest is sandbox on whichever register subject it uses
	// (registry.GuestRoster). Nil when the control plane has no bus
	// connection: its guests then get creds.PinnedGuestPermissions, their
	// own bound register subject only, which alone makes them sandbox.
	Roster  Roster
	Mesh    credential.MeshInfo
	IdleTTL time.Duration
	// Limits bound what one address, one network and everyone take from
	// the pool; zero fields take DefaultLimits.
	Limits        Limits
	CredentialTTL time.Duration
	// Class are the guest credentials' fence limits; nil means
	// creds.DefaultClassLimits()[creds.ClassGuest].
	Class *creds.ClassLimits
	Now   func() time.Time
	Log   *slog.Logger
}

// Service leases guest credentials.
type Service struct {
	cfg Config
	st  store.Store
	now func() time.Time
	log *slog.Logger
}

// New builds the service.
func New(cfg Config) *Service {
	if cfg.IdleTTL <= 0 {
		cfg.IdleTTL = DefaultIdleTTL
	}
	cfg.Limits = cfg.Limits.withDefaults()
	if cfg.CredentialTTL <= 0 {
		cfg.CredentialTTL = DefaultCredentialTTL
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Mesh.Protocol == "" {
		cfg.Mesh.Protocol = "0.3"
	}
	return &Service{cfg: cfg, st: cfg.Store, now: cfg.Now, log: cfg.Log}
}

// Lease is one guest lease.
type Lease struct {
	Key string `json:"key"`
	// IP is the client's key for the per-address cap (httpx.ClientKey):
	// an IPv4 address, or the /64 of an IPv6 one.
	IP         string `json:"ip"`
	IssuedAt   int64  `json:"issued_at"`
	LeaseUntil int64  `json:"lease_until"`
	Active     bool   `json:"active"`
	EndedAt    int64  `json:"ended_at,omitempty"`
	EndReason  string `json:"end_reason,omitempty"` // released, idle, unrecorded
	// PendingClear marks an ended lease whose bus leftovers (registration,
	// activity rows, the roster's record) are not yet confirmed cleared, or
	// whose credential is not yet confirmed revoked; every sweep retries.
	PendingClear bool `json:"pending_clear,omitempty"`
}

// Evictor removes an ended guest's registration and erases its activity
// rows and counters (spec §3.3, "guest lease" row). It must be safe to
// call again for keys already cleared.
type Evictor interface {
	EvictGuests(ctx context.Context, keys []string) error
}

// Roster is the list of live guest keys the registry reads to file a
// registration as sandbox.
type Roster interface {
	// Record stores key as a guest whose credential expires at expires
	// (the record lasts at least that long unless forgotten). It returns
	// only once every registry copy can read it; recording a key again is
	// not an error.
	Record(ctx context.Context, key string, expires time.Time) error
	// Forget removes keys; a key that is not there is not an error.
	Forget(ctx context.Context, keys []string) error
}

// Grant is the answer of POST /v1/guest.
type Grant struct {
	JWT          string         `json:"jwt"`
	Seed         string         `json:"seed"`
	PublicKey    string         `json:"publicKey"`
	ExpiresAt    string         `json:"expires_at"`
	Limits       map[string]any `json:"limits"`
	Sandbox      bool           `json:"sandbox"`
	Discoverable bool           `json:"discoverable"`
	TrustTier    string         `json:"trust_tier"`
	Mesh         map[string]any `json:"mesh"`
	// InboxPrefix is the reply prefix the guest must set on its
	// connection: a guest has no shared _INBOX.> grant.
	InboxPrefix string `json:"inbox_prefix"`
}

func ms(t time.Time) int64 { return t.UnixMilli() }

func (s *Service) limits() map[string]any {
	c := s.class()
	return map[string]any{
		"idle_ttl_seconds":    int(s.cfg.IdleTTL / time.Second),
		"leases_per_address":  s.cfg.Limits.LivePerAddress,
		"max_inbound_chars":   protocol.DefaultMaxInbound,
		"max_payload_bytes":   c.Payload,
		"max_subscriptions":   c.Subs,
		"max_connections":     c.Conns,
		"max_msgs_per_sec":    c.MsgsPerSec,
		"max_bytes_per_sec":   c.BytesPerSec,
		"mailbox":             false,
		"visibility":          "unlisted",
		"heartbeat_every_sec": int(s.cfg.IdleTTL / time.Second / 3),
	}
}

// class is the guest fence class's limits (Config.Class, else the default).
func (s *Service) class() creds.ClassLimits {
	if s.cfg.Class != nil {
		return *s.cfg.Class
	}
	return creds.DefaultClassLimits()[creds.ClassGuest]
}

// Issue leases a fresh guest credential to the client at ip, its key for
// the per-address limits (httpx.ClientKey, so an IPv6 client counts by its
// /64); its network's limits count httpx.NetworkKey of it (see Limits).
func (s *Service) Issue(ctx context.Context, ip string) (Grant, error) {
	if s.cfg.Trust == nil {
		return Grant{}, errs.New(errs.NotImplemented, "guest credentials are not configured on this instance")
	}
	k, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		return Grant{}, errs.Wrap(errs.InternalError, "guest key", err)
	}
	ip = httpx.LimitKey(ip)
	now := s.now()
	perms := creds.PinnedGuestPermissions(k.Public())
	if s.cfg.Roster != nil {
		perms = creds.GuestPermissions(k.Public())
	}
	lease := Lease{Key: k.Public(), IP: ip, IssuedAt: ms(now), LeaseUntil: ms(now.Add(s.cfg.IdleTTL)), Active: true}
	credExpires := now.Add(s.cfg.CredentialTTL)
	var lapsed []string
	var tok string
	err = s.st.RunTx(ctx, func(tx store.Tx) error {
		lapsed = nil
		var active []Lease
		if err := tx.Query(CollLeases, store.Where("active", true), &active); err != nil {
			return err
		}
		var live []Lease
		for _, l := range active {
			if l.LeaseUntil <= ms(now) {
				lapsed = append(lapsed, l.Key)
				continue
			}
			live = append(live, l)
		}
		if err := s.admit(tx, live, ip, now); err != nil {
			return err
		}
		var err error
		tok, err = s.cfg.Trust.MintUser(creds.UserSpec{PublicKey: k.Public(), Name: "guest", Kind: creds.KindGuest,
			Hosted: []string{k.Public()}, Permissions: perms, Expires: credExpires,
			Class: creds.ClassGuest, Limits: s.class().ConnLimits})
		if err != nil {
			return errs.Wrap(errs.InternalError, "the guest credential could not be signed", err)
		}
		if err := s.end(tx, lapsed, now, "idle"); err != nil {
			return err
		}
		return tx.Create(CollLeases, lease.Key, lease)
	})
	if err != nil {
		if errs.CodeOf(err) == "" {
			err = errs.Wrap(errs.Unavailable, "the guest pool is unavailable; retry shortly", err)
		}
		return Grant{}, err
	}
	s.revoke(ctx, lapsed, now)
	// The registry must know the key for a guest before the guest holds
	// its credential: recorded now, or the credential is never handed out.
	if s.cfg.Roster != nil {
		if err := s.cfg.Roster.Record(ctx, lease.Key, credExpires); err != nil {
			s.abandon(ctx, lease.Key, now)
			return Grant{}, errs.Wrap(errs.Unavailable, "the guest pool is unavailable; retry shortly", err)
		}
	}
	return Grant{JWT: tok, Seed: string(k.Seed()), PublicKey: k.Public(), ExpiresAt: protocol.FormatTime(time.UnixMilli(lease.LeaseUntil)),
		Limits: s.limits(), Sandbox: true, Discoverable: false, TrustTier: "sandbox", InboxPrefix: protocol.PrivateInboxPrefix(k.Public()),
		Mesh: map[string]any{"name": s.cfg.Mesh.Name, "protocol": s.cfg.Mesh.Protocol,
			"nats_endpoints": append(append([]string{}, s.cfg.Mesh.TCP...), s.cfg.Mesh.WS...)}}, nil
}

// abandon ends a lease whose credential was never handed out, because its
// key could not be recorded. Nobody holds that credential, so there is
// nothing to revoke or clear; a record that was written after all expires
// with the credential. Left active, the lease would hold its place in the
// pool until it lapsed.
func (s *Service) abandon(ctx context.Context, key string, now time.Time) {
	// The client may be gone (a cancelled request is one way to fail
	// Record); the lease must end all the same.
	err := s.st.RunTx(context.WithoutCancel(ctx), func(tx store.Tx) error {
		return tx.Update(CollLeases, key, map[string]any{"active": false, "ended_at": ms(now), "end_reason": "unrecorded"})
	})
	if err != nil {
		s.log.Warn("a guest lease never handed out still counts until it lapses", "err", err)
	}
}

// end marks leases over inside tx (reads must already be done).
func (s *Service) end(tx store.Tx, keys []string, now time.Time, reason string) error {
	for _, k := range keys {
		if err := tx.Update(CollLeases, k, map[string]any{"active": false, "ended_at": ms(now), "end_reason": reason,
			"pending_clear": s.clears()}); err != nil {
			return err
		}
	}
	return nil
}

// clears reports whether an ended lease leaves anything on the bus to
// clear: registrations and activity (Evictor), the roster's record
// (Roster).
func (s *Service) clears() bool { return s.cfg.Evictor != nil || s.cfg.Roster != nil }

// clear asks the bus to forget the ended leases' guests, then records them
// cleared. revoked says the broker now refuses their credentials: only
// then are the keys taken off the roster, since a credential the broker
// still accepts must stay in the sandbox (without a Revoker the records
// expire with the credentials). A failure, or a revocation still to be
// done, is logged and left pending for the next sweep, which revokes again
// and clears again; the lease is over either way.
func (s *Service) clear(ctx context.Context, keys []string, revoked bool) {
	if len(keys) == 0 || !s.clears() {
		return
	}
	if s.cfg.Evictor != nil {
		if err := s.cfg.Evictor.EvictGuests(ctx, keys); err != nil {
			s.log.Warn("ended guests not yet cleared from the bus; the next sweep retries", "count", len(keys), "err", err)
			return
		}
	}
	if s.cfg.Roster != nil && s.cfg.Revoker != nil {
		if !revoked {
			s.log.Warn("ended guests stay on the guest roster until their credentials are revoked; the next sweep retries", "count", len(keys))
			return
		}
		if err := s.cfg.Roster.Forget(ctx, keys); err != nil {
			s.log.Warn("ended guests not yet taken off the guest roster; the next sweep retries", "count", len(keys), "err", err)
			return
		}
	}
	err := s.st.RunTx(ctx, func(tx store.Tx) error {
		for _, k := range keys {
			if err := tx.Update(CollLeases, k, map[string]any{"pending_clear": false}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		s.log.Warn("guests cleared but not recorded; the next sweep clears them again", "count", len(keys), "err", err)
	}
}

// revoke revokes keys' credentials at the broker and reports whether it
// did (false without a Revoker).
func (s *Service) revoke(ctx context.Context, keys []string, now time.Time) bool {
	if len(keys) == 0 || s.cfg.Revoker == nil {
		return false
	}
	// A failed push is logged: the lease is already over in the store, and
	// the next sweep or restart does not bring it back. A lease with
	// something to clear stays pending, and the sweep revokes it again;
	// otherwise the JWT's own expiry bounds the damage.
	// Recorded first, with the instant every covered credential has
	// expired by (none outlives its issue plus the credential lifetime):
	// the credential sweep keeps the broker's list in line with the
	// records and forgets them once that has passed.
	if err := credential.RecordRevocations(ctx, s.st, keys, now, now.Add(s.cfg.CredentialTTL)); err != nil {
		s.log.Warn("guest revocations not recorded: the broker keeps them for good", "count", len(keys), "err", err)
	}
	if err := s.cfg.Revoker.Revoke(ctx, keys, now.Truncate(time.Second)); err != nil {
		s.log.Warn("guest credentials not revoked at the broker", "count", len(keys), "err", err)
		return false
	}
	return true
}

// Signed is the body of heartbeat and release: the guest proves it holds
// the leased key.
type Signed struct {
	PublicKey string `json:"publicKey"`
	TS        *int64 `json:"ts"`
	Sig       string `json:"sig"`
}

// HeartbeatString is what a heartbeat signs (protocol.GuestHeartbeatString).
func HeartbeatString(publicKey string, ts int64) string {
	return protocol.GuestHeartbeatString(publicKey, ts)
}

// checkSigned verifies that b is signed over signedString(publicKey, ts).
func (s *Service) checkSigned(b Signed, signedString func(publicKey string, ts int64) string) error {
	if b.PublicKey == "" || b.TS == nil || b.Sig == "" {
		return errs.New(errs.InvalidRequest, "publicKey, ts and sig are required")
	}
	if d := s.now().Sub(time.Unix(*b.TS, 0)); d > signatureWindow || d < -signatureWindow {
		return errs.New(errs.Unauthorized, "stale timestamp; re-sign with the current time")
	}
	if protocol.VerifyString(b.PublicKey, []byte(signedString(b.PublicKey, *b.TS)), b.Sig, protocol.Base64Std) != nil {
		return errs.New(errs.Unauthorized, "signature does not verify against publicKey")
	}
	return nil
}

// Heartbeat keeps a lease alive for another idle period.
func (s *Service) Heartbeat(ctx context.Context, b Signed) (string, error) {
	if err := s.checkSigned(b, HeartbeatString); err != nil {
		return "", err
	}
	now := s.now()
	until := now.Add(s.cfg.IdleTTL)
	err := s.st.RunTx(ctx, func(tx store.Tx) error {
		var l Lease
		if err := tx.Get(CollLeases, b.PublicKey, &l); err != nil {
			return err
		}
		if !l.Active || l.LeaseUntil <= ms(now) {
			return errs.New(errs.Forbidden, "this guest lease has ended; request a new guest credential")
		}
		return tx.Update(CollLeases, b.PublicKey, map[string]any{"lease_until": ms(until)})
	})
	if errors.Is(err, store.ErrNotFound) {
		return "", errs.New(errs.NotFound, "no guest lease for that key")
	}
	if err != nil && errs.CodeOf(err) == "" {
		return "", errs.Wrap(errs.Unavailable, "the guest pool is unavailable; retry shortly", err)
	}
	return protocol.FormatTime(until), err
}

// Release ends a lease early, signed guest-release-v1:<publicKey>:<ts>.
func (s *Service) Release(ctx context.Context, b Signed) error {
	if err := s.checkSigned(b, protocol.GuestReleaseString); err != nil {
		return err
	}
	now := s.now()
	err := s.st.RunTx(ctx, func(tx store.Tx) error {
		var l Lease
		if err := tx.Get(CollLeases, b.PublicKey, &l); err != nil {
			return err
		}
		if !l.Active {
			return nil // releasing twice is quiet
		}
		return s.end(tx, []string{b.PublicKey}, now, "released")
	})
	if errors.Is(err, store.ErrNotFound) {
		return errs.New(errs.NotFound, "no guest lease for that key")
	}
	if err != nil {
		return errs.Wrap(errs.Unavailable, "the guest pool is unavailable; retry shortly", err)
	}
	revoked := s.revoke(ctx, []string{b.PublicKey}, now)
	s.clear(ctx, []string{b.PublicKey}, revoked)
	return nil
}

// Sweep ends every lease idle past its deadline, revokes its key and clears
// its guest from the bus, retries the revocation and clearing of leases
// that ended earlier without them (revoking a guest key again is harmless:
// it is never issued again), and deletes the rate-limit counters that no
// longer matter. meshd runs it every minute; Issue also sweeps what it
// reads.
func (s *Service) Sweep(ctx context.Context) (int, error) {
	now := s.now()
	var lapsed, pending []string
	err := s.st.RunTx(ctx, func(tx store.Tx) error {
		lapsed, pending = nil, nil
		var active, ended []Lease
		if err := tx.Query(CollLeases, store.Where("active", true), &active); err != nil {
			return err
		}
		if s.clears() {
			if err := tx.Query(CollLeases, store.Where("pending_clear", true), &ended); err != nil {
				return err
			}
		}
		for _, l := range active {
			if l.LeaseUntil <= ms(now) {
				lapsed = append(lapsed, l.Key)
			}
		}
		for _, l := range ended {
			if !l.Active {
				pending = append(pending, l.Key)
			}
		}
		return s.end(tx, lapsed, now, "idle")
	})
	if err != nil {
		return 0, err
	}
	ended := append(pending, lapsed...)
	revoked := s.revoke(ctx, ended, now)
	s.clear(ctx, ended, revoked)
	if _, err := ratelimit.Sweep(ctx, s.st, CollRateLimits, now); err != nil {
		s.log.Warn("expired guest rate-limit counters not deleted; the next sweep retries", "err", err)
	}
	return len(lapsed), nil
}

// Status is GET /auth/status: {available, issued}.
func (s *Service) Status(ctx context.Context) (available, issued int, err error) {
	var active []Lease
	if err := store.List(ctx, s.st, CollLeases, store.Where("active", true), &active); err != nil {
		return 0, 0, errs.Wrap(errs.Unavailable, "the guest pool is unavailable", err)
	}
	now := ms(s.now())
	for _, l := range active {
		if l.LeaseUntil > now {
			issued++
		}
	}
	if s.cfg.Trust == nil {
		return 0, issued, nil
	}
	return max(s.cfg.Limits.Pool-issued, 0), issued, nil
}
