package protocol

import (
	"regexp"
	"strings"
)

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
	// SubjRegistryRemove asks the registry to remove the registrations of
	// the agents of a closed account, whatever they are:
	// {agents:[...]} → {removed:[...]}.
	SubjRegistryRemove = "mesh.internal.registry.remove"
	// SubjCreditsGrant asks the clearing to credit an owner's balance:
	// {owner, credits, reason} → {owner, credits, balance}, the operator's
	// only way to put credits into the mesh (meshd admin credits grant).
	SubjCreditsGrant = "mesh.internal.credits.grant"
)

// The catalog's writes (docs/bus-admission-activity.md "Catalog"): an
// agent removes its own entry; the operator sets official or removes any,
// through the services key on the internal subject.
const (
	// SubjCatalogRemove: {agent_id}, signed by that agent → {removed}.
	SubjCatalogRemove = "mesh.catalog.remove"
	// SubjCatalogAdmin: {agent_id, official?: bool, remove?: true,
	// restore?: true}, signed by the services key → {entry}, {removed} or
	// {restored, listed}.
	SubjCatalogAdmin = "mesh.internal.catalog.admin"
)

// RoomVerbs, ArtifactVerbs and BoardVerbs are the request subjects of the
// rooms, artifacts and board services; credentials enumerate them one by
// one rather than granting a wildcard.
var (
	RoomVerbs = []string{"provision", "reclaim", "replay", "status", "attach", "fetch", "mine", "cursor",
		"usage", "admit", "credential", "expel", "leave", "note", "notes", "dossier"}
	ArtifactVerbs = []string{"put", "fetch", "stat", "remove", "usage", "put.begin", "put.commit", "link"}
	BoardVerbs    = []string{"post", "list", "claim", "complete", "abandon", "withdraw"}
	// AgreementVerbs are the agreements service's (docs/commerce.md): an
	// owner-signed agreement filed, listed (by its seller or its owner's
	// agents) and revoked; CreditVerbs the clearing service's.
	AgreementVerbs = []string{"file", "list", "revoke"}
	CreditVerbs    = []string{"balance", "history"}
)

// SubjCommerceAdmit is the seller node's question at admission, before the
// accept: may this requester have this offering (SKU and agreement, an
// engagement's volume)? Answered by the agreements service with the
// refusal to send, or admitted.
const SubjCommerceAdmit = "mesh.commerce.admit"

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

// Offline mailboxes are one shared stream over every agent inbox
// (DESIGN §5), which keeps the stream count flat on a managed cluster. No
// client reaches JetStream: the mailbox worker reads an agent's mail for it
// on a signed request and deletes what it acknowledged, so nothing is made
// per agent at the broker (docs/bus.md "Mailboxes").
const MailboxStream = "MESH_MAILBOX"

// Mailbox subjects: fetch and acknowledge are signed by the agent whose
// mail they touch; known is the control plane's internal question "has
// this key a registration or mail?".
const (
	SubjMailboxFetch = "mesh.mailbox.fetch"
	SubjMailboxAck   = "mesh.mailbox.ack"
	SubjMailboxKnown = "mesh.internal.mailbox.known"
)

// Reply prefixes (docs/security.md). Every connection this project makes
// sets a custom inbox prefix, so that no other credential can read the
// replies it receives:
//
//   - a credential minted for a client runtime subscribes only
//     PrivateInboxPrefix(<its own key>).>, which lies outside _INBOX.>, so
//     even a credential holding the shared _INBOX.> grant cannot reach it;
//   - the workers and every other service connection use
//     ServiceInboxPrefix, which no client credential may subscribe or
//     publish to;
//   - the admission service relays a request to a guarded inbox with a
//     reply subject under RelayReplyPrefix: agents publish their answers
//     there, and only services subscribe it.
//
// SharedInboxSpace is the default prefix of upstream SDKs, which cannot
// set one; it is granted only to the credential kinds such SDKs use, and
// only when the request does not ask for a private inbox alone.
const (
	privateInboxRoot   = "_MESH_INBOX"
	ServiceInboxPrefix = "_MESH_SVC"
	RelayReplyPrefix   = "_MESH_RELAY"
	SharedInboxSpace   = "_INBOX.>"
	// PrivateInboxSpace is everything under every private prefix: what a
	// client publishes replies to.
	PrivateInboxSpace = privateInboxRoot + ".>"
	// ServiceInboxSpace and RelayReplySpace are everything under the
	// services' and the relay's prefixes.
	ServiceInboxSpace = ServiceInboxPrefix + ".>"
	RelayReplySpace   = RelayReplyPrefix + ".>"
)

// IsClientReplySubject reports whether s lies where a client's replies
// arrive: the shared _INBOX. or a private _MESH_INBOX.<key>. prefix. A
// service answering a client's request publishes only there: a reply
// subject anywhere else (a key-value subject, the JetStream API, an
// inbox) names no client, and publishing on it with the services' rights
// would let the sender write where it may not (docs/security.md).
func IsClientReplySubject(s string) bool {
	if inACLRoomReplies(s) {
		return false
	}
	for _, p := range []string{"_INBOX.", privateInboxRoot + "."} {
		if len(s) > len(p) && strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// PrivateInboxPrefix is the reply prefix of the credential minted for key.
func PrivateInboxPrefix(key string) string { return privateInboxRoot + "." + key }

// IsReplySubject reports whether s lies in a reply namespace (a shared,
// private, relay or service inbox): the only subjects a worker or an agent
// answers on, so a request cannot make either publish its signed answer
// anywhere else.
func IsReplySubject(s string) bool {
	if inACLRoomReplies(s) {
		return false
	}
	for _, p := range []string{"_INBOX.", privateInboxRoot + ".", RelayReplyPrefix + ".", ServiceInboxPrefix + "."} {
		if len(s) > len(p) && strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// subjectToken is what a subject token supplied by a caller (a topic, a
// room id, a channel) may contain: no dots, no wildcards, no spaces.
var subjectToken = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

// ValidToken reports whether s may be used as one subject token.
func ValidToken(s string) bool { return subjectToken.MatchString(s) }

// Rooms, board and artifacts (spec §4.3, upstream-notes §7, §8, §14).
func RoomVerbSubject(verb string) string     { return "mesh.rooms." + verb }
func BoardVerbSubject(verb string) string    { return "mesh.board." + verb }
func ArtifactVerbSubject(verb string) string { return "mesh.artifacts." + verb }

// Commerce (docs/commerce.md).
func AgreementVerbSubject(verb string) string { return "mesh.agreements." + verb }
func CreditVerbSubject(verb string) string    { return "mesh.credits." + verb }

// RoomEventSubject is a room's live traffic on one channel (capability and
// sealed rooms); subscribe RoomEventSubject(room, "*") for every channel.
func RoomEventSubject(room, channel string) string { return "mesh.event.room." + room + "." + channel }

// ACLRoomSubject is an acl room's traffic on one channel: reachable only on
// the room credential of mesh.rooms.credential.
func ACLRoomSubject(room, channel string) string { return "mesh.aclroom." + room + "." + channel }

// ACLRoomInboxPrefix is the reply prefix of a room credential's connection.
func ACLRoomInboxPrefix(room string) string { return aclRoomInboxRoot + "." + room }

// aclRoomInboxRoot roots the acl rooms' reply spaces, inside the shared
// _INBOX. namespace.
const aclRoomInboxRoot = "_INBOX.aclroom"

// inACLRoomReplies reports whether s lies in an acl room's reply space:
// reachable on that room's credentials only, so neither a service nor an
// agent answers there (a request naming it as its reply would put a signed
// answer into a room the requester may not speak in).
func inACLRoomReplies(s string) bool { return strings.HasPrefix(s, aclRoomInboxRoot+".") }

// SubjRoomsSweep asks the rooms worker to expire idle rooms (the scheduled
// job RoomSweep): {} → {expired}. Services only.
const SubjRoomsSweep = "mesh.internal.rooms.sweep"
