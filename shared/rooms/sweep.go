package rooms

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// SweepInterval is how often the scheduled job RoomSweep asks the rooms
// worker to expire idle rooms (upstream-notes §7: swept hourly).
const SweepInterval = time.Hour

// quotaGrace is how old a quota's count of a room that does not exist must
// be before the sweep gives it back: a provision cut short between
// counting the room and creating it. A provision in progress creates its
// room well within it.
const quotaGrace = 10 * time.Minute

// sweepEndpoint answers mesh.internal.rooms.sweep {} with {expired}: the
// services' scheduled job (RoomSweep) only.
func (w *Worker) sweepEndpoint(ctx context.Context, r *bus.Request) (any, error) {
	if err := w.svc.RequireServices(r); err != nil {
		return nil, err
	}
	n, err := w.Sweep(ctx)
	if err != nil && n == 0 {
		return nil, err
	}
	if err != nil {
		w.svc.Log.Warn("room sweep stopped early; the next one continues", "expired", n, "err", err)
	}
	return map[string]any{"expired": n}, nil
}

// Sweep removes every room idle longer than Limits.IdleAfter with the
// cascade of reclaim, finishes removals that were cut short, and gives back
// quota counts of rooms whose provision was cut short. It returns how many
// rooms it removed; it stops early, with what it did so far, when ctx ends.
func (w *Worker) Sweep(ctx context.Context) (int, error) {
	entries, err := w.kvValues(ctx, RoomKey("*"))
	if err != nil {
		return 0, err
	}
	now := w.now()
	removed := 0
	rooms := make(map[string]bool, len(entries))
	var errsSeen []error
	for _, e := range entries {
		if ctx.Err() != nil {
			return removed, ctx.Err()
		}
		var room Room
		if err := json.Unmarshal(e.Value, &room); err != nil {
			errsSeen = append(errsSeen, fmt.Errorf("rooms: decode %s: %w", e.Key, err))
			continue
		}
		rooms[room.ID] = true
		switch {
		case room.ClosedAt != nil && now.Sub(*room.ClosedAt) < closingGrace:
			continue // a reclaim is making its dossier
		case room.ClosedAt != nil:
		case now.Sub(room.LastActive) > w.limits.IdleAfter:
			idle := func(cur *Room) bool { return now.Sub(cur.LastActive) > w.limits.IdleAfter }
			closed, err := w.closeRoom(ctx, room.ID, WhyExpired, idle)
			if errors.Is(err, errNotIdle) || errs.CodeOf(err) == errs.NotFound {
				continue // spoke since, or removed since (another copy's sweep)
			}
			if err != nil {
				errsSeen = append(errsSeen, err)
				continue
			}
			room = *closed
		default:
			continue
		}
		if err := w.removeRoom(ctx, &room); err != nil {
			errsSeen = append(errsSeen, err)
			continue
		}
		removed++
		w.svc.Log.Info("room removed by the sweep", "room", room.ID, "why", room.Why)
	}
	if err := w.releaseLostCounts(ctx, rooms, now); err != nil {
		errsSeen = append(errsSeen, err)
	}
	// Room credentials revoked by expel and leave: restore a revocation the
	// broker lost, forget those whose credentials have expired.
	if restored, forgotten, err := w.syncRevocations(ctx); err != nil {
		errsSeen = append(errsSeen, err)
	} else if restored+forgotten > 0 {
		w.svc.Log.Info("room credential revocations synced", "restored", restored, "forgotten", forgotten)
	}
	return removed, errors.Join(errsSeen...)
}

// releaseLostCounts gives back the rooms a quota counts that do not exist
// (rooms lists those that did when the sweep began) and were counted more
// than quotaGrace ago: a provision that counted one since may still be
// creating it. A count with no time (made before counts had one) is as old
// as the quota's last write.
func (w *Worker) releaseLostCounts(ctx context.Context, rooms map[string]bool, now time.Time) error {
	quotas, err := w.kvValues(ctx, QuotaKey("")+"*")
	if err != nil {
		return err
	}
	for _, e := range quotas {
		var q Quota
		if err := json.Unmarshal(e.Value, &q); err != nil {
			continue
		}
		operator, err := base64.RawURLEncoding.DecodeString(strings.TrimPrefix(e.Key, QuotaKey("")))
		if err != nil {
			continue
		}
		for _, id := range slices.Clone(q.RoomIDs) {
			if rooms[id] {
				continue
			}
			at, ok := q.CountedAt[id]
			if !ok {
				at = e.Written
			}
			if now.Sub(at) < quotaGrace {
				continue
			}
			if _, found, err := bus.GetJSON[Room](ctx, w.kv, RoomKey(id)); err != nil || found {
				continue
			}
			if _, err := w.uncountRoom(ctx, string(operator), id, 0); err != nil {
				return err
			}
		}
	}
	return nil
}

// CallSweep asks the rooms workers to sweep (mesh.internal.rooms.sweep,
// signed by c's key, which must be the services key): the scheduled job
// RoomSweep. It returns how many rooms were removed.
func CallSweep(ctx context.Context, c *bus.Caller) (int, error) {
	out, err := c.Call(ctx, protocol.SubjRoomsSweep, protocol.TypeRequest, map[string]any{})
	if err != nil {
		return 0, err
	}
	n, _ := out["expired"].(float64)
	return int(n), nil
}
