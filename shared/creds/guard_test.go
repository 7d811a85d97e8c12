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

// TestNodePermissionsAreSpecSet spells spec §4.6's set out in full, once, so
// any drift of the builder shows here.
func TestNodePermissionsAreSpecSet(t *testing.T) {
	ag := agentKeys(t, 2)
	a, b := ag[0], ag[1]
	wantPub := []string{
		"mesh.registry.>", "mesh.agent.*.inbox", "mesh.task.>", "mesh.event.>", "mesh.presence.get",
		"mesh.heartbeat.*", "mesh.feed.get", "mesh.admission.guard", "mesh.admission.unguard",
		"mesh.rooms.provision", "mesh.rooms.reclaim", "mesh.rooms.replay", "mesh.rooms.status",
		"mesh.rooms.attach", "mesh.rooms.fetch", "mesh.rooms.mine", "mesh.rooms.cursor", "mesh.rooms.usage",
		"mesh.rooms.admit", "mesh.rooms.credential", "mesh.rooms.expel", "mesh.rooms.leave", "mesh.rooms.note",
		"mesh.rooms.notes", "mesh.rooms.dossier",
		"mesh.artifacts.put", "mesh.artifacts.fetch", "mesh.artifacts.stat", "mesh.artifacts.remove",
		"mesh.artifacts.usage", "mesh.artifacts.put.begin", "mesh.artifacts.put.commit", "mesh.artifacts.link",
		"mesh.board.post", "mesh.board.list", "mesh.board.claim", "mesh.board.complete", "mesh.board.abandon",
		"mesh.board.withdraw",
		"_INBOX.>", "$JS.API.STREAM.INFO.MESH_MAILBOX",
	}
	for _, x := range []string{a, b} {
		wantPub = append(wantPub,
			"mesh.agent."+x+".outbox", "mesh.trace."+x, "mesh.feed."+x+".*",
			"$JS.API.CONSUMER.INFO.MESH_MAILBOX.inbox_"+x,
			"$JS.API.CONSUMER.MSG.NEXT.MESH_MAILBOX.inbox_"+x,
			// Both ack layouts, each pinned to its token count.
			"$JS.ACK.MESH_MAILBOX.inbox_"+x+".*.*.*.*.*",
			"$JS.ACK.*.*.MESH_MAILBOX.inbox_"+x+".*.*.*.*.>",
		)
	}
	wantSub := []string{
		"mesh.agent." + a + ".inbox", "mesh.agent." + a + ".inbox.guarded", "mesh.agent." + a + ".outbox",
		"mesh.agent." + b + ".inbox", "mesh.agent." + b + ".inbox.guarded", "mesh.agent." + b + ".outbox",
		"mesh.event.>", "mesh.task.>", "mesh.feed.*.*", "_INBOX.>",
	}
	wantDeny := []string{"$KV.>", "mesh.peer.>", "mesh.aclroom.>", "$SYS.>"}

	p := NodePermissions(ag)
	for _, c := range []struct {
		name      string
		got, want []string
	}{
		{"pub allow", p.PubAllow, wantPub},
		{"sub allow", p.SubAllow, wantSub},
		{"pub deny", p.PubDeny, wantDeny},
		{"sub deny", p.SubDeny, wantDeny},
	} {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("%s:\n got %q\nwant %q", c.name, c.got, c.want)
		}
	}
	// Bootstrap and app are the node set of one agent.
	if got, want := BootstrapPermissions(a), NodePermissions([]string{a}); !equalPerms(got, want) {
		t.Errorf("bootstrap set differs from the one-agent node set")
	}
	if got, want := AppPermissions(a), NodePermissions([]string{a}); !equalPerms(got, want) {
		t.Errorf("app set differs from the one-agent node set")
	}
}

func TestGuestAndJobPermissions(t *testing.T) {
	g := agentKeys(t, 1)[0]
	p := GuestPermissions(g)
	// No mesh.registry.>: the one register subject is the guest's own bound
	// one, so the broker pins where its registrations arrive.
	wantPub := []string{"mesh.registry.register." + g, "mesh.registry.deregister", "mesh.registry.discover",
		"mesh.registry.get.*", "mesh.registry.nodes.list",
		"mesh.agent.*.inbox", "mesh.task.>", "mesh.event.>",
		"mesh.presence.get", "mesh.heartbeat.*", "mesh.feed.get", "_INBOX.>",
		"mesh.agent." + g + ".outbox", "mesh.trace." + g, "mesh.feed." + g + ".*"}
	wantSub := []string{"mesh.agent." + g + ".inbox", "mesh.agent." + g + ".outbox",
		"mesh.event.>", "mesh.task.>", "mesh.feed.*.*", "_INBOX.>"}
	wantDeny := []string{"$KV.>", "mesh.peer.>", "mesh.aclroom.>", "$SYS.>", "$JS.API.>", "$JS.ACK.>"}
	if !slices.Equal(p.PubAllow, wantPub) || !slices.Equal(p.SubAllow, wantSub) ||
		!slices.Equal(p.PubDeny, wantDeny) || !slices.Equal(p.SubDeny, wantDeny) {
		t.Errorf("guest set:\n%q\n%q\n%q\n%q", p.PubAllow, p.SubAllow, p.PubDeny, p.SubDeny)
	}

	j := JobPermissions(g, "t1")
	wantPub = []string{"mesh.task.t1.update", "mesh.task.t1.stream", "mesh.task.get.t1",
		"mesh.agent." + g + ".outbox", "mesh.trace." + g, "_INBOX.>"}
	wantSub = []string{"mesh.task.t1.>", "_INBOX.>"}
	wantDeny = RequiredDenies()
	if !slices.Equal(j.PubAllow, wantPub) || !slices.Equal(j.SubAllow, wantSub) ||
		!slices.Equal(j.PubDeny, wantDeny) || !slices.Equal(j.SubDeny, wantDeny) {
		t.Errorf("job set:\n%q\n%q\n%q\n%q", j.PubAllow, j.SubAllow, j.PubDeny, j.SubDeny)
	}
}

func equalPerms(a, b Permissions) bool {
	return slices.Equal(a.PubAllow, b.PubAllow) && slices.Equal(a.SubAllow, b.SubAllow) &&
		slices.Equal(a.PubDeny, b.PubDeny) && slices.Equal(a.SubDeny, b.SubDeny)
}

func TestEveryBuilderPassesTheGuard(t *testing.T) {
	ag := agentKeys(t, MaxNodeAgents)
	tests := []struct {
		name   string
		kind   Kind
		hosted []string
		perms  Permissions
	}{
		{"node of one", KindNode, ag[:1], NodePermissions(ag[:1])},
		{"node of two", KindNode, ag[:2], NodePermissions(ag[:2])},
		{"node of sixteen", KindNode, ag, NodePermissions(ag)},
		{"bootstrap", KindBootstrap, ag[:1], BootstrapPermissions(ag[0])},
		{"app", KindApp, ag[:1], AppPermissions(ag[0])},
		{"guest", KindGuest, ag[:1], GuestPermissions(ag[0])},
		{"job", KindJob, ag[:1], JobPermissions(ag[0], "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b")},
		// A narrower set passes too: the guard bounds, it does not demand.
		{"node hosting more than it serves", KindNode, ag[:2], NodePermissions(ag[:1])},
		{"acks in exact layouts", KindNode, ag[:1], addPub(NodePermissions(ag[:1]),
			"$JS.ACK.MESH_MAILBOX.inbox_"+ag[0]+".*.*.*.*.*",
			"$JS.ACK.*.*.MESH_MAILBOX.inbox_"+ag[0]+".*.*.*.*.>")},
		{"deny wider than required", KindNode, ag[:1], with(NodePermissions(ag[:1]), func(p *Permissions) {
			p.PubDeny = []string{"$KV.>", "mesh.peer.>", "mesh.aclroom.>", "$SYS.>", "mesh.agent.*.inbox.guarded"}
		})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := Guard(tc.kind, tc.hosted, tc.perms); err != nil {
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
	ag := agentKeys(t, MaxNodeAgents+1)
	a, b, other := ag[0], ag[1], ag[2]
	roster := []string{a, b}
	node := NodePermissions(roster)
	guest := GuestPermissions(a)
	job := JobPermissions(a, "t1")

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
		{"node of seventeen", KindNode, ag, NodePermissions(ag), RuleRoster, ""},
		{"bootstrap of two", KindBootstrap, roster, node, RuleRoster, ""},
		{"job of two", KindJob, roster, job, RuleRoster, ""},
		{"duplicate agent", KindNode, []string{a, a}, node, RuleRoster, a},
		{"wildcard as agent", KindNode, []string{"*"}, NodePermissions([]string{"*"}), RuleRoster, "*"},
		{"seed-shaped agent", KindNode, []string{"SU" + a[1:]}, node, RuleRoster, "SU" + a[1:]},

		// Allow lists.
		{"empty publish allow", KindNode, roster, with(node, func(p *Permissions) { p.PubAllow = nil }), RuleAllowLists, ""},
		{"empty subscribe allow", KindNode, roster, with(node, func(p *Permissions) { p.SubAllow = nil }), RuleAllowLists, ""},
		{"malformed subject", KindNode, roster, addPub(node, "mesh..event"), RuleAllowLists, "mesh..event"},
		{"> before the end", KindNode, roster, addSub(node, "mesh.>.x"), RuleAllowLists, "mesh.>.x"},

		// Guest extra denies.
		{"guest without $JS.API deny", KindGuest, []string{a}, with(guest, func(p *Permissions) { p.PubDeny = drop(p.PubDeny, "$JS.API.>") }), RuleDenies, "$JS.API.>"},
		{"guest without $JS.ACK sub deny", KindGuest, []string{a}, with(guest, func(p *Permissions) { p.SubDeny = drop(p.SubDeny, "$JS.ACK.>") }), RuleDenies, "$JS.ACK.>"},
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

		// Stream subjects.
		{"whole JetStream API", KindNode, roster, addPub(node, "$JS.API.>"), RuleStreamSubjects, "$JS.API.>"},
		{"every mailbox consumer", KindNode, roster, addPub(node, "$JS.API.CONSUMER.MSG.NEXT.MESH_MAILBOX.*"), RuleStreamSubjects, "$JS.API.CONSUMER.MSG.NEXT.MESH_MAILBOX.*"},
		{"another agent's next", KindNode, roster, addPub(node, protocol.MailboxNextSubject(other)), RuleStreamSubjects, protocol.MailboxNextSubject(other)},
		{"another agent's consumer info", KindNode, roster, addPub(node, protocol.MailboxConsumerInfoSubject(other)), RuleStreamSubjects, protocol.MailboxConsumerInfoSubject(other)},
		{"another agent's acks", KindNode, roster, addPub(node, protocol.MailboxAckSubjects(other)[0]), RuleStreamSubjects, protocol.MailboxAckSubjects(other)[0]},
		{"loose v2 ack grant", KindNode, roster, addPub(node, "$JS.ACK.*.*.MESH_MAILBOX.inbox_"+a+".>"), RuleStreamSubjects, "$JS.ACK.*.*.MESH_MAILBOX.inbox_" + a + ".>"},
		{"ack grant of any stream", KindNode, roster, addPub(node, "$JS.ACK.*.inbox_"+a+".>"), RuleStreamSubjects, "$JS.ACK.*.inbox_" + a + ".>"},
		{"every ack", KindNode, roster, addPub(node, "$JS.ACK.>"), RuleStreamSubjects, "$JS.ACK.>"},
		{"stream delete", KindNode, roster, addPub(node, "$JS.API.STREAM.DELETE.MESH_MAILBOX"), RuleStreamSubjects, "$JS.API.STREAM.DELETE.MESH_MAILBOX"},
		{"every stream info", KindNode, roster, addPub(node, "$JS.API.STREAM.INFO.*"), RuleStreamSubjects, "$JS.API.STREAM.INFO.*"},
		{"object store", KindNode, roster, addPub(node, "$O.files.>"), RuleStreamSubjects, "$O.files.>"},
		{"key-value write", KindNode, roster, addPub(node, "$KV.mesh_registry.x"), RuleStreamSubjects, "$KV.mesh_registry.x"},
		{"everything published", KindNode, roster, addPub(node, ">"), RuleStreamSubjects, ">"},
		{"subscribing acks", KindNode, roster, addSub(node, protocol.MailboxAckSubjects(a)[0]), RuleStreamSubjects, protocol.MailboxAckSubjects(a)[0]},
		{"guest using its own mailbox", KindGuest, []string{a}, addPub(guest, protocol.MailboxNextSubject(a)), RuleStreamSubjects, protocol.MailboxNextSubject(a)},
		{"job reading the mailbox stream", KindJob, []string{a}, addPub(job, protocol.MailboxStreamInfoSubject()), RuleStreamSubjects, protocol.MailboxStreamInfoSubject()},

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

		// Sandbox register: a guest registers on its own bound subject only.
		{"guest on the whole registry", KindGuest, []string{a}, addPub(guest, "mesh.registry.>"), RuleSandboxRegister, "mesh.registry.>"},
		{"guest on every registry verb", KindGuest, []string{a}, addPub(guest, "mesh.registry.*"), RuleSandboxRegister, "mesh.registry.*"},
		{"guest on the untokenized register", KindGuest, []string{a}, addPub(guest, protocol.SubjRegister), RuleSandboxRegister, protocol.SubjRegister},
		{"guest on every bound register", KindGuest, []string{a}, addPub(guest, protocol.SubjRegister+".*"), RuleSandboxRegister, protocol.SubjRegister + ".*"},
		{"guest on another key's bound register", KindGuest, []string{a}, addPub(guest, protocol.SubjRegister+"."+other), RuleSandboxRegister, protocol.SubjRegister + "." + other},
		{"guest under its own bound register", KindGuest, []string{a}, addPub(guest, protocol.SubjRegister+"."+a+".>"), RuleSandboxRegister, protocol.SubjRegister + "." + a + ".>"},
		{"guest bound to another key", KindGuest, []string{a}, with(guest, func(p *Permissions) {
			p.PubAllow = append(drop(p.PubAllow, protocol.SubjRegister+"."+a), protocol.SubjRegister+"."+b)
		}), RuleSandboxRegister, protocol.SubjRegister + "." + b},

		// Job scope.
		{"job updating every task", KindJob, []string{a}, addPub(job, "mesh.task.*.update"), RuleJobScope, "mesh.task.*.update"},
		{"job reading every task", KindJob, []string{a}, addPub(job, "mesh.task.get.*"), RuleJobScope, "mesh.task.get.*"},
		{"job subscribing every task", KindJob, []string{a}, addSub(job, "mesh.task.>"), RuleJobScope, "mesh.task.>"},
		{"job through a wildcard", KindJob, []string{a}, addSub(job, "mesh.*.t1.update"), RuleJobScope, "mesh.*.t1.update"},
		{"job with a wildcard task id", KindJob, []string{a}, JobPermissions(a, "*"), RuleJobScope, "mesh.task.*.>"},
	}
	// Each of the four denies, missing from either side, for every kind.
	for _, k := range []struct {
		kind   Kind
		hosted []string
		perms  Permissions
	}{{KindNode, roster, node}, {KindGuest, []string{a}, guest}, {KindJob, []string{a}, job},
		{KindBootstrap, []string{a}, BootstrapPermissions(a)}, {KindApp, []string{a}, AppPermissions(a)}} {
		for _, d := range RequiredDenies() {
			tests = append(tests,
				tcase{k.kind.String() + " without publish deny " + d, k.kind, k.hosted,
					with(k.perms, func(p *Permissions) { p.PubDeny = drop(p.PubDeny, d) }), RuleDenies, d},
				tcase{k.kind.String() + " without subscribe deny " + d, k.kind, k.hosted,
					with(k.perms, func(p *Permissions) { p.SubDeny = drop(p.SubDeny, d) }), RuleDenies, d},
			)
		}
	}

	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := Guard(tc.kind, tc.hosted, tc.perms)
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
		RuleFeedPublish, RuleOwnerPublish, RuleGuardedPublish, RuleSandbox, RuleSandboxRegister, RuleJobScope} {
		if !seen[r] {
			t.Errorf("no refusal case for rule %q", r)
		}
	}
}

func TestGuardRefusesUnguardedKinds(t *testing.T) {
	for _, k := range []Kind{KindUnset, KindService, Kind(99)} {
		if err := Guard(k, nil, ServicePermissions()); err == nil {
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

func TestAckGrantSafe(t *testing.T) {
	a := agentKeys(t, 1)[0]
	own := []string{protocol.MailboxConsumer(a)}
	c := protocol.MailboxConsumer(a)
	for s, want := range map[string]bool{
		"$JS.ACK.MESH_MAILBOX." + c + ".>":                true,
		"$JS.ACK.MESH_MAILBOX." + c + ".*.*.*.*.*":        true,
		"$JS.ACK.*.*.MESH_MAILBOX." + c + ".*.*.*.*.>":    true,
		"$JS.ACK._.abcdefgh.MESH_MAILBOX." + c + ".>":     false, // nine tokens: v1 consumer "abcdefgh" of a stream "_"
		"$JS.ACK.*.*.MESH_MAILBOX." + c + ".>":            false, // also nine tokens: any v1 consumer
		"$JS.ACK.*.*.MESH_MAILBOX." + c + ".*.*.>":        false, // still nine tokens
		"$JS.ACK.MESH_MAILBOX.inbox_other.>":              false,
		"$JS.ACK.OTHER." + c + ".>":                       false,
		"$JS.ACK.MESH_MAILBOX.*.>":                        false,
		"$JS.ACK.>":                                       false,
		"$JS.*.MESH_MAILBOX." + c + ".>":                  false,
		"$JS.API.CONSUMER.MSG.NEXT.MESH_MAILBOX." + c:     false,
		"$JS.ACK.MESH_MAILBOX":                            false,
		"$JS.ACK._.abcdefgh.MESH_MAILBOX.inbox_other.>":   false,
		"$JS.ACK.MESH_MAILBOX." + c + ".MESH_MAILBOX.x.>": true, // v1 own; a v2 reading needs hash == consumer name
		"$JS.ACK.MESH_MAILBOX.x.MESH_MAILBOX." + c + ".>": false,
	} {
		if got := ackGrantSafe(s, own); got != want {
			t.Errorf("ackGrantSafe(%q) = %v, want %v", s, got, want)
		}
	}
}
