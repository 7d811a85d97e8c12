package cli_test

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// busURL is the bus endpoint `up` saved in state's config.json.
func busURL(t *testing.T, state string) string {
	t.Helper()
	var c struct {
		NATSURLs []string `json:"nats_urls"`
	}
	b, err := os.ReadFile(filepath.Join(state, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &c); err != nil || len(c.NATSURLs) == 0 {
		t.Fatalf("config.json: %v %s", err, b)
	}
	return c.NATSURLs[0]
}

// setBusURL points state's saved bus endpoint at url, keeping the rest.
func setBusURL(t *testing.T, state, url string) {
	t.Helper()
	path := filepath.Join(state, "config.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var c map[string]any
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	c["nats_urls"] = []string{url}
	if b, err = json.Marshal(c); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// unusedPort is a loopback port nobody listens on (it was free a moment
// ago, and nothing in this test listens on it).
func unusedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return strconv.Itoa(port)
}

// fails runs the adapter and requires that it fail with exactly line on
// stderr, nothing on stdout, exit status 1, and no stack trace.
func (w *world) fails(state, line string, args ...string) {
	w.t.Helper()
	out, errOut, code := w.run(state, args...)
	if code != 1 || out != "" || errOut != line+"\n" {
		w.t.Errorf("mesh-adapter %v: exit %d, want 1\nstdout: %q\nstderr: %q\nwant:   %q", args, code, out, errOut, line+"\n")
	}
	if s := out + errOut; strings.Contains(s, "panic") || strings.Contains(s, "goroutine") {
		w.t.Errorf("mesh-adapter %v printed a stack trace:\n%s", args, s)
	}
}

// Issue 10 item 6: starting or sending when the mesh cannot be used is one
// line saying what happened and what to do, exit status 1, never a panic
// (the adapter used to dereference a nil adapter while undoing a failed
// start): the bus unreachable (a port nobody listens on), the agent
// retired (a stopped adapter starting or sending, and a running one
// sending), and meshd stopped (a stopped adapter starting or sending, and a
// running one sending).
func TestFailuresToStartOrSendAreOneLine(t *testing.T) {
	w := newWorld(t)
	a, r, x := w.state("a"), w.state("r"), w.state("x")
	pa, idA := w.start(a, "up", w.agentKey("alpha"))
	pa.stop()
	pr, _ := w.start(r, "up", w.agentKey("retiree"))
	_, idX := w.start(x, "up", w.agentKey("xeno"))
	idR, _ := identity(t, r)

	// The control plane unreachable, for a state directory with no agent
	// yet (it would lease a guest identity).
	control := "http://127.0.0.1:" + unusedPort(t)
	g := w.state("g")
	for _, args := range [][]string{{"start", "--inbox", "--name", "guest"}, {"send", idA, "hello", "--wait", "5"}} {
		w.fails(g, "mesh-adapter "+args[0]+": lease a guest credential: cannot reach the mesh's control plane at "+control+": is meshd running?",
			append([]string{"--control-url", control}, args...)...)
	}

	// The bus unreachable.
	saved := busURL(t, a)
	bus := "nats://127.0.0.1:" + unusedPort(t)
	setBusURL(t, a, bus)
	unreachable := "cannot reach the mesh at " + bus + ": is meshd running?"
	w.fails(a, "mesh-adapter start: "+unreachable, "start", "--inbox", "--name", "alpha")
	w.fails(a, "mesh-adapter send: "+unreachable, "send", idX, "hello", "--wait", "5")
	setBusURL(t, a, saved)

	// Retired, while its adapter runs: the broker closes the connection,
	// and a send through the running adapter says why.
	const reason = "sent spam to the whole roster"
	if err := w.m.Control().Credentials.RetireAgent(t.Context(), idR, reason); err != nil {
		t.Fatal(err)
	}
	retired := "this agent was retired: " + reason + "; to go on, redeem a new agent key with `mesh-adapter up` in another --state-dir"
	w.fails(r, "mesh-adapter send: "+retired, "send", idX, "hello", "--wait", "5")
	pr.stop()
	w.fails(r, "mesh-adapter start: "+retired, "start", "--inbox", "--name", "retiree")
	w.fails(r, "mesh-adapter send: "+retired, "send", idX, "hello", "--wait", "5")

	// meshd stopped after `up`: x's adapter still runs, a's does not.
	if err := w.m.Close(); err != nil {
		t.Fatal(err)
	}
	w.fails(x, "mesh-adapter send: cannot reach the mesh at "+busURL(t, x)+": is meshd running?", "send", idA, "hello", "--wait", "5")
	down := "cannot reach the mesh at " + saved + ": is meshd running?"
	w.fails(a, "mesh-adapter start: "+down, "start", "--inbox", "--name", "alpha")
	w.fails(a, "mesh-adapter send: "+down, "send", idX, "hello", "--wait", "5")
}
