package rooms

import "context"

// The acl grade's hooks in the record and the removal of a room. (The acl
// work replaces this file.)

// memberLeft is called by the ingest once it has recorded a leave room
// message of an acl room (member == the sender): it must have the effect
// of the acl leave verb.
func (w *Worker) memberLeft(ctx context.Context, roomID, member string) error { return nil }

// roomClosed is called when reclaim or the idle sweep removes a closed
// room, before its cred. and member. keys are deleted: the place to revoke
// the live room credentials of an acl room.
func (w *Worker) roomClosed(ctx context.Context, room *Room) error { return nil }
