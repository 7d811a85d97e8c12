package rooms

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/jwt/v2"

	"agentmesh.dev/mesh/shared/creds"
)

// Revoker revokes user keys at the broker, closing their live
// connections: devenv.Mesh on one machine (it edits the mesh account's JWT
// in process) and creds.Revoker on the cloud's cluster (over a
// system-account connection, re-signing the account JWT with the operator
// key).
type Revoker interface {
	Revoke(ctx context.Context, userKeys []string, at time.Time) error
}

// TrustCredentials is the Credentials of a mesh whose rooms worker holds
// the trust chain: it mints room credentials with the mesh account's
// signing key (creds.Trust.MintRoomUser) and revokes them with Revoker.
// Revocation re-signs the account JWT, so whoever runs the rooms worker
// with it holds the operator key (docs/security.md).
type TrustCredentials struct {
	Trust   *creds.Trust
	Revoker Revoker
}

// MintRoom mints a room credential for member in roomID on a fresh key,
// expiring after ttl (at most creds.MaxRoomLifetime).
func (c *TrustCredentials) MintRoom(roomID, member string, ttl time.Duration) (RoomCredential, error) {
	if c.Trust == nil {
		return RoomCredential{}, errors.New("mint room credential: no trust chain")
	}
	u, err := c.Trust.MintRoomUser(roomID, "room "+roomID+" member "+member, ttl)
	if err != nil {
		return RoomCredential{}, err
	}
	uc, err := jwt.DecodeUserClaims(u.JWT)
	if err != nil {
		return RoomCredential{}, fmt.Errorf("mint room credential: read back the jwt: %w", err)
	}
	return RoomCredential{JWT: u.JWT, Seed: string(u.Key.Seed()), UserKey: u.Key.Public(), Expires: time.Unix(uc.Expires, 0)}, nil
}

// SyncRevocations brings the broker's revocations in line with keep and
// forget (RevocationSyncer), through the revoker: devenv.Mesh and
// creds.Revoker both can.
func (c *TrustCredentials) SyncRevocations(ctx context.Context, keep, forget map[string]time.Time) (added, forgotten int, err error) {
	s, ok := c.Revoker.(RevocationSyncer)
	if !ok {
		return 0, 0, errors.New("sync room credential revocations: the revoker cannot sync")
	}
	return s.SyncRevocations(ctx, keep, forget)
}

// Revoke revokes the user keys at the broker, up to at.
func (c *TrustCredentials) Revoke(ctx context.Context, userKeys []string, at time.Time) error {
	if c.Revoker == nil {
		return errors.New("revoke room credentials: no revoker")
	}
	return c.Revoker.Revoke(ctx, userKeys, at)
}
