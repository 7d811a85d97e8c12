package rooms

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// MemberEntry is the value of a member.<agent>.<room_id> key, the index that
// mesh.rooms.mine reads. Whoever writes the key (provision for the creator,
// admit for an acl member) writes one; mine reads only the key's presence
// and checks membership on the room itself.
type MemberEntry struct {
	Role string `json:"role"` // "creator" or "member"
	At   string `json:"at"`
}

// Member roles.
const (
	RoleCreator = "creator"
	RoleMember  = "member"
)

// provision answers mesh.rooms.provision {descriptor}: the room's durable
// record, drive and board come into being, counted against the creator's
// operator. Provisioning the same descriptor again changes nothing and
// answers as the first time did.
func (w *Worker) provision(ctx context.Context, r *bus.Request) (any, error) {
	var p roomCall
	if err := r.Decode(&p); err != nil {
		return nil, err
	}
	d, err := ParseDescriptor(p.Descriptor)
	if err != nil {
		return nil, err
	}
	switch {
	case !d.Durable():
		return nil, errs.Newf(errs.InputInvalid, "room %s is ephemeral, so the mesh keeps nothing for it: provision a descriptor whose record is %q", d.RoomID, DurableRecord(d.RoomID))
	case d.Creator != r.Env.From:
		return nil, errs.Newf(errs.IdentityMismatch, "only the room's creator %s may provision it; this call is signed by %s", d.Creator, r.Env.From)
	}
	owner, err := w.owner(ctx, d.Creator)
	if err != nil {
		return nil, err
	}
	cur, found, err := bus.GetJSON[Room](ctx, w.kv, RoomKey(d.RoomID))
	if err != nil {
		return nil, fmt.Errorf("rooms: read room %s: %w", d.RoomID, err)
	}
	if found {
		if err := sameRoom(&cur, d); err != nil {
			return nil, err
		}
		// The index entry again, in case the first provision stopped short
		// of it.
		if err := putJSON(ctx, w, MemberKey(d.Creator, d.RoomID), MemberEntry{Role: RoleCreator, At: protocol.FormatTime(cur.CreatedAt)}); err != nil {
			return nil, err
		}
		return provisioned(&cur, false), nil
	}
	if err := w.countRoom(ctx, owner.Operator, d.RoomID); err != nil {
		return nil, err
	}
	now := w.now().UTC()
	room := &Room{ID: d.RoomID, Name: d.Name, Privacy: d.Privacy, Channels: d.Channels, Creator: d.Creator,
		Handle: owner.Handle, Operator: owner.Operator, Descriptor: d.Raw, CreatedAt: now, LastActive: now}
	if d.Privacy == GradeACL {
		room.Members = []string{d.Creator}
	}
	var other *Room
	stored, created, err := bus.CAS(ctx, w.kv, RoomKey(d.RoomID), func(cur *Room, exists bool) (*Room, error) {
		if exists {
			// Another call provisioned the room_id between the read and
			// now: the same descriptor is this call's success too.
			if sameRoom(cur, d) != nil {
				other = cur
			}
			return nil, bus.ErrNoChange
		}
		return room, nil
	})
	if err != nil {
		return nil, fmt.Errorf("rooms: create room %s: %w", d.RoomID, err)
	}
	if other != nil {
		// Give back the count unless the room_id is this operator's anyway.
		if other.Operator != owner.Operator {
			if _, err := w.uncountRoom(ctx, owner.Operator, d.RoomID, 0); err != nil {
				w.svc.Log.Warn("room count not given back", "room", d.RoomID, "err", err)
			}
		}
		return nil, sameRoom(other, d)
	}
	member := MemberEntry{Role: RoleCreator, At: protocol.FormatTime(stored.CreatedAt)}
	if err := putJSON(ctx, w, MemberKey(d.Creator, d.RoomID), member); err != nil {
		return nil, err
	}
	if created {
		w.svc.Log.Info("room provisioned", "room", d.RoomID, "privacy", d.Privacy, "handle", owner.Handle)
	}
	return provisioned(stored, created), nil
}

// sameRoom refuses a descriptor other than the one room was provisioned
// with, and a room being removed.
func sameRoom(room *Room, d *Descriptor) error {
	switch {
	case !sameDescriptor(room.Descriptor, d.Raw):
		return errs.Newf(errs.IdentityMismatch, "room_id %s is already provisioned with another descriptor: sign a descriptor with a new room_id", d.RoomID)
	case room.ClosedAt != nil:
		return errs.Newf(errs.InputInvalid, "room %s was %s and is being removed: sign a descriptor with a new room_id", d.RoomID, room.Why)
	}
	return nil
}

func provisioned(room *Room, created bool) map[string]any {
	return map[string]any{"ok": true, "room_id": room.ID, "created": created, "created_at": protocol.FormatTime(room.CreatedAt),
		"handle": room.Handle}
}

// owner resolves agent to its handle and operator through Config.Owners.
func (w *Worker) owner(ctx context.Context, agent string) (Owner, error) {
	if w.cfg.Owners == nil {
		return Owner{}, errs.New(errs.Unavailable, "this mesh has no registrar to resolve room creators to handles, so it cannot provision durable rooms; ask its operator to configure one")
	}
	o, err := w.cfg.Owners.Owner(ctx, agent)
	if err != nil {
		return Owner{}, errs.OrUnavailable(err, "the registrar could not be asked who owns this agent; retry shortly")
	}
	if o.Operator == "" || o.Handle == "" {
		return Owner{}, errs.Newf(errs.NotNamed, "agent %s is bound to no handle: claim one and pair this agent (mesh-adapter join), then try again", agent)
	}
	return o, nil
}

// countRoom counts roomID against operator's durable rooms, refusing the
// one past the limit (QUOTA_EXCEEDED). A room already counted is not
// counted again.
func (w *Worker) countRoom(ctx context.Context, operator, roomID string) error {
	limit := w.limits.RoomsPerOperator
	now := w.now().UTC()
	_, _, err := bus.CAS(ctx, w.kv, QuotaKey(operator), func(q *Quota, exists bool) (*Quota, error) {
		if q == nil {
			q = &Quota{}
		}
		if slices.Contains(q.RoomIDs, roomID) {
			return nil, bus.ErrNoChange
		}
		if len(q.RoomIDs) >= limit {
			return nil, errs.Newf(errs.QuotaExceeded, "your operator already has %d durable rooms, the most this mesh keeps: reclaim one (mesh.rooms.reclaim) and try again", len(q.RoomIDs)).
				WithDetails(map[string]any{"rooms": len(q.RoomIDs), "limit": limit})
		}
		q.RoomIDs = append(q.RoomIDs, roomID)
		q.Rooms = len(q.RoomIDs)
		if q.CountedAt == nil {
			q.CountedAt = map[string]time.Time{}
		}
		q.CountedAt[roomID] = now
		return q, nil
	})
	var e *errs.Error
	if errors.As(err, &e) {
		return err
	}
	if err != nil {
		return fmt.Errorf("rooms: count room %s: %w", roomID, err)
	}
	return nil
}

// uncountRoom gives roomID back to operator's quota with the room's drive
// bytes; a room not counted (any more) changes nothing, so removal may be
// repeated. It reports whether the quota changed.
func (w *Worker) uncountRoom(ctx context.Context, operator, roomID string, driveBytes int64) (bool, error) {
	_, changed, err := bus.CAS(ctx, w.kv, QuotaKey(operator), func(q *Quota, exists bool) (*Quota, error) {
		if !exists || !slices.Contains(q.RoomIDs, roomID) {
			return nil, bus.ErrNoChange
		}
		q.RoomIDs = slices.DeleteFunc(q.RoomIDs, func(id string) bool { return id == roomID })
		q.Rooms = len(q.RoomIDs)
		delete(q.CountedAt, roomID)
		q.DriveBytes = max(q.DriveBytes-driveBytes, 0)
		return q, nil
	})
	if err != nil {
		return false, fmt.Errorf("rooms: free quota of room %s: %w", roomID, err)
	}
	return changed, nil
}

// putJSON writes v under key.
func putJSON(ctx context.Context, w *Worker, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("rooms: encode %s: %w", key, err)
	}
	if _, err := w.kv.Put(ctx, key, b); err != nil {
		return fmt.Errorf("rooms: write %s: %w", key, err)
	}
	return nil
}
