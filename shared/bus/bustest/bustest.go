// Package bustest starts a real in-process mesh for worker tests and hands
// out the environments of worker copies and of clients.
package bustest

import (
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/devenv"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/keys"
)

// Mesh starts a mesh on random ports in a temp dir, stopped at cleanup.
func Mesh(t testing.TB) *devenv.Mesh {
	t.Helper()
	// No built-in workers: a worker test starts the copies it counts.
	m, err := devenv.Start(t.Context(), devenv.Config{DataDir: t.TempDir(), Workers: devenv.WorkerConfig{None: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// Env is the environment of one worker copy: its own service connection,
// the mesh's services key, and the given clock (nil: time.Now).
func Env(t testing.TB, m *devenv.Mesh, name string, now func() time.Time) bus.Env {
	t.Helper()
	nc, err := m.ConnectService(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if now == nil {
		now = time.Now
	}
	return bus.Env{NC: nc, Key: m.ServicesKey(), Log: slog.New(slog.DiscardHandler), Now: now}
}

// Client is a service connection for a test's own calls and subscriptions.
func Client(t testing.TB, m *devenv.Mesh) *nats.Conn {
	t.Helper()
	nc, err := m.ConnectService("test-client")
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
