package engagement

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/registry"
)

// AgentInfo is what the registry says of an agent, as the formation gates
// need it.
type AgentInfo struct {
	Registered bool
	// Owner is the agent's owner key when asked (registry.OwnerOf): the
	// attested owner while its attestation lasts, else its node's key; ""
	// when it has none (a guest, an agent that is its own node, or an
	// expired attestation), and then nobody signs for its seat.
	Owner string
	// Offerings are the ids of the offerings its manifest publishes.
	Offerings []string
	// SKUs: its manifest publishes at least one SKU.
	SKUs bool
}

// Directory answers AgentInfo at now (the owner an agent has depends on
// when it is asked).
type Directory interface {
	Agent(ctx context.Context, agent string, now time.Time) (AgentInfo, error)
}

// RegistryBucket is the registry's bucket (shared/registry), read by key.
const RegistryBucket = "mesh_registry"

// BusDirectory reads the registry's records from its bucket, at the
// stream's leader (bus.LeaderGet): a formation decision must not rest on a
// follower that has not yet seen a deregistration. It reads the bucket
// rather than asking mesh.registry.get, which hides a private agent from
// everyone but the agent and its node.
type BusDirectory struct{ NC *nats.Conn }

// Agent reads agent's registration.
func (b BusDirectory) Agent(ctx context.Context, agent string, now time.Time) (AgentInfo, error) {
	if !keys.IsUserPublicKey(agent) {
		return AgentInfo{}, nil
	}
	raw, found, err := bus.LeaderGet(ctx, b.NC, RegistryBucket, agent)
	if err != nil {
		return AgentInfo{}, fmt.Errorf("registry %s: %w", agent, err)
	}
	if !found {
		return AgentInfo{}, nil
	}
	var rec map[string]any
	if err := json.Unmarshal(raw, &rec); err != nil {
		return AgentInfo{}, fmt.Errorf("registry %s: %w", agent, err)
	}
	return InfoFromRecord(rec, now), nil
}

// InfoFromRecord reads AgentInfo from a registry record (the manifest as
// registered, plus what the registry adds) at now; the owner is
// registry.OwnerOf's, the one reader of owners.
func InfoFromRecord(rec map[string]any, now time.Time) AgentInfo {
	info := AgentInfo{Registered: true, Owner: registry.OwnerOf(rec, now)}
	for _, k := range []string{"offerings", "skills"} {
		list, _ := rec[k].([]any)
		for _, x := range list {
			if o, ok := x.(map[string]any); ok {
				if id, ok := o["id"].(string); ok {
					info.Offerings = append(info.Offerings, id)
				}
			}
		}
	}
	skus, _ := rec["skus"].([]any)
	info.SKUs = len(skus) > 0
	return info
}
