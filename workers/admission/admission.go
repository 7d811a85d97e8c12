// Package admission is the bus adapter of the admission worker: one copy of
// shared/admission with its defaults (relay timeout 35 s).
package admission

import (
	"context"

	"agentmesh.dev/mesh/shared/admission"
	"agentmesh.dev/mesh/shared/bus"
)

// Start runs one copy of the admission worker in env.
func Start(ctx context.Context, env bus.Env) (*admission.Worker, error) {
	return admission.Start(ctx, env, admission.Config{RelayTimeout: admission.DefaultRelayTimeout})
}
