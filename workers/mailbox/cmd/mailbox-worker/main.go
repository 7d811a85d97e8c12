// Command mailbox-worker runs the mailbox bus worker on its own (one Cloud
// Run service; every copy joins the same queue group). meshd runs the same
// worker in-process.
//
//	mailbox-worker --nats-url tls://nats.example:4222 --creds worker.creds --services-key services.nk
//
// MESH_LIMIT_MAILBOX_BYTES, MESH_LIMIT_MAILBOX_PER_AGENT,
// MESH_LIMIT_MAILBOX_MESSAGE and MESH_LIMIT_MAILBOX_UNREAD_AGE bound the
// mailbox stream and what it keeps for agents that do not fetch, as meshd's
// --limit-mailbox-* flags do (docs/security.md); unset means the defaults
// of shared/mailbox.
package main

import (
	"context"
	"fmt"
	"os"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/mailbox"
	"agentmesh.dev/mesh/shared/ratelimit"
	mailboxworker "agentmesh.dev/mesh/workers/mailbox"
	"agentmesh.dev/mesh/workers/workerkit"
)

func main() {
	l := mailbox.DefaultLimits
	if err := ratelimit.FromEnv(os.Getenv, l.Knobs()...); err != nil {
		fmt.Fprintf(os.Stderr, "mailbox-worker: %v\n", err)
		os.Exit(2)
	}
	workerkit.Main("mailbox", func(ctx context.Context, env bus.Env) (workerkit.Stopper, error) {
		return mailboxworker.Start(ctx, env, l)
	})
}
