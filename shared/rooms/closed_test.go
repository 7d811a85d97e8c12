package rooms

import (
	"testing"

	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/errs"
)

// closeForTest marks a room closed as reclaim's first step does, leaving
// the rest of the removal undone (a reclaim making its dossier).
func closeForTest(t *testing.T, w *Worker, roomID string) {
	t.Helper()
	if _, err := w.closeRoom(t.Context(), roomID, WhyReclaimed, nil); err != nil {
		t.Fatal(err)
	}
}

// A room being removed (ClosedAt set, its credentials revoked by
// roomClosed) takes no acl verb (review finding 8): before, credential
// minted a room credential for it that nothing would ever revoke (the
// room's cred. keys were already listed), and admit, expel and leave
// changed it.
func TestACLVerbsRefuseAClosedRoom(t *testing.T) {
	m := startACL(t, 1, Limits{}, true)
	creator, member, other := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)
	desc, id := m.room(creator, GradeACL)
	m.must(nil, creator, "admit", map[string]any{"descriptor": desc, "agent_id": member.Public()})
	closeForTest(t, m.workers[0], id)
	before := m.readRoom(id)

	m.refused(nil, member, "credential", map[string]any{"descriptor": desc}, errs.NotFound, "reclaimed or expired")
	m.refused(nil, creator, "credential", map[string]any{"descriptor": desc}, errs.NotFound, "reclaimed or expired")
	m.refused(nil, creator, "admit", map[string]any{"descriptor": desc, "agent_id": other.Public()}, errs.NotFound, "reclaimed or expired")
	m.refused(nil, creator, "expel", map[string]any{"descriptor": desc, "member": member.Public()}, errs.NotFound, "reclaimed or expired")
	m.refused(nil, member, "leave", map[string]any{"descriptor": desc}, errs.NotFound, "reclaimed or expired")
	if live, revoked := m.credsOnRecord(desc, member); live+revoked != 0 {
		t.Fatalf("credentials on record for a closed room: %d live, %d revoked", live, revoked)
	}
	after := m.readRoom(id)
	if len(after.Members) != len(before.Members) || len(after.Expelled) != 0 {
		t.Fatalf("members %v expelled %v after verbs on a closed room", after.Members, after.Expelled)
	}
	// The check after minting: a room closed between the first check and
	// the credential's record takes the credential back.
	if err := mayHoldCredential(&after, member.Public()); errs.CodeOf(err) != errs.NotFound {
		t.Fatalf("mayHoldCredential on a closed room: %v", err)
	}
}

// An attach that read the room before reclaim closed it counts nothing
// and stores nothing (review finding 9): before, it counted its bytes in
// the room and the quota and stored them in MESH_DRIVE after the purge.
func TestAttachRefusesAClosedRoom(t *testing.T) {
	h := startDrive(t, 1, Limits{})
	creator := bustest.Agent(t)
	roomID, desc := h.room(creator, "ops@example.com", GradeCapability)
	room := h.roomRecord(roomID) // read by Access, before the close
	closeForTest(t, h.workers[0], roomID)
	a, err := parseAttach(mustMarshal(t, attachPayload(desc, "late.txt", []byte("too late"))), DefaultFileBytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.workers[0].storeCounted(t.Context(), &room, a); errs.CodeOf(err) != errs.NotFound {
		t.Fatalf("storeCounted on a closed room: %v, want NOT_FOUND", err)
	}
	if r, q := h.roomRecord(roomID), h.quota("ops@example.com"); r.DriveBytes != 0 || q.DriveBytes != 0 {
		t.Fatalf("counted %d bytes in the room, %d in the quota", r.DriveBytes, q.DriveBytes)
	}
	if _, found, err := h.workers[0].driveBytes(t.Context(), roomID, a.DigestHex); err != nil || found {
		t.Fatalf("bytes stored for a closed room: %t %v", found, err)
	}
	// And through the verb: NOT_FOUND.
	h.refuse(creator, "attach", attachPayload(desc, "late.txt", []byte("too late")), errs.NotFound)
}
