package devenv_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/devenv"
	"agentmesh.dev/mesh/shared/passkey/passkeytest"
)

// registrarSession proves addr at the registrar by its mailed code, as
// mesh-adapter join does, and returns the session token.
func (c *cp) registrarSession(addr string) string {
	c.t.Helper()
	if st, out := c.post("/api/handles/start", map[string]any{"email": addr}, ""); st != 200 {
		c.t.Fatalf("registrar start: %d %v", st, out)
	}
	st, out := c.post("/api/handles/verify", map[string]any{"email": addr, "code": c.mailedCode(addr)}, "")
	if st != 200 {
		c.t.Fatalf("registrar verify: %d %v", st, out)
	}
	return out["token"].(string)
}

// card resolves a handle and returns the operator name on its card.
func (c *cp) cardOperator(handle string) string {
	c.t.Helper()
	st, out := c.do(http.MethodGet, "/api/resolve?handle="+url.QueryEscape(handle), nil, "")
	card, _ := out["card"].(map[string]any)
	op, _ := card["operator"].(map[string]any)
	if st != 200 || op == nil {
		c.t.Fatalf("resolve %s: %d %v", handle, st, out)
	}
	name, _ := op["name"].(string)
	return name
}

// adminPost calls the operator commands' handler (meshd admin's socket).
func (c *cp) adminPost(path string, body any) (int, map[string]any) {
	c.t.Helper()
	b, _ := json.Marshal(body)
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json") // as meshd admin sends it
	devenv.AdminHandler(c.m.Control(), nil).ServeHTTP(rec, req)
	var out map[string]any
	_ = json.Unmarshal(rec.Body.Bytes(), &out)
	return rec.Code, out
}

// The operator name lives in one place: a name given at the registrar
// (mesh-adapter join), at minting (the console's form, meshd admin
// agent-token --operator) or by a console claim is the name every other
// door shows, and one given later through another door does not replace
// it.
func TestOperatorNameIsOneName(t *testing.T) {
	c := startCP(t)

	// 1. Named at join (the registrar), seen by the account, minting and
	// the cards.
	reg := c.registrarSession("ana@example.org")
	if st, out := c.post("/api/handles/claim", map[string]any{"name": "helper", "operator_name": "Ana López"}, reg); st != 200 || out["operator_name"] != "Ana López" {
		t.Fatalf("join's claim: %d %v", st, out)
	}
	acct, tok := c.signIn("ana@example.org")
	if st, out := c.do(http.MethodGet, "/v1/session", nil, tok); st != 200 || out["operator_name"] != "Ana López" {
		t.Fatalf("the console's account after a join: %d %v", st, out)
	}
	st, grant := c.adminPost("/admin/agent-tokens", map[string]any{"account": acct, "name": "coder", "operator_name": "Someone Else"})
	if st != 200 || grant["operator_name"] != "Ana López" ||
		grant["handle_note"] != "When the agent starts it claims the handle coder.ana@example.org, unless someone claims it first." {
		t.Fatalf("meshd admin agent-token for a joined address: %d %v", st, grant)
	}
	agent := newAgent(t)
	if st, out := c.post("/v1/bootstrap", map[string]any{"token": grant["token"], "agent_id": agent.Public()}, ""); st != 200 || out["handle"] != "coder.ana@example.org" {
		t.Fatalf("exchange: %d %v", st, out)
	}
	for _, h := range []string{"helper.ana@example.org", "coder.ana@example.org"} {
		if got := c.cardOperator(h); got != "Ana López" {
			t.Errorf("card of %s: operator %q, want Ana López", h, got)
		}
	}

	// 2. Named at minting (the HTTP door the console uses), seen by a
	// later join that gives no name, and by the cards.
	ops, opsTok := c.signIn("ops@example.org")
	rp := passkeytest.RelyingParty{Name: "agentmesh", ID: "localhost", Origin: strings.TrimSuffix(c.m.URLs().Console, "/console/")}
	dev := passkeytest.NewDevice([]byte(ops))
	if st, out := c.passkeyCeremony(ops, opsTok, "register", dev, rp); st != 200 {
		t.Fatalf("register: %d %v", st, out)
	}
	c.passkeyAddedMail("ops@example.org")
	if st, out := c.passkeyCeremony(ops, opsTok, "assert", dev, rp); st != 200 {
		t.Fatalf("assert: %d %v", st, out)
	}
	st, out := c.post("/v1/accounts/"+ops+"/agent-tokens", map[string]any{"name": "my builder", "operator_name": "Ops Team"}, opsTok)
	if st != 201 || out["operator_name"] != "Ops Team" || !strings.Contains(out["handle_note"].(string), "space or an @") {
		t.Fatalf("mint naming the operator: %d %v", st, out)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, err := c.smtp.Wait(ctx, "ops@example.org"); err != nil { // the key's mailed copy
		t.Fatal(err)
	}
	st, out = c.post("/api/handles/claim", map[string]any{"name": "builder"}, c.registrarSession("ops@example.org"))
	if st != 200 || out["operator_name"] != "Ops Team" {
		t.Fatalf("a join's claim with no name for an account named at minting: %d %v", st, out)
	}
	if got := c.cardOperator("builder.ops@example.org"); got != "Ops Team" {
		t.Errorf("card: operator %q, want Ops Team", got)
	}

	// 3. An account with no name yet: the key says plainly it will not
	// claim, and why; meshd admin agent-token --operator names it.
	bare := c.adminAccount("bare@example.org")
	st, grant = c.adminPost("/admin/agent-tokens", map[string]any{"account": bare, "name": "worker"})
	if st != 200 || grant["operator_name"] != "" || !strings.Contains(grant["handle_note"].(string), "the account has no operator name") {
		t.Fatalf("mint for an account with no name: %d %v", st, grant)
	}
	st, grant = c.adminPost("/admin/agent-tokens", map[string]any{"account": bare, "name": "worker", "operator_name": "Bare Ops"})
	if st != 200 || grant["operator_name"] != "Bare Ops" || !strings.Contains(grant["handle_note"].(string), "claims the handle worker.bare@example.org") {
		t.Fatalf("mint with --operator: %d %v", st, grant)
	}
}

// adminAccount creates an account as meshd admin account create does.
func (c *cp) adminAccount(email string) string {
	c.t.Helper()
	st, out := c.adminPost("/admin/accounts", map[string]any{"email": email})
	if st != 200 {
		c.t.Fatalf("admin account create: %d %v", st, out)
	}
	return out["account_id"].(string)
}
