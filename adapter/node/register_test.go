package node

import (
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

// Every node registers on its node-bound subject; a sandboxed agent says
// trust_tier "sandbox", so the registry files it as a sandbox (unlisted,
// no mailbox) whichever node key its runtime uses (H1, runtime side).
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
		found := false
		bound.mu.Lock()
		for _, m := range bound.msgs {
			if m.Subject == protocol.SubjRegister+"."+n.ID() {
				if e, err := protocol.Decode(m.Data); err == nil && e.From == k.Public() {
					found = true
				}
			}
		}
		bound.mu.Unlock()
		if !found {
			t.Fatalf("%s: no registration on %s.%s", name, protocol.SubjRegister, n.ID())
		}
	}

	// A node credential: not a sandbox.
	k := agentKey(t)
	check("node", tm.startNode(t, nodeKey(t), []*keys.Agent{k}, nil), k, false)

	// A guest whose runtime uses the guest key as its node key.
	guest := agentKey(t)
	nk, err := keys.FromSeed[keys.NodeRole](guest.Seed())
	if err != nil {
		t.Fatal(err)
	}
	check("guest", tm.guestNode(t, guest, nk), guest, true)

	// A guest whose runtime uses a separate node key: the manifest's
	// trust_tier still makes it a sandbox.
	guest2 := agentKey(t)
	check("guest with its own node key", tm.guestNode(t, guest2, nodeKey(t)), guest2, true)

	if bare.len() != 0 {
		t.Fatalf("%d registrations on the bare %s", bare.len(), protocol.SubjRegister)
	}
}
