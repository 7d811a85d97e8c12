package devenv_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/devenv"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/registry"
)

// A guest on the bus: its lease's key, its connection, and the agent it
// answered once (so the timeline and the counters hold rows for it).
type busGuest struct {
	k  *keys.Agent
	nc *nats.Conn
}

// leaseGuest takes a guest lease, registers the guest (its own node, on its
// own bound subject: the only register subject its credential reaches) and
// publishes one answer on its outbox.
func leaseGuest(t *testing.T, c *cp, peer *keys.Agent) busGuest {
	t.Helper()
	st, g := c.post("/v1/guest", nil, "")
	if st != 200 {
		t.Fatalf("guest lease: %d %v", st, g)
	}
	k, err := keys.FromSeed[keys.AgentRole]([]byte(g["seed"].(string)))
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(c.m.URLs().MeshTCP, nats.UserJWTAndSeed(g["jwt"].(string), g["seed"].(string)), nats.MaxReconnects(0), nats.CustomInboxPrefix(g["inbox_prefix"].(string)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	now := c.clock.Now()
	vouch, err := protocol.NewVouch(k, k.Public(), now, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	manifest := map[string]any{"id": k.Public(), "name": "guest", "endpoint": protocol.InboxSubject(k.Public()),
		"node": map[string]any{"id": k.Public(), "attestation": vouch}, "visibility": "public", "availability_class": "always_on"}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	rep, err := bus.Call(ctx, nc, k, protocol.SubjRegister+"."+k.Public(), protocol.TypeRegister, "", manifest)
	if err != nil {
		t.Fatalf("guest register: %v", err)
	}
	if m, _ := rep.PayloadValue(); m.(map[string]any)["sandbox"] != true {
		t.Fatalf("guest registration %v", m)
	}
	req, _ := protocol.New(protocol.TypeRequest, peer.Public(), map[string]any{"offering": "chat"})
	req.To = k.Public()
	ans, _ := protocol.NewReply(req, k.Public(), map[string]any{"status": "completed"})
	_ = ans.Sign(k)
	b, _ := ans.Marshal()
	if err := nc.Publish(protocol.OutboxSubject(k.Public()), b); err != nil {
		t.Fatal(err)
	}
	return busGuest{k: k, nc: nc}
}

// traces is what the bus still holds of agent: its registration, its
// timeline rows (either direction) and its counters.
func traces(t *testing.T, svc *bus.Caller, agent string) (registered bool, rows int, counted bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	_, err := svc.Call(ctx, protocol.RegistryGetSubject(agent), protocol.TypeDiscover, nil)
	switch {
	case err == nil:
		registered = true
	case errs.CodeOf(err) != errs.NotFound:
		t.Fatalf("registry get: %v", err)
	}
	for _, dir := range []string{"from", "to"} {
		out, err := svc.Call(ctx, protocol.SubjActivityList, protocol.TypeRequest, map[string]any{dir: agent})
		if err != nil {
			t.Fatal(err)
		}
		rows += int(out["total"].(float64))
	}
	out, err := svc.Call(ctx, protocol.SubjUsageList, protocol.TypeRequest, map[string]any{"agent": agent})
	if err != nil {
		t.Fatal(err)
	}
	return registered, rows, len(out["agents"].([]any)) > 0
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5 s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// When a guest lease ends, released or lapsed, the guest's registration is
// removed and its timeline rows and counters erased (spec §3.3, "guest
// lease" row), with registry.agent_reaped saying why; a non-guest agent's
// registration and its own rows are untouched, even when asked to evict it.
func TestGuestLeaseEndClearsTheBus(t *testing.T) {
	c := startCP(t, func(cfg *devenv.Config) { cfg.GuestIdleTTL = time.Minute })
	nc, err := c.m.ConnectService("test-observer")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// The control plane's way onto the bus: mesh.internal.guest.evict takes
	// only the services key.
	svc := &bus.Caller{NC: nc, Key: c.m.ServicesKey()}
	reaped, err := nc.SubscribeSync(protocol.EventSubject("registry." + registry.EventReaped))
	if err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()

	peer := newAgent(t)
	released, lapsed := leaseGuest(t, c, peer), leaseGuest(t, c, peer)
	for _, g := range []busGuest{released, lapsed} {
		eventually(t, "the guest's rows and counters", func() bool {
			reg, rows, counted := traces(t, svc, g.k.Public())
			return reg && rows == 2 && counted
		})
	}
	peerRows := func() int { _, rows, _ := traces(t, svc, peer.Public()); return rows }
	if n := peerRows(); n != 4 {
		t.Fatalf("the peer's rows: %d", n)
	}

	expectReaped := func(agent string) {
		t.Helper()
		m, err := reaped.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("no agent_reaped for %s: %v", agent, err)
		}
		env, err := protocol.Decode(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		var ev struct {
			Data map[string]any `json:"data"`
		}
		_ = json.Unmarshal(env.Payload, &ev)
		if ev.Data["agent_id"] != agent || ev.Data["reason"] != registry.ReasonLeaseEnded {
			t.Fatalf("reaped event %s", env.Payload)
		}
	}
	gone := func(g busGuest) {
		t.Helper()
		expectReaped(g.k.Public())
		if reg, rows, counted := traces(t, svc, g.k.Public()); reg || rows != 0 || counted {
			t.Fatalf("after the lease ended: registered %v, %d rows, counted %v", reg, rows, counted)
		}
	}

	// Released: cleared before the release answers.
	ts := c.clock.Now().Unix()
	rel := map[string]any{"publicKey": released.k.Public(), "ts": ts, "sig": protocol.SignGuestRelease(released.k, ts)}
	if st, out := c.post("/v1/guest/release", rel, ""); st != 200 {
		t.Fatalf("release: %d %v", st, out)
	}
	gone(released)
	if n := peerRows(); n != 2 {
		t.Fatalf("the peer keeps its rows with the other guest only: %d", n)
	}

	// Lapsed: the sweep ends it and clears it.
	c.clock.Advance(61 * time.Second)
	if n, err := c.m.Control().Guests.Sweep(t.Context()); err != nil || n != 1 {
		t.Fatalf("sweep: %d %v", n, err)
	}
	gone(lapsed)

	// A registered non-guest is not evicted, even when named.
	agent, node := newAgent(t), newNode(t)
	now := c.clock.Now()
	vouch, _ := protocol.NewVouch(node, agent.Public(), now, now.Add(time.Hour))
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	manifest := map[string]any{"id": agent.Public(), "name": "keeper", "endpoint": protocol.InboxSubject(agent.Public()),
		"node": map[string]any{"id": node.Public(), "attestation": vouch}, "visibility": "public", "availability_class": "always_on"}
	if _, err := bus.Call(ctx, nc, agent, protocol.SubjRegister, protocol.TypeRegister, "", manifest); err != nil {
		t.Fatal(err)
	}
	out, err := svc.Call(ctx, protocol.SubjGuestEvict, protocol.TypeRequest, map[string]any{"keys": []string{agent.Public()}})
	if err != nil || len(out["evicted"].([]any)) != 0 {
		t.Fatalf("evict a non-guest: %v %v", out, err)
	}
	if reg, _, _ := traces(t, svc, agent.Public()); !reg {
		t.Fatal("a non-guest registration was evicted")
	}
	if _, err := svc.Call(ctx, protocol.SubjGuestEvict, protocol.TypeRequest, map[string]any{"keys": []string{"nope"}}); errs.CodeOf(err) != errs.InvalidRequest {
		t.Fatalf("evict a non-key: %v", err)
	}
	if st, out := c.do(http.MethodGet, "/auth/status", nil, ""); st != 200 || out["issued"] != 0.0 {
		t.Errorf("auth/status %d %v", st, out)
	}
}
