package devenv_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/protocol"
)

// On a whole mesh: an agent registered publicly enters the catalog, stays
// there (unavailable) when it deregisters, is made official by the
// operator's command, and is removed by the operator's command; a stopped
// mesh cannot change the catalog.
func TestCatalogOnTheMesh(t *testing.T) {
	c := startCP(t)
	acct, _ := c.signIn("cat@example.org")
	agent, node := newAgent(t), newNode(t)
	st, boot := c.post("/v1/bootstrap", map[string]any{"token": c.agentKey(acct, "lister"), "agent_id": agent.Public()}, "")
	if st != 200 {
		t.Fatalf("bootstrap: %d %v", st, boot)
	}
	nc, err := nats.Connect(c.m.URLs().MeshTCP, nats.UserCredentialBytes([]byte(boot["creds"].(string))))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	vouch, err := protocol.NewVouch(node, agent.Public(), time.Now(), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	manifest := map[string]any{"id": agent.Public(), "name": "lister", "endpoint": protocol.InboxSubject(agent.Public()),
		"node": map[string]any{"id": node.Public(), "attestation": vouch}, "tags": []string{"search"},
		"offerings": []any{map[string]any{"id": "find", "name": "Find"}}, "visibility": "public"}
	if _, err := bus.Call(ctx, nc, agent, protocol.SubjRegister, protocol.TypeRegister, "", manifest); err != nil {
		t.Fatalf("register: %v", err)
	}
	sc, err := c.m.ConnectService("test-catalog")
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	viewer := &bus.Caller{NC: sc, Key: newAgent(t)}
	entry := func(what string, ok func(e map[string]any) bool) map[string]any {
		t.Helper()
		for {
			out, err := viewer.Call(ctx, protocol.SubjCatalogList, protocol.TypeDiscover, map[string]any{})
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range out["entries"].([]any) {
				if m := e.(map[string]any); m["agent_id"] == agent.Public() && ok(m) {
					return m
				}
			}
			select {
			case <-ctx.Done():
				t.Fatalf("the catalog never showed %s: %v", what, out)
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	entry("the registered agent", func(e map[string]any) bool { return e["available"] == true })

	if _, err := bus.Call(ctx, nc, agent, protocol.SubjDeregister, protocol.TypeRegister, "", map[string]any{"agent_id": agent.Public()}); err != nil {
		t.Fatalf("deregister: %v", err)
	}
	gone := entry("the deregistered agent, unavailable", func(e map[string]any) bool { return e["available"] == false })
	if gone["name"] != "lister" || gone["official"] != false {
		t.Fatalf("after deregistration: %v", gone)
	}

	if st, out := c.adminPost("/admin/catalog/"+agent.Public()+"/official", map[string]any{"official": "on"}); st != 200 ||
		out["entry"].(map[string]any)["official"] != true {
		t.Fatalf("official on: %d %v", st, out)
	}
	entry("the operator's official flag", func(e map[string]any) bool { return e["official"] == true })
	if st, out := c.adminPost("/admin/catalog/"+agent.Public()+"/official", map[string]any{"official": "yes"}); st != 400 {
		t.Errorf("official yes: %d %v", st, out)
	}
	if st, out := c.adminPost("/admin/catalog/"+newAgent(t).Public()+"/official", map[string]any{"official": "on"}); st != 404 {
		t.Errorf("official for an agent never listed: %d %v", st, out)
	}
	if st, out := c.adminPost("/admin/catalog/"+agent.Public()+"/remove", map[string]any{}); st != 200 || out["removed"] != true {
		t.Fatalf("remove: %d %v", st, out)
	}
	out, err := viewer.Call(ctx, protocol.SubjCatalogList, protocol.TypeDiscover, map[string]any{})
	if err != nil || out["total"] != 0.0 {
		t.Fatalf("after the removal: %v %v", out, err)
	}
}
