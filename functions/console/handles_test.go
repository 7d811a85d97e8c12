package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"agentmesh.dev/mesh/functions/console"
	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/errs"
)

// registrarDouble stands in for shared/registrar in the Handles page's own
// tests: it checks what the page sends through console.Registrar and
// answers as the registrar's contract says (spec §4.1). It is a test
// double of the interface, not a registrar; the real one is exercised by
// the browser test.
type registrarDouble struct {
	mu       sync.Mutex
	sessions map[string]string // token → email
	operator map[string]string // email → operator name
	handles  []account.Handle
	calls    []string
	opened   int
}

func newRegistrarDouble() *registrarDouble {
	return &registrarDouble{sessions: map[string]string{}, operator: map[string]string{}}
}

func (r *registrarDouble) SessionFor(_ context.Context, email, provenance string) (string, time.Time, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, "session "+email+" "+provenance)
	r.opened++
	tok := fmt.Sprintf("rs-%d-%s", r.opened, email)
	r.sessions[tok] = email
	return tok, time.Now().Add(8 * time.Hour), nil
}

// sessionsOpened is how many registrar sessions the console asked for.
func (r *registrarDouble) sessionsOpened() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.opened
}

// expireAll forgets every session, as the registrar does after 8 hours.
func (r *registrarDouble) expireAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sessions = map[string]string{}
}

func (r *registrarDouble) email(token string) (string, error) {
	e, ok := r.sessions[token]
	if !ok {
		return "", errs.New(errs.Unauthorized, "session expired")
	}
	return e, nil
}

func (r *registrarDouble) Claim(_ context.Context, token, name, operatorName string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	email, err := r.email(token)
	if err != nil {
		return "", err
	}
	r.calls = append(r.calls, "claim "+name+" "+operatorName)
	if r.operator[email] == "" && operatorName == "" {
		return "", errs.New(console.OperatorRequired, "operator_name is required on the first claim")
	}
	if operatorName != "" {
		r.operator[email] = operatorName
	}
	h := name + "." + email
	for _, x := range r.handles {
		if account.HandleID(x.Handle) == account.HandleID(h) {
			return "", errs.New(errs.Conflict, "taken")
		}
	}
	r.handles = append(r.handles, account.Handle{Handle: h, Email: email, OperatorName: r.operator[email], ClaimedAt: time.Now().UnixMilli()})
	return h, nil
}

func (r *registrarDouble) StartPairing(_ context.Context, token, handle string) (string, time.Time, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.email(token); err != nil {
		return "", time.Time{}, err
	}
	r.calls = append(r.calls, "pair "+handle)
	return "ABC-234", time.Now().Add(10 * time.Minute), nil
}

func (r *registrarDouble) Mine(_ context.Context, token string) ([]account.Handle, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	email, err := r.email(token)
	if err != nil {
		return nil, err
	}
	var out []account.Handle
	for _, h := range r.handles {
		if h.Email == email {
			out = append(out, h)
		}
	}
	return out, nil
}

// The Handles page against the registrar's contract: a registrar session
// for the signed-in address (provenance email), a first claim refused for
// want of an operator name shown next to the claim form, a claim, and a
// pairing code with the exact command to run.
func TestConsoleHandlesPage(t *testing.T) {
	w := startWorld(t)
	reg := newRegistrarDouble()
	srv := httptest.NewUnstartedServer(nil)
	srv.Config.Handler = console.New(console.Config{Accounts: w.m.Control().Accounts, Registrar: reg, ConsoleURL: "http://" + srv.Listener.Addr().String() + "/console/"})
	srv.Start()
	t.Cleanup(srv.Close)

	b := newBrowser(t, srv.URL+"/console/")
	b.signIn(w, "ana@example.org")
	page := b.get("handles")
	tok := csrf(t, page)
	if page.status != 200 || !strings.Contains(page.body, "<title>Handles – agentmesh console</title>") || !strings.Contains(page.body, "No handles yet.") {
		t.Fatalf("handles page: %d\n%s", page.status, page.body)
	}

	a := b.post("handles/claim", url.Values{"name": {"coder"}, "csrf": {tok}})
	if a.status != http.StatusBadRequest || alert(a) != "Operator_name is required on the first claim." ||
		!strings.Contains(a.body, `required aria-invalid="true"`) || !strings.Contains(a.body, `value="coder"`) {
		t.Fatalf("first claim without an operator: %d %q\n%s", a.status, alert(a), a.body)
	}
	a = b.post("handles/claim", url.Values{"name": {"coder"}, "operator_name": {"Ana Example"}, "csrf": {tok}})
	if a.status != http.StatusSeeOther || a.location != "/console/handles?claimed=coder.ana%40example.org" {
		t.Fatalf("claim: %d %q %q", a.status, a.location, alert(a))
	}
	page = b.get(a.location)
	if !strings.Contains(page.body, `role="status">You claimed coder.ana@example.org.`) || !strings.Contains(page.body, `data-label="Handle">coder.ana@example.org</td>`) {
		t.Errorf("after claiming:\n%s", page.body)
	}
	if a := b.post("handles/claim", url.Values{"name": {"coder"}, "csrf": {tok}}); a.status != http.StatusConflict || alert(a) != "Taken." {
		t.Errorf("claim again: %d %q", a.status, alert(a))
	}

	a = b.post("handles/pair", url.Values{"handle": {"coder.ana@example.org"}, "csrf": {tok}})
	if a.status != 200 || !strings.Contains(a.body, `<p class="big-code" id="pairing-code">ABC-234</p>`) ||
		!strings.Contains(a.body, `<code id="pair-command">mesh-adapter pair coder.ana@example.org ABC-234</code>`) {
		t.Fatalf("pairing: %d %q\n%s", a.status, alert(a), a.body)
	}
	reg.mu.Lock()
	defer reg.mu.Unlock()
	if len(reg.calls) == 0 || reg.calls[0] != "session ana@example.org email" {
		t.Errorf("registrar calls: %q", reg.calls)
	}
}

// The review's L3: the console keeps one registrar session per console
// session (in an HttpOnly cookie bound to it) instead of opening an
// eight-hour one on every Handles request. A session the registrar forgot
// is replaced once; a registrar cookie not bound to this console session
// (planted, or from an earlier sign-in) is not used; signing out clears it.
func TestConsoleKeepsOneRegistrarSession(t *testing.T) {
	w := startWorld(t)
	reg := newRegistrarDouble()
	srv := httptest.NewUnstartedServer(nil)
	srv.Config.Handler = console.New(console.Config{Accounts: w.m.Control().Accounts, Registrar: reg, ConsoleURL: "http://" + srv.Listener.Addr().String() + "/console/"})
	srv.Start()
	t.Cleanup(srv.Close)

	b := newBrowser(t, srv.URL+"/console/")
	b.signIn(w, "ana@example.org")
	page := b.get("handles")
	tok := csrf(t, page)
	var cookie string
	for _, c := range page.header.Values("Set-Cookie") {
		if strings.HasPrefix(c, "mesh_console_registrar=") {
			cookie = c
		}
	}
	if !strings.Contains(cookie, "HttpOnly") || !strings.Contains(cookie, "Path=/console/") || !strings.Contains(cookie, "SameSite=Lax") {
		t.Errorf("registrar cookie: %q", cookie)
	}
	b.get("handles")
	b.post("handles/claim", url.Values{"name": {"coder"}, "operator_name": {"Ana"}, "csrf": {tok}})
	b.get("handles?claimed=coder.ana%40example.org")
	b.post("handles/pair", url.Values{"handle": {"coder.ana@example.org"}, "csrf": {tok}})
	if n := reg.sessionsOpened(); n != 1 {
		t.Errorf("registrar sessions for one console session: %d, want 1", n)
	}

	// The registrar forgot it: one new session, and the page still works.
	reg.expireAll()
	if page := b.get("handles"); page.status != 200 || !strings.Contains(page.body, "coder.ana@example.org") {
		t.Errorf("handles after the registrar session expired: %d\n%s", page.status, page.body)
	}
	if a := b.post("handles/pair", url.Values{"handle": {"coder.ana@example.org"}, "csrf": {tok}}); a.status != 200 {
		t.Errorf("pairing after the registrar session expired: %d %q", a.status, alert(a))
	}
	if n := reg.sessionsOpened(); n != 2 {
		t.Errorf("registrar sessions after one expired: %d, want 2", n)
	}

	// A registrar cookie that is not bound to this console session is
	// ignored, even when it names a live registrar session of another
	// address.
	u, _ := url.Parse(srv.URL + "/console/")
	eve, _, _ := reg.SessionFor(context.Background(), "eve@example.org", "email")
	b.hc.Jar.SetCookies(u, []*http.Cookie{{Name: "mesh_console_registrar", Value: eve + ".forged", Path: "/console/"}})
	if page := b.get("handles"); page.status != 200 || strings.Contains(page.body, "eve@example.org") {
		t.Errorf("a planted registrar cookie was used: %d", page.status)
	}
	if n := reg.sessionsOpened(); n != 4 { // eve's, then a new one for ana
		t.Errorf("registrar sessions after a planted cookie: %d, want 4", n)
	}

	// Signing out clears it; a new console session gets its own.
	a := b.post("logout", url.Values{"csrf": {tok}})
	cleared := false
	for _, c := range a.header.Values("Set-Cookie") {
		cleared = cleared || (strings.HasPrefix(c, "mesh_console_registrar=;") && strings.Contains(c, "Max-Age=0"))
	}
	if !cleared {
		t.Errorf("sign-out did not clear the registrar cookie: %q", a.header.Values("Set-Cookie"))
	}
	b.signIn(w, "ana@example.org")
	b.get("handles")
	b.get("handles")
	if n := reg.sessionsOpened(); n != 5 {
		t.Errorf("registrar sessions after signing in again: %d, want 5", n)
	}
}
