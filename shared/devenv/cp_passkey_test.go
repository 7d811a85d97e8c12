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
	if st, out := c.passkeyCeremony(acct, tok, "register", dev, rp); st != 200 {
		t.Fatalf("register: %d %v", st, out)
	}
	st, out = mint()
	if st != 201 {
		t.Fatalf("mint after registering: %d %v", st, out)
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

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
