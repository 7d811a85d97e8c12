package console_test

import (
	"context"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/devenv"
	"agentmesh.dev/mesh/functions/api"
	"agentmesh.dev/mesh/shared/grant"
	"agentmesh.dev/mesh/shared/grant/googlefake"
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/mail/mailtest"
	"agentmesh.dev/mesh/shared/testclock"
)

// clock is the control plane's clock in tests: real time plus an offset
// the test can move forward (the broker keeps real time).
type clock = testclock.Clock

// world is a whole in-process mesh (meshd's handlers, workers and broker)
// whose mail goes to a real SMTP server in the test; startCloudWorld adds
// a fake Google for the cloud grants.
type world struct {
	t       *testing.T
	m       *devenv.Mesh
	smtp    *mailtest.Server
	clock   *clock
	console string // the console URL meshd prints: http://localhost:<port>/console/
}

func startWorld(t *testing.T, mut ...func(*devenv.Config)) *world {
	t.Helper()
	srv := mailtest.Start(t)
	sender, err := mail.NewSMTP(mail.SMTPConfig{Addr: srv.Addr(), From: "mesh@mesh.test", TLS: mail.StartTLSNone})
	if err != nil {
		t.Fatal(err)
	}
	w := &world{t: t, smtp: srv, clock: &clock{}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := devenv.Config{DataDir: t.TempDir(), Mail: sender, Now: w.clock.Now, MeshName: "test-mesh"}
	for _, m := range mut {
		m(&cfg)
	}
	w.m, err = devenv.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.m.Close() })
	w.console = w.m.URLs().Console
	return w
}

var codeRE = regexp.MustCompile(`\b(\d{6})\b`)

// mailedCode waits for the next mail to addr and returns the code in it.
func (w *world) mailedCode(addr string) string {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	msg, err := w.smtp.Wait(ctx, addr)
	if err != nil {
		w.t.Fatalf("no mail to %s: %v", addr, err)
	}
	m := codeRE.FindStringSubmatch(msg.Message.Text)
	if m == nil {
		w.t.Fatalf("no code in mail: %q", msg.Message.Text)
	}
	return m[1]
}

// browser is a browser without a screen: a cookie jar, redirects not
// followed, so each answer can be looked at.
type browser struct {
	t      *testing.T
	base   *url.URL // the console URL
	hc     *http.Client
	origin string // sent as Origin on posts ("" sends none)
}

func newBrowser(t *testing.T, consoleURL string) *browser {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	u, err := url.Parse(consoleURL)
	if err != nil {
		t.Fatal(err)
	}
	return &browser{t: t, base: u, origin: u.Scheme + "://" + u.Host, hc: &http.Client{
		Jar: jar, Timeout: 15 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// answer is one response, read.
type answer struct {
	status   int
	body     string
	location string
	header   http.Header
}

func (b *browser) url(path string) string {
	ref, err := url.Parse(strings.TrimPrefix(path, "/console/"))
	if err != nil {
		b.t.Fatal(err)
	}
	return b.base.ResolveReference(ref).String()
}

func (b *browser) do(req *http.Request) answer {
	b.t.Helper()
	resp, err := b.hc.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, body: string(body), location: resp.Header.Get("Location"), header: resp.Header}
}

// get fetches a console page; path is relative to the console
// ("agent-keys") or absolute under it ("/console/agent-keys?x=1").
func (b *browser) get(path string) answer {
	b.t.Helper()
	req, err := http.NewRequest(http.MethodGet, b.url(path), nil)
	if err != nil {
		b.t.Fatal(err)
	}
	return b.do(req)
}

// post sends a form, as a browser on the console's own page would (with
// its Origin), plus any extra headers.
func (b *browser) post(path string, form url.Values, header ...string) answer {
	b.t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.url(path), strings.NewReader(form.Encode()))
	if err != nil {
		b.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if b.origin != "" {
		req.Header.Set("Origin", b.origin)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return b.do(req)
}

// postJSON is what console.js sends to the passkey calls.
func (b *browser) postJSON(path, body, csrf string) answer {
	b.t.Helper()
	req, err := http.NewRequest(http.MethodPost, b.url(path), strings.NewReader(body))
	if err != nil {
		b.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Origin", b.origin)
	if csrf != "" {
		req.Header.Set("X-CSRF-Token", csrf)
	}
	return b.do(req)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf is the CSRF value of the forms on a page.
func csrf(t *testing.T, page answer) string {
	t.Helper()
	m := csrfRE.FindStringSubmatch(page.body)
	if m == nil {
		t.Fatalf("no csrf field on the page (%d):\n%s", page.status, page.body)
	}
	return m[1]
}

// signIn goes through the console's sign-in with the mailed code.
func (b *browser) signIn(w *world, email string) {
	b.t.Helper()
	page := b.get("login")
	a := b.post("login", url.Values{"email": {email}, "csrf": {csrf(b.t, page)}})
	if a.status != http.StatusSeeOther {
		b.t.Fatalf("send code: %d\n%s", a.status, a.body)
	}
	code := w.mailedCode(email)
	page = b.get(a.location)
	a = b.post("login/verify", url.Values{"email": {email}, "code": {code}, "csrf": {csrf(b.t, page)}})
	if a.status != http.StatusSeeOther || a.location != "/console/" {
		b.t.Fatalf("verify: %d %q\n%s", a.status, a.location, a.body)
	}
}

// alert is the text of the first non-empty role="alert" element.
var alertRE = regexp.MustCompile(`role="alert">([^<]+)<`)

func alert(page answer) string {
	m := alertRE.FindStringSubmatch(page.body)
	if m == nil {
		return ""
	}
	return html.UnescapeString(m[1])
}

// The fake Google's names: the mesh's own two accounts, and a customer's
// project and account.
const (
	gRuntime  = "mesh-runtime@mesh-prod.iam.gserviceaccount.com"
	gDeployer = "mesh-deployer@mesh-prod.iam.gserviceaccount.com"
	gProject  = "acme-agents"
	gSA       = "mesh-agent@acme-agents.iam.gserviceaccount.com"
)

// startCloudWorld is a world whose control plane reaches a fake Google
// (shared/grant/googlefake, one in-memory world over the real client
// libraries) for its cloud grants, as meshd reaches the real one. The
// customer's side of the world is left to the test (g.Customer).
func startCloudWorld(t *testing.T) (*world, *googlefake.Fake) {
	t.Helper()
	g := googlefake.Start(t)
	tok := g.Provider(gRuntime, gDeployer)
	w := startWorld(t, func(cfg *devenv.Config) {
		cfg.Grants = api.Grants{Deployer: gDeployer, Google: &grant.Google{Self: g.Options(tok), As: g.Options}, CallTimeout: 5 * time.Second}
	})
	return w, g
}
