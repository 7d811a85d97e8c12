package creds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
)

// ClaimsUpdateSubject is where a full ("dir") account resolver accepts account
// JWT updates from system-account users.
const ClaimsUpdateSubject = "$SYS.REQ.CLAIMS.UPDATE"

// claimsUpdateReply mirrors the broker's reply to a claims update; it is
// declared here so that minting and pushing credentials never link the broker.
type claimsUpdateReply struct {
	Data *struct {
		Account string `json:"account"`
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"data"`
	Error *struct {
		Account     string `json:"account"`
		Code        int    `json:"code"`
		Description string `json:"description"`
	} `json:"error"`
}

// PushAttemptTimeout is how long PushAccountJWT waits for an answer before
// it sends the update again.
const PushAttemptTimeout = 2 * time.Second

// PushAccountJWT sends an updated account JWT to the running broker over a
// system-account connection and waits for it to be accepted. The broker
// applies it at once: revoked user keys lose their connections, and the new
// limits hold, without a restart. With several servers, the first answer is
// returned and the resolvers spread the update among themselves. An attempt
// unanswered within PushAttemptTimeout is made again until ctx ends.
func PushAccountJWT(ctx context.Context, nc *nats.Conn, accountJWT string) error {
	if nc == nil {
		return errors.New("push account jwt: no connection")
	}
	var msg *nats.Msg
	for {
		// Each attempt waits a little: a request that met its server going
		// away (on a cluster losing a member) is lost with it, and only a
		// new attempt gets an answer. Pushing the same JWT again changes
		// nothing where it already arrived.
		actx, cancel := context.WithTimeout(ctx, PushAttemptTimeout)
		var err error
		msg, err = nc.RequestWithContext(actx, ClaimsUpdateSubject, []byte(accountJWT))
		cancel()
		if err == nil {
			break
		}
		retry := errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders)
		if !retry || ctx.Err() != nil {
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			return fmt.Errorf("push account jwt: %w", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("push account jwt: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	var reply claimsUpdateReply
	if err := json.Unmarshal(msg.Data, &reply); err != nil {
		return fmt.Errorf("push account jwt: decode reply: %w", err)
	}
	switch {
	case reply.Error != nil:
		return fmt.Errorf("push account jwt: refused for %s (%d): %s",
			reply.Error.Account, reply.Error.Code, reply.Error.Description)
	case reply.Data == nil:
		return fmt.Errorf("push account jwt: reply has neither data nor error: %q", msg.Data)
	}
	return nil
}

// AccountLookupSubject is where a full resolver answers with an account's
// current JWT.
func AccountLookupSubject(account string) string {
	return "$SYS.REQ.ACCOUNT." + account + ".CLAIMS.LOOKUP"
}

// Revoker revokes credential keys on a running cluster it reaches only
// over NATS (the cloud deployment, which has no resolver directory of its
// own): it asks the resolver for the mesh account's current JWT, adds the
// revocations, re-signs it with the operator key and pushes it back.
// Revocations already in the JWT are kept, because the current JWT is the
// starting point.
type Revoker struct {
	Trust *Trust
	// Sys is a system-account connection (MintSystemUser).
	Sys *nats.Conn
	// mu serialises read-modify-write cycles from this process. The
	// resolver applies whole JWTs, keeping either of two issued in the
	// same second, so another process (another copy of the rooms worker,
	// the control plane) revoking at once can still replace this one's
	// update: Revoke reads the account back and makes it again.
	mu sync.Mutex
}

// RevokeAttempts is how many times Revoke pushes a revocation before it
// gives up on one that reading the account back still shows missing.
const RevokeAttempts = 5

// ReadBackSettle is how long Revoke waits after a push before reading the
// account back, plus a random part up to as much again. A push that
// replaces this one was built on a JWT read before this one arrived and
// is sent at once, so it has arrived by then; the random part keeps two
// revokers that collided from colliding again.
const ReadBackSettle = 250 * time.Millisecond

// Revoke implements the credential service's Revoker. It returns once the
// broker's resolver holds every revocation (each key revoked at least up
// to the second of at), pushing again on top of whatever update replaced
// its own, up to RevokeAttempts times.
func (r *Revoker) Revoke(ctx context.Context, keys []string, at time.Time) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	claims, err := r.current(ctx)
	if err != nil {
		return fmt.Errorf("revoke: %w", err)
	}
	for attempt := 1; ; attempt++ {
		issued := claims.IssuedAt
		if err := RevokeCredentials(claims, at, keys...); err != nil {
			return err
		}
		if err := r.push(ctx, claims, issued); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("revoke: read back: %w", ctx.Err())
		case <-time.After(ReadBackSettle + rand.N(ReadBackSettle)):
		}
		if claims, err = r.current(ctx); err != nil {
			return fmt.Errorf("revoke: read back: %w", err)
		}
		missing := unrevoked(claims, at, keys)
		if missing == 0 {
			return nil
		}
		if attempt == RevokeAttempts {
			return fmt.Errorf("revoke: %d of %d revocations still missing at the broker after %d updates (other updates of the mesh account kept replacing them); revoke again",
				missing, len(keys), attempt)
		}
	}
}

// unrevoked counts the keys ac does not revoke up to the second of at.
func unrevoked(ac *jwt.AccountClaims, at time.Time, keys []string) int {
	n := 0
	for _, k := range keys {
		if RevokedAt(ac, k).Unix() < at.Unix() {
			n++
		}
	}
	return n
}

// LookupGrace is how long the Revoker waits, after the first resolver
// answers its lookup, for the others.
const LookupGrace = 100 * time.Millisecond

// current asks every server's resolver for the mesh account's JWT and
// returns the newest: a server back from an outage answers with the JWT it
// had before, until its first resolver sync, and an update built on that
// one would drop every revocation made meanwhile (and, being newer, win
// everywhere).
func (r *Revoker) current(ctx context.Context) (*jwt.AccountClaims, error) {
	mesh := r.Trust.PublicKeys().MeshAccount
	inbox := r.Sys.NewRespInbox()
	ch := make(chan *nats.Msg, 16)
	sub, err := r.Sys.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil, fmt.Errorf("look up the mesh account: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := r.Sys.PublishRequest(AccountLookupSubject(mesh), inbox, nil); err != nil {
		return nil, fmt.Errorf("look up the mesh account: %w", err)
	}
	var newest *jwt.AccountClaims
	var grace <-chan time.Time
	// A lookup lost with a server going away is asked again.
	again := time.NewTicker(PushAttemptTimeout)
	defer again.Stop()
	for {
		select {
		case <-again.C:
			if newest == nil {
				if err := r.Sys.PublishRequest(AccountLookupSubject(mesh), inbox, nil); err != nil {
					return nil, fmt.Errorf("look up the mesh account: %w", err)
				}
			}
		case m := <-ch:
			ac, err := jwt.DecodeAccountClaims(string(m.Data))
			if err != nil {
				continue // an empty answer: that server does not hold it
			}
			if newest == nil || ac.IssuedAt > newest.IssuedAt {
				newest = ac
			}
			if grace == nil {
				grace = time.After(LookupGrace)
			}
		case <-grace:
			return newest, nil
		case <-ctx.Done():
			if newest != nil {
				return newest, nil
			}
			return nil, fmt.Errorf("look up the mesh account: %w", ctx.Err())
		}
	}
}

// push signs claims and pushes them, in a later second than issued, the
// issue time of the JWT they replace: the servers' resolvers keep the
// later of two JWTs and take either of two issued in the same second, so
// two updates in one second could undo each other at every sync between
// them.
func (r *Revoker) push(ctx context.Context, claims *jwt.AccountClaims, issued int64) error {
	for time.Now().Unix() <= issued {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Until(time.Unix(issued+1, 0))):
		}
	}
	signed, err := r.Trust.EncodeAccount(claims)
	if err != nil {
		return err
	}
	return PushAccountJWT(ctx, r.Sys, signed)
}
