package rooms

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
)

// CredRecord is cred.<room_id>.<agent>: the user keys of the room
// credentials issued to one member of one acl room that may still be
// live, so that expel and leave revoke exactly those at the broker. Every
// room credential has a key of its own (creds.Trust.MintRoomUser), so
// revoking them touches nothing else.
type CredRecord struct {
	Creds []IssuedCredential `json:"creds"`
}

// IssuedCredential is one issued room credential.
type IssuedCredential struct {
	UserKey   string    `json:"user_key"`
	ExpiresAt time.Time `json:"expires_at"`
}

// credSkew is how long past its expiry an issued credential is kept on
// record: a broker whose clock is behind the worker's still accepts it
// that much longer.
const credSkew = time.Minute

// live are the credentials of list still live at now (within credSkew).
func live(list []IssuedCredential, now time.Time) []IssuedCredential {
	return slices.DeleteFunc(slices.Clone(list), func(c IssuedCredential) bool { return !now.Before(c.ExpiresAt.Add(credSkew)) })
}

// recordCredential adds rc to member's record in roomID, dropping expired
// entries, before rc is handed out: a credential not on record is one
// revocation would miss.
func (w *Worker) recordCredential(ctx context.Context, roomID, member string, rc RoomCredential) error {
	now := w.now()
	_, _, err := bus.CAS(ctx, w.kv, CredKey(roomID, member), func(cur *CredRecord, exists bool) (*CredRecord, error) {
		next := &CredRecord{}
		if exists {
			next.Creds = live(cur.Creds, now)
		}
		if len(next.Creds) >= MaxLiveCredentials {
			return nil, errs.Newf(errs.QuotaExceeded, "you hold %d live credentials for room %s, the most one member may; use one of them (each lasts at most %s)",
				len(next.Creds), roomID, w.limits.CredentialTTL)
		}
		next.Creds = append(next.Creds, IssuedCredential{UserKey: rc.UserKey, ExpiresAt: rc.Expires.UTC()})
		return next, nil
	})
	if err != nil {
		return fmt.Errorf("rooms: record the room credential of %s in %s: %w", member, roomID, err)
	}
	return nil
}

// dropMember finishes a member's removal from an acl room (expel, leave):
// their mesh.rooms.mine index entry goes, and their live room credentials
// are revoked. It returns how many credentials it revoked.
func (w *Worker) dropMember(ctx context.Context, roomID, member string) (int, error) {
	if err := w.kv.Delete(ctx, MemberKey(member, roomID)); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, fmt.Errorf("rooms: unindex member %s of %s: %w", member, roomID, err)
	}
	return w.revokeCredentials(ctx, roomID, member)
}

// revokeCredentials revokes at the broker every live room credential on
// member's record in roomID, then takes them off the record. The record is
// read through the stream's leader, so a credential recorded just before
// is seen (see credential). A revocation the broker was not told of stays
// on record, and the next expel, leave or reclaim revokes it.
func (w *Worker) revokeCredentials(ctx context.Context, roomID, member string) (int, error) {
	key := CredKey(roomID, member)
	b, found, err := bus.LeaderGet(ctx, w.svc.NC, Bucket, key)
	if err != nil {
		return 0, fmt.Errorf("rooms: read the room credentials of %s in %s: %w", member, roomID, err)
	}
	if !found {
		return 0, nil
	}
	var rec CredRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return 0, fmt.Errorf("rooms: decode %s: %w", key, err)
	}
	issued := live(rec.Creds, w.now())
	if len(issued) > 0 {
		if w.cfg.Credentials == nil {
			// Minted under another configuration; they expire within the
			// credential's life.
			w.svc.Log.Warn("room credentials on record but no way to revoke them", "room", roomID, "member", member, "credentials", len(issued))
			return 0, nil
		}
		userKeys := make([]string, len(issued))
		var until time.Time
		for i, c := range issued {
			userKeys[i] = c.UserKey
			if c.ExpiresAt.After(until) {
				until = c.ExpiresAt
			}
		}
		// Revoked up to their expiry, not now: each key is used for one
		// credential only, so a revocation time past every JWT's issue
		// time is right whatever the skew between the minting copy's
		// clock and this one's.
		if err := w.cfg.Credentials.Revoke(ctx, userKeys, until); err != nil {
			return 0, errs.Wrap(errs.Unavailable, fmt.Sprintf("%s is out of room %s, but the broker could not be told to close their room connection yet; do it again", member, roomID), err)
		}
	}
	done := make(map[string]bool, len(issued))
	for _, c := range issued {
		done[c.UserKey] = true
	}
	now := w.now()
	if _, _, err := bus.CAS(ctx, w.kv, key, func(cur *CredRecord, exists bool) (*CredRecord, error) {
		if !exists {
			return nil, bus.ErrNoChange
		}
		rest := slices.DeleteFunc(live(cur.Creds, now), func(c IssuedCredential) bool { return done[c.UserKey] })
		if len(rest) == 0 {
			return nil, nil
		}
		return &CredRecord{Creds: rest}, nil
	}); err != nil {
		return len(issued), fmt.Errorf("rooms: clear the room credentials of %s in %s: %w", member, roomID, err)
	}
	return len(issued), nil
}

// revokeRoomCredentials revokes every live room credential of every
// member of roomID and clears their records: for reclaim and idle expiry,
// after which nobody may speak in the room. It returns how many it revoked.
func (w *Worker) revokeRoomCredentials(ctx context.Context, roomID string) (int, error) {
	prefix := CredKey(roomID, "")
	lister, err := w.kv.ListKeysFiltered(ctx, prefix+"*")
	if err != nil {
		return 0, fmt.Errorf("rooms: list the room credentials of %s: %w", roomID, err)
	}
	var members []string
	for k := range lister.Keys() {
		members = append(members, strings.TrimPrefix(k, prefix))
	}
	total := 0
	for _, m := range members {
		n, err := w.revokeCredentials(ctx, roomID, m)
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}
