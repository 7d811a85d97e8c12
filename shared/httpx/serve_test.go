package httpx

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/errs"
)

// captureLog is a logger at debug level writing JSON lines to a buffer.
func captureLog() (*slog.Logger, *bytes.Buffer) {
	var buf bytes.Buffer
	return slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), &buf
}

func logLines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

// Every refusal is logged once, by class: 4xx at debug, 5xx at error with
// its cause; both name the route by method and pattern, never the path.
func TestFailLogsByClass(t *testing.T) {
	storeDown := errors.New("bbolt: database not open")
	for _, c := range []struct {
		name   string
		err    error
		status int
		level  string
		cause  bool
	}{
		{"bad input", errs.New(errs.InvalidRequest, "name is required"), 400, "DEBUG", false},
		{"not found", errs.New(errs.NotFound, "no app"), 404, "DEBUG", false},
		{"rate limited", RateLimited(time.Second, ""), 429, "DEBUG", false},
		{"store outage", errs.Wrap(errs.Unavailable, "the store is unavailable; retry shortly", storeDown), 503, "ERROR", true},
		{"internal", fmt.Errorf("mint: %w", storeDown), 500, "ERROR", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			log, buf := captureLog()
			mux := http.NewServeMux()
			mux.Handle("POST /v1/accounts/{id}/apps", Handle(log, func(http.ResponseWriter, *http.Request) error { return c.err }))
			rec := httptest.NewRecorder()
			mux.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/accounts/acct_secretish/apps", nil))
			if rec.Code != c.status {
				t.Fatalf("status %d, want %d", rec.Code, c.status)
			}
			lines := logLines(t, buf)
			if len(lines) != 1 {
				t.Fatalf("%d log lines, want 1: %s", len(lines), buf)
			}
			l := lines[0]
			if l["level"] != c.level || l["route"] != "POST /v1/accounts/{id}/apps" || l["status"] != float64(c.status) {
				t.Errorf("log line %v", l)
			}
			if strings.Contains(buf.String(), "acct_secretish") {
				t.Errorf("the log names the path, not the pattern: %s", buf)
			}
			if got := fmt.Sprint(l["err"]); c.cause != strings.Contains(got, "database not open") {
				t.Errorf("cause logged = %q, want it: %v", got, c.cause)
			}
			// The cause never reaches the caller.
			if strings.Contains(rec.Body.String(), "bbolt") {
				t.Errorf("cause leaked: %s", rec.Body)
			}
		})
	}
	// At info level a refusal costs nothing and says nothing.
	var buf bytes.Buffer
	info := slog.New(slog.NewJSONHandler(&buf, nil))
	rec := httptest.NewRecorder()
	Fail(rec, httptest.NewRequest(http.MethodGet, "/", nil), info, errs.New(errs.InvalidRequest, "x"))
	if buf.Len() != 0 {
		t.Errorf("4xx logged at info: %s", &buf)
	}
}

// The mux's own 404 and 405 answer the JSON error body, and say so in the
// log at debug; its redirects pass unchanged.
func TestJSONErrors(t *testing.T) {
	log, buf := captureLog()
	mux := http.NewServeMux()
	mux.Handle("POST /v1/guest", Handle(log, func(w http.ResponseWriter, _ *http.Request) error {
		WriteJSON(w, 200, map[string]any{"ok": true})
		return nil
	}))
	mux.Handle("GET /v1/tree/", http.NotFoundHandler())
	h := JSONErrors(mux, log)
	for _, c := range []struct {
		method, path string
		status       int
		code         errs.Code
		allow        string
	}{
		{"GET", "/v1/nope", 404, errs.NotFound, ""},
		{"GET", "/v1/guest", 405, errs.InvalidRequest, "POST"},
		{"DELETE", "/v1/guest", 405, errs.InvalidRequest, "POST"},
		{"POST", "/v1/guest", 200, "", ""},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(c.method, c.path, nil))
		if rec.Code != c.status || !strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json") {
			t.Errorf("%s %s: %d %q", c.method, c.path, rec.Code, rec.Header().Get("Content-Type"))
			continue
		}
		if c.code == "" {
			continue
		}
		var body errs.HTTPBody
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.OK || body.Code != c.code || body.Error == "" {
			t.Errorf("%s %s: body %s (%v)", c.method, c.path, rec.Body, err)
		}
		if got := rec.Header().Get("Allow"); got != c.allow {
			t.Errorf("%s %s: Allow %q, want %q", c.method, c.path, got, c.allow)
		}
	}
	// A path with a "." segment is redirected to its clean form, as before.
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/tree/./x", nil))
	if rec.Code/100 != 3 || rec.Header().Get("Location") != "/v1/tree/x" {
		t.Errorf("redirect: %d %v", rec.Code, rec.Header())
	}
	lines := logLines(t, buf)
	if len(lines) != 3 {
		t.Fatalf("log lines: %s", buf)
	}
	for _, l := range lines {
		if l["level"] != "DEBUG" || !strings.HasSuffix(fmt.Sprint(l["route"]), "(no route)") {
			t.Errorf("log line %v", l)
		}
	}
}

// A client that trickles its body is cut off at the body deadline with a
// 408, and the handler is not held; a client that sends its body at once,
// then waits for a slow handler, keeps its request context.
func TestBodyDeadlineCutsOffATrickle(t *testing.T) {
	log, buf := captureLog()
	handlerDone := make(chan error, 1)
	mux := http.NewServeMux()
	mux.Handle("POST /v1/x", BodyDeadline(200*time.Millisecond, Handle(log, func(w http.ResponseWriter, r *http.Request) error {
		var b struct {
			Name string `json:"name"`
		}
		err := Decode(w, r, &b, DecodeOptions{Strict: true})
		if err == nil && b.Name == "slow" {
			// Past the body deadline, with the body read: the context lives.
			time.Sleep(400 * time.Millisecond)
			err = r.Context().Err()
		}
		handlerDone <- err
		if err != nil {
			return err
		}
		WriteJSON(w, 200, map[string]any{"ok": true})
		return nil
	})))
	srv := httptest.NewServer(JSONErrors(mux, log))
	defer srv.Close()

	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"name":"` + strings.Repeat("x", 1000) + `"}`
	fmt.Fprintf(conn, "POST /v1/x HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))
	// Trickle one byte at a time until the server answers or hangs up.
	answered := make(chan struct{})
	go func() {
		for i := 0; i < len(body); i++ {
			select {
			case <-answered:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if _, err := conn.Write([]byte{body[i]}); err != nil {
				return
			}
		}
	}()
	_ = conn.SetReadDeadline(time.Now().Add(15 * time.Second)) // a hang fails the test, it does not time it
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	close(answered)
	if err != nil {
		t.Fatalf("no answer to a trickled body: %v", err)
	}
	raw, _ := io.ReadAll(resp.Body)
	var eb errs.HTTPBody
	if resp.StatusCode != http.StatusRequestTimeout || json.Unmarshal(raw, &eb) != nil || eb.Code != errs.InvalidRequest {
		t.Fatalf("trickle: %d %s", resp.StatusCode, raw)
	}
	if err := <-handlerDone; errs.As(err).HTTPStatus() != http.StatusRequestTimeout {
		t.Errorf("handler saw %v", err)
	}
	if !strings.Contains(buf.String(), `"status":408`) {
		t.Errorf("the 408 is not logged: %s", buf)
	}

	// The deadline covers the body only.
	resp, err = http.Post(srv.URL+"/v1/x", "application/json", strings.NewReader(`{"name":"slow"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if err := <-handlerDone; err != nil || resp.StatusCode != 200 {
		t.Errorf("a slow handler after a prompt body: %d, %v", resp.StatusCode, err)
	}
}
