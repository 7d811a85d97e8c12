package registry

import (
	"context"
	"errors"
	"fmt"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
)

// MaxRemove bounds one mesh.internal.registry.remove request: an account
// holds at most a few dozen agents.
const MaxRemove = 1000

// remove serves mesh.internal.registry.remove, which the control plane
// calls when it closes an account: {agents:[agent ids]} → {removed:[the
// ids whose registration this call removed]}. Unlike the guests' evict it
// removes any registration, sandbox or not, each by a compare-and-set
// delete, so copies removing at once remove (and emit
// registry.agent_reaped with reason account_closed for) each once. An
// agent with no registration is not an error: it may never have
// registered, or an earlier try removed it, so a closure that resumes
// asks again safely. Only the services key may call it (FORBIDDEN
// otherwise); the agents' credentials are revoked before it is called,
// so none registers again.
func (w *Worker) remove(ctx context.Context, r *bus.Request) (any, error) {
	if err := w.svc.RequireServices(r); err != nil {
		return nil, err
	}
	raw, ok := r.Object()["agents"].([]any)
	if !ok || len(raw) > MaxRemove {
		return nil, errs.Newf(errs.InvalidRequest, "remove takes {agents: [agent public keys]}, at most %d", MaxRemove)
	}
	seen := map[string]bool{}
	var targets []string
	for _, v := range raw {
		agent, ok := v.(string)
		if !ok || !keys.IsUserPublicKey(agent) {
			return nil, errs.Newf(errs.InvalidRequest, "remove: %v is not an agent's public key", v)
		}
		if !seen[agent] {
			seen[agent] = true
			targets = append(targets, agent)
		}
	}
	removed := []string{}
	var errList []error
	for _, agent := range targets {
		_, changed, err := bus.CAS(ctx, w.kv, agent, func(_ *record, exists bool) (*record, error) {
			if !exists {
				return nil, bus.ErrNoChange
			}
			return nil, nil
		})
		if err != nil {
			errList = append(errList, fmt.Errorf("remove %s: %w", agent, err))
			continue
		}
		if !changed {
			continue
		}
		removed = append(removed, agent)
		if err := w.svc.Emit(Name, EventReaped, map[string]any{"agent_id": agent, "reason": ReasonAccountClosed}); err != nil {
			w.log.Warn("emit", "event", EventReaped, "agent", agent, "err", err)
		}
	}
	if err := errors.Join(errList...); err != nil {
		return nil, errs.OrUnavailable(err, "the registry could not remove every registration; try again")
	}
	return map[string]any{"removed": removed}, nil
}
