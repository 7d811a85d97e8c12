package creds

import (
	"fmt"
	"slices"
	"time"

	"agentmesh.dev/mesh/shared/protocol"
)

// Kind is what a user credential is for. It decides which permission
// builder made its set and which rules the guard applies before MintUser
// signs it.
type Kind int

const (
	// KindUnset is the zero Kind, and MintUser refuses it: every credential
	// says what it is for.
	KindUnset Kind = iota
	// KindService is an internal worker connection: broad permissions, no
	// guard, and a JWT that never leaves the process (see MintServiceUser).
	KindService
	// KindNode is the node credential of POST /v1/node-credential (spec
	// §4.6); it hosts a roster of 1 to MaxNodeAgents agents.
	KindNode
	// KindBootstrap is the connection credential of an am_ key exchange
	// (spec §4.5); it hosts the one agent named in the exchange.
	KindBootstrap
	// KindApp is an app's durable credential; it hosts the app's own key.
	KindApp
	// KindGuest is the sandbox credential leased by POST /v1/guest; it hosts
	// the guest's own key and has no mailbox.
	KindGuest
	// KindJob is the narrow, minutes-long credential of POST
	// /v1/job-credential for one task performed by one agent.
	KindJob
	// KindRoom is the acl grade's room credential (mesh.rooms.credential):
	// a fresh key reaching one room's traffic and its reply prefix, and
	// nothing else, for at most MaxRoomLifetime. It hosts no agent.
	KindRoom
)

// String names the kind in errors and logs.
func (k Kind) String() string {
	switch k {
	case KindUnset:
		return "unset"
	case KindService:
		return "service"
	case KindNode:
		return "node"
	case KindBootstrap:
		return "bootstrap"
	case KindApp:
		return "app"
	case KindGuest:
		return "guest"
	case KindJob:
		return "job"
	case KindRoom:
		return "room"
	case KindOperator:
		return "operator"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Guarded reports whether credentials of this kind pass the guard before
// they are signed: every kind that can leave the process.
func (k Kind) Guarded() bool {
	switch k {
	case KindNode, KindBootstrap, KindApp, KindGuest, KindJob, KindRoom:
		return true
	}
	return false
}

// MaxNodeAgents is the largest roster one node credential covers (spec §4.6).
const MaxNodeAgents = 16

// MaxControlLine is the smallest max_control_line (server.Options
// .MaxControlLine) a broker needs to accept every credential minted here.
// The client sends its user JWT inside the CONNECT protocol line, and the
// broker closes a connection whose line exceeds max_control_line, 4096 bytes
// by default ("maximum control line exceeded"). Every hosted agent adds
// about 1.1 KB of per-agent subjects to a node JWT: one agent is about
// 3.3 KB, two 4.4 KB (already over the default), sixteen about 20 KB.
const MaxControlLine = 32 * 1024

// Subjects of the permission sets that package protocol does not name one by
// one (it names the concrete subjects; these are the grants over them).
const (
	subjRegistryAll = "mesh.registry.>"
	subjTaskAll     = "mesh.task.>"
	roomsPrefix     = "mesh.rooms."
	artifactsPrefix = "mesh.artifacts."
	boardPrefix     = "mesh.board."
	agreementPrefix = "mesh.agreements."
	creditPrefix    = "mesh.credits."
)

// The namespaces every guarded credential is denied in both directions (spec
// §4.6): the key-value buckets behind the registry and the other services,
// peer traffic, acl-room traffic (reachable only on a room credential) and
// the broker's system subjects. Deny wins over allow at the broker.
const (
	denyKV      = "$KV.>"
	denyPeer    = "mesh.peer.>"
	denyACLRoom = "mesh.aclroom.>"
	denySys     = "$SYS.>"
)

// What this mesh denies every guarded credential on top of the spec's four,
// both ways: no client reaches JetStream (the mailbox worker reads and
// acknowledges mail for it, so nothing in $JS — API, acknowledgements, flow
// control — is needed), the object store namespace, the internal service
// subjects, and the services' own reply prefix (so no client reads or
// forges a worker's key-value reads and JetStream answers).
const (
	denyJS       = "$JS.>"
	denyObjects  = "$O.>"
	denyInternal = "mesh.internal.>"
	// denyACLRoomInbox is the acl rooms' reply space, every
	// protocol.ACLRoomInboxPrefix: it lies under the shared _INBOX.>, so
	// without this deny a credential holding the shared grant would read
	// every acl room's replies, and any credential could publish forged
	// ones into them. Only a room credential reaches it (its own room's).
	denyACLRoomInbox = "_INBOX.aclroom.>"
)

// RequiredDenies returns the four namespaces spec §4.6 requires every
// guarded credential to deny for both publish and subscribe.
func RequiredDenies() []string { return []string{denyKV, denyPeer, denyACLRoom, denySys} }

// MeshDenies returns everything a guarded credential of this mesh denies
// both ways: RequiredDenies and the JetStream, object store, internal,
// service reply and acl room reply namespaces. The room credential is the
// one exception (RoomDenies): it reaches the acl namespaces, of one room.
func MeshDenies() []string {
	return append(RequiredDenies(), denyJS, denyObjects, denyInternal, protocol.ServiceInboxSpace, denyACLRoomInbox)
}

// RoomDenies is what a room credential denies both ways: MeshDenies less
// the two acl namespaces (mesh.aclroom.> and _INBOX.aclroom.>), which it
// must reach for its own room (deny wins over allow at the broker, and a
// deny cannot except one room). Its allow lists, which the guard holds to
// one room (RuleRoomScope), are what keep it out of every other room.
func RoomDenies() []string {
	return slices.DeleteFunc(MeshDenies(), func(s string) bool { return s == denyACLRoom || s == denyACLRoomInbox })
}

// roomSubDenies are RoomDenies plus what every guarded credential denies
// for subscribe: the relay reply space and every queue subscription.
func roomSubDenies() []string { return append(RoomDenies(), protocol.RelayReplySpace, denyQueues) }

// denyQueues denies every queue subscription ("<subject> <queue>", both
// wildcards): no client needs one, and the workers' queue groups
// (mesh-tasks, mesh-feeds, ...) are public names, so a client joining one
// would take a share of the traffic meant for the workers (task updates,
// feed publishes, the outbox taps) and drop it.
const denyQueues = "> >"

// subDenies are MeshDenies plus the relay reply space, which clients
// publish answers to and never read, and every queue subscription.
func subDenies() []string { return append(MeshDenies(), protocol.RelayReplySpace, denyQueues) }

// Replies says where a credential's connection receives replies.
type Replies struct {
	// Key is the credential's own public key: it subscribes
	// protocol.PrivateInboxPrefix(Key).> and no other private prefix.
	Key string
	// Shared also grants the shared _INBOX.> space, for upstream SDKs that
	// cannot set an inbox prefix. A client on it can read every reply sent
	// to every other client on it (docs/security.md). Guests and jobs never
	// get it; the guard refuses it for them.
	Shared bool
}

// PrivateOnly is the reply grant of a client that sets its prefix.
func PrivateOnly(key string) Replies { return Replies{Key: key} }

// subAllow is the subscribe side of r.
func (r Replies) subAllow() []string {
	out := []string{protocol.PrivateInboxPrefix(r.Key) + ".>"}
	if r.Shared {
		out = append(out, protocol.SharedInboxSpace)
	}
	return out
}

// replyPublish are the reply spaces a client that answers requests
// publishes to: the shared and private inboxes of callers, and the
// admission relay's replies. Never the services' prefix.
func replyPublish() []string {
	return []string{protocol.SharedInboxSpace, protocol.PrivateInboxSpace, protocol.RelayReplySpace}
}

// NodePermissions is the permission set of a node credential hosting agents
// (spec §4.6), with this mesh's changes:
//
// Publish, once for the node: mesh.registry.>, mesh.agent.*.inbox (one
// token wildcard: it does not reach the five-token .inbox.guarded),
// mesh.task.>, mesh.event.>, mesh.presence.get, mesh.heartbeat.*,
// mesh.feed.get, mesh.admission.guard, mesh.admission.unguard, every verb of
// mesh.rooms, mesh.artifacts and mesh.board one by one, mesh.mailbox.fetch
// and mesh.mailbox.ack, mesh.catalog.list and mesh.catalog.remove, and the
// reply spaces (_INBOX.>, _MESH_INBOX.>,
// _MESH_RELAY.>). The mailbox is reached through the mailbox worker, so no
// JetStream subject is granted.
//
// Publish, per hosted agent: its outbox, its trace subject, its own feeds
// mesh.feed.<agent>.*.
//
// Subscribe: per hosted agent its inbox, guarded inbox and outbox; then
// mesh.event.>, mesh.task.>, mesh.feed.*.*, mesh.heartbeat.* (read-only
// liveness: an upstream SDK's trackPresence subscribes
// mesh.heartbeat.<node> after a mesh.presence.get snapshot), its private
// reply prefix _MESH_INBOX.<node key>.>, and _INBOX.> when r.Shared.
//
// Denied both ways: $KV.>, mesh.peer.>, mesh.aclroom.>, $SYS.> (spec), and
// $JS.>, $O.>, mesh.internal.>, _MESH_SVC.>, _INBOX.aclroom.> (the acl
// rooms' replies, inside the shared _INBOX.>); subscribe also
// _MESH_RELAY.> and every queue subscription.
//
// The builder does not check the roster; the guard (run by MintUser) refuses
// an empty, oversized, duplicated or malformed one.
func NodePermissions(agents []string, r Replies) Permissions {
	return nodeLike(agents, r, []string{subjRegistryAll}, true)
}

// BootstrapPermissions is the connection credential issued by an am_ key
// exchange (spec §4.5): the node set for a roster of that one agent, with
// the credential key's reply prefix.
//
// It is the node set because the adapter that redeems an am_ key runs as a
// node hosting that agent, and renews the credential through
// /v1/node-credential with the same one-agent roster. The two credentials
// then carry the same permissions, so renewal never changes what the
// connection may do, and one builder and one guard cover both. The agent was
// bound to the exchanging account by the exchange itself (an agent key owned
// by another account is refused), which is what entitles the credential to
// that agent's inbox and mailbox. The credential key is a separate key
// (spec §2.3); MintUser refuses a bootstrap credential issued to the agent key.
func BootstrapPermissions(agent string, r Replies) Permissions {
	return nodeLike([]string{agent}, r, []string{subjRegistryAll}, true)
}

// AppPermissions is an app's durable credential: the app key is both the
// credential key and an agent the app hosts, so it is the node set for a
// roster of that one key.
//
// On top of the node set an app reads the activity timeline and the usage
// counters of its account's agents (mesh.activity.list, mesh.usage.list:
// the activity worker answers an app about its own account's agents only,
// docs/bus.md "Who may call what"); no other kind may ask them.
func AppPermissions(appKey string, shared bool) Permissions {
	p := nodeLike([]string{appKey}, Replies{Key: appKey, Shared: shared}, []string{subjRegistryAll}, true)
	p.PubAllow = append(p.PubAllow, protocol.SubjActivityList, protocol.SubjUsageList)
	return p
}

// GuestPermissions is the sandbox fence of a leased guest credential whose
// key is also the guest agent's key. It is the node set of a node hosting
// only that key, less everything a sandbox does not get:
//
//   - no offline mailbox (no mesh.mailbox subject);
//   - no admission guard (so no guarded inbox either: only the admission
//     service publishes there, and it guards no sandbox);
//   - no rooms, artifacts or work board;
//   - no shared _INBOX.> grant: its replies arrive only at its private
//     prefix;
//   - of the registry, only the subjects it needs, and two register
//     subjects: the plain mesh.registry.register (where upstream SDKs
//     register, guests included, since they dropped the guest door) and
//     mesh.registry.register.<key>, the node-bound form pinned to its own
//     key (where this mesh's runtime registers a guest). It reaches no
//     other key's bound subject (RuleSandboxRegister). What makes its
//     registrations sandbox is what the control plane issued, not the
//     subject alone: the guest service records every leased key in the
//     registry's guest roster (registry.GuestsBucket) before it answers,
//     and the registry files as sandbox every registration whose agent or
//     vouching node is a recorded guest key. Only a control plane that can
//     record its guests may issue this set; one that cannot issues
//     PinnedGuestPermissions.
//
// Publish: mesh.registry.register, mesh.registry.register.<key>,
// mesh.registry.deregister, mesh.registry.discover, mesh.registry.get.*,
// mesh.registry.nodes.list, mesh.agent.*.inbox, mesh.task.>, mesh.event.>,
// mesh.presence.get, mesh.heartbeat.*, mesh.feed.get, the reply spaces, and
// for the guest key its outbox, trace subject and feeds mesh.feed.<key>.*.
// Subscribe: its inbox and outbox, mesh.event.>, mesh.task.>, mesh.feed.*.*,
// mesh.heartbeat.*, _MESH_INBOX.<key>.>. Denied both ways as for a node.
func GuestPermissions(publicKey string) Permissions {
	return nodeLike([]string{publicKey}, PrivateOnly(publicKey), guestRegistrySubjects(publicKey, true), false)
}

// PinnedGuestPermissions is GuestPermissions without the plain register
// subject: the one register subject is mesh.registry.register.<key>, and
// the registry files everything arriving on a bound subject as sandbox, so
// the broker's pin alone keeps the guest in the sandbox. It is for a
// control plane with no bus connection, which cannot record its guests
// where the registry reads them.
func PinnedGuestPermissions(publicKey string) Permissions {
	return nodeLike([]string{publicKey}, PrivateOnly(publicKey), guestRegistrySubjects(publicKey, false), false)
}

// JobPermissions is the narrow credential of one job: the performing agent
// reports on one task and nothing else.
//
// Publish: mesh.task.<task>.update, mesh.task.<task>.stream,
// mesh.task.get.<task>, mesh.agent.<agent>.outbox, mesh.trace.<agent>.
// Subscribe: mesh.task.<task>.>, _MESH_INBOX.<credential key>.>. Denied both
// ways as for a node.
//
// taskID must be one subject token (protocol.ValidToken); the guard refuses
// a wildcard in the task position.
func JobPermissions(credKey, agent, taskID string) Permissions {
	return Permissions{
		PubAllow: []string{
			protocol.TaskUpdateSubject(taskID),
			protocol.TaskStreamSubject(taskID),
			protocol.TaskGetSubject(taskID),
			protocol.OutboxSubject(agent),
			protocol.TraceSubject(agent),
		},
		SubAllow: append([]string{"mesh.task." + taskID + ".>"}, PrivateOnly(credKey).subAllow()...),
		PubDeny:  MeshDenies(),
		SubDeny:  subDenies(),
	}
}

// MaxRoomLifetime bounds a room credential (upstream-notes §7: one hour):
// expel and leave revoke it at the broker at once, and its renewal is
// refused, so a short life bounds what a lost revocation could leave open.
const MaxRoomLifetime = time.Hour

// RoomPermissions is the room credential of acl room roomID (spec §4.3,
// upstream-notes §7): the room's traffic and its reply prefix, both ways,
// and nothing else.
//
// Publish and subscribe: mesh.aclroom.<room>.> (protocol.ACLRoomSubject)
// and _INBOX.aclroom.<room>.> (protocol.ACLRoomInboxPrefix, the prefix the
// room connection sets, shared by the room's members: a member's request
// in the room is answered by another member there). Denied both ways:
// RoomDenies; subscribe also _MESH_RELAY.> and every queue subscription.
// No $SYS, $KV, $JS, service verb, event, inbox or other room.
//
// roomID must be one subject token (protocol.ValidToken); the guard
// refuses a wildcard or a second room (RuleRoomScope).
func RoomPermissions(roomID string) Permissions {
	traffic := protocol.ACLRoomSubject(roomID, ">")
	replies := protocol.ACLRoomInboxPrefix(roomID) + ".>"
	return Permissions{
		PubAllow: []string{traffic, replies},
		SubAllow: []string{traffic, replies},
		PubDeny:  RoomDenies(),
		SubDeny:  roomSubDenies(),
	}
}

// ServicePermissions is the set of the internal workers: everything in the
// mesh account, which they need ($JS.API.> for streams and consumers, $KV.>
// for the buckets, every service subject), except the broker's system
// namespace. JetStream works without $SYS: its API lives on $JS.API in the
// account itself (TestServicePermissionsKeepJetStream). These credentials are
// never guarded and must never leave the process; their connections set the
// reply prefix protocol.ServiceInboxPrefix (ServiceInboxOption).
func ServicePermissions() Permissions {
	return Permissions{
		PubAllow: []string{">"},
		SubAllow: []string{">"},
		PubDeny:  []string{denySys},
		SubDeny:  []string{denySys},
	}
}

// nodeLike builds the node set for agents, publishing on the registry
// subjects registry; full is false for the guest's sandbox cut.
func nodeLike(agents []string, r Replies, registry []string, full bool) Permissions {
	pub := slices.Clone(registry)
	pub = append(pub,
		protocol.InboxSubject("*"),
		subjTaskAll,
		protocol.EventSubject(">"),
		protocol.SubjPresenceGet,
		protocol.HeartbeatSubject("*"),
		protocol.SubjFeedGet,
	)
	if full {
		pub = append(pub, protocol.SubjAdmissionGuard, protocol.SubjAdmissionUnguard,
			protocol.SubjMailboxFetch, protocol.SubjMailboxAck,
			// The catalog is public to every credential but a guest's (and
			// a job's, which sees its one task); an agent removes its own
			// entry (the worker checks the signature).
			protocol.SubjCatalogList, protocol.SubjCatalogRemove)
		pub = appendVerbs(pub, roomsPrefix, protocol.RoomVerbs)
		pub = appendVerbs(pub, artifactsPrefix, protocol.ArtifactVerbs)
		pub = appendVerbs(pub, boardPrefix, protocol.BoardVerbs)
		pub = appendVerbs(pub, agreementPrefix, protocol.AgreementVerbs)
		pub = appendVerbs(pub, creditPrefix, protocol.CreditVerbs)
		pub = append(pub, protocol.SubjCommerceAdmit)
	}
	pub = append(pub, replyPublish()...)
	pub = slices.Grow(pub, 3*len(agents))
	sub := make([]string, 0, 3*len(agents)+8)
	for _, a := range agents {
		outbox := protocol.OutboxSubject(a) // in both lists: one string
		pub = append(pub,
			outbox,
			protocol.TraceSubject(a),
			protocol.FeedSubject(a, "*"),
		)
		sub = append(sub, protocol.InboxSubject(a))
		if full {
			sub = append(sub, protocol.GuardedInboxSubject(a))
		}
		sub = append(sub, outbox)
	}
	sub = append(sub,
		protocol.EventSubject(">"),
		subjTaskAll,
		protocol.FeedSubject("*", "*"),
		protocol.HeartbeatSubject("*"),
	)
	sub = append(sub, r.subAllow()...)
	return Permissions{PubAllow: pub, PubDeny: MeshDenies(), SubAllow: sub, SubDeny: subDenies()}
}

// registerBound is the node-bound register subject of key,
// mesh.registry.register.<key> (upstream clause b).
func registerBound(key string) string { return protocol.SubjRegister + "." + key }

// guestRegistrySubjects are the registry subjects a guest with key
// publishes on, in place of mesh.registry.>: the plain register subject
// when plain is set, the bound register subject of its own key (and of no
// other, RuleSandboxRegister), deregister, discover, get and the node list.
func guestRegistrySubjects(key string, plain bool) []string {
	var out []string
	if plain {
		out = append(out, protocol.SubjRegister)
	}
	return append(out,
		registerBound(key),
		protocol.SubjDeregister,
		protocol.SubjDiscover,
		protocol.RegistryGetSubject("*"),
		protocol.SubjNodesList,
	)
}

func appendVerbs(dst []string, prefix string, verbs []string) []string {
	for _, v := range verbs {
		dst = append(dst, prefix+v)
	}
	return dst
}

// Fence classes: credentials whose holders proved nothing beyond possession
// of a fresh key get limits the broker enforces from the JWT (ConnLimits)
// and the fence enforces beside it (connections per key, message and byte
// rates). Everything else is unclassed: an account vouches for it.
const (
	// ClassGuest is a leased guest (sandbox) credential.
	ClassGuest = "guest"
	// ClassUnowned is a node credential whose roster no account owns.
	ClassUnowned = "unowned"
)

// ClassLimits are the limits of one fence class (docs/security.md).
type ClassLimits struct {
	// ConnLimits are carried in the JWT and enforced by the broker.
	ConnLimits
	// Conns is how many connections one credential key may hold open at
	// once; the fence closes the newest beyond it.
	Conns int
	// MsgsPerSec and BytesPerSec bound what one connection publishes,
	// averaged over the fence's window; the fence closes a connection over
	// either and refuses the key's connections for a cooling-off period.
	MsgsPerSec  int
	BytesPerSec int64
}

// DefaultClassLimits are the limits meshd and the cloud use unless
// configured otherwise.
func DefaultClassLimits() map[string]ClassLimits {
	return map[string]ClassLimits{
		ClassGuest: {ConnLimits: ConnLimits{Payload: 64 << 10, Subs: 256},
			Conns: 2, MsgsPerSec: 50, BytesPerSec: 256 << 10},
		ClassUnowned: {ConnLimits: ConnLimits{Payload: protocol.TransportMaxPayload, Subs: 1024},
			Conns: 4, MsgsPerSec: 200, BytesPerSec: 256 << 10},
	}
}
