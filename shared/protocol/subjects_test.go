package protocol

import "testing"

// The reply namespaces a service or agent answers on, and the subjects it
// never answers on: an acl room's reply space (_INBOX.aclroom.<room>.>) is
// reachable on that room's credentials only, so nobody may steer a
// services-signed answer into it.
func TestReplySubjects(t *testing.T) {
	for _, tc := range []struct {
		subject       string
		reply, client bool
	}{
		{"_INBOX.abc.1", true, true},
		{"_INBOX.", false, false},
		{PrivateInboxPrefix("UABC") + ".1", true, true},
		{RelayReplyPrefix + ".x.1", true, false},
		{ServiceInboxPrefix + ".x.1", true, false},
		{ACLRoomInboxPrefix("room1") + ".abc", false, false},
		{"_INBOX.aclroom.room1.abc", false, false},
		{"_INBOX.aclroom", true, true}, // not the acl space: no dot after it
		{"_INBOX.aclroomx.1", true, true},
		{ACLRoomSubject("room1", "main"), false, false},
		{"$KV.mesh_rooms.room.x", false, false},
		{"mesh.rooms.status", false, false},
	} {
		if got := IsReplySubject(tc.subject); got != tc.reply {
			t.Errorf("IsReplySubject(%q) = %t, want %t", tc.subject, got, tc.reply)
		}
		if got := IsClientReplySubject(tc.subject); got != tc.client {
			t.Errorf("IsClientReplySubject(%q) = %t, want %t", tc.subject, got, tc.client)
		}
	}
}
