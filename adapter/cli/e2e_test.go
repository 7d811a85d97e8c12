package cli_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"agentmesh.dev/mesh/devenv"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/protocol"
)

// The end-to-end tests run the built mesh-adapter binary against an
// in-process mesh (devenv): real broker, real workers, real control plane.

var (
	binary     string
	buildFlags []string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "mesh-adapter-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "mesh-adapter")
	args := append(append([]string{"build"}, buildFlags...), "-o", binary, "agentmesh.dev/mesh/adapter/cmd/mesh-adapter")
	out, err := exec.Command("go", args...).CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build mesh-adapter: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// world is a mesh and a short base directory for adapter state (unix
// socket paths must stay short).
type world struct {
	t    *testing.T
	m    *devenv.Mesh
	base string
	acct string
}

func newWorld(t *testing.T) *world {
	t.Helper()
	ob, err := mail.NewOutbox(t.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return newWorldWith(t, ob)
}

// newWorldWith starts the mesh with sender as its mail, and an account.
func newWorldWith(t *testing.T, sender mail.Sender) *world {
	t.Helper()
	m, err := devenv.Start(context.Background(), devenv.Config{DataDir: t.TempDir(), Mail: sender})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	base, err := os.MkdirTemp("", "ma")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	a, _, err := m.Control().Accounts.CreateAccount(t.Context(), "ana@example.org")
	if err != nil {
		t.Fatal(err)
	}
	return &world{t: t, m: m, base: base, acct: a.ID}
}

// agentKey mints a single-use am_ key on the account.
func (w *world) agentKey(name string) string {
	w.t.Helper()
	g, err := w.m.Control().Accounts.AdminMintAgentKey(w.t.Context(), w.acct, name)
	if err != nil {
		w.t.Fatal(err)
	}
	return g.Token
}

func (w *world) state(name string) string { return filepath.Join(w.base, name) }

// run runs the adapter to completion.
func (w *world) run(state string, args ...string) (stdout, stderr string, code int) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(w.t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, append([]string{"--state-dir", state, "--control-url", w.m.URLs().Control}, args...)...)
	cmd.Env = append(os.Environ(), "MESH_ADAPTER_HOME=", "MESH_CONTROL_URL=", "MESH_REGISTRAR_URL=")
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code = 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		w.t.Fatalf("run %v: %v", args, err)
	}
	return o.String(), e.String(), code
}

// must runs the adapter and requires success.
func (w *world) must(state string, args ...string) string {
	w.t.Helper()
	out, errOut, code := w.run(state, args...)
	if code != 0 {
		w.t.Fatalf("mesh-adapter %v: exit %d\nstdout: %s\nstderr: %s", args, code, out, errOut)
	}
	return out
}

// proc is a long-lived adapter.
type proc struct {
	cmd   *exec.Cmd
	mu    sync.Mutex
	lines []string
	id    chan string
	done  chan struct{}
}

// start runs a long-lived adapter command and waits for its agent id.
func (w *world) start(state string, args ...string) (*proc, string) {
	w.t.Helper()
	cmd := exec.Command(binary, append([]string{"--state-dir", state, "--control-url", w.m.URLs().Control}, args...)...)
	cmd.Env = append(os.Environ(), "MESH_ADAPTER_HOME=", "MESH_CONTROL_URL=", "MESH_REGISTRAR_URL=")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		w.t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	p := &proc{cmd: cmd, id: make(chan string, 1), done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		w.t.Fatal(err)
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.lines = append(p.lines, line)
			p.mu.Unlock()
			if id, ok := strings.CutPrefix(line, "agent id: "); ok {
				select {
				case p.id <- strings.TrimSpace(id):
				default:
				}
			}
		}
		_ = cmd.Wait()
	}()
	w.t.Cleanup(func() { p.stop() })
	select {
	case id := <-p.id:
		return p, id
	case <-p.done:
		w.t.Fatalf("mesh-adapter %v exited:\n%s", args, p.output())
	case <-time.After(30 * time.Second):
		w.t.Fatalf("mesh-adapter %v printed no agent id:\n%s", args, p.output())
	}
	return nil, ""
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

// printed waits a little for a line containing s.
func (p *proc) printed(s string) bool {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if strings.Contains(p.output(), s) {
			return true
		}
	}
	return false
}

// stop interrupts the adapter and waits for it to end.
func (p *proc) stop() {
	if p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// background runs a command that blocks (a send waiting for a reply).
func (w *world) background(state string, args ...string) chan [3]string {
	ch := make(chan [3]string, 1)
	go func() {
		o, e, code := w.run(state, args...)
		ch <- [3]string{o, e, fmt.Sprint(code)}
	}()
	return ch
}

// inboxJSON is `inbox --json`.
func (w *world) inboxJSON(state string, all bool) []map[string]any {
	w.t.Helper()
	args := []string{"inbox", "--json"}
	if all {
		args = append(args, "--all")
	}
	var msgs []map[string]any
	if err := json.Unmarshal([]byte(w.must(state, args...)), &msgs); err != nil {
		w.t.Fatal(err)
	}
	return msgs
}

// waitInbox waits until the inbox at state holds a message with text.
func (w *world) waitInbox(state, text string) map[string]any {
	w.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		for _, m := range w.inboxJSON(state, false) {
			if m["text"] == text {
				return m
			}
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("%q never reached the inbox at %s", text, state)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Two adapters, one in inbox mode and one in command mode, exchange
// messages with send --wait; the inbox side reads, replies, refuses on
// budget (both kinds, checked on the wire) and acknowledges; a restart of
// the inbox adapter keeps its identity and its unread messages, and picks
// up what arrived while it was down.
func TestTwoAdaptersTalk(t *testing.T) {
	w := newWorld(t)
	a, b := w.state("a"), w.state("b")

	// A: up with a minted key → inbox mode.
	pa, idA := w.start(a, "up", w.agentKey("helper"))
	if !pa.printed("saved agent " + idA + " (helper)") {
		t.Fatalf("up output:\n%s", pa.output())
	}
	// B: up, then restarted in command mode (framed input).
	pb, idB := w.start(b, "up", w.agentKey("echo"))
	pb.stop()
	cmd := `in=$(cat); case "$in" in *please-fail*) echo "the tool broke" >&2; exit 3;; esac; printf '%s' "$in" | tr a-z A-Z`
	pb, idB2 := w.start(b, "start", "--cmd", cmd, "--name", "echo")
	if idB2 != idB {
		t.Fatalf("B's identity changed across a restart: %s → %s", idB, idB2)
	}
	if !pb.printed("also here: helper (" + idA) {
		t.Errorf("B did not report A in the node discovery directory:\n%s", pb.output())
	}

	// A asks B: the command's stdout, framed input uppercased, is the reply.
	out := w.must(a, "send", idB, "hello from a", "--wait", "20")
	if !strings.Contains(out, "--- BEGIN SENDER MESSAGE ---\nHELLO FROM A\n--- END SENDER MESSAGE ---") ||
		!strings.Contains(out, "FROM:      AGENT "+strings.ToUpper(idA)) {
		t.Fatalf("reply from command mode:\n%s", out)
	}
	// A failing command is an error reply the sender sees.
	_, errOut, code := w.run(a, "send", idB, "please-fail", "--wait", "20")
	if code == 0 || !strings.Contains(errOut, "the tool broke") || !strings.Contains(errOut, "exit status 3") {
		t.Fatalf("failing command: exit %d, stderr %s", code, errOut)
	}

	// The wire: a service connection watches A's outbox.
	nc, err := w.m.ConnectService("test-wire")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	wire, err := nc.SubscribeSync(protocol.OutboxSubject(idA))
	if err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	answerOf := func(requestFrom string) map[string]any {
		t.Helper()
		for {
			m, err := wire.NextMsg(10 * time.Second)
			if err != nil {
				t.Fatalf("no answer on A's outbox: %v", err)
			}
			env, err := protocol.Decode(m.Data)
			if err != nil {
				t.Fatal(err)
			}
			v, _ := env.PayloadValue()
			p := v.(map[string]any)
			if _, queued := p["queued"]; queued || env.To != requestFrom {
				continue
			}
			return p
		}
	}

	// B asks A (inbox mode): held until A replies.
	wait := w.background(b, "send", idA, "what is 2+2?", "--wait", "30")
	m := w.waitInbox(a, "what is 2+2?")
	if m["from"] != idB || m["budget_line"] != "" || !strings.Contains(m["framed"].(string), "from:      agent "+idB) {
		t.Fatalf("inbox entry %v", m)
	}
	w.must(a, "reply", fmt.Sprint(m["seq"]), "four")
	if r := <-wait; r[2] != "0" || strings.TrimSpace(r[0]) != "four" {
		t.Fatalf("send waiting for the inbox reply: %v", r)
	}
	// A person's answer reaches a protocol 0.3 sender as a fresh request
	// offering back what was asked for (upstream-notes §15).
	if p := answerOf(idB); p["offering"] != "chat" || p["input"].(map[string]any)["text"] != "four" {
		t.Fatalf("reply on the wire %v", p)
	}
	if _, errOut, code := w.run(a, "reply", fmt.Sprint(m["seq"]), "again"); code == 0 || !strings.Contains(errOut, "already replied") {
		t.Fatalf("second reply: %d %s", code, errOut)
	}

	// Refusals on budget: money, then time; an ambiguous estimate is
	// refused here and the message stays unread.
	for _, tc := range []struct {
		estimate string
		says     string
		code     errs.Code
		check    func(details map[string]any) bool
	}{
		{"$12.50", "their estimate: 12.5", errs.BudgetInsufficient, func(d map[string]any) bool {
			e := d["estimate"].(map[string]any)
			return e["amount_micro"] == 12_500_000.0 && e["currency"] == "USD"
		}},
		{"90m", "earliest completion: ", errs.DeadlineUnmeetable, func(d map[string]any) bool {
			at, err := protocol.ParseTime(d["earliest_completion"].(string))
			return err == nil && time.Until(at) > 80*time.Minute && time.Until(at) < 100*time.Minute
		}},
	} {
		text := "job for " + tc.estimate
		wait := w.background(b, "send", idA, text, "--wait", "30")
		m := w.waitInbox(a, text)
		if _, errOut, code := w.run(a, "reply", fmt.Sprint(m["seq"]), "--refuse-budget", "5.00"); code == 0 || !strings.Contains(errOut, "ambiguous") {
			t.Fatalf("ambiguous estimate: %d %s", code, errOut)
		}
		w.must(a, "reply", fmt.Sprint(m["seq"]), "--refuse-budget", tc.estimate, "not at that price")
		r := <-wait
		if r[2] == "0" || !strings.Contains(r[1], string(tc.code)) || !strings.Contains(r[1], tc.says) {
			t.Fatalf("send refused on budget (%s): %v", tc.estimate, r)
		}
		p := answerOf(idB)
		e := p["error"].(map[string]any)
		if p["status"] != "failed" || e["code"] != string(tc.code) || !tc.check(e["details"].(map[string]any)) {
			t.Fatalf("refusal on the wire (%s): %v", tc.estimate, p)
		}
	}

	// ack: seen without a reply.
	wait = w.background(b, "send", idA, "fyi", "--wait", "2")
	m = w.waitInbox(a, "fyi")
	<-wait
	w.must(a, "ack", fmt.Sprint(m["seq"]))
	if got := w.inboxJSON(a, false); len(got) != 0 {
		t.Fatalf("unread after ack: %v", got)
	}

	// A reply that comes after the sender stopped waiting is kept in the
	// sender's inbox, as a reply; there is nothing to answer in it.
	wait = w.background(b, "send", idA, "answer me later", "--wait", "1")
	m = w.waitInbox(a, "answer me later")
	<-wait
	w.must(a, "reply", fmt.Sprint(m["seq"]), "here is the late answer")
	late := w.waitInbox(b, "here is the late answer")
	if late["kind"] != "reply" || late["from"] != idA || late["in_reply_to"] == "" {
		t.Fatalf("late reply in the sender's inbox: %v", late)
	}
	if _, errOut, code := w.run(b, "reply", fmt.Sprint(late["seq"]), "thanks"); code == 0 || !strings.Contains(errOut, "nothing to answer") {
		t.Fatalf("reply to a reply: %d %s", code, errOut)
	}
	w.must(b, "ack", fmt.Sprint(late["seq"]))

	// Restart: identity and unread messages survive, and what arrived
	// while the adapter was down is delivered from the mailbox.
	wait = w.background(b, "send", idA, "unread before restart", "--wait", "2")
	w.waitInbox(a, "unread before restart")
	<-wait
	pa.stop()
	if _, errOut, code := w.run(a, "inbox"); code == 0 || !strings.Contains(errOut, "no inbox-mode adapter running") {
		t.Fatalf("inbox with no adapter: %d %s", code, errOut)
	}
	if _, errOut, code := w.run(b, "send", idA, "while you were out", "--wait", "2"); code == 0 || !strings.Contains(errOut, "may not be running") {
		t.Fatalf("send to a stopped adapter: %d %s", code, errOut)
	}
	_, idA2 := w.start(a, "start", "--inbox", "--name", "helper")
	if idA2 != idA {
		t.Fatalf("A's identity changed across a restart: %s → %s", idA, idA2)
	}
	w.waitInbox(a, "unread before restart")
	w.waitInbox(a, "while you were out")

	// whoami needs no network.
	var who map[string]any
	if err := json.Unmarshal([]byte(w.must(a, "whoami", "--json")), &who); err != nil || who["agent_id"] != idA || who["handle"] != nil {
		t.Fatalf("whoami: %v %v", who, err)
	}
	if fi, err := os.Stat(filepath.Join(a, "identity.json")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("identity.json mode: %v %v", fi, err)
	}
}

// The owner's allowance governs command mode: work over the tightest
// ceiling is refused with BUDGET_INSUFFICIENT quoting its price; with
// ask-owner it is held in the inbox for the owner; a tampered policy fails
// closed.
func TestAllowanceInCommandMode(t *testing.T) {
	w := newWorld(t)
	a, b := w.state("a"), w.state("b")
	pb, idB := w.start(b, "up", w.agentKey("worker"))
	pb.stop()
	// $1 per 1,000 tokens; the framed prompt of a short message is ~600
	// characters (~150 tokens, $0.15), prompt plus echoed output ~$0.30.
	if _, errOut, code := w.run(b, "allowance", "set", "$0.20"); code == 0 || !strings.Contains(errOut, "per-1k-tokens") {
		t.Fatalf("first set without a price: %d %s", code, errOut)
	}
	out := w.must(b, "allowance", "set", "$0.20", "--per-1k-tokens", "$1.00")
	if !strings.Contains(out, "0.20") {
		t.Fatalf("allowance set:\n%s", out)
	}
	w.start(b, "start", "--cmd", "cat", "--name", "worker")
	w.start(a, "up", w.agentKey("caller"))

	w.must(a, "send", idB, "first", "--wait", "20") // fits: admitted, then metered
	if show := w.must(b, "allowance", "show"); !strings.Contains(show, "verified") && !strings.Contains(show, "signed") {
		t.Logf("allowance show:\n%s", show)
	}
	_, errOut, code := w.run(a, "send", idB, "second", "--wait", "20")
	if code == 0 || !strings.Contains(errOut, "BUDGET_INSUFFICIENT") {
		t.Fatalf("over the day's ceiling: %d %s", code, errOut)
	}

	// ask-owner: held for the owner instead.
	w.must(b, "allowance", "set", "$0.20", "--on-exhausted", "ask-owner")
	wait := w.background(a, "send", idB, "third", "--wait", "20")
	m := w.waitInbox(b, "third")
	w.must(b, "reply", fmt.Sprint(m["seq"]), "approved by the owner")
	if r := <-wait; r[2] != "0" || strings.TrimSpace(r[0]) != "approved by the owner" {
		t.Fatalf("held then answered: %v", r)
	}

	// Tampered: every ceiling counts as exhausted, and nothing is held.
	policy := filepath.Join(b, "allowance.json")
	data, err := os.ReadFile(policy)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(policy, bytes.Replace(data, []byte(`"amount_micro":200000`), []byte(`"amount_micro":900000000`), 1), 0o600); err != nil {
		t.Fatal(err)
	}
	if show := w.must(b, "allowance", "show"); !strings.Contains(strings.ToLower(show), "fail") {
		t.Fatalf("show of a tampered policy:\n%s", show)
	}
	_, errOut, code = w.run(a, "send", idB, "fourth", "--wait", "20")
	if code == 0 || !strings.Contains(errOut, "BUDGET_INSUFFICIENT") {
		t.Fatalf("tampered policy: %d %s", code, errOut)
	}
	w.must(b, "allowance", "clear")
	w.must(a, "send", idB, "fifth", "--wait", "20")
}

// Every command explains itself with an example; mistakes in the command
// line exit 2 with the usage.
func TestHelp(t *testing.T) {
	out, err := exec.Command(binary, "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Commands:") {
		t.Fatalf("--help: %v\n%s", err, out)
	}
	for _, c := range []string{"start", "up", "join", "inbox", "reply", "ack", "pair", "send", "whoami", "allowance", "contacts", "room", "board", "skus"} {
		if !strings.Contains(string(out), "  "+c+" ") {
			t.Errorf("--help does not list %s", c)
		}
		// Help wherever it is asked for, in any spelling, never runs the
		// command (issue 10 item 9: --help=true used to be a usage error).
		for _, args := range [][]string{{"help", c}, {c, "--help"}, {c, "-h"}, {c, "--help=true"}, {c, "-help"}, {c, "some-arg", "--help"}, {c, "show", "-h"}} {
			h, err := exec.Command(binary, args...).CombinedOutput()
			if err != nil || !strings.Contains(string(h), "usage: mesh-adapter "+c) || !strings.Contains(string(h), "Example:") {
				t.Errorf("%v: %v\n%s", args, err, h)
			}
		}
	}
	for _, args := range [][]string{{"help", "--help"}, {"help", "-h"}, {"--help=true"}} {
		if out, err := exec.Command(binary, args...).CombinedOutput(); err != nil || !strings.Contains(string(out), "Commands:") {
			t.Errorf("%v: %v\n%s", args, err, out)
		}
	}
	// An agent key with --help is not redeemed.
	if out, err := exec.Command(binary, "--state-dir", filepath.Join(t.TempDir(), "h"), "--control-url", "http://127.0.0.1:1", "up", "am_notakey", "--help").CombinedOutput(); err != nil ||
		!strings.Contains(string(out), "usage: mesh-adapter up") || strings.Contains(string(out), "redeeming") {
		t.Errorf("up --help: %v\n%s", err, out)
	}
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"frobnicate"}, "unknown command"},
		{[]string{"start"}, "choose one of --inbox or --cmd"},
		{[]string{"start", "--inbox"}, "--inbox needs --name"},
		{[]string{"up", "not-a-key"}, "not an agent key"},
		{[]string{"reply", "1"}, "give the message id and the text"},
		{[]string{"send", "x"}, "give the recipient and the text"},
		{[]string{"allowance", "frob"}, "unknown allowance action"},
		{[]string{"room", "dossier"}, "room dossier takes 1 argument"},
		{[]string{"room", "frob"}, "unknown room action"},
		{[]string{"board", "claim", "r"}, "board claim takes 2 argument"},
		{[]string{"skus"}, "give one agent"},
	} {
		cmd := exec.Command(binary, append([]string{"--state-dir", filepath.Join(dir, "s")}, tc.args...)...)
		out, err := cmd.CombinedOutput()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), tc.want) {
			t.Errorf("%v: %v\n%s", tc.args, err, out)
		}
	}
	// Errors a user can act on.
	out, _ = exec.Command(binary, "--state-dir", filepath.Join(dir, "s"), "whoami").CombinedOutput()
	if !strings.Contains(string(out), "mesh-adapter up") {
		t.Errorf("whoami without an identity: %s", out)
	}
	out, _ = exec.Command(binary, "--state-dir", filepath.Join(dir, "s"), "room", "dossier", "r", "--out", filepath.Join(dir, "d.json")).CombinedOutput()
	if !strings.Contains(string(out), "mesh-adapter up") {
		t.Errorf("room dossier without an identity: %s", out)
	}
}

// runAt runs the adapter to completion against controlURL.
func (w *world) runAt(controlURL, state string, args ...string) (stdout, stderr string, code int) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(w.t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, append([]string{"--state-dir", state, "--control-url", controlURL}, args...)...)
	cmd.Env = append(os.Environ(), "MESH_ADAPTER_HOME=", "MESH_CONTROL_URL=", "MESH_REGISTRAR_URL=")
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		w.t.Fatalf("run %v: %v", args, err)
	}
	return o.String(), e.String(), code
}

// identity reads the state directory's identity.json.
func identity(t *testing.T, state string) (agentID string, guest bool) {
	t.Helper()
	var id struct {
		AgentID string `json:"agent_id"`
		Guest   bool   `json:"guest"`
	}
	b, err := os.ReadFile(filepath.Join(state, "identity.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &id); err != nil {
		t.Fatal(err)
	}
	return id.AgentID, id.Guest
}

// The review's M2: an `up` whose exchange fails leaves its identity, and
// the next `up` retries with it (same agent id); a `send` or `start` in a
// directory whose `up` did not finish refuses instead of leasing a guest
// over the agent's seeds. A key an earlier attempt spent (its answer lost)
// is explained, and a new key redeems the same agent.
func TestUpCanBeRetried(t *testing.T) {
	w := newWorld(t)
	a := w.state("a")
	key := w.agentKey("helper")

	// The control plane is unreachable: the identity is saved, the key is
	// not spent.
	_, errOut, code := w.runAt("http://127.0.0.1:1", a, "up", key)
	if code == 0 || !strings.Contains(errOut, "run the same `mesh-adapter up <agent-key>` again") {
		t.Fatalf("up against an unreachable control plane: exit %d\n%s", code, errOut)
	}
	saved, guest := identity(t, a)
	if guest || !strings.HasPrefix(saved, "U") {
		t.Fatalf("identity after the failed up: %s guest=%v", saved, guest)
	}

	// send and start refuse rather than lease a guest over it.
	_, errOut, code = w.run(a, "send", saved, "hello", "--wait", "5")
	if code == 0 || !strings.Contains(errOut, "holds agent "+saved) || !strings.Contains(errOut, "No guest identity is leased") {
		t.Fatalf("send with an unfinished up: exit %d\n%s", code, errOut)
	}
	_, errOut, code = w.run(a, "start", "--inbox", "--name", "x")
	if code == 0 || !strings.Contains(errOut, "holds agent "+saved) {
		t.Fatalf("start with an unfinished up: exit %d\n%s", code, errOut)
	}
	if id, guest := identity(t, a); id != saved || guest {
		t.Fatalf("the identity changed: %s → %s (guest=%v)", saved, id, guest)
	}

	// up again, against the real control plane: the same agent.
	p, id := w.start(a, "up", key)
	if id != saved || !p.printed("retrying as agent "+saved) || !p.printed("saved agent "+saved+" (helper)") {
		t.Fatalf("the retried up is agent %s, want %s:\n%s", id, saved, p.output())
	}
	p.stop()
	// Now it has a credential: a third up is refused, start runs it.
	if _, errOut, code := w.run(a, "up", w.agentKey("other")); code == 0 || !strings.Contains(errOut, "already belongs to agent "+saved) {
		t.Fatalf("up over a finished up: exit %d\n%s", code, errOut)
	}
	if _, id := w.start(a, "start", "--inbox", "--name", "helper"); id != saved {
		t.Fatalf("start after the retried up: %s, want %s", id, saved)
	}

	// An exchange whose answer was lost: the key is spent for the saved
	// agent. The retry says what happened and what to do; a new key
	// redeems the same agent.
	b := w.state("b")
	key = w.agentKey("lost")
	if _, _, code := w.runAt("http://127.0.0.1:1", b, "up", key); code == 0 {
		t.Fatal("up against an unreachable control plane succeeded")
	}
	lost, _ := identity(t, b)
	if st, out := bootstrap(t, w, key, lost); st != 200 {
		t.Fatalf("the lost exchange: %d %v", st, out)
	}
	_, errOut, code = w.run(b, "up", key)
	if code == 0 || !strings.Contains(errOut, "it is now used by agent "+lost) || !strings.Contains(errOut, "Mint a new agent key") ||
		!strings.Contains(errOut, "it reuses agent "+lost) {
		t.Fatalf("up with a key the lost exchange spent: exit %d\n%s", code, errOut)
	}
	if _, id := w.start(b, "up", w.agentKey("lost")); id != lost {
		t.Fatalf("up with a new key: %s, want %s", id, lost)
	}
}

// bootstrap exchanges key for agentID directly, as an up whose answer was
// lost would have.
func bootstrap(t *testing.T, w *world, key, agentID string) (int, map[string]any) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"token": key, "agent_id": agentID})
	resp, err := http.Post(w.m.URLs().Control+"/v1/bootstrap", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// contacts runs `contacts export` at state and returns the roster's subjects.
func (w *world) contacts(state string) []string {
	w.t.Helper()
	var r struct {
		Entries []struct {
			Subject string `json:"subject"`
			Stance  string `json:"stance"`
		} `json:"entries"`
		Sig string `json:"sig"`
	}
	if err := json.Unmarshal([]byte(w.must(state, "contacts", "export")), &r); err != nil || r.Sig == "" {
		w.t.Fatalf("contacts export: %v %+v", err, r)
	}
	out := []string{}
	for _, e := range r.Entries {
		if e.Stance != "allow" {
			w.t.Errorf("entry %+v", e)
		}
		out = append(out, e.Subject)
	}
	return out
}

// The review's L6: `contacts export` lists the agents this adapter
// exchanged messages with — one it sent to, one whose message it replied
// to — and not a sender whose message it only acknowledged.
func TestContactsExportOnlyExchanges(t *testing.T) {
	w := newWorld(t)
	a, b, c := w.state("a"), w.state("b"), w.state("c")
	w.start(a, "up", w.agentKey("owner"))
	pb, idB := w.start(b, "up", w.agentKey("worker"))
	pb.stop()
	w.start(b, "start", "--cmd", "cat", "--name", "worker")
	_, idC := w.start(c, "up", w.agentKey("stranger"))
	idOfA, _ := identity(t, a)

	if got := w.contacts(a); len(got) != 0 {
		t.Fatalf("contacts before any exchange: %v", got)
	}
	// A sends to B: B is a contact.
	w.must(a, "send", idB, "hello worker", "--wait", "20")
	// C's message reaches A's inbox; A only acknowledges it.
	wait := w.background(c, "send", idOfA, "buy my stuff", "--wait", "2")
	m := w.waitInbox(a, "buy my stuff")
	<-wait
	w.must(a, "ack", fmt.Sprint(m["seq"]))
	if got := w.contacts(a); strings.Join(got, ",") != idB {
		t.Fatalf("contacts after sending to B and acking C: %v, want [%s]", got, idB)
	}
	// Once A replies to C, C is a contact too.
	wait = w.background(c, "send", idOfA, "a real question", "--wait", "20")
	m = w.waitInbox(a, "a real question")
	w.must(a, "reply", fmt.Sprint(m["seq"]), "a real answer")
	<-wait
	want := []string{idB, idC}
	sort.Strings(want)
	if got := w.contacts(a); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("contacts after replying to C: %v, want %v", got, want)
	}
}

// The review's L4: send --wait must be a finite number of seconds in
// (0, 3600]; NaN, infinities and huge values used to pass and give a
// deadline already past.
func TestSendWaitMustBeSensible(t *testing.T) {
	dir := t.TempDir()
	for _, wait := range []string{"NaN", "nan", "Inf", "+Inf", "-Inf", "1e300", "3601", "0", "-1"} {
		cmd := exec.Command(binary, "--state-dir", filepath.Join(dir, "s"), "send", "UABC", "hi", "--wait", wait)
		out, err := cmd.CombinedOutput()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "--wait must be a number of seconds greater than 0 and at most 3600") {
			t.Errorf("--wait %s: %v\n%s", wait, err, out)
		}
	}
	// In range, it goes on to the recipient (which this one is not).
	out, _ := exec.Command(binary, "--state-dir", filepath.Join(dir, "s"), "send", "UABC", "hi", "--wait", "3600").CombinedOutput()
	if strings.Contains(string(out), "--wait must") || !strings.Contains(string(out), "neither an agent id") {
		t.Errorf("--wait 3600: %s", out)
	}
}

// The review's L5: help for a command that does not exist names it and
// exits 2.
func TestHelpUnknownCommand(t *testing.T) {
	cmd := exec.Command(binary, "help", "frobnicate")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 2 || !strings.Contains(stderr.String(), `mesh-adapter help: unknown command "frobnicate"`) || !strings.Contains(stderr.String(), "Commands:") {
		t.Errorf("help frobnicate: %v\nstdout: %s\nstderr: %s", err, stdout.String(), stderr.String())
	}
	if out, err := exec.Command(binary, "help").CombinedOutput(); err != nil || !strings.Contains(string(out), "Commands:") {
		t.Errorf("help: %v\n%s", err, out)
	}
}
