package node_test

import (
	"context"
	"testing"
	"time"

	"agentmesh.dev/mesh/adapter/node"
	"agentmesh.dev/mesh/devenv"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
)

// startOn starts a node on m for agent k with a fresh node credential.
func startOn(t *testing.T, m *devenv.Mesh, nk *keys.Node, k *keys.Agent) *node.Node {
	t.Helper()
	ids := []string{k.Public()}
	jwtStr, err := m.Trust().MintUser(creds.UserSpec{PublicKey: nk.Public(), Kind: creds.KindNode, Hosted: ids,
		Permissions: creds.NodePermissions(ids, creds.PrivateOnly(nk.Public())), Expires: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.Start(t.Context(), node.Config{NATSURL: m.URLs().MeshTCP, NodeKey: nk,
		Credential: node.Credential{JWT: jwtStr, Sign: nk.SignNonce}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}

// A request sent while its recipient is offline waits in the mailbox
// through a restart of the whole mesh, and is answered to the sender's
// inbox when the recipient comes back.
func TestMailboxSurvivesAMeshRestart(t *testing.T) {
	dir := t.TempDir()
	start := func() *devenv.Mesh {
		m, err := devenv.Start(t.Context(), devenv.Config{DataDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	ka, kb := bustest.Agent(t), bustest.Agent(t)
	na, nb := bustest.Node(t), bustest.Node(t)
	echo := func(ctx context.Context, c *node.Call) error { return c.Reply(map[string]any{"text": "got it"}) }

	m1 := start()
	nB := startOn(t, m1, nb, kb)
	if _, err := nB.Host(t.Context(), node.AgentConfig{Key: kb, Name: "b", AvailabilityClass: "always_on",
		Offerings: []node.Offering{{ID: "echo", Name: "Echo"}}, Handler: echo}); err != nil {
		t.Fatal(err)
	}
	_ = nB.Close() // b is registered, with a mailbox, and offline
	nA := startOn(t, m1, na, ka)
	a, err := nA.Host(t.Context(), node.AgentConfig{Key: ka, Name: "a", Handler: echo})
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.Request(t.Context(), kb.Public(), "echo", "while you were out", node.RequestOptions{Timeout: 300 * time.Millisecond})
	if errs.CodeOf(err) != errs.TransportTimeout {
		t.Fatalf("request to an offline agent: %v", err)
	}
	reqID, _ := errs.As(err).Details["request_id"].(string)
	_ = nA.Close()
	if err := m1.Close(); err != nil {
		t.Fatal(err)
	}

	m2 := start()
	defer m2.Close()
	late := make(chan *node.Result, 4)
	nA2 := startOn(t, m2, na, ka)
	if _, err := nA2.Host(t.Context(), node.AgentConfig{Key: ka, Name: "a", Handler: echo, OnReply: func(r *node.Result) { late <- r }}); err != nil {
		t.Fatal(err)
	}
	nB2 := startOn(t, m2, nb, kb)
	if _, err := nB2.Host(t.Context(), node.AgentConfig{Key: kb, Name: "b", AvailabilityClass: "always_on",
		Offerings: []node.Offering{{ID: "echo", Name: "Echo"}}, Handler: echo}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-late:
		if r.RequestID != reqID || r.From != kb.Public() || r.Status != "completed" {
			t.Fatalf("late reply %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the request did not survive the restart")
	}
}
