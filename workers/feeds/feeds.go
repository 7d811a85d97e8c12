// Package feeds is the bus adapter of the feeds worker: one copy of
// shared/feeds with its defaults.
package feeds

import (
	"context"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/feeds"
)

// Start runs one copy of the feeds worker in env.
func Start(ctx context.Context, env bus.Env) (*feeds.Worker, error) {
	return feeds.Start(ctx, env, feeds.Config{})
}
