package node

import (
	"context"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// guestNode starts a node on a guest credential: the guest key is the
// credential key and the agent, and nk is the node key the runtime signs
// vouches and heartbeats with.
func (tm *testMesh) guestNode(t *testing.T, guest *keys.Agent, nk *keys.Node) *Node {
	t.Helper()
	tok, err := tm.m.Trust().MintUser(creds.UserSpec{PublicKey: guest.Public(), Name: "guest", Kind: creds.KindGuest,
		Hosted: []string{guest.Public()}, Permissions: creds.GuestPermissions(guest.Public()), Expires: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	n, err := Start(t.Context(), Config{NATSURL: tm.m.URLs().MeshTCP, NodeKey: nk, Credential: Credential{JWT: tok, Sign: guest.SignNonce}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}

// A sandboxed agent (a guest, whose key is its node key) registers on its
// node-bound subject and says trust_tier "sandbox", so the registry files
// it as a sandbox (unlisted, no mailbox); any other agent registers on the
// bare subject and stays public. A guest whose runtime uses another node
// key cannot register at all: the broker pins the guest's register subject
// to its own key.
func TestRegistrationIsNodeBoundAndSandboxSaysSo(t *testing.T) {
	tm := newMesh(t)
	bound := tm.collect(t, protocol.SubjRegister+".>")
	bare := tm.collect(t, protocol.SubjRegister)

	check := func(name string, n *Node, k *keys.Agent, sandbox bool) {
		t.Helper()
		a := tm.host(t, n, AgentConfig{Key: k, Name: name, Sandbox: sandbox, Visibility: "public", Handler: refuseAll})
		man := tm.registered(t, k, k.Public())
		wantVis, wantTier := "public", any(nil)
		if sandbox {
			wantVis, wantTier = "unlisted", "sandbox"
		}
		if man["sandbox"] != sandbox || man["visibility"] != wantVis || man["trust_tier"] != wantTier || a.Sandbox() != sandbox {
			t.Fatalf("%s: registry sandbox=%v visibility=%v trust_tier=%v; runtime Sandbox()=%v",
				name, man["sandbox"], man["visibility"], man["trust_tier"], a.Sandbox())
		}
		want, c := protocol.SubjRegister, bare
		if sandbox {
			want, c = protocol.SubjRegister+"."+n.ID(), bound
		}
		// The collector's copy may arrive after the registry answered.
		eventually(t, name+": a registration on "+want, func() bool {
			c.mu.Lock()
			defer c.mu.Unlock()
			for _, m := range c.msgs {
				if m.Subject == want {
					if e, err := protocol.Decode(m.Data); err == nil && e.From == k.Public() {
						return true
					}
				}
			}
			return false
		})
	}

	// A node credential: not a sandbox, on the bare subject.
	k := agentKey(t)
	check("node", tm.startNode(t, nodeKey(t), []*keys.Agent{k}, nil), k, false)

	// A guest whose runtime uses the guest key as its node key.
	guest := agentKey(t)
	nk, err := keys.FromSeed[keys.NodeRole](guest.Seed())
	if err != nil {
		t.Fatal(err)
	}
	check("guest", tm.guestNode(t, guest, nk), guest, true)

	// A guest whose runtime uses a separate node key is refused by the
	// broker: Host fails rather than leaving an unregistered agent.
	guest2 := agentKey(t)
	n2 := tm.guestNode(t, guest2, nodeKey(t))
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	if _, err := n2.Host(ctx, AgentConfig{Key: guest2, Name: "guest2", Sandbox: true, Handler: refuseAll}); err == nil {
		t.Fatal("a guest registered under a node key other than its own")
	}
}

// TestNodeProfileInTheNodesList: what a node declares (Config.Profile) and
// what its heartbeat reports reach mesh.registry.nodes.list through the
// registry and presence workers, with the node's live status and its
// hosted-agent count.
func TestNodeProfileInTheNodesList(t *testing.T) {
	tm := newMesh(t)
	nk, ka, kb := nodeKey(t), agentKey(t), agentKey(t)
	profile := Profile{Role: "build box", Reachability: "direct", Capacity: 4,
		Device: Device{Kind: "server", Host: "ci-7", Platform: "linux/amd64"}}
	n := tm.startNode(t, nk, []*keys.Agent{ka, kb}, func(c *Config) { c.Profile = profile })
	tm.host(t, n, AgentConfig{Key: ka, Name: "a", AvailabilityClass: "always_on", Handler: refuseAll})
	tm.host(t, n, AgentConfig{Key: kb, Name: "b", Visibility: "unlisted", Handler: refuseAll})

	var entry map[string]any
	eventually(t, "the node live in the nodes list", func() bool {
		rep, err := bus.Call(t.Context(), tm.svc, ka, protocol.SubjNodesList, protocol.TypeDiscover, "", map[string]any{})
		if err != nil {
			t.Fatal(err)
		}
		var out struct {
			Nodes []map[string]any `json:"nodes"`
		}
		if err := rep.DecodePayload(&out); err != nil {
			t.Fatal(err)
		}
		for _, e := range out.Nodes {
			if e["node"] == nk.Public() && e["live"] == true {
				entry = e
				return true
			}
		}
		return false
	})
	dev, _ := entry["device"].(map[string]any)
	beat, _ := entry["heartbeat"].(map[string]any)
	if entry["role"] != "build box" || entry["reachability"] != "direct" || entry["capacity"] != 4.0 ||
		entry["availability_class"] != "always_on" || entry["hosted_agents"] != 2.0 || entry["availability"] != "online" ||
		dev["kind"] != "server" || dev["host"] != "ci-7" || dev["platform"] != "linux/amd64" ||
		beat["capacity"] != 4.0 || beat["uptime_seconds"] == nil || beat["active_tasks"] != 0.0 {
		t.Fatalf("node entry %v", entry)
	}
	if agents, _ := entry["agents"].([]any); len(agents) != 1 || agents[0] != ka.Public() {
		t.Fatalf("public agents of the node %v", entry["agents"])
	}
}
