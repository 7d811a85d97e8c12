// Command presence-worker runs the presence bus worker on its own (one Cloud Run
// service; every copy joins the same queue group). meshd runs the same
// worker in-process.
//
//	presence-worker --nats-url tls://nats.example:4222 --creds worker.creds --services-key services.nk
package main

import (
	"context"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/workers/presence"
	"agentmesh.dev/mesh/workers/workerkit"
)

func main() {
	workerkit.Main("presence", func(ctx context.Context, env bus.Env) (workerkit.Stopper, error) {
		return presence.Start(ctx, env)
	})
}
