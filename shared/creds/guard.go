package creds

import (
	"fmt"
	"slices"
	"strings"

	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// Rule names one check of the guard; it appears in every refusal.
type Rule string

// The guard's rules (spec §4.6 rule 4, and what follows from it for the
// other kinds).
const (
	// RuleRoster: the hosted set is present, within the kind's size, free of
	// duplicates, and made of user public keys (which also keeps dots and
	// wildcards out of every per-agent subject).
	RuleRoster Rule = "roster"
	// RuleAllowLists: both allow lists are non-empty; an empty set would
	// inherit the account's defaults.
	RuleAllowLists Rule = "allow-lists"
	// RuleDenies: $KV.>, mesh.peer.>, mesh.aclroom.> and $SYS.> (spec §4.6),
	// and $JS.>, $O.>, mesh.internal.>, the services' reply prefix
	// _MESH_SVC.> and the acl rooms' reply space _INBOX.aclroom.> are
	// denied for both publish and subscribe, and the relay reply space
	// _MESH_RELAY.> for subscribe (MeshDenies). A room credential denies
	// RoomDenies: the same less the two acl namespaces.
	RuleDenies Rule = "deny-entries"
	// RuleInboxSubscribe: a subscription that reaches any agent inbox must be
	// exactly a hosted agent's inbox or guarded inbox, never a wildcard.
	RuleInboxSubscribe Rule = "inbox-subscribe"
	// RuleStreamSubjects: no JetStream subject ($JS.>, and the $KV.> and
	// $O.> stream namespaces) is granted in either direction. Spec §4.6
	// allows a node its own mailbox stream's subjects; this mesh grants none,
	// because a client reads its mail through the mailbox worker
	// (mesh.mailbox.fetch and .ack) and JetStream answers travel on reply
	// subjects others could read.
	RuleStreamSubjects Rule = "stream-subjects"
	// RuleMailbox: mesh.mailbox.fetch and mesh.mailbox.ack, and nothing else
	// under mesh.mailbox, only for kinds that have a mailbox.
	RuleMailbox Rule = "mailbox"
	// RuleReplySubscribe: of the reply spaces (_INBOX.>, _MESH_INBOX.>,
	// _MESH_SVC.>, _MESH_RELAY.>) a credential subscribes exactly its own
	// private prefix _MESH_INBOX.<credential key>.>, and the shared
	// _INBOX.> only where its kind may serve an upstream SDK (node,
	// bootstrap, app): never a guest or a job.
	RuleReplySubscribe Rule = "reply-subscribe"
	// RuleReplyPublish: no client publishes into the services' reply prefix.
	RuleReplyPublish Rule = "reply-publish"
	// RuleInternal: no client reaches mesh.internal.>.
	RuleInternal Rule = "internal"
	// RuleFeedPublish: a feed publish is mesh.feed.<hosted agent>.<topic or *>.
	RuleFeedPublish Rule = "feed-publish"
	// RuleOwnerPublish: outbox and trace publishes name a hosted agent.
	RuleOwnerPublish Rule = "owner-publish"
	// RuleGuardedPublish: nobody but the admission service publishes to a
	// guarded inbox.
	RuleGuardedPublish Rule = "guarded-inbox-publish"
	// RuleSandbox: a guest reaches no admission, rooms, artifacts or board
	// subject.
	RuleSandbox Rule = "sandbox"
	// RuleSandboxRegister: a guest publishes on no register subject but the
	// plain mesh.registry.register and its own node-bound one,
	// mesh.registry.register.<guest key>. On the plain subject the registry
	// files a guest as sandbox because the control plane recorded its key
	// (registry.GuestsBucket); on a bound subject because the subject is
	// bound (the registry also requires its token to be the attesting
	// node). Another key's bound subject is that node's, which the broker
	// pins to it (upstream §2.1 clause b); a guest is only its own node.
	RuleSandboxRegister Rule = "sandbox-register"
	// RuleHeartbeatSubscribe: node heartbeats (mesh.heartbeat.<node>, read-
	// only liveness, what an upstream SDK's trackPresence follows) are
	// subscribed only by kinds that host agents: node, bootstrap, app and
	// guest. A job credential subscribes none: it sees its one task only.
	RuleHeartbeatSubscribe Rule = "heartbeat-subscribe"
	// RuleJobScope: a job credential names one literal task wherever it
	// touches mesh.task.
	RuleJobScope Rule = "job-scope"
	// RuleRoomScope: every subject a room credential publishes or
	// subscribes lies under one room's traffic, mesh.aclroom.<room>.>, or
	// its reply prefix, _INBOX.aclroom.<room>.>, with the room a literal
	// room id, the same room throughout: nothing wider, no wildcard room, no
	// second room, and nothing outside the acl namespaces (no service verb,
	// event, inbox, $SYS or $KV).
	RuleRoomScope Rule = "room-scope"
)

// GuardError is a refusal by the guard.
type GuardError struct {
	Kind Kind
	Rule Rule
	// Subject is the offending subject or roster entry ("" when the refusal
	// is about something missing).
	Subject string
	Reason  string
}

func (e *GuardError) Error() string {
	if e.Subject == "" {
		return fmt.Sprintf("guard: %s credential refused by rule %q: %s", e.Kind, e.Rule, e.Reason)
	}
	return fmt.Sprintf("guard: %s credential refused by rule %q: %q %s", e.Kind, e.Rule, e.Subject, e.Reason)
}

// profile is what each guarded kind may do with its hosted agents.
type profile struct {
	minHosted, maxHosted int
	inboxes              bool // may subscribe the hosted agents' inboxes
	mailbox              bool // may fetch and acknowledge the hosted agents' mail
	feeds                bool // may publish the hosted agents' feeds
	sharedInbox          bool // may hold the shared _INBOX.> grant
	heartbeats           bool // may subscribe node heartbeats
	sandbox              bool
	job                  bool
}

// What "hosted" means per kind:
//
//   - node: the roster, 1 to 16 agents whose inboxes, mailboxes, feeds,
//     outboxes and traces the node serves;
//   - bootstrap: the one agent named in the am_ exchange, served like a node;
//   - app: the app's own key, served like a node;
//   - guest: the guest's own key: its inbox, feeds, outbox and trace, but no
//     mailbox;
//   - job: the one agent performing the task: its outbox and trace only; a
//     job subscribes no inbox, has no mailbox and publishes no feed.
//   - room: none; a room credential reaches one acl room (guardRoom).
func profileOf(k Kind) (profile, bool) {
	switch k {
	case KindNode:
		return profile{minHosted: 1, maxHosted: MaxNodeAgents, inboxes: true, mailbox: true, feeds: true, sharedInbox: true, heartbeats: true}, true
	case KindBootstrap, KindApp:
		return profile{minHosted: 1, maxHosted: 1, inboxes: true, mailbox: true, feeds: true, sharedInbox: true, heartbeats: true}, true
	case KindGuest:
		return profile{minHosted: 1, maxHosted: 1, inboxes: true, feeds: true, heartbeats: true, sandbox: true}, true
	case KindJob:
		return profile{minHosted: 1, maxHosted: 1, job: true}, true
	}
	return profile{}, false
}

// The subject spaces the guard watches, as wildcard patterns.
var (
	inboxSpaces       = []string{protocol.InboxSubject("*"), protocol.GuardedInboxSubject("*")}
	streamSpaces      = []string{denyJS, denyKV, denyObjects}
	mailboxSpace      = "mesh.mailbox.>"
	replySpaces       = []string{protocol.SharedInboxSpace, protocol.PrivateInboxSpace, protocol.ServiceInboxSpace, protocol.RelayReplySpace}
	feedSpace         = protocol.FeedSubject("*", "*")
	outboxSpace       = protocol.OutboxSubject("*")
	traceSpace        = protocol.TraceSubject(">")
	guardedInboxSpace = protocol.GuardedInboxSubject("*")
	sandboxSpaces     = []string{protocol.SubjAdmissionGuard, protocol.SubjAdmissionUnguard,
		roomsPrefix + ">", artifactsPrefix + ">", boardPrefix + ">"}
	// registerSpaces are the untokenized register subject and everything
	// under it (the bound form is one token more).
	registerSpaces = []string{protocol.SubjRegister, protocol.SubjRegister + ".>"}
	heartbeatSpace = protocol.HeartbeatSubject("*")
)

// The same spaces split at their dots, for Guard's token comparisons.
var (
	inboxSpacesT       = splitAll(inboxSpaces)
	streamSpacesT      = splitAll(streamSpaces)
	mailboxSpaceT      = split(mailboxSpace)
	replySpacesT       = splitAll(replySpaces)
	feedSpaceT         = split(feedSpace)
	outboxSpaceT       = split(outboxSpace)
	traceSpaceT        = split(traceSpace)
	guardedInboxSpaceT = split(guardedInboxSpace)
	sandboxSpacesT     = splitAll(sandboxSpaces)
	registerSpacesT    = splitAll(registerSpaces)
	heartbeatSpaceT    = split(heartbeatSpace)
	serviceInboxSpaceT = split(protocol.ServiceInboxSpace)
	denyInternalT      = split(denyInternal)
	taskAllT           = split(subjTaskAll)

	// The deny entries every set must carry, in the order they are
	// reported missing.
	pubDeniesRequired  = MeshDenies()
	pubDeniesRequiredT = splitAll(pubDeniesRequired)
	subDeniesRequired  = subDenies()
	subDeniesRequiredT = splitAll(subDeniesRequired)

	// The per-agent subjects of a credential, as forms over the agent's key.
	inboxForm        = formOf(protocol.InboxSubject)
	guardedInboxForm = formOf(protocol.GuardedInboxSubject)
	outboxForm       = formOf(protocol.OutboxSubject)
	traceForm        = formOf(protocol.TraceSubject)
	registerForm     = formOf(registerBound)
)

// Guard checks a permission set against the rules of spec §4.6 rule 4 for a
// credential of kind, issued to the credential key key and hosting the
// agents in hosted, and returns a *GuardError
// naming the first broken rule and the offending subject. Only guarded kinds
// (Kind.Guarded) have a guard; the others are refused. Subjects are compared
// as NATS subjects, token by token, with * and > as the broker reads them.
//
// Each subject is split at its dots once and compared with the watched
// spaces, split once at start-up, token by token; a hosted agent's own
// subjects are recognised by their form (ownForm) rather than built for
// every agent and searched. guard_diff_test.go proves it refuses exactly
// what the string-by-string guard it replaced refused, with the same
// rule, subject and reason.
func Guard(kind Kind, key string, hosted []string, p Permissions) error {
	if kind == KindRoom {
		return guardRoom(key, hosted, p)
	}
	prof, ok := profileOf(kind)
	if !ok {
		return &GuardError{Kind: kind, Rule: RuleRoster, Reason: "is not a guarded kind; only credentials that never leave the process go unguarded"}
	}
	refuse := func(r Rule, subject, format string, args ...any) error {
		return &GuardError{Kind: kind, Rule: r, Subject: subject, Reason: fmt.Sprintf(format, args...)}
	}

	// Roster.
	switch {
	case len(hosted) < prof.minHosted:
		return refuse(RuleRoster, "", "empty roster: the credential hosts no agent")
	case len(hosted) > prof.maxHosted:
		return refuse(RuleRoster, "", "roster of %d agents, at most %d allowed", len(hosted), prof.maxHosted)
	}
	for i, h := range hosted {
		if !keys.IsUserPublicKey(h) {
			return refuse(RuleRoster, h, "is not an agent public key")
		}
		if slices.Contains(hosted[:i], h) {
			return refuse(RuleRoster, h, "is on the roster twice")
		}
	}
	// From here on every hosted key is a user public key: one subject
	// token, without dots or wildcards, which is what ownForm needs.

	// Allow lists.
	if len(p.PubAllow) == 0 {
		return refuse(RuleAllowLists, "", "empty publish allow list (it would inherit the account's defaults)")
	}
	if len(p.SubAllow) == 0 {
		return refuse(RuleAllowLists, "", "empty subscribe allow list (it would inherit the account's defaults)")
	}

	// Denies.
	for i, d := range pubDeniesRequiredT {
		if !anyCovers(p.PubDeny, d) {
			return refuse(RuleDenies, pubDeniesRequired[i], "is missing from the publish deny list")
		}
	}
	for i, d := range subDeniesRequiredT {
		if !anyCovers(p.SubDeny, d) {
			return refuse(RuleDenies, subDeniesRequired[i], "is missing from the subscribe deny list")
		}
	}
	if !keys.IsUserPublicKey(key) {
		return refuse(RuleReplySubscribe, key, "is not a credential public key, so it names no reply prefix")
	}
	ownReplies := protocol.PrivateInboxPrefix(key) + ".>"
	ownReply := func(s string) bool {
		return s == ownReplies || prof.sharedInbox && s == protocol.SharedInboxSpace
	}
	ownMailbox := func(s string) bool {
		return prof.mailbox && (s == protocol.SubjMailboxFetch || s == protocol.SubjMailboxAck)
	}

	// The hosted agents' own subjects, by what this kind may do with them
	// (hosted is never empty here).
	ownInbox := func(t subject) bool {
		return prof.inboxes && (inboxForm.matches(t, hosted) || !prof.sandbox && guardedInboxForm.matches(t, hosted))
	}
	var ownFeeds []string
	if prof.feeds {
		ownFeeds = hosted
	}
	ownRegister := func(s string, t subject) bool {
		return s == protocol.SubjRegister || registerForm.matches(t, hosted)
	}

	var buf [16]string

	// Subscriptions.
	for _, s := range p.SubAllow {
		t, ok := validSplit(s, buf[:0])
		if !ok {
			return refuse(RuleAllowLists, s, "is not a valid subscribe subject")
		}
		if anyOverlaps(inboxSpacesT, t) && !ownInbox(t) {
			switch {
			case hasWildcard(t):
				return refuse(RuleInboxSubscribe, s, "subscribes to agent inboxes through a wildcard")
			case !prof.inboxes:
				return refuse(RuleInboxSubscribe, s, "subscribes to an inbox; a %s credential subscribes to none", kind)
			default:
				return refuse(RuleInboxSubscribe, s, "subscribes to an inbox outside the hosted agents' own")
			}
		}
		if anyOverlaps(streamSpacesT, t) {
			return refuse(RuleStreamSubjects, s, "subscribes to a JetStream subject")
		}
		if anyOverlaps(replySpacesT, t) && !ownReply(s) {
			if s == protocol.SharedInboxSpace {
				return refuse(RuleReplySubscribe, s, "is the shared reply space, which a %s credential never gets", kind)
			}
			return refuse(RuleReplySubscribe, s, "reaches replies outside the credential's own prefix %s.>", protocol.PrivateInboxPrefix(key))
		}
		if !prof.heartbeats && overlaps(heartbeatSpaceT, t) {
			return refuse(RuleHeartbeatSubscribe, s, "subscribes to node heartbeats; a %s credential follows none", kind)
		}
		if prof.job {
			if err := jobScope(t); err != "" {
				return refuse(RuleJobScope, s, "%s", err)
			}
		}
		if overlaps(denyInternalT, t) {
			return refuse(RuleInternal, s, "reaches the internal service subjects")
		}
	}

	// Publishes.
	for _, s := range p.PubAllow {
		t, ok := validSplit(s, buf[:0])
		if !ok {
			return refuse(RuleAllowLists, s, "is not a valid publish subject")
		}
		if anyOverlaps(streamSpacesT, t) {
			return refuse(RuleStreamSubjects, s, "reaches JetStream; clients read their mail through the mailbox worker")
		}
		if overlaps(mailboxSpaceT, t) && !ownMailbox(s) {
			if !prof.mailbox {
				return refuse(RuleMailbox, s, "reaches the mailbox; a %s credential has none", kind)
			}
			return refuse(RuleMailbox, s, "reaches mailbox subjects other than fetch and ack")
		}
		if overlaps(serviceInboxSpaceT, t) {
			return refuse(RuleReplyPublish, s, "publishes into the services' reply prefix")
		}
		if overlaps(feedSpaceT, t) && !ownFeed(t, ownFeeds) {
			if len(ownFeeds) == 0 {
				return refuse(RuleFeedPublish, s, "publishes on a feed; a %s credential publishes none", kind)
			}
			return refuse(RuleFeedPublish, s, "publishes on a feed outside mesh.feed.<hosted agent>.*")
		}
		if overlaps(guardedInboxSpaceT, t) {
			return refuse(RuleGuardedPublish, s, "publishes to guarded inboxes, which only the admission service may do")
		}
		if overlaps(outboxSpaceT, t) && !outboxForm.matches(t, hosted) {
			return refuse(RuleOwnerPublish, s, "publishes on an outbox that is not a hosted agent's")
		}
		if overlaps(traceSpaceT, t) && !traceForm.matches(t, hosted) {
			return refuse(RuleOwnerPublish, s, "publishes on a trace subject that is not a hosted agent's")
		}
		if prof.sandbox && anyOverlaps(sandboxSpacesT, t) {
			return refuse(RuleSandbox, s, "is outside the sandbox (no admission, rooms, artifacts or board)")
		}
		if prof.sandbox && anyOverlaps(registerSpacesT, t) && !ownRegister(s, t) {
			own := []string{protocol.SubjRegister}
			for _, h := range hosted {
				own = append(own, registerBound(h))
			}
			return refuse(RuleSandboxRegister, s, "reaches a register subject other than the plain one and the guest's own bound one (%s)", strings.Join(own, ", "))
		}
		if prof.job {
			if err := jobScope(t); err != "" {
				return refuse(RuleJobScope, s, "%s", err)
			}
		}
		if overlaps(denyInternalT, t) {
			return refuse(RuleInternal, s, "reaches the internal service subjects")
		}
	}
	return nil
}

// The deny entries a room credential must carry (RoomDenies), split.
var (
	roomPubDeniesRequired  = RoomDenies()
	roomPubDeniesRequiredT = splitAll(roomPubDeniesRequired)
	roomSubDeniesRequired  = roomSubDenies()
	roomSubDeniesRequiredT = splitAll(roomSubDeniesRequired)
)

// guardRoom is the guard of a room credential (KindRoom). It shares the
// allow-list and deny rules with the agent kinds, and nothing else: a room
// credential hosts no agent, denies RoomDenies (not the acl namespaces it
// exists to reach), and reaches one room only (RuleRoomScope). It is kept
// apart from Guard's agent rules, which the differential test holds to
// the reference guard, rather than threaded through them.
func guardRoom(key string, hosted []string, p Permissions) error {
	refuse := func(r Rule, subject, format string, args ...any) error {
		return &GuardError{Kind: KindRoom, Rule: r, Subject: subject, Reason: fmt.Sprintf(format, args...)}
	}
	if len(hosted) > 0 {
		return refuse(RuleRoster, hosted[0], "is hosted, but a room credential hosts no agent: it reaches one room's traffic only")
	}
	if !keys.IsUserPublicKey(key) {
		return refuse(RuleRoster, key, "is not a credential public key")
	}
	if len(p.PubAllow) == 0 {
		return refuse(RuleAllowLists, "", "empty publish allow list (it would inherit the account's defaults)")
	}
	if len(p.SubAllow) == 0 {
		return refuse(RuleAllowLists, "", "empty subscribe allow list (it would inherit the account's defaults)")
	}
	for i, d := range roomPubDeniesRequiredT {
		if !anyCovers(p.PubDeny, d) {
			return refuse(RuleDenies, roomPubDeniesRequired[i], "is missing from the publish deny list")
		}
	}
	for i, d := range roomSubDeniesRequiredT {
		if !anyCovers(p.SubDeny, d) {
			return refuse(RuleDenies, roomSubDeniesRequired[i], "is missing from the subscribe deny list")
		}
	}
	room := ""
	var buf [16]string
	for _, list := range []struct {
		dir      string
		subjects []string
	}{{"subscribe", p.SubAllow}, {"publish", p.PubAllow}} {
		for _, s := range list.subjects {
			t, ok := validSplit(s, buf[:0])
			if !ok {
				return refuse(RuleAllowLists, s, "is not a valid %s subject", list.dir)
			}
			r, why := roomOf(t)
			switch {
			case why != "":
				return refuse(RuleRoomScope, s, "%s", why)
			case room == "":
				room = r
			case r != room:
				return refuse(RuleRoomScope, s, "reaches room %s; the credential is for room %s only", r, room)
			}
		}
	}
	return nil
}

// roomOf returns the room whose traffic or replies t lies under, or why t
// is not under exactly one room's.
func roomOf(t subject) (room, why string) {
	const outside = "is outside one room's traffic (mesh.aclroom.<room>.>) and replies (_INBOX.aclroom.<room>.>)"
	if len(t) < 3 || t[1] != "aclroom" || (t[0] != "mesh" && t[0] != "_INBOX") {
		return "", outside
	}
	switch {
	case isWildcard(t[2]):
		return "", "names no single room: a wildcard in the room position reaches every room"
	case !protocol.ValidToken(t[2]):
		return "", "names no room: a room id is one token of [A-Za-z0-9_-]"
	case len(t) < 4:
		return "", outside
	}
	return t[2], ""
}

// subject is a subject or a pattern split at its dots: "a.b" is [a b], ""
// is [""], "a..b" is [a "" b]. Only a subject that passed validPattern
// (or a watched space) holds wildcards as whole tokens.
type subject []string

// split splits s at its dots.
func split(s string) subject { return splitInto(s, nil) }

// splitInto splits s at its dots into buf's storage, growing it only when
// s has more tokens than buf holds.
func splitInto(s string, buf []string) subject {
	t := buf[:0]
	for {
		tok, rest, more := strings.Cut(s, ".")
		t = append(t, tok)
		if !more {
			return t
		}
		s = rest
	}
}

func splitAll(list []string) []subject {
	out := make([]subject, len(list))
	for i, s := range list {
		out[i] = split(s)
	}
	return out
}

// ownForm is a per-agent subject (protocol.InboxSubject and the like) as
// tokens, the agent's key at token at. A subject is the form of one of the
// hosted agents when it has the form's length, every other token is the
// form's, and token at is a hosted key. For keys of one token (user public
// keys, which the guard checks first) that is exactly "the subject equals
// form(h) for some hosted h".
type ownForm struct {
	toks subject
	at   int
}

// formOf finds the agent's token in what form builds for a marker key.
func formOf(form func(agent string) string) ownForm {
	const marker = "\x00agent\x00"
	t := split(form(marker))
	at := slices.Index(t, marker)
	if at < 0 {
		panic("creds: subject form without its agent token: " + form(marker))
	}
	return ownForm{toks: t, at: at}
}

func (f ownForm) matches(t subject, hosted []string) bool {
	if len(t) != len(f.toks) {
		return false
	}
	for i, x := range f.toks {
		if i != f.at && t[i] != x {
			return false
		}
	}
	return slices.Contains(hosted, t[f.at])
}

// ownFeed reports whether t is mesh.feed.<owner>.<topic or *> for one of owners.
func ownFeed(t subject, owners []string) bool {
	return len(t) == 4 && t[0] == "mesh" && t[1] == "feed" && t[3] != ">" &&
		slices.Contains(owners, t[2])
}

// jobScope explains why t, in a job credential, reaches more than one task,
// or returns "".
func jobScope(t subject) string {
	if !overlaps(taskAllT, t) {
		return ""
	}
	switch {
	case t[0] != "mesh" || t[1] != "task":
		return "reaches task subjects through a wildcard"
	case len(t) < 3 || isWildcard(t[2]):
		return "reaches more than one task"
	case t[2] == "get" && (len(t) != 4 || isWildcard(t[3])):
		return "reads more than one task"
	}
	return ""
}

// anyCovers reports whether one of patterns covers subject.
func anyCovers(patterns []string, subject subject) bool {
	var buf [16]string
	for _, p := range patterns {
		if covers(splitInto(p, buf[:0]), subject) {
			return true
		}
	}
	return false
}

func anyOverlaps(patterns []subject, t subject) bool {
	for _, p := range patterns {
		if overlaps(p, t) {
			return true
		}
	}
	return false
}

func isWildcard(tok string) bool { return tok == "*" || tok == ">" }

func hasWildcard(t subject) bool { return slices.ContainsFunc(t, isWildcard) }

// patternByte classes the bytes validPattern looks at: 1 a dot, 2 white
// space, 3 a wildcard; every other byte is 0 and passes at a table look-up.
var patternByte = [256]uint8{'.': 1, ' ': 2, '\t': 2, '\r': 2, '\n': 2, '*': 3, '>': 3}

// validPattern reports whether s is a subject or subscription pattern the
// broker would read as one: non-empty tokens without white space, wildcards
// only as whole tokens, > only last.
func validPattern(s string) bool {
	var buf [16]string
	_, ok := validSplit(s, buf[:0])
	return ok
}

// validSplit is validPattern and splitInto in one pass over s; the
// subject is only meaningful when ok.
func validSplit(s string, buf []string) (t subject, ok bool) {
	t = buf[:0]
	start, wild := 0, false
	for i := 0; i <= len(s); i++ {
		if i < len(s) {
			switch patternByte[s[i]] {
			case 0:
				continue
			case 2:
				return nil, false
			case 3:
				wild = true
				continue
			}
		}
		tok := s[start:i]
		switch {
		case tok == "":
			return nil, false
		case tok == ">" && i != len(s):
			return nil, false
		case wild && tok != "*" && tok != ">":
			return nil, false
		}
		t = append(t, tok)
		start, wild = i+1, false
	}
	return t, true
}

// subjectCovers reports whether pattern matches every subject that subject
// matches (subject may itself hold wildcards).
func subjectCovers(pattern, subject string) bool { return covers(split(pattern), split(subject)) }

// covers is subjectCovers on split subjects: token by token, * covers one
// token (a literal or *), > covers one or more remaining tokens.
func covers(pattern, subject subject) bool {
	for i := 0; ; i++ {
		pt, st := pattern[i], subject[i]
		switch {
		case pt == ">":
			return true
		case pt == "*":
			if st == ">" {
				return false
			}
		case st != pt:
			return false
		}
		pmore, smore := i+1 < len(pattern), i+1 < len(subject)
		if !pmore || !smore {
			return pmore == smore
		}
	}
}

// patternsOverlap reports whether some concrete subject matches both a and b.
func patternsOverlap(a, b string) bool { return overlaps(split(a), split(b)) }

// overlaps is patternsOverlap on split subjects.
func overlaps(a, b subject) bool {
	for i := 0; ; i++ {
		x, y := a[i], b[i]
		switch {
		case x == ">" || y == ">":
			return true
		case x != "*" && y != "*" && x != y:
			return false
		}
		amore, bmore := i+1 < len(a), i+1 < len(b)
		if !amore || !bmore {
			return amore == bmore
		}
	}
}
