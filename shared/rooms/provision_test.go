package rooms_test

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/rooms"
)

// signatureTags reads the upstream fixture signature-tags.json from the
// handbook's conformance folder beside the repository (or
// MESH_CONFORMANCE_DIR).
func signatureTags(t *testing.T) map[string]any {
	t.Helper()
	dir := os.Getenv("MESH_CONFORMANCE_DIR")
	if dir == "" {
		_, file, _, _ := runtime.Caller(0)
		dir = filepath.Join(filepath.Dir(file), "..", "..", "..", "shared", "conformance")
	}
	b, err := os.ReadFile(filepath.Join(dir, "signature-tags.json"))
	if os.IsNotExist(err) {
		t.Skipf("conformance fixtures not found in %s (set MESH_CONFORMANCE_DIR)", dir)
	}
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

// The room_descriptor vector of signature-tags.json verifies through the
// rooms service's own path: ParseDescriptor takes it as an object and as
// its token, and provision signed by its published sender gets past the
// signature to the next rule (an ephemeral room is not provisioned). The
// vector changed by one character is refused as a bad signature. A
// durable descriptor signed by the same published key is provisioned.
func TestDescriptorVector(t *testing.T) {
	doc := signatureTags(t)
	vec := doc["room_descriptor"].(map[string]any)
	signed, err := json.Marshal(vec["signed"])
	if err != nil {
		t.Fatal(err)
	}
	d, err := rooms.ParseDescriptor(signed)
	if err != nil {
		t.Fatalf("the vector does not verify: %v", err)
	}
	if d.RoomID != "conformance-room-b7d9" || d.Durable() || d.Privacy != rooms.GradeCapability {
		t.Fatalf("parsed %+v", d)
	}
	token, _ := json.Marshal(base64.RawURLEncoding.EncodeToString(signed))
	if _, err := rooms.ParseDescriptor(token); err != nil {
		t.Fatalf("the vector's token form: %v", err)
	}

	ids := doc["identities"].(map[string]any)
	sender, err := keys.FromSeed[keys.AgentRole]([]byte(ids["sender_seed"].(string)))
	if err != nil || sender.Public() != ids["sender"] {
		t.Fatalf("published sender: %v", err)
	}
	h := start(t, rooms.Config{}, 1)
	h.owners.bind(sender.Public(), "vector", "vector@example.org")
	e := h.refused(sender, "provision", map[string]any{"descriptor": json.RawMessage(signed)}, errs.InputInvalid)
	if !strings.Contains(e.Message, "ephemeral") {
		t.Fatalf("the vector was refused for another reason: %v", e)
	}
	tampered := strings.Replace(string(signed), "signature-tags vector", "signature-tags vectoR", 1)
	h.refused(sender, "provision", map[string]any{"descriptor": json.RawMessage(tampered)}, errs.IdentityMismatch)

	durable := descriptor(t, sender, "conformance-room-durable", rooms.GradeCapability, nil)
	if out := h.must(sender, "provision", map[string]any{"descriptor": durable}); out["created"] != true || out["handle"] != "vector.vector@example.org" {
		t.Fatalf("durable room of the published key: %v", out)
	}
}

// Provision's rules, one by one.
func TestProvision(t *testing.T) {
	h := start(t, rooms.Config{}, 2)
	ana := h.agent("ana@example.org")
	bob := h.agent("bob@example.org")
	nobody := bustest.Agent(t)
	id := newRoomID()
	d := descriptor(t, ana, id, rooms.GradeCapability, nil)

	for _, tc := range []struct {
		name    string
		signer  keys.Signer
		payload map[string]any
		code    errs.Code
	}{
		{"no descriptor", ana, map[string]any{}, errs.InputInvalid},
		{"not the creator", bob, map[string]any{"descriptor": d}, errs.IdentityMismatch},
		{"ephemeral", ana, map[string]any{"descriptor": descriptor(t, ana, newRoomID(), rooms.GradeCapability, func(m map[string]any) { m["record"] = "ephemeral" })}, errs.InputInvalid},
		{"bad signature", ana, map[string]any{"descriptor": json.RawMessage(strings.Replace(string(d), `"name":"room`, `"name":"Room`, 1))}, errs.IdentityMismatch},
		{"creator bound to no handle", nobody, map[string]any{"descriptor": descriptor(t, nobody, newRoomID(), rooms.GradeCapability, nil)}, errs.NotNamed},
		{"acl room not durable", ana, map[string]any{"descriptor": descriptor(t, ana, newRoomID(), rooms.GradeACL, func(m map[string]any) { m["record"] = "ephemeral" })}, errs.InputInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h.refused(tc.signer, "provision", tc.payload, tc.code)
		})
	}

	out := h.must(ana, "provision", map[string]any{"descriptor": d})
	if out["created"] != true || out["room_id"] != id || out["handle"] != "bot.ana@example.org" {
		t.Fatalf("provision: %v", out)
	}
	// Again, as an object and as its token: the same room, counted once.
	again := h.must(ana, "provision", map[string]any{"descriptor": d})
	token := h.must(ana, "provision", map[string]any{"descriptor": base64.RawURLEncoding.EncodeToString(d)})
	if again["created"] != false || again["created_at"] != out["created_at"] || token["created"] != false {
		t.Fatalf("provision again: %v %v", again, token)
	}
	if q := h.quota("ana@example.org"); q.Rooms != 1 || len(q.RoomIDs) != 1 {
		t.Fatalf("quota %+v", q)
	}
	// Another descriptor with the same room_id, even by the same creator.
	other := descriptor(t, ana, id, rooms.GradeCapability, func(m map[string]any) { m["name"] = "another" })
	h.refused(ana, "provision", map[string]any{"descriptor": other}, errs.IdentityMismatch)
	// The stored room, and the creator's index entry.
	room, found := h.room(id)
	if !found || room.Creator != ana.Public() || room.Operator != "ana@example.org" || room.Handle != "bot.ana@example.org" ||
		len(room.Members) != 0 || room.LastActive.IsZero() {
		t.Fatalf("room %+v", room)
	}
	if _, err := h.kv.Get(t.Context(), rooms.MemberKey(ana.Public(), id)); err != nil {
		t.Fatalf("creator's index entry: %v", err)
	}

	// An acl room: the creator is its first member.
	aclID, aclD := h.provision(ana, rooms.GradeACL)
	if room, _ := h.room(aclID); len(room.Members) != 1 || room.Members[0] != ana.Public() {
		t.Fatalf("acl members %v", room.Members)
	}
	st := h.must(ana, "status", map[string]any{"descriptor": aclD})
	if m := st["members"].([]any); len(m) != 1 || m[0] != ana.Public() || st["privacy"] != rooms.GradeACL {
		t.Fatalf("acl status %v", st)
	}

	// A registrar that cannot be reached.
	h.owners.mu.Lock()
	h.owners.down = true
	h.owners.mu.Unlock()
	h.refused(ana, "provision", map[string]any{"descriptor": descriptor(t, ana, newRoomID(), rooms.GradeCapability, nil)}, errs.Unavailable)
}

// A worker without Owners refuses every provision, UNAVAILABLE.
func TestProvisionWithoutOwners(t *testing.T) {
	h := start(t, rooms.Config{}, 0)
	w, err := rooms.Start(t.Context(), bustest.Env(t, h.bus, "rooms", nil), rooms.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop() })
	ana := bustest.Agent(t)
	e := h.refused(ana, "provision", map[string]any{"descriptor": descriptor(t, ana, newRoomID(), rooms.GradeCapability, nil)}, errs.Unavailable)
	if !strings.Contains(e.Message, "registrar") {
		t.Fatalf("message %q", e.Message)
	}
}

// Ten durable rooms per operator: the eleventh is QUOTA_EXCEEDED, whoever
// of the operator's agents asks, and reclaiming one frees its place.
func TestQuota(t *testing.T) {
	h := start(t, rooms.Config{}, 3)
	ana := h.agent("ana@example.org")
	ana2 := h.agent("ana@example.org") // another agent of the same operator
	bob := h.agent("bob@example.org")
	var ds []json.RawMessage
	for i := range rooms.DefaultRoomsPerOperator {
		signer := ana
		if i%2 == 1 {
			signer = ana2
		}
		_, d := h.provision(signer, rooms.GradeCapability)
		ds = append(ds, d)
	}
	eleventh := descriptor(t, ana2, newRoomID(), rooms.GradeCapability, nil)
	e := h.refused(ana2, "provision", map[string]any{"descriptor": eleventh}, errs.QuotaExceeded)
	if e.Details["limit"] != float64(10) || !strings.Contains(e.Message, "reclaim") {
		t.Fatalf("refusal %+v", e)
	}
	// Provisioning a counted room again is still fine; another operator
	// has its own ten.
	h.must(ana, "provision", map[string]any{"descriptor": ds[0]})
	h.provision(bob, rooms.GradeCapability)
	u := h.must(ana2, "usage", map[string]any{})
	if u["rooms"] != float64(10) || u["max_rooms"] != float64(10) || u["operator"] != "ana@example.org" ||
		u["max_drive_bytes"] != float64(rooms.DefaultDriveBytesPerOperator) {
		t.Fatalf("usage %v", u)
	}
	h.must(ana, "reclaim", map[string]any{"descriptor": ds[0]})
	if u := h.must(ana, "usage", map[string]any{"descriptor": ds[1]}); u["rooms"] != float64(9) {
		t.Fatalf("usage after reclaim %v", u)
	}
	h.must(ana2, "provision", map[string]any{"descriptor": eleventh})
	if q := h.quota("ana@example.org"); q.Rooms != 10 || len(q.RoomIDs) != 10 {
		t.Fatalf("quota %+v", q)
	}
}

// Ten agents of one operator racing for its last two places: exactly two
// win, across three copies.
func TestQuotaRace(t *testing.T) {
	h := start(t, rooms.Config{Limits: rooms.Limits{RoomsPerOperator: 2}}, 3)
	results := make(chan error, 10)
	for range 10 {
		a := h.agent("race@example.org")
		d := descriptor(t, a, newRoomID(), rooms.GradeCapability, nil)
		go func() {
			_, err := h.call(a, "provision", map[string]any{"descriptor": d})
			results <- err
		}()
	}
	won, lost := 0, 0
	for range 10 {
		switch err := <-results; errs.CodeOf(err) {
		case "":
			if err != nil {
				t.Fatal(err)
			}
			won++
		case errs.QuotaExceeded:
			lost++
		default:
			t.Fatalf("provision: %v", err)
		}
	}
	if won != 2 || lost != 8 {
		t.Fatalf("%d won, %d lost", won, lost)
	}
	if q := h.quota("race@example.org"); q.Rooms != 2 {
		t.Fatalf("quota %+v", q)
	}
}
