package console_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/webauthn"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"agentmesh.dev/mesh/shared/grant"
	"agentmesh.dev/mesh/shared/grant/googlefake"
)

// browserCandidates are where the console's browser test looks for a
// browser, in order: Debian's chromium first (.ci/run installs it).
var browserCandidates = []string{"/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless_shell"}

func findBrowser() string {
	for _, c := range browserCandidates {
		if p, err := exec.LookPath(c); err == nil {
			return p
		}
	}
	return ""
}

// screenshotDir is where the browser test leaves its screenshots for a
// reviewer: $MESH_SCREENSHOTS_DIR, or test-output/console at the
// repository root (git-ignored).
func screenshotDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("MESH_SCREENSHOTS_DIR")
	if dir == "" {
		dir = filepath.Join("..", "..", "test-output", "console")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		t.Fatal(err)
	}
	// Drop the last run's screenshots, so the folder shows this run only.
	old, _ := filepath.Glob(filepath.Join(abs, "[0-9][0-9]-*.png"))
	for _, f := range old {
		_ = os.Remove(f)
	}
	return abs
}

// buildAdapter builds the mesh-adapter binary, as its own end-to-end tests
// do, so the key the page shows is redeemed by the real command.
func buildAdapter(t *testing.T) func() string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "mesh-adapter")
	var out []byte
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		out, err = exec.Command("go", "build", "-o", bin, "agentmesh.dev/mesh/adapter/cmd/mesh-adapter").CombinedOutput()
	}()
	t.Cleanup(func() { <-done }) // before the temporary directory goes
	return func() string {
		t.Helper()
		<-done
		if err != nil {
			t.Fatalf("build mesh-adapter: %v\n%s", err, out)
		}
		return bin
	}
}

// page is the browser test's tab: a headless Chromium with a virtual
// WebAuthn authenticator (CTAP2, internal, resident keys, user verification
// that succeeds), on the console of an in-process mesh.
type page struct {
	t     *testing.T
	ctx   context.Context
	w     *world
	shots string
	n     int
	auth  webauthn.AuthenticatorID
}

// needBrowser finds the browser, or skips the test saying why; with CI set
// a missing browser fails it instead.
func needBrowser(t *testing.T) string {
	t.Helper()
	exe := findBrowser()
	if exe == "" {
		msg := "no Chromium found (looked for " + strings.Join(browserCandidates, ", ") + "); install Debian's: apt-get install -y chromium"
		if os.Getenv("CI") != "" {
			t.Fatal(msg + " (.ci/run does this; CI must run the console's browser test)")
		}
		t.Skip("skipping the console's browser test: " + msg)
	}
	return exe
}

func openPage(t *testing.T, w *world, exe string) *page {
	t.Helper()
	var output bytes.Buffer
	var outMu sync.Mutex
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(exe),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.Flag("password-store", "basic"),
		chromedp.WindowSize(1200, 900),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.CombinedOutput(writerFunc(func(b []byte) (int, error) {
			outMu.Lock()
			defer outMu.Unlock()
			return output.Write(b)
		})),
	)
	ctx, cancelTab := chromedp.NewContext(alloc)
	ctx, cancelTimeout := context.WithTimeout(ctx, 50*time.Second)
	t.Cleanup(func() {
		cancelTimeout()
		cancelTab()
		cancelAlloc()
		if t.Failed() {
			outMu.Lock()
			t.Logf("browser output:\n%s", output.String())
			outMu.Unlock()
		}
	})
	p := &page{t: t, ctx: ctx, w: w, shots: screenshotDir(t)}
	t.Logf("browser %s; screenshots in %s", exe, p.shots)
	if _, err := chromedp.Call(ctx, webauthn.Enable, webauthn.EnableParams{}); err != nil {
		t.Fatalf("start the browser and enable WebAuthn: %v", err)
	}
	va, err := chromedp.Call(ctx, webauthn.AddVirtualAuthenticator, webauthn.AddVirtualAuthenticatorParams{
		Options: &webauthn.VirtualAuthenticatorOptions{
			Protocol:                    webauthn.AuthenticatorProtocolCtap2,
			Transport:                   webauthn.AuthenticatorTransportInternal,
			HasResidentKey:              true,
			HasUserVerification:         true,
			IsUserVerified:              true,
			AutomaticPresenceSimulation: true,
		}})
	if err != nil {
		t.Fatalf("virtual authenticator: %v", err)
	}
	p.auth = va.AuthenticatorID
	return p
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

// do runs steps; a failure names the step and the page it happened on.
func (p *page) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 15*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		loc, _ := chromedp.Run(p.ctx, chromedp.Location())
		body, _ := chromedp.Run(p.ctx, chromedp.Text(chromedp.CSS("main")))
		p.t.Fatalf("%s: %v\n(at %s)\n%s", what, err, loc, body)
	}
}

func (p *page) text(sel string) string {
	p.t.Helper()
	s, err := chromedp.Run(p.ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		p.t.Fatalf("text of %s: %v", sel, err)
	}
	return strings.TrimSpace(s)
}

// shot saves a full-page PNG of what the browser shows.
func (p *page) shot(name string) {
	p.t.Helper()
	buf, err := chromedp.Run(p.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		p.t.Fatalf("screenshot %s: %v", name, err)
	}
	p.n++
	file := filepath.Join(p.shots, fmt.Sprintf("%02d-%s.png", p.n, name))
	if err := os.WriteFile(file, buf, 0o644); err != nil {
		p.t.Fatal(err)
	}
}

// signIn signs in with the code mailed to the test's SMTP server, using
// the keyboard to send the forms.
func (p *page) signIn(email string) {
	p.t.Helper()
	p.do("open the console", chromedp.Navigate(p.w.console), chromedp.WaitVisible(chromedp.CSS(`#email`)))
	if title, _ := chromedp.Run(p.ctx, chromedp.Title()); title != "Sign in – agentmesh console" {
		p.t.Errorf("sign-in page title %q", title)
	}
	p.shot("sign-in")
	p.do("send the code", chromedp.SendKeys(chromedp.CSS(`#email`), email+kb.Enter), chromedp.WaitVisible(chromedp.CSS(`#code`)))
	p.shot("code-entry")
	code := p.w.mailedCode(email)
	p.do("enter the code", chromedp.SendKeys(chromedp.CSS(`#code`), code+kb.Enter), chromedp.WaitVisible(chromedp.CSS(`dl.facts`)))
	if got := p.text("h1"); got != "Your account" {
		p.t.Fatalf("after signing in: %q", got)
	}
	p.shot("account-home")
}

// registerPasskey adds a passkey through the virtual authenticator.
func (p *page) registerPasskey() {
	p.t.Helper()
	p.do("open passkeys", chromedp.Navigate(p.w.console+"passkeys"), chromedp.WaitVisible(chromedp.CSS(`#register-passkey`)))
	p.do("register a passkey", chromedp.Click(chromedp.CSS(`#register-passkey`)), chromedp.WaitVisible(chromedp.CSS(`p.notice`)))
	if got := p.text("p.notice"); !strings.HasPrefix(got, "Passkey registered.") {
		p.t.Fatalf("after registering: %q (error: %q)", got, p.text("#register-error"))
	}
	if got := p.text("#passkey-count"); !strings.HasPrefix(got, "You have 1 passkey.") {
		p.t.Errorf("passkey count: %q", got)
	}
	p.shot("passkey-registered")
}

// registerAgainAssertsFirst clicks "Register a passkey" on an account that
// already has one: the page runs an assertion with the existing passkey
// first (the server refuses a second passkey without one), then the
// registration, which this one virtual authenticator declines because it
// already holds the account's passkey. The error shown is the browser's
// (not the server's refusal), and the assertion left the session fresh.
func (p *page) registerAgainAssertsFirst() {
	p.t.Helper()
	p.do("open passkeys", chromedp.Navigate(p.w.console+"passkeys"), chromedp.WaitVisible(chromedp.CSS(`#register-passkey[data-passkey-register="assert-first"]`)))
	if got := p.text("#passkey-count"); strings.Contains(got, "counts until") {
		p.t.Fatalf("the session is fresh before the assertion: %q", got)
	}
	p.do("register a second passkey on the same device", chromedp.Click(chromedp.CSS(`#register-passkey`)),
		chromedp.Poll[chromedp.Void](`document.getElementById("register-error").textContent !== ""`, chromedp.WithPollingTimeout(10*time.Second)))
	if got := p.text("#register-error"); got != "This device already holds a passkey for your account." {
		p.t.Fatalf("registering again on the same device says %q", got)
	}
	p.shot("passkey-again-refused")
	p.do("reload passkeys", chromedp.Navigate(p.w.console+"passkeys"), chromedp.WaitVisible(chromedp.CSS(`#passkey-count`)))
	if got := p.text("#passkey-count"); !strings.HasPrefix(got, "You have 1 passkey.") || !strings.Contains(got, "counts until") {
		p.t.Errorf("after the assertion: %q", got)
	}
}

// mintAgentKey mints a key: the page runs the passkey assertion (through
// the virtual authenticator) right before it posts the form, and shows the
// key and its command once.
func (p *page) mintAgentKey(name, operator string) (key, command string) {
	p.t.Helper()
	p.do("open agent keys", chromedp.Navigate(p.w.console+"agent-keys"), chromedp.WaitVisible(chromedp.CSS(`#mint-name`)))
	p.do("fill the mint form", chromedp.SendKeys(chromedp.CSS(`#mint-name`), name), chromedp.SendKeys(chromedp.CSS(`#mint-operator`), operator))
	p.do("mint", chromedp.Click(chromedp.CSS(`#mint-form button[type="submit"]`)), chromedp.WaitVisible(chromedp.CSS(`#agent-key`)))
	key, command = p.text("#agent-key"), p.text("#up-command")
	p.shot("agent-key-minted")
	return key, command
}

// mintRefusedWithoutPasskey tries to mint before any passkey exists: the
// page's passkey step fails and says why next to the form.
func (p *page) mintRefusedWithoutPasskey() {
	p.t.Helper()
	p.do("open agent keys", chromedp.Navigate(p.w.console+"agent-keys"), chromedp.WaitVisible(chromedp.CSS(`#mint-name`)))
	p.do("mint without a passkey", chromedp.SendKeys(chromedp.CSS(`#mint-name`), "early"),
		chromedp.Click(chromedp.CSS(`#mint-form button[type="submit"]`)),
		chromedp.Poll[chromedp.Void](`document.getElementById("mint-error").textContent !== ""`, chromedp.WithPollingTimeout(10*time.Second)))
	if got := p.text("#mint-error"); got != "This account has no passkey yet; register one first." {
		p.t.Errorf("minting without a passkey says %q", got)
	}
	p.shot("mint-refused")
}

func (p *page) createToken(name string) string {
	p.t.Helper()
	p.do("open API tokens", chromedp.Navigate(p.w.console+"tokens"), chromedp.WaitVisible(chromedp.CSS(`#token-name`)))
	p.do("create a token", chromedp.SendKeys(chromedp.CSS(`#token-name`), name), chromedp.Click(chromedp.CSS(`#scope-read`)),
		chromedp.Click(chromedp.CSS(`form[action="/console/tokens"] button[type="submit"]`)), chromedp.WaitVisible(chromedp.CSS(`#api-token`)))
	tok := p.text("#api-token")
	p.shot("api-token-created")
	return tok
}

// up runs `mesh-adapter ... up <key>` exactly as the page printed it, with
// a state directory of its own, until it prints its agent id; it returns
// that id and the state directory (which later commands, such as `pair`,
// use as the agent's).
func up(t *testing.T, bin, command string) (agentID, state string) {
	t.Helper()
	args := strings.Fields(command)
	if len(args) < 2 || args[0] != "mesh-adapter" {
		t.Fatalf("the page's command %q is not a mesh-adapter command", command)
	}
	state, err := os.MkdirTemp("", "ma") // short: the adapter's socket lives there
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(state) })
	cmd := exec.Command(bin, append([]string{"--state-dir", state}, args[1:]...)...)
	cmd.Env = append(os.Environ(), "MESH_ADAPTER_HOME=", "MESH_CONTROL_URL=", "MESH_REGISTRAR_URL=")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ids := make(chan string, 1)
	var lines []string
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			mu.Lock()
			lines = append(lines, sc.Text())
			mu.Unlock()
			if id, ok := strings.CutPrefix(sc.Text(), "agent id: "); ok {
				select {
				case ids <- strings.TrimSpace(id):
				default:
				}
			}
		}
		_ = cmd.Wait()
	}()
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}
	defer stop()
	select {
	case id := <-ids:
		return id, state
	case <-done:
	case <-time.After(30 * time.Second):
	}
	mu.Lock()
	defer mu.Unlock()
	t.Fatalf("%s printed no agent id:\n%s", command, strings.Join(lines, "\n"))
	return "", ""
}

// The console in a real browser, end to end: sign in with the mailed
// code, register a passkey (Chrome's virtual authenticator), mint an agent
// key (the passkey assertion runs right before the form is sent), read the
// key off the page, and run the built mesh-adapter with the command the
// page shows: it redeems the key against the same mesh and prints its
// agent id, which the page then lists. Screenshots of each page are left
// in test-output/console (or $MESH_SCREENSHOTS_DIR).
//
// Handles: claim "helper" (the operator name is inherited from the key's
// claim), start pairing, read the code and the command the page shows, run
// that command with the built adapter on the agent's state directory (the
// adapter signs the code with the agent key), and resolve the handle at the
// registrar: its card names the agent.
func TestConsoleInBrowser(t *testing.T) {
	exe := needBrowser(t)
	adapter := buildAdapter(t) // in the background, while the browser starts
	w, g := startCloudWorld(t)
	p := openPage(t, w, exe)

	p.signIn("ana@example.org")
	p.mintRefusedWithoutPasskey()
	p.registerPasskey()
	// Registering is not a passkey check, so registering again right away
	// runs an assertion first. Six minutes on (the control plane's clock;
	// more than ten would put the adapter's signed exchange out of its
	// window), only the assertion the page runs before it posts the mint
	// form can make the session fresh.
	p.registerAgainAssertsFirst()
	w.clock.Advance(6 * time.Minute)
	key, command := p.mintAgentKey("coder", "Ana Example")
	if !strings.HasPrefix(key, "am_") {
		t.Fatalf("key %q", key)
	}
	if want := "mesh-adapter --control-url " + w.m.URLs().Control + " up " + key; command != want {
		t.Fatalf("command %q, want %q", command, want)
	}

	agentID, state := up(t, adapter(), command)
	if !strings.HasPrefix(agentID, "U") {
		t.Fatalf("agent id %q", agentID)
	}
	// The page lists the key as used by that agent, and never shows it again.
	p.do("reload agent keys", chromedp.Navigate(p.w.console+"agent-keys"), chromedp.WaitVisible(chromedp.CSS(`table`)))
	if row := p.text("tbody tr"); !strings.Contains(row, "used") || !strings.Contains(row, agentID) || strings.Contains(row, key) {
		t.Errorf("the key's row after up: %q", row)
	}
	p.shot("agent-key-used")

	if tok := p.createToken("dashboard"); !strings.HasPrefix(tok, "amt_") {
		t.Errorf("API token %q", tok)
	}

	p.pairHandle("helper", adapter(), state, agentID)

	p.cloud(g)

	// The same lists on a phone-sized screen: nothing may overflow the page.
	p.do("phone-sized", chromedp.EmulateViewport(390, 844), chromedp.Navigate(p.w.console+"agent-keys"), chromedp.WaitVisible(chromedp.CSS(`table`)))
	if over, err := chromedp.Run(p.ctx, chromedp.Evaluate[bool](`document.documentElement.scrollWidth > window.innerWidth`)); err != nil || over {
		t.Errorf("the agent keys page is wider than a phone screen (%v)", err)
	}
	p.shot("agent-keys-phone")
	p.do("phone-sized cloud", chromedp.Navigate(p.w.console+"cloud"), chromedp.WaitVisible(chromedp.CSS(`#actions`)))
	if over, err := chromedp.Run(p.ctx, chromedp.Evaluate[bool](`document.documentElement.scrollWidth > window.innerWidth`)); err != nil || over {
		wide, _ := chromedp.Run(p.ctx, chromedp.Evaluate[string](`Array.from(document.querySelectorAll("*")).filter(e => e.getBoundingClientRect().right > window.innerWidth).map(e => e.tagName+"#"+e.id+"."+e.className).join(" ")`))
		t.Errorf("the Cloud page is wider than a phone screen (%v): %s", err, wide)
	}
	p.shot("cloud-phone")
	p.do("desktop-sized", chromedp.EmulateViewport(1200, 900))

	p.records()
	p.closeAccount(agentID, "helper.ana@example.org")
}

// signCount is the virtual authenticator's signature counter: it moves on
// every assertion.
func (p *page) signCount() float64 {
	p.t.Helper()
	res, err := chromedp.Call(p.ctx, webauthn.GetCredentials, webauthn.GetCredentialsParams{AuthenticatorID: p.auth})
	if err != nil || len(res.Credentials) != 1 {
		p.t.Fatalf("the authenticator's credentials: %v %v", res, err)
	}
	return res.Credentials[0].SignCount
}

// records opens the Records page: the export's download link and the
// anchors (a table, or a sentence saying why there is none).
func (p *page) records() {
	p.t.Helper()
	p.do("open records", chromedp.Navigate(p.w.console+"records"), chromedp.WaitVisible(chromedp.CSS(`#audit-export`)))
	if href, err := chromedp.Run(p.ctx, chromedp.AttributeValue(chromedp.CSS(`#audit-export`), "href")); err != nil || href.Value != "/console/records/audit-export" {
		p.t.Errorf("the export link: %q %v", href.Value, err)
	}
	if n, err := chromedp.Run(p.ctx, chromedp.Evaluate[int](`document.querySelectorAll("#anchors, #anchors-note").length`)); err != nil || n != 1 {
		p.t.Errorf("the anchors: neither a table nor a note (%v)", err)
	}
	p.shot("records")
}

// closeAccount closes the account on the Close account page: the preview
// names the agent's handles and the cloud grant's binding, the form runs
// a passkey assertion before it posts (the authenticator signs once
// more), and the answer is the closed page with the outstanding list. The
// session is gone, and the handle no longer resolves.
func (p *page) closeAccount(agentID, handle string) {
	p.t.Helper()
	p.do("open close", chromedp.Navigate(p.w.console+"close"), chromedp.WaitVisible(chromedp.CSS(`#close-form`)))
	if got := p.text("#will-remove"); !strings.Contains(got, handle) {
		p.t.Errorf("will remove: %q", got)
	}
	keeps := p.text("#will-not-remove")
	for _, want := range []string{"remove-iam-policy-binding " + gSA, "projects/acme-agents/locations/europe-west1/workerPools/mesh-scout"} {
		if !strings.Contains(keeps, want) {
			p.t.Errorf("will not remove lacks %q: %q", want, keeps)
		}
	}
	p.shot("close-preview")
	before := p.signCount()
	p.do("close the account", chromedp.Click(chromedp.CSS(`#close-confirm`)), chromedp.Click(chromedp.CSS(`#close-form button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#closed-notice`)))
	if got := p.text("#closed-notice"); !strings.HasPrefix(got, "The account ana@example.org is closed") {
		p.t.Fatalf("after closing: %q", got)
	}
	if after := p.signCount(); after <= before {
		p.t.Errorf("no passkey assertion ran before the close form was sent (sign count %v → %v)", before, after)
	}
	if got := p.text("#outstanding"); !strings.Contains(got, "remove-iam-policy-binding") || !strings.Contains(got, "mesh-scout") {
		p.t.Errorf("outstanding: %q", got)
	}
	p.shot("account-closed")
	p.do("signed out", chromedp.Navigate(p.w.console), chromedp.WaitVisible(chromedp.CSS(`#email`)))
	resp, err := http.Get(p.w.m.URLs().Registrar + "/api/resolve?handle=" + url.QueryEscape(handle))
	if err != nil {
		p.t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		p.t.Errorf("resolve %s after closing: %d", handle, resp.StatusCode)
	}
	_ = agentID
}

// cloud is the Cloud page against the fake Google: fill the setup form and
// read the exact commands; the customer runs them (the fake world gets
// the project, the account, its roles and the deployer's binding); add
// the grant and see it verified, the project read made as the customer's
// account; deploy (the page runs the passkey assertion before it posts);
// see the deploy and its calls in the actions log; and check in the fake
// world that both secrets and the worker pool were written as the
// customer's account, with the model API key typed into the page and a
// live agent key of this account.
func (p *page) cloud(g *googlefake.Fake) {
	p.t.Helper()
	// The account's id, for the project's label (the home page carries it).
	p.do("open home", chromedp.Navigate(p.w.console), chromedp.WaitVisible(chromedp.CSS(`main`)))
	home, err := chromedp.Run(p.ctx, chromedp.Evaluate[string](`document.documentElement.outerHTML`))
	acct := acctRE.FindString(home)
	if err != nil || acct == "" {
		p.t.Fatalf("the account id on the home page: %v", err)
	}
	p.do("open cloud", chromedp.Navigate(p.w.console+"cloud"), chromedp.WaitVisible(chromedp.CSS(`#setup-project`)))
	if got := p.text("#grant-to"); got != gDeployer {
		p.t.Fatalf("the deployer to bind: %q", got)
	}
	p.do("fill the setup form",
		chromedp.SendKeys(chromedp.CSS(`#setup-project`), gProject), chromedp.SendKeys(chromedp.CSS(`#setup-account`), "mesh-agent"),
		chromedp.SendKeys(chromedp.CSS(`#setup-region`), "europe-west1"), chromedp.SendKeys(chromedp.CSS(`#setup-bucket`), "acme-agents-mesh-state"),
		chromedp.SendKeys(chromedp.CSS(`#setup-repository`), "agents"+kb.Enter),
		// Only the answer has the add form filled in from the setup.
		chromedp.WaitVisible(chromedp.CSS(`#grant-account[value="`+gSA+`"]`)))
	setup := grant.Setup{ProjectID: gProject, Account: "mesh-agent", Deployer: gDeployer, Region: "europe-west1",
		Bucket: "acme-agents-mesh-state", Repository: "agents", MeshAccount: acct}
	for i, st := range setup.Steps() {
		if got := p.text(fmt.Sprintf("#setup-step-%d", i)); got != strings.Join(st.Commands, "\n") {
			p.t.Errorf("step %d reads\n%s\nwant\n%s", i, got, strings.Join(st.Commands, "\n"))
		}
	}
	p.shot("cloud-setup")

	// The customer runs the commands.
	g.Customer(gProject, gSA, gDeployer, acct)
	p.do("add the grant", chromedp.Click(chromedp.CSS(`form[action="/console/cloud/grant"] button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#grant-state`)))
	if got := p.text("#grant-state"); got != "verified" {
		p.t.Fatalf("the grant is %q: %s (%s)", got, p.text("main"), p.text("#grant-error"))
	}
	if got := p.text("p.notice"); got != "Grant recorded and checked just now: it is verified." {
		p.t.Errorf("after adding the grant: %q", got)
	}
	for _, c := range g.Calls() {
		if c.Method == "GetProject" && c.Principal != gSA {
			p.t.Errorf("the project was read as %q", c.Principal)
		}
	}
	p.shot("cloud-grant-verified")

	// Deploy: the form starts with the setup's region and bucket only
	// when the page was opened from the setup; fill it whole.
	p.do("fill the deploy form",
		chromedp.SetValue(chromedp.CSS(`#deploy-name`), "scout"), chromedp.SetValue(chromedp.CSS(`#deploy-region`), "europe-west1"),
		chromedp.SetValue(chromedp.CSS(`#deploy-image`), "europe-west1-docker.pkg.dev/acme-agents/agents/scout:1"),
		chromedp.SetValue(chromedp.CSS(`#deploy-bucket`), "acme-agents-mesh-state"),
		chromedp.SendKeys(chromedp.CSS(`#deploy-model-key`), modelKey))
	// Only the answer lists a deployed agent (a refusal fails the step with
	// the page's text, its message included).
	p.do("deploy", chromedp.Click(chromedp.CSS(`#deploy-form button[type="submit"]`)), chromedp.WaitVisible(chromedp.CSS(`#deploys`)))
	if got := p.text("p.notice"); !strings.HasPrefix(got, "Deployed scout: Cloud Run runs the worker pool mesh-scout in europe-west1 of acme-agents") {
		p.t.Errorf("after the deploy: %q", got)
	}
	pool := "projects/acme-agents/locations/europe-west1/workerPools/mesh-scout"
	if got := p.text("#deploys tbody tr"); !strings.Contains(got, pool) {
		p.t.Errorf("deployed agents: %q", got)
	}
	if got := p.text("#actions tbody tr"); !strings.Contains(got, "run.UpdateWorkerPool") || !strings.Contains(got, "deploy") || !strings.Contains(got, pool) {
		p.t.Errorf("the newest line of the actions log: %q", got)
	}
	body, err := chromedp.Run(p.ctx, chromedp.OuterHTML(chromedp.CSS("html")))
	if err != nil || strings.Contains(body, modelKey) {
		p.t.Errorf("the page shows the model API key (%v)", err)
	}
	p.shot("cloud-deployed")

	// In the fake world: written as the customer's account.
	wp, by := g.WorkerPool(pool)
	if wp == nil || by != gSA || wp.GetTemplate().GetServiceAccount() != gSA {
		p.t.Fatalf("the worker pool was written by %q and runs as %q", by, wp.GetTemplate().GetServiceAccount())
	}
	agentKey, model := g.Secret(gProject, "mesh-scout-agent-key"), g.Secret(gProject, "mesh-scout-model-key")
	if len(agentKey) != 1 || agentKey[0].By != gSA || !agentKey[0].Checksummed || !strings.HasPrefix(string(agentKey[0].Data), "am_") {
		p.t.Errorf("the agent key's secret: %d versions", len(agentKey))
	}
	if len(model) != 1 || model[0].By != gSA || !model[0].Checksummed || string(model[0].Data) != modelKey {
		p.t.Errorf("the model key's secret: %d versions", len(model))
	}
}

// pairHandle claims name on the Handles page, starts pairing, runs the
// pairing command the page shows with the agent's adapter, and checks the
// registrar resolves the handle to the agent.
func (p *page) pairHandle(name, bin, state, agentID string) {
	p.t.Helper()
	p.do("open handles", chromedp.Navigate(p.w.console+"handles"), chromedp.WaitVisible(chromedp.CSS(`#handle-name`)))
	handle := name + ".ana@example.org"
	// The page before the post already has a row (the handle the key's
	// exchange claimed), so wait for the notice only the answer has.
	p.do("claim a handle", chromedp.SendKeys(chromedp.CSS(`#handle-name`), name),
		chromedp.Click(chromedp.CSS(`form[action="/console/handles/claim"] button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`p.notice`)))
	if rows := p.text("tbody"); !strings.Contains(rows, handle) {
		p.t.Fatalf("handles after the claim: %q (error: %q)", rows, p.text("#claim-error"))
	}
	p.do("start pairing", chromedp.Click(chromedp.CSS(`button[aria-label="Start pairing an agent with `+handle+`"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#pairing-code`)))
	code, command := p.text("#pairing-code"), p.text("#pair-command")
	if want := "mesh-adapter pair " + handle + " " + code; command != want {
		p.t.Fatalf("pairing command %q, want %q", command, want)
	}
	p.shot("handles")
	args := strings.Fields(command)[1:]
	cmd := exec.Command(bin, append([]string{"--state-dir", state, "--registrar-url", p.w.m.URLs().Registrar}, args...)...)
	cmd.Env = append(os.Environ(), "MESH_ADAPTER_HOME=", "MESH_CONTROL_URL=", "MESH_REGISTRAR_URL=")
	if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "is now bound to agent "+agentID) {
		p.t.Fatalf("%s: %v\n%s", command, err, out)
	}
	resp, err := http.Get(p.w.m.URLs().Registrar + "/api/resolve?handle=" + url.QueryEscape(handle))
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	var got struct {
		Card struct {
			Reserved  bool `json:"reserved"`
			Endpoints []struct {
				Protocol string `json:"protocol"`
				AgentID  string `json:"agent_id"`
			} `json:"endpoints"`
		} `json:"card"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != 200 || got.Card.Reserved ||
		len(got.Card.Endpoints) != 1 || got.Card.Endpoints[0].AgentID != agentID {
		p.t.Fatalf("resolve %s: %d %+v %v", handle, resp.StatusCode, got, err)
	}
	p.do("reload handles", chromedp.Navigate(p.w.console+"handles"), chromedp.WaitVisible(chromedp.CSS(`tbody tr`)))
	if rows := p.text("tbody"); !strings.Contains(rows, agentID) {
		p.t.Errorf("the handles page does not show %s paired: %q", handle, rows)
	}
	p.shot("handle-paired")
}
