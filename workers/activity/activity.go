// Package activity is the bus adapter of the activity worker: one copy of
// shared/activity (taps, timeline, usage counters, catalog) with its
// defaults. Official catalog entries are named by the caller.
package activity

import (
	"context"

	"agentmesh.dev/mesh/shared/activity"
	"agentmesh.dev/mesh/shared/bus"
)

// Start runs one copy of the activity worker in env; official lists the
// agent ids the catalog marks official.
func Start(ctx context.Context, env bus.Env, official ...string) (*activity.Worker, error) {
	return activity.Start(ctx, env, activity.Config{Official: official})
}
