package console_test

import (
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/grant"
	"agentmesh.dev/mesh/shared/grant/googlefake"
	"agentmesh.dev/mesh/shared/passkey/passkeytest"
)

// sentence is err's message as the console shows it: capitalised, with a
// full stop.
func sentence(err error) string {
	msg := errs.As(err).Message
	msg = strings.ToUpper(msg[:1]) + msg[1:]
	if !strings.HasSuffix(msg, ".") {
		msg += "."
	}
	return msg
}

const modelKey = "sk-model-secret-123"

var stateRE = regexp.MustCompile(`id="grant-state">([a-z]+)<`)

func grantState(page answer) string {
	if m := stateRE.FindStringSubmatch(page.body); m != nil {
		return m[1]
	}
	return ""
}

// The Cloud page against a fake Google, without a browser: the setup's
// commands filled in (and a link's values that are not Google names left
// out); a grant refused at the door with the service's sentence; a grant
// that reads revoked; the deploy refused without a fresh passkey (403) and
// into a grant that is not verified (409), without any call in the
// customer's project; Verify raising it once the customer's binding is
// there; a deploy; a deploy refused inside the customer's project (502)
// lowering the grant; the model API key never on a page; and forgetting the
// grant making no call.
func TestConsoleCloudPage(t *testing.T) {
	w, g := startCloudWorld(t)
	b := newBrowser(t, w.console)
	b.signIn(w, "ana@example.org")
	acct := acctRE.FindString(b.get("").body)

	page := b.get("cloud")
	if page.status != 200 || !strings.Contains(page.body, "<title>Cloud – agentmesh console</title>") ||
		!strings.Contains(page.body, `aria-current="page">Cloud`) || !strings.Contains(page.body, `<code id="grant-to" aria-labelledby="grant-to-label">`+gDeployer+`</code>`) ||
		!strings.Contains(page.body, `id="no-grant"`) || strings.Contains(page.body, `id="deploy-form"`) {
		t.Fatalf("the Cloud page without a grant: %d\n%s", page.status, page.body)
	}
	tok := csrf(t, page)

	// The setup form fills the exact commands, step by step.
	setup := grant.Setup{ProjectID: gProject, Account: "mesh-agent", Deployer: gDeployer, Region: "europe-west1",
		Bucket: "acme-agents-mesh-state", Repository: "agents", MeshAccount: acct}
	page = b.get("cloud?project=acme-agents&account=mesh-agent&region=europe-west1&bucket=acme-agents-mesh-state&repository=agents")
	for i, st := range setup.Steps() {
		want := `<code id="setup-step-` + string(rune('0'+i)) + `" aria-labelledby="setup-step-` + string(rune('0'+i)) + `-label">` +
			html.EscapeString(strings.Join(st.Commands, "\n")) + `</code>`
		if !strings.Contains(page.body, want) {
			t.Errorf("step %d is not on the page as\n%s", i, want)
		}
	}
	if !strings.Contains(page.body, `name="service_account" required maxlength="200" value="`+gSA+`"`) {
		t.Errorf("the add form does not start from the setup's account")
	}
	// A link cannot make the page show commands that do something else.
	page = b.get("cloud?project=" + url.QueryEscape("acme; rm -rf ~") + "&account=mesh-agent")
	if got := alert(page); got != "Not a Google Cloud name, so left as a placeholder: project. Use lower-case letters, digits, '-', '_' and '.'." ||
		strings.Contains(page.body, "rm -rf") || !strings.Contains(page.body, "gcloud services enable") ||
		!strings.Contains(page.body, "mesh-agent@PROJECT_ID.iam.gserviceaccount.com") {
		t.Errorf("a setup value that is no Google name: %q\n%s", alert(page), page.body)
	}

	// Refused at the door, with the service's own sentence.
	compute := "123456789012-compute@developer.gserviceaccount.com"
	_, doorErr := grant.CheckRequest(grant.Request{Provider: "gcp", ProjectID: gProject, ServiceAccount: compute})
	a := b.post("cloud/grant", url.Values{"csrf": {tok}, "provider": {"gcp"}, "project_id": {gProject}, "service_account": {compute}})
	if a.status != http.StatusBadRequest || alert(a) != sentence(doorErr) || !strings.Contains(a.body, `value="`+compute+`"`) {
		t.Fatalf("the compute default account: %d %q", a.status, alert(a))
	}
	if a := b.post("cloud/grant", url.Values{"csrf": {tok}, "provider": {"aws"}, "project_id": {gProject}, "service_account": {gSA}}); a.status != http.StatusBadRequest ||
		alert(a) != `Provider "aws" is not supported: the only provider is "gcp".` {
		t.Errorf("another provider: %d %q", a.status, alert(a))
	}

	// The customer has not made the account yet: the grant reads revoked,
	// with its last error in plain words, and deploys are withheld.
	add := url.Values{"csrf": {tok}, "provider": {"gcp"}, "project_id": {gProject}, "service_account": {gSA}}
	if a = b.post("cloud/grant", add); a.status != http.StatusSeeOther || a.location != "/console/cloud?added=1" {
		t.Fatalf("add the grant: %d %q %q", a.status, a.location, alert(a))
	}
	page = b.get(a.location)
	if grantState(page) != "revoked" || !strings.Contains(page.body, `role="status">Grant recorded and checked just now: it is revoked.`) ||
		!strings.Contains(page.body, `<dd id="grant-last-error">Your side`) || !strings.Contains(page.body, `id="deploy-withheld"`) {
		t.Fatalf("the grant before the customer's setup:\n%s", page.body)
	}

	deploy := url.Values{"csrf": {tok}, "name": {"helper"}, "region": {"europe-west1"}, "image": {"europe-west1-docker.pkg.dev/acme-agents/agents/helper:1"},
		"bucket": {"acme-agents-mesh-state"}, "model_api_key": {modelKey}}
	calls := len(g.Calls())
	a = b.post("cloud/deploy", deploy)
	if a.status != http.StatusForbidden ||
		alert(a) != "Confirm with your passkey first: a deploy mints an agent key, which needs a passkey check from the last few minutes." {
		t.Fatalf("a deploy without a fresh passkey: %d %q", a.status, alert(a))
	}
	if strings.Contains(a.body, modelKey) || !strings.Contains(a.body, `name="name" required maxlength="30" value="helper"`) {
		t.Errorf("the refused deploy form shows the model key, or lost its values:\n%s", a.body)
	}

	dev := passkeytest.NewDevice([]byte(acct))
	rp := passkeytest.RelyingParty{Name: "agentmesh", ID: "localhost", Origin: b.origin}
	for _, kind := range []string{"register", "assert"} {
		if a := b.passkey(kind, dev, rp, tok); a.status != 200 {
			t.Fatalf("%s: %d %s", kind, a.status, a.body)
		}
	}
	a = b.post("cloud/deploy", deploy)
	if a.status != http.StatusConflict || !strings.HasPrefix(alert(a), "The gcp grant is revoked, so nothing was deployed (and nothing runs on the mesh's own machines instead). Your side") ||
		strings.Contains(a.body, modelKey) {
		t.Fatalf("a deploy into a revoked grant: %d %q", a.status, alert(a))
	}
	if n := len(g.Calls()); n != calls {
		t.Fatalf("the withheld deploys made %d calls", n-calls)
	}

	// The customer follows the setup; Verify raises the grant.
	g.Customer(gProject, gSA, gDeployer, acct)
	if a = b.post("cloud/verify", url.Values{"csrf": {tok}}); a.status != http.StatusSeeOther || a.location != "/console/cloud?checked=1" {
		t.Fatalf("verify: %d %q %q", a.status, a.location, alert(a))
	}
	page = b.get(a.location)
	if grantState(page) != "verified" || !strings.Contains(page.body, `role="status">Checked just now: the grant is verified.`) ||
		strings.Contains(page.body, `id="grant-last-error"`) || strings.Contains(page.body, `id="deploy-withheld"`) {
		t.Fatalf("after verify:\n%s", page.body)
	}

	// A deploy: the page says where it runs, lists it, and the actions log
	// has its calls, newest first.
	if a = b.post("cloud/deploy", deploy); a.status != http.StatusSeeOther || a.location != "/console/cloud?deployed=helper" {
		t.Fatalf("deploy: %d %q %q", a.status, a.location, alert(a))
	}
	page = b.get(a.location)
	pool := "projects/acme-agents/locations/europe-west1/workerPools/mesh-helper"
	if !strings.Contains(page.body, `role="status">Deployed helper: Cloud Run runs the worker pool mesh-helper in europe-west1 of acme-agents as your service account`) ||
		!strings.Contains(page.body, `<td data-label="Worker pool"><code class="id">`+pool+`</code></td>`) ||
		!strings.Contains(page.body, `<td data-label="Call"><code>run.UpdateWorkerPool</code></td>`) || strings.Contains(page.body, modelKey) {
		t.Fatalf("after the deploy:\n%s", page.body)
	}
	if i, j := strings.Index(page.body, "run.UpdateWorkerPool"), strings.Index(page.body, "<code>iamcredentials.GenerateAccessToken</code>"); i < 0 || j < i {
		t.Errorf("the actions log is not newest first")
	}
	if wp, by := g.WorkerPool(pool); wp == nil || by != gSA {
		t.Fatalf("the worker pool was written by %q", by)
	}

	// Refused inside the customer's project: 502, and the grant is lowered.
	g.Deny(gSA, gProject, googlefake.PermWorkerPoolsCreate, googlefake.PermWorkerPoolsUpdate)
	a = b.post("cloud/deploy", deploy)
	if a.status != http.StatusBadGateway || !strings.HasPrefix(alert(a), "Your project refused the deploy, so the grant is now revoked: Your side: the deploy's run.UpdateWorkerPool") ||
		grantState(a) != "revoked" || strings.Contains(a.body, modelKey) {
		t.Fatalf("a deploy refused in the project: %d %q (state %q)", a.status, alert(a), grantState(a))
	}
	if !strings.Contains(a.body, `<span class="state state-failed">PERMISSION_DENIED</span>`) {
		t.Errorf("the actions log does not show the refusal")
	}

	// The forms need the session's token.
	if a := b.post("cloud/verify", url.Values{"csrf": {"x"}}); a.status != http.StatusForbidden {
		t.Errorf("verify without the token: %d", a.status)
	}

	// Forgetting makes no call; the log stays.
	calls = len(g.Calls())
	if a = b.post("cloud/forget", url.Values{"csrf": {tok}}); a.status != http.StatusSeeOther || a.location != "/console/cloud?forgotten=1" {
		t.Fatalf("forget: %d %q %q", a.status, a.location, alert(a))
	}
	page = b.get(a.location)
	if !strings.Contains(page.body, `role="status">The grant is forgotten. Nothing was changed in your project`) ||
		!strings.Contains(page.body, `id="no-grant"`) || !strings.Contains(page.body, `<table id="actions">`) {
		t.Errorf("after forgetting:\n%s", page.body)
	}
	if n := len(g.Calls()); n != calls {
		t.Errorf("forgetting made %d calls", n-calls)
	}
}

// Without a deployer the Cloud page says cloud grants are not configured,
// and its forms answer 501 in words.
func TestConsoleCloudNotConfigured(t *testing.T) {
	w := startWorld(t)
	b := newBrowser(t, w.console)
	b.signIn(w, "ana@example.org")
	page := b.get("cloud")
	if page.status != 200 || !strings.Contains(page.body, `<p class="warn" id="cloud-missing">Cloud grants are not configured on this instance`) {
		t.Fatalf("cloud page: %d\n%s", page.status, page.body)
	}
	tok := csrf(t, page)
	for _, form := range []string{"cloud/grant", "cloud/verify", "cloud/forget", "cloud/deploy"} {
		if a := b.post(form, url.Values{"csrf": {tok}, "model_api_key": {modelKey}}); a.status != http.StatusNotImplemented ||
			alert(a) != "Cloud grants are not configured on this instance." || strings.Contains(a.body, modelKey) {
			t.Errorf("POST %s: %d %q", form, a.status, alert(a))
		}
	}
}
