package creds

import (
	"testing"

	"agentmesh.dev/mesh/shared/protocol"
)

// FuzzGuardRoom adds a publish and a subscribe subject to a room
// credential's set: whenever the guard passes it, every subject of both
// allow lists lies under the room's own traffic or replies, so the broker
// can deliver the credential nothing of another room, the services, the
// events or the system account.
func FuzzGuardRoom(f *testing.F) {
	for _, s := range []string{"mesh.aclroom.r1.main", "mesh.aclroom.r2.main", "mesh.aclroom.*.main", "mesh.aclroom.>",
		"_INBOX.aclroom.r1.x.1", "_INBOX.>", "mesh.rooms.credential", "mesh.*.r1.>", "*.aclroom.r1.>", ">", "mesh.aclroom.r1",
		"$SYS.>", "mesh.aclroom.r1.>.x", "mesh.aclroom.r1..x", " ", ""} {
		f.Add(s, s)
	}
	key := agentKeys(f, 1)[0]
	room := RoomPermissions("r1")
	own := []subject{split(protocol.ACLRoomSubject("r1", ">")), split(protocol.ACLRoomInboxPrefix("r1") + ".>")}
	f.Fuzz(func(t *testing.T, pub, sub string) {
		p := addSub(addPub(room, pub), sub)
		if Guard(KindRoom, key, nil, p) != nil {
			return
		}
		for _, s := range append(p.PubAllow, p.SubAllow...) {
			t2, ok := validSplit(s, nil)
			if !ok {
				t.Fatalf("the guard passed the malformed subject %q", s)
			}
			if !covers(own[0], t2) && !covers(own[1], t2) {
				t.Fatalf("the guard passed %q, outside room r1's traffic and replies", s)
			}
		}
	})
}
