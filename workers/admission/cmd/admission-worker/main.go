// Command admission-worker runs the admission bus worker on its own (one Cloud Run
// service; every copy joins the same queue group). meshd runs the same
// worker in-process.
//
//	admission-worker --nats-url tls://nats.example:4222 --creds worker.creds --services-key services.nk
package main

import (
	"context"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/workers/admission"
	"agentmesh.dev/mesh/workers/workerkit"
)

func main() {
	workerkit.Main("admission", func(ctx context.Context, env bus.Env) (workerkit.Stopper, error) {
		return admission.Start(ctx, env)
	})
}
