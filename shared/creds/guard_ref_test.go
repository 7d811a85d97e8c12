package creds

// The guard as it was before it compared subjects token by token
// (November 2026), kept verbatim as the reference of the differential
// test in guard_diff_test.go: the faster guard must refuse exactly what
// this one refuses, with the same rule, subject and reason.

import (
	"fmt"
	"slices"
	"strings"

	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// refGuard checks a permission set against the rules of spec §4.6 rule 4 for a
// credential of kind, issued to the credential key key and hosting the
// agents in hosted, and returns a *GuardError
// naming the first broken rule and the offending subject. Only guarded kinds
// (Kind.Guarded) have a guard; the others are refused. Subjects are compared
// as NATS subjects, token by token, with * and > as the broker reads them.
func refGuard(kind Kind, key string, hosted []string, p Permissions) error {
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
		if !refAnyCovers(p.PubDeny, d) {
			return refuse(RuleDenies, d, "is missing from the publish deny list")
		}
	}
	for _, d := range subDenies() {
		if !refAnyCovers(p.SubDeny, d) {
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
		if !refValidPattern(s) {
			return refuse(RuleAllowLists, s, "is not a valid subscribe subject")
		}
		if refAnyOverlaps(inboxSpaces, s) && !slices.Contains(ownInboxes, s) {
			switch {
			case refHasWildcard(s):
				return refuse(RuleInboxSubscribe, s, "subscribes to agent inboxes through a wildcard")
			case len(ownInboxes) == 0:
				return refuse(RuleInboxSubscribe, s, "subscribes to an inbox; a %s credential subscribes to none", kind)
			default:
				return refuse(RuleInboxSubscribe, s, "subscribes to an inbox outside the hosted agents' own")
			}
		}
		if refAnyOverlaps(streamSpaces, s) {
			return refuse(RuleStreamSubjects, s, "subscribes to a JetStream subject")
		}
		if refAnyOverlaps(replySpaces, s) && !slices.Contains(ownReplies, s) {
			if s == protocol.SharedInboxSpace {
				return refuse(RuleReplySubscribe, s, "is the shared reply space, which a %s credential never gets", kind)
			}
			return refuse(RuleReplySubscribe, s, "reaches replies outside the credential's own prefix %s.>", protocol.PrivateInboxPrefix(key))
		}
		if !prof.heartbeats && refPatternsOverlap(heartbeatSpace, s) {
			return refuse(RuleHeartbeatSubscribe, s, "subscribes to node heartbeats; a %s credential follows none", kind)
		}
		if prof.job {
			if err := refJobScope(s); err != "" {
				return refuse(RuleJobScope, s, "%s", err)
			}
		}
		if refPatternsOverlap(denyInternal, s) {
			return refuse(RuleInternal, s, "reaches the internal service subjects")
		}
	}

	// Publishes.
	for _, s := range p.PubAllow {
		if !refValidPattern(s) {
			return refuse(RuleAllowLists, s, "is not a valid publish subject")
		}
		if refAnyOverlaps(streamSpaces, s) {
			return refuse(RuleStreamSubjects, s, "reaches JetStream; clients read their mail through the mailbox worker")
		}
		if refPatternsOverlap(mailboxSpace, s) && !slices.Contains(ownMailbox, s) {
			if len(ownMailbox) == 0 {
				return refuse(RuleMailbox, s, "reaches the mailbox; a %s credential has none", kind)
			}
			return refuse(RuleMailbox, s, "reaches mailbox subjects other than fetch and ack")
		}
		if refPatternsOverlap(protocol.ServiceInboxSpace, s) {
			return refuse(RuleReplyPublish, s, "publishes into the services' reply prefix")
		}
		if refPatternsOverlap(feedSpace, s) && !refOwnFeed(s, ownFeeds) {
			if len(ownFeeds) == 0 {
				return refuse(RuleFeedPublish, s, "publishes on a feed; a %s credential publishes none", kind)
			}
			return refuse(RuleFeedPublish, s, "publishes on a feed outside mesh.feed.<hosted agent>.*")
		}
		if refPatternsOverlap(guardedInboxSpace, s) {
			return refuse(RuleGuardedPublish, s, "publishes to guarded inboxes, which only the admission service may do")
		}
		if refPatternsOverlap(outboxSpace, s) && !slices.Contains(ownOutboxes, s) {
			return refuse(RuleOwnerPublish, s, "publishes on an outbox that is not a hosted agent's")
		}
		if refPatternsOverlap(traceSpace, s) && !slices.Contains(ownTraces, s) {
			return refuse(RuleOwnerPublish, s, "publishes on a trace subject that is not a hosted agent's")
		}
		if prof.sandbox && refAnyOverlaps(sandboxSpaces, s) {
			return refuse(RuleSandbox, s, "is outside the sandbox (no admission, rooms, artifacts or board)")
		}
		if prof.sandbox && refAnyOverlaps(registerSpaces, s) && !slices.Contains(ownRegister, s) {
			return refuse(RuleSandboxRegister, s, "reaches a register subject other than the plain one and the guest's own bound one (%s)", strings.Join(ownRegister, ", "))
		}
		if prof.job {
			if err := refJobScope(s); err != "" {
				return refuse(RuleJobScope, s, "%s", err)
			}
		}
		if refPatternsOverlap(denyInternal, s) {
			return refuse(RuleInternal, s, "reaches the internal service subjects")
		}
	}
	return nil
}

// ownFeed reports whether s is mesh.feed.<owner>.<topic or *> for one of owners.
func refOwnFeed(s string, owners []string) bool {
	t := strings.Split(s, ".")
	return len(t) == 4 && t[0] == "mesh" && t[1] == "feed" && t[3] != ">" &&
		slices.Contains(owners, t[2])
}

// jobScope explains why s, in a job credential, reaches more than one task,
// or returns "".
func refJobScope(s string) string {
	if !refPatternsOverlap(subjTaskAll, s) {
		return ""
	}
	t := strings.Split(s, ".")
	switch {
	case t[0] != "mesh" || t[1] != "task":
		return "reaches task subjects through a wildcard"
	case len(t) < 3 || refIsWildcard(t[2]):
		return "reaches more than one task"
	case t[2] == "get" && (len(t) != 4 || refIsWildcard(t[3])):
		return "reads more than one task"
	}
	return ""
}

func refAnyCovers(patterns []string, subject string) bool {
	for _, p := range patterns {
		if refSubjectCovers(p, subject) {
			return true
		}
	}
	return false
}

func refAnyOverlaps(patterns []string, s string) bool {
	for _, p := range patterns {
		if refPatternsOverlap(p, s) {
			return true
		}
	}
	return false
}

func refIsWildcard(tok string) bool { return tok == "*" || tok == ">" }

// nextToken splits the first token off a subject; more reports whether
// another token follows.
func refNextToken(s string) (tok, rest string, more bool) {
	tok, rest, more = strings.Cut(s, ".")
	return tok, rest, more
}

func refHasWildcard(s string) bool {
	for {
		tok, rest, more := refNextToken(s)
		if refIsWildcard(tok) {
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
func refValidPattern(s string) bool {
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
func refSubjectCovers(pattern, subject string) bool {
	for {
		pt, prest, pmore := refNextToken(pattern)
		st, srest, smore := refNextToken(subject)
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
func refPatternsOverlap(a, b string) bool {
	for {
		x, arest, amore := refNextToken(a)
		y, brest, bmore := refNextToken(b)
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
