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

// SyncRevocations brings ac's revocation list in line with what the
// control plane recorded: every key of keep is revoked at least up to its
// instant (a revocation lost to a concurrent update of the account JWT, or
// to a regenerated NATS configuration whose preload replaced the JWT, comes
// back), and every key of forget whose revocation is not later than its
// instant is deleted (its credentials have all expired, so the entry only
// makes the JWT every server receives on each change longer). Keys in
// neither map are left as they are: a revocation made by hand, which the
// store does not know, is never forgotten. It returns how many entries it
// added and deleted. The all-keys entry is never touched.
func SyncRevocations(ac *jwt.AccountClaims, keep, forget map[string]time.Time) (added, forgotten int) {
	if ac == nil {
		return 0, 0
	}
	for k, at := range keep {
		if k == jwt.All || !keys.IsUserPublicKey(k) {
			continue
		}
		if ts, ok := ac.Revocations[k]; !ok || ts < at.Unix() {
			ac.RevokeAt(k, at)
			added++
		}
	}
	for k, at := range forget {
		if k == jwt.All {
			continue
		}
		if ts, ok := ac.Revocations[k]; ok && ts <= at.Unix() {
			delete(ac.Revocations, k)
			forgotten++
		}
	}
	return added, forgotten
}

// SyncRevocations applies the function SyncRevocations to the mesh account
// on the running cluster, pushing an update only when something changed.
func (r *Revoker) SyncRevocations(ctx context.Context, keep, forget map[string]time.Time) (added, forgotten int, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	claims, err := r.current(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("sync revocations: %w", err)
	}
	issued := claims.IssuedAt
	added, forgotten = SyncRevocations(claims, keep, forget)
	if added+forgotten == 0 {
		return 0, 0, nil
	}
	return added, forgotten, r.push(ctx, claims, issued)
}
