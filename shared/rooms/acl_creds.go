package rooms

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
)

// CredRecord is cred.<room_id>.<agent>: the room credentials issued to one
// member of one acl room that may still be live, so that expel and leave
// revoke exactly those at the broker, and those revoked, until their
// revocation is no longer needed (syncRevocations). Every room credential
// has a key of its own (creds.Trust.MintRoomUser), so revoking one
// touches nothing else.
type CredRecord struct {
	Creds []IssuedCredential `json:"creds"`
}

// IssuedCredential is one issued room credential.
type IssuedCredential struct {
	UserKey   string    `json:"user_key"`
	ExpiresAt time.Time `json:"expires_at"`
	// Revoked says the broker was told to revoke it, up to ExpiresAt.
	Revoked bool `json:"revoked,omitempty"`
}

// credSkew is how long past its expiry an issued credential counts as
// live: a broker whose clock is behind the worker's still accepts it that
// much longer.
const credSkew = time.Minute

// expired reports whether c is past its expiry (and credSkew) at now.
func (c IssuedCredential) expired(now time.Time) bool { return !now.Before(c.ExpiresAt.Add(credSkew)) }

// unrevoked are the credentials of list not yet revoked and still live.
func unrevoked(list []IssuedCredential, now time.Time) []IssuedCredential {
	return slices.DeleteFunc(slices.Clone(list), func(c IssuedCredential) bool { return c.Revoked || c.expired(now) })
}

// pruned is list without the credentials that expired unrevoked: nothing
// at the broker remembers them. Revoked ones stay until syncRevocations
// has forgotten their revocations at the broker.
func pruned(list []IssuedCredential, now time.Time) []IssuedCredential {
	return slices.DeleteFunc(slices.Clone(list), func(c IssuedCredential) bool { return !c.Revoked && c.expired(now) })
}

// recordCredential adds rc to member's record in roomID before rc is
// handed out: a credential not on record is one revocation would miss.
func (w *Worker) recordCredential(ctx context.Context, roomID, member string, rc RoomCredential) error {
	now := w.now()
	_, _, err := bus.CAS(ctx, w.kv, CredKey(roomID, member), func(cur *CredRecord, exists bool) (*CredRecord, error) {
		next := &CredRecord{}
		if exists {
			next.Creds = pruned(cur.Creds, now)
		}
		if n := len(unrevoked(next.Creds, now)); n >= MaxLiveCredentials {
			return nil, errs.Newf(errs.QuotaExceeded, "you hold %d live credentials for room %s, the most one member may; use one of them (each lasts at most %s)",
				n, roomID, w.limits.CredentialTTL)
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
// member's record in roomID not revoked yet, then marks them revoked. The
// record is read through the stream's leader, so a credential recorded
// just before is seen (see credential). One the broker was not told of
// stays unrevoked on record, and the next expel, leave or reclaim revokes
// it.
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
	issued := unrevoked(rec.Creds, w.now())
	if len(issued) == 0 {
		return 0, nil
	}
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
	// credential only, so a revocation time past every JWT's issue time is
	// right whatever the skew between the minting copy's clock and this
	// one's, and syncRevocations forgets it once it is past.
	if err := w.cfg.Credentials.Revoke(ctx, userKeys, until); err != nil {
		return 0, errs.Wrap(errs.Unavailable, fmt.Sprintf("%s is out of room %s, but the broker could not be told to close their room connection yet; do it again", member, roomID), err)
	}
	done := make(map[string]time.Time, len(issued))
	for _, c := range issued {
		done[c.UserKey] = until
	}
	now := w.now()
	if _, _, err := bus.CAS(ctx, w.kv, key, func(cur *CredRecord, exists bool) (*CredRecord, error) {
		if !exists {
			return nil, bus.ErrNoChange
		}
		next := &CredRecord{Creds: pruned(cur.Creds, now)}
		for i, c := range next.Creds {
			if at, ok := done[c.UserKey]; ok {
				next.Creds[i].Revoked = true
				next.Creds[i].ExpiresAt = at // the instant it is revoked up to, which the sync forgets by
			}
		}
		if len(next.Creds) == 0 {
			return nil, nil
		}
		return next, nil
	}); err != nil {
		return len(issued), fmt.Errorf("rooms: mark the room credentials of %s in %s revoked: %w", member, roomID, err)
	}
	return len(issued), nil
}

// revokeRoomCredentials revokes every live room credential of every
// member of roomID: for reclaim and idle expiry, after which nobody may
// speak in the room. It returns how many it revoked.
func (w *Worker) revokeRoomCredentials(ctx context.Context, roomID string) (int, error) {
	members, err := w.credKeys(ctx, CredKey(roomID, ""))
	if err != nil {
		return 0, err
	}
	total := 0
	for _, k := range members {
		n, err := w.revokeCredentials(ctx, roomID, strings.TrimPrefix(k, CredKey(roomID, "")))
		total += n
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// credPrefix is what every CredKey starts with.
const credPrefix = "cred."

// credKeys lists the cred.* keys under prefix.
func (w *Worker) credKeys(ctx context.Context, prefix string) ([]string, error) {
	lister, err := w.kv.ListKeysFiltered(ctx, prefix+">")
	if err != nil {
		return nil, fmt.Errorf("rooms: list %s>: %w", prefix, err)
	}
	var out []string
	for k := range lister.Keys() {
		out = append(out, k)
	}
	return out, nil
}

// RevocationSyncer is a Credentials whose revoker can bring the broker's
// revocation list in line with a record (TrustCredentials over
// devenv.Mesh or creds.Revoker): every key of keep revoked at least up to
// its instant, every key of forget whose revocation is not later than its
// instant deleted (creds.SyncRevocations).
type RevocationSyncer interface {
	SyncRevocations(ctx context.Context, keep, forget map[string]time.Time) (added, forgotten int, err error)
}

// DefaultRevocationSync is how often, on average, each copy of the worker
// runs syncRevocations on its own: a revocation lost to a concurrent
// update of the account JWT that the revoker's read-back missed is made
// again within about this long, not at the next hourly sweep.
const DefaultRevocationSync = time.Minute

// startRevocationSync runs syncRevocations every Config.RevocationSync
// (with jitter, so the copies do not all ask the broker at once) until
// Stop, when the Credentials can sync.
func (w *Worker) startRevocationSync() {
	every := w.cfg.RevocationSync
	if _, ok := w.cfg.Credentials.(RevocationSyncer); !ok || every < 0 {
		return
	}
	if every == 0 {
		every = DefaultRevocationSync
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(every/2 + rand.N(every)):
			}
			sctx, scancel := context.WithTimeout(ctx, every)
			_, forgotten, err := w.syncRevocations(sctx)
			scancel()
			switch {
			case err != nil && ctx.Err() == nil:
				w.svc.Log.Warn("room credential revocations not synced; the next sync tries again", "err", err)
			case forgotten > 0:
				w.svc.Log.Info("revocations of expired room credentials forgotten", "count", forgotten)
			}
		}
	}()
	w.onStop(func() error {
		cancel()
		<-done
		return nil
	})
}

// syncRevocations keeps the broker's revocations of room credentials in
// line with the cred records, for the rooms' periodic sweep and each
// copy's own timer (startRevocationSync):
//
//   - a revocation of a credential not yet expired that the broker lost
//     (on the cloud, the control plane and the rooms worker each re-sign
//     the account JWT, and two updates at once can drop one) is made
//     again;
//   - a revocation of a credential that has expired is forgotten at the
//     broker, then on record: the account JWT every server receives on each
//     change would otherwise grow with every expel for good.
//
// It returns how many revocations it restored and forgot. Credentials that
// cannot sync (none, or a revoker without SyncRevocations) sync nothing.
func (w *Worker) syncRevocations(ctx context.Context) (restored, forgotten int, err error) {
	syncer, ok := w.cfg.Credentials.(RevocationSyncer)
	if !ok {
		return 0, 0, nil
	}
	keys, err := w.credKeys(ctx, credPrefix)
	if err != nil {
		return 0, 0, err
	}
	now := w.now()
	keep, forget := map[string]time.Time{}, map[string]time.Time{}
	var stale []string // records holding revocations to forget
	for _, k := range keys {
		rec, found, err := bus.GetJSON[CredRecord](ctx, w.kv, k)
		if err != nil {
			return 0, 0, fmt.Errorf("rooms: read %s: %w", k, err)
		}
		if !found {
			continue
		}
		has := false
		for _, c := range rec.Creds {
			switch {
			case !c.Revoked:
			case c.expired(now):
				forget[c.UserKey] = c.ExpiresAt
				has = true
			default:
				keep[c.UserKey] = c.ExpiresAt
			}
		}
		if has {
			stale = append(stale, k)
		}
	}
	if len(keep)+len(forget) == 0 {
		return 0, 0, nil
	}
	restored, forgotten, err = syncer.SyncRevocations(ctx, keep, forget)
	if err != nil {
		return 0, 0, fmt.Errorf("rooms: sync the room credentials' revocations: %w", err)
	}
	if restored > 0 {
		w.svc.Log.Warn("room credential revocations missing at the broker were made again", "count", restored)
	}
	for _, k := range stale {
		if _, _, err := bus.CAS(ctx, w.kv, k, func(cur *CredRecord, exists bool) (*CredRecord, error) {
			if !exists {
				return nil, bus.ErrNoChange
			}
			rest := slices.DeleteFunc(pruned(cur.Creds, now), func(c IssuedCredential) bool {
				at, ok := forget[c.UserKey]
				return ok && c.Revoked && c.ExpiresAt.Equal(at)
			})
			if len(rest) == 0 {
				return nil, nil
			}
			return &CredRecord{Creds: rest}, nil
		}); err != nil {
			return restored, forgotten, fmt.Errorf("rooms: clear %s: %w", k, err)
		}
	}
	return restored, forgotten, nil
}
