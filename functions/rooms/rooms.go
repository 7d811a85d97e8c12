// Package rooms is the control plane's part of the durable rooms: the
// scheduled job that has the rooms worker expire idle rooms. The rooms'
// verbs are bus subjects (shared/rooms), not routes.
package rooms

import (
	"context"

	"agentmesh.dev/mesh/functions/api"
	"agentmesh.dev/mesh/shared/rooms"
)

// Routes is the group's route table.
var Routes = []api.Route{
	api.JobRoute("RoomSweep", "/jobs/room-sweep", rooms.SweepInterval, func(d *api.Deps) api.Job {
		if d.Bus == nil {
			return nil
		}
		return func(ctx context.Context) (int, error) { return rooms.CallSweep(ctx, d.Bus) }
	}),
}
