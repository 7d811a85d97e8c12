package rooms

import (
	"context"
	"slices"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
)

// memberLeft takes member out of acl room roomID, first person: the leave
// verb calls it, and so may the record's ingest on a member's own leave
// message. A member who already left, or an agent that never was one,
// leaves quietly (nil), and so does anyone leaving a room of another
// grade, which keeps no members. The creator is refused and pointed at
// reclaim. The member's index entry goes and their live room credentials
// are revoked, as on expel, whether or not this call changed the room: a
// second leave finishes a revocation the first could not.
func (w *Worker) memberLeft(ctx context.Context, roomID, member string) error {
	_, changed, err := bus.CAS(ctx, w.kv, RoomKey(roomID), func(cur *Room, exists bool) (*Room, error) {
		switch {
		case !exists || cur.ClosedAt != nil:
			return nil, errACLRoomGone(roomID)
		case member == cur.Creator:
			return nil, errs.Newf(errs.Forbidden, "you created room %s, so you cannot leave it; reclaim it (mesh.rooms.reclaim) to close it for everyone", roomID)
		case cur.Privacy != GradeACL, !slices.Contains(cur.Members, member):
			return nil, bus.ErrNoChange
		}
		cur.Members = slices.DeleteFunc(cur.Members, func(a string) bool { return a == member })
		return cur, nil
	})
	if err != nil {
		return err
	}
	revoked, err := w.dropMember(ctx, roomID, member)
	if err != nil {
		return err
	}
	if changed || revoked > 0 {
		w.svc.Log.Info("acl member left", "room", roomID, "member", member, "credentials_revoked", revoked)
	}
	return nil
}

// roomClosed revokes the live room credentials of every member of a room
// that reclaim or the idle sweep is removing, before its cred. and member.
// keys go: nobody speaks in a closed room. Other grades have none.
func (w *Worker) roomClosed(ctx context.Context, room *Room) error {
	if room.Privacy != GradeACL {
		return nil
	}
	n, err := w.revokeRoomCredentials(ctx, room.ID)
	if n > 0 {
		w.svc.Log.Info("acl room closed: room credentials revoked", "room", room.ID, "credentials_revoked", n)
	}
	return err
}
