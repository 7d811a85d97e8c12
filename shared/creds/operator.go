package creds

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"agentmesh.dev/mesh/shared/protocol"
)

// KindOperator is the operator's wide test credential (meshd admin
// operator-credential, docs/security.md "The operator test credential"):
// one connection that speaks for any agent key, which third-party
// conformance suites assume. It stands outside the iota run of the other
// kinds so that a kind added there never takes its value.
const KindOperator Kind = 100

// MaxOperatorLifetime bounds an operator credential: it is for a test run,
// and a leaked one reads every agent's traffic until it expires or is
// revoked.
const MaxOperatorLifetime = 24 * time.Hour

// OperatorLabel starts the JWT name of every operator credential, so a
// connection listing or a broker log names it for what it is.
const OperatorLabel = "OPERATOR TEST CREDENTIAL (wide: mesh.> and _INBOX.>)"

// OperatorTag is the JWT tag every operator credential carries; the broker
// reports it in connect events and connection listings.
const OperatorTag = "mesh-kind:operator"

// OperatorPermissions is the operator credential's set: publish and
// subscribe mesh.> and the shared _INBOX.>, and publish into the other
// reply spaces a client answers on (_MESH_INBOX.>, _MESH_RELAY.>), so a
// suite can answer this mesh's own clients. Denied both ways, as for every
// client credential: $KV.>, mesh.peer.>, mesh.aclroom.>, $SYS.> (spec
// §4.6), $JS.>, $O.>, mesh.internal.> (the workers' streams and internal
// subjects) and the services' reply prefix; subscribe also the relay's
// replies and every queue group (a member would take the workers' share of
// traffic). It subscribes no private prefix but reads every reply on the
// shared one: that is what it is for, and why it is short-lived.
func OperatorPermissions() Permissions {
	return Permissions{
		PubAllow: []string{"mesh.>", protocol.SharedInboxSpace, protocol.PrivateInboxSpace, protocol.RelayReplySpace},
		SubAllow: []string{"mesh.>", protocol.SharedInboxSpace},
		PubDeny:  MeshDenies(),
		SubDeny:  subDenies(),
	}
}

// checkOperator holds an operator credential to exactly its set, hosting
// nothing, expiring within MaxOperatorLifetime.
func checkOperator(spec UserSpec) error {
	want := OperatorPermissions()
	p := spec.Permissions
	switch {
	case len(spec.Hosted) > 0:
		return errors.New("an operator credential hosts no agent")
	case !slices.Equal(p.PubAllow, want.PubAllow) || !slices.Equal(p.SubAllow, want.SubAllow) ||
		!slices.Equal(p.PubDeny, want.PubDeny) || !slices.Equal(p.SubDeny, want.SubDeny):
		return errors.New("an operator credential carries exactly OperatorPermissions")
	case spec.Expires.IsZero():
		return errors.New("an operator credential must expire")
	case time.Until(spec.Expires) > MaxOperatorLifetime+time.Minute:
		return fmt.Errorf("an operator credential lives at most %s", MaxOperatorLifetime)
	}
	return nil
}
