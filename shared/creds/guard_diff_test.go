package creds

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"agentmesh.dev/mesh/shared/protocol"
)

// The guard compares subjects token by token and recognises a hosted
// agent's own subjects by their form; the tests below prove it refuses
// exactly what the string-by-string guard it replaced (refGuard, kept in
// guard_ref_test.go) refuses, with the same rule, subject and reason: on
// every permission set this package builds, for every kind and key, and on
// those sets with subjects and roster entries added, dropped and replaced
// at random.

// sameVerdict fails t when Guard and refGuard disagree about one input.
func sameVerdict(t *testing.T, what string, kind Kind, key string, hosted []string, p Permissions) {
	t.Helper()
	got, want := Guard(kind, key, hosted, p), refGuard(kind, key, hosted, p)
	if (got == nil) != (want == nil) {
		t.Fatalf("%s: Guard(%s, %s, %d hosted) = %v, the reference guard %v\nperms %+v", what, kind, key, len(hosted), got, want, p)
	}
	if got == nil {
		return
	}
	var g, w *GuardError
	if !errors.As(got, &g) || !errors.As(want, &w) || *g != *w {
		t.Fatalf("%s: Guard(%s, %s, %d hosted) = %#v, the reference guard %#v", what, kind, key, len(hosted), got, want)
	}
}

// guardCase is one permission set with the key and roster it was built for.
type guardCase struct {
	name   string
	kind   Kind
	key    string
	hosted []string
	perms  Permissions
}

// projectSets are the sets every builder of this package makes.
func projectSets(ag []string, cred string) []guardCase {
	var out []guardCase
	for n := 1; n <= len(ag); n++ {
		out = append(out,
			guardCase{"node", KindNode, cred, ag[:n], NodePermissions(ag[:n], PrivateOnly(cred))},
			guardCase{"node shared", KindNode, cred, ag[:n], NodePermissions(ag[:n], Replies{Key: cred, Shared: true})})
	}
	return append(out,
		guardCase{"bootstrap", KindBootstrap, cred, ag[:1], BootstrapPermissions(ag[0], PrivateOnly(cred))},
		guardCase{"bootstrap shared", KindBootstrap, cred, ag[:1], BootstrapPermissions(ag[0], Replies{Key: cred, Shared: true})},
		guardCase{"app", KindApp, ag[0], ag[:1], AppPermissions(ag[0], true)},
		guardCase{"app private", KindApp, ag[0], ag[:1], AppPermissions(ag[0], false)},
		guardCase{"guest", KindGuest, ag[0], ag[:1], GuestPermissions(ag[0])},
		guardCase{"pinned guest", KindGuest, ag[0], ag[:1], PinnedGuestPermissions(ag[0])},
		guardCase{"job", KindJob, cred, ag[:1], JobPermissions(cred, ag[0], "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b")},
		guardCase{"service", KindService, cred, nil, ServicePermissions()},
	)
}

var allKinds = []Kind{KindUnset, KindService, KindNode, KindBootstrap, KindApp, KindGuest, KindJob, Kind(99)}

func TestGuardAgreesWithReferenceOnProjectSets(t *testing.T) {
	ag := agentKeys(t, MaxNodeAgents+2)
	cred, other := ag[MaxNodeAgents], ag[MaxNodeAgents+1]
	ag = ag[:MaxNodeAgents]
	for _, c := range projectSets(ag, cred) {
		for _, kind := range allKinds {
			for _, key := range []string{c.key, cred, other, ag[0], "", "not-a-key", "U.x"} {
				sameVerdict(t, c.name, kind, key, c.hosted, c.perms)
			}
			// Rosters: the one the set was built for, others, and broken ones.
			for _, hosted := range [][]string{nil, ag[:1], ag[1:3], ag, append(slices.Clone(ag), other),
				{ag[0], ag[0]}, {"mesh.x", ag[0]}, {ag[0] + ".inbox"}, {"*"}, {">"}, {""}} {
				sameVerdict(t, c.name+" other roster", kind, c.key, hosted, c.perms)
			}
		}
	}
}

// guardTokens are what random subjects are made of: the tokens of every
// space the guard watches, the roster's and the key's own, wildcards, and
// tokens the broker would not read as one.
func guardTokens(ag []string, cred string) []string {
	toks := []string{"*", ">", "mesh", "agent", "inbox", "guarded", "outbox", "trace", "feed", "get",
		"task", "event", "heartbeat", "registry", "register", "mailbox", "fetch", "ack", "internal",
		"admission", "guard", "unguard", "rooms", "artifacts", "board", "peer", "aclroom", "presence",
		"$JS", "$KV", "$O", "$SYS", "API", "_INBOX", "_MESH_INBOX", "_MESH_SVC", "_MESH_RELAY",
		"x", "", " ", "a b", "x*", ">x", "\t", "> >", "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", cred}
	toks = append(toks, ag...)
	for _, s := range []string{protocol.PrivateInboxPrefix(cred), protocol.ServiceInboxSpace, protocol.RelayReplySpace,
		protocol.SubjAdmissionGuard, protocol.SubjNodesList, protocol.SubjFeedGet, protocol.SubjPresenceGet} {
		toks = append(toks, strings.Split(s, ".")...)
	}
	return toks
}

// randomSubject is a subject of one to seven random tokens, most often
// a mutation of an existing one so that it lands near the rules' edges.
func randomSubject(r *rand.Rand, toks, near []string) string {
	if len(near) > 0 && r.IntN(3) > 0 {
		t := strings.Split(near[r.IntN(len(near))], ".")
		switch r.IntN(4) {
		case 0:
			t[r.IntN(len(t))] = toks[r.IntN(len(toks))]
		case 1:
			t = t[:1+r.IntN(len(t))]
		case 2:
			t = append(t, toks[r.IntN(len(toks))])
		case 3:
			t[len(t)-1] = []string{"*", ">"}[r.IntN(2)]
		}
		return strings.Join(t, ".")
	}
	n := 1 + r.IntN(7)
	t := make([]string, n)
	for i := range t {
		t[i] = toks[r.IntN(len(toks))]
	}
	return strings.Join(t, ".")
}

// mutate edits one list of p at random: adds, replaces or drops a
// subject, most often one near a subject of near.
func mutate(r *rand.Rand, p Permissions, toks, near []string) Permissions {
	q := with(p, func(*Permissions) {})
	lists := []*[]string{&q.PubAllow, &q.SubAllow, &q.PubDeny, &q.SubDeny}
	l := lists[r.IntN(len(lists))]
	switch op := r.IntN(3); {
	case op == 0 || len(*l) == 0:
		*l = slices.Insert(*l, r.IntN(len(*l)+1), randomSubject(r, toks, near))
	case op == 1:
		(*l)[r.IntN(len(*l))] = randomSubject(r, toks, near)
	default:
		i := r.IntN(len(*l))
		*l = slices.Delete(*l, i, i+1)
	}
	return q
}

func TestGuardAgreesWithReferenceOnRandomEdits(t *testing.T) {
	ag := agentKeys(t, MaxNodeAgents+1)
	cred := ag[MaxNodeAgents]
	ag = ag[:MaxNodeAgents]
	toks := guardTokens(ag, cred)
	r := rand.New(rand.NewPCG(12, 2026))
	sets := projectSets(ag, cred)
	byKind := map[Kind][]guardCase{}
	var kinds []Kind
	for _, c := range sets {
		if byKind[c.kind] == nil {
			kinds = append(kinds, c.kind)
		}
		byKind[c.kind] = append(byKind[c.kind], c)
	}
	watched := slices.Concat(inboxSpaces, streamSpaces, replySpaces, sandboxSpaces, registerSpaces, []string{mailboxSpace,
		feedSpace, outboxSpace, traceSpace, guardedInboxSpace, heartbeatSpace, subjTaskAll, denyInternal})
	var near []string // every subject of every set
	for _, c := range sets {
		near = append(append(append(near, c.perms.PubAllow...), c.perms.SubAllow...), c.perms.PubDeny...)
	}
	slices.Sort(near)
	near = slices.Compact(near)
	rounds := 40000
	if testing.Short() {
		rounds = 4000
	}
	refused := map[Rule]int{}
	for i := range rounds {
		// A kind first, then one of its sets: there are thirty-odd node
		// sets and one job set, and each kind's own rules must be reached.
		ofKind := byKind[kinds[r.IntN(len(kinds))]]
		c := ofKind[r.IntN(len(ofKind))]
		p := c.perms
		// Half the edits land near the set's own subjects and the spaces
		// the guard watches, where the rules' edges are.
		close := near
		if r.IntN(2) == 0 {
			close = slices.Concat(c.perms.PubAllow, c.perms.SubAllow, watched)
		}
		for range 1 + r.IntN(3) {
			p = mutate(r, p, toks, close)
		}
		kind := c.kind
		if r.IntN(4) == 0 {
			kind = allKinds[r.IntN(len(allKinds))]
		}
		hosted := c.hosted
		if r.IntN(8) == 0 {
			hosted = ag[:1+r.IntN(len(ag))]
		}
		sameVerdict(t, fmt.Sprintf("round %d", i), kind, c.key, hosted, p)
		var ge *GuardError
		if errors.As(Guard(kind, c.key, hosted, p), &ge) {
			refused[ge.Rule]++
		}
	}
	t.Logf("refusals by rule: %v", refused)
	// The random edits must reach the rules, or the agreement says little.
	for _, rule := range []Rule{RuleAllowLists, RuleDenies, RuleInboxSubscribe, RuleStreamSubjects, RuleMailbox,
		RuleReplySubscribe, RuleReplyPublish, RuleInternal, RuleFeedPublish, RuleOwnerPublish, RuleGuardedPublish,
		RuleSandbox, RuleSandboxRegister, RuleHeartbeatSubscribe, RuleJobScope} {
		if refused[rule] == 0 {
			t.Errorf("no random edit was refused by rule %q", rule)
		}
	}
}

func TestSubjectPrimitivesAgreeWithReference(t *testing.T) {
	ag := agentKeys(t, 2)
	toks := guardTokens(ag, ag[1])
	r := rand.New(rand.NewPCG(3, 4))
	for range 20000 {
		a, b := randomSubject(r, toks, nil), randomSubject(r, toks, nil)
		if got, want := patternsOverlap(a, b), refPatternsOverlap(a, b); got != want {
			t.Fatalf("patternsOverlap(%q, %q) = %v, reference %v", a, b, got, want)
		}
		if got, want := subjectCovers(a, b), refSubjectCovers(a, b); got != want {
			t.Fatalf("subjectCovers(%q, %q) = %v, reference %v", a, b, got, want)
		}
		if got, want := validPattern(a), refValidPattern(a); got != want {
			t.Fatalf("validPattern(%q) = %v, reference %v", a, got, want)
		}
		if got, want := hasWildcard(split(a)), refHasWildcard(a); got != want {
			t.Fatalf("hasWildcard(%q) = %v, reference %v", a, got, want)
		}
	}
}

// FuzzGuardAgreesWithReference adds one publish and one subscribe subject
// to a node's set and a guest's, and compares the verdicts.
func FuzzGuardAgreesWithReference(f *testing.F) {
	ag := agentKeys(f, 3)
	cred := ag[2]
	ag = ag[:2]
	f.Add("mesh.agent.*.inbox", "mesh.feed."+ag[0]+".x")
	f.Add(protocol.InboxSubject(ag[0]), protocol.OutboxSubject(ag[1]))
	f.Add("_INBOX.>", "mesh.mailbox.>")
	f.Add("mesh.task.get.*", "mesh.registry.register."+ag[1])
	f.Add("a..b", "> >")
	sets := []guardCase{
		{"node", KindNode, cred, ag, NodePermissions(ag, PrivateOnly(cred))},
		{"guest", KindGuest, ag[0], ag[:1], GuestPermissions(ag[0])},
		{"job", KindJob, cred, ag[:1], JobPermissions(cred, ag[0], "t1")},
	}
	f.Fuzz(func(t *testing.T, pub, sub string) {
		for _, c := range sets {
			p := addSub(addPub(c.perms, pub), sub)
			sameVerdict(t, c.name, c.kind, c.key, c.hosted, p)
			q := with(c.perms, func(q *Permissions) { q.PubDeny = append(q.PubDeny[:1:1], pub); q.SubDeny = []string{sub} })
			sameVerdict(t, c.name+" denies", c.kind, c.key, c.hosted, q)
		}
	})
}

func TestValidSplitIsValidPatternAndSplit(t *testing.T) {
	ag := agentKeys(t, 2)
	toks := guardTokens(ag, ag[1])
	r := rand.New(rand.NewPCG(5, 6))
	for range 20000 {
		s := randomSubject(r, toks, nil)
		var buf [4]string
		got, ok := validSplit(s, buf[:0])
		if ok != refValidPattern(s) {
			t.Fatalf("validSplit(%q) ok = %v, reference validPattern %v", s, ok, !ok)
		}
		if ok && !slices.Equal(got, strings.Split(s, ".")) {
			t.Fatalf("validSplit(%q) = %q", s, got)
		}
	}
}
