package devenv_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// The account views ask the bus: an agent whose node heartbeats is live, a
// request to it shows in the account's activity, and subscriptions need an
// agent in the catalog.
func TestAccountViews(t *testing.T) {
	c := startCP(t)
	acct, tok := c.signIn("ana@example.org")
	agent, node := newAgent(t), newNode(t)
	st, boot := c.post("/v1/bootstrap", map[string]any{"token": c.agentKey(acct, "coder"), "agent_id": agent.Public()}, "")
	if st != 200 {
		t.Fatalf("bootstrap: %d %v", st, boot)
	}
	st, out := c.do(http.MethodGet, "/v1/accounts/"+acct+"/agents", nil, tok)
	if st != 200 {
		t.Fatalf("agents: %d %v", st, out)
	}
	ags := out["agents"].([]any)
	if len(ags) != 1 || ags[0].(map[string]any)["live"] != false {
		t.Fatalf("before any heartbeat: %v", out)
	}

	nc, err := nats.Connect(c.m.URLs().MeshTCP, nats.UserCredentialBytes([]byte(boot["creds"].(string))))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// The agent registers on its node: live status follows the node its
	// registration names.
	now := time.Now()
	homeVouch, _ := protocol.NewVouch(node, agent.Public(), now, now.Add(time.Hour))
	registration := map[string]any{"id": agent.Public(), "name": "coder", "endpoint": protocol.InboxSubject(agent.Public()),
		"node": map[string]any{"id": node.Public(), "attestation": homeVouch}}
	rctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, err := bus.Call(rctx, nc, agent, protocol.SubjRegister, protocol.TypeRegister, "", registration); err != nil {
		t.Fatal(err)
	}
	heartbeat := func(from *keys.Node) {
		t.Helper()
		hb, _ := protocol.New(protocol.TypeEmit, from.Public(), map[string]any{"availability": "online", "agents": []string{agent.Public()}})
		_ = hb.Sign(from)
		b, _ := hb.Marshal()
		if err := nc.Publish(protocol.HeartbeatSubject(from.Public()), b); err != nil {
			t.Fatal(err)
		}
	}

	// Another node claims the agent in its beat: the beat is recorded, but
	// the agent is not live on it.
	intruder := newNode(t)
	heartbeat(intruder)
	sc, err := c.m.ConnectService("test-views")
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	viewer := &bus.Caller{NC: sc, Key: newAgent(t)}
	deadline := time.Now().Add(5 * time.Second)
	for {
		p, err := viewer.Call(rctx, protocol.SubjPresenceGet, protocol.TypeDiscover, map[string]any{"node": intruder.Public()})
		if err != nil {
			t.Fatal(err)
		}
		if nodes, _ := p["nodes"].([]any); len(nodes) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the intruder's beat was never recorded: %v", p)
		}
		time.Sleep(20 * time.Millisecond)
	}
	_, out = c.do(http.MethodGet, "/v1/accounts/"+acct+"/agents", nil, tok)
	if a := out["agents"].([]any)[0].(map[string]any); a["live"] != false || a["node"] != nil {
		t.Fatalf("live on a node that merely claims it: %v", out)
	}

	heartbeat(node)
	deadline = time.Now().Add(5 * time.Second)
	for {
		_, out = c.do(http.MethodGet, "/v1/accounts/"+acct+"/agents", nil, tok)
		a := out["agents"].([]any)[0].(map[string]any)
		if a["live"] == true && a["node"] == node.Public() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never live: %v", out)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// A request to the agent (signed by someone else), once the agent has
	// answered it on its outbox, is in its activity with the answer.
	caller := newAgent(t)
	req, _ := protocol.New(protocol.TypeRequest, caller.Public(), map[string]any{"offering": "chat", "input": map[string]any{"text": "secret words"}})
	req.To = agent.Public()
	_ = req.Sign(caller)
	rep, _ := protocol.NewReply(req, agent.Public(), map[string]any{"status": "completed", "output": map[string]any{"text": "secret answer"}})
	_ = rep.Sign(agent)
	b, _ := rep.Marshal()
	if err := nc.Publish(protocol.OutboxSubject(agent.Public()), b); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(5 * time.Second)
	for {
		_, out = c.do(http.MethodGet, "/v1/accounts/"+acct+"/activity", nil, tok)
		if items, _ := out["items"].([]any); len(items) == 2 {
			kinds := map[string]map[string]any{}
			for _, it := range items {
				kinds[it.(map[string]any)["kind"].(string)] = it.(map[string]any)
			}
			rq, rs := kinds["request"], kinds["response"]
			if rq["from"] != caller.Public() || rq["to"] != agent.Public() || rq["id"] != req.ID || rs["in_reply_to"] != req.ID || rs["status"] != "completed" {
				t.Errorf("activity items %v", items)
			}
			if s := mustJSON(out); strings.Contains(s, "secret words") || strings.Contains(s, "secret answer") {
				t.Errorf("content in the activity: %s", s)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no activity: %v", out)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Subscriptions: an agent not in the catalog is refused; none listed yet.
	if st, out := c.post("/v1/accounts/"+acct+"/subscriptions", map[string]any{"agent_id": newAgent(t).Public()}, tok); st != 404 {
		t.Errorf("subscribe to an unlisted agent: %d %v", st, out)
	}
	if st, out := c.do(http.MethodGet, "/v1/accounts/"+acct+"/subscriptions", nil, tok); st != 200 || len(out["subscriptions"].([]any)) != 0 {
		t.Errorf("subscriptions: %d %v", st, out)
	}
	// Registered publicly, the agent is in the catalog and can be followed.
	vouch, err := protocol.NewVouch(node, agent.Public(), time.Now(), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	manifest := map[string]any{"id": agent.Public(), "name": "coder", "endpoint": protocol.InboxSubject(agent.Public()),
		"node": map[string]any{"id": node.Public(), "attestation": vouch}, "capabilities": []string{"code"},
		"offerings": []any{map[string]any{"id": "chat", "name": "Chat"}}, "visibility": "public", "availability_class": "always_on"}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, err := bus.Call(ctx, nc, agent, protocol.SubjRegister, protocol.TypeRegister, "", manifest); err != nil {
		t.Fatalf("register: %v", err)
	}
	// The catalog follows the registry within moments.
	deadline = time.Now().Add(5 * time.Second)
	for {
		st, out := c.post("/v1/accounts/"+acct+"/subscriptions", map[string]any{"agent_id": agent.Public()}, tok)
		if st == 201 {
			break
		}
		if st != 404 || time.Now().After(deadline) {
			t.Fatalf("subscribe: %d %v", st, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	st, out = c.do(http.MethodGet, "/v1/accounts/"+acct+"/subscriptions", nil, tok)
	subs := out["subscriptions"].([]any)
	if st != 200 || len(subs) != 1 || subs[0].(map[string]any)["entry"].(map[string]any)["name"] != "coder" {
		t.Errorf("subscriptions: %d %v", st, out)
	}
	if st, _ := c.do(http.MethodDelete, "/v1/accounts/"+acct+"/subscriptions/"+agent.Public(), nil, tok); st != 200 {
		t.Error("unsubscribe")
	}
}
