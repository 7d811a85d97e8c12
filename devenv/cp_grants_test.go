package devenv_test

import (
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/devenv"
	"agentmesh.dev/mesh/functions/api"
	"agentmesh.dev/mesh/shared/grant"
	"agentmesh.dev/mesh/shared/grant/googlefake"
	"agentmesh.dev/mesh/shared/passkey/passkeytest"
)

const (
	gRuntime  = "mesh-runtime@mesh-prod.iam.gserviceaccount.com"
	gDeployer = "mesh-deployer@mesh-prod.iam.gserviceaccount.com"
	gProject  = "acme-agents"
	gSA       = "mesh-agent@acme-agents.iam.gserviceaccount.com"
)

// startGrantsCP is a whole mesh whose control plane reaches a fake Google
// (one world) for its cloud grants, as meshd would reach the real one.
func startGrantsCP(t *testing.T, mut ...func(*devenv.Config)) (*cp, *googlefake.Fake) {
	t.Helper()
	g := googlefake.Start(t)
	tok := g.Provider(gRuntime, gDeployer)
	c := startCP(t, append([]func(*devenv.Config){func(cfg *devenv.Config) {
		cfg.Grants = api.Grants{Deployer: gDeployer, Google: &grant.Google{Self: g.Options(tok), As: g.Options}, CallTimeout: 5 * time.Second}
	}}, mut...)...)
	return c, g
}

// A customer's whole grant through the mesh's HTTP surface: the grant is
// verified in the POST, against the world, with the project read made as
// the customer's account; a deploy (after a passkey check) places a working
// agent key in the customer's Secret Manager — the key found there
// bootstraps an agent on this mesh — and runs the worker pool as the
// customer's account; the actions log is readable with an audit token; the
// customer's revocation turns the grant revoked on verify and withholds the
// next deploy without a call; DELETE makes no call.
func TestCloudGrantEndToEnd(t *testing.T) {
	c, g := startGrantsCP(t)
	acct, tok := c.signIn("ana@example.org")
	g.Customer(gProject, gSA, gDeployer, acct)
	base := "/v1/accounts/" + acct + "/cloud/grants"

	st, out := c.post(base, map[string]any{"provider": "gcp", "project_id": gProject, "service_account": gSA}, tok)
	gr, _ := out["grant"].(map[string]any)
	if st != 201 || gr["state"] != "verified" || out["grant_to"] != gDeployer || !strings.HasSuffix(out["permissions"].(string), grant.RolesPath) {
		t.Fatalf("POST grant: %d %v", st, out)
	}
	for _, call := range g.Calls() {
		if call.Method == "GetProject" && call.Principal != gSA {
			t.Errorf("the project was read as %q", call.Principal)
		}
	}

	// A deploy mints an agent key: it needs a fresh passkey check.
	rp := passkeytest.RelyingParty{Name: "agentmesh", ID: "localhost", Origin: strings.TrimSuffix(c.m.URLs().Console, "/console/")}
	dev := passkeytest.NewDevice([]byte(acct))
	if st, out := c.passkeyCeremony(acct, tok, "register", dev, rp); st != 200 {
		t.Fatalf("register: %d %v", st, out)
	}
	if st, out := c.passkeyCeremony(acct, tok, "assert", dev, rp); st != 200 || out["passkey_fresh"] != true {
		t.Fatalf("assert: %d %v", st, out)
	}
	deploy := map[string]any{"name": "helper", "region": "europe-west1", "image": "europe-west1-docker.pkg.dev/acme-agents/agents/helper:1",
		"bucket": "acme-agents-mesh-state", "model_api_key": "sk-model-secret-123"}
	st, out = c.post(base+"/gcp/deploys", deploy, tok)
	d, _ := out["deploy"].(map[string]any)
	if st != 201 || d["worker_pool"] != "projects/acme-agents/locations/europe-west1/workerPools/mesh-helper" || d["done"] != true {
		t.Fatalf("deploy: %d %v", st, out)
	}
	if strings.Contains(mustJSON(out), "sk-model-secret-123") || strings.Contains(mustJSON(out), "am_") {
		t.Errorf("the deploy's answer carries a secret: %v", out)
	}
	wp, by := g.WorkerPool(d["worker_pool"].(string))
	if wp == nil || by != gSA || wp.GetTemplate().GetServiceAccount() != gSA {
		t.Fatalf("worker pool written by %q, running as %q", by, wp.GetTemplate().GetServiceAccount())
	}
	vs := g.Secret(gProject, "mesh-helper-agent-key")
	if len(vs) != 1 || !vs[0].Checksummed || vs[0].By != gSA {
		t.Fatalf("the agent key's secret: %+v", vs)
	}
	// The key in the customer's secret is a real key of this account: an
	// agent redeems it here.
	agent := newAgent(t)
	if st, out := c.post("/v1/bootstrap", bootstrapBody(string(vs[0].Data), agent), ""); st != 200 || out["label"] != "helper" || out["account_email"] != "ana@example.org" {
		t.Fatalf("bootstrap with the deployed key: %d %v", st, out)
	}

	// The actions log, with an API token of scope audit.
	st, out = c.post("/v1/accounts/"+acct+"/api-tokens", map[string]any{"name": "auditor", "scopes": []string{"audit"}}, tok)
	if st != 201 {
		t.Fatalf("api token: %d %v", st, out)
	}
	st, out = c.do("GET", "/v1/accounts/"+acct+"/cloud/actions?provider=gcp&limit=500", nil, out["token"].(string))
	acts, _ := out["actions"].([]any)
	if st != 200 || len(acts) != 8 || acts[0].(map[string]any)["call"] != "run.UpdateWorkerPool" {
		t.Fatalf("actions: %d %v", st, out)
	}

	// The customer removes the one binding: verify reads it as revoked,
	// and the next deploy is withheld without a call.
	g.RemoveTokenCreator(gSA, gDeployer)
	if st, out = c.post(base+"/gcp/verify", nil, tok); st != 200 || out["grant"].(map[string]any)["state"] != "revoked" {
		t.Fatalf("verify after the binding was removed: %d %v", st, out)
	}
	n := len(g.Calls())
	if st, out = c.post(base+"/gcp/deploys", deploy, tok); st != 409 || out["details"].(map[string]any)["grant_state"] != "revoked" {
		t.Fatalf("deploy into a revoked grant: %d %v", st, out)
	}
	if st, _ = c.do("DELETE", base+"/gcp", nil, tok); st != 200 {
		t.Fatalf("DELETE: %d", st)
	}
	if calls := g.Calls()[n:]; len(calls) != 0 {
		t.Fatalf("the withheld deploy and DELETE made calls: %+v", calls)
	}
}

// The re-check of unreachable grants is a scheduled row, which meshd runs
// from its ticker: a grant unreachable because our own hop broke becomes
// verified on its own once the hop works and its wait is over.
func TestCloudGrantRecheckRunsOnMeshd(t *testing.T) {
	c, g := startGrantsCP(t, func(cfg *devenv.Config) { cfg.JobInterval = 20 * time.Millisecond })
	acct, tok := c.signIn("ana@example.org")
	g.Customer(gProject, gSA, gDeployer, acct)
	g.RemoveTokenCreator(gDeployer, gRuntime)
	base := "/v1/accounts/" + acct + "/cloud/grants"
	st, out := c.post(base, map[string]any{"provider": "gcp", "project_id": gProject, "service_account": gSA}, tok)
	if gr, _ := out["grant"].(map[string]any); st != 201 || gr["state"] != "unreachable" || !strings.Contains(gr["last_error"].(string), "Our side") {
		t.Fatalf("POST with our hop broken: %d %v", st, out)
	}
	g.AllowTokenCreator(gDeployer, gRuntime)
	c.clock.Advance(grant.RecheckEvery)
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, out = c.do("GET", base+"/gcp", nil, tok)
		if out["grant"].(map[string]any)["state"] == "verified" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the scheduled re-check never verified the grant: %v", out)
		}
		time.Sleep(20 * time.Millisecond)
	}
	_, out = c.do("GET", "/v1/accounts/"+acct+"/cloud/actions?limit=1", nil, tok)
	if a := out["actions"].([]any)[0].(map[string]any); a["trigger"] != "recheck" {
		t.Errorf("newest action %v", a)
	}
}
