package artifacts

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
)

// RegistryBucket is the registry's bucket of registrations, keyed by agent
// id (registry.Bucket). The store only reads it, and only to admit a
// caller: while it does not exist, nobody is registered.
const RegistryBucket = "mesh_registry"

// tierSandbox is the registry's trust tier of a sandbox registration.
const tierSandbox = "sandbox"

// mayStore refuses a caller that is not a registered agent outside the
// sandbox. The quota is per agent key, and keys cost nothing: counted for
// any key, it would bound nothing. A registration is what the mesh
// vouches for (its node attested it; a guest's or a self-declared sandbox
// one is not enough), so only those put and link. The registration is read
// through the bucket's stream leader, so an agent registered a moment ago,
// through another server, is admitted.
func (w *Worker) mayStore(ctx context.Context, agent string) error {
	raw, found, err := bus.LeaderGet(ctx, w.svc.NC, RegistryBucket, agent)
	if err != nil {
		var api *jetstream.APIError
		if !errors.As(err, &api) || api.ErrorCode != jetstream.JSErrCodeStreamNotFound {
			return errs.Wrap(errs.Unavailable, "the artifact store could not check the caller's registration; try again", err)
		}
		found = false // no registry yet: nobody is registered
	}
	if !found {
		return errs.Newf(errs.Forbidden, "agent %s is not registered: register it with mesh.registry.register first, then store artifacts", agent)
	}
	var rec struct {
		Sandbox   bool   `json:"sandbox"`
		TrustTier string `json:"trust_tier"`
	}
	if err := json.Unmarshal(raw, &rec); err != nil {
		return errs.Wrap(errs.Unavailable, "the artifact store could not read the caller's registration; try again", err)
	}
	if rec.Sandbox || rec.TrustTier == tierSandbox {
		return errs.Newf(errs.Forbidden, "agent %s has a sandbox registration, which cannot store artifacts: register it through a node that is not a guest, without trust_tier \"sandbox\"", agent)
	}
	return nil
}
