package rooms

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// Cursor is an agent's read position in a room's record, key
// cursor.<room_id>.<agent>.
type Cursor struct {
	Seq uint64    `json:"seq"`
	At  time.Time `json:"at"`
}

// status answers mesh.rooms.status {descriptor, drive_after?,
// drive_limit?}: the room's grade, its acl members, the record's use
// against its limits, the cursors' high-water mark and the caller's own
// cursor, and the drive with one page of its entries (drive.next names
// where the next page starts).
func (w *Worker) status(ctx context.Context, r *bus.Request) (any, error) {
	var p struct {
		roomCall
		DriveAfter *string `json:"drive_after"`
		DriveLimit *int    `json:"drive_limit"`
	}
	_, room, err := w.access(ctx, r, &p)
	if err != nil {
		return nil, err
	}
	after, limit, err := pageRequest(p.DriveAfter, p.DriveLimit, "drive_limit", MaxDrivePage, MaxDrivePage)
	if err != nil {
		return nil, err
	}
	last, err := w.lastSeqs(ctx, []string{room.ID})
	if err != nil {
		return nil, err
	}
	cursors, err := w.kvValues(ctx, CursorKey(room.ID, "*"))
	if err != nil {
		return nil, err
	}
	var high uint64
	mine := Cursor{}
	for _, e := range cursors {
		var c Cursor
		if json.Unmarshal(e.Value, &c) != nil {
			continue
		}
		high = max(high, c.Seq)
		if e.Key == CursorKey(room.ID, r.Env.From) {
			mine = c
		}
	}
	drive, err := w.driveStatus(ctx, room, after, limit)
	if err != nil {
		return nil, err
	}
	out := map[string]any{
		"room_id": room.ID, "name": room.Name, "privacy": room.Privacy, "channels": room.Channels,
		"creator": room.Creator, "handle": room.Handle,
		"created_at": protocol.FormatTime(room.CreatedAt), "last_active": protocol.FormatTime(room.LastActive),
		"record": map[string]any{"msgs": room.RecordMsgs, "bytes": room.RecordBytes, "last_seq": nullSeq(last[room.ID]),
			"max_msgs": w.limits.RecordMsgs, "max_bytes": w.limits.RecordBytes},
		"cursor":            cursorAnswer(mine),
		"cursor_high_water": high,
		"idle_expiry_at":    protocol.FormatTime(room.LastActive.Add(w.limits.IdleAfter)),
		"drive":             drive,
	}
	if room.Privacy == GradeACL {
		out["members"] = room.Members
	}
	return out, nil
}

// lastSeqs is the last record seq of each room that has one, in one batch
// read per maxMultiLast rooms.
func (w *Worker) lastSeqs(ctx context.Context, roomIDs []string) (map[string]uint64, error) {
	out := make(map[string]uint64, len(roomIDs))
	for start := 0; start < len(roomIDs); start += maxMultiLast {
		chunk := roomIDs[start:min(start+maxMultiLast, len(roomIDs))]
		subjects := make([]string, len(chunk))
		for i, id := range chunk {
			subjects[i] = RecordSubject(id)
		}
		msgs, err := w.lastMsgs(ctx, RecordStream, subjects)
		if err != nil {
			return nil, fmt.Errorf("rooms: last record seqs: %w", err)
		}
		for _, m := range msgs {
			out[strings.TrimPrefix(m.Subject, RecordSubject(""))] = m.Sequence
		}
	}
	return out, nil
}

// nullSeq is a seq, or null for none.
func nullSeq(seq uint64) any {
	if seq == 0 {
		return nil
	}
	return seq
}

func cursorAnswer(c Cursor) map[string]any {
	var at any
	if !c.At.IsZero() {
		at = protocol.FormatTime(c.At)
	}
	return map[string]any{"seq": c.Seq, "at": at}
}

// mine answers mesh.rooms.mine {descriptor?, after?, limit?} with {rooms,
// next?}: the durable rooms the caller created or was admitted to, from the
// member.<agent>. index (never capability or sealed rooms merely held),
// oldest first, one page at a time (at most limit, DefaultMinePage by
// default and MaxMinePage at most, and pageBytes of them; next names where
// the next page starts). It names no room, so a descriptor is optional;
// one given must pass Access.
func (w *Worker) mine(ctx context.Context, r *bus.Request) (any, error) {
	if err := w.optionalAccess(ctx, r); err != nil {
		return nil, err
	}
	var pg struct {
		After *string `json:"after"`
		Limit *int    `json:"limit"`
	}
	if err := r.Decode(&pg); err != nil {
		return nil, err
	}
	after, limit, err := pageRequest(pg.After, pg.Limit, "limit", DefaultMinePage, MaxMinePage)
	if err != nil {
		return nil, err
	}
	index, err := w.kvValues(ctx, MemberKey(r.Env.From, "*"))
	if err != nil {
		return nil, err
	}
	var roomKeys []string
	for _, e := range index {
		roomKeys = append(roomKeys, RoomKey(strings.TrimPrefix(e.Key, MemberKey(r.Env.From, ""))))
	}
	roomVals, err := w.kvValues(ctx, roomKeys...)
	if err != nil {
		return nil, err
	}
	var rooms []mineRoom
	for _, e := range roomVals {
		var room Room
		if json.Unmarshal(e.Value, &room) != nil || room.ClosedAt != nil || room.Privacy != GradeACL && room.Creator != r.Env.From ||
			!room.IsMember(r.Env.From) {
			continue
		}
		var name any
		if room.Name != "" {
			name = room.Name
		}
		role := RoleMember
		if room.Creator == r.Env.From {
			role = RoleCreator
		}
		rooms = append(rooms, mineRoom{Descriptor: room.Descriptor, RoomID: room.ID, Name: name, Privacy: room.Privacy,
			CreatedAt: protocol.FormatTime(room.CreatedAt), Role: role, createdAt: room.CreatedAt})
	}
	slices.SortFunc(rooms, func(a, b mineRoom) int { return strings.Compare(a.key(), b.key()) })
	page, next, err := pageOf(rooms, mineRoom.key, after, limit)
	if err != nil {
		return nil, err
	}
	// The record and cursor of the page's rooms only.
	ids := make([]string, len(page))
	cursorKeys := make([]string, len(page))
	for i, m := range page {
		ids[i], cursorKeys[i] = m.RoomID, CursorKey(m.RoomID, r.Env.From)
	}
	cursorVals, err := w.kvValues(ctx, cursorKeys...)
	if err != nil {
		return nil, err
	}
	last, err := w.lastSeqs(ctx, ids)
	if err != nil {
		return nil, err
	}
	cursors := map[string]Cursor{}
	for _, e := range cursorVals {
		var c Cursor
		if json.Unmarshal(e.Value, &c) == nil {
			cursors[e.Key] = c
		}
	}
	for i := range page {
		page[i].LastSeq = nullSeq(last[page[i].RoomID])
		page[i].Cursor = cursorAnswer(cursors[CursorKey(page[i].RoomID, r.Env.From)])
	}
	out := map[string]any{"rooms": page}
	if next != "" {
		out["next"] = next
	}
	return out, nil
}

// mineRoom is one room of mine's answer (upstream-notes §7).
type mineRoom struct {
	Descriptor json.RawMessage `json:"descriptor"`
	RoomID     string          `json:"room_id"`
	Name       any             `json:"name"`
	Privacy    string          `json:"privacy"`
	CreatedAt  string          `json:"created_at"`
	Role       string          `json:"role"`
	LastSeq    any             `json:"last_seq"`
	Cursor     map[string]any  `json:"cursor"`

	createdAt time.Time
}

// key orders mine's rooms and is its page cursor: when the room was
// created (to the nanosecond, fixed width), then its id.
func (m mineRoom) key() string {
	return m.createdAt.UTC().Format("2006-01-02T15:04:05.000000000Z") + "/" + m.RoomID
}

// optionalAccess runs Access when the call carries a descriptor: for the
// verbs about the caller rather than one room (mine, usage).
func (w *Worker) optionalAccess(ctx context.Context, r *bus.Request) error {
	var p roomCall
	if err := r.Decode(&p); err != nil {
		return err
	}
	if len(p.Descriptor) == 0 || string(p.Descriptor) == "null" {
		return nil
	}
	_, room, err := w.gate.Access(ctx, p.Descriptor, r.Env.From)
	if err != nil {
		return err
	}
	w.touch(ctx, room)
	return nil
}

// cursor answers mesh.rooms.cursor {descriptor, seq?}: without seq it reads
// the caller's position {seq, at}; with seq it moves it there if that is
// further, {seq, advanced} (a cursor never moves back).
func (w *Worker) cursor(ctx context.Context, r *bus.Request) (any, error) {
	var p struct {
		roomCall
		Seq *int64 `json:"seq"`
	}
	_, room, err := w.access(ctx, r, &p)
	if err != nil {
		return nil, err
	}
	key := CursorKey(room.ID, r.Env.From)
	if p.Seq == nil {
		c, _, err := bus.GetJSON[Cursor](ctx, w.kv, key)
		if err != nil {
			return nil, fmt.Errorf("rooms: read cursor: %w", err)
		}
		return cursorAnswer(c), nil
	}
	if *p.Seq < 0 {
		return nil, errs.New(errs.InputInvalid, "seq must be a seq of the room's record (0 or more)")
	}
	seq, now := uint64(*p.Seq), w.now().UTC()
	c, advanced, err := bus.CAS(ctx, w.kv, key, func(cur *Cursor, exists bool) (*Cursor, error) {
		if exists && cur.Seq >= seq {
			return nil, bus.ErrNoChange
		}
		return &Cursor{Seq: seq, At: now}, nil
	})
	if err != nil {
		return nil, fmt.Errorf("rooms: move cursor: %w", err)
	}
	var at uint64
	if c != nil {
		at = c.Seq
	}
	return map[string]any{"seq": at, "advanced": advanced}, nil
}

// usage answers mesh.rooms.usage {descriptor?}: the durable rooms and drive
// bytes of the caller's operator against their limits.
func (w *Worker) usage(ctx context.Context, r *bus.Request) (any, error) {
	if err := w.optionalAccess(ctx, r); err != nil {
		return nil, err
	}
	owner, err := w.owner(ctx, r.Env.From)
	if err != nil {
		return nil, err
	}
	q, _, err := bus.GetJSON[Quota](ctx, w.kv, QuotaKey(owner.Operator))
	if err != nil {
		return nil, fmt.Errorf("rooms: read quota: %w", err)
	}
	return map[string]any{"operator": owner.Operator, "handle": owner.Handle,
		"rooms": len(q.RoomIDs), "max_rooms": w.limits.RoomsPerOperator,
		"drive_bytes": q.DriveBytes, "max_drive_bytes": w.limits.DriveBytesPerOperator,
		"max_file_bytes": w.limits.FileBytes}, nil
}
