package creds

import (
	"fmt"
	"slices"

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
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// Guarded reports whether credentials of this kind pass the guard before
// they are signed: every kind that can leave the process.
func (k Kind) Guarded() bool {
	switch k {
	case KindNode, KindBootstrap, KindApp, KindGuest, KindJob:
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
	subjReplies     = "_INBOX.>" // request replies, JetStream API replies and pull deliveries
	roomsPrefix     = "mesh.rooms."
	artifactsPrefix = "mesh.artifacts."
	boardPrefix     = "mesh.board."
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

// The guest's extra denies: a sandbox has no mailbox, so no JetStream API
// call and no acknowledgement is ever needed.
const (
	denyJSAPI = "$JS.API.>"
	denyJSAck = "$JS.ACK.>"
)

// RequiredDenies returns the four namespaces every guarded credential must
// deny for both publish and subscribe.
func RequiredDenies() []string { return []string{denyKV, denyPeer, denyACLRoom, denySys} }

// guestDenies are RequiredDenies plus the JetStream API and ack namespaces.
func guestDenies() []string { return append(RequiredDenies(), denyJSAPI, denyJSAck) }

// NodePermissions is the permission set of a node credential hosting agents
// (spec §4.6), and exactly that set:
//
// Publish, once for the node: mesh.registry.>, mesh.agent.*.inbox (one
// token wildcard: it does not reach the five-token .inbox.guarded),
// mesh.task.>, mesh.event.>, mesh.presence.get, mesh.heartbeat.*,
// mesh.feed.get, mesh.admission.guard, mesh.admission.unguard, every verb of
// mesh.rooms, mesh.artifacts and mesh.board one by one, _INBOX.>, and the
// mailbox stream-info subject.
//
// Publish, per hosted agent: its outbox, its trace subject, its own feeds
// mesh.feed.<agent>.*, and its own mailbox consumer's info, next and ack
// subjects.
//
// Subscribe: per hosted agent its inbox, guarded inbox and outbox; then
// mesh.event.>, mesh.task.>, mesh.feed.*.* and _INBOX.>.
//
// Denied both ways: $KV.>, mesh.peer.>, mesh.aclroom.>, $SYS.>.
//
// The builder does not check the roster; the guard (run by MintUser) refuses
// an empty, oversized, duplicated or malformed one.
func NodePermissions(agents []string) Permissions {
	return nodeLike(agents, true)
}

// BootstrapPermissions is the connection credential issued by an am_ key
// exchange (spec §4.5): the node set for a roster of that one agent.
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
func BootstrapPermissions(agent string) Permissions {
	return nodeLike([]string{agent}, true)
}

// AppPermissions is an app's durable credential: the app key is both the
// credential key and an agent the app hosts, so it is the node set for a
// roster of that one key.
func AppPermissions(appKey string) Permissions {
	return nodeLike([]string{appKey}, true)
}

// GuestPermissions is the sandbox fence of a leased guest credential whose
// key is also the guest agent's key. It is the node set of a node hosting
// only that key, less everything a sandbox does not get:
//
//   - no offline mailbox: no stream, consumer or ack subject, and $JS.API.>
//     and $JS.ACK.> are denied both ways on top of the four denies;
//   - no admission guard (so no guarded inbox either: only the admission
//     service publishes there, and it guards no sandbox);
//   - no rooms, artifacts or work board;
//   - of the registry, only the subjects it needs, and one register
//     subject: mesh.registry.register.<key>, the node-bound form pinned to
//     its own key (a guest is its own node). It reaches neither the
//     untokenized mesh.registry.register nor another key's bound subject,
//     so every registration sent with a guest credential arrives on a bound
//     subject, and the registry marks every bound-subject registration
//     sandbox: the broker's pin, not a member the sender chose, is what
//     makes a guest's registration sandbox (RuleSandboxRegister keeps it so).
//
// Publish: mesh.registry.register.<key>, mesh.registry.deregister,
// mesh.registry.discover, mesh.registry.get.*, mesh.registry.nodes.list,
// mesh.agent.*.inbox, mesh.task.>, mesh.event.>, mesh.presence.get,
// mesh.heartbeat.*, mesh.feed.get, _INBOX.>, and for the guest key its
// outbox, trace subject and feeds mesh.feed.<key>.*.
// Subscribe: its inbox and outbox, mesh.event.>, mesh.task.>, mesh.feed.*.*,
// _INBOX.>. Denied both ways: $KV.>, mesh.peer.>, mesh.aclroom.>, $SYS.>,
// $JS.API.>, $JS.ACK.>.
func GuestPermissions(publicKey string) Permissions {
	return nodeLike([]string{publicKey}, false)
}

// JobPermissions is the narrow credential of one job: the performing agent
// reports on one task and nothing else.
//
// Publish: mesh.task.<task>.update, mesh.task.<task>.stream,
// mesh.task.get.<task>, mesh.agent.<agent>.outbox, mesh.trace.<agent>,
// _INBOX.>. Subscribe: mesh.task.<task>.>, _INBOX.>. Denied both ways:
// $KV.>, mesh.peer.>, mesh.aclroom.>, $SYS.>.
//
// taskID must be one subject token (protocol.ValidToken); the guard refuses
// a wildcard in the task position.
func JobPermissions(agent, taskID string) Permissions {
	return Permissions{
		PubAllow: []string{
			protocol.TaskUpdateSubject(taskID),
			protocol.TaskStreamSubject(taskID),
			protocol.TaskGetSubject(taskID),
			protocol.OutboxSubject(agent),
			protocol.TraceSubject(agent),
			subjReplies,
		},
		SubAllow: []string{"mesh.task." + taskID + ".>", subjReplies},
		PubDeny:  RequiredDenies(),
		SubDeny:  RequiredDenies(),
	}
}

// ServicePermissions is the set of the internal workers: everything in the
// mesh account, which they need ($JS.API.> for streams and consumers, $KV.>
// for the buckets, every service subject), except the broker's system
// namespace. JetStream works without $SYS: its API lives on $JS.API in the
// account itself (TestServicePermissionsKeepJetStream). These credentials are
// never guarded and must never leave the process.
func ServicePermissions() Permissions {
	return Permissions{
		PubAllow: []string{">"},
		SubAllow: []string{">"},
		PubDeny:  []string{denySys},
		SubDeny:  []string{denySys},
	}
}

// nodeLike builds the node set for agents; full is false for the guest's
// sandbox cut.
func nodeLike(agents []string, full bool) Permissions {
	var pub []string
	if full {
		pub = append(pub, subjRegistryAll)
	} else {
		pub = append(pub, guestRegistrySubjects(agents)...)
	}
	pub = append(pub,
		protocol.InboxSubject("*"),
		subjTaskAll,
		protocol.EventSubject(">"),
		protocol.SubjPresenceGet,
		protocol.HeartbeatSubject("*"),
		protocol.SubjFeedGet,
	)
	if full {
		pub = append(pub, protocol.SubjAdmissionGuard, protocol.SubjAdmissionUnguard)
		pub = appendVerbs(pub, roomsPrefix, protocol.RoomVerbs)
		pub = appendVerbs(pub, artifactsPrefix, protocol.ArtifactVerbs)
		pub = appendVerbs(pub, boardPrefix, protocol.BoardVerbs)
	}
	pub = append(pub, subjReplies)
	if full {
		pub = append(pub, protocol.MailboxStreamInfoSubject())
	}
	var sub []string
	for _, a := range agents {
		pub = append(pub,
			protocol.OutboxSubject(a),
			protocol.TraceSubject(a),
			protocol.FeedSubject(a, "*"),
		)
		if full {
			pub = append(pub, mailboxSubjects(a)...)
		}
		sub = append(sub, protocol.InboxSubject(a))
		if full {
			sub = append(sub, protocol.GuardedInboxSubject(a))
		}
		sub = append(sub, protocol.OutboxSubject(a))
	}
	sub = append(sub,
		protocol.EventSubject(">"),
		subjTaskAll,
		protocol.FeedSubject("*", "*"),
		subjReplies,
	)
	deny := RequiredDenies()
	if !full {
		deny = guestDenies()
	}
	return Permissions{PubAllow: pub, PubDeny: deny, SubAllow: sub, SubDeny: slices.Clone(deny)}
}

// registerBound is the node-bound register subject of key,
// mesh.registry.register.<key> (upstream clause b).
func registerBound(key string) string { return protocol.SubjRegister + "." + key }

// guestRegistrySubjects are the registry subjects a guest publishes on, in
// place of mesh.registry.>: the bound register subject of its own key (and
// of no other, RuleSandboxRegister), deregister, discover, get and the node
// list.
func guestRegistrySubjects(agents []string) []string {
	var out []string
	for _, a := range agents {
		out = append(out, registerBound(a))
	}
	return append(out,
		protocol.SubjDeregister,
		protocol.SubjDiscover,
		protocol.RegistryGetSubject("*"),
		protocol.SubjNodesList,
	)
}

// mailboxSubjects are the JetStream subjects one agent's node publishes on
// its own mailbox consumer: info, next and the acknowledgements, in both ack
// layouts. Guard checks each ack pattern reaches no other consumer
// (ackGrantSafe): a looser v2 pattern, $JS.ACK.*.*.MESH_MAILBOX.inbox_<a>.>,
// also matched nine-token subjects the broker routes by the v1 layout, so a
// node could send "+NXT" to another agent's consumer and read its mail
// (TestLooseAckGrantReadsOtherMailboxes); protocol.MailboxAckSubjects pins
// both layouts' token counts for that reason.
func mailboxSubjects(agent string) []string {
	return append([]string{
		protocol.MailboxConsumerInfoSubject(agent),
		protocol.MailboxNextSubject(agent),
	}, protocol.MailboxAckSubjects(agent)...)
}

func appendVerbs(dst []string, prefix string, verbs []string) []string {
	for _, v := range verbs {
		dst = append(dst, prefix+v)
	}
	return dst
}
