package console_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/passkey/passkeytest"
)

// The Close account page lists what closing removes and what it leaves,
// and its form closes the account only when the box is ticked and the
// session confirmed a passkey in the last five minutes (the page's script
// runs the assertion right before it posts; here it is run as the script
// does). The answer is a page without a session, and the session is
// gone.
func TestConsoleClosePage(t *testing.T) {
	w := startWorld(t)
	b := newBrowser(t, w.console)
	b.signIn(w, "ana@example.org")
	page := b.get("close")
	if page.status != 200 || !strings.Contains(page.body, `<table id="will-remove">`) || !strings.Contains(page.body, `id="will-not-remove"`) ||
		!strings.Contains(page.body, `data-passkey-assert="close"`) || !strings.Contains(page.body, "Closing needs a passkey check.") ||
		!strings.Contains(page.body, `aria-current="page">Close account</a>`) {
		t.Fatalf("close page: %d\n%s", page.status, page.body)
	}
	if !strings.Contains(page.body, "The account, its address ana@example.org") {
		t.Errorf("the page does not name the account's address")
	}
	tok := csrf(t, page)
	closeForm := func(confirm bool) answer {
		f := url.Values{"csrf": {tok}}
		if confirm {
			f.Set("confirm", "yes")
		}
		return b.post("close", f)
	}
	if a := closeForm(false); a.status != http.StatusBadRequest || alert(a) != "Tick the box to confirm that you want to close the account for good." {
		t.Errorf("without the box: %d %q", a.status, alert(a))
	}
	acct := acctRE.FindString(b.get("").body)
	dev := passkeytest.NewDevice([]byte(acct))
	rp := passkeytest.RelyingParty{Name: "agentmesh", ID: "localhost", Origin: b.origin}
	if a := b.passkey("register", dev, rp, tok); a.status != 200 {
		t.Fatalf("register: %d %s", a.status, a.body)
	}
	// Registering is not a passkey check.
	if a := closeForm(true); a.status != http.StatusForbidden || alert(a) != "Confirm with your passkey first: closing the account needs a passkey check from the last 5 minutes." {
		t.Fatalf("without an assertion: %d %q", a.status, alert(a))
	}
	if a := b.passkey("assert", dev, rp, tok); a.status != 200 {
		t.Fatalf("assert: %d %s", a.status, a.body)
	}
	w.clock.Advance(6 * time.Minute)
	if a := closeForm(true); a.status != http.StatusForbidden {
		t.Fatalf("a stale assertion: %d %q", a.status, alert(a))
	}
	if a := b.passkey("assert", dev, rp, tok); a.status != 200 {
		t.Fatalf("assert: %d %s", a.status, a.body)
	}
	a := closeForm(true)
	if a.status != 200 || !strings.Contains(a.body, `<p class="notice" id="closed-notice" role="status">The account ana@example.org is closed`) ||
		!strings.Contains(a.body, `<ul id="outstanding"`) || strings.Contains(a.body, "Sign out") {
		t.Fatalf("closing: %d\n%s", a.status, a.body)
	}
	cleared := false
	for _, c := range strings.Split(strings.Join(a.header.Values("Set-Cookie"), "\n"), "\n") {
		cleared = cleared || (strings.HasPrefix(c, "mesh_console_session=;") && strings.Contains(c, "Max-Age=0"))
	}
	if !cleared {
		t.Errorf("the session cookie was not cleared: %v", a.header.Values("Set-Cookie"))
	}
	// The session is gone with the account, even for a browser that kept
	// the cookie.
	if _, err := w.m.Control().Accounts.GetAccount(t.Context(), acct); err == nil {
		t.Error("the account is still there")
	}
}

// Without the closure service the page says closing is not configured
// here, and the form is not there.
func TestConsoleCloseNotConfigured(t *testing.T) {
	h := startRecordsHost(t) // a console built without closure
	page := h.b.get("close")
	if page.status != 200 || !strings.Contains(page.body, `<p class="warn" id="close-missing">Closing an account is not configured on this instance.`) ||
		strings.Contains(page.body, `id="close-form"`) {
		t.Fatalf("close page: %d\n%s", page.status, page.body)
	}
}
