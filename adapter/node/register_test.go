package node

import (
	"context"
	"testing"
	"time"

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
