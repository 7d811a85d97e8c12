package audit_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/functions/api"
	auditfn "agentmesh.dev/mesh/functions/audit"
	"agentmesh.dev/mesh/shared/audit"
	"agentmesh.dev/mesh/shared/audit/audittest"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/credential"
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/store/boltstore"
)

// inbox keeps the control plane's mail.
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

// env is a control plane with the audit routes over a broker whose audit
// stream has two agents' chains, and two test-only authorities.
type env struct {
	t      *testing.T
	d      *api.Deps
	mux    *http.ServeMux
	mail   *inbox
	chains *audit.Chains
	auths  []*audittest.Authority
	export string
}

func newEnv(t *testing.T, withAuthorities bool) *env {
	t.Helper()
	b := bustest.Start(t)
	nc, err := b.ConnectService("control-plane")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	// The activity worker's part: the stream and its rows.
	chains, err := audit.OpenChains(t.Context(), audit.ChainsConfig{JS: js})
	if err != nil {
		t.Fatal(err)
	}
	for i, agent := range []string{audittest.Agent(t), audittest.Agent(t)} {
		for n := range i + 2 {
			if _, _, err := chains.Append(t.Context(), audittest.Entry(agent, n)); err != nil {
				t.Fatal(err)
			}
		}
	}
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "control.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	e := &env{t: t, mail: &inbox{}, chains: chains, mux: http.NewServeMux()}
	exportKey := bustest.Agent(t)
	e.export = exportKey.Public()
	cfg := api.Audit{ExportKey: exportKey,
		// The anchor job runs as if two days had passed: today has ended.
		Now: func() time.Time { return time.Now().Add(48 * time.Hour) }}
	if withAuthorities {
		e.auths = []*audittest.Authority{audittest.NewAuthority(t, "tsa-one"), audittest.NewAuthority(t, "tsa-two")}
		for _, a := range e.auths {
			a.Now = cfg.Now // they stamp after the anchored date ends, as real ones do
			cfg.Authorities = append(cfg.Authorities, a.Config())
		}
	}
	e.d, err = api.NewDeps(api.Backends{Log: slog.New(slog.DiscardHandler), Store: st, Mail: e.mail,
		Bus: &bus.Caller{NC: nc, Key: b.ServicesKey()}, ConsoleURL: "http://localhost/console/", ControlURL: "http://localhost",
		Mesh: credential.MeshInfo{Name: "test-mesh"}, Audit: cfg})
	if err != nil {
		t.Fatal(err)
	}
	e.d.Mount(e.mux, auditfn.Routes)
	return e
}

// get answers a GET on the mounted routes.
func (e *env) get(path, bearer string) (int, []byte, http.Header) {
	e.t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	rec := httptest.NewRecorder()
	e.mux.ServeHTTP(rec, req)
	body, _ := io.ReadAll(rec.Body)
	return rec.Code, body, rec.Header()
}

func (e *env) getJSON(path, bearer string) (int, map[string]any) {
	e.t.Helper()
	st, body, _ := e.get(path, bearer)
	var out map[string]any
	if err := json.Unmarshal(body, &out); err != nil {
		e.t.Fatalf("GET %s: %d, not JSON: %s", path, st, body)
	}
	return st, out
}

// runJob runs the anchor job's row as Cloud Scheduler does.
func (e *env) runJob() (int, map[string]any) {
	e.t.Helper()
	rec := httptest.NewRecorder()
	e.d.Function(auditfn.Routes[0]).ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/jobs/audit-anchor", nil))
	var out map[string]any
	_ = json.Unmarshal(rec.Body.Bytes(), &out)
	return rec.Code, out
}

// The anchor job anchors the last date that has ended, once however often
// it runs; the listing, the document, the proof and the authorities are
// public and agree with each other: the document's SHA-256 is the
// listed one, and every stamp of the proof verifies against it with the
// published root.
func TestAnchorRoutes(t *testing.T) {
	e := newEnv(t, true)
	rt := auditfn.Routes[0]
	if rt.Auth != api.Scheduled(auditfn.AnchorEvery) || rt.Path != "/jobs/audit-anchor" {
		t.Fatalf("job row %+v", rt)
	}
	if st, out := e.runJob(); st != 200 || out["count"] != float64(1) {
		t.Fatalf("anchor job: %d %v", st, out)
	}
	if st, out := e.runJob(); st != 200 || out["count"] != float64(0) {
		t.Fatalf("anchor job again: %d %v", st, out)
	}

	st, out := e.getJSON("/v1/anchors", "")
	items, _ := out["anchors"].([]any)
	if st != 200 || len(items) != 1 || out["test_only"] != false {
		t.Fatalf("anchors: %d %v", st, out)
	}
	a := items[0].(map[string]any)
	date := time.Now().Add(24 * time.Hour).UTC().Format(time.DateOnly)
	if a["date"] != date || a["status"] != audit.StatusStamped || a["heads"] != float64(2) || a["rows"] != float64(5) ||
		a["document_url"] != "/v1/anchors/"+date+"/document" || a["proof_url"] != "/v1/anchors/"+date+"/proof" || len(a["stamped_by"].([]any)) != 2 {
		t.Fatalf("anchor entry %v", a)
	}

	st, doc, hdr := e.get(a["document_url"].(string), "")
	sum := sha256.Sum256(doc)
	var d audit.Document
	if st != 200 || hdr.Get("Content-Type") != "application/json" || hex.EncodeToString(sum[:]) != a["document_sha256"] ||
		json.Unmarshal(doc, &d) != nil || d.Root != a["root"] || d.Mesh != "test-mesh" {
		t.Fatalf("document: %d %s", st, doc)
	}
	if canon, _ := d.Canonical(); string(canon) != string(doc) {
		t.Fatalf("the document is not served as its canonical bytes: %s", doc)
	}

	st, body, _ := e.get(a["proof_url"].(string), "")
	var proof struct {
		DocumentSHA256 string `json:"document_sha256"`
		Stamps         []struct {
			Authority     string   `json:"authority"`
			AuthorityID   string   `json:"authority_id"`
			Nonce         string   `json:"nonce"`
			Token         []byte   `json:"token"`
			Root          []byte   `json:"root"`
			Intermediates [][]byte `json:"intermediates"`
		} `json:"stamps"`
	}
	if st != 200 || json.Unmarshal(body, &proof) != nil || len(proof.Stamps) != 2 || proof.DocumentSHA256 != a["document_sha256"] {
		t.Fatalf("proof: %d %s", st, body)
	}
	st, out = e.getJSON("/v1/anchors/authorities", "")
	auths, _ := out["authorities"].([]any)
	if st != 200 || len(auths) != 2 {
		t.Fatalf("authorities: %d %v", st, out)
	}
	roots := map[string]string{}
	for _, x := range auths {
		m := x.(map[string]any)
		roots[m["id"].(string)] = m["root_pem"].(string)
		if m["test_only"] != false || !strings.HasPrefix(m["url"].(string), "http://127.0.0.1:") {
			t.Fatalf("authority %v", m)
		}
	}
	for _, s := range proof.Stamps {
		if !strings.Contains(roots[s.AuthorityID], "BEGIN CERTIFICATE") || audit.RootID(s.Root) != s.AuthorityID {
			t.Fatalf("stamp of %s names a root the mesh does not publish", s.Authority)
		}
		stamp := audit.Stamp{Authority: s.Authority, Nonce: s.Nonce, Token: s.Token, Root: s.Root, Intermediates: s.Intermediates}
		if _, err := stamp.Verify(sum[:]); err != nil {
			t.Fatalf("stamp of %s: %v", s.Authority, err)
		}
	}

	for path, want := range map[string]int{
		"/v1/anchors/2020-01-01/document": 404, "/v1/anchors/yesterday/proof": 400, "/v1/anchors?limit=0": 400, "/v1/anchors?limit=366": 200,
	} {
		if st, _, _ := e.get(path, ""); st != want {
			t.Errorf("GET %s: %d, want %d", path, st, want)
		}
	}
}

// Without authorities the job is not configured (501); the listing still
// answers.
func TestAnchorJobNotConfigured(t *testing.T) {
	e := newEnv(t, false)
	if st, _ := e.runJob(); st != http.StatusNotImplemented {
		t.Fatalf("job without authorities: %d", st)
	}
	if st, out := e.getJSON("/v1/anchors", ""); st != 200 || len(out["anchors"].([]any)) != 0 {
		t.Fatalf("anchors: %d %v", st, out)
	}
	caps := e.d.Capabilities["audit"].(map[string]any)
	if caps["anchors"] != false || caps["export_key"] != e.export {
		t.Fatalf("capabilities %v", caps)
	}
}

// The export is the account's: a session, or an API token with scope
// "audit" (not "read"); it is the signed bundle, as a file, that verifies
// under the export key the capabilities publish.
func TestExportRoute(t *testing.T) {
	e := newEnv(t, true)
	ctx := t.Context()
	if _, err := e.d.Accounts.StartLogin(ctx, "ana@example.org", true, "127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	e.mail.mu.Lock()
	code := codeRE.FindStringSubmatch(e.mail.msgs[len(e.mail.msgs)-1].Text)[1]
	e.mail.mu.Unlock()
	session, _, acct, err := e.d.Accounts.VerifyLogin(ctx, "ana@example.org", code)
	if err != nil {
		t.Fatal(err)
	}
	p, err := e.d.Accounts.Authenticate(ctx, acct.ID, session, "")
	if err != nil {
		t.Fatal(err)
	}
	auditTok, _, err := e.d.Accounts.CreateAPIToken(ctx, p, "auditor", []string{"audit"})
	if err != nil {
		t.Fatal(err)
	}
	readTok, _, err := e.d.Accounts.CreateAPIToken(ctx, p, "reader", []string{"read"})
	if err != nil {
		t.Fatal(err)
	}
	path := "/v1/accounts/" + acct.ID + "/audit/export"
	for _, bearer := range []string{session, auditTok} {
		st, body, hdr := e.get(path, bearer)
		if st != 200 || !strings.HasPrefix(hdr.Get("Content-Disposition"), `attachment; filename="audit-`+acct.ID+"-") {
			t.Fatalf("export: %d %v %s", st, hdr, body)
		}
		b, err := audit.ParseBundle(body)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := audit.Check(b, audit.Trust{Signer: e.d.Capabilities["audit"].(map[string]any)["export_key"].(string)}); err != nil {
			t.Fatal(err)
		}
		if b.Manifest.Account != acct.ID || b.Manifest.Mesh != "test-mesh" || len(b.Chains) != 0 {
			t.Fatalf("manifest %+v", b.Manifest)
		}
	}
	for bearer, want := range map[string]int{"": 401, readTok: 401} {
		if st, body, _ := e.get(path, bearer); st != want {
			t.Errorf("export with %q: %d %s", bearer, st, body)
		}
	}
}
