package rooms

import (
	"encoding/json"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/bus/bustest"
)

// A Gate records a holder once and answers for it on any copy; a holder
// key left by a removed room of the same id counts for nothing, and
// presenting the new room's descriptor replaces it; the creator and acl
// rooms need no key.
func TestGateHolders(t *testing.T) {
	h := startDrive(t, 1, Limits{})
	creator, holder, other := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)
	roomID, desc := h.room(creator, "ops@example.com", GradeCapability)
	aclID, aclDesc := h.room(creator, "ops@example.com", GradeACL, other.Public())
	a, b := NewGate(h.kv, h.nc, nil), NewGate(h.kv, nil, nil)
	room := h.roomRecord(roomID)

	for _, g := range []*Gate{a, b} {
		if ok, err := g.Holds(t.Context(), &room, holder.Public()); err != nil || ok {
			t.Fatalf("holds before presenting: %t %v", ok, err)
		}
		if ok, _ := g.Holds(t.Context(), &room, creator.Public()); !ok {
			t.Fatal("the creator needs no presenting")
		}
	}
	if _, _, err := a.Access(t.Context(), desc, holder.Public()); err != nil {
		t.Fatal(err)
	}
	for _, g := range []*Gate{a, b} {
		if ok, err := g.Holds(t.Context(), &room, holder.Public()); err != nil || !ok {
			t.Fatalf("holds after presenting: %t %v", ok, err)
		}
	}
	// The creator and an acl member leave no key.
	if _, _, err := a.Access(t.Context(), desc, creator.Public()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Access(t.Context(), aclDesc, other.Public()); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{HolderKey(roomID, creator.Public()), HolderKey(aclID, other.Public())} {
		if _, err := h.kv.Get(t.Context(), k); err == nil {
			t.Fatalf("%s written", k)
		}
	}

	// A key of an earlier room with this id.
	stale, _ := json.Marshal(Holder{RoomCreatedAt: room.CreatedAt.Add(-time.Hour), At: time.Now()})
	if _, err := h.kv.Put(t.Context(), HolderKey(roomID, other.Public()), stale); err != nil {
		t.Fatal(err)
	}
	fresh := NewGate(h.kv, h.nc, nil)
	if ok, _ := fresh.Holds(t.Context(), &room, other.Public()); ok {
		t.Fatal("a holder key of a removed room counts")
	}
	if _, _, err := fresh.Access(t.Context(), desc, other.Public()); err != nil {
		t.Fatal(err)
	}
	if ok, _ := NewGate(h.kv, h.nc, nil).Holds(t.Context(), &room, other.Public()); !ok {
		t.Fatal("presenting did not replace the stale key")
	}
}
