package board_test

import (
	"encoding/base64"
	"encoding/json"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/board"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/rooms"
)

// A holder of a capability room's descriptor re-signs it under its own key,
// with the creator's creator and sig, another channel and the acl grade as
// case-folded shadow keys (review finding 2). Before the fix the board
// admitted it and published services-signed events on the channel the
// forgery named; now it is refused, and the events of a genuine call go to
// the stored room's first channel.
func TestForgedDescriptorRefused(t *testing.T) {
	f := setup(t, board.Config{})
	creator, attacker := bustest.Agent(t), bustest.Agent(t)
	r := f.room(creator, rooms.GradeCapability, true)
	var vm map[string]any
	if err := json.Unmarshal(r.descriptor, &vm); err != nil {
		t.Fatal(err)
	}
	lower := map[string]any{"rooms": "v1", "room_id": r.id, "channels": []any{"main", "side"}, "record": rooms.DurableRecord(r.id),
		"privacy": rooms.GradeCapability, "creator": attacker.Public(), "created_at": protocol.FormatTime(time.Now())}
	upper := map[string]any{"CREATOR": vm["creator"], "SIG": vm["sig"], "CHANNELS": []any{"evil"}, "PRIVACY": rooms.GradeACL}
	all := map[string]any{}
	for _, m := range []map[string]any{lower, upper} {
		for k, v := range m {
			all[k] = v
		}
	}
	sig, err := protocol.SignRoomDescriptor(all, attacker)
	if err != nil {
		t.Fatal(err)
	}
	lower["sig"] = sig
	a, _ := json.Marshal(lower)
	b, _ := json.Marshal(upper)
	raw := append(append(a[:len(a)-1:len(a)-1], ','), b[1:]...)
	// The token form: an object inside the request's payload would be
	// canonicalised with it, upper-case keys first.
	token, _ := json.Marshal(base64.RawURLEncoding.EncodeToString(raw))
	forged := &room{id: r.id, descriptor: token, events: r.events}

	_, err = f.call(forged, attacker, board.VerbPost, map[string]any{"title": "forged"})
	wantCode(t, err, errs.InputInvalid, "is not spelled")
	// The genuine descriptor posts, and its event is on the stored room's
	// first channel (events checks the subject).
	f.post(r, attacker, "genuine")
	if evs := f.events(r); len(evs) != 1 || evs[0].Item.Title != "genuine" {
		t.Fatalf("events %+v", evs)
	}
}

// A board call presents the room's descriptor: an agent that lists a
// capability room's board is recorded as a holder (holder.<room>.<agent>),
// whose messages the room's record then takes (review finding 3); the
// creator and acl members need no key.
func TestBoardCallRecordsHolder(t *testing.T) {
	f := setup(t, board.Config{})
	creator, holder, member := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)
	open := f.room(creator, rooms.GradeCapability, true)
	acl := f.room(creator, rooms.GradeACL, true, member)
	f.list(open, holder, nil)
	f.list(open, creator, nil)
	f.list(acl, member, nil)
	e, err := f.kv.Get(t.Context(), rooms.HolderKey(open.id, holder.Public()))
	if err != nil {
		t.Fatalf("holder key: %v", err)
	}
	var h rooms.Holder
	if err := json.Unmarshal(e.Value(), &h); err != nil || h.RoomCreatedAt.IsZero() {
		t.Fatalf("holder %s: %v", e.Value(), err)
	}
	for _, k := range []string{rooms.HolderKey(open.id, creator.Public()), rooms.HolderKey(acl.id, member.Public())} {
		if _, err := f.kv.Get(t.Context(), k); err == nil {
			t.Fatalf("%s written", k)
		}
	}
}
