package grants_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"agentmesh.dev/mesh/functions/api"
	"agentmesh.dev/mesh/functions/grants"
	"agentmesh.dev/mesh/shared/grant"
	"agentmesh.dev/mesh/shared/grant/googlefake"
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/store/boltstore"
)

const (
	runtime  = "mesh-runtime@mesh-prod.iam.gserviceaccount.com"
	deployer = "mesh-deployer@mesh-prod.iam.gserviceaccount.com"
	project  = "acme-agents"
	sa       = "mesh-agent@acme-agents.iam.gserviceaccount.com"
)

// inbox keeps the mail the control plane sends.
type inbox struct {
	mu   sync.Mutex
	msgs []mail.Message
}

func (b *inbox) Send(_ context.Context, m mail.Message) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.msgs = append(b.msgs, m)
	return nil
}

var codeRE = regexp.MustCompile(`\b(\d{6})\b`)

func (b *inbox) code(t *testing.T) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	m := codeRE.FindStringSubmatch(b.msgs[len(b.msgs)-1].Text)
	if m == nil {
		t.Fatal("no code in the last mail")
	}
	return m[1]
}

// server is the control plane's routes (every group's, as the cloud and
// meshd build them) over a fake Google world.
type server struct {
	t    *testing.T
	g    *googlefake.Fake
	d    *api.Deps
	url  string
	mail *inbox
}

func start(t *testing.T, configured bool) *server {
	t.Helper()
	s := &server{t: t, g: googlefake.Start(t), mail: &inbox{}}
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "control.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	b := api.Backends{Log: slog.New(slog.DiscardHandler), Store: st, Mail: s.mail, ControlURL: "https://mesh.example.org",
		ConsoleURL: "https://mesh.example.org/console/"}
	if configured {
		tok := s.g.Provider(runtime, deployer)
		b.Grants = api.Grants{Deployer: deployer, Google: &grant.Google{Self: s.g.Options(tok), As: s.g.Options}, CallTimeout: 5 * time.Second}
	}
	if s.d, err = api.NewDeps(b); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	s.d.Mount(mux, grants.Routes)
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	s.url = hs.URL
	return s
}

// signIn makes an account and returns its id and a session token.
func (s *server) signIn(email string) (string, string) {
	s.t.Helper()
	ctx := s.t.Context()
	if _, err := s.d.Accounts.StartLogin(ctx, email, true, "192.0.2.1"); err != nil {
		s.t.Fatal(err)
	}
	tok, _, acct, err := s.d.Accounts.VerifyLogin(ctx, email, s.mail.code(s.t))
	if err != nil {
		s.t.Fatal(err)
	}
	return acct.ID, tok
}

func (s *server) apiToken(acct, session string, scopes ...string) string {
	s.t.Helper()
	p, err := s.d.Accounts.Authenticate(s.t.Context(), acct, session, "")
	if err != nil {
		s.t.Fatal(err)
	}
	tok, _, err := s.d.Accounts.CreateAPIToken(s.t.Context(), p, "tool", scopes)
	if err != nil {
		s.t.Fatal(err)
	}
	return tok
}

// do sends body as it is (a string is sent raw) and decodes the answer.
func (s *server) do(method, path string, body any, bearer string) (int, map[string]any) {
	s.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		raw, _ := json.Marshal(b)
		rd = strings.NewReader(string(raw))
	}
	req, _ := http.NewRequest(method, s.url+path, rd)
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		s.t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, raw)
	}
	return resp.StatusCode, out
}

func body() map[string]any {
	return map[string]any{"provider": "gcp", "project_id": project, "service_account": sa}
}

func grantOf(out map[string]any) map[string]any { g, _ := out["grant"].(map[string]any); return g }

// The grant routes end to end over HTTP: POST records and verifies in one
// call, with grant_to and permissions; the list carries deploys_here;
// verify takes no body at all; a second POST replaces the record; DELETE
// forgets it and makes no call.
func TestGrantRoutes(t *testing.T) {
	s := start(t, true)
	acct, tok := s.signIn("ana@example.org")
	s.g.Customer(project, sa, deployer, acct)
	base := "/v1/accounts/" + acct + "/cloud/grants"

	st, out := s.do("POST", base, body(), tok)
	g := grantOf(out)
	if st != 201 || g["state"] != "verified" || g["verified_at"] == nil || g["last_error"] != nil || g["deploys_here"] != true ||
		g["account_id"] != acct || g["granted_at"] == nil || out["grant_to"] != deployer || out["permissions"] != "https://mesh.example.org"+grant.RolesPath {
		t.Fatalf("POST: %d %v", st, out)
	}
	st, out = s.do("GET", base, nil, tok)
	list, _ := out["grants"].([]any)
	if st != 200 || len(list) != 1 || list[0].(map[string]any)["deploys_here"] != true || out["grant_to"] != deployer {
		t.Fatalf("GET list: %d %v", st, out)
	}
	if st, out = s.do("GET", base+"/gcp", nil, tok); st != 200 || grantOf(out)["project_id"] != project {
		t.Fatalf("GET one: %d %v", st, out)
	}
	if st, out = s.do("GET", base+"/aws", nil, tok); st != 400 || !strings.Contains(out["error"].(string), `"aws" is not supported`) {
		t.Fatalf("GET aws: %d %v", st, out)
	}
	for _, b := range []string{"{}", " ", `{"provider":"gcp"}`} {
		if st, out = s.do("POST", base+"/gcp/verify", b, tok); st != 400 || !strings.Contains(out["error"].(string), "no body") {
			t.Errorf("verify with body %q: %d %v", b, st, out)
		}
	}
	if st, out = s.do("POST", base+"/gcp/verify", nil, tok); st != 200 || grantOf(out)["state"] != "verified" {
		t.Fatalf("verify: %d %v", st, out)
	}
	if st, out = s.do("POST", base, body(), tok); st != 200 || grantOf(out)["state"] != "verified" {
		t.Fatalf("second POST: %d %v", st, out)
	}
	n := len(s.g.Calls())
	if st, out = s.do("DELETE", base+"/gcp", nil, tok); st != 200 || out["forgotten"] != "gcp" || !strings.Contains(out["note"].(string), "Nothing was changed") {
		t.Fatalf("DELETE: %d %v", st, out)
	}
	if calls := s.g.Calls()[n:]; len(calls) != 0 {
		t.Fatalf("DELETE made calls in the customer's project: %+v", calls)
	}
	if st, _ = s.do("GET", base+"/gcp", nil, tok); st != 404 {
		t.Fatalf("GET after DELETE: %d", st)
	}
	// The actions log: session, or an amt_ token with scope audit.
	audit := s.apiToken(acct, tok, "audit")
	st, out = s.do("GET", "/v1/accounts/"+acct+"/cloud/actions?provider=gcp&limit=500", nil, audit)
	acts, _ := out["actions"].([]any)
	if st != 200 || len(acts) != 6 {
		t.Fatalf("actions: %d %v", st, out)
	}
	a := acts[0].(map[string]any)
	if a["call"] != "resourcemanager.GetProject" || a["outcome"] != "ok" || a["trigger"] != "create" || a["project_id"] != project ||
		a["service_account"] != sa || a["at"] == nil || a["duration_ms"] == nil {
		t.Errorf("newest action %v", a)
	}
}

// The POST body is exactly provider, project_id and service_account: a
// member the service writes is refused by name, anything else as unknown,
// and nothing is recorded or called.
func TestPostBodyIsExactlyThreeMembers(t *testing.T) {
	s := start(t, true)
	acct, tok := s.signIn("ana@example.org")
	s.g.Customer(project, sa, deployer, acct)
	with := func(k string, v any) map[string]any { b := body(); b[k] = v; return b }
	for _, tc := range []struct {
		body any
		word string
	}{
		{with("state", "verified"), "state is written by the service only"},
		{with("verified_at", nil), "verified_at is written by the service only"},
		{with("last_error", ""), "last_error is written by the service only"},
		{with("deploys_here", true), "deploys_here is written by the service only"},
		{with("region", "eu"), `unknown member "region"`},
		{with("Provider", "gcp"), "case-sensitive"},
		{with("provider", "aws"), `provider "aws" is not supported`},
		{with("provider", 7), "provider"},
		{`{"provider":"gcp","provider":"gcp","project_id":"acme-agents","service_account":"` + sa + `"}`, "duplicate"},
		{`[1,2]`, "JSON object"},
		{"", "body is required"},
	} {
		st, out := s.do("POST", "/v1/accounts/"+acct+"/cloud/grants", tc.body, tok)
		if st != 400 || !strings.Contains(out["error"].(string), tc.word) {
			t.Errorf("%v: %d %v, want 400 saying %q", tc.body, st, out, tc.word)
		}
	}
	if calls := s.g.Calls(); len(calls) != 0 {
		t.Errorf("refused bodies made calls: %+v", calls)
	}
	if _, out := s.do("GET", "/v1/accounts/"+acct+"/cloud/grants", nil, tok); len(out["grants"].([]any)) != 0 {
		t.Errorf("refused bodies recorded grants: %v", out)
	}
}

// Grant routes take a session only (spec §5: no API token), of the account
// in the path; the actions log also takes an amt_ token with scope audit.
func TestSessionOnly(t *testing.T) {
	s := start(t, true)
	acct, tok := s.signIn("ana@example.org")
	s.g.Customer(project, sa, deployer, acct)
	_, other := s.signIn("eve@example.org")
	all := s.apiToken(acct, tok, "audit", "read")
	read := s.apiToken(acct, tok, "read")
	g := "/v1/accounts/" + acct + "/cloud/grants"
	for _, rq := range []struct{ method, path string }{
		{"POST", g}, {"GET", g}, {"GET", g + "/gcp"}, {"POST", g + "/gcp/verify"}, {"DELETE", g + "/gcp"}, {"POST", g + "/gcp/deploys"},
	} {
		for name, bearer := range map[string]string{"API token": all, "no token": "", "another account's session": other} {
			var b any
			if rq.method == "POST" && !strings.HasSuffix(rq.path, "verify") {
				b = body()
			}
			if st, out := s.do(rq.method, rq.path, b, bearer); st != 401 {
				t.Errorf("%s %s with %s: %d %v", rq.method, rq.path, name, st, out)
			}
		}
	}
	actions := "/v1/accounts/" + acct + "/cloud/actions"
	if st, out := s.do("GET", actions, nil, all); st != 200 {
		t.Errorf("actions with an audit token: %d %v", st, out)
	}
	if st, out := s.do("GET", actions, nil, read); st != 401 {
		t.Errorf("actions with a read token: %d %v", st, out)
	}
	for _, q := range []string{"?limit=501", "?limit=0", "?limit=ten", "?provider=aws"} {
		if st, out := s.do("GET", actions+q, nil, tok); st != 400 {
			t.Errorf("actions%s: %d %v", q, st, out)
		}
	}
	if len(s.g.Calls()) != 0 {
		t.Errorf("refused callers made calls: %+v", s.g.Calls())
	}
}

// A deploy mints an agent key, so it needs what minting needs: a session
// whose passkey check is fresh. Without one it is refused before any call.
func TestDeployNeedsAFreshPasskey(t *testing.T) {
	s := start(t, true)
	acct, tok := s.signIn("ana@example.org")
	s.g.Customer(project, sa, deployer, acct)
	s.do("POST", "/v1/accounts/"+acct+"/cloud/grants", body(), tok)
	n := len(s.g.Calls())
	st, out := s.do("POST", "/v1/accounts/"+acct+"/cloud/grants/gcp/deploys", map[string]any{"name": "helper", "region": "europe-west1",
		"image": "europe-west1-docker.pkg.dev/acme-agents/agents/helper:1", "bucket": "acme-state", "model_api_key": "sk-1"}, tok)
	if st != 403 || out["details"].(map[string]any)["passkey_required"] != true {
		t.Fatalf("deploy without a passkey check: %d %v", st, out)
	}
	if st, out := s.do("POST", "/v1/accounts/"+acct+"/cloud/grants/gcp/deploys", `{"name":"helper","replicas":3}`, tok); st != 400 ||
		!strings.Contains(out["error"].(string), `unknown member "replicas"`) {
		t.Errorf("deploy with an unknown member: %d %v", st, out)
	}
	if calls := s.g.Calls()[n:]; len(calls) != 0 {
		t.Errorf("refused deploys made calls: %+v", calls)
	}
}

// The published role list is served as a page with the deployer filled
// in, also on an instance without grants, whose grant routes answer 501.
func TestRolesPageAndNotConfigured(t *testing.T) {
	for _, configured := range []bool{true, false} {
		s := start(t, configured)
		resp, err := http.Get(s.url + grant.RolesPath)
		if err != nil {
			t.Fatal(err)
		}
		page, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") ||
			!strings.Contains(string(page), "roles/iam.serviceAccountTokenCreator") || strings.Contains(string(page), deployer) != configured {
			t.Errorf("configured=%v: %d %s", configured, resp.StatusCode, page)
		}
		if !configured {
			acct, tok := s.signIn("ana@example.org")
			if st, out := s.do("GET", "/v1/accounts/"+acct+"/cloud/grants", nil, tok); st != 501 || !strings.Contains(out["error"].(string), "MESH_DEPLOYER_SA") {
				t.Errorf("grants without a deployer: %d %v", st, out)
			}
		}
	}
}

// The re-check is a scheduled row; its function runs the service's
// Recheck and reports the count.
func TestRecheckJobRow(t *testing.T) {
	s := start(t, true)
	var row api.Route
	for _, rt := range grants.Routes {
		if rt.Auth.Kind == api.AuthScheduled {
			row = rt
		}
	}
	if row.EntryPoint != "CloudGrantRecheck" || row.Auth.Every != grant.RecheckEvery {
		t.Fatalf("job row %+v", row)
	}
	rec := httptest.NewRecorder()
	s.d.Function(row).ServeHTTP(rec, httptest.NewRequest("POST", row.Path, nil))
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"job":"CloudGrantRecheck"`) {
		t.Fatalf("job: %d %s", rec.Code, rec.Body)
	}
}
