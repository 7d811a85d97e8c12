// Package presence is the bus adapter of the presence worker: one copy of
// shared/presence with its defaults (offline after 60 s, sweep every 10 s).
package presence

import (
	"context"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/presence"
)

// Start runs one copy of the presence worker in env.
func Start(ctx context.Context, env bus.Env) (*presence.Worker, error) {
	return presence.Start(ctx, env, presence.Config{})
}
