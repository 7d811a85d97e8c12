package devenv_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"agentmesh.dev/mesh/devenv"
	"agentmesh.dev/mesh/shared/errs"
)

// raw sends body as is with content type ct and returns the status and the
// decoded JSON error body (failing the test when the answer is not JSON).
func (c *cp) raw(method, path, ct, body, bearer string) (int, errs.HTTPBody) {
	c.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out errs.HTTPBody
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") || json.Unmarshal(b, &out) != nil {
		c.t.Fatalf("%s %.80s: %d %q, not JSON: %.200s", method, path, resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	return resp.StatusCode, out
}

// An id no document can have (Firestore's rules, which the embedded store
// applies alike) is the caller's bad input: 400 INVALID_REQUEST, never a
// retryable 503. Ids in a path with "." or ".." segments are cleaned away
// by the mux (a redirect), so they reach no store; the answer is still a
// JSON refusal.
func TestBadIDsAreBadInput(t *testing.T) {
	c := startCP(t)
	acct, tok := c.signIn("ana@example.org")
	badInPath := map[string]string{"a/b": "contains '/'", "__x__": "reserved form", strings.Repeat("x", 1501): "longer than 1500 bytes"}
	for _, route := range []string{"POST /v1/accounts/%s/apps/%s/refresh", "DELETE /v1/accounts/%s/apps/%s"} {
		method, pattern, _ := strings.Cut(route, " ")
		for id, why := range badInPath {
			st, body := c.raw(method, fmt.Sprintf(pattern, acct, url.PathEscape(id)), "", "", tok)
			if st != http.StatusBadRequest || body.Code != errs.InvalidRequest || body.Retryable || !strings.Contains(body.Error, why) {
				t.Errorf("%s with app id %.12q: %d %+v", route, id, st, body)
			}
		}
		for _, id := range []string{".", ".."} {
			st, body := c.raw(method, fmt.Sprintf(pattern, acct, id), "", "", tok)
			if st/100 != 4 || body.Retryable {
				t.Errorf("%s with app id %q: %d %+v", route, id, st, body)
			}
		}
	}
	// A query parameter is not cleaned: "." and ".." reach the registrar.
	for _, h := range []string{".", ".."} {
		st, body := c.raw("GET", "/api/resolve?handle="+url.QueryEscape(h), "", "", "")
		if st != http.StatusBadRequest || body.Code != errs.InvalidRequest || body.Retryable {
			t.Errorf("resolve %q: %d %+v", h, st, body)
		}
	}
	// Removing a subscription refuses what cannot be an agent id, as adding
	// one does.
	for id := range badInPath {
		st, body := c.raw("DELETE", "/v1/accounts/"+acct+"/subscriptions/"+url.PathEscape(id), "", "", tok)
		if st != http.StatusBadRequest || body.Code != errs.InvalidRequest {
			t.Errorf("unsubscribe %.12q: %d %+v", id, st, body)
		}
	}
}

// The mux's own 404 and 405 are JSON error bodies, like every route's.
func TestMuxErrorsAreJSON(t *testing.T) {
	c := startCP(t)
	for _, r := range []struct {
		method, path string
		status       int
		code         errs.Code
	}{
		{"GET", "/v1/nothing-here", 404, errs.NotFound},
		{"GET", "/", 404, errs.NotFound},
		{"GET", "/v1/bootstrap", 405, errs.InvalidRequest},
		{"PUT", "/v1/guest", 405, errs.InvalidRequest},
		{"DELETE", "/api/resolve", 405, errs.InvalidRequest},
	} {
		st, body := c.raw(r.method, r.path, "", "", "")
		if st != r.status || body.Code != r.code || body.OK || body.Error == "" {
			t.Errorf("%s %s: %d %+v", r.method, r.path, st, body)
		}
	}
}

// Bodies are decoded strictly on the real routes: exact member names, no
// duplicates, valid UTF-8, application/json, and only the documented
// members where the spec lists them.
func TestStrictBodiesOnRoutes(t *testing.T) {
	c := startCP(t)
	const js = "application/json"
	for _, r := range []struct {
		name, path, ct, body string
		status               int
		code                 errs.Code
	}{
		{"case-insensitive name", "/api/handles/start", js, `{"Email":"ana@example.org"}`, 400, errs.InvalidRequest},
		{"duplicate member", "/api/handles/start", js, `{"email":"eve@example.org","email":"ana@example.org"}`, 400, errs.InvalidRequest},
		{"invalid UTF-8", "/v1/accounts", js, "{\"email\":\"ana\xff@example.org\"}", 400, errs.InvalidRequest},
		{"no content type", "/v1/login", "", `{"email":"ana@example.org"}`, 415, errs.ContentTypeNotSupported},
		{"form content type", "/v1/connect", "application/x-www-form-urlencoded", `email=a`, 415, errs.ContentTypeNotSupported},
		{"text content type", "/v1/bootstrap", "text/plain", `{"token":"am_x","agent_id":"U"}`, 415, errs.ContentTypeNotSupported},
		{"unknown member (bootstrap)", "/v1/bootstrap", js, `{"token":"am_x","agent_id":"U","admin":true}`, 400, errs.InvalidRequest},
		{"case variant (bootstrap)", "/v1/bootstrap", js, `{"Token":"am_x","agent_id":"U"}`, 400, errs.InvalidRequest},
		{"unknown nested member (node-credential)", "/v1/node-credential", js, `{"node_id":"U","agents":[{"id":"U","sig":"s","x":1}],"ts":1,"node_sig":"s"}`, 400, errs.InvalidRequest},
		{"case variant nested (node-credential)", "/v1/node-credential", js, `{"node_id":"U","agents":[{"ID":"U","sig":"s"}],"ts":1,"node_sig":"s"}`, 400, errs.InvalidRequest},
		{"a body on POST /v1/guest", "/v1/guest", js, `{"want":"admin"}`, 400, errs.InvalidRequest},
		{"unknown member (claim)", "/api/handles/claim", js, `{"name":"coder","state":"bound"}`, 400, errs.InvalidRequest},
	} {
		st, body := c.raw("POST", r.path, r.ct, r.body, "")
		if st != r.status || body.Code != r.code {
			t.Errorf("%s: %d %+v", r.name, st, body)
		}
	}
	// No mail went out for the refused sign-ups.
	c.noMail("ana@example.org")
	c.noMail("eve@example.org")
}

// A body that trickles in is cut off at the body deadline (408), through
// meshd's own server.
func TestTrickledBodyIsCutOff(t *testing.T) {
	c := startCP(t, func(cfg *devenv.Config) { cfg.BodyTimeout = 300 * time.Millisecond })
	conn, err := net.Dial("tcp", strings.TrimPrefix(c.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"email":"ana@example.org"}` + strings.Repeat(" ", 2000)
	fmt.Fprintf(conn, "POST /v1/login HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for i := range len(body) {
			select {
			case <-stop:
				return
			case <-time.After(25 * time.Millisecond):
			}
			if _, err := conn.Write([]byte{body[i]}); err != nil {
				return
			}
		}
	}()
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second)) // a hang fails; it is not what is measured
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to a trickled body: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestTimeout || !bytes.Contains(b, []byte(`"code":"INVALID_REQUEST"`)) {
		t.Fatalf("trickle: %d %s", resp.StatusCode, b)
	}
}

// Refusals are logged by class with the route: a 4xx at debug, a store
// outage (503) at error with its cause.
func TestRefusalsAreLoggedByClass(t *testing.T) {
	var buf syncBuffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	c := startCP(t, func(cfg *devenv.Config) { cfg.Logger = log })
	acct, tok := c.signIn("ana@example.org")
	if st, _ := c.raw("POST", "/v1/login", "text/plain", `{}`, ""); st != 415 {
		t.Fatalf("415: %d", st)
	}
	// The store goes away under the routes: an outage.
	if err := c.m.Control().Store.Close(); err != nil {
		t.Fatal(err)
	}
	if st, body := c.raw("GET", "/v1/accounts/"+acct+"/apps", "", "", tok); st != 503 || !body.Retryable {
		t.Fatalf("outage: %d %+v", st, body)
	}
	var refused, failed map[string]any
	for _, l := range strings.Split(buf.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) != nil {
			continue
		}
		switch m["msg"] {
		case "request refused":
			refused = m
		case "request failed":
			failed = m
		}
	}
	if refused == nil || refused["level"] != "DEBUG" || refused["route"] != "POST /v1/login" || refused["status"] != float64(415) {
		t.Errorf("4xx log line: %v", refused)
	}
	if failed == nil || failed["level"] != "ERROR" || failed["route"] != "GET /v1/accounts/{id}/apps" || failed["status"] != float64(503) ||
		!strings.Contains(fmt.Sprint(failed["err"]), "database not open") {
		t.Errorf("5xx log line: %v", failed)
	}
	if strings.Contains(buf.String(), tok) {
		t.Error("a session token reached the log")
	}
}

// syncBuffer is a bytes.Buffer safe for the concurrent writes of a logger.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Invisible and bidirectional format characters are refused in every name
// and address on the routes: the connect approval mail (email and app
// name), API-token and app names, agent-key labels, and the registrar's
// email, handle name and operator name.
func TestFormatCharactersRefusedOnRoutes(t *testing.T) {
	c := startCP(t)
	acct, tok := c.signIn("ana@example.org")
	reg, err := c.m.Control().Registrar.SessionFor(t.Context(), "bo@example.org", "console")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"\u202e", "\u200b", "\u2066", "\ufeff", "\u200f"} {
		for _, r := range []struct {
			name, path, body, bearer string
		}{
			{"connect email", "/v1/connect", `{"email":"eve` + f + `@example.org","app_name":"dash"}`, ""},
			{"connect app name", "/v1/connect", `{"email":"eve@example.org","app_name":"dash` + f + `board"}`, ""},
			{"sign-up email", "/v1/accounts", `{"email":"eve` + f + `@example.org"}`, ""},
			{"API-token name", "/v1/accounts/" + acct + "/api-tokens", `{"name":"ci` + f + `"}`, tok},
			{"app name", "/v1/accounts/" + acct + "/apps", `{"name":"` + f + `dash"}`, tok},
			{"registrar email", "/api/handles/start", `{"email":"eve` + f + `@example.org"}`, ""},
			{"handle name", "/api/handles/claim", `{"name":"coder` + f + `","operator_name":"Bo"}`, reg.Token},
			{"operator name", "/api/handles/claim", `{"name":"coder","operator_name":"Bo` + f + `"}`, reg.Token},
		} {
			st, body := c.raw("POST", r.path, "application/json", r.body, r.bearer)
			if st != http.StatusBadRequest || body.Code != errs.InvalidRequest || !strings.Contains(body.Error, "invisible formatting characters") {
				t.Errorf("%s with %U: %d %+v", r.name, []rune(f)[0], st, body)
			}
		}
		if _, err := c.m.Control().Accounts.AdminMintAgentKey(t.Context(), acct, "coder"+f); errs.CodeOf(err) != errs.InvalidRequest {
			t.Errorf("agent-key label with %U: %v", []rune(f)[0], err)
		}
	}
	c.noMail("eve@example.org")
}
