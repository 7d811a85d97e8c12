// Command mailbox-worker runs the mailbox bus worker on its own (one Cloud
// Run service; every copy joins the same queue group). meshd runs the same
// worker in-process.
//
//	mailbox-worker --nats-url tls://nats.example:4222 --creds worker.creds --services-key services.nk
//
// MESH_MAILBOX_MAX_BYTES, MESH_MAILBOX_MAX_MSGS_PER_AGENT and
// MESH_MAILBOX_MAX_MSG_BYTES bound the mailbox stream (docs/security.md);
// unset means the defaults of shared/mailbox.
package main

import (
	"context"
	"fmt"
	"os"
	"strconv"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/mailbox"
	mailboxworker "agentmesh.dev/mesh/workers/mailbox"
	"agentmesh.dev/mesh/workers/workerkit"
)

func main() {
	l, err := limitsFromEnv(os.Getenv)
	if err != nil {
		fmt.Fprintf(os.Stderr, "mailbox-worker: %v\n", err)
		os.Exit(2)
	}
	workerkit.Main("mailbox", func(ctx context.Context, env bus.Env) (workerkit.Stopper, error) {
		return mailboxworker.Start(ctx, env, l)
	})
}

// limitsFromEnv reads the stream's limits once.
func limitsFromEnv(getenv func(string) string) (mailbox.Limits, error) {
	var l mailbox.Limits
	for _, v := range []struct {
		name string
		set  func(int64)
	}{
		{"MESH_MAILBOX_MAX_BYTES", func(n int64) { l.MaxBytes = n }},
		{"MESH_MAILBOX_MAX_MSGS_PER_AGENT", func(n int64) { l.MaxMsgsPerAgent = n }},
		{"MESH_MAILBOX_MAX_MSG_BYTES", func(n int64) { l.MaxMsgSize = int32(min(n, 1<<30)) }},
	} {
		s := getenv(v.name)
		if s == "" {
			continue
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			return l, fmt.Errorf("%s=%q: want a positive whole number", v.name, s)
		}
		v.set(n)
	}
	return l, nil
}
