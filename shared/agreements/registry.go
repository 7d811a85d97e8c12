package agreements

import (
	"context"
	"fmt"
	"time"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/jsonv"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/registry"
)

// RegistryBucket is the registry's bucket (registry.Bucket), read here by
// key: one record per agent id, the manifest as registered.
const RegistryBucket = "mesh_registry"

// Record is an agent's registry record as stored (generic JSON).
type Record map[string]any

// Owner is the agent's owner key at now, "" when it has none (a guest, an
// agent that would be its own owner, or an owner whose attestation has
// expired): registry.OwnerOf, the one reader of owners.
func (r Record) Owner(now time.Time) string { return registry.OwnerOf(r, now) }

// Sandbox reports whether the registry filed the agent as a sandbox
// (guest) registration.
func (r Record) Sandbox() bool {
	b, _ := r["sandbox"].(bool)
	return b
}

// SKUs are the SKUs the agent's manifest publishes (none: nil). The
// registry validated them at register; a record whose skus no longer
// validate is an error, never "no SKUs": that would make paid offerings
// free.
func (r Record) SKUs() ([]commerce.SKU, error) {
	raw, present := r["skus"]
	if !present || raw == nil {
		return nil, nil
	}
	if list, ok := jsonv.Array(raw); ok && len(list) == 0 {
		return nil, nil
	}
	return commerce.SKUsFromValue(raw)
}

// record reads agent's registry record from the bucket's stream leader
// (bus.LeaderGet): admission and filing are security decisions, and a
// follower may not yet have the newest registration, a re-pricing among
// them. found is false for an agent not registered.
func (w *Worker) record(ctx context.Context, agent string) (Record, bool, error) {
	if !keys.IsUserPublicKey(agent) {
		return nil, false, nil
	}
	b, found, err := bus.LeaderGet(ctx, w.svc.NC, RegistryBucket, agent)
	if err != nil || !found {
		return nil, false, err
	}
	v, err := protocol.ParseJSON(b)
	if err != nil {
		return nil, false, fmt.Errorf("registry record %s: %w", agent, err)
	}
	m, ok := jsonv.Object(v)
	if !ok {
		return nil, false, fmt.Errorf("registry record %s is not an object", agent)
	}
	return Record(m), true, nil
}

// sellerSKUs reads the seller's current SKUs: NOT_FOUND when it is not
// registered; UNAVAILABLE when its record cannot be read or its SKUs do
// not validate (fail closed: no decision is made from a record nobody can
// read).
func (w *Worker) sellerSKUs(ctx context.Context, seller string) ([]commerce.SKU, error) {
	rec, found, err := w.record(ctx, seller)
	if err != nil {
		return nil, errs.Wrap(errs.Unavailable, "the seller's registration could not be read just now; retry", err)
	}
	if !found {
		return nil, errs.Newf(errs.NotFound, "agent %s is not registered: it sells nothing here", seller)
	}
	skus, err := rec.SKUs()
	if err != nil {
		w.svc.Log.Error("a registered seller's SKUs do not validate", "seller", seller, "err", err)
		return nil, errs.Wrap(errs.Unavailable, "the seller's published SKUs could not be read; retry later", err)
	}
	return skus, nil
}

// ownerOf is the owner key of agent now, "" when it is not registered or
// has no owner (it then holds no agreement anywhere).
func (w *Worker) ownerOf(ctx context.Context, agent string) (string, error) {
	rec, found, err := w.record(ctx, agent)
	if err != nil {
		return "", errs.Wrap(errs.Unavailable, "the requester's registration could not be read just now; retry", err)
	}
	if !found {
		return "", nil
	}
	return rec.Owner(w.now()), nil
}
