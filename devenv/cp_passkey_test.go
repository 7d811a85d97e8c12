package devenv_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/passkey/passkeytest"
)

// passkeyCeremony runs begin/finish for kind ("register" or "assert") with
// the device, as the console's browser would.
func (c *cp) passkeyCeremony(acct, tok, kind string, d *passkeytest.Device, rp passkeytest.RelyingParty) (int, map[string]any) {
	c.t.Helper()
	st, out := c.post("/v1/accounts/"+acct+"/passkeys/"+kind+"/begin", nil, tok)
	if st != 200 {
		c.t.Fatalf("%s begin: %d %v", kind, st, out)
	}
	opts, _ := json.Marshal(out["options"])
	var resp []byte
	if kind == "register" {
		resp = d.Attest(c.t, rp, opts)
	} else {
		resp = d.Assert(c.t, rp, opts)
	}
	return c.post("/v1/accounts/"+acct+"/passkeys/"+kind+"/finish",
		map[string]any{"ceremony": out["ceremony"], "response": json.RawMessage(resp)}, tok)
}

func TestAgentKeysNeedAFreshPasskey(t *testing.T) {
	c := startCP(t)
	acct, tok := c.signIn("ana@example.org")
	rp := passkeytest.RelyingParty{Name: "agentmesh", ID: "localhost", Origin: strings.TrimSuffix(c.m.URLs().Console, "/console/")}
	mint := func() (int, map[string]any) {
		return c.post("/v1/accounts/"+acct+"/agent-tokens", map[string]any{"name": "coder", "operator_name": "Ana Example"}, tok)
	}

	st, out := mint()
	if st != 403 || out["details"].(map[string]any)["passkey_required"] != true {
		t.Fatalf("without a passkey: %d %v", st, out)
	}
	dev := passkeytest.NewDevice([]byte(acct))
	if st, out := c.passkeyCeremony(acct, tok, "register", dev, rp); st != 200 || out["registered"] != true || out["passkey_fresh"] != false {
		t.Fatalf("register: %d %v", st, out)
	}
	c.passkeyAddedMail("ana@example.org")
	// Registering is not a passkey check: only an assertion is.
	if st, out := mint(); st != 403 {
		t.Fatalf("mint right after registering, without an assertion: %d %v", st, out)
	}
	if st, out := c.passkeyCeremony(acct, tok, "assert", dev, rp); st != 200 || out["passkey_fresh"] != true {
		t.Fatalf("assert: %d %v", st, out)
	}
	st, out = mint()
	if st != 201 {
		t.Fatalf("mint after asserting: %d %v", st, out)
	}
	key := out["token"].(string)
	if !strings.HasPrefix(key, "am_") || out["expires_in"] != 604800.0 || out["label"] != "coder" ||
		!strings.Contains(out["command"].(string), "mesh-adapter") || !strings.Contains(out["command"].(string), key) ||
		out["handle_claim"] != "coder.ana@example.org" {
		t.Errorf("grant: %v", out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	msg, err := c.smtp.Wait(ctx, "ana@example.org")
	if err != nil || !strings.Contains(msg.Message.Text, key) {
		t.Errorf("the mailed copy of the key: %v %q", err, msg.Message.Text)
	}
	// The key is listed, never shown again.
	_, list := c.do("GET", "/v1/accounts/"+acct+"/agent-tokens", nil, tok)
	items := list["agent_tokens"].([]any)
	if len(items) != 1 || items[0].(map[string]any)["state"] != "unused" || strings.Contains(mustJSON(list), key) {
		t.Errorf("list: %v", list)
	}

	// Six minutes later the passkey check is stale; an assertion renews it.
	c.clock.Advance(6 * time.Minute)
	if st, _ := mint(); st != 403 {
		t.Errorf("stale passkey: %d", st)
	}
	if st, out := c.passkeyCeremony(acct, tok, "assert", dev, rp); st != 200 {
		t.Fatalf("assert: %d %v", st, out)
	}
	if st, out := mint(); st != 201 {
		t.Errorf("after asserting: %d %v", st, out)
	}

	// A response from another origin, and a ceremony replayed, are refused.
	evil := passkeytest.RelyingParty{Name: "x", ID: "localhost", Origin: "http://localhost:1"}
	if st, _ := c.passkeyCeremony(acct, tok, "assert", dev, evil); st != 401 {
		t.Errorf("wrong origin: %d", st)
	}
	st, out = c.post("/v1/accounts/"+acct+"/passkeys/assert/begin", nil, tok)
	if st != 200 {
		t.Fatalf("assert begin: %d %v", st, out)
	}
	opts, _ := json.Marshal(out["options"])
	body := map[string]any{"ceremony": out["ceremony"], "response": json.RawMessage(dev.Assert(t, rp, opts))}
	if st, _ := c.post("/v1/accounts/"+acct+"/passkeys/assert/finish", body, tok); st != 200 {
		t.Fatal("first finish")
	}
	if st, _ := c.post("/v1/accounts/"+acct+"/passkeys/assert/finish", body, tok); st != 400 {
		t.Errorf("replayed ceremony: %d", st)
	}
	// Another account's session cannot use this account's routes at all.
	other, otherTok := c.signIn("eve@example.org")
	_ = other
	if st, _ := c.post("/v1/accounts/"+acct+"/agent-tokens", map[string]any{"name": "x"}, otherTok); st != 401 {
		t.Errorf("cross-account mint: %d", st)
	}
}

// passkeyAddedMail waits for the notice mailed to addr when a passkey is
// added to its account.
func (c *cp) passkeyAddedMail(addr string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	msg, err := c.smtp.Wait(ctx, addr)
	if err != nil {
		c.t.Fatalf("no passkey notice to %s: %v", addr, err)
	}
	if msg.Message.Kind != "passkey-added" || !strings.Contains(msg.Message.Text, "A passkey was added to your account "+addr) {
		c.t.Fatalf("mail to %s is not the passkey notice: %q %q", addr, msg.Message.Kind, msg.Message.Text)
	}
}

// The review's H1: a session alone must not be able to add its own
// authenticator and mint. The owner registers device A; six minutes later
// registering device B without an assertion is refused, and so is a mint.
// Registering never makes the session fresh; a registration begun while
// fresh is refused at finish once the check went stale; a second session
// (the attacker's) that began registering while the account had no passkey
// is refused once the owner's first passkey exists. After an assertion with
// A, B is added, and the owner is mailed each time.
func TestRegisteringAPasskeyIsNotAFreshCheck(t *testing.T) {
	c := startCP(t)
	acct, tok := c.signIn("ana@example.org")
	rp := passkeytest.RelyingParty{Name: "agentmesh", ID: "localhost", Origin: strings.TrimSuffix(c.m.URLs().Console, "/console/")}
	mint := func(tok string) (int, map[string]any) {
		return c.post("/v1/accounts/"+acct+"/agent-tokens", map[string]any{"name": "coder", "operator_name": "Ana Example"}, tok)
	}
	begin := func(tok, kind string) (int, map[string]any) {
		return c.post("/v1/accounts/"+acct+"/passkeys/"+kind+"/begin", nil, tok)
	}
	finish := func(tok string, out map[string]any, resp []byte) (int, map[string]any) {
		return c.post("/v1/accounts/"+acct+"/passkeys/register/finish",
			map[string]any{"ceremony": out["ceremony"], "response": json.RawMessage(resp)}, tok)
	}
	attest := func(d *passkeytest.Device, out map[string]any) []byte {
		opts, _ := json.Marshal(out["options"])
		return d.Attest(t, rp, opts)
	}
	passkeys := func() float64 {
		_, out := c.do("GET", "/v1/session", nil, tok)
		return out["passkeys"].(float64)
	}

	// A second session of the account (say a leaked sign-in code) begins
	// registering its own device while the account has no passkey.
	_, evilTok := c.signIn("ana@example.org")
	evil := passkeytest.NewDevice([]byte(acct))
	st, evilBegin := begin(evilTok, "register")
	if st != 200 {
		t.Fatalf("first-passkey registration begin: %d %v", st, evilBegin)
	}

	// The owner registers A with the session alone (the account's first).
	a := passkeytest.NewDevice([]byte(acct))
	if st, out := c.passkeyCeremony(acct, tok, "register", a, rp); st != 200 || out["registered"] != true || out["passkey_fresh"] != false {
		t.Fatalf("register A: %d %v", st, out)
	}
	c.passkeyAddedMail("ana@example.org")
	if st, _ := mint(tok); st != 403 {
		t.Errorf("a registration made the session fresh: mint %d", st)
	}

	// The other session's registration, begun before A existed, is now
	// the second passkey of the account, and that session never asserted.
	if st, out := finish(evilTok, evilBegin, attest(evil, evilBegin)); st != 403 || out["details"].(map[string]any)["passkey_required"] != true {
		t.Errorf("second passkey finished by a session without an assertion: %d %v", st, out)
	}

	// Six minutes on: registering B without an assertion is refused at
	// begin, and a mint is refused.
	c.clock.Advance(6 * time.Minute)
	b := passkeytest.NewDevice([]byte(acct))
	if st, out := begin(tok, "register"); st != 403 || out["details"].(map[string]any)["passkey_required"] != true {
		t.Errorf("register B without an assertion: %d %v", st, out)
	}
	if st, out := mint(tok); st != 403 {
		t.Errorf("mint without an assertion: %d %v", st, out)
	}
	if n := passkeys(); n != 1 {
		t.Fatalf("passkeys: %v, want 1", n)
	}

	// Asserted, begun, but finished after the check went stale: refused.
	if st, out := c.passkeyCeremony(acct, tok, "assert", a, rp); st != 200 || out["passkey_fresh"] != true {
		t.Fatalf("assert A: %d %v", st, out)
	}
	c.clock.Advance(4 * time.Minute)
	st, out := begin(tok, "register")
	if st != 200 {
		t.Fatalf("register B after asserting: %d %v", st, out)
	}
	c.clock.Advance(70 * time.Second) // the ceremony is young; the assertion is not
	if st, out := finish(tok, out, attest(b, out)); st != 403 {
		t.Errorf("register B finished after the assertion went stale: %d %v", st, out)
	}

	// With a fresh assertion, B is added (and the owner told).
	if st, out := c.passkeyCeremony(acct, tok, "assert", a, rp); st != 200 {
		t.Fatalf("assert A again: %d %v", st, out)
	}
	if st, out := c.passkeyCeremony(acct, tok, "register", b, rp); st != 200 || out["registered"] != true || out["passkey_fresh"] != true {
		t.Fatalf("register B after asserting: %d %v", st, out)
	}
	c.passkeyAddedMail("ana@example.org")
	if n := passkeys(); n != 2 {
		t.Errorf("passkeys: %v, want 2", n)
	}
	// Registering A's credential again cannot replace it.
	if st, out := c.passkeyCeremony(acct, tok, "register", a, rp); st < 400 {
		t.Errorf("registering an existing credential again: %d %v", st, out)
	}
	if n := passkeys(); n != 2 {
		t.Errorf("passkeys after re-registering A: %v, want 2", n)
	}
	// The other session still cannot register or mint.
	if st, _ := begin(evilTok, "register"); st != 403 {
		t.Errorf("the other session registers: %d", st)
	}
	if st, _ := mint(evilTok); st != 403 {
		t.Errorf("the other session mints: %d", st)
	}
	if st, out := mint(tok); st != 201 {
		t.Errorf("the owner's mint after asserting: %d %v", st, out)
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
