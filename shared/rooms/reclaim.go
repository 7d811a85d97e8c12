package rooms

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
)

// Why a room was removed (Room.Why, the dossier's why).
const (
	WhyReclaimed = "reclaimed"
	WhyExpired   = "expired"
	// WhyExport is the dossier's why while the room is open.
	WhyExport = "export"
)

// reclaim answers mesh.rooms.reclaim {descriptor, dossier?}: the creator
// closes the room and gets its dossier; the record, the drive and every
// key of the room are deleted and the operator's quota freed.
//
// The removal is a sequence of steps that may each be repeated: the room is
// first marked closed (from then on Access refuses it and the record takes
// nothing), the dossier is made, then the record, the drive and the room's
// keys go, the quota is freed, and the room's own key goes last. A removal
// cut short leaves a closed room, which reclaim (again) or the idle sweep
// finishes.
//
// A dossier longer than one answer carries is refused (PAYLOAD_TOO_LARGE)
// before anything is deleted, unless the call says "dossier": false.
func (w *Worker) reclaim(ctx context.Context, r *bus.Request) (any, error) {
	var p struct {
		roomCall
		Dossier *bool `json:"dossier"`
	}
	if err := r.Decode(&p); err != nil {
		return nil, err
	}
	_, room, err := access(ctx, w.kv, p.Descriptor, r.Env.From, true)
	if err != nil {
		return nil, err
	}
	if err := creatorOnly(room, r.Env.From, "reclaim"); err != nil {
		return nil, err
	}
	reopen := room.ClosedAt == nil
	if room, err = w.closeRoom(ctx, room.ID, WhyReclaimed, nil); err != nil {
		return nil, err
	}
	wantDossier := p.Dossier == nil || *p.Dossier
	var dossier *Dossier
	if wantDossier {
		if dossier, err = w.makeDossier(ctx, room); err != nil {
			if reopen && errs.CodeOf(err) == errs.PayloadTooLarge {
				w.reopenRoom(ctx, room.ID)
			}
			return nil, err
		}
	}
	if err := w.removeRoom(ctx, room); err != nil {
		return nil, err
	}
	w.svc.Log.Info("room reclaimed", "room", room.ID)
	return map[string]any{"ok": true, "room_id": room.ID, "dossier": dossier}, nil
}

// errNotIdle is closeRoom's refusal when the room's condition no longer
// holds (a message arrived as the sweep looked).
var errNotIdle = errors.New("room is no longer idle")

// closeRoom marks the room closed for why, when cond (nil: always) holds of
// the stored room. A room already closed stays as it was closed. It returns
// the room as stored.
func (w *Worker) closeRoom(ctx context.Context, roomID, why string, cond func(*Room) bool) (*Room, error) {
	now := w.now().UTC()
	room, _, err := bus.CAS(ctx, w.kv, RoomKey(roomID), func(cur *Room, exists bool) (*Room, error) {
		switch {
		case !exists:
			return nil, errs.Newf(errs.NotFound, "room %s is not provisioned on this mesh (or was reclaimed or expired)", roomID)
		case cur.ClosedAt != nil:
			return nil, bus.ErrNoChange
		case cond != nil && !cond(cur):
			return nil, errNotIdle
		}
		cur.ClosedAt, cur.Why = &now, why
		return cur, nil
	})
	if err != nil && errs.CodeOf(err) == "" && !errors.Is(err, errNotIdle) {
		return nil, fmt.Errorf("rooms: close room %s: %w", roomID, err)
	}
	return room, err
}

// reopenRoom undoes closeRoom of a reclaim that was refused before it
// deleted anything.
func (w *Worker) reopenRoom(ctx context.Context, roomID string) {
	_, _, err := bus.CAS(ctx, w.kv, RoomKey(roomID), func(cur *Room, exists bool) (*Room, error) {
		if !exists || cur.ClosedAt == nil || cur.Why != WhyReclaimed {
			return nil, bus.ErrNoChange
		}
		cur.ClosedAt, cur.Why = nil, ""
		return cur, nil
	})
	if err != nil {
		w.svc.Log.Warn("room not reopened after a refused reclaim; the idle sweep will remove it", "room", roomID, "err", err)
	}
}

// roomKeyPatterns are the bucket's keys of one room, other than the room
// itself.
func roomKeyPatterns(roomID string) []string {
	return []string{
		"drive." + roomID + ".*",
		"note." + roomID + ".>",
		"cursor." + roomID + ".*",
		"cred." + roomID + ".*",
		"holder." + roomID + ".*",
		"board." + roomID + ".*",
		"member.*." + roomID,
	}
}

// removeRoom deletes a closed room: its record, its drive files, its keys,
// its count and drive bytes in the quota, and last the room itself. Every
// step may be repeated.
func (w *Worker) removeRoom(ctx context.Context, room *Room) error {
	if err := w.roomClosed(ctx, room); err != nil {
		return fmt.Errorf("rooms: close room %s: %w", room.ID, err)
	}
	for _, purge := range []struct{ stream, subject string }{
		{RecordStream, RecordSubject(room.ID)},
		{DriveStream, DriveSubject(room.ID, ">")},
	} {
		s, err := w.js.Stream(ctx, purge.stream)
		if err != nil {
			return fmt.Errorf("rooms: stream %s: %w", purge.stream, err)
		}
		if err := s.Purge(ctx, jetstream.WithPurgeSubject(purge.subject)); err != nil {
			return fmt.Errorf("rooms: purge %s: %w", purge.subject, err)
		}
	}
	for _, pattern := range roomKeyPatterns(room.ID) {
		keys, err := w.keysMatching(ctx, pattern)
		if err != nil {
			return err
		}
		for _, k := range keys {
			if err := w.kv.Delete(ctx, k); err != nil {
				return fmt.Errorf("rooms: delete %s: %w", k, err)
			}
		}
	}
	// The room as it is now: the drive bytes the quota gives back are the
	// ones counted when the room was closed.
	cur, found, err := bus.GetJSON[Room](ctx, w.kv, RoomKey(room.ID))
	if err != nil {
		return fmt.Errorf("rooms: read room %s: %w", room.ID, err)
	}
	if !found {
		return nil
	}
	if _, err := w.uncountRoom(ctx, cur.Operator, cur.ID, cur.DriveBytes); err != nil {
		return err
	}
	if err := w.kv.Delete(ctx, RoomKey(room.ID)); err != nil {
		return fmt.Errorf("rooms: delete room %s: %w", room.ID, err)
	}
	return nil
}

// closingGrace is how long a closed room is left to the reclaim that closed
// it (making its dossier) before the sweep finishes its removal.
const closingGrace = 5 * time.Minute
