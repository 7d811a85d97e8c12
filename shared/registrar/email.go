package registrar

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/httpx"
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/ratelimit"
	"agentmesh.dev/mesh/shared/secret"
	"agentmesh.dev/mesh/shared/store"
)

// emailCodes are the codes pending for one address. Each StartEmail adds
// one (so a second mail does not void the first); a wrong try costs every
// pending code one of its five tries; a right one deletes them all.
type emailCodes struct {
	// ID is the document's own id (codesID), and ExpiresAt the latest of
	// its codes' deadlines: what the sweep needs (see Sweep).
	ID        string        `json:"id"`
	Email     string        `json:"email"`
	Codes     []secret.Code `json:"codes"`
	ExpiresAt int64         `json:"expires_at"`
}

// with sets rec's codes, and its id and deadline to match.
func (rec emailCodes) with(codes []secret.Code) emailCodes {
	rec.ID, rec.Codes, rec.ExpiresAt = codesID(rec.Email), codes, 0
	for _, c := range codes {
		rec.ExpiresAt = max(rec.ExpiresAt, c.ExpiresAt)
	}
	return rec
}

// session is a registrar session, stored under the hash of its token.
type session struct {
	// ID is the document's own id (the hash of the token), for the sweep.
	ID    string `json:"id"`
	Email string `json:"email"`
	// Provenance is how the address was proven: "email" (a code mailed
	// by this registrar) or what the caller of SessionFor named
	// ("console"). It becomes the card's claimed_via.
	Provenance string `json:"provenance"`
	CreatedAt  int64  `json:"created_at"`
	ExpiresAt  int64  `json:"expires_at"`
}

// codesID is the document id of an address's pending codes.
func codesID(email string) string { return secret.Hash("registrar-code\x00" + email) }

// codeContext is what a code is hashed with: the address it was mailed to.
func codeContext(email string) string { return "registrar\x00" + email }

// Started is the answer of StartEmail.
type Started struct {
	Email    string `json:"email"`
	Delivery string `json:"delivery"` // "email"
}

// StartEmail mails a 6-digit code to email (POST /api/handles/start). The
// code lives 15 minutes and allows 5 tries. Codes are limited per address
// (5 an hour), per client IP (15; an IPv6 client by its /64, see
// httpx.LimitKey) and for the whole registrar (500); the counters are in the
// store, so the limits hold across replicas.
func (s *Service) StartEmail(ctx context.Context, email, ip string) (Started, error) {
	email, err := NormalizeEmail(email)
	if err != nil {
		return Started{}, err
	}
	ip = httpx.LimitKey(ip)
	now := s.now()
	code := secret.Digits(6)
	l := s.limits
	err = s.st.RunTx(ctx, func(tx store.Tx) error {
		var rec emailCodes
		if _, err := getOptional(tx, CollCodes, codesID(email), &rec); err != nil {
			return err
		}
		if err := ratelimit.Take(tx, CollRateLimits, now,
			ratelimit.Limit{Name: "code-per-address", Key: email, Max: l.CodesPerAddress, Window: l.Window},
			ratelimit.Limit{Name: "code-per-ip", Key: ip, Max: l.CodesPerIP, Window: l.Window},
			ratelimit.Limit{Name: "code-overall", Max: l.CodesOverall, Window: l.Window},
		); err != nil {
			return err
		}
		live := rec.Codes[:0]
		for _, c := range rec.Codes {
			if now.UnixMilli() < c.ExpiresAt && c.AttemptsLeft > 0 {
				live = append(live, c)
			}
		}
		rec = emailCodes{Email: email}.with(append(live, s.codes.NewCode(codeContext(email), code, now.Add(CodeTTL), CodeAttempts)))
		return tx.Set(CollCodes, codesID(email), rec)
	})
	if err != nil {
		return Started{Email: email}, s.limited(err)
	}
	body := fmt.Sprintf("Your code is %s\n\nEnter it where you asked to claim a handle at %s. It works once, for %d minutes.\nIf you did not ask for it, ignore this message: nothing happens without the code.\n",
		code, s.url, int(CodeTTL/time.Minute))
	if err := s.mail.Send(ctx, mail.Message{To: email, Subject: "Your code to claim a handle", Text: body, Kind: "handle-code"}); err != nil {
		s.log.Warn("verification code not mailed", "err", err)
		return Started{Email: email}, errs.Wrap(errs.DependencyFailed, "the verification code could not be mailed (a delivery problem on the registrar's side); try again shortly", err)
	}
	return Started{Email: email, Delivery: "email"}, nil
}

// limited renders a rate limit refusal as a 429 with retry_after_ms, saying
// which limit; other errors pass through txErr.
func (s *Service) limited(err error) error {
	var ex *ratelimit.Exceeded
	if !errors.As(err, &ex) {
		return txErr(err)
	}
	what := map[string]string{
		"code-per-address": "verification codes for this address",
		"code-per-ip":      "verification codes from your address",
		"code-overall":     "verification codes on this registrar",
		"pair-per-ip":      "pairing attempts from your address",
		"verify-per-ip":    "wrong or unknown verification codes from your address",
	}[ex.Limit.Name]
	after := ex.RetryAfter.Milliseconds()
	if after < 1 {
		after = 1
	}
	return errs.Newf(errs.RateLimited, "too many %s (at most %d an hour); retry in %d s", what, ex.Limit.Max, (after+999)/1000).
		WithRetryAfter(after).WithDetail("limit", ex.Limit.Name)
}

// Verified is the answer of Verify.
type Verified struct {
	Token     string    `json:"token"`
	ExpiresAt time.Time `json:"-"`
}

// Verify exchanges a mailed code for a session token that lives 8 hours
// (POST /api/handles/verify). A right code deletes every code pending for
// the address; a wrong one costs a try; an unknown, used or expired code is
// a 401 that says which. Every such refusal counts against the client IP's
// verify-per-ip limit (30 an hour; an IPv6 client by its /64); over it,
// verify answers 429 before comparing the code, so a client cannot burn
// other people's pending codes (five wrong tries each) cheaply.
func (s *Service) Verify(ctx context.Context, email, code, ip string) (Verified, error) {
	email, err := NormalizeEmail(email)
	if err != nil {
		return Verified{}, err
	}
	code = strings.TrimSpace(code)
	if code == "" {
		return Verified{}, errs.New(errs.InvalidRequest, "code is required: the 6 digits from the mail")
	}
	now := s.now()
	token := secret.Token(SessionPrefix)
	lim := ratelimit.Limit{Name: "verify-per-ip", Key: httpx.LimitKey(ip), Max: s.limits.VerifyFailuresPerIP, Window: s.limits.Window}
	var outcome error
	err = s.st.RunTx(ctx, func(tx store.Tx) error {
		outcome = nil
		var rec emailCodes
		found, err := getOptional(tx, CollCodes, codesID(email), &rec)
		if err != nil {
			return err
		}
		// Over the limit nothing is compared, so no try is spent and a
		// refusal tells nothing about the code.
		if err := ratelimit.Check(tx, CollRateLimits, now, lim); err != nil {
			return err
		}
		// refuse records a refused try against the IP; it must come before
		// the transaction's other writes.
		refuse := func(e error) error {
			outcome = e
			return ratelimit.Take(tx, CollRateLimits, now, lim)
		}
		if !found || len(rec.Codes) == 0 {
			return refuse(errs.New(errs.Unauthorized, "no code is pending for that address (unknown or already used): request a new one"))
		}
		matched, expired := false, 0
		live := rec.Codes[:0]
		for _, c := range rec.Codes {
			switch s.codes.Check(&c, codeContext(email), code, now) {
			case secret.CodeMatch:
				matched = true
			case secret.CodeExpired:
				expired++
			case secret.CodeWrong:
				live = append(live, c)
			}
		}
		switch {
		case matched:
			if err := tx.Delete(CollCodes, codesID(email)); err != nil {
				return err
			}
			return tx.Create(CollSessions, secret.Hash(token), session{ID: secret.Hash(token), Email: email, Provenance: "email",
				CreatedAt: ms(now), ExpiresAt: ms(now.Add(SessionTTL))})
		case len(live) == 0 && expired == len(rec.Codes):
			if err := refuse(errs.New(errs.Unauthorized, "that code has expired (codes last 15 minutes): request a new one")); err != nil {
				return err
			}
			return tx.Delete(CollCodes, codesID(email))
		case len(live) == 0:
			if err := refuse(errs.New(errs.Unauthorized, "wrong code, and that was the last try: request a new one")); err != nil {
				return err
			}
			return tx.Delete(CollCodes, codesID(email))
		}
		left := 0
		for _, c := range live {
			left = max(left, c.AttemptsLeft)
		}
		if err := refuse(errs.Newf(errs.Unauthorized, "wrong code; %d tries left", left).WithDetail("attempts_left", left)); err != nil {
			return err
		}
		rec = emailCodes{Email: email}.with(live)
		return tx.Set(CollCodes, codesID(email), rec)
	})
	if err != nil {
		return Verified{}, s.limited(err)
	}
	if outcome != nil {
		return Verified{}, outcome
	}
	return Verified{Token: token, ExpiresAt: now.Add(SessionTTL)}, nil
}

// SessionFor opens a registrar session for an address that the caller has
// already proven, for the console in the same binary: the console's
// signed-in account email. provenance names how ("console") and becomes the
// claimed_via of the handles claimed with it. Not an HTTP route.
func (s *Service) SessionFor(ctx context.Context, email, provenance string) (Verified, error) {
	email, err := NormalizeEmail(email)
	if err != nil {
		return Verified{}, err
	}
	if provenance == "" || len(provenance) > 64 || strings.ContainsFunc(provenance, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == ':' || r == '.' || r == '_')
	}) {
		return Verified{}, errs.New(errs.InvalidRequest, "provenance must be a short lower-case label such as \"console\"")
	}
	now := s.now()
	token := secret.Token(SessionPrefix)
	err = s.st.RunTx(ctx, func(tx store.Tx) error {
		return tx.Create(CollSessions, secret.Hash(token), session{ID: secret.Hash(token), Email: email, Provenance: provenance,
			CreatedAt: ms(now), ExpiresAt: ms(now.Add(SessionTTL))})
	})
	if err != nil {
		return Verified{}, txErr(err)
	}
	return Verified{Token: token, ExpiresAt: now.Add(SessionTTL)}, nil
}

var (
	errNoToken = errs.New(errs.Unauthorized, "a session is required: send Authorization: Bearer <token> from POST /api/handles/verify")
	errSession = errs.New(errs.Unauthorized, "session unknown or expired (sessions last 8 hours): verify your email again with POST /api/handles/start")
	// errSessionExpired reads as errSession to the caller; it tells
	// dropExpiredSession that there is a document to delete.
	errSessionExpired = errs.New(errs.Unauthorized, errSession.Message)
)

// sessionIn reads the session of token inside tx. An expired session is
// refused with errSessionExpired; the caller's transaction rolls back, so
// the caller then deletes it with dropExpiredSession.
func (s *Service) sessionIn(tx store.Tx, token string, now time.Time) (session, error) {
	if token == "" {
		return session{}, errNoToken
	}
	var sess session
	found, err := getOptional(tx, CollSessions, secret.Hash(token), &sess)
	switch {
	case err != nil:
		return session{}, err
	case !found:
		return session{}, errSession
	case now.UnixMilli() >= sess.ExpiresAt:
		return session{}, errSessionExpired
	}
	return sess, nil
}

// dropExpiredSession deletes the session of token when err says it was
// presented expired (the sweep would delete it later anyway). A failure is
// only logged: the caller's answer stays the 401.
func (s *Service) dropExpiredSession(ctx context.Context, token string, err error) {
	if !errors.Is(err, errSessionExpired) {
		return
	}
	id, now := secret.Hash(token), s.now()
	if err := s.st.RunTx(ctx, func(tx store.Tx) error {
		var sess session
		found, err := getOptional(tx, CollSessions, id, &sess)
		if err != nil || !found || now.UnixMilli() < sess.ExpiresAt {
			return err
		}
		return tx.Delete(CollSessions, id)
	}); err != nil {
		s.log.Warn("expired registrar session not deleted", "err", err)
	}
}
