package node

import (
	"context"
	"fmt"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// Registration reads agent's registry record (mesh.registry.get.<agent>),
// asked by signer: the manifest as registered, with what the registry adds
// (owner, sandbox, availability, ...). An agent that is not registered is
// NOT_FOUND. With Config.ServicesKey set, an answer signed by any other
// key is refused.
func (n *Node) Registration(ctx context.Context, signer keys.Signer, agent string) (map[string]any, error) {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.RequestTimeout)
	defer cancel()
	rep, err := bus.Call(ctx, n.nc, signer, protocol.RegistryGetSubject(agent), protocol.TypeDiscover, "", map[string]any{})
	if err != nil {
		return nil, err
	}
	if pin := n.cfg.ServicesKey; pin != "" && rep.From != pin {
		return nil, errs.Newf(errs.IdentityMismatch, "node: the registry answer is signed by %s, not the services key", rep.From)
	}
	var rec map[string]any
	if err := rep.DecodePayload(&rec); err != nil {
		return nil, fmt.Errorf("node: the registry answer for %s is not a record: %w", agent, err)
	}
	return rec, nil
}
