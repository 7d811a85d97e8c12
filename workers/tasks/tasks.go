// Package tasks is the task manager worker: the bus adapter over
// shared/tasks with the production defaults (bucket mesh_tasks, 7 days,
// history 50, queue group mesh-tasks).
package tasks

import (
	"context"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/tasks"
)

// Start runs one copy of the task manager in env until Stop.
func Start(ctx context.Context, env bus.Env) (*tasks.Worker, error) {
	return tasks.Start(ctx, env, tasks.Config{})
}
