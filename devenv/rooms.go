package devenv

import (
	"context"
	"sync/atomic"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/registrar"
	"agentmesh.dev/mesh/shared/rooms"
)

// registrarOwners resolves room creators with the mesh's own registrar, in
// process (rooms.Owners): the handle bound to the agent, and its operator
// (account.OperatorID of the handle's address, as the card's operator.id)
// whose quota the room counts against. The registrar is built
// with the control plane, after the workers start, so until then it
// answers UNAVAILABLE.
type registrarOwners struct {
	reg atomic.Pointer[registrar.Service]
}

func (o *registrarOwners) Owner(ctx context.Context, agentID string) (rooms.Owner, error) {
	reg := o.reg.Load()
	if reg == nil {
		return rooms.Owner{}, errs.New(errs.Unavailable, "the registrar is not running yet; retry shortly")
	}
	h, err := reg.Lookup(ctx, "", agentID)
	switch {
	case errs.CodeOf(err) == errs.NotFound:
		return rooms.Owner{}, errs.Newf(errs.NotNamed, "agent %s is bound to no handle: claim one and pair this agent (mesh-adapter join), then try again", agentID)
	case err != nil:
		return rooms.Owner{}, errs.OrUnavailable(err, "the registrar could not be asked who owns this agent; retry shortly")
	case h.AgentID != agentID || h.Email == "":
		// A handle reserved with no agent bound does not name one.
		return rooms.Owner{}, errs.Newf(errs.NotNamed, "agent %s is bound to no handle: pair it with your handle, then try again", agentID)
	}
	return rooms.Owner{Handle: h.Handle, Operator: account.OperatorID(h.Email)}, nil
}
