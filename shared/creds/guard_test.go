package creds

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

func TestSubjectCovers(t *testing.T) {
	tests := []struct {
		pattern, subject string
		want             bool
	}{
		{"$KV.>", "$KV.mesh_registry.x", true},
		{"$KV.>", "$KV.>", true},
		{"$KV.>", "$KV", false},
		{"$KV.>", "$KV.*", true},
		{">", "a", true},
		{">", "a.b.c", true},
		{"*", "a", true},
		{"*", "a.b", false},
		{"*", ">", false},
		{"a.*", "a.*", true},
		{"a.*", "a.>", false},
		{"a.*.c", "a.b.c", true},
		{"a.b.c", "a.*.c", false},
		{"a.b", "a.b", true},
		{"a.b", "a.b.c", false},
		{"a.b.c", "a.b", false},
		{"mesh.agent.*.inbox", "mesh.agent.U1.inbox.guarded", false},
		{"$SYS.>", "$SYS.REQ.SERVER.PING", true},
		{"mesh.>", "$SYS.>", false},
	}
	for _, tc := range tests {
		if got := subjectCovers(tc.pattern, tc.subject); got != tc.want {
			t.Errorf("subjectCovers(%q, %q) = %v, want %v", tc.pattern, tc.subject, got, tc.want)
		}
	}
}

func TestPatternsOverlap(t *testing.T) {
	tests := []struct {
		a, b string
		want bool
	}{
		{"mesh.agent.*.inbox", "mesh.agent.U1.inbox", true},
		{"mesh.agent.*.inbox", "mesh.agent.U1.inbox.guarded", false},
		{"mesh.agent.*.inbox", "mesh.agent.>", true},
		{"mesh.agent.*.inbox", "mesh.>", true},
		{"mesh.agent.*.inbox", ">", true},
		{"mesh.agent.*.inbox", "mesh.agent.*.>", true},
		{"mesh.agent.*.inbox", "mesh.agent.*.outbox", false},
		{"mesh.agent.*.inbox", "mesh.*.*.*", true},
		{"mesh.agent.*.inbox", "mesh.agent", false},
		{"mesh.feed.*.*", "mesh.feed.get", false},
		{"mesh.feed.*.*", "mesh.feed.>", true},
		{"$JS.>", "_INBOX.>", false},
		{"$JS.>", "$JS", false},
		{"$JS.>", "$JS.API.STREAM.INFO.MESH_MAILBOX", true},
		{"a.b", "a.b", true},
		{"a.b", "a.c", false},
		{"*.b", "a.*", true},
	}
	for _, tc := range tests {
		if got := patternsOverlap(tc.a, tc.b); got != tc.want {
			t.Errorf("patternsOverlap(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
		if got := patternsOverlap(tc.b, tc.a); got != tc.want {
			t.Errorf("patternsOverlap(%q, %q) = %v, want %v (not symmetric)", tc.b, tc.a, got, tc.want)
		}
	}
}

func agentKeys(t testing.TB, n int) []string {
	t.Helper()
	out := make([]string, n)
	for i := range out {
		k, err := keys.Generate[keys.AgentRole]()
		if err != nil {
			t.Fatal(err)
		}
		out[i] = k.Public()
	}
	return out
}

// TestNodePermissionsAreSpecSet spells spec §4.6's set, with this mesh's
// changes (no JetStream subject, mesh.mailbox.fetch and .ack, the reply
// spaces), out in full, once, so any drift of the builder shows here.
func TestNodePermissionsAreSpecSet(t *testing.T) {
	ag := agentKeys(t, 3)
	a, b, nodeKey := ag[0], ag[1], ag[2]
	wantPub := []string{
		"mesh.registry.>", "mesh.agent.*.inbox", "mesh.task.>", "mesh.event.>", "mesh.presence.get",
		"mesh.heartbeat.*", "mesh.feed.get", "mesh.admission.guard", "mesh.admission.unguard",
		"mesh.mailbox.fetch", "mesh.mailbox.ack", "mesh.catalog.list", "mesh.catalog.remove",
		"mesh.rooms.provision", "mesh.rooms.reclaim", "mesh.rooms.replay", "mesh.rooms.status",
		"mesh.rooms.attach", "mesh.rooms.fetch", "mesh.rooms.mine", "mesh.rooms.cursor", "mesh.rooms.usage",
		"mesh.rooms.admit", "mesh.rooms.credential", "mesh.rooms.expel", "mesh.rooms.leave", "mesh.rooms.note",
		"mesh.rooms.notes", "mesh.rooms.dossier",
		"mesh.artifacts.put", "mesh.artifacts.fetch", "mesh.artifacts.stat", "mesh.artifacts.remove",
		"mesh.artifacts.usage", "mesh.artifacts.put.begin", "mesh.artifacts.put.commit", "mesh.artifacts.link",
		"mesh.board.post", "mesh.board.list", "mesh.board.claim", "mesh.board.complete", "mesh.board.abandon",
		"mesh.board.withdraw",
		"mesh.agreements.file", "mesh.agreements.list", "mesh.agreements.revoke",
		"mesh.credits.balance", "mesh.credits.history", "mesh.commerce.admit",
		"_INBOX.>", "_MESH_INBOX.>", "_MESH_RELAY.>",
	}
	for _, x := range []string{a, b} {
		wantPub = append(wantPub, "mesh.agent."+x+".outbox", "mesh.trace."+x, "mesh.feed."+x+".*")
	}
	wantSub := []string{
		"mesh.agent." + a + ".inbox", "mesh.agent." + a + ".inbox.guarded", "mesh.agent." + a + ".outbox",
		"mesh.agent." + b + ".inbox", "mesh.agent." + b + ".inbox.guarded", "mesh.agent." + b + ".outbox",
		"mesh.event.>", "mesh.task.>", "mesh.feed.*.*", "mesh.heartbeat.*", "_MESH_INBOX." + nodeKey + ".>",
	}
	wantPubDeny := []string{"$KV.>", "mesh.peer.>", "mesh.aclroom.>", "$SYS.>", "$JS.>", "$O.>", "mesh.internal.>", "_MESH_SVC.>", "_INBOX.aclroom.>"}
	wantSubDeny := append(slices.Clone(wantPubDeny), "_MESH_RELAY.>", "> >")

	for _, shared := range []bool{false, true} {
		p := NodePermissions(ag[:2], Replies{Key: nodeKey, Shared: shared})
		sub := wantSub
		if shared {
			sub = append(slices.Clone(wantSub), "_INBOX.>")
		}
		for _, c := range []struct {
			name      string
			got, want []string
		}{
			{"pub allow", p.PubAllow, wantPub},
			{"sub allow", p.SubAllow, sub},
			{"pub deny", p.PubDeny, wantPubDeny},
			{"sub deny", p.SubDeny, wantSubDeny},
		} {
			if !slices.Equal(c.got, c.want) {
				t.Errorf("shared=%v %s:\n got %q\nwant %q", shared, c.name, c.got, c.want)
			}
		}
	}
	// Bootstrap and app are the node set of one agent.
	if got, want := BootstrapPermissions(a, PrivateOnly(nodeKey)), NodePermissions([]string{a}, PrivateOnly(nodeKey)); !equalPerms(got, want) {
		t.Errorf("bootstrap set differs from the one-agent node set")
	}
	// An app's is that set and the activity and usage listings of its
	// account's agents.
	app := NodePermissions([]string{a}, Replies{Key: a, Shared: true})
	app.PubAllow = append(app.PubAllow, "mesh.activity.list", "mesh.usage.list")
	if got := AppPermissions(a, true); !equalPerms(got, app) {
		t.Errorf("app set differs from the one-agent node set with the activity and usage listings")
	}
}

func TestGuestAndJobPermissions(t *testing.T) {
	ks := agentKeys(t, 2)
	g, jobKey := ks[0], ks[1]
	p := GuestPermissions(g)
	// No mesh.registry.>: two register subjects, the plain one (upstream
	// SDKs) and the guest's own bound one, and no other key's. No shared
	// _INBOX.> and no mailbox. Heartbeats to follow, as a node.
	wantPub := []string{"mesh.registry.register", "mesh.registry.register." + g, "mesh.registry.deregister", "mesh.registry.discover",
		"mesh.registry.get.*", "mesh.registry.nodes.list",
		"mesh.agent.*.inbox", "mesh.task.>", "mesh.event.>",
		"mesh.presence.get", "mesh.heartbeat.*", "mesh.feed.get", "_INBOX.>", "_MESH_INBOX.>", "_MESH_RELAY.>",
		"mesh.agent." + g + ".outbox", "mesh.trace." + g, "mesh.feed." + g + ".*"}
	wantSub := []string{"mesh.agent." + g + ".inbox", "mesh.agent." + g + ".outbox",
		"mesh.event.>", "mesh.task.>", "mesh.feed.*.*", "mesh.heartbeat.*", "_MESH_INBOX." + g + ".>"}
	if !slices.Equal(p.PubAllow, wantPub) || !slices.Equal(p.SubAllow, wantSub) ||
		!slices.Equal(p.PubDeny, MeshDenies()) || !slices.Equal(p.SubDeny, subDenies()) {
		t.Errorf("guest set:\n%q\n%q\n%q\n%q", p.PubAllow, p.SubAllow, p.PubDeny, p.SubDeny)
	}
	// Pinned: the same without the plain register subject.
	pinned := PinnedGuestPermissions(g)
	if want := wantPub[1:]; !slices.Equal(pinned.PubAllow, want) || !slices.Equal(pinned.SubAllow, wantSub) ||
		!slices.Equal(pinned.PubDeny, MeshDenies()) || !slices.Equal(pinned.SubDeny, subDenies()) {
		t.Errorf("pinned guest set:\n%q\n%q", pinned.PubAllow, pinned.SubAllow)
	}

	j := JobPermissions(jobKey, g, "t1")
	wantPub = []string{"mesh.task.t1.update", "mesh.task.t1.stream", "mesh.task.get.t1",
		"mesh.agent." + g + ".outbox", "mesh.trace." + g}
	wantSub = []string{"mesh.task.t1.>", "_MESH_INBOX." + jobKey + ".>"}
	if !slices.Equal(j.PubAllow, wantPub) || !slices.Equal(j.SubAllow, wantSub) ||
		!slices.Equal(j.PubDeny, MeshDenies()) || !slices.Equal(j.SubDeny, subDenies()) {
		t.Errorf("job set:\n%q\n%q\n%q\n%q", j.PubAllow, j.SubAllow, j.PubDeny, j.SubDeny)
	}
}

// TestRoomPermissions spells the room credential's set out in full: one
// room's traffic and replies, both ways, and the mesh's denies less the two
// acl namespaces it exists to reach.
func TestRoomPermissions(t *testing.T) {
	p := RoomPermissions("r1")
	want := []string{"mesh.aclroom.r1.>", "_INBOX.aclroom.r1.>"}
	wantDeny := []string{"$KV.>", "mesh.peer.>", "$SYS.>", "$JS.>", "$O.>", "mesh.internal.>", "_MESH_SVC.>"}
	wantSubDeny := append(slices.Clone(wantDeny), "_MESH_RELAY.>", "> >")
	if !slices.Equal(p.PubAllow, want) || !slices.Equal(p.SubAllow, want) ||
		!slices.Equal(p.PubDeny, wantDeny) || !slices.Equal(p.SubDeny, wantSubDeny) {
		t.Errorf("room set:\n%q\n%q\n%q\n%q", p.PubAllow, p.SubAllow, p.PubDeny, p.SubDeny)
	}
	// The builders of protocol name the same subjects: the traffic of any
	// channel, and the reply prefix the room connection sets.
	for _, s := range []string{protocol.ACLRoomSubject("r1", "main"), protocol.ACLRoomInboxPrefix("r1") + ".x.1"} {
		if !anyCovers(p.PubAllow, split(s)) || !anyCovers(p.SubAllow, split(s)) {
			t.Errorf("%s is not granted both ways", s)
		}
	}
	// Every other guarded kind denies both acl namespaces, both ways, for
	// every room: the shared _INBOX.> grant does not reach a room's replies.
	for _, s := range []string{protocol.ACLRoomSubject("r1", "main"), protocol.ACLRoomInboxPrefix("r1") + ".x.1", protocol.ACLRoomInboxPrefix("*") + ".>"} {
		if !anyCovers(MeshDenies(), split(s)) || !anyCovers(subDenies(), split(s)) {
			t.Errorf("%s is not denied to the other kinds", s)
		}
	}
}

func equalPerms(a, b Permissions) bool {
	return slices.Equal(a.PubAllow, b.PubAllow) && slices.Equal(a.SubAllow, b.SubAllow) &&
		slices.Equal(a.PubDeny, b.PubDeny) && slices.Equal(a.SubDeny, b.SubDeny)
}

func TestEveryBuilderPassesTheGuard(t *testing.T) {
	ag := agentKeys(t, MaxNodeAgents+1)
	cred := ag[MaxNodeAgents]
	ag = ag[:MaxNodeAgents]
	tests := []struct {
		name   string
		kind   Kind
		key    string
		hosted []string
		perms  Permissions
	}{
		{"node of one", KindNode, cred, ag[:1], NodePermissions(ag[:1], PrivateOnly(cred))},
		{"node of two, shared inbox", KindNode, cred, ag[:2], NodePermissions(ag[:2], Replies{Key: cred, Shared: true})},
		{"node of sixteen", KindNode, cred, ag, NodePermissions(ag, PrivateOnly(cred))},
		{"bootstrap", KindBootstrap, cred, ag[:1], BootstrapPermissions(ag[0], PrivateOnly(cred))},
		{"bootstrap, shared inbox", KindBootstrap, cred, ag[:1], BootstrapPermissions(ag[0], Replies{Key: cred, Shared: true})},
		{"app", KindApp, ag[0], ag[:1], AppPermissions(ag[0], true)},
		{"guest", KindGuest, ag[0], ag[:1], GuestPermissions(ag[0])},
		{"pinned guest", KindGuest, ag[0], ag[:1], PinnedGuestPermissions(ag[0])},
		{"job", KindJob, cred, ag[:1], JobPermissions(cred, ag[0], "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b")},
		{"room", KindRoom, cred, nil, RoomPermissions("AbC-12_xyz")},
		{"room, one channel", KindRoom, cred, nil, with(RoomPermissions("r1"), func(p *Permissions) {
			p.PubAllow = []string{protocol.ACLRoomSubject("r1", "main")}
		})},
		{"guest following one node's heartbeats", KindGuest, ag[0], ag[:1], addSub(GuestPermissions(ag[0]), protocol.HeartbeatSubject(ag[1]))},
		{"app following one node's heartbeats", KindApp, ag[0], ag[:1], addSub(AppPermissions(ag[0], false), protocol.HeartbeatSubject(ag[1]))},
		// A narrower set passes too: the guard bounds, it does not demand.
		{"node hosting more than it serves", KindNode, cred, ag[:2], NodePermissions(ag[:1], PrivateOnly(cred))},
		{"deny wider than required", KindNode, cred, ag[:1], with(NodePermissions(ag[:1], PrivateOnly(cred)), func(p *Permissions) {
			p.PubDeny = append(p.PubDeny, "mesh.agent.*.inbox.guarded")
		})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := Guard(tc.kind, tc.key, tc.hosted, tc.perms); err != nil {
				t.Fatalf("Guard: %v", err)
			}
		})
	}
}

// with returns a copy of p edited by edit.
func with(p Permissions, edit func(*Permissions)) Permissions {
	q := Permissions{
		PubAllow: slices.Clone(p.PubAllow), PubDeny: slices.Clone(p.PubDeny),
		SubAllow: slices.Clone(p.SubAllow), SubDeny: slices.Clone(p.SubDeny),
	}
	edit(&q)
	return q
}

func addPub(p Permissions, s ...string) Permissions {
	return with(p, func(q *Permissions) { q.PubAllow = append(q.PubAllow, s...) })
}

func addSub(p Permissions, s ...string) Permissions {
	return with(p, func(q *Permissions) { q.SubAllow = append(q.SubAllow, s...) })
}

func drop(list []string, s string) []string {
	return slices.DeleteFunc(slices.Clone(list), func(x string) bool { return x == s })
}

func TestGuardRefuses(t *testing.T) {
	ag := agentKeys(t, MaxNodeAgents+2)
	a, b, other, cred := ag[0], ag[1], ag[2], ag[MaxNodeAgents+1]
	ag = ag[:MaxNodeAgents+1]
	roster := []string{a, b}
	node := NodePermissions(roster, PrivateOnly(cred))
	guest := GuestPermissions(a)
	job := JobPermissions(cred, a, "t1")
	room := RoomPermissions("r1")

	type tcase struct {
		name    string
		kind    Kind
		hosted  []string
		perms   Permissions
		rule    Rule
		subject string // "" when the refusal names none
	}
	tests := []tcase{
		// Roster.
		{"node with empty roster", KindNode, nil, node, RuleRoster, ""},
		{"guest with empty roster", KindGuest, []string{}, guest, RuleRoster, ""},
		{"node of seventeen", KindNode, ag, NodePermissions(ag, PrivateOnly(cred)), RuleRoster, ""},
		{"bootstrap of two", KindBootstrap, roster, node, RuleRoster, ""},
		{"job of two", KindJob, roster, job, RuleRoster, ""},
		{"duplicate agent", KindNode, []string{a, a}, node, RuleRoster, a},
		{"wildcard as agent", KindNode, []string{"*"}, NodePermissions([]string{"*"}, PrivateOnly(cred)), RuleRoster, "*"},
		{"seed-shaped agent", KindNode, []string{"SU" + a[1:]}, node, RuleRoster, "SU" + a[1:]},

		// Allow lists.
		{"empty publish allow", KindNode, roster, with(node, func(p *Permissions) { p.PubAllow = nil }), RuleAllowLists, ""},
		{"empty subscribe allow", KindNode, roster, with(node, func(p *Permissions) { p.SubAllow = nil }), RuleAllowLists, ""},
		{"malformed subject", KindNode, roster, addPub(node, "mesh..event"), RuleAllowLists, "mesh..event"},
		{"> before the end", KindNode, roster, addSub(node, "mesh.>.x"), RuleAllowLists, "mesh.>.x"},

		// Denies beyond the spec's four.
		{"guest without $JS deny", KindGuest, []string{a}, with(guest, func(p *Permissions) { p.PubDeny = drop(p.PubDeny, "$JS.>") }), RuleDenies, "$JS.>"},
		{"node without the services' reply deny", KindNode, roster, with(node, func(p *Permissions) { p.SubDeny = drop(p.SubDeny, "_MESH_SVC.>") }), RuleDenies, "_MESH_SVC.>"},
		{"node reading the relay's replies", KindNode, roster, with(node, func(p *Permissions) { p.SubDeny = drop(p.SubDeny, "_MESH_RELAY.>") }), RuleDenies, "_MESH_RELAY.>"},
		{"guest joining queue groups", KindGuest, []string{a}, with(guest, func(p *Permissions) { p.SubDeny = drop(p.SubDeny, "> >") }), RuleDenies, "> >"},
		{"narrower deny is not the deny", KindNode, roster, with(node, func(p *Permissions) {
			p.PubDeny = append(drop(p.PubDeny, "$KV.>"), "$KV.mesh_registry.>")
		}), RuleDenies, "$KV.>"},

		// Inbox subscribe.
		{"every inbox", KindNode, roster, addSub(node, "mesh.agent.*.inbox"), RuleInboxSubscribe, "mesh.agent.*.inbox"},
		{"every guarded inbox", KindNode, roster, addSub(node, "mesh.agent.*.inbox.guarded"), RuleInboxSubscribe, "mesh.agent.*.inbox.guarded"},
		{"mesh.agent.>", KindNode, roster, addSub(node, "mesh.agent.>"), RuleInboxSubscribe, "mesh.agent.>"},
		{"mesh.agent.*.>", KindNode, roster, addSub(node, "mesh.agent.*.>"), RuleInboxSubscribe, "mesh.agent.*.>"},
		{"mesh.>", KindNode, roster, addSub(node, "mesh.>"), RuleInboxSubscribe, "mesh.>"},
		{"everything", KindNode, roster, addSub(node, ">"), RuleInboxSubscribe, ">"},
		{"own inbox through a wildcard", KindNode, roster, addSub(node, "mesh.*."+a+".inbox"), RuleInboxSubscribe, "mesh.*." + a + ".inbox"},
		{"own agent's every subject", KindNode, roster, addSub(node, "mesh.agent."+a+".>"), RuleInboxSubscribe, "mesh.agent." + a + ".>"},
		{"another agent's inbox", KindNode, roster, addSub(node, protocol.InboxSubject(other)), RuleInboxSubscribe, protocol.InboxSubject(other)},
		{"another agent's guarded inbox", KindNode, roster, addSub(node, protocol.GuardedInboxSubject(other)), RuleInboxSubscribe, protocol.GuardedInboxSubject(other)},
		{"guest's guarded inbox", KindGuest, []string{a}, addSub(guest, protocol.GuardedInboxSubject(a)), RuleInboxSubscribe, protocol.GuardedInboxSubject(a)},
		{"job subscribing its agent's inbox", KindJob, []string{a}, addSub(job, protocol.InboxSubject(a)), RuleInboxSubscribe, protocol.InboxSubject(a)},

		// Stream subjects: none, in either direction.
		{"whole JetStream API", KindNode, roster, addPub(node, "$JS.API.>"), RuleStreamSubjects, "$JS.API.>"},
		{"own mailbox stream info", KindNode, roster, addPub(node, "$JS.API.STREAM.INFO."+protocol.MailboxStream), RuleStreamSubjects, "$JS.API.STREAM.INFO." + protocol.MailboxStream},
		{"a consumer's next", KindNode, roster, addPub(node, "$JS.API.CONSUMER.MSG.NEXT.MESH_MAILBOX.inbox_"+a), RuleStreamSubjects, "$JS.API.CONSUMER.MSG.NEXT.MESH_MAILBOX.inbox_" + a},
		{"every ack", KindNode, roster, addPub(node, "$JS.ACK.>"), RuleStreamSubjects, "$JS.ACK.>"},
		{"direct get", KindNode, roster, addPub(node, "$JS.API.DIRECT.GET."+protocol.MailboxStream), RuleStreamSubjects, "$JS.API.DIRECT.GET." + protocol.MailboxStream},
		{"object store", KindNode, roster, addPub(node, "$O.files.>"), RuleStreamSubjects, "$O.files.>"},
		{"key-value write", KindNode, roster, addPub(node, "$KV.mesh_registry.x"), RuleStreamSubjects, "$KV.mesh_registry.x"},
		{"everything published", KindNode, roster, addPub(node, ">"), RuleStreamSubjects, ">"},
		{"subscribing acks", KindNode, roster, addSub(node, "$JS.ACK.MESH_MAILBOX.>"), RuleStreamSubjects, "$JS.ACK.MESH_MAILBOX.>"},

		// Mailbox.
		{"guest fetching mail", KindGuest, []string{a}, addPub(guest, protocol.SubjMailboxFetch), RuleMailbox, protocol.SubjMailboxFetch},
		{"job acknowledging mail", KindJob, []string{a}, addPub(job, protocol.SubjMailboxAck), RuleMailbox, protocol.SubjMailboxAck},
		{"every mailbox verb", KindNode, roster, addPub(node, "mesh.mailbox.>"), RuleMailbox, "mesh.mailbox.>"},

		// Reply subscribe.
		{"every private prefix", KindNode, roster, addSub(node, "_MESH_INBOX.>"), RuleReplySubscribe, "_MESH_INBOX.>"},
		{"another credential's prefix", KindNode, roster, addSub(node, protocol.PrivateInboxPrefix(other)+".>"), RuleReplySubscribe, protocol.PrivateInboxPrefix(other) + ".>"},
		{"part of another's prefix", KindNode, roster, addSub(node, protocol.PrivateInboxPrefix(other)+".x.*"), RuleReplySubscribe, protocol.PrivateInboxPrefix(other) + ".x.*"},
		{"prefixes through a wildcard", KindNode, roster, addSub(node, "_MESH_INBOX.*.>"), RuleReplySubscribe, "_MESH_INBOX.*.>"},
		{"the services' replies", KindNode, roster, addSub(node, "_MESH_SVC.>"), RuleReplySubscribe, "_MESH_SVC.>"},
		{"the relay's replies", KindNode, roster, addSub(node, "_MESH_RELAY.>"), RuleReplySubscribe, "_MESH_RELAY.>"},
		{"guest on the shared inbox", KindGuest, []string{a}, addSub(guest, "_INBOX.>"), RuleReplySubscribe, "_INBOX.>"},
		{"job on the shared inbox", KindJob, []string{a}, addSub(job, "_INBOX.>"), RuleReplySubscribe, "_INBOX.>"},
		{"part of the shared inbox", KindNode, roster, addSub(node, "_INBOX.abc.>"), RuleReplySubscribe, "_INBOX.abc.>"},
		{"guest on its node's prefix", KindGuest, []string{a}, addSub(guest, protocol.PrivateInboxPrefix(b)+".>"), RuleReplySubscribe, protocol.PrivateInboxPrefix(b) + ".>"},

		// Reply publish and internal subjects.
		{"publishing the services' replies", KindNode, roster, addPub(node, "_MESH_SVC.x.y"), RuleReplyPublish, "_MESH_SVC.x.y"},
		{"publishing internal", KindNode, roster, addPub(node, protocol.SubjGuestEvict), RuleInternal, protocol.SubjGuestEvict},
		{"subscribing internal", KindNode, roster, addSub(node, "mesh.internal.>"), RuleInternal, "mesh.internal.>"},

		// Feed publish.
		{"every feed", KindNode, roster, addPub(node, "mesh.feed.>"), RuleFeedPublish, "mesh.feed.>"},
		{"one topic of every owner", KindNode, roster, addPub(node, "mesh.feed.*.x"), RuleFeedPublish, "mesh.feed.*.x"},
		{"every feed of every owner", KindNode, roster, addPub(node, "mesh.feed.*.*"), RuleFeedPublish, "mesh.feed.*.*"},
		{"another owner's feeds", KindNode, roster, addPub(node, protocol.FeedSubject(other, "*")), RuleFeedPublish, protocol.FeedSubject(other, "*")},
		{"own feeds and beyond", KindNode, roster, addPub(node, "mesh.feed."+a+".>"), RuleFeedPublish, "mesh.feed." + a + ".>"},
		{"job publishing a feed", KindJob, []string{a}, addPub(job, protocol.FeedSubject(a, "*")), RuleFeedPublish, protocol.FeedSubject(a, "*")},

		// Guarded inbox publish.
		{"publishing a guarded inbox", KindNode, roster, addPub(node, protocol.GuardedInboxSubject(a)), RuleGuardedPublish, protocol.GuardedInboxSubject(a)},
		{"publishing every guarded inbox", KindNode, roster, addPub(node, "mesh.agent.*.*.*"), RuleGuardedPublish, "mesh.agent.*.*.*"},

		// Owner publish.
		{"another agent's outbox", KindNode, roster, addPub(node, protocol.OutboxSubject(other)), RuleOwnerPublish, protocol.OutboxSubject(other)},
		{"every outbox", KindNode, roster, addPub(node, "mesh.agent.*.outbox"), RuleOwnerPublish, "mesh.agent.*.outbox"},
		{"another agent's trace", KindJob, []string{a}, addPub(job, protocol.TraceSubject(other)), RuleOwnerPublish, protocol.TraceSubject(other)},
		{"every trace", KindNode, roster, addPub(node, "mesh.trace.*"), RuleOwnerPublish, "mesh.trace.*"},

		// Sandbox.
		{"guest asking for a guard", KindGuest, []string{a}, addPub(guest, protocol.SubjAdmissionGuard), RuleSandbox, protocol.SubjAdmissionGuard},
		{"guest provisioning a room", KindGuest, []string{a}, addPub(guest, "mesh.rooms.provision"), RuleSandbox, "mesh.rooms.provision"},
		{"guest putting an artifact", KindGuest, []string{a}, addPub(guest, "mesh.artifacts.put"), RuleSandbox, "mesh.artifacts.put"},
		{"guest on the board", KindGuest, []string{a}, addPub(guest, "mesh.board.>"), RuleSandbox, "mesh.board.>"},

		// Sandbox register: a guest registers on the plain subject and its
		// own bound one only (both in GuestPermissions, which passes).
		{"guest on the whole registry", KindGuest, []string{a}, addPub(guest, "mesh.registry.>"), RuleSandboxRegister, "mesh.registry.>"},
		{"guest on every registry verb", KindGuest, []string{a}, addPub(guest, "mesh.registry.*"), RuleSandboxRegister, "mesh.registry.*"},
		{"guest on every bound register", KindGuest, []string{a}, addPub(guest, protocol.SubjRegister+".*"), RuleSandboxRegister, protocol.SubjRegister + ".*"},
		{"guest on every register subject", KindGuest, []string{a}, addPub(guest, protocol.SubjRegister+".>"), RuleSandboxRegister, protocol.SubjRegister + ".>"},
		{"guest on another key's bound register", KindGuest, []string{a}, addPub(guest, protocol.SubjRegister+"."+other), RuleSandboxRegister, protocol.SubjRegister + "." + other},
		{"guest under its own bound register", KindGuest, []string{a}, addPub(guest, protocol.SubjRegister+"."+a+".>"), RuleSandboxRegister, protocol.SubjRegister + "." + a + ".>"},
		{"guest bound to another key", KindGuest, []string{a}, with(guest, func(p *Permissions) {
			p.PubAllow = append(drop(p.PubAllow, protocol.SubjRegister+"."+a), protocol.SubjRegister+"."+b)
		}), RuleSandboxRegister, protocol.SubjRegister + "." + b},

		// Heartbeats: a job follows none (the other kinds may: their
		// builders, which grant mesh.heartbeat.*, pass the guard).
		{"job subscribing heartbeats", KindJob, []string{a}, addSub(job, "mesh.heartbeat.*"), RuleHeartbeatSubscribe, "mesh.heartbeat.*"},
		{"job subscribing one node's heartbeats", KindJob, []string{a}, addSub(job, protocol.HeartbeatSubject(other)), RuleHeartbeatSubscribe, protocol.HeartbeatSubject(other)},
		{"job subscribing heartbeats through a wildcard", KindJob, []string{a}, addSub(job, "mesh.*.*"), RuleHeartbeatSubscribe, "mesh.*.*"},

		// Job scope.
		{"job updating every task", KindJob, []string{a}, addPub(job, "mesh.task.*.update"), RuleJobScope, "mesh.task.*.update"},
		{"job reading every task", KindJob, []string{a}, addPub(job, "mesh.task.get.*"), RuleJobScope, "mesh.task.get.*"},
		{"job subscribing every task", KindJob, []string{a}, addSub(job, "mesh.task.>"), RuleJobScope, "mesh.task.>"},
		{"job through a wildcard", KindJob, []string{a}, addSub(job, "mesh.*.t1.update"), RuleJobScope, "mesh.*.t1.update"},
		{"job with a wildcard task id", KindJob, []string{a}, JobPermissions(cred, a, "*"), RuleJobScope, "mesh.task.*.>"},

		// Room: no roster, allow lists, the room denies, one room only.
		{"room hosting an agent", KindRoom, []string{a}, room, RuleRoster, a},
		{"room with empty publish allow", KindRoom, nil, with(room, func(p *Permissions) { p.PubAllow = nil }), RuleAllowLists, ""},
		{"room with empty subscribe allow", KindRoom, nil, with(room, func(p *Permissions) { p.SubAllow = nil }), RuleAllowLists, ""},
		{"room with a malformed subject", KindRoom, nil, addPub(room, "mesh.aclroom.r1..main"), RuleAllowLists, "mesh.aclroom.r1..main"},
		{"room whose id is a >", KindRoom, nil, RoomPermissions(">"), RuleAllowLists, "mesh.aclroom.>.>"},
		{"room with the agents' denies", KindRoom, nil, with(room, func(p *Permissions) { p.PubDeny = drop(p.PubDeny, "$SYS.>") }), RuleDenies, "$SYS.>"},
		{"room with a wildcard room id", KindRoom, nil, RoomPermissions("*"), RuleRoomScope, "mesh.aclroom.*.>"},
		{"room reaching every room", KindRoom, nil, addSub(room, "mesh.aclroom.>"), RuleRoomScope, "mesh.aclroom.>"},
		{"room reaching every room's channel", KindRoom, nil, addPub(room, "mesh.aclroom.*.main"), RuleRoomScope, "mesh.aclroom.*.main"},
		{"room reading every room's replies", KindRoom, nil, addSub(room, "_INBOX.aclroom.>"), RuleRoomScope, "_INBOX.aclroom.>"},
		{"room reaching a second room", KindRoom, nil, addPub(room, protocol.ACLRoomSubject("r2", "main")), RuleRoomScope, protocol.ACLRoomSubject("r2", "main")},
		{"room reading a second room's replies", KindRoom, nil, addSub(room, protocol.ACLRoomInboxPrefix("r2")+".>"), RuleRoomScope, protocol.ACLRoomInboxPrefix("r2") + ".>"},
		{"room through a wildcard namespace", KindRoom, nil, addSub(room, "mesh.*.r1.>"), RuleRoomScope, "mesh.*.r1.>"},
		{"room with no channel", KindRoom, nil, addPub(room, "mesh.aclroom.r1"), RuleRoomScope, "mesh.aclroom.r1"},
		{"room id that is no token", KindRoom, nil, addPub(room, "mesh.aclroom.r$1.main"), RuleRoomScope, "mesh.aclroom.r$1.main"},
		{"room publishing everything", KindRoom, nil, addPub(room, ">"), RuleRoomScope, ">"},
		{"room on all of mesh", KindRoom, nil, addSub(room, "mesh.>"), RuleRoomScope, "mesh.>"},
		{"room on the shared inbox", KindRoom, nil, addSub(room, "_INBOX.>"), RuleRoomScope, "_INBOX.>"},
		{"room on its own private prefix", KindRoom, nil, addSub(room, protocol.PrivateInboxPrefix(cred)+".>"), RuleRoomScope, protocol.PrivateInboxPrefix(cred) + ".>"},
		{"room asking for a credential", KindRoom, nil, addPub(room, protocol.RoomVerbSubject("credential")), RuleRoomScope, protocol.RoomVerbSubject("credential")},
		{"room on every rooms verb", KindRoom, nil, addPub(room, "mesh.rooms.*"), RuleRoomScope, "mesh.rooms.*"},
		{"room on its capability-grade events", KindRoom, nil, addSub(room, protocol.RoomEventSubject("r1", "main")), RuleRoomScope, protocol.RoomEventSubject("r1", "main")},
		{"room on the events", KindRoom, nil, addPub(room, "mesh.event.>"), RuleRoomScope, "mesh.event.>"},
		{"room on an inbox", KindRoom, nil, addSub(room, protocol.InboxSubject(a)), RuleRoomScope, protocol.InboxSubject(a)},
		{"room on the system account", KindRoom, nil, addPub(room, "$SYS.REQ.SERVER.PING"), RuleRoomScope, "$SYS.REQ.SERVER.PING"},
		{"room on the rooms bucket", KindRoom, nil, addSub(room, "$KV.mesh_rooms.>"), RuleRoomScope, "$KV.mesh_rooms.>"},
		{"room on the record stream", KindRoom, nil, addSub(room, "mesh.internal.rooms.rec.r1"), RuleRoomScope, "mesh.internal.rooms.rec.r1"},
	}
	// Each deny, missing from either side, for every kind.
	for _, k := range []struct {
		kind   Kind
		hosted []string
		perms  Permissions
	}{{KindNode, roster, node}, {KindGuest, []string{a}, guest}, {KindJob, []string{a}, job},
		{KindBootstrap, []string{a}, BootstrapPermissions(a, PrivateOnly(cred))}, {KindApp, []string{a}, AppPermissions(a, false)}} {
		for _, d := range MeshDenies() {
			tests = append(tests,
				tcase{k.kind.String() + " without publish deny " + d, k.kind, k.hosted,
					with(k.perms, func(p *Permissions) { p.PubDeny = drop(p.PubDeny, d) }), RuleDenies, d},
				tcase{k.kind.String() + " without subscribe deny " + d, k.kind, k.hosted,
					with(k.perms, func(p *Permissions) { p.SubDeny = drop(p.SubDeny, d) }), RuleDenies, d},
			)
		}
	}

	for _, d := range RoomDenies() {
		tests = append(tests,
			tcase{"room without publish deny " + d, KindRoom, nil, with(room, func(p *Permissions) { p.PubDeny = drop(p.PubDeny, d) }), RuleDenies, d},
			tcase{"room without subscribe deny " + d, KindRoom, nil, with(room, func(p *Permissions) { p.SubDeny = drop(p.SubDeny, d) }), RuleDenies, d},
		)
	}
	for _, d := range []string{"_MESH_RELAY.>", "> >"} {
		tests = append(tests, tcase{"room without subscribe deny " + d, KindRoom, nil,
			with(room, func(p *Permissions) { p.SubDeny = drop(p.SubDeny, d) }), RuleDenies, d})
	}

	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			key := cred
			if tc.kind == KindGuest || tc.kind == KindApp {
				key = a // issued to the key it hosts
			}
			err := Guard(tc.kind, key, tc.hosted, tc.perms)
			var ge *GuardError
			if !errors.As(err, &ge) {
				t.Fatalf("Guard = %v, want a refusal by rule %q", err, tc.rule)
			}
			if ge.Rule != tc.rule || ge.Subject != tc.subject || ge.Kind != tc.kind {
				t.Fatalf("refused by %q on %q (%s), want %q on %q (%s): %v",
					ge.Rule, ge.Subject, ge.Kind, tc.rule, tc.subject, tc.kind, err)
			}
			msg := err.Error()
			if !strings.Contains(msg, string(tc.rule)) || !strings.Contains(msg, tc.subject) {
				t.Fatalf("message %q does not name rule %q and subject %q", msg, tc.rule, tc.subject)
			}
		})
	}

	// The rules cover every rule the guard has.
	seen := map[Rule]bool{}
	for _, tc := range tests {
		seen[tc.rule] = true
	}
	for _, r := range []Rule{RuleRoster, RuleAllowLists, RuleDenies, RuleInboxSubscribe, RuleStreamSubjects,
		RuleMailbox, RuleReplySubscribe, RuleReplyPublish, RuleInternal,
		RuleFeedPublish, RuleOwnerPublish, RuleGuardedPublish, RuleSandbox, RuleSandboxRegister, RuleHeartbeatSubscribe, RuleJobScope,
		RuleRoomScope} {
		if !seen[r] {
			t.Errorf("no refusal case for rule %q", r)
		}
	}
}

func TestGuardRefusesUnguardedKinds(t *testing.T) {
	for _, k := range []Kind{KindUnset, KindService, Kind(99)} {
		if err := Guard(k, "", nil, ServicePermissions()); err == nil {
			t.Errorf("Guard(%s) accepted", k)
		}
	}
}

func TestValidPattern(t *testing.T) {
	for s, want := range map[string]bool{
		"a": true, "a.b": true, "*": true, ">": true, "a.*.c": true, "a.>": true, "$JS.API.>": true,
		"": false, ".": false, "a.": false, ".a": false, "a..b": false, "a.>.b": false,
		"a.b*": false, "a.*b": false, "a>.b": false, "a b": false, "a.\tb": false,
	} {
		if got := validPattern(s); got != want {
			t.Errorf("validPattern(%q) = %v, want %v", s, got, want)
		}
	}
}
