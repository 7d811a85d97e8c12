package devenv_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/devenv"
)

func TestSignInByMailedCode(t *testing.T) {
	c := startCP(t)
	acct, tok := c.signIn("Ana@Example.org")
	if !strings.HasPrefix(acct, "acct_") || !strings.HasPrefix(tok, "ams_") {
		t.Fatalf("account %q token %q", acct, tok)
	}
	st, who := c.do(http.MethodGet, "/v1/session", nil, tok)
	if st != 200 || who["account_id"] != acct || who["email"] != "ana@example.org" {
		t.Fatalf("session: %d %v", st, who)
	}

	// Login for an unknown address answers the same and mails nothing.
	st, out := c.post("/v1/login", map[string]any{"email": "nobody@example.org"}, "")
	if st != http.StatusAccepted || out["delivery"] != "email" {
		t.Fatalf("unknown login: %d %v", st, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := c.smtp.Wait(ctx, "nobody@example.org"); err == nil {
		t.Error("mail was sent to an address with no account")
	}

	// Five wrong codes burn the code; the right one then fails too.
	c.post("/v1/login", map[string]any{"email": "ana@example.org"}, "")
	code := c.mailedCode("ana@example.org")
	for i := range 5 {
		st, out := c.post("/v1/login/verify", map[string]any{"email": "ana@example.org", "code": "000000x"}, "")
		if st != 401 {
			t.Fatalf("wrong code %d: %d %v", i, st, out)
		}
	}
	if st, _ := c.post("/v1/login/verify", map[string]any{"email": "ana@example.org", "code": code}, ""); st != 401 {
		t.Error("a burned code still worked")
	}

	// A code expires after 15 minutes.
	c.post("/v1/login", map[string]any{"email": "ana@example.org"}, "")
	code = c.mailedCode("ana@example.org")
	c.clock.Advance(16 * time.Minute)
	st, out = c.post("/v1/login/verify", map[string]any{"email": "ana@example.org", "code": code}, "")
	if st != 401 || !strings.Contains(out["error"].(string), "expired") {
		t.Errorf("expired code: %d %v", st, out)
	}

	// Sessions expire (30 days) and end at sign-out.
	if st, _ := c.post("/v1/logout", nil, tok); st != 200 {
		t.Fatal("logout")
	}
	if st, _ := c.do(http.MethodGet, "/v1/session", nil, tok); st != 401 {
		t.Error("a signed-out session still works")
	}
	_, tok2 := c.signIn("ana@example.org")
	c.clock.Advance(31 * 24 * time.Hour)
	if st, _ := c.do(http.MethodGet, "/v1/session", nil, tok2); st != 401 {
		t.Error("an expired session still works")
	}
}

func TestSignInRefusals(t *testing.T) {
	c := startCP(t)
	for _, body := range []map[string]any{
		{"email": "not-an-address"}, {"email": ""}, {"email": "a@b.c", "extra": 1}, {},
	} {
		if st, out := c.post("/v1/accounts", body, ""); st != 400 || out["code"] != "INVALID_REQUEST" {
			t.Errorf("%v: %d %v", body, st, out)
		}
	}
	// The mail limit per address (5 per 15 minutes) answers 429.
	for i := range 5 {
		if st, out := c.post("/v1/accounts", map[string]any{"email": "rate@example.org"}, ""); st != 202 {
			t.Fatalf("mail %d: %d %v", i, st, out)
		}
	}
	st, out := c.post("/v1/login", map[string]any{"email": "rate@example.org"}, "")
	if st != 429 || out["retry_after_ms"] == nil {
		t.Errorf("6th mail: %d %v", st, out)
	}
}

// Every account route answers one identical 401, whatever is wrong.
func TestAccountRoutesUniform401(t *testing.T) {
	c := startCP(t)
	a, tokA := c.signIn("a@example.org")
	b, _ := c.signIn("b@example.org")
	var bodies []string
	for _, tc := range []struct{ account, bearer string }{
		{a, ""}, {a, "garbage"}, {b, tokA}, {"acct_nope", tokA}, {a, "amt_notatoken"}, {a, "ams_notatoken"},
	} {
		st, out := c.do(http.MethodGet, "/v1/accounts/"+tc.account+"/api-tokens", nil, tc.bearer)
		if st != 401 {
			t.Errorf("%v: %d", tc, st)
		}
		bodies = append(bodies, out["error"].(string)+string(out["code"].(string)))
	}
	for _, b := range bodies[1:] {
		if b != bodies[0] {
			t.Errorf("401 bodies differ: %q vs %q", b, bodies[0])
		}
	}
}

func TestAPITokens(t *testing.T) {
	c := startCP(t)
	acct, tok := c.signIn("ana@example.org")
	path := "/v1/accounts/" + acct + "/api-tokens"
	st, out := c.post(path, map[string]any{"name": "ci", "scopes": []string{"audit"}}, tok)
	if st != 201 || !strings.HasPrefix(out["token"].(string), "amt_") {
		t.Fatalf("create: %d %v", st, out)
	}
	amt, id := out["token"].(string), out["id"].(string)
	if st, _ := c.post(path, map[string]any{"name": "x", "scopes": []string{"root"}}, tok); st != 400 {
		t.Error("unknown scope accepted")
	}
	// An API token can neither make tokens nor mint agent keys.
	if st, _ := c.post(path, map[string]any{"name": "x"}, amt); st != 401 {
		t.Errorf("an amt_ token created a token: %d", st)
	}
	if st, _ := c.post("/v1/accounts/"+acct+"/agent-tokens", map[string]any{"name": "coder"}, amt); st != 401 {
		t.Errorf("an amt_ token reached agent-token minting: %d", st)
	}
	st, out = c.do(http.MethodGet, path, nil, tok)
	if st != 200 || len(out["tokens"].([]any)) != 1 {
		t.Fatalf("list: %d %v", st, out)
	}
	if st, _ := c.do(http.MethodDelete, path+"/"+id, nil, tok); st != 200 {
		t.Fatal("revoke")
	}
	st, out = c.do(http.MethodGet, path, nil, tok)
	if st != 200 {
		t.Fatalf("list after revoke: %d %v", st, out)
	}
	if out["tokens"].([]any)[0].(map[string]any)["revoked"] != true {
		t.Errorf("not revoked: %v", out)
	}
}

// A mesh without its workers runs no clearing, and says that instead.
func TestCapabilitiesWithoutWorkers(t *testing.T) {
	c := startCP(t, func(cfg *devenv.Config) { cfg.Workers.None = true; cfg.MarkupPct = 15 })
	st, out := c.do(http.MethodGet, "/v1/capabilities", nil, "")
	if st != 200 || out["markup_pct"] != 15.0 || out["clearing_service"] != false || out["clearing"] != nil {
		t.Fatalf("%d %v", st, out)
	}
}

func TestCapabilities(t *testing.T) {
	c := startCP(t)
	st, out := c.do(http.MethodGet, "/v1/capabilities", nil, "")
	// The mesh runs the clearing worker, and says so with its terms.
	if st != 200 || out["markup_pct"] != 10.0 || out["clearing_service"] != true {
		t.Fatalf("%d %v", st, out)
	}
	if cl, _ := out["clearing"].(map[string]any); cl["currency"] != "XCR" || cl["markup_pct"] != 10.0 || cl["payout"] != false || cl["resale_path"] == nil {
		t.Fatalf("clearing: %v", out["clearing"])
	}
	if st, out := c.do(http.MethodGet, "/auth/status", nil, ""); st != 200 || out["available"] == nil || out["issued"] != 0.0 {
		t.Errorf("auth/status: %d %v", st, out)
	}
}
