package creds

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/jwt/v2"

	"agentmesh.dev/mesh/shared/keys"
)

// RevokeCredentials records in the mesh account claims ac that every JWT
// issued to each of publicKeys up to and including the second of at is
// revoked. Pushed to the broker (devenv.Mesh.UpdateMeshAccount, or
// PushAccountJWT), it closes those keys' live connections and refuses their
// JWTs from then on; a credential minted later for the same key must carry
// a later iat, which MintUser gives it when told RevokedAt.
//
// Keys must be user public keys: the all-keys entry ("*") is not revoked
// through this helper. A later revocation already recorded for a key is
// kept (jwt.RevocationList never moves one back).
//
// It has the shape of an edit for UpdateMeshAccount once at and the keys are
// bound: func(ac) error { return RevokeCredentials(ac, at, keys...) }.
func RevokeCredentials(ac *jwt.AccountClaims, at time.Time, publicKeys ...string) error {
	if ac == nil {
		return errors.New("revoke credentials: nil account claims")
	}
	if at.IsZero() {
		return errors.New("revoke credentials: no revocation time")
	}
	if len(publicKeys) == 0 {
		return errors.New("revoke credentials: no keys")
	}
	for _, k := range publicKeys {
		if !keys.IsUserPublicKey(k) {
			return fmt.Errorf("revoke credentials: %q is not a user public key", k)
		}
	}
	for _, k := range publicKeys {
		ac.RevokeAt(k, at)
	}
	return nil
}

// RevokedAt returns the latest revocation in ac covering publicKey, its own
// or the all-keys one, at whole-second precision; zero when there is none.
// Pass it as UserSpec.RevokedAt when minting for that key again.
func RevokedAt(ac *jwt.AccountClaims, publicKey string) time.Time {
	if ac == nil {
		return time.Time{}
	}
	var latest int64
	for _, k := range []string{publicKey, jwt.All} {
		if ts, ok := ac.Revocations[k]; ok && ts > latest {
			latest = ts
		}
	}
	if latest == 0 {
		return time.Time{}
	}
	return time.Unix(latest, 0)
}

// PruneRevocations deletes from ac every key's revocation older than
// before (whole seconds), and returns how many it deleted. It is for
// revocations whose credentials have all expired anyway: a JWT issued up to
// the revocation instant expires at most one credential lifetime later, so
// once that has passed the entry protects nothing and only makes the
// account JWT (pushed to every server on each change) longer. The all-keys
// entry is never pruned.
func PruneRevocations(ac *jwt.AccountClaims, before time.Time) int {
	if ac == nil {
		return 0
	}
	n := 0
	for k, ts := range ac.Revocations {
		if k != jwt.All && ts < before.Unix() {
			delete(ac.Revocations, k)
			n++
		}
	}
	return n
}

// PruneRevocations deletes the mesh account's revocations older than
// before on the running cluster (see the function PruneRevocations).
func (r *Revoker) PruneRevocations(ctx context.Context, before time.Time) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	mesh := r.Trust.PublicKeys().MeshAccount
	msg, err := r.Sys.RequestWithContext(ctx, AccountLookupSubject(mesh), nil)
	if err != nil {
		return 0, fmt.Errorf("prune revocations: look up the mesh account: %w", err)
	}
	claims, err := jwt.DecodeAccountClaims(string(msg.Data))
	if err != nil {
		return 0, fmt.Errorf("prune revocations: the resolver's mesh account jwt: %w", err)
	}
	n := PruneRevocations(claims, before)
	if n == 0 {
		return 0, nil
	}
	signed, err := r.Trust.EncodeAccount(claims)
	if err != nil {
		return 0, err
	}
	return n, PushAccountJWT(ctx, r.Sys, signed)
}
