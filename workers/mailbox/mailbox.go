// Package mailbox is the bus adapter of the mailbox worker: one copy of
// shared/mailbox (fetch, acknowledge, the control plane's known question,
// and the sweep of mail nobody will read) with its defaults.
package mailbox

import (
	"context"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/mailbox"
)

// Start runs one copy of the mailbox worker in env with limits l (zero
// members take mailbox.DefaultLimits).
func Start(ctx context.Context, env bus.Env, l mailbox.Limits) (*mailbox.Worker, error) {
	return mailbox.Start(ctx, env, mailbox.Config{Limits: l})
}
