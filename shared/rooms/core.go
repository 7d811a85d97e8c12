package rooms

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"time"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// coreEndpoints are the room verbs: provision, reclaim, replay, status,
// mine, cursor, usage, dossier; and the services' idle sweep.
func (w *Worker) coreEndpoints() []endpoint {
	return []endpoint{
		{"provision", protocol.RoomVerbSubject("provision"), w.provision},
		{"reclaim", protocol.RoomVerbSubject("reclaim"), w.reclaim},
		{"replay", protocol.RoomVerbSubject("replay"), w.replay},
		{"status", protocol.RoomVerbSubject("status"), w.status},
		{"mine", protocol.RoomVerbSubject("mine"), w.mine},
		{"cursor", protocol.RoomVerbSubject("cursor"), w.cursor},
		{"usage", protocol.RoomVerbSubject("usage"), w.usage},
		{"dossier", protocol.RoomVerbSubject("dossier"), w.dossier},
		{"sweep", protocol.SubjRoomsSweep, w.sweepEndpoint},
	}
}

// coreState is what one copy keeps for the ingest: counters of what it did
// with the room traffic it received.
type coreState struct {
	recorded, duplicates, dropped atomic.Uint64
}

// Stats counts what one copy's ingest did with the room traffic it
// received.
type Stats struct {
	Recorded   uint64 // appended to the record
	Duplicates uint64 // the same (from, id) was already recorded
	Dropped    uint64 // refused: unknown room, bad envelope, sender rule, full record
}

// Stats reports this copy's ingest counters.
func (w *Worker) Stats() Stats {
	return Stats{Recorded: w.core.recorded.Load(), Duplicates: w.core.duplicates.Load(), Dropped: w.core.dropped.Load()}
}

// roomCall is the payload every verb naming a room carries; a verb's own
// payload embeds it.
type roomCall struct {
	Descriptor json.RawMessage `json:"descriptor"`
}

func (c *roomCall) descriptor() json.RawMessage { return c.Descriptor }

// described is a verb's payload: a roomCall and the verb's own members.
type described interface{ descriptor() json.RawMessage }

// access decodes the request into p, runs Access and notes the call as the
// room's activity.
func (w *Worker) access(ctx context.Context, r *bus.Request, p described) (*Descriptor, *Room, error) {
	if err := r.Decode(p); err != nil {
		return nil, nil, err
	}
	d, room, err := w.gate.Access(ctx, p.descriptor(), r.Env.From)
	if err != nil {
		return nil, nil, err
	}
	w.touch(ctx, room)
	return d, room, nil
}

// activeEvery is how stale LastActive may be before a call writes it
// again: idle expiry counts days, so a write a minute keeps the room's
// compare-and-set traffic low.
const activeEvery = time.Minute

// touch moves the room's LastActive to now when it is more than
// activeEvery old. A failure is only logged: activity is a hint for the
// idle sweep, never a reason to refuse a call.
func (w *Worker) touch(ctx context.Context, room *Room) {
	now := w.now()
	if now.Sub(room.LastActive) < activeEvery {
		return
	}
	_, _, err := bus.CAS(ctx, w.kv, RoomKey(room.ID), func(cur *Room, exists bool) (*Room, error) {
		if !exists || cur.ClosedAt != nil || now.Sub(cur.LastActive) < activeEvery {
			return nil, bus.ErrNoChange
		}
		cur.LastActive = now
		return cur, nil
	})
	if err != nil {
		w.svc.Log.Debug("room activity not noted", "room", room.ID, "err", err)
	}
}

// creatorOnly refuses a caller who is not the room's creator.
func creatorOnly(room *Room, from, verb string) error {
	if from != room.Creator {
		return errs.Newf(errs.Forbidden, "only the creator of room %s may %s it", room.ID, verb)
	}
	return nil
}
