package devenv_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// On a whole mesh, as decided in docs/bus.md "Who may call what": an app
// credential reads the catalog, and the activity and usage of its own
// account's agents (not another account's); a bootstrap credential reads
// the catalog and is refused the other two by the broker; GET
// /v1/accounts/:id/usage shows the account's counters.
func TestListingsOnTheMesh(t *testing.T) {
	c := startCP(t)
	acct, tok := c.signIn("lists@example.org")
	other, _ := c.signIn("other@example.org")
	agent, foreign := newAgent(t), newAgent(t)
	st, boot := c.post("/v1/bootstrap", map[string]any{"token": c.agentKey(acct, "worker"), "agent_id": agent.Public()}, "")
	if st != 200 {
		t.Fatalf("bootstrap: %d %v", st, boot)
	}
	if st, out := c.post("/v1/bootstrap", map[string]any{"token": c.agentKey(other, "theirs"), "agent_id": foreign.Public()}, ""); st != 200 {
		t.Fatalf("bootstrap of the other account: %d %v", st, out)
	}
	st, app := c.post("/v1/accounts/"+acct+"/apps", map[string]any{"name": "dashboard"}, tok)
	if st != 201 {
		t.Fatalf("app: %d %v", st, app)
	}
	appKey := app["public_key"].(string)
	appSigner, err := keys.FromSeed[keys.AgentRole]([]byte(app["seed"].(string)))
	if err != nil {
		t.Fatal(err)
	}

	bootErrs := make(chan error, 16)
	agentNC, err := nats.Connect(c.m.URLs().MeshTCP, nats.UserCredentialBytes([]byte(boot["creds"].(string))),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { bootErrs <- err }))
	if err != nil {
		t.Fatal(err)
	}
	defer agentNC.Close()
	appNC, err := nats.Connect(c.m.URLs().MeshTCP, nats.UserCredentialBytes([]byte(app["creds"].(string))),
		nats.CustomInboxPrefix(app["inbox_prefix"].(string)))
	if err != nil {
		t.Fatal(err)
	}
	defer appNC.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()

	// Traffic: the account's agent answers a request of the other
	// account's agent, and a request that fails.
	for i, status := range []string{"completed", "failed"} {
		req, _ := protocol.New(protocol.TypeRequest, foreign.Public(), map[string]any{"offering": "chat"})
		req.To = agent.Public()
		_ = req.Sign(foreign)
		payload := map[string]any{"status": status}
		if i == 1 {
			payload["error"] = map[string]any{"code": "INPUT_INVALID", "message": "no"}
		}
		rep, _ := protocol.NewReply(req, agent.Public(), payload)
		_ = rep.Sign(agent)
		b, _ := rep.Marshal()
		if err := agentNC.Publish(protocol.OutboxSubject(agent.Public()), b); err != nil {
			t.Fatal(err)
		}
	}

	// The catalog: both kinds may ask.
	for name, c := range map[string]struct {
		nc  *nats.Conn
		key *keys.Agent
	}{"bootstrap": {agentNC, agent}, "app": {appNC, appSigner}} {
		if _, err := bus.Call(ctx, c.nc, c.key, protocol.SubjCatalogList, protocol.TypeDiscover, "", map[string]any{}); err != nil {
			t.Errorf("catalog as %s: %v", name, err)
		}
	}

	// The app reads its account's agent's usage once the counters are in,
	// and its activity; never the other account's agent.
	var counters map[string]any
	for {
		rep, err := bus.Call(ctx, appNC, appSigner, protocol.SubjUsageList, protocol.TypeDiscover, "", map[string]any{})
		if err != nil {
			t.Fatalf("usage as the app: %v", err)
		}
		var u struct {
			Agents []map[string]any `json:"agents"`
		}
		_ = rep.DecodePayload(&u)
		if len(u.Agents) == 1 && u.Agents[0]["messages_out"] == 2.0 {
			counters = u.Agents[0]
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the app never saw its agent's counters: %+v", u)
		case <-time.After(50 * time.Millisecond):
		}
	}
	if counters["agent"] != agent.Public() || counters["errors"] != 1.0 {
		t.Errorf("counters %v", counters)
	}
	rep, err := bus.Call(ctx, appNC, appSigner, protocol.SubjActivityList, protocol.TypeDiscover, "", map[string]any{"from": agent.Public()})
	var l struct {
		Total int `json:"total"`
	}
	if err != nil || rep.DecodePayload(&l) != nil || l.Total != 2 {
		t.Errorf("activity of its own agent as the app: %v %+v", err, l)
	}
	for _, s := range []string{protocol.SubjActivityList, protocol.SubjUsageList} {
		_, err := bus.Call(ctx, appNC, appSigner, s, protocol.TypeDiscover, "", map[string]any{"agent": foreign.Public(), "to": foreign.Public()})
		if errs.CodeOf(err) != errs.Forbidden {
			t.Errorf("%s of another account's agent as the app: %v, want FORBIDDEN", s, err)
		}
	}

	// A bootstrap credential may not ask the timeline or the counters.
	for _, s := range []string{protocol.SubjActivityList, protocol.SubjUsageList} {
		if err := agentNC.Publish(s, []byte("{}")); err != nil {
			t.Fatal(err)
		}
		expectViolation(t, bootErrs, s)
	}

	// The account's HTTP view of the counters: every agent and app.
	st, out := c.do(http.MethodGet, "/v1/accounts/"+acct+"/usage", nil, tok)
	if st != 200 {
		t.Fatalf("usage view: %d %v", st, out)
	}
	rows := map[string]map[string]any{}
	for _, r := range out["agents"].([]any) {
		m := r.(map[string]any)
		rows[m["agent_id"].(string)] = m
	}
	if a := rows[agent.Public()]; len(rows) != 2 || a["kind"] != "agent" || a["label"] != "worker" || a["messages_in"] != 2.0 ||
		a["messages_out"] != 2.0 || a["errors"] != 1.0 || a["last_active"] == nil {
		t.Errorf("usage view: %v", out)
	}
	if a := rows[appKey]; a["kind"] != "app" || a["messages_in"] != 0.0 {
		t.Errorf("the app's row: %v", a)
	}
	if st, _ := c.do(http.MethodGet, "/v1/accounts/"+other+"/usage", nil, tok); st == 200 {
		t.Errorf("another account's usage view: %d", st)
	}
}
