// Package registrar is the handle registrar (spec §1, §2.1–2.2, §3.1, §4.1;
// upstream-notes §12): a person proves an email address with a mailed
// code, claims `<name>.<email>` handles with the session that gives, and
// binds an agent to a handle with a single-use pairing code the agent
// signs; anyone resolves a handle (or an agent id) to a card signed by the
// registrar's key.
//
// Every secret is stored only hashed: session tokens (256 bits) as their
// SHA-256, and the short codes (email codes, pairing codes) as an
// HMAC-SHA256 keyed with a secret derived from the registrar's signing key,
// so that a leaked store does not give away live codes (SHA-256 when the
// registrar has no key). Everything single use is consumed in the
// transaction that checks it, and every rate limit is kept in the store so
// it holds across replicas. docs/registrar.md is the reference of the HTTP
// surface.
package registrar

import (
	"crypto/hkdf"
	"crypto/sha256"
	"errors"
	"log/slog"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/secret"
	"agentmesh.dev/mesh/shared/store"
)

// Collections of the control-plane store this package owns. Handles live
// in account.CollHandles ("handles"), shared with the control plane, whose
// agent key exchange may bind a handle too.
const (
	CollCodes      = "registrar_email_codes"   // id: hash of the address → its pending codes
	CollSessions   = "registrar_sessions"      // id: SHA-256 of the session token
	CollPairing    = "registrar_pairing_codes" // id: keyed hash of the normalised pairing code (codeHasher)
	CollOperators  = "registrar_operators"     // id: the address → its operator name, as kept before it moved to the account; Claim and Sweep move each one there
	CollRateLimits = "registrar_rate_limits"   // id: hash of (limit, key); see shared/ratelimit
)

// Defaults (upstream-notes §12–13).
const (
	CodeTTL         = 15 * time.Minute
	CodeAttempts    = 5
	SessionTTL      = 8 * time.Hour
	PairingTTL      = 10 * time.Minute
	CardTTL         = time.Hour
	MaxName         = 64 // bytes, after trimming
	MaxOperatorName = 80 // characters
	// SessionPrefix starts every registrar session token.
	SessionPrefix = "rgs_"
	// Protocol is the endpoint protocol of a mesh agent on a card. The
	// specification (§2.2) says "mesh"; upstream says "agentmesh". The
	// specification wins; the adapter accepts both.
	Protocol = "mesh"
	// KeyUse is the use of every key in the key set.
	KeyUse = "pan-card-signing"
)

// Limits are the registrar's rate limits; zero fields take the defaults of
// upstream-notes §12.2–12.3.
type Limits struct {
	CodesPerAddress int // verification codes mailed per address per window (5)
	CodesPerIP      int // per client IP (15)
	CodesOverall    int // for the whole registrar (500)
	PairingPerIP    int // pairing completions per client IP (60)
	// VerifyFailuresPerIP bounds the refused verification tries (wrong,
	// expired or no code pending) per client IP (30; not in upstream).
	VerifyFailuresPerIP int
	// LivePairingCodes is how many unexpired pairing codes one address may
	// hold at once (10; not in upstream).
	LivePairingCodes int
	Window           time.Duration
}

func (l Limits) withDefaults() Limits {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&l.CodesPerAddress, 5)
	def(&l.CodesPerIP, 15)
	def(&l.CodesOverall, 500)
	def(&l.PairingPerIP, 60)
	def(&l.VerifyFailuresPerIP, 30)
	def(&l.LivePairingCodes, 10)
	if l.Window <= 0 {
		l.Window = time.Hour
	}
	return l
}

// Config is what the service needs: its dependencies and its settings.
type Config struct {
	// Store is the control-plane store.
	Store store.Store
	// Mail delivers the verification codes.
	Mail mail.Sender
	// Signer is the registrar's card-signing key. Nil: this registrar
	// cannot sign, so resolve and the key set answer 503 (never an
	// unsigned card) while claiming and pairing still work.
	Signer keys.Signer
	// URL is the registrar's public base URL: the `registrar` of every
	// card, and the base of WebFinger links.
	URL string
	// Now is the clock (time.Now when nil).
	Now func() time.Time
	// Log receives what happened; never a code, token or seed.
	Log *slog.Logger
	// Limits are the rate limits.
	Limits Limits
	// CardTTL is how long a signed card is valid (1 h; clamped to
	// 60 s–24 h as upstream does).
	CardTTL time.Duration
}

// Service is the registrar.
type Service struct {
	st      store.Store
	mail    mail.Sender
	signer  keys.Signer
	url     string
	now     func() time.Time
	log     *slog.Logger
	limits  Limits
	cardTTL time.Duration
	// codes hashes the short codes for storage (codeHasher).
	codes secret.CodeHasher
}

// New builds the service.
func New(cfg Config) *Service {
	s := &Service{st: cfg.Store, mail: cfg.Mail, signer: cfg.Signer, url: strings.TrimRight(cfg.URL, "/"),
		now: cfg.Now, log: cfg.Log, limits: cfg.Limits.withDefaults(), cardTTL: cfg.CardTTL, codes: codeHasher(cfg.Signer)}
	if s.now == nil {
		s.now = time.Now
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	switch {
	case s.cardTTL <= 0:
		s.cardTTL = CardTTL
	case s.cardTTL < time.Minute:
		s.cardTTL = time.Minute
	case s.cardTTL > 24*time.Hour:
		s.cardTTL = 24 * time.Hour
	}
	return s
}

// codeKeyTag is what the registrar key signs to derive the code-hashing
// secret. It is not JSON, so it is never a card the registrar signs for the
// world, and the signature over it is never published.
const codeKeyTag = "agentmesh registrar: code-hashing key v1"

// codeHasher keys the hashes of email and pairing codes with a secret only
// the registrar key's holder can compute: HKDF-SHA256 of the key's Ed25519
// signature over codeKeyTag. Ed25519 signs deterministically, so every
// replica and every restart with the same key derives the same secret.
// Without a key the codes are hashed with plain SHA-256 (and a leaked
// store gives them away to anyone who tries them all). Changing the key
// voids the codes pending at that moment (they live 15 minutes at most).
func codeHasher(signer keys.Signer) secret.CodeHasher {
	if signer == nil {
		return secret.CodeHasher{}
	}
	sig := signer.Sign([]byte(codeKeyTag))
	key, err := hkdf.Key(sha256.New, sig, nil, "registrar code hashes", 32)
	clear(sig)
	if err != nil {
		panic("registrar: hkdf: " + err.Error()) // only for an impossible length
	}
	return secret.NewCodeHasher(key)
}

// URL is the registrar's base URL as cards name it.
func (s *Service) URL() string { return s.url }

const storeDown = "the registrar's store is unavailable; retry shortly"

// txErr passes protocol errors through and turns store failures into 503.
func txErr(err error) error { return errs.OrUnavailable(err, storeDown) }

// getOptional reads coll/id into dst and reports whether it was there.
func getOptional(tx store.Tx, coll, id string, dst any) (bool, error) {
	err := tx.Get(coll, id, dst)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, store.ErrNotFound):
		return false, nil
	}
	return false, err
}

func ms(t time.Time) int64 { return t.UnixMilli() }
