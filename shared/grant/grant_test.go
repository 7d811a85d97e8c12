package grant_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/grant"
	"agentmesh.dev/mesh/shared/grant/googlefake"
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/store/boltstore"
	"agentmesh.dev/mesh/shared/testclock"
)

// The mesh's side and one customer's, as in docs/grants.md.
const (
	runtime  = "mesh-runtime@mesh-prod.iam.gserviceaccount.com"
	deployer = "mesh-deployer@mesh-prod.iam.gserviceaccount.com"
	project  = "acme-agents"
	sa       = "mesh-agent@acme-agents.iam.gserviceaccount.com"
)

// world is a grant service over a fake Google, a bolt store and the real
// account service, with one signed-in account whose passkey check is fresh.
type world struct {
	t        *testing.T
	g        *googlefake.Fake
	svc      *grant.Service
	accounts *account.Service
	clock    *testclock.Clock
	acct     string
	p        *account.Principal
	outbox   string // the mail outbox's directory
}

func newWorld(t *testing.T, timeout time.Duration, with ...func(*grant.Config)) *world {
	t.Helper()
	w := &world{t: t, g: googlefake.Start(t), clock: &testclock.Clock{}}
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "control.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ob, err := mail.NewOutbox(t.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	w.outbox = ob.Dir()
	w.accounts = account.New(account.Config{Store: st, Mail: ob, Now: w.clock.Now, ControlURL: "https://mesh.example.org"})
	acct, _, err := w.accounts.CreateAccount(t.Context(), "ana@example.org")
	if err != nil {
		t.Fatal(err)
	}
	w.acct = acct.ID
	w.p = &account.Principal{AccountID: acct.ID, Account: acct, Via: "session", SessionID: "s", PasskeyAt: w.clock.Now()}
	runtimeToken := w.g.Provider(runtime, deployer)
	cfg := grant.Config{Store: st, Deployer: deployer, Accounts: w.accounts, ControlURL: "https://mesh.example.org",
		Google: &grant.Google{Self: w.g.Options(runtimeToken), As: w.g.Options}, CallTimeout: timeout, Now: w.clock.Now}
	for _, f := range with {
		f(&cfg)
	}
	w.svc, err = grant.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.svc.Close() })
	return w
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func (w *world) create() grant.View {
	w.t.Helper()
	res, err := w.svc.Create(ctx(w.t), w.acct, grant.Request{Provider: "gcp", ProjectID: project, ServiceAccount: sa})
	if err != nil {
		w.t.Fatal(err)
	}
	return res.Grant
}

// callsSince are the world's calls after the first n.
func (w *world) callsSince(n int) []googlefake.Call { return w.g.Calls()[n:] }

func lastError(v grant.View) string {
	if v.LastError == nil {
		return ""
	}
	return *v.LastError
}

// Every row of the state table of spec §3.2 that a check decides, with the
// real client libraries against one fake world. Each row says what the
// world looks like, the state and the words of last_error, and which calls
// arrive as whom: the token call always as the mesh's runtime, the project
// read always as the customer's account (the bearer the chain minted).
func TestCheckStateTable(t *testing.T) {
	type call struct {
		method, principal, resource string
	}
	chained := call{"GenerateAccessToken", runtime, "projects/-/serviceAccounts/" + sa}
	ownHop := call{"GenerateAccessToken", runtime, "projects/-/serviceAccounts/" + deployer}
	read := call{"GetProject", sa, "projects/" + project}
	for _, tc := range []struct {
		name    string
		arrange func(f *googlefake.Fake)
		timeout time.Duration
		state   grant.State
		words   []string
		calls   []call // nil: not checked call by call (retries)
	}{
		{name: "verified", arrange: func(f *googlefake.Fake) {},
			state: grant.Verified, calls: []call{chained, read}},
		{name: "customer removed the binding (403)", arrange: func(f *googlefake.Fake) { f.RemoveTokenCreator(sa, deployer) },
			state: grant.Revoked, words: []string{"Your side", deployer, "roles/iam.serviceAccountTokenCreator", "2–7 minutes"}, calls: []call{chained, ownHop}},
		{name: "service account deleted (404)", arrange: func(f *googlefake.Fake) { f.DeleteAccount(sa) },
			state: grant.Revoked, words: []string{"Your side", sa, "not found"}, calls: []call{chained, ownHop}},
		{name: "our own hop broken (the same 403, and the own-hop question fails)", arrange: func(f *googlefake.Fake) { f.RemoveTokenCreator(deployer, runtime) },
			state: grant.Unreachable, words: []string{"Our side", deployer, "nothing to change on your side"}, calls: []call{chained, ownHop}},
		{name: "our deployer deleted (404, and the own-hop question fails)", arrange: func(f *googlefake.Fake) { f.DeleteAccount(deployer) },
			state: grant.Unreachable, words: []string{"Our side", deployer}, calls: []call{chained, ownHop}},
		{name: "IAM Credentials unavailable, short deadline", arrange: func(f *googlefake.Fake) { f.Outage("GenerateAccessToken", codes.Unavailable) },
			timeout: 300 * time.Millisecond, state: grant.Unreachable, words: []string{"IAM Credentials", "retries on its own"}},
		{name: "project read refused", arrange: func(f *googlefake.Fake) { f.Deny(sa, project, googlefake.PermProjectsGet) },
			state: grant.Unreachable, words: []string{"Your side", "roles/browser", project}, calls: []call{chained, read}},
		{name: "project read names another project", arrange: func(f *googlefake.Fake) { f.AnswerProjectAs(project, "someone-else") },
			state: grant.Unreachable, words: []string{"someone-else", "project_id"}, calls: []call{chained, read}},
		{name: "project without the grant label", arrange: func(f *googlefake.Fake) { f.LabelProject(project, googlefake.GrantLabel, "") },
			state: grant.Unreachable, words: []string{"Your side", "agentmesh-grant", "gcloud projects update " + project + " --update-labels=agentmesh-grant=acct_"}, calls: []call{chained, read}},
		{name: "project labelled for another mesh account", arrange: func(f *googlefake.Fake) { f.LabelProject(project, googlefake.GrantLabel, "acct_someone_else") },
			state: grant.Unreachable, words: []string{"Your side", "another mesh account", "acct_someone_else", "--update-labels=agentmesh-grant=acct_"}, calls: []call{chained, read}},
		{name: "project read unavailable", arrange: func(f *googlefake.Fake) { f.Outage("GetProject", codes.Unavailable) },
			timeout: 300 * time.Millisecond, state: grant.Unreachable, words: []string{"read of project", "retries on its own"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, tc.timeout)
			w.g.Customer(project, sa, deployer, w.acct)
			tc.arrange(w.g)
			n := len(w.g.Calls())
			v := w.create()
			if v.State != tc.state {
				t.Fatalf("state %s, want %s (last_error %q)", v.State, tc.state, lastError(v))
			}
			for _, word := range tc.words {
				if !strings.Contains(lastError(v), word) {
					t.Errorf("last_error %q does not say %q", lastError(v), word)
				}
			}
			if tc.state == grant.Verified {
				if v.LastError != nil || v.VerifiedAt == nil || !v.DeploysHere {
					t.Errorf("a verified grant: %+v", v)
				}
			} else if v.VerifiedAt != nil {
				t.Errorf("never verified, yet verified_at %v", *v.VerifiedAt)
			}
			got := w.callsSince(n)
			if tc.calls != nil {
				if len(got) != len(tc.calls) {
					t.Fatalf("calls %+v, want %+v", got, tc.calls)
				}
				for i, c := range tc.calls {
					if got[i].Method != c.method || got[i].Principal != c.principal || got[i].Resource != c.resource {
						t.Errorf("call %d: %s by %s on %s, want %s by %s on %s", i, got[i].Method, got[i].Principal, got[i].Resource, c.method, c.principal, c.resource)
					}
				}
			}
			for _, c := range got {
				if c.Method == "GetProject" && c.Principal != sa {
					t.Errorf("the project was read as %q, not as the customer's account", c.Principal)
				}
				if c.Method == "GenerateAccessToken" && c.Principal != runtime {
					t.Errorf("a token was asked for as %q, not as the mesh's runtime", c.Principal)
				}
			}
			// Every call in the customer's project is a line of the actions
			// log; the own-hop question, in our project, is not.
			acts, err := w.svc.Actions(ctx(t), w.acct, "gcp", 0)
			if err != nil {
				t.Fatal(err)
			}
			inCustomer := 0
			for _, c := range got {
				if c.Resource != ownHop.resource {
					inCustomer++
				}
			}
			if len(acts) == 0 || (tc.calls != nil && len(acts) != inCustomer) {
				t.Errorf("%d action lines for %d calls in the customer's project: %+v", len(acts), inCustomer, acts)
			}
			for _, a := range acts {
				if a.ProjectID != project || a.ServiceAccount != sa || a.Trigger != "create" || a.At == "" || a.Outcome == "" {
					t.Errorf("action line %+v", a)
				}
			}
		})
	}
}

// An explicit verify may raise revoked to verified once the customer puts
// the binding back (IAM takes minutes; a grant posted right after the
// binding can read as revoked).
func TestVerifyRaisesRevoked(t *testing.T) {
	w := newWorld(t, 0)
	w.g.Customer(project, sa, deployer, w.acct)
	w.g.RemoveTokenCreator(sa, deployer)
	if v := w.create(); v.State != grant.Revoked {
		t.Fatalf("posted without the binding: %s", v.State)
	}
	w.g.AllowTokenCreator(sa, deployer)
	v, err := w.svc.Verify(ctx(t), w.acct, "gcp")
	if err != nil || v.State != grant.Verified || v.LastError != nil || v.VerifiedAt == nil {
		t.Fatalf("verify after the binding came back: %+v %v", v, err)
	}
	acts, _ := w.svc.Actions(ctx(t), w.acct, "", 0)
	if len(acts) == 0 || acts[0].Trigger != "verify" || acts[0].Call != "resourcemanager.GetProject" || acts[0].Outcome != "ok" {
		t.Errorf("newest action line: %+v", acts)
	}
}

// DELETE forgets the record and makes no call at all: nothing in the
// customer's project changes, and the world sees nothing.
func TestDeleteMakesNoCall(t *testing.T) {
	w := newWorld(t, 0)
	w.g.Customer(project, sa, deployer, w.acct)
	w.create()
	n := len(w.g.Calls())
	if _, err := w.svc.Delete(ctx(t), w.acct, "gcp"); err != nil {
		t.Fatal(err)
	}
	if got := w.callsSince(n); len(got) != 0 {
		t.Fatalf("DELETE made calls: %+v", got)
	}
	if _, err := w.svc.Get(ctx(t), w.acct, "gcp"); errs.CodeOf(err) != errs.NotFound {
		t.Fatalf("after DELETE: %v", err)
	}
	if _, err := w.svc.Delete(ctx(t), w.acct, "gcp"); errs.CodeOf(err) != errs.NotFound {
		t.Fatalf("second DELETE: %v", err)
	}
	// The actions log outlives the record: it is the customer's history.
	if acts, _ := w.svc.Actions(ctx(t), w.acct, "gcp", 0); len(acts) != 2 {
		t.Errorf("actions after DELETE: %+v", acts)
	}
}

// The confused deputy across tenants: the deployer is shared by every mesh
// account, so Eve, another mesh account, can name the victim's project and
// service account, and the chain works. The victim's project is labelled
// for the victim's account, so Eve's grant is not verified, and her deploy
// makes no call at all in the victim's project; the victim's own grant of
// the same project is verified.
func TestGrantOfAnotherTenantsProject(t *testing.T) {
	w := newWorld(t, 0)
	w.g.Customer(project, sa, deployer, w.acct)
	eve, _, err := w.accounts.CreateAccount(t.Context(), "eve@example.org")
	if err != nil {
		t.Fatal(err)
	}
	pe := &account.Principal{AccountID: eve.ID, Account: eve, Via: "session", SessionID: "e", PasskeyAt: w.clock.Now()}
	res, err := w.svc.Create(ctx(t), eve.ID, grant.Request{Provider: "gcp", ProjectID: project, ServiceAccount: sa})
	if err != nil {
		t.Fatal(err)
	}
	if res.Grant.State == grant.Verified || !strings.Contains(lastError(res.Grant), "names another mesh account") ||
		!strings.Contains(lastError(res.Grant), "--update-labels=agentmesh-grant="+eve.ID) {
		t.Fatalf("Eve's grant of the victim's project: %s %q", res.Grant.State, lastError(res.Grant))
	}
	if v, err := w.svc.Verify(ctx(t), eve.ID, "gcp"); err != nil || v.State == grant.Verified {
		t.Fatalf("Eve's verify: %v %+v", err, v)
	}
	n := len(w.g.Calls())
	if _, err := w.svc.Deploy(ctx(t), pe, "gcp", deployRequest()); errs.CodeOf(err) != errs.Conflict {
		t.Fatalf("Eve's deploy: %v", err)
	}
	if calls := w.callsSince(n); len(calls) != 0 {
		t.Fatalf("Eve's deploy made calls in the victim's project: %+v", calls)
	}
	if ks, _ := w.accounts.ListAgentKeys(ctx(t), pe); len(ks) != 0 {
		t.Errorf("Eve's refused deploy minted keys: %+v", ks)
	}
	if v := w.create(); v.State != grant.Verified {
		t.Fatalf("the owner's grant: %s %q", v.State, lastError(v))
	}
}

// A DELETE while a deploy is placing its secrets: the grant is re-read
// before the worker pool, so no worker pool is written, and the key is
// revoked.
func TestDeleteDuringDeploy(t *testing.T) {
	w := newWorld(t, 0)
	w.g.Customer(project, sa, deployer, w.acct)
	w.create()
	w.g.OnCall("AddSecretVersion", func(context.Context) {
		if _, err := w.svc.Delete(context.Background(), w.acct, "gcp"); err != nil && errs.CodeOf(err) != errs.NotFound {
			t.Errorf("DELETE: %v", err)
		}
	})
	n := len(w.g.Calls())
	_, err := w.svc.Deploy(ctx(t), w.p, "gcp", deployRequest())
	if e := errs.As(err); e.Code != errs.Conflict || !strings.Contains(e.Message, "no worker pool was written") {
		t.Fatalf("deploy: %+v", e)
	}
	for _, c := range w.callsSince(n) {
		if c.Method == "UpdateWorkerPool" {
			t.Errorf("a worker pool was written after the DELETE: %+v", c)
		}
	}
	if wp, _ := w.g.WorkerPool("projects/acme-agents/locations/europe-west1/workerPools/mesh-helper"); wp != nil {
		t.Errorf("worker pool %v", wp)
	}
	if ks, _ := w.accounts.ListAgentKeys(ctx(t), w.p); len(ks) != 1 || w.accounts.KeyState(ks[0]) != "revoked" {
		t.Errorf("the key of a deploy whose grant was deleted: %+v", ks)
	}
}

func deployRequest() grant.DeployRequest {
	return grant.DeployRequest{Name: "helper", Region: "europe-west1", Image: "europe-west1-docker.pkg.dev/acme-agents/agents/helper:1",
		Bucket: "acme-agents-mesh-state", ModelAPIKey: "sk-model-secret-123"}
}

// A deploy into a verified grant: the key is minted, both secrets are
// created and given a version with its checksum, as the customer's account
// (and never read back: the world fails the test on a read), and the
// worker pool runs mesh-adapter as the customer's account with exactly
// those versions.
func TestDeploy(t *testing.T) {
	w := newWorld(t, 0)
	w.g.Customer(project, sa, deployer, w.acct)
	w.create()
	n := len(w.g.Calls())
	res, err := w.svc.Deploy(ctx(t), w.p, "gcp", deployRequest())
	if err != nil {
		t.Fatal(err)
	}
	wantPool := "projects/acme-agents/locations/europe-west1/workerPools/mesh-helper"
	if res.WorkerPool != wantPool || !res.Done || res.Grant.State != grant.Verified || res.Label != "helper" || res.AgentKeyID == "" ||
		!slices.Equal(res.Secrets, []string{"projects/acme-agents/secrets/mesh-helper-agent-key/versions/1", "projects/acme-agents/secrets/mesh-helper-model-key/versions/1"}) {
		t.Errorf("result %+v", res)
	}
	var methods []string
	for _, c := range w.callsSince(n) {
		methods = append(methods, c.Method)
		if c.Method != "GenerateAccessToken" && c.Principal != sa {
			t.Errorf("%s on %s arrived as %q, not as the customer's account", c.Method, c.Resource, c.Principal)
		}
	}
	if want := []string{"GenerateAccessToken", "CreateSecret", "AddSecretVersion", "CreateSecret", "AddSecretVersion", "UpdateWorkerPool"}; !slices.Equal(methods, want) {
		t.Errorf("calls %v, want %v", methods, want)
	}
	key := w.g.Secret(project, "mesh-helper-agent-key")
	model := w.g.Secret(project, "mesh-helper-model-key")
	if len(key) != 1 || !key[0].Checksummed || key[0].By != sa || !strings.HasPrefix(string(key[0].Data), "am_") {
		t.Errorf("agent key secret: %+v", key)
	}
	if len(model) != 1 || !model[0].Checksummed || model[0].By != sa || string(model[0].Data) != "sk-model-secret-123" {
		t.Errorf("model key secret: %+v", model)
	}
	// The owner is told by mail, with the key's id and where it went, but
	// the key itself is only in the customer's secret.
	msgs, err := mail.ReadOutbox(w.outbox)
	if err != nil {
		t.Fatal(err)
	}
	notices := 0
	for _, m := range msgs {
		if strings.Contains(m.Text, "am_") || strings.Contains(m.Text, string(key[0].Data)) {
			t.Errorf("a mail carries the deploy's agent key: %q", m.Text)
		}
		if m.Kind == "agent-key" && strings.Contains(m.Text, res.AgentKeyID) && strings.Contains(m.Text, "mesh-helper-agent-key") {
			notices++
		}
	}
	if notices != 1 {
		t.Errorf("%d notices of the deploy's key in %d mails", notices, len(msgs))
	}
	// The key in the secret is the account's, unused, under the id answered.
	ks, _ := w.accounts.ListAgentKeys(ctx(t), w.p)
	if len(ks) != 1 || ks[0].ID != res.AgentKeyID || w.accounts.KeyState(ks[0]) != "unused" {
		t.Errorf("agent keys: %+v", ks)
	}
	wp, by := w.g.WorkerPool(wantPool)
	if wp == nil || by != sa {
		t.Fatalf("worker pool %v written by %q", wp, by)
	}
	tpl := wp.GetTemplate()
	c := tpl.GetContainers()[0]
	env := map[string]string{}
	for _, e := range c.GetEnv() {
		if ref := e.GetValueSource().GetSecretKeyRef(); ref != nil {
			env[e.GetName()] = "secret:" + ref.GetSecret() + "@" + ref.GetVersion()
		} else {
			env[e.GetName()] = e.GetValue()
		}
	}
	if tpl.GetServiceAccount() != sa || c.GetImage() != deployRequest().Image || env["MESH_AGENT_KEY"] != "secret:mesh-helper-agent-key@1" ||
		env["MODEL_API_KEY"] != "secret:mesh-helper-model-key@1" || env["MESH_CONTROL_URL"] != "https://mesh.example.org" ||
		env["MESH_ADAPTER_HOME"] != "/mesh-state" || tpl.GetVolumes()[0].GetGcs().GetBucket() != "acme-agents-mesh-state" ||
		!strings.Contains(strings.Join(c.GetCommand(), " "), "mesh-adapter up \"$MESH_AGENT_KEY\"") || wp.GetScaling().GetManualInstanceCount() != 1 {
		t.Errorf("worker pool: sa %s, image %s, env %v, command %q", tpl.GetServiceAccount(), c.GetImage(), env, c.GetCommand())
	}
	for _, v := range env {
		if strings.Contains(v, "sk-model") || strings.Contains(v, "am_") {
			t.Errorf("a secret's value is in the worker pool's plain environment: %v", env)
		}
	}
	// The actions log has one line per call in the customer's project.
	acts, _ := w.svc.Actions(ctx(t), w.acct, "gcp", 6)
	var calls []string
	for _, a := range slices.Backward(acts) {
		calls = append(calls, a.Call)
		if a.Trigger != "deploy" || a.Outcome != "ok" {
			t.Errorf("deploy action %+v", a)
		}
	}
	if want := []string{"iamcredentials.GenerateAccessToken", "secretmanager.CreateSecret", "secretmanager.AddSecretVersion",
		"secretmanager.CreateSecret", "secretmanager.AddSecretVersion", "run.UpdateWorkerPool"}; !slices.Equal(calls, want) {
		t.Errorf("action lines %v, want %v", calls, want)
	}

	// A second deploy of the same agent finds the secrets (AlreadyExists),
	// adds new versions and updates the worker pool to them.
	res, err = w.svc.Deploy(ctx(t), w.p, "gcp", deployRequest())
	if err != nil {
		t.Fatal(err)
	}
	wp, _ = w.g.WorkerPool(wantPool)
	if len(w.g.Secret(project, "mesh-helper-agent-key")) != 2 || res.Secrets[0] != "projects/acme-agents/secrets/mesh-helper-agent-key/versions/2" {
		t.Errorf("redeploy: %+v", res)
	}
	for _, e := range wp.GetTemplate().GetContainers()[0].GetEnv() {
		if ref := e.GetValueSource().GetSecretKeyRef(); ref != nil && ref.GetVersion() != "2" {
			t.Errorf("redeployed worker pool still names %s@%s", ref.GetSecret(), ref.GetVersion())
		}
	}
}

// A deploy refused inside the customer's project lowers the verified grant
// to revoked and takes its key back; a later deploy is withheld, makes no
// call and never raises the state; only a verify raises it.
func TestDeployRefusedLowersAndNeverRaises(t *testing.T) {
	w := newWorld(t, 0)
	w.g.Customer(project, sa, deployer, w.acct)
	w.create()
	w.g.Deny(sa, project, googlefake.PermWorkerPoolsCreate)
	_, err := w.svc.Deploy(ctx(t), w.p, "gcp", deployRequest())
	e := errs.As(err)
	if e.Code != errs.DependencyFailed || e.Details["grant_state"] != "revoked" || e.Retryable || !strings.Contains(e.Message, "run.UpdateWorkerPool") {
		t.Fatalf("refused deploy: %+v", e)
	}
	v, _ := w.svc.Get(ctx(t), w.acct, "gcp")
	if v.State != grant.Revoked || !strings.Contains(lastError(v), "refused") || !strings.Contains(lastError(v), grant.RolesPath) {
		t.Fatalf("after a refused deploy: %+v", v)
	}
	ks, _ := w.accounts.ListAgentKeys(ctx(t), w.p)
	if len(ks) != 1 || w.accounts.KeyState(ks[0]) != "revoked" {
		t.Errorf("the failed deploy's key: %+v", ks)
	}

	w.g.Allow(sa, project, googlefake.PermWorkerPoolsCreate)
	n := len(w.g.Calls())
	_, err = w.svc.Deploy(ctx(t), w.p, "gcp", deployRequest())
	if e := errs.As(err); e.Code != errs.Conflict || e.Details["grant_state"] != "revoked" {
		t.Fatalf("deploy into a revoked grant: %+v", e)
	}
	if got := w.callsSince(n); len(got) != 0 {
		t.Errorf("a withheld deploy made calls: %+v", got)
	}
	if v, _ := w.svc.Get(ctx(t), w.acct, "gcp"); v.State != grant.Revoked {
		t.Errorf("a deploy raised the grant to %s", v.State)
	}
	if v, err := w.svc.Verify(ctx(t), w.acct, "gcp"); err != nil || v.State != grant.Verified {
		t.Fatalf("verify: %+v %v", v, err)
	}
	if _, err := w.svc.Deploy(ctx(t), w.p, "gcp", deployRequest()); err != nil {
		t.Fatalf("deploy after verify: %v", err)
	}
}

// The other refusals of a deploy: at the token call (the binding gone)
// the grant is lowered; a failure that is not a refusal leaves it as it
// is; no grant, a grant that is not verified, or no fresh passkey refuse
// before any call.
func TestDeployRefusals(t *testing.T) {
	t.Run("binding removed after verification", func(t *testing.T) {
		w := newWorld(t, 0)
		w.g.Customer(project, sa, deployer, w.acct)
		w.create()
		w.g.RemoveTokenCreator(sa, deployer)
		_, err := w.svc.Deploy(ctx(t), w.p, "gcp", deployRequest())
		if e := errs.As(err); e.Details["grant_state"] != "revoked" {
			t.Fatalf("deploy: %+v", e)
		}
		if v, _ := w.svc.Get(ctx(t), w.acct, "gcp"); v.State != grant.Revoked {
			t.Errorf("state %s", v.State)
		}
		if ks, _ := w.accounts.ListAgentKeys(ctx(t), w.p); len(ks) != 0 {
			t.Errorf("a key was minted for a deploy that could not start: %+v", ks)
		}
	})
	// UNAUTHENTICATED says our token was not accepted: our problem, not
	// the customer's refusal, so the grant stays verified.
	t.Run("our token not accepted (UNAUTHENTICATED)", func(t *testing.T) {
		w := newWorld(t, 0)
		w.g.Customer(project, sa, deployer, w.acct)
		w.create()
		w.g.Outage("CreateSecret", codes.Unauthenticated)
		_, err := w.svc.Deploy(ctx(t), w.p, "gcp", deployRequest())
		if e := errs.As(err); e.Code != errs.DependencyFailed || e.Details["grant_state"] != "verified" || !strings.Contains(e.Message, "UNAUTHENTICATED") {
			t.Fatalf("deploy: %+v", e)
		}
		if v, _ := w.svc.Get(ctx(t), w.acct, "gcp"); v.State != grant.Verified {
			t.Errorf("UNAUTHENTICATED lowered the grant to %s", v.State)
		}
	})
	// The worker pool's write got no certain answer: it may have
	// happened, so the key is kept (not revoked), and the answer and the
	// actions log say so; the grant is unchanged.
	t.Run("Cloud Run unavailable: the outcome is uncertain", func(t *testing.T) {
		w := newWorld(t, 300*time.Millisecond)
		w.g.Customer(project, sa, deployer, w.acct)
		w.create()
		w.g.Outage("UpdateWorkerPool", codes.Unavailable)
		_, err := w.svc.Deploy(ctx(t), w.p, "gcp", deployRequest())
		e := errs.As(err)
		ks, _ := w.accounts.ListAgentKeys(ctx(t), w.p)
		if len(ks) != 1 || w.accounts.KeyState(ks[0]) != "unused" {
			t.Fatalf("the key of an uncertain deploy: %+v", ks)
		}
		if e.Code != errs.Unavailable || e.Details["grant_state"] != "verified" || e.Details["agent_key_id"] != ks[0].ID ||
			!strings.Contains(e.Message, "may have been written") || !strings.Contains(e.Message, "kept") {
			t.Fatalf("deploy: %+v", e)
		}
		if v, _ := w.svc.Get(ctx(t), w.acct, "gcp"); v.State != grant.Verified {
			t.Errorf("an uncertain outcome changed the grant to %s", v.State)
		}
		acts, _ := w.svc.Actions(ctx(t), w.acct, "gcp", 0)
		if len(acts) == 0 || acts[0].Call != "run.UpdateWorkerPool" || !strings.Contains(acts[0].Error, "outcome uncertain") {
			t.Errorf("the actions log's newest line: %+v", acts[:min(1, len(acts))])
		}
	})
	// The deploy's budget ends it even when each call's own deadline is
	// far off, and the failed deploy's key is still revoked (its own
	// deadline, after the budget).
	t.Run("the deploy's budget", func(t *testing.T) {
		w := newWorld(t, 0, func(c *grant.Config) { c.DeployBudget = 300 * time.Millisecond })
		w.g.Customer(project, sa, deployer, w.acct)
		w.create()
		// Google holds the call until the caller gives up.
		w.g.OnCall("AddSecretVersion", func(ctx context.Context) { <-ctx.Done() })
		_, err := w.svc.Deploy(ctx(t), w.p, "gcp", deployRequest())
		if e := errs.As(err); e.Code != errs.DependencyFailed || e.Details["grant_state"] != "verified" || !strings.Contains(e.Message, "DEADLINE_EXCEEDED") {
			t.Fatalf("deploy: %+v", e)
		}
		if ks, _ := w.accounts.ListAgentKeys(ctx(t), w.p); len(ks) != 1 || w.accounts.KeyState(ks[0]) != "revoked" {
			t.Errorf("the key of a deploy out of budget: %+v", ks)
		}
	})
	t.Run("Secret Manager unavailable", func(t *testing.T) {
		w := newWorld(t, 300*time.Millisecond)
		w.g.Customer(project, sa, deployer, w.acct)
		w.create()
		w.g.Outage("CreateSecret", codes.Unavailable)
		_, err := w.svc.Deploy(ctx(t), w.p, "gcp", deployRequest())
		if e := errs.As(err); e.Code != errs.DependencyFailed || e.Details["grant_state"] != "verified" {
			t.Fatalf("deploy: %+v", e)
		}
		if v, _ := w.svc.Get(ctx(t), w.acct, "gcp"); v.State != grant.Verified {
			t.Errorf("an outage changed the grant to %s", v.State)
		}
	})
	for _, tc := range []struct {
		name    string
		arrange func(w *world)
		code    errs.Code
	}{
		{"no grant", func(w *world) {}, errs.NotFound},
		{"unreachable grant", func(w *world) {
			w.g.Customer(project, sa, deployer, w.acct)
			w.g.AnswerProjectAs(project, "someone-else")
			w.create()
		}, errs.Conflict},
		{"no fresh passkey", func(w *world) {
			w.g.Customer(project, sa, deployer, w.acct)
			w.create()
			w.clock.Advance(10 * time.Minute)
		}, errs.Forbidden},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t, 0)
			tc.arrange(w)
			n := len(w.g.Calls())
			_, err := w.svc.Deploy(ctx(t), w.p, "gcp", deployRequest())
			if errs.CodeOf(err) != tc.code {
				t.Fatalf("deploy: %v, want %s", err, tc.code)
			}
			if got := w.callsSince(n); len(got) != 0 {
				t.Errorf("a refused deploy made calls: %+v", got)
			}
		})
	}
}

// The scheduled row re-checks unreachable grants once their wait is over,
// and leaves revoked and verified ones alone.
func TestRecheck(t *testing.T) {
	w := newWorld(t, 0)
	w.g.Customer(project, sa, deployer, w.acct)
	w.g.RemoveTokenCreator(deployer, runtime)
	if v := w.create(); v.State != grant.Unreachable {
		t.Fatalf("state %s", v.State)
	}
	if n, err := w.svc.Recheck(ctx(t)); err != nil || n != 0 {
		t.Fatalf("recheck before the wait is over: %d %v", n, err)
	}
	w.g.AllowTokenCreator(deployer, runtime)
	w.clock.Advance(grant.RecheckEvery)
	if n, err := w.svc.Recheck(ctx(t)); err != nil || n != 1 {
		t.Fatalf("recheck: %d %v", n, err)
	}
	v, _ := w.svc.Get(ctx(t), w.acct, "gcp")
	if v.State != grant.Verified {
		t.Fatalf("after recheck: %+v", v)
	}
	acts, _ := w.svc.Actions(ctx(t), w.acct, "gcp", 1)
	if len(acts) != 1 || acts[0].Trigger != "recheck" {
		t.Errorf("newest action: %+v", acts)
	}
	// Revoked grants are not retried.
	w.g.RemoveTokenCreator(sa, deployer)
	if v, _ := w.svc.Verify(ctx(t), w.acct, "gcp"); v.State != grant.Revoked {
		t.Fatalf("state %s", v.State)
	}
	w.clock.Advance(grant.MaxRecheckWait)
	n := len(w.g.Calls())
	if c, err := w.svc.Recheck(ctx(t)); err != nil || c != 0 || len(w.callsSince(n)) != 0 {
		t.Errorf("a revoked grant was re-checked: %d %v", c, err)
	}
}

// The door: a refused body is refused before anything is recorded or
// called, each with its own message.
func TestCreateRefusedAtTheDoor(t *testing.T) {
	w := newWorld(t, 0)
	for _, tc := range []struct {
		req  grant.Request
		word string
	}{
		{grant.Request{Provider: "aws", ProjectID: project, ServiceAccount: sa}, `provider "aws" is not supported`},
		{grant.Request{Provider: "gcp", ProjectID: project, ServiceAccount: "123456789-compute@developer.gserviceaccount.com"}, "Compute Engine default"},
		{grant.Request{Provider: "gcp", ProjectID: project, ServiceAccount: "acme-agents@appspot.gserviceaccount.com"}, "App Engine default"},
		{grant.Request{Provider: "gcp", ProjectID: project, ServiceAccount: "service-123456789@gcp-sa-run.iam.gserviceaccount.com"}, "Google-managed service agent"},
		{grant.Request{Provider: "gcp", ProjectID: project, ServiceAccount: "123456789@cloudbuild.gserviceaccount.com"}, "Google-managed service agent"},
		{grant.Request{Provider: "gcp", ProjectID: project, ServiceAccount: "mesh-agent@other-project.iam.gserviceaccount.com"}, "does not belong to project acme-agents"},
		{grant.Request{Provider: "gcp", ProjectID: project, ServiceAccount: "ana@example.org"}, "does not belong to project acme-agents"},
		{grant.Request{Provider: "gcp", ProjectID: "Acme Agents", ServiceAccount: sa}, "not a Google Cloud project id"},
		{grant.Request{Provider: "gcp", ProjectID: "example.com:acme", ServiceAccount: sa}, "domain-scoped"},
		{grant.Request{Provider: "gcp", ProjectID: project}, "service_account is required"},
	} {
		_, err := w.svc.Create(ctx(t), w.acct, tc.req)
		if e := errs.As(err); e.Code != errs.InvalidRequest || !strings.Contains(e.Message, tc.word) {
			t.Errorf("%+v: %v, want a refusal saying %q", tc.req, err, tc.word)
		}
	}
	if len(w.g.Calls()) != 0 {
		t.Errorf("refusals at the door made calls: %+v", w.g.Calls())
	}
	if gs, _ := w.svc.List(ctx(t), w.acct); len(gs) != 0 {
		t.Errorf("refusals at the door recorded grants: %+v", gs)
	}
	// Addresses are compared in lower case, as Google stores them.
	w.g.Customer(project, sa, deployer, w.acct)
	res, err := w.svc.Create(ctx(t), w.acct, grant.Request{Provider: "gcp", ProjectID: project, ServiceAccount: " Mesh-Agent@acme-agents.iam.gserviceaccount.com "})
	if err != nil || res.Grant.ServiceAccount != sa || res.Grant.State != grant.Verified || !res.Created {
		t.Fatalf("%+v %v", res, err)
	}
	// A second POST replaces the record and checks it again.
	res, err = w.svc.Create(ctx(t), w.acct, grant.Request{Provider: "gcp", ProjectID: project, ServiceAccount: sa})
	if err != nil || res.Created || res.Grant.State != grant.Verified {
		t.Fatalf("second POST: %+v %v", res, err)
	}
}

func TestActionsLimit(t *testing.T) {
	w := newWorld(t, 0)
	w.g.Customer(project, sa, deployer, w.acct)
	for range 3 {
		w.create()
	}
	all, err := w.svc.Actions(ctx(t), w.acct, "", 0)
	if err != nil || len(all) != 6 {
		t.Fatalf("%d actions, %v", len(all), err)
	}
	for i := 1; i < len(all); i++ {
		if all[i].At > all[i-1].At {
			t.Errorf("not newest first: %s after %s", all[i].At, all[i-1].At)
		}
	}
	if two, _ := w.svc.Actions(ctx(t), w.acct, "gcp", 2); len(two) != 2 {
		t.Errorf("limit 2: %d", len(two))
	}
	for _, bad := range []int{-1, grant.MaxActionsLimit + 1} {
		if _, err := w.svc.Actions(ctx(t), w.acct, "", bad); errs.CodeOf(err) != errs.InvalidRequest {
			t.Errorf("limit %d: %v", bad, err)
		}
	}
	if _, err := w.svc.Actions(ctx(t), w.acct, "azure", 0); errs.CodeOf(err) != errs.InvalidRequest {
		t.Errorf("provider azure: %v", err)
	}
	if other, _ := w.svc.Actions(ctx(t), "acct_someoneelse", "", 0); len(other) != 0 {
		t.Errorf("another account's log: %+v", other)
	}
}

// A POST whose caller goes away during the check writes no verdict (the
// failures it saw say nothing about the grant): the record stays pending,
// and the scheduled row checks it once it is older than a few minutes.
func TestInterruptedCheckLeavesPending(t *testing.T) {
	w := newWorld(t, 0)
	w.g.Customer(project, sa, deployer, w.acct)
	w.g.Outage("GenerateAccessToken", codes.Unavailable)
	short, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, err := w.svc.Create(short, w.acct, grant.Request{Provider: "gcp", ProjectID: project, ServiceAccount: sa})
	if errs.CodeOf(err) != errs.Unavailable {
		t.Fatalf("interrupted POST: %v", err)
	}
	if v, _ := w.svc.Get(ctx(t), w.acct, "gcp"); v.State != grant.Pending || v.CheckedAt != nil {
		t.Fatalf("after an interrupted check: %+v", v)
	}
	w.g.EndOutage("GenerateAccessToken")
	if n, _ := w.svc.Recheck(ctx(t)); n != 0 {
		t.Fatalf("a fresh pending grant was re-checked")
	}
	w.clock.Advance(10 * time.Minute)
	if n, err := w.svc.Recheck(ctx(t)); n != 1 || err != nil {
		t.Fatalf("recheck of a stale pending grant: %d %v", n, err)
	}
	if v, _ := w.svc.Get(ctx(t), w.acct, "gcp"); v.State != grant.Verified {
		t.Fatalf("after the re-check: %+v", v)
	}
}
