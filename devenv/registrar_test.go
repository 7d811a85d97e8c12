package devenv_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/devenv"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/registrar"
	"agentmesh.dev/mesh/shared/store"
)

// get fetches path and returns the status, the headers and the body.
func (c *cp) get(path string) (int, http.Header, []byte) {
	c.t.Helper()
	resp, err := http.Get(c.base + path)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

// The whole registrar flow through the in-process mesh, over real HTTP
// with real mail: start → mailed code → verify → claim → pair/start →
// the agent signs → pair/complete → resolve shows the agent, under a
// signature that verifies with the published key set.
func TestRegistrarFlow(t *testing.T) {
	c := startCP(t)
	if c.m.URLs().Registrar != c.base {
		t.Fatalf("registrar URL %s, control URL %s: one server on meshd", c.m.URLs().Registrar, c.base)
	}
	if fi, err := os.Stat(filepath.Join(c.dir, "keys", devenv.RegistrarKeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("registrar key file: %v %v", fi, err)
	}

	st, out := c.post("/api/handles/start", map[string]any{"email": "Ana@Example.org"}, "")
	if st != 200 || out["ok"] != true || out["email"] != "ana@example.org" || out["delivery"] != "email" {
		t.Fatalf("start: %d %v", st, out)
	}
	code := c.mailedCode("ana@example.org")
	if st, out := c.post("/api/handles/verify", map[string]any{"email": "ana@example.org", "code": "000000"}, ""); st != 401 || out["ok"] != false ||
		(code != "000000" && !strings.Contains(out["error"].(string), "wrong code")) {
		t.Fatalf("wrong code: %d %v", st, out)
	}
	st, out = c.post("/api/handles/verify", map[string]any{"email": "ana@example.org", "code": code}, "")
	if st != 200 || out["ok"] != true || !strings.HasPrefix(out["token"].(string), "rgs_") {
		t.Fatalf("verify: %d %v", st, out)
	}
	tok := out["token"].(string)
	if st, out := c.post("/api/handles/verify", map[string]any{"email": "ana@example.org", "code": code}, ""); st != 401 || !strings.Contains(out["error"].(string), "already used") {
		t.Fatalf("reused code: %d %v", st, out)
	}

	// Claim: operator name first, then the handle is reserved.
	if st, out := c.post("/api/handles/claim", map[string]any{"name": "helper"}, ""); st != 401 {
		t.Fatalf("claim without a session: %d %v", st, out)
	}
	if st, out := c.post("/api/handles/claim", map[string]any{"name": "helper"}, tok); st != 400 || out["code"] != "OPERATOR_REQUIRED" || out["ok"] != false {
		t.Fatalf("first claim without operator: %d %v", st, out)
	}
	if st, out := c.post("/api/handles/claim", map[string]any{"name": "helper", "operator_name": "Ana", "extra": 1}, tok); st != 400 || !strings.Contains(out["error"].(string), "unknown member") {
		t.Fatalf("unknown member: %d %v", st, out)
	}
	st, out = c.post("/api/handles/claim", map[string]any{"name": "Helper", "operator_name": "Ana"}, tok)
	if st != 200 || out["handle"] != "Helper.ana@example.org" || out["operator_name"] != "Ana" {
		t.Fatalf("claim: %d %v", st, out)
	}
	handle := out["handle"].(string)
	st, out = c.do(http.MethodGet, "/api/resolve?handle="+url.QueryEscape("helper.ana@example.org"), nil, "")
	card, _ := out["card"].(map[string]any)
	if st != 200 || card["reserved"] != true || len(card["endpoints"].([]any)) != 0 || card["binding"] != nil {
		t.Fatalf("reserved: %d %v", st, out)
	}

	// Pairing.
	st, out = c.post("/api/pair/start", map[string]any{"handle": handle}, tok)
	if st != 200 || len(out["code"].(string)) != 7 || out["expires_at"] == nil {
		t.Fatalf("pair/start: %d %v", st, out)
	}
	pcode := out["code"].(string)
	agent, impostor := newAgent(t), newAgent(t)
	st, out = c.post("/api/pair/complete", map[string]any{"code": pcode, "agent_id": agent.Public(), "signature": protocol.SignPair(impostor, pcode)}, "")
	if st != 401 || !strings.Contains(out["error"].(string), "the code was not used") {
		t.Fatalf("bad signature: %d %v", st, out)
	}
	st, out = c.post("/api/pair/complete", map[string]any{"code": pcode, "agent_id": agent.Public(), "signature": protocol.SignPair(agent, pcode)}, "")
	if st != 200 || out["handle"] != handle {
		t.Fatalf("pair/complete: %d %v", st, out)
	}
	st, out = c.post("/api/pair/complete", map[string]any{"code": pcode, "agent_id": agent.Public(), "signature": protocol.SignPair(agent, pcode)}, "")
	if st != 404 || out["error"] != "pairing code unknown, used or expired: request a new one" {
		t.Fatalf("used code: %d %v", st, out)
	}

	// Resolve: the agent is in the endpoints, and the card verifies with
	// the key set.
	resp, err := http.Get(c.base + "/api/resolve?handle=" + url.QueryEscape(handle))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Cache-Control") != "public, max-age=360" {
		t.Fatalf("resolve: %d %v %s", resp.StatusCode, resp.Header, raw)
	}
	var res struct {
		Card         json.RawMessage `json:"card"`
		RegistrarKey string          `json:"registrar_key"`
		RegistrarKid string          `json:"registrar_kid"`
		RegistrarSig string          `json:"registrar_sig"`
	}
	if err := json.Unmarshal(raw, &res); err != nil {
		t.Fatal(err)
	}
	var cardV map[string]any
	if err := json.Unmarshal(res.Card, &cardV); err != nil {
		t.Fatal(err)
	}
	eps := cardV["endpoints"].([]any)
	if cardV["reserved"] != false || len(eps) != 1 || eps[0].(map[string]any)["agent_id"] != agent.Public() || eps[0].(map[string]any)["protocol"] != "mesh" ||
		cardV["registrar"] != c.base || cardV["operator"].(map[string]any)["name"] != "Ana" {
		t.Fatalf("bound card: %s", res.Card)
	}
	st, ks := c.do(http.MethodGet, "/api/registrar-key", nil, "")
	set := ks["key_set"].([]any)[0].(map[string]any)
	if st != 200 || ks["registrar"] != c.base || ks["keys"].([]any)[0] != res.RegistrarKey || set["kid"] != res.RegistrarKid ||
		set["status"] != "current" || set["use"] != "pan-card-signing" {
		t.Fatalf("key set: %d %v", st, ks)
	}
	if err := protocol.VerifyCard(ks["keys"].([]any)[0].(string), cardV, res.RegistrarSig); err != nil {
		t.Fatalf("card signature: %v", err)
	}
	// In reverse, by agent id.
	if st, out := c.do(http.MethodGet, "/api/resolve?agent_id="+agent.Public(), nil, ""); st != 200 || out["card"].(map[string]any)["handle"] != handle {
		t.Fatalf("reverse: %d %v", st, out)
	}

	// Refusals of resolve.
	if st, out := c.do(http.MethodGet, "/api/resolve?handle=nobody.ana@example.org", nil, ""); st != 404 || out["ok"] != false || out["error"] != "no agent by that name" {
		t.Fatalf("unknown handle: %d %v", st, out)
	}
	if st, out := c.do(http.MethodGet, "/api/resolve", nil, ""); st != 400 || out["ok"] != false {
		t.Fatalf("no parameter: %d %v", st, out)
	}

	// WebFinger.
	st, hdr, body := c.get("/.well-known/webfinger?resource=" + url.QueryEscape("acct:"+handle))
	if st != 200 || hdr.Get("Content-Type") != "application/jrd+json" || !strings.Contains(string(body), `"urn:pan:binding":"agent-key"`) {
		t.Fatalf("webfinger: %d %v %s", st, hdr, body)
	}
}

// The refusals of spec §7.2 over HTTP that the flow above does not reach:
// a taken name (409), the per-address code limit (429 with Retry-After),
// an expired pairing code, and the escaped card page.
func TestRegistrarRefusals(t *testing.T) {
	c := startCP(t)
	session := func(email string) string {
		t.Helper()
		if st, out := c.post("/api/handles/start", map[string]any{"email": email}, ""); st != 200 {
			t.Fatalf("start %s: %d %v", email, st, out)
		}
		st, out := c.post("/api/handles/verify", map[string]any{"email": email, "code": c.mailedCode(email)}, "")
		if st != 200 {
			t.Fatalf("verify %s: %d %v", email, st, out)
		}
		return out["token"].(string)
	}
	ops := session("ops@example.org")
	if st, out := c.post("/api/handles/claim", map[string]any{"name": "a.b", "operator_name": "Ops"}, ops); st != 200 {
		t.Fatalf("claim: %d %v", st, out)
	}
	rival := session("b.ops@example.org")
	st, out := c.post("/api/handles/claim", map[string]any{"name": "A", "operator_name": "Rival"}, rival)
	if st != 409 || out["ok"] != false || !strings.HasPrefix(out["error"].(string), "taken") {
		t.Fatalf("taken: %d %v", st, out)
	}

	// A name with markup is a valid handle; the card page escapes it.
	if st, out := c.post("/api/handles/claim", map[string]any{"name": "<script>alert(1)</script>"}, ops); st != 200 {
		t.Fatalf("claim: %d %v", st, out)
	}
	st, hdr, body := c.get("/a/" + url.PathEscape("<script>alert(1)</script>.ops@example.org"))
	if st != 200 || !strings.HasPrefix(hdr.Get("Content-Type"), "text/html") || strings.Contains(string(body), "<script>") ||
		!strings.Contains(string(body), "&lt;script&gt;alert(1)&lt;/script&gt;.ops@example.org") || !strings.Contains(string(body), "Reserved") {
		t.Fatalf("card page: %d %v\n%s", st, hdr, body)
	}
	st, hdr, body = c.get("/a/nobody.ops@example.org")
	if st != 404 || !strings.HasPrefix(hdr.Get("Content-Type"), "text/html") || !strings.Contains(string(body), "No agent by that name") {
		t.Fatalf("card page 404: %d %v\n%s", st, hdr, body)
	}

	// Pairing codes expire after ten minutes.
	st, out = c.post("/api/pair/start", map[string]any{"handle": "a.b.ops@example.org"}, ops)
	if st != 200 {
		t.Fatalf("pair/start: %d %v", st, out)
	}
	pcode := out["code"].(string)
	c.clock.Advance(10*time.Minute + time.Millisecond)
	agent := newAgent(t)
	st, out = c.post("/api/pair/complete", map[string]any{"code": pcode, "agent_id": agent.Public(), "signature": protocol.SignPair(agent, pcode)}, "")
	if st != 404 || !strings.Contains(out["error"].(string), "unknown, used or expired") {
		t.Fatalf("expired code: %d %v", st, out)
	}

	// Five codes an hour per address; the sixth is a 429.
	for i := range 5 {
		st, out := c.post("/api/handles/start", map[string]any{"email": "many@example.org"}, "")
		if st != 200 {
			t.Fatalf("code %d: %d %v", i+1, st, out)
		}
	}
	req, _ := http.NewRequest(http.MethodPost, c.base+"/api/handles/start", strings.NewReader(`{"email":"many@example.org"}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var lim map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&lim)
	resp.Body.Close()
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || lim["code"] != "RATE_LIMITED" || lim["details"].(map[string]any)["limit"] != "code-per-address" {
		t.Fatalf("sixth code: %d %v %v", resp.StatusCode, resp.Header, lim)
	}
}

// Behind a reverse proxy (TrustedProxyHops 1, meshd's
// --trusted-proxy-hops) the per-IP limits key on the address the proxy
// appended to X-Forwarded-For, not on the proxy's own socket address.
func TestTrustedProxyHops(t *testing.T) {
	c := startCP(t, func(cfg *devenv.Config) { cfg.RateLimit = 2; cfg.TrustedProxyHops = 1 })
	get := func(xff string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, c.base+"/api/registrar-key", nil)
		req.Header.Set("X-Forwarded-For", xff)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for i, xff := range []string{"203.0.113.5, 192.0.2.1", "192.0.2.1"} {
		if st := get(xff); st != 200 {
			t.Fatalf("request %d: %d", i, st)
		}
	}
	if st := get("198.51.100.7, 192.0.2.1"); st != 429 {
		t.Fatalf("the client's third request: %d, want 429 (the left-most entry is the client's to forge)", st)
	}
	if st := get("192.0.2.2"); st != 200 {
		t.Fatalf("another client behind the same proxy: %d (every client would share the proxy's limit)", st)
	}
}

// meshd sweeps the registrar's expired documents on its own: a code mailed
// and never used, and the counters it took, are gone once they expire.
func TestRegistrarSweepRuns(t *testing.T) {
	c := startCP(t, func(cfg *devenv.Config) { cfg.JobInterval = 20 * time.Millisecond })
	if st, out := c.post("/api/handles/start", map[string]any{"email": "never@example.org"}, ""); st != 200 {
		t.Fatalf("start: %d %v", st, out)
	}
	c.mailedCode("never@example.org")
	count := func(coll string) int {
		var docs []map[string]any
		if err := store.List(t.Context(), c.m.Control().Store, coll, store.Query{}, &docs); err != nil {
			t.Fatal(err)
		}
		return len(docs)
	}
	time.Sleep(100 * time.Millisecond)
	if count(registrar.CollCodes) != 1 || count(registrar.CollRateLimits) != 3 {
		t.Fatalf("before expiry: %d codes, %d counters", count(registrar.CollCodes), count(registrar.CollRateLimits))
	}
	c.clock.Advance(3 * time.Hour)
	deadline := time.Now().Add(5 * time.Second)
	for count(registrar.CollCodes)+count(registrar.CollRateLimits) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("not swept: %d codes, %d counters", count(registrar.CollCodes), count(registrar.CollRateLimits))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
