package cli_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/mail/mailtest"
)

// mailWorld is a world whose mesh mails through an in-process SMTP server,
// so a test can read the codes a person would read.
type mailWorld struct {
	*world
	smtp *mailtest.Server
}

func newMailWorld(t *testing.T) *mailWorld {
	t.Helper()
	srv := mailtest.Start(t)
	sender, err := mail.NewSMTP(mail.SMTPConfig{Addr: srv.Addr(), From: "mesh@mesh.test", TLS: mail.StartTLSNone})
	if err != nil {
		t.Fatal(err)
	}
	return &mailWorld{world: newWorldWith(t, sender), smtp: srv}
}

var handleCodeRE = regexp.MustCompile(`\b(\d{6})\b`)

// handleCode waits for the next registrar code mailed to addr (agent key
// copies go to the same address and are skipped).
func (w *mailWorld) handleCode(addr string) string {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(w.t.Context(), 10*time.Second)
	defer cancel()
	for {
		msg, err := w.smtp.Wait(ctx, addr)
		if err != nil {
			w.t.Fatalf("no code mailed to %s: %v", addr, err)
		}
		if msg.Message.Kind != "handle-code" {
			continue
		}
		m := handleCodeRE.FindStringSubmatch(msg.Message.Text)
		if m == nil {
			w.t.Fatalf("no code in %q", msg.Message.Text)
		}
		return m[1]
	}
}

// api calls the registrar over HTTP, as the console or a person would.
func (w *mailWorld) api(method, path, bearer string, body any) map[string]any {
	w.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, w.m.URLs().Registrar+path, rd)
	req.Header.Set("Content-Type", "application/json")
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		w.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	if resp.StatusCode != 200 {
		w.t.Fatalf("%s %s: %d %v", method, path, resp.StatusCode, out)
	}
	return out
}

// lockedBuffer collects a child's output while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// waitFor waits for s in out.
func waitFor(t *testing.T, out *lockedBuffer, s string) {
	t.Helper()
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if strings.Contains(out.String(), s) {
			return
		}
	}
	t.Fatalf("never printed %q:\n%s", s, out.String())
}

// The registrar through the built adapter: `join` (email, the mailed code,
// name and operator name typed on stdin) claims and binds a handle; `send`
// to the handle resolves it through the registrar, verifies the card and
// pins the agent; `pair` with a code from the registrar moves the handle
// to another agent, and the next send refuses loudly until the user
// accepts the new binding.
func TestJoinPairAndSendByHandle(t *testing.T) {
	w := newMailWorld(t)
	reg := w.m.URLs().Registrar
	a, b, c := w.state("a"), w.state("b"), w.state("c")
	const handle = "helper.ana@example.org"

	pa, idA := w.start(a, "--registrar-url", reg, "up", w.agentKey("helper"))
	pa.stop()

	// join, answering its questions as a person would.
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	join := exec.CommandContext(ctx, binary, "--state-dir", a, "--control-url", w.m.URLs().Control, "join")
	join.Env = append(os.Environ(), "MESH_ADAPTER_HOME=", "MESH_CONTROL_URL=", "MESH_REGISTRAR_URL=")
	stdin, err := join.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out lockedBuffer
	join.Stdout, join.Stderr = &out, &out
	if err := join.Start(); err != nil {
		t.Fatal(err)
	}
	io.WriteString(stdin, "ana@example.org\n")
	waitFor(t, &out, "Code: ")
	io.WriteString(stdin, w.handleCode("ana@example.org")+"\n")
	waitFor(t, &out, "Agent name [helper]")
	io.WriteString(stdin, "helper\n")
	waitFor(t, &out, "Operator name")
	io.WriteString(stdin, "Ana Lopez\n")
	stdin.Close()
	if err := join.Wait(); err != nil {
		t.Fatalf("join: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "Claimed "+handle) || !strings.Contains(out.String(), handle+" is now bound to agent "+idA) {
		t.Fatalf("join output:\n%s", out.String())
	}
	var who map[string]any
	if err := json.Unmarshal([]byte(w.must(a, "whoami", "--json")), &who); err != nil || who["handle"] != handle {
		t.Fatalf("whoami after join: %v %v", who, err)
	}

	// A answers in command mode; B sends to the handle.
	w.start(a, "start", "--cmd", "tr a-z A-Z", "--raw", "--name", "helper")
	pb, _ := w.start(b, "--registrar-url", reg, "up", w.agentKey("caller"))
	pb.stop()
	if got := strings.TrimSpace(w.must(b, "send", handle, "hello", "--wait", "20")); got != "HELLO" {
		t.Fatalf("send by handle: %q", got)
	}
	if fi, err := os.Stat(filepath.Join(b, "pins.json")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("pins.json: %v %v", fi, err)
	}

	// The owner pairs the handle with another agent, C, using a code from
	// the registrar and `pair`.
	pc, idC := w.start(c, "--registrar-url", reg, "up", w.agentKey("replacement"))
	pc.stop()
	w.api("POST", "/api/handles/start", "", map[string]any{"email": "ana@example.org"})
	tok := w.api("POST", "/api/handles/verify", "", map[string]any{"email": "ana@example.org", "code": w.handleCode("ana@example.org")})["token"].(string)
	code := w.api("POST", "/api/pair/start", tok, map[string]any{"handle": handle})["code"].(string)
	if _, errOut, status := w.run(c, "pair", handle, "ZZZ-ZZZ"); status == 0 || !strings.Contains(errOut, "unknown, used or expired: request a new one") {
		t.Fatalf("pair with an unknown code: %d %s", status, errOut)
	}
	if out := w.must(c, "pair", handle, strings.ToLower(code)); !strings.Contains(out, handle+" is now bound to agent "+idC) {
		t.Fatalf("pair: %s", out)
	}
	if _, errOut, status := w.run(c, "pair", handle, code); status == 0 || !strings.Contains(errOut, "unknown, used or expired") {
		t.Fatalf("pair with a used code: %d %s", status, errOut)
	}
	w.start(c, "start", "--cmd", "sed 's/^/from C: /'", "--raw", "--name", "replacement")

	// B's pin says A: the send is refused, loudly, and nothing is sent.
	_, errOut, status := w.run(b, "send", handle, "hello again", "--wait", "20")
	if status == 0 || !strings.Contains(errOut, "THE AGENT BEHIND A HANDLE HAS CHANGED") || !strings.Contains(errOut, idA) ||
		!strings.Contains(errOut, idC) || !strings.Contains(errOut, "--accept-new-binding") {
		t.Fatalf("send after the binding changed: exit %d\n%s", status, errOut)
	}
	// Accepting the change sends to C and pins it.
	outS, errOut, status := w.run(b, "send", handle, "hello again", "--wait", "20", "--accept-new-binding")
	if status != 0 || strings.TrimSpace(outS) != "from C: hello again" || !strings.Contains(errOut, "now pinned to agent "+idC) {
		t.Fatalf("send --accept-new-binding: exit %d\nstdout %s\nstderr %s", status, outS, errOut)
	}
	if got := strings.TrimSpace(w.must(b, "send", handle, "and again", "--wait", "20")); got != "from C: and again" {
		t.Fatalf("send after accepting: %q", got)
	}

	// Issue 10 item 9: a send through a running adapter that saved no
	// registrar resolves the handle with --registrar-url or
	// MESH_REGISTRAR_URL (both used to be ignored on that path).
	d := w.state("d")
	w.start(d, "up", w.agentKey("by-flag"))
	if _, errOut, status := w.run(d, "send", handle, "no registrar", "--wait", "20"); status != 1 || !strings.Contains(errOut, "needs the registrar") {
		t.Fatalf("send by handle with no registrar: exit %d\n%s", status, errOut)
	}
	if got := strings.TrimSpace(w.must(d, "send", handle, "by flag", "--wait", "20", "--registrar-url", reg)); got != "from C: by flag" {
		t.Fatalf("send --registrar-url through a running adapter: %q", got)
	}
	byEnv := exec.CommandContext(ctx, binary, "--state-dir", d, "send", handle, "by env", "--wait", "20")
	byEnv.Env = append(os.Environ(), "MESH_ADAPTER_HOME=", "MESH_CONTROL_URL=", "MESH_REGISTRAR_URL="+reg)
	if got, err := byEnv.Output(); err != nil || strings.TrimSpace(string(got)) != "from C: by env" {
		t.Fatalf("send with MESH_REGISTRAR_URL through a running adapter: %q %v", got, err)
	}

	// The card as anyone sees it.
	resp, err := http.Get(reg + "/api/resolve?handle=" + url.QueryEscape(handle))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var res struct {
		Card struct {
			Operator struct {
				Name string `json:"name"`
			} `json:"operator"`
			Endpoints []struct {
				AgentID string `json:"agent_id"`
			} `json:"endpoints"`
		} `json:"card"`
	}
	if err := json.NewDecoder(bufio.NewReader(resp.Body)).Decode(&res); err != nil || res.Card.Operator.Name != "Ana Lopez" ||
		len(res.Card.Endpoints) != 1 || res.Card.Endpoints[0].AgentID != idC {
		t.Fatalf("card: %+v %v", res, err)
	}
}
