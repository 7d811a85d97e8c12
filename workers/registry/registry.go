// Package registry is the bus adapter of the registry worker: one copy of
// shared/registry with its defaults (reap every 10 min, sandbox
// registrations swept after 1 h of node silence).
package registry

import (
	"context"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/registry"
)

// Start runs one copy of the registry worker in env.
func Start(ctx context.Context, env bus.Env) (*registry.Worker, error) {
	return registry.Start(ctx, env, registry.Config{})
}
