package devenv_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/devenv"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/protocol"
)

// BenchmarkShutdownWithAgents measures what meshd's SIGTERM costs with
// thousands of agents: a mesh with MESH_BENCH_NODES (2,000 by default)
// node connections over TCP, each hosting one agent that registered with
// the registry (a mailbox each) and listens on its inbox, is shut down,
// and the time Shutdown took is reported as shutdown-ms (with how many
// registrations succeeded). Run it with
//
//	go test ./devenv/ -run '^$' -bench ShutdownWithAgents -benchtime 1x
//
// It asserts nothing about the time: the machine it runs on decides that.
func BenchmarkShutdownWithAgents(b *testing.B) {
	n := 2000
	if v, err := strconv.Atoi(os.Getenv("MESH_BENCH_NODES")); err == nil && v > 0 {
		n = v
	}
	for b.Loop() {
		d, registered := shutdownWithAgents(b, n)
		b.ReportMetric(float64(d.Milliseconds()), "shutdown-ms")
		b.ReportMetric(float64(registered), "registered")
	}
}

// shutdownWithAgents starts a mesh, connects n nodes with one registered
// agent each, and returns how long Shutdown took.
func shutdownWithAgents(tb testing.TB, n int) (time.Duration, int) {
	tb.Helper()
	ob, err := mail.NewOutbox(tb.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	m, err := devenv.Start(context.Background(), devenv.Config{DataDir: dir, Mail: ob})
	if err != nil {
		tb.Fatal(err)
	}
	defer m.Close()

	var registered atomic.Int64
	conns := make([]*nats.Conn, n)
	var wg sync.WaitGroup
	work := make(chan int)
	var firstErr atomic.Value
	for range 16 {
		wg.Go(func() {
			for i := range work {
				nc, err := connectAgentNode(m)
				if err != nil {
					firstErr.CompareAndSwap(nil, err)
					continue
				}
				conns[i] = nc.nc
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				if _, err := bus.Call(ctx, nc.nc, nc.agent, protocol.SubjRegister, protocol.TypeRegister, "", nc.manifest); err == nil {
					registered.Add(1)
				} else {
					firstErr.CompareAndSwap(nil, err)
				}
				cancel()
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		tb.Logf("first failure while setting up (of %d registered): %v", registered.Load(), err)
	}
	tb.Logf("%d node connections, %d agents registered; shutting down", n, registered.Load())

	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second) // meshd's budget
	defer cancel()
	if err := m.Shutdown(ctx); err != nil {
		tb.Errorf("Shutdown: %v", err)
	}
	d := time.Since(start)
	tb.Logf("Shutdown took %v", d)
	for _, nc := range conns {
		if nc != nil {
			nc.Close()
		}
	}
	// The broker goes on in the background; let it finish before the
	// directory is removed.
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if l, err := devenv.LockDataDir(dir, "bench"); err == nil {
			_ = l.Unlock()
			break
		}
	}
	return d, int(registered.Load())
}

type agentNode struct {
	nc       *nats.Conn
	agent    *keys.Agent
	manifest map[string]any
}

// connectAgentNode connects a node credential hosting one new agent, as
// mesh-adapter would, subscribes its inbox and returns its manifest.
func connectAgentNode(m *devenv.Mesh) (agentNode, error) {
	node, err := keys.Generate[keys.NodeRole]()
	if err != nil {
		return agentNode{}, err
	}
	agent, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		return agentNode{}, err
	}
	ids := []string{agent.Public()}
	jwtStr, err := m.Trust().MintUser(creds.UserSpec{PublicKey: node.Public(), Name: "bench node", Kind: creds.KindNode,
		Hosted: ids, Permissions: creds.NodePermissions(ids, creds.PrivateOnly(node.Public())), Expires: time.Now().Add(time.Hour)})
	if err != nil {
		return agentNode{}, err
	}
	nc, err := nats.Connect(m.URLs().MeshTCP, nats.UserJWT(func() (string, error) { return jwtStr, nil }, node.SignNonce),
		nats.MaxReconnects(0), nats.Timeout(10*time.Second), nats.CustomInboxPrefix(protocol.PrivateInboxPrefix(node.Public())))
	if err != nil {
		return agentNode{}, fmt.Errorf("connect: %w", err)
	}
	if _, err := nc.Subscribe(protocol.InboxSubject(agent.Public()), func(*nats.Msg) {}); err != nil {
		nc.Close()
		return agentNode{}, err
	}
	now := time.Now()
	v, err := protocol.NewVouch(node, agent.Public(), now, now.Add(24*time.Hour))
	if err != nil {
		nc.Close()
		return agentNode{}, err
	}
	man := map[string]any{"id": agent.Public(), "name": "bench " + agent.Public()[:8], "endpoint": protocol.InboxSubject(agent.Public()),
		"node":      map[string]any{"id": node.Public(), "attestation": v},
		"offerings": []any{map[string]any{"id": "chat", "name": "Chat"}}, "visibility": "public", "availability_class": "always_on"}
	return agentNode{nc: nc, agent: agent, manifest: man}, nil
}
