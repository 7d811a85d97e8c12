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
	// and $JS.>, $O.>, mesh.internal.> and the services' reply prefix
	// _MESH_SVC.> are denied for both publish and subscribe, and the relay
	// reply space _MESH_RELAY.> for subscribe (MeshDenies).
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

// Guard checks a permission set against the rules of spec §4.6 rule 4 for a
// credential of kind, issued to the credential key key and hosting the
// agents in hosted, and returns a *GuardError
// naming the first broken rule and the offending subject. Only guarded kinds
// (Kind.Guarded) have a guard; the others are refused. Subjects are compared
// as NATS subjects, token by token, with * and > as the broker reads them.
func Guard(kind Kind, key string, hosted []string, p Permissions) error {
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

	// Allow lists.
	if len(p.PubAllow) == 0 {
		return refuse(RuleAllowLists, "", "empty publish allow list (it would inherit the account's defaults)")
	}
	if len(p.SubAllow) == 0 {
		return refuse(RuleAllowLists, "", "empty subscribe allow list (it would inherit the account's defaults)")
	}

	// Denies.
	for _, d := range MeshDenies() {
		if !anyCovers(p.PubDeny, d) {
			return refuse(RuleDenies, d, "is missing from the publish deny list")
		}
	}
	for _, d := range subDenies() {
		if !anyCovers(p.SubDeny, d) {
			return refuse(RuleDenies, d, "is missing from the subscribe deny list")
		}
	}
	if !keys.IsUserPublicKey(key) {
		return refuse(RuleReplySubscribe, key, "is not a credential public key, so it names no reply prefix")
	}
	ownReplies := []string{protocol.PrivateInboxPrefix(key) + ".>"}
	if prof.sharedInbox {
		ownReplies = append(ownReplies, protocol.SharedInboxSpace)
	}
	var ownMailbox []string
	if prof.mailbox {
		ownMailbox = []string{protocol.SubjMailboxFetch, protocol.SubjMailboxAck}
	}

	// The hosted agents' own subjects, by what this kind may do with them.
	ownRegister := []string{protocol.SubjRegister}
	var ownInboxes, ownFeeds, ownOutboxes, ownTraces []string
	for _, h := range hosted {
		if prof.inboxes {
			ownInboxes = append(ownInboxes, protocol.InboxSubject(h))
			if !prof.sandbox {
				ownInboxes = append(ownInboxes, protocol.GuardedInboxSubject(h))
			}
		}
		if prof.feeds {
			ownFeeds = append(ownFeeds, h)
		}
		ownOutboxes = append(ownOutboxes, protocol.OutboxSubject(h))
		ownTraces = append(ownTraces, protocol.TraceSubject(h))
		ownRegister = append(ownRegister, registerBound(h))
	}

	// Subscriptions.
	for _, s := range p.SubAllow {
		if !validPattern(s) {
			return refuse(RuleAllowLists, s, "is not a valid subscribe subject")
		}
		if anyOverlaps(inboxSpaces, s) && !slices.Contains(ownInboxes, s) {
			switch {
			case hasWildcard(s):
				return refuse(RuleInboxSubscribe, s, "subscribes to agent inboxes through a wildcard")
			case len(ownInboxes) == 0:
				return refuse(RuleInboxSubscribe, s, "subscribes to an inbox; a %s credential subscribes to none", kind)
			default:
				return refuse(RuleInboxSubscribe, s, "subscribes to an inbox outside the hosted agents' own")
			}
		}
		if anyOverlaps(streamSpaces, s) {
			return refuse(RuleStreamSubjects, s, "subscribes to a JetStream subject")
		}
		if anyOverlaps(replySpaces, s) && !slices.Contains(ownReplies, s) {
			if s == protocol.SharedInboxSpace {
				return refuse(RuleReplySubscribe, s, "is the shared reply space, which a %s credential never gets", kind)
			}
			return refuse(RuleReplySubscribe, s, "reaches replies outside the credential's own prefix %s.>", protocol.PrivateInboxPrefix(key))
		}
		if !prof.heartbeats && patternsOverlap(heartbeatSpace, s) {
			return refuse(RuleHeartbeatSubscribe, s, "subscribes to node heartbeats; a %s credential follows none", kind)
		}
		if prof.job {
			if err := jobScope(s); err != "" {
				return refuse(RuleJobScope, s, "%s", err)
			}
		}
		if patternsOverlap(denyInternal, s) {
			return refuse(RuleInternal, s, "reaches the internal service subjects")
		}
	}

	// Publishes.
	for _, s := range p.PubAllow {
		if !validPattern(s) {
			return refuse(RuleAllowLists, s, "is not a valid publish subject")
		}
		if anyOverlaps(streamSpaces, s) {
			return refuse(RuleStreamSubjects, s, "reaches JetStream; clients read their mail through the mailbox worker")
		}
		if patternsOverlap(mailboxSpace, s) && !slices.Contains(ownMailbox, s) {
			if len(ownMailbox) == 0 {
				return refuse(RuleMailbox, s, "reaches the mailbox; a %s credential has none", kind)
			}
			return refuse(RuleMailbox, s, "reaches mailbox subjects other than fetch and ack")
		}
		if patternsOverlap(protocol.ServiceInboxSpace, s) {
			return refuse(RuleReplyPublish, s, "publishes into the services' reply prefix")
		}
		if patternsOverlap(feedSpace, s) && !ownFeed(s, ownFeeds) {
			if len(ownFeeds) == 0 {
				return refuse(RuleFeedPublish, s, "publishes on a feed; a %s credential publishes none", kind)
			}
			return refuse(RuleFeedPublish, s, "publishes on a feed outside mesh.feed.<hosted agent>.*")
		}
		if patternsOverlap(guardedInboxSpace, s) {
			return refuse(RuleGuardedPublish, s, "publishes to guarded inboxes, which only the admission service may do")
		}
		if patternsOverlap(outboxSpace, s) && !slices.Contains(ownOutboxes, s) {
			return refuse(RuleOwnerPublish, s, "publishes on an outbox that is not a hosted agent's")
		}
		if patternsOverlap(traceSpace, s) && !slices.Contains(ownTraces, s) {
			return refuse(RuleOwnerPublish, s, "publishes on a trace subject that is not a hosted agent's")
		}
		if prof.sandbox && anyOverlaps(sandboxSpaces, s) {
			return refuse(RuleSandbox, s, "is outside the sandbox (no admission, rooms, artifacts or board)")
		}
		if prof.sandbox && anyOverlaps(registerSpaces, s) && !slices.Contains(ownRegister, s) {
			return refuse(RuleSandboxRegister, s, "reaches a register subject other than the plain one and the guest's own bound one (%s)", strings.Join(ownRegister, ", "))
		}
		if prof.job {
			if err := jobScope(s); err != "" {
				return refuse(RuleJobScope, s, "%s", err)
			}
		}
		if patternsOverlap(denyInternal, s) {
			return refuse(RuleInternal, s, "reaches the internal service subjects")
		}
	}
	return nil
}

// ownFeed reports whether s is mesh.feed.<owner>.<topic or *> for one of owners.
func ownFeed(s string, owners []string) bool {
	t := strings.Split(s, ".")
	return len(t) == 4 && t[0] == "mesh" && t[1] == "feed" && t[3] != ">" &&
		slices.Contains(owners, t[2])
}

// jobScope explains why s, in a job credential, reaches more than one task,
// or returns "".
func jobScope(s string) string {
	if !patternsOverlap(subjTaskAll, s) {
		return ""
	}
	t := strings.Split(s, ".")
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

func anyCovers(patterns []string, subject string) bool {
	for _, p := range patterns {
		if subjectCovers(p, subject) {
			return true
		}
	}
	return false
}

func anyOverlaps(patterns []string, s string) bool {
	for _, p := range patterns {
		if patternsOverlap(p, s) {
			return true
		}
	}
	return false
}

func isWildcard(tok string) bool { return tok == "*" || tok == ">" }

// nextToken splits the first token off a subject; more reports whether
// another token follows.
func nextToken(s string) (tok, rest string, more bool) {
	tok, rest, more = strings.Cut(s, ".")
	return tok, rest, more
}

func hasWildcard(s string) bool {
	for {
		tok, rest, more := nextToken(s)
		if isWildcard(tok) {
			return true
		}
		if !more {
			return false
		}
		s = rest
	}
}

// validPattern reports whether s is a subject or subscription pattern the
// broker would read as one: non-empty tokens without white space, wildcards
// only as whole tokens, > only last.
func validPattern(s string) bool {
	start, wild := 0, false
	for i := 0; i <= len(s); i++ {
		if i < len(s) && s[i] != '.' {
			switch s[i] {
			case ' ', '\t', '\r', '\n':
				return false
			case '*', '>':
				wild = true
			}
			continue
		}
		tok := s[start:i]
		switch {
		case tok == "":
			return false
		case tok == ">" && i != len(s):
			return false
		case wild && tok != "*" && tok != ">":
			return false
		}
		start, wild = i+1, false
	}
	return true
}

// subjectCovers reports whether pattern matches every subject that subject
// matches (subject may itself hold wildcards): token by token, * covers one
// token (a literal or *), > covers one or more remaining tokens.
func subjectCovers(pattern, subject string) bool {
	for {
		pt, prest, pmore := nextToken(pattern)
		st, srest, smore := nextToken(subject)
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
		if !pmore || !smore {
			return pmore == smore
		}
		pattern, subject = prest, srest
	}
}

// patternsOverlap reports whether some concrete subject matches both a and b.
func patternsOverlap(a, b string) bool {
	for {
		x, arest, amore := nextToken(a)
		y, brest, bmore := nextToken(b)
		switch {
		case x == ">" || y == ">":
			return true
		case x != "*" && y != "*" && x != y:
			return false
		}
		if !amore || !bmore {
			return amore == bmore
		}
		a, b = arest, brest
	}
}
