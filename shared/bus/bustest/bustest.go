// Package bustest starts a real in-process broker for worker tests (only the
// broker: shared/broker, not the control plane) and hands out the
// environments of worker copies and of clients.
package bustest

import (
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/broker"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/keys"
)

// Bus is a running broker with a fresh trust chain, and the services key
// the workers sign with.
type Bus struct {
	*broker.Broker
	servicesKey *keys.Agent
}

// ServicesKey is the key the workers of this bus sign with.
func (b *Bus) ServicesKey() *keys.Agent { return b.servicesKey }

// Start starts a broker on random loopback ports in a temp dir, with a
// fresh trust chain, stopped at cleanup. No worker runs: a worker test
// starts the copies it counts.
func Start(t testing.TB) *Bus {
	t.Helper()
	trust, err := creds.Generate()
	if err != nil {
		t.Fatal(err)
	}
	key, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		t.Fatal(err)
	}
	return StartWith(t, trust, key)
}

// StartWith starts a broker trusting trust, whose workers sign with key:
// for tests whose keys come from elsewhere (Secret Manager).
func StartWith(t testing.TB, trust *creds.Trust, key *keys.Agent) *Bus {
	t.Helper()
	b, err := broker.Start(t.Context(), broker.Config{DataDir: t.TempDir(), Trust: trust, Name: "bustest"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Shutdown)
	return &Bus{Broker: b, servicesKey: key}
}

// Env is the environment of one worker copy: its own service connection,
// the bus's services key, and the given clock (nil: time.Now).
func Env(t testing.TB, b *Bus, name string, now func() time.Time) bus.Env {
	t.Helper()
	nc, err := b.ConnectService(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if now == nil {
		now = time.Now
	}
	return bus.Env{NC: nc, Key: b.ServicesKey(), Log: slog.New(slog.DiscardHandler), Now: now}
}

// Client is a service connection for a test's own calls and subscriptions.
func Client(t testing.TB, b *Bus) *nats.Conn {
	t.Helper()
	nc, err := b.ConnectService("test-client")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Agent is a fresh agent key.
func Agent(t testing.TB) *keys.Agent {
	t.Helper()
	k, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// Node is a fresh node key.
func Node(t testing.TB) *keys.Node {
	t.Helper()
	k, err := keys.Generate[keys.NodeRole]()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// Clock is a test clock: real time plus an offset the test moves.
type Clock struct {
	off time.Duration
}

// Now is the clock's time.
func (c *Clock) Now() time.Time { return time.Now().Add(c.off) }

// Advance moves the clock forward. Not safe for concurrent use with Now;
// call it between steps.
func (c *Clock) Advance(d time.Duration) { c.off += d }
