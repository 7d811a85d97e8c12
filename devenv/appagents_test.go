package devenv_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/devenv"
	"agentmesh.dev/mesh/shared/activity"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// The activity worker answers apps from the control plane's records on
// the bus (activity.AppAgentsPrefix in mesh_usage), never from the store,
// as in the cloud: each record is written when an app is created or
// refreshed, an agent is bound or retired, and deleted when the app is
// revoked or its account disabled; the credential sweep corrects a record
// the bus lost or kept too long. Over the broker, with app credentials, an
// app reads its own account's agents (one bound after it too) and is
// refused another account's; a revoked app is refused.
func TestAppRecordsOnTheBus(t *testing.T) { appRecordsOnTheBus(t) }

// The same on a three-server cluster, where mesh_usage is R3 and the
// worker reads each record from the bucket's leader.
func TestAppRecordsOnACluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-server cluster")
	}
	appRecordsOnTheBus(t, func(cfg *devenv.Config) {
		cfg.Cluster, cfg.ClusterResolverSync, cfg.Workers.Copies = 3, 200*time.Millisecond, 2
	})
}

func appRecordsOnTheBus(t *testing.T, mut ...func(*devenv.Config)) {
	c := startCP(t, mut...)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	acct, tok := c.signIn("apps@example.org")
	other, _ := c.signIn("elsewhere@example.org")
	agent, later, foreign := newAgent(t), newAgent(t), newAgent(t)
	bootstrap := func(account, label string, k *keys.Agent) {
		t.Helper()
		if st, out := c.post("/v1/bootstrap", map[string]any{"token": c.agentKey(account, label), "agent_id": k.Public()}, ""); st != 200 {
			t.Fatalf("bootstrap %s: %d %v", label, st, out)
		}
	}
	bootstrap(acct, "worker", agent)
	bootstrap(other, "theirs", foreign)

	svc, err := c.m.ConnectService("test-app-records")
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	js, err := jetstream.New(svc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, activity.UsageBucket)
	if err != nil {
		t.Fatal(err)
	}
	record := func(appKey string) ([]string, bool) {
		t.Helper()
		e, err := kv.Get(ctx, activity.AppAgentsPrefix+appKey)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, false
		}
		if err != nil {
			t.Fatal(err)
		}
		var v struct {
			Agents []string `json:"agents"`
		}
		if err := json.Unmarshal(e.Value(), &v); err != nil {
			t.Fatal(err)
		}
		return v.Agents, true
	}
	// want checks the app's record against what the store says
	// (credential.Service.AppAgents), and that it holds agents.
	want := func(appKey string, agents ...string) {
		t.Helper()
		got, ok := record(appKey)
		if !ok {
			t.Fatalf("app %s… has no record on the bus", appKey[:8])
		}
		fromStore, err := c.m.Control().Credentials.AppAgents(ctx, appKey)
		if err != nil || !slices.Equal(got, fromStore) {
			t.Errorf("record %v, the store says %v (%v)", got, fromStore, err)
		}
		for _, a := range agents {
			if !slices.Contains(got, a) {
				t.Errorf("app %s… record %v lacks %s…", appKey[:8], got, a[:8])
			}
		}
	}
	gone := func(appKey string) {
		t.Helper()
		if got, ok := record(appKey); ok {
			t.Errorf("app %s… still has a record: %v", appKey[:8], got)
		}
	}
	type app struct {
		id, key string
		signer  *keys.Agent
		nc      *nats.Conn
	}
	newApp := func(name string) app {
		t.Helper()
		st, out := c.post("/v1/accounts/"+acct+"/apps", map[string]any{"name": name}, tok)
		if st != 201 {
			t.Fatalf("app %s: %d %v", name, st, out)
		}
		signer, err := keys.FromSeed[keys.AgentRole]([]byte(out["seed"].(string)))
		if err != nil {
			t.Fatal(err)
		}
		nc, err := nats.Connect(c.m.URLs().MeshTCP, nats.UserCredentialBytes([]byte(out["creds"].(string))),
			nats.CustomInboxPrefix(out["inbox_prefix"].(string)), nats.NoReconnect())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return app{id: out["app_id"].(string), key: out["public_key"].(string), signer: signer, nc: nc}
	}
	// ask sends a listing about agent as the app, on the app's connection.
	ask := func(a app, nc *nats.Conn, subject string, agent *keys.Agent) error {
		t.Helper()
		_, err := bus.Call(ctx, nc, a.signer, subject, protocol.TypeDiscover, "", map[string]any{"agent": agent.Public(), "to": agent.Public()})
		return err
	}
	allowed := func(a app, mine ...*keys.Agent) {
		t.Helper()
		for _, s := range []string{protocol.SubjActivityList, protocol.SubjUsageList} {
			for _, k := range mine {
				if err := ask(a, a.nc, s, k); err != nil {
					t.Errorf("%s about its own account's agent %s… as app %s…: %v", s, k.Public()[:8], a.key[:8], err)
				}
			}
			if err := ask(a, a.nc, s, foreign); errs.CodeOf(err) != errs.Forbidden {
				t.Errorf("%s about another account's agent as app %s…: %v, want FORBIDDEN", s, a.key[:8], err)
			}
		}
	}

	// Created: the record names the account's agent and the app itself.
	first := newApp("dashboard")
	want(first.key, agent.Public(), first.key)
	allowed(first, agent)

	// An agent bound after the app: the app reads it at once.
	bootstrap(acct, "later", later)
	want(first.key, agent.Public(), later.Public())
	allowed(first, agent, later)

	// A second app: both records name both apps.
	second := newApp("reports")
	want(first.key, second.key)
	want(second.key, first.key, agent.Public(), later.Public())

	// A record the bus lost comes back with a refresh, and with the sweep;
	// a record of no live app goes with the sweep.
	if err := kv.Delete(ctx, activity.AppAgentsPrefix+first.key); err != nil {
		t.Fatal(err)
	}
	if err := ask(first, first.nc, protocol.SubjUsageList, agent); errs.CodeOf(err) != errs.Forbidden {
		t.Errorf("usage as an app without a record: %v, want FORBIDDEN", err)
	}
	if st, out := c.post("/v1/accounts/"+acct+"/apps/"+first.id+"/refresh", nil, tok); st != 200 {
		t.Fatalf("refresh: %d %v", st, out)
	}
	want(first.key, agent.Public())
	stray := newAgent(t).Public()
	if err := kv.Delete(ctx, activity.AppAgentsPrefix+second.key); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, activity.AppAgentsPrefix+stray, []byte(`{"agents":["`+foreign.Public()+`"]}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, activity.AppAgentsPrefix+first.key, []byte(`{"agents":["`+foreign.Public()+`"]}`)); err != nil {
		t.Fatal(err)
	}
	if n, err := c.m.Control().Credentials.Sweep(ctx); err != nil || n != 3 {
		t.Errorf("sweep: %d corrections, %v; want 3", n, err)
	}
	want(first.key, agent.Public())
	want(second.key, agent.Public())
	gone(stray)
	allowed(first, agent, later)
	allowed(second, agent, later)
	if n, err := c.m.Control().Credentials.Sweep(ctx); err != nil || n != 0 {
		t.Errorf("sweep with nothing to correct: %d, %v", n, err)
	}

	// Retiring an agent leaves it readable (the account bound it once).
	if err := c.m.Control().Credentials.RetireAgent(ctx, later.Public(), "replaced"); err != nil {
		t.Fatal(err)
	}
	want(first.key, later.Public())

	// Revoked: the record goes, and the app's key is refused even on a
	// connection the broker did not cut (a service's, signed by the app).
	if st, out := c.do(http.MethodDelete, "/v1/accounts/"+acct+"/apps/"+first.id, nil, tok); st/100 != 2 {
		t.Fatalf("revoke: %d %v", st, out)
	}
	gone(first.key)
	for _, s := range []string{protocol.SubjActivityList, protocol.SubjUsageList} {
		if err := ask(first, svc, s, agent); errs.CodeOf(err) != errs.Forbidden {
			t.Errorf("%s as the revoked app: %v, want FORBIDDEN", s, err)
		}
	}
	want(second.key, first.key)
	allowed(second, agent)

	// A disabled account's apps have no record.
	if err := c.m.Control().Credentials.DisableAccount(ctx, acct, "terms"); err != nil {
		t.Fatal(err)
	}
	gone(second.key)
	if err := ask(second, svc, protocol.SubjUsageList, agent); errs.CodeOf(err) != errs.Forbidden {
		t.Errorf("usage as an app of a disabled account: %v, want FORBIDDEN", err)
	}
	if n, err := c.m.Control().Credentials.Sweep(ctx); err != nil || n != 0 {
		t.Errorf("sweep after the disabling: %d, %v", n, err)
	}
}
