package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/devenv"
	"agentmesh.dev/mesh/functions/console"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/passkey/passkeytest"
)

// Every page but sign-in sends a signed-out visitor to sign in (keeping
// where they were going), and a form posted without a session changes
// nothing. The console opened by its loopback address is sent to the
// localhost URL, the one passkeys are bound to.
func TestConsoleSignedOutGoesToSignIn(t *testing.T) {
	w := startWorld(t)
	b := newBrowser(t, w.console)
	for path, want := range map[string]string{
		"/console/":           "/console/login",
		"/console/passkeys":   "/console/login?next=%2Fconsole%2Fpasskeys",
		"/console/agent-keys": "/console/login?next=%2Fconsole%2Fagent-keys",
		"/console/tokens":     "/console/login?next=%2Fconsole%2Ftokens",
		"/console/handles":    "/console/login?next=%2Fconsole%2Fhandles",
		"/console/cloud":      "/console/login?next=%2Fconsole%2Fcloud",
	} {
		if a := b.get(path); a.status != http.StatusSeeOther || a.location != want {
			t.Errorf("GET %s: %d → %q, want 303 → %q", path, a.status, a.location, want)
		}
	}
	if a := b.post("agent-keys", url.Values{"name": {"x"}, "csrf": {"x"}}); a.status != http.StatusSeeOther || !strings.HasPrefix(a.location, "/console/login") {
		t.Errorf("POST agent-keys signed out: %d → %q", a.status, a.location)
	}
	a := b.postJSON("passkeys/register/begin", "{}", "x")
	if a.status != http.StatusUnauthorized || !strings.Contains(a.body, "signed out") {
		t.Errorf("passkey call signed out: %d %s", a.status, a.body)
	}
	page := b.get("login")
	if page.status != 200 || !strings.Contains(page.body, "<title>Sign in – agentmesh console</title>") ||
		!strings.Contains(page.body, `<label for="email">Email address</label>`) {
		t.Errorf("sign-in page: %d\n%s", page.status, page.body)
	}
	if got := page.header.Get("Content-Security-Policy"); !strings.Contains(got, "script-src 'self'") || !strings.Contains(got, "frame-ancestors 'none'") {
		t.Errorf("CSP %q", got)
	}

	// 127.0.0.1 → localhost, same path and query.
	loop := newBrowser(t, strings.Replace(w.console, "localhost", "127.0.0.1", 1))
	if a := loop.get("login?email=a%40b.org"); a.status != http.StatusFound || a.location != w.console+"login?email=a%40b.org" {
		t.Errorf("loopback address: %d → %q", a.status, a.location)
	}
	if a := b.get("no-such-page"); a.status != http.StatusNotFound || !strings.Contains(a.body, `role="alert"`) {
		t.Errorf("unknown page: %d", a.status)
	}
}

// Signing in: a wrong code is refused next to the form with the service's
// words; the right one sets the session cookie (HttpOnly, SameSite=Lax,
// not Secure on http) and opens the account; signing out ends the session
// itself, not just the cookie.
func TestConsoleSignInWithMailedCode(t *testing.T) {
	w := startWorld(t)
	b := newBrowser(t, w.console)
	page := b.get("login")
	tok := csrf(t, page)
	a := b.post("login", url.Values{"email": {"Ana@Example.org"}, "csrf": {tok}})
	if a.status != http.StatusSeeOther || a.location != "/console/login?email=ana%40example.org&sent=1" {
		t.Fatalf("send code: %d %q\n%s", a.status, a.location, a.body)
	}
	code := w.mailedCode("ana@example.org")
	page = b.get(a.location)
	if !strings.Contains(page.body, "<title>Enter your sign-in code – agentmesh console</title>") ||
		!strings.Contains(page.body, `role="status">Code sent.`) || !strings.Contains(page.body, "the mail we sent to <strong>ana@example.org</strong>") {
		t.Fatalf("code page:\n%s", page.body)
	}
	// Mail goes to a mail server here: nothing about files on a machine.
	if strings.Contains(page.body, "outbox") || strings.Contains(page.body, "no mail server") {
		t.Errorf("the code page speaks of an outbox with a mail server configured:\n%s", page.body)
	}
	wrong := "000000"
	if code == wrong {
		wrong = "111111"
	}
	a = b.post("login/verify", url.Values{"email": {"ana@example.org"}, "code": {wrong}, "csrf": {csrf(t, page)}})
	if a.status != http.StatusUnauthorized || alert(a) != "Wrong code; 4 tries left." ||
		!strings.Contains(a.body, `aria-invalid="true"`) || !strings.Contains(a.body, `aria-describedby="code-hint code-error"`) {
		t.Fatalf("wrong code: %d %q\n%s", a.status, alert(a), a.body)
	}
	a = b.post("login/verify", url.Values{"email": {"ana@example.org"}, "code": {code}, "csrf": {csrf(t, a)}})
	if a.status != http.StatusSeeOther || a.location != "/console/" {
		t.Fatalf("right code: %d %q\n%s", a.status, a.location, a.body)
	}
	var session string
	for _, c := range a.header.Values("Set-Cookie") {
		if strings.HasPrefix(c, "mesh_console_session=ams_") {
			session = c
		}
	}
	for _, attr := range []string{"HttpOnly", "SameSite=Lax", "Path=/console/"} {
		if !strings.Contains(session, attr) {
			t.Errorf("session cookie %q lacks %s", session, attr)
		}
	}
	if strings.Contains(session, "Secure") {
		t.Errorf("session cookie %q is Secure on an http console", session)
	}
	home := b.get("")
	if home.status != 200 || !strings.Contains(home.body, "<title>Your account – agentmesh console</title>") ||
		!strings.Contains(home.body, "Signed in as <strong>ana@example.org</strong>") || !strings.Contains(home.body, `aria-current="page">Account`) {
		t.Fatalf("home: %d\n%s", home.status, home.body)
	}
	// The code was used: it does not sign in twice.
	b2 := newBrowser(t, w.console)
	p2 := b2.get("login?email=ana%40example.org")
	if a := b2.post("login/verify", url.Values{"email": {"ana@example.org"}, "code": {code}, "csrf": {csrf(t, p2)}}); a.status != http.StatusUnauthorized ||
		!strings.Contains(alert(a), "No sign-in code is pending") {
		t.Errorf("reused code: %d %q", a.status, alert(a))
	}

	cookieJar := b.hc.Jar
	saved := cookieJar.Cookies(b.base)
	a = b.post("logout", url.Values{"csrf": {csrf(t, home)}})
	if a.status != http.StatusSeeOther || a.location != "/console/login?signed_out=1" {
		t.Fatalf("sign out: %d %q", a.status, a.location)
	}
	if page := b.get(a.location); !strings.Contains(page.body, `role="status">You are signed out.`) {
		t.Errorf("signed-out page:\n%s", page.body)
	}
	// The old cookie, replayed, is a session that ended.
	cookieJar.SetCookies(b.base, saved)
	if a := b.get(""); a.status != http.StatusSeeOther {
		t.Errorf("ended session still opens the console: %d", a.status)
	}
}

var (
	agentKeyRE = regexp.MustCompile(`<code id="agent-key"[^>]*>(am_[A-Za-z0-9_-]+)</code>`)
	commandRE  = regexp.MustCompile(`<code id="up-command"[^>]*>([^<]+)</code>`)
	amRE       = regexp.MustCompile(`am_[A-Za-z0-9_-]{20,}`)
	acctRE     = regexp.MustCompile(`acct_[0-9a-f]{32}`)
)

// Minting needs a fresh passkey check (spec §5): without one the console
// refuses with the service's sentence next to the form; after a passkey
// ceremony through the console's own calls the key is shown once, with the
// exact command, and never again; six minutes later it is refused again.
func TestConsoleMintNeedsAFreshPasskey(t *testing.T) {
	w := startWorld(t)
	b := newBrowser(t, w.console)
	b.signIn(w, "ana@example.org")
	page := b.get("agent-keys")
	tok := csrf(t, page)
	if !strings.Contains(page.body, "You need a passkey to mint agent keys") {
		t.Errorf("no hint to register a passkey first")
	}
	mint := func() answer {
		return b.post("agent-keys", url.Values{"name": {"coder"}, "operator_name": {"Ana Example"}, "csrf": {tok}})
	}
	a := mint()
	if a.status != http.StatusForbidden || alert(a) != "Confirm with your passkey first: minting an agent key needs a passkey check from the last few minutes." {
		t.Fatalf("mint without a passkey: %d %q", a.status, alert(a))
	}
	if !strings.Contains(a.body, `value="coder"`) || amRE.MatchString(a.body) {
		t.Errorf("the refused form keeps its values and shows no key")
	}

	// Register a passkey as console.js does, with a software authenticator
	// whose user handle is the account id.
	acct := acctRE.FindString(b.get("").body)
	dev := passkeytest.NewDevice([]byte(acct))
	rp := passkeytest.RelyingParty{Name: "agentmesh", ID: "localhost", Origin: b.origin}
	ceremony := func(kind string) {
		t.Helper()
		if a := b.passkey(kind, dev, rp, tok); a.status != 200 {
			t.Fatalf("%s: %d %s", kind, a.status, a.body)
		}
	}
	ceremony("register")
	if page := b.get("passkeys?registered=1"); !strings.Contains(page.body, "You have 1 passkey.") ||
		!strings.Contains(page.body, `role="status">Passkey registered.`) || strings.Contains(page.body, "Your last passkey check counts until") {
		t.Errorf("passkeys page after registering:\n%s", page.body)
	}
	// Registering is not a passkey check (review H1): the mint form's own
	// assertion is what makes the session fresh.
	if a := mint(); a.status != http.StatusForbidden || !strings.HasPrefix(alert(a), "Confirm with your passkey first") {
		t.Fatalf("mint right after registering: %d %q", a.status, alert(a))
	}
	ceremony("assert")

	a = mint()
	if a.status != 200 {
		t.Fatalf("mint after the passkey: %d %q", a.status, alert(a))
	}
	m := agentKeyRE.FindStringSubmatch(a.body)
	if m == nil {
		t.Fatalf("no key on the page:\n%s", a.body)
	}
	key := m[1]
	cmd := commandRE.FindStringSubmatch(a.body)
	if want := "mesh-adapter --control-url " + w.m.URLs().Control + " up " + key; cmd == nil || cmd[1] != want {
		t.Errorf("command %q, want %q", cmd, want)
	}
	if strings.Count(a.body, key) != 2 || !strings.Contains(a.body, "it is shown only this once") ||
		!strings.Contains(a.body, "coder.ana@example.org") || a.header.Get("Cache-Control") != "no-store" {
		t.Errorf("the minted key's page:\n%s", a.body)
	}
	// The page says plainly which handle the key's name claims.
	if !strings.Contains(a.body, `<p id="handle-note">When the agent starts it claims the handle coder.ana@example.org, unless someone claims it first.</p>`) {
		t.Errorf("the minted key's page has no handle note:\n%s", a.body)
	}
	// Listed, never shown again.
	list := b.get("agent-keys")
	if strings.Contains(list.body, key) || amRE.MatchString(list.body) || !strings.Contains(list.body, `state-unused">unused`) {
		t.Errorf("the list shows the key again:\n%s", list.body)
	}
	if strings.Contains(list.body, `name="operator_name"`) {
		t.Errorf("the operator name is set; the form should not ask again")
	}

	// The check goes stale; an assertion renews it.
	w.clock.Advance(6 * time.Minute)
	if a := mint(); a.status != http.StatusForbidden || !strings.HasPrefix(alert(a), "Confirm with your passkey first") {
		t.Errorf("stale passkey: %d %q", a.status, alert(a))
	}
	ceremony("assert")
	a = mint()
	if a.status != 200 || agentKeyRE.FindStringSubmatch(a.body) == nil {
		t.Fatalf("after asserting: %d %q", a.status, alert(a))
	}
	second := agentKeyRE.FindStringSubmatch(a.body)[1]

	// Revoke the second key: the list says so, and the key is dead.
	ids := regexp.MustCompile(`action="/console/agent-keys/([0-9a-f]{12})/revoke"`).FindAllStringSubmatch(a.body, -1)
	if len(ids) != 2 {
		t.Fatalf("revoke buttons: %v", ids)
	}
	r := b.post("agent-keys/"+ids[0][1]+"/revoke", url.Values{"csrf": {tok}})
	if r.status != http.StatusSeeOther {
		t.Fatalf("revoke: %d %q", r.status, alert(r))
	}
	list = b.get(r.location)
	if !strings.Contains(list.body, `role="status">The agent key for coder (`+ids[0][1]+`) is revoked`) || !strings.Contains(list.body, `state-revoked">revoked`) {
		t.Errorf("after revoking:\n%s", list.body)
	}
	if st, out := bootstrap(t, w, second); st < 400 {
		t.Errorf("a revoked key was exchanged: %d %v", st, out)
	}
	if r := b.post("agent-keys/nosuchkey000/revoke", url.Values{"csrf": {tok}}); r.status != http.StatusNotFound ||
		alert(r) != "No agent key nosuchkey000 on this account." {
		t.Errorf("revoking an unknown key: %d %q", r.status, alert(r))
	}
}

// passkey runs one ceremony through the console's passkey calls, as
// console.js does, with a software authenticator; it returns the begin's
// answer when that is refused, else the finish's.
func (b *browser) passkey(kind string, dev *passkeytest.Device, rp passkeytest.RelyingParty, tok string) answer {
	b.t.Helper()
	a := b.postJSON("passkeys/"+kind+"/begin", "{}", tok)
	if a.status != 200 {
		return a
	}
	var out struct {
		Ceremony string          `json:"ceremony"`
		Options  json.RawMessage `json:"options"`
	}
	if err := json.Unmarshal([]byte(a.body), &out); err != nil {
		b.t.Fatal(err)
	}
	var resp []byte
	if kind == "register" {
		resp = dev.Attest(b.t, rp, out.Options)
	} else {
		resp = dev.Assert(b.t, rp, out.Options)
	}
	body, _ := json.Marshal(map[string]any{"ceremony": out.Ceremony, "response": json.RawMessage(resp)})
	return b.postJSON("passkeys/"+kind+"/finish", string(body), tok)
}

// Review H1 through the console: the first passkey is registered with the
// session alone; a second one only after an assertion with the first (the
// page tells the script to run it first), so a session alone cannot add
// its own authenticator; registering never makes the session fresh, and
// the owner is mailed for each passkey added.
func TestConsoleSecondPasskeyNeedsAnAssertion(t *testing.T) {
	w := startWorld(t)
	b := newBrowser(t, w.console)
	b.signIn(w, "ana@example.org")
	page := b.get("passkeys")
	tok := csrf(t, page)
	if !strings.Contains(page.body, `data-passkey-register="first"`) {
		t.Errorf("the first passkey's button should not ask for an assertion first:\n%s", page.body)
	}
	acct := acctRE.FindString(b.get("").body)
	rp := passkeytest.RelyingParty{Name: "agentmesh", ID: "localhost", Origin: b.origin}
	first, second := passkeytest.NewDevice([]byte(acct)), passkeytest.NewDevice([]byte(acct))
	if a := b.passkey("register", first, rp, tok); a.status != 200 || !strings.Contains(a.body, `"passkey_fresh":false`) {
		t.Fatalf("register the first passkey: %d %s", a.status, a.body)
	}
	w.passkeyNotice("ana@example.org")

	w.clock.Advance(6 * time.Minute)
	page = b.get("passkeys")
	if !strings.Contains(page.body, `data-passkey-register="assert-first"`) || !strings.Contains(page.body, "First confirm with a passkey you already have") {
		t.Errorf("with a passkey, the page should assert before registering:\n%s", page.body)
	}
	a := b.passkey("register", second, rp, tok)
	if a.status != http.StatusForbidden || !strings.Contains(a.body, "confirm with one of your passkeys first") || !strings.Contains(a.body, `"passkey_required":true`) {
		t.Fatalf("a second passkey without an assertion: %d %s", a.status, a.body)
	}
	if a := b.post("agent-keys", url.Values{"name": {"coder"}, "operator_name": {"Ana"}, "csrf": {tok}}); a.status != http.StatusForbidden {
		t.Errorf("mint without an assertion: %d %q", a.status, alert(a))
	}
	if a := b.passkey("assert", first, rp, tok); a.status != 200 || !strings.Contains(a.body, `"passkey_fresh":true`) {
		t.Fatalf("assert: %d %s", a.status, a.body)
	}
	if a := b.passkey("register", second, rp, tok); a.status != 200 || !strings.Contains(a.body, `"registered":true`) {
		t.Fatalf("a second passkey after an assertion: %d %s", a.status, a.body)
	}
	w.passkeyNotice("ana@example.org")
	if page := b.get("passkeys"); !strings.Contains(page.body, "You have 2 passkeys.") {
		t.Errorf("passkeys page:\n%s", page.body)
	}
}

// passkeyNotice waits for the mail telling addr a passkey was added.
func (w *world) passkeyNotice(addr string) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	msg, err := w.smtp.Wait(ctx, addr)
	if err != nil {
		w.t.Fatalf("no passkey notice to %s: %v", addr, err)
	}
	if msg.Message.Kind != "passkey-added" || msg.Message.Subject != "A passkey was added to your account" {
		w.t.Fatalf("not the passkey notice: %q %q", msg.Message.Kind, msg.Message.Subject)
	}
}

// CSRF: a form needs the session's token, and a post from another origin
// is refused even with it; the passkey calls need the token header; the
// sign-in forms need the sign-in cookie's value (login CSRF). API tokens
// are shown once, then listed and revocable.
func TestConsoleRefusesCrossSitePosts(t *testing.T) {
	w := startWorld(t)
	b := newBrowser(t, w.console)
	b.signIn(w, "ana@example.org")
	page := b.get("tokens")
	tok := csrf(t, page)
	form := url.Values{"name": {"dashboard"}, "scope": {"read"}}

	if a := b.post("tokens", form); a.status != http.StatusForbidden || !strings.Contains(alert(a), "security token is missing or wrong") {
		t.Errorf("no token: %d %q", a.status, alert(a))
	}
	bad := url.Values{"name": {"dashboard"}, "scope": {"read"}, "csrf": {tok[:len(tok)-2] + "xx"}}
	if a := b.post("tokens", bad); a.status != http.StatusForbidden {
		t.Errorf("wrong token: %d", a.status)
	}
	withTok := url.Values{"name": {"dashboard"}, "scope": {"read"}, "csrf": {tok}}
	if a := b.post("tokens", withTok, "Origin", "http://evil.example"); a.status != http.StatusForbidden || !strings.Contains(alert(a), "sent from another site") {
		t.Errorf("another origin: %d %q", a.status, alert(a))
	}
	b.origin = ""
	if a := b.post("tokens", withTok, "Referer", "http://evil.example/page"); a.status != http.StatusForbidden {
		t.Errorf("another site's referer: %d", a.status)
	}
	if a := b.post("tokens", withTok, "Sec-Fetch-Site", "cross-site"); a.status != http.StatusForbidden {
		t.Errorf("Sec-Fetch-Site cross-site: %d", a.status)
	}
	b.origin = newBrowser(t, w.console).origin
	if a := b.postJSON("passkeys/register/begin", "{}", ""); a.status != http.StatusForbidden {
		t.Errorf("passkey call without the header: %d %s", a.status, a.body)
	}
	if a := b.get("tokens"); strings.Contains(a.body, `data-label="Name">dashboard</td>`) {
		t.Fatalf("a refused post made a token")
	}

	// The sign-in forms: another site cannot sign a visitor in or mail codes.
	v := newBrowser(t, w.console)
	if a := v.post("login", url.Values{"email": {"eve@example.org"}, "csrf": {"guess-guess-guess-guess"}}); a.status != http.StatusForbidden ||
		!strings.Contains(alert(a), "did not send back the console's sign-in cookie") {
		t.Errorf("sign-in form without the cookie: %d %q", a.status, alert(a))
	}
	lp := v.get("login")
	if a := v.post("login", url.Values{"email": {"eve@example.org"}, "csrf": {csrf(t, lp)}}, "Origin", "http://evil.example"); a.status != http.StatusForbidden {
		t.Errorf("sign-in form from another origin: %d", a.status)
	}

	// The real thing: shown once, listed, revoked.
	a := b.post("tokens", withTok)
	m := regexp.MustCompile(`<code id="api-token"[^>]*>(amt_[A-Za-z0-9_-]+)</code>`).FindStringSubmatch(a.body)
	if a.status != 200 || m == nil {
		t.Fatalf("create: %d %q\n%s", a.status, alert(a), a.body)
	}
	list := b.get("tokens")
	if strings.Contains(list.body, m[1]) || !strings.Contains(list.body, `data-label="Name">dashboard</td>`) {
		t.Errorf("token list:\n%s", list.body)
	}
	if a := b.post("tokens", url.Values{"name": {"x"}, "scope": {"admin"}, "csrf": {tok}}); a.status != http.StatusBadRequest ||
		alert(a) != `Unknown scope "admin" (known: audit, read).` {
		t.Errorf("unknown scope: %d %q", a.status, alert(a))
	}
	id := regexp.MustCompile(`action="/console/tokens/([0-9a-f]{12})/revoke"`).FindStringSubmatch(list.body)
	if id == nil {
		t.Fatal("no revoke button")
	}
	r := b.post("tokens/"+id[1]+"/revoke", url.Values{"csrf": {tok}})
	if r.status != http.StatusSeeOther || !strings.Contains(b.get(r.location).body, "The API token dashboard ("+id[1]+") is revoked.") {
		t.Errorf("revoke: %d %q", r.status, r.location)
	}
}

// bootstrap tries an agent key at the bootstrap door.
func bootstrap(t *testing.T, w *world, key string) (int, map[string]any) {
	t.Helper()
	agent, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(map[string]any{"token": key, "agent_id": agent.Public()})
	resp, err := http.Post(w.m.URLs().Control+"/v1/bootstrap", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// After signing in, the visitor lands on the page they were sent from;
// a "next" that leaves the console is ignored, before and after signing in
// (review M1: "/console/../%5Cevil.example/" was cleaned by http.Redirect
// into "/\evil.example/", which a browser follows off-site).
func TestConsoleSignInReturnsToThePage(t *testing.T) {
	w := startWorld(t)
	cases := []struct{ next, want string }{
		{"/console/tokens", "/console/tokens"},
		{"//evil.example/x", "/console/"},
		{"https://evil.example/console/", "/console/"},
		{"/console/../%5Cevil.example/", "/console/"},
		{"/console/%2e%2e/%5Cevil.example/", "/console/"},
		{"/\\evil.example/", "/console/"},
	}
	for i, c := range cases {
		email := fmt.Sprintf("ana%d@example.org", i) // five code mails per address
		b := newBrowser(t, w.console)
		page := b.get("login?next=" + url.QueryEscape(c.next))
		a := b.post("login", url.Values{"email": {email}, "csrf": {csrf(t, page)}, "next": {c.next}})
		page = b.get(a.location)
		a = b.post("login/verify", url.Values{"email": {email}, "code": {w.mailedCode(email)}, "csrf": {csrf(t, page)}, "next": {c.next}})
		if a.status != http.StatusSeeOther || a.location != c.want {
			t.Errorf("next %q: %d → %q, want %q", c.next, a.status, a.location, c.want)
		}
		// Signed in, the sign-in page redirects at once: the same rule.
		if a := b.get("login?next=" + url.QueryEscape(c.next)); a.status != http.StatusSeeOther || a.location != c.want {
			t.Errorf("signed in, next %q: %d → %q, want %q", c.next, a.status, a.location, c.want)
		}
	}
	// The review's link, exactly as it would be sent.
	b := newBrowser(t, w.console)
	b.signIn(w, "eve@example.org")
	if a := b.get("/console/login?next=%2Fconsole%2F..%2F%255Cevil.example%2F"); a.status != http.StatusSeeOther || a.location != "/console/" {
		t.Errorf("the review's link: %d → %q", a.status, a.location)
	}
}

// On an https console the cookies are Secure, and a post is accepted only
// from that exact origin.
func TestConsoleOnHTTPS(t *testing.T) {
	s := console.New(console.Config{ConsoleURL: "https://mesh.example.org/console/"})
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "https://mesh.example.org/console/login", nil))
	c := rec.Header().Get("Set-Cookie")
	if !strings.HasPrefix(c, "mesh_console_signin=") || !strings.Contains(c, "; Secure") || !strings.Contains(c, "HttpOnly") {
		t.Errorf("sign-in cookie on https: %q", c)
	}
	for origin, want := range map[string]int{"http://mesh.example.org": http.StatusForbidden, "https://evil.example": http.StatusForbidden,
		"https://mesh.example.org": http.StatusForbidden /* passes the origin check; then the missing cookie */} {
		req := httptest.NewRequest(http.MethodPost, "https://mesh.example.org/console/login", strings.NewReader("email=a%40b.org&csrf=x"))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", origin)
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		body := rec.Body.String()
		foreign := strings.Contains(body, "sent from another site")
		if rec.Code != want || foreign != (origin != "https://mesh.example.org") {
			t.Errorf("post from %s: %d, refused as another site: %v", origin, rec.Code, foreign)
		}
	}
}

// meshd with no mail server writes its mail to <data-dir>/outbox/: the
// sign-in code page says so and where, and the code is in the newest file
// there.
func TestConsoleCodePageSaysWhereTheOutboxIs(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	m, err := devenv.Start(ctx, devenv.Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	b := newBrowser(t, m.URLs().Console)
	a := b.post("login", url.Values{"email": {"ana@example.org"}, "csrf": {csrf(t, b.get("login"))}})
	if a.status != http.StatusSeeOther {
		t.Fatalf("send code: %d\n%s", a.status, a.body)
	}
	page := b.get(a.location)
	outbox := filepath.Join(dir, "outbox")
	if !strings.Contains(page.body, `id="outbox-note"`) || !strings.Contains(page.body, "<code>"+outbox+"</code>") ||
		!strings.Contains(page.body, "newest file") || strings.Contains(page.body, "spam folder") {
		t.Fatalf("code page with mail in the outbox:\n%s", page.body)
	}
	msgs, err := mail.ReadOutbox(outbox)
	if err != nil || len(msgs) != 1 || codeRE.FindString(msgs[0].Text) == "" {
		t.Fatalf("the outbox at %s: %+v, %v", outbox, msgs, err)
	}
	code := codeRE.FindString(msgs[0].Text)
	if a := b.post("login/verify", url.Values{"email": {"ana@example.org"}, "code": {code}, "csrf": {csrf(t, page)}}); a.status != http.StatusSeeOther {
		t.Errorf("sign in with the code from the outbox: %d\n%s", a.status, a.body)
	}
}
