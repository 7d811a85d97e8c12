package protocol

import "regexp"

// Subjects of the bus (spec §4.3) and the JetStream names behind them. One
// place names them so the workers, the runtime and the permission builders
// cannot drift apart.

// Fixed subjects.
const (
	SubjRegister         = "mesh.registry.register"
	SubjDeregister       = "mesh.registry.deregister"
	SubjDiscover         = "mesh.registry.discover"
	SubjRegistryGetPfx   = "mesh.registry.get."
	SubjNodesList        = "mesh.registry.nodes.list"
	SubjPresenceGet      = "mesh.presence.get"
	SubjFeedGet          = "mesh.feed.get"
	SubjAdmissionGuard   = "mesh.admission.guard"
	SubjAdmissionUnguard = "mesh.admission.unguard"
	SubjCatalogList      = "mesh.catalog.list"
	SubjActivityList     = "mesh.activity.list"
	SubjUsageList        = "mesh.usage.list"
	SubjTaskGetPfx       = "mesh.task.get."
)

// Internal subjects: only service credentials reach mesh.internal.> (no
// agent credential's allow-list names it), so the broker is what keeps
// agents off them.
const (
	// SubjGuestEvict asks the registry to remove the registrations of
	// guests whose leases ended: {keys:[...]} → {evicted:[...]}.
	SubjGuestEvict = "mesh.internal.guest.evict"
	// SubjGuestErase asks the activity worker to erase the timeline rows
	// and counters of guests whose leases ended: {keys:[...]} → {erased}.
	SubjGuestErase = "mesh.internal.guest.erase"
)

// RoomVerbs, ArtifactVerbs and BoardVerbs are the request subjects of the
// rooms, artifacts and board services; credentials enumerate them one by
// one rather than granting a wildcard.
var (
	RoomVerbs = []string{"provision", "reclaim", "replay", "status", "attach", "fetch", "mine", "cursor",
		"usage", "admit", "credential", "expel", "leave", "note", "notes", "dossier"}
	ArtifactVerbs = []string{"put", "fetch", "stat", "remove", "usage", "put.begin", "put.commit", "link"}
	BoardVerbs    = []string{"post", "list", "claim", "complete", "abandon", "withdraw"}
)

// Per-agent and per-task subjects.
func InboxSubject(agent string) string        { return "mesh.agent." + agent + ".inbox" }
func GuardedInboxSubject(agent string) string { return "mesh.agent." + agent + ".inbox.guarded" }
func OutboxSubject(agent string) string       { return "mesh.agent." + agent + ".outbox" }
func TraceSubject(agent string) string        { return "mesh.trace." + agent }
func FeedSubject(agent, topic string) string  { return "mesh.feed." + agent + "." + topic }
func HeartbeatSubject(node string) string     { return "mesh.heartbeat." + node }
func TaskUpdateSubject(task string) string    { return "mesh.task." + task + ".update" }
func TaskStreamSubject(task string) string    { return "mesh.task." + task + ".stream" }
func TaskGetSubject(task string) string       { return SubjTaskGetPfx + task }
func EventSubject(topic string) string        { return "mesh.event." + topic }
func RegistryGetSubject(agent string) string  { return SubjRegistryGetPfx + agent }

// Offline mailboxes are one shared stream over every agent inbox, with one
// durable pull consumer per agent filtered to its own inbox (DESIGN §5);
// this keeps the stream count flat on a managed cluster.
const MailboxStream = "MESH_MAILBOX"

// MailboxConsumer is the durable consumer that holds one agent's mail.
func MailboxConsumer(agent string) string { return "inbox_" + agent }

// The JetStream API subjects a node uses on its own mailbox: read the
// stream's bound once (the drain stops at the last sequence it saw), read
// its own consumer, pull the next batch, and acknowledge.
func MailboxStreamInfoSubject() string { return "$JS.API.STREAM.INFO." + MailboxStream }
func MailboxConsumerInfoSubject(agent string) string {
	return "$JS.API.CONSUMER.INFO." + MailboxStream + "." + MailboxConsumer(agent)
}
func MailboxNextSubject(agent string) string {
	return "$JS.API.CONSUMER.MSG.NEXT." + MailboxStream + "." + MailboxConsumer(agent)
}

// MailboxAckSubjects match the acknowledgement subjects of one agent's
// consumer in both reply-subject layouts the server uses:
//
//	v1: $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>        (9 tokens)
//	v2: $JS.ACK.<domain>.<acct hash>.<stream>.<consumer>.<d>.<s>.<c>.<ts>.<p>[.…]     (11+ tokens)
//
// Both patterns pin their token counts. The v2 one spells out the tokens
// after the consumer so it cannot match a 9-token v1 subject, and the v1 one
// is exactly 9 tokens so it cannot match a v2 subject naming another
// consumer. A looser "$JS.ACK.*.*.<stream>.<own>.>" would also match $JS.ACK.<stream>.<other's consumer>.<stream>.<own>.1.1.1,
// which the server routes as a v1 ack to the other consumer — letting one
// node pull another agent's mail (found by the broker tests in creds).
func MailboxAckSubjects(agent string) []string {
	c := MailboxConsumer(agent)
	return []string{
		"$JS.ACK." + MailboxStream + "." + c + ".*.*.*.*.*",
		"$JS.ACK.*.*." + MailboxStream + "." + c + ".*.*.*.*.>",
	}
}

// subjectToken is what a subject token supplied by a caller (a topic, a
// room id, a channel) may contain: no dots, no wildcards, no spaces.
var subjectToken = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// ValidToken reports whether s may be used as one subject token.
func ValidToken(s string) bool { return subjectToken.MatchString(s) }
