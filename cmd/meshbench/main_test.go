package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/cmd/meshbench/internal/load"
	"agentmesh.dev/mesh/cmd/meshbench/internal/report"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
)

// rowsOf reads a JSON report and checks that every row ran the requests
// asked for; it returns the rows by name.
func rowsOf(t *testing.T, js []byte) (*report.Report, map[string]report.Row) {
	t.Helper()
	var rep report.Report
	if err := json.Unmarshal(js, &rep); err != nil {
		t.Fatalf("report: %v\n%s", err, js)
	}
	rows := map[string]report.Row{}
	for _, r := range rep.Rows {
		rows[r.Name] = r
	}
	return &rep, rows
}

func rowNamesOf(rep *report.Report) []string {
	var names []string
	for _, r := range rep.Rows {
		names = append(names, r.Name)
	}
	return names
}

// meshbench against a meshd of its own process (--in-process): every row,
// several responders over two nodes, every request answered.
func TestInProcess(t *testing.T) {
	var out, errOut bytes.Buffer
	err := run(t.Context(), []string{"--in-process", "--requests", "120", "--callers", "6", "--responders", "3",
		"--nodes", "2", "--size", "256", "--warmup", "0", "--json"}, &out, &errOut)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	rep, rows := rowsOf(t, out.Bytes())
	if got := rowNamesOf(rep); !slices.Equal(got, rowNames) {
		t.Errorf("rows %v, want %v", got, rowNames)
	}
	for name, r := range rows {
		if r.OK != 120 || r.Errors != 0 || r.ReqPerSec <= 0 || r.Latency.P50 <= 0 || r.Latency.Max < r.Latency.P99 {
			t.Errorf("%s: %+v", name, r)
		}
	}
	if len(rep.Ratios) != 3 {
		t.Errorf("ratios %+v", rep.Ratios)
	}
	if !strings.Contains(rep.Target, "(in-process)") || rep.Load.Responders != 3 || rep.Load.Size != 256 {
		t.Errorf("report header %+v", rep)
	}
	// Progress goes to stderr: the setup of each row and its summary.
	for _, want := range []string{"mesh: setting up 3 responders on 2 nodes", "http: 120 requests in"} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut.String())
		}
	}
}

// Failed requests are counted by their protocol error code, the other rows
// still run, and run returns an error naming them (exit status 1).
func TestFailuresByCode(t *testing.T) {
	var out, errOut bytes.Buffer
	report := filepath.Join(t.TempDir(), "report.json")
	// The mesh refuses sender text over 65,536 characters before sending
	// (pre-flight); the signed row carries it.
	err := run(t.Context(), []string{"--in-process", "--rows", "mesh,signed", "--requests", "10", "--callers", "2",
		"--size", "70000", "--warmup", "0", "--quiet", "--out", report}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "10 requests failed (mesh 10)") {
		t.Fatalf("err %v, want 10 failed", err)
	}
	if errOut.Len() != 0 {
		t.Errorf("--quiet wrote to stderr:\n%s", errOut.String())
	}
	js, rerr := os.ReadFile(report)
	if rerr != nil {
		t.Fatal(rerr)
	}
	_, rows := rowsOf(t, js)
	if m := rows["mesh"]; m.Errors != 10 || m.ErrorsByCode[string(errs.ContextTooLarge)] != 10 || m.OK != 0 {
		t.Errorf("mesh row %+v", m)
	}
	if s := rows["signed"]; s.OK != 10 || s.Errors != 0 {
		t.Errorf("signed row %+v", s)
	}
	if !strings.Contains(out.String(), "mesh  CONTEXT_TOO_LARGE  10") {
		t.Errorf("text report lacks the errors:\n%s", out.String())
	}
	if !slices.ContainsFunc(strings.Split(out.String(), "\n"), func(l string) bool {
		return slices.Equal(strings.Fields(l), []string{"mesh", "10", "10", "0", "-", "-", "-", "-"})
	}) {
		t.Errorf("text report lacks the mesh row with no latencies:\n%s", out.String())
	}
}

// Wrong command lines are refused with one line and the usage status.
func TestParse(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--callers", "0"}, "--callers, --responders and --nodes must be at least 1"},
		{[]string{"--responders", "-1"}, "must be at least 1"},
		{[]string{"--size", "-1"}, "--size must be from 0"},
		{[]string{"--requests", "-5"}, "--requests must not be negative"},
		{[]string{"--duration", "0"}, "--duration must be positive"},
		{[]string{"--timeout", "0"}, "--timeout must be positive"},
		{[]string{"--warmup", "-1s"}, "--warmup must not be negative"},
		{[]string{"--rows", "mesh,grpc"}, `unknown row "grpc"`},
		{[]string{"--rows", "raw,raw"}, `"raw" twice`},
		{[]string{"extra"}, "unexpected arguments: extra"},
		{[]string{"--nosuch"}, "flag provided but not defined"},
		{[]string{"--kill-after", "2s"}, "--kill-after needs --cluster"},
		{[]string{"--cluster", "--kill-after", "2s", "--requests", "100"}, "measures for --duration"},
		{[]string{"--cluster", "--kill-after", "5s", "--down-for", "5s", "--duration", "10s"}, "must be longer than --kill-after plus --down-for"},
		{[]string{"--cluster", "--kill-after", "2s", "--down-for", "0s"}, "must be positive"},
		{[]string{"--cluster", "--kill-after", "2s", "--rows", "mesh,http"}, "the http row does not use the bus"},
	} {
		var errOut bytes.Buffer
		_, err := parse(c.args, io.Discard, &errOut)
		if !errors.Is(err, errUsage) || !strings.Contains(errOut.String(), c.want) {
			t.Errorf("%v: err %v, stderr %q; want usage error with %q", c.args, err, errOut.String(), c.want)
		}
	}
	o, err := parse([]string{"--rows", " raw , mesh", "--requests", "5", "--duration", "0"}, io.Discard, io.Discard)
	if err != nil || !slices.Equal(o.rows, []string{"raw", "mesh"}) || o.requests != 5 {
		t.Errorf("parse: %+v %v", o, err)
	}
	// A failover measures the mesh row unless told otherwise.
	o, err = parse([]string{"--cluster", "--kill-after", "2s"}, io.Discard, io.Discard)
	if err != nil || !slices.Equal(o.rows, []string{"mesh"}) || !o.cluster || o.killAfter != 2*time.Second || o.downFor != 3*time.Second {
		t.Errorf("parse --kill-after: %+v %v", o, err)
	}
	var help bytes.Buffer
	if _, err := parse([]string{"--help"}, &help, io.Discard); !errors.Is(err, flag.ErrHelp) || !strings.Contains(help.String(), "Usage: meshbench") || !strings.Contains(help.String(), "-rows") {
		t.Errorf("--help: %v %q", err, help.String())
	}
}

// Failures are named by their protocol code when they have one, else by
// kind.
func TestClassify(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	for _, c := range []struct {
		err  error
		want load.Failure
	}{
		{errs.New(errs.TransportTimeout, "no answer"), load.Failure{Code: "TRANSPORT_TIMEOUT"}},
		{fmt.Errorf("wrapped: %w", errs.New(errs.AgentOverloaded, "busy")), load.Failure{Code: "AGENT_OVERLOADED"}},
		{errs.New("SOMETHING_NEW", "a code from a newer peer"), load.Failure{Code: "SOMETHING_NEW"}},
		{nats.ErrTimeout, load.Failure{Kind: "timeout"}},
		{context.DeadlineExceeded, load.Failure{Kind: "timeout"}},
		{nats.ErrNoResponders, load.Failure{Kind: "no_responders"}},
		{nats.ErrConnectionClosed, load.Failure{Kind: "connection_closed"}},
		{nats.ErrMaxPayload, load.Failure{Kind: "max_payload"}},
		{fmt.Errorf("%w: publish", nats.ErrPermissionViolation), load.Failure{Kind: "permission_denied"}},
		{fmt.Errorf("Post: %w", refused), load.Failure{Kind: "connection_refused"}},
		{io.ErrUnexpectedEOF, load.Failure{Kind: "connection_reset"}},
		{&rowError{kind: "http_503", msg: "HTTP 503"}, load.Failure{Kind: "http_503"}},
		{errors.New("something else"), load.Failure{Kind: "other"}},
	} {
		if got := classify(c.err); got != c.want {
			t.Errorf("classify(%v) = %+v, want %+v", c.err, got, c.want)
		}
	}
}

// --cluster --kill-after: the mesh on three servers, one killed during the
// measured run and restarted. The report has the three phases, requests
// answered before and after, acknowledged writes all read back, and no
// request handled twice.
func TestClusterFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a three-server cluster under load")
	}
	var out, errOut bytes.Buffer
	err := run(t.Context(), []string{"--cluster", "--kill-after", "2s", "--down-for", "2s", "--duration", "7s",
		"--callers", "8", "--warmup", "500ms", "--json"}, &out, &errOut)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	rep, rows := rowsOf(t, out.Bytes())
	if got := rowNamesOf(rep); !slices.Equal(got, []string{"mesh"}) || !strings.Contains(rep.Target, "(in-process cluster of 3)") {
		t.Fatalf("rows %v, target %q", got, rep.Target)
	}
	f := rows["mesh"].Failover
	if f == nil || len(f.Phases) != 3 || f.Server == "" {
		t.Fatalf("failover %+v", f)
	}
	for i, name := range []string{"before", "during", "after"} {
		if f.Phases[i].Name != name || f.Phases[i].Elapsed <= 0 {
			t.Errorf("phase %d: %+v", i, f.Phases[i])
		}
	}
	if f.Phases[0].OK == 0 || f.Phases[2].OK == 0 {
		t.Errorf("nothing answered before or after the failover: %+v", f.Phases)
	}
	if f.Writes.Acked == 0 || f.Writes.Lost != 0 || f.HandledTwice != 0 || f.AnsweredUnhandled != 0 || f.Lost() != 0 {
		t.Errorf("failover lost something: %+v", f)
	}
	for _, want := range []string{"killed meshd-", "restarted meshd-", "replicas current again"} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut.String())
		}
	}
	// The text report has the failover section.
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"failover (mesh row): meshd-", "before", "during", "after", "lost acknowledged messages: 0"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, text.String())
		}
	}
}

// Without a running meshd the tool says so.
func TestNoMeshd(t *testing.T) {
	var out, errOut bytes.Buffer
	err := run(t.Context(), []string{"--data-dir", t.TempDir()}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "is meshd running") {
		t.Errorf("no meshd: %v", err)
	}
}

// meshbench and meshd as two processes, as a user runs them: meshd on
// random ports with a fresh data directory, meshbench reading it. Every row
// is in the report, text on stdout and JSON in --out, with no errors; a
// run whose requests fail exits with status 1 and says why.
func TestAgainstSeparateMeshd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds meshd and meshbench")
	}
	bin := t.TempDir()
	for _, cmd := range []string{"meshd", "meshbench"} {
		out, err := exec.Command("go", "build", "-o", filepath.Join(bin, cmd), "agentmesh.dev/mesh/cmd/"+cmd).CombinedOutput()
		if err != nil {
			t.Fatalf("build %s: %v\n%s", cmd, err, out)
		}
	}
	data := t.TempDir()
	var meshdOut bytes.Buffer
	meshd := exec.Command(filepath.Join(bin, "meshd"), "--data-dir", data, "--http-addr", "127.0.0.1:0",
		"--nats-addr", "127.0.0.1:0", "--ws-addr", "127.0.0.1:0", "--log-level", "warn")
	meshd.Stdout, meshd.Stderr = &meshdOut, &meshdOut
	if err := meshd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- meshd.Wait() }()
	t.Cleanup(func() {
		_ = meshd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = meshd.Process.Kill()
			<-exited
		}
	})
	// meshd writes meshd.json once the mesh is ready.
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(data, "meshd.json")); err == nil {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("meshd exited: %v\n%s", err, meshdOut.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("meshd did not write meshd.json\n%s", meshdOut.String())
		}
	}

	meshbench := func(args ...string) (stdout, stderr string, code int) {
		var o, e bytes.Buffer
		cmd := exec.Command(filepath.Join(bin, "meshbench"), append([]string{"--data-dir", data}, args...)...)
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		var exit *exec.ExitError
		switch {
		case errors.As(err, &exit):
			code = exit.ExitCode()
		case err != nil:
			t.Fatal(err)
		}
		return o.String(), e.String(), code
	}

	reportPath := filepath.Join(t.TempDir(), "report.json")
	stdout, stderr, code := meshbench("--requests", "200", "--callers", "8", "--warmup", "0", "--out", reportPath)
	if code != 0 {
		t.Fatalf("meshbench exited %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	js, err := os.ReadFile(reportPath)
	if err != nil {
		t.Fatal(err)
	}
	rep, rows := rowsOf(t, js)
	if got := rowNamesOf(rep); !slices.Equal(got, rowNames) {
		t.Errorf("rows %v, want %v", got, rowNames)
	}
	for name, r := range rows {
		if r.OK != 200 || r.Errors != 0 || r.ReqPerSec <= 0 {
			t.Errorf("%s: %+v", name, r)
		}
	}
	if strings.Contains(rep.Target, "in-process") || !strings.HasPrefix(rep.Target, "nats://127.0.0.1:") {
		t.Errorf("target %q", rep.Target)
	}
	for _, want := range []string{"no errors", "ratios to signed", "\nmesh ", "\nsigned ", "\nraw ", "\nhttp "} {
		if !strings.Contains(stdout, want) {
			t.Errorf("text report lacks %q:\n%s", want, stdout)
		}
	}

	stdout, stderr, code = meshbench("--rows", "mesh", "--requests", "5", "--callers", "1", "--size", "70000", "--warmup", "0", "--quiet", "--json")
	if code != 1 || !strings.Contains(stderr, "meshbench: 5 requests failed (mesh 5); the report lists them by code") {
		t.Errorf("failing run: exit %d\nstderr:\n%s", code, stderr)
	}
	if _, rows := rowsOf(t, []byte(stdout)); rows["mesh"].ErrorsByCode[string(errs.ContextTooLarge)] != 5 {
		t.Errorf("failing run's report:\n%s", stdout)
	}
}

// The signed and HTTP rows really verify both ways: a request or an answer
// whose signature does not verify fails with the mesh's code for it.
func TestSignedRowsVerify(t *testing.T) {
	ck, _ := keys.Generate[keys.AgentRole]()
	rk, _ := keys.Generate[keys.AgentRole]()
	req, data, err := signedRequest(requestPayload(16), ck, rk.Public())
	if err != nil {
		t.Fatal(err)
	}
	if err := checkSignedAnswer(signedAnswer(data, rk), req, rk.Public()); err != nil {
		t.Fatalf("a good exchange: %v", err)
	}
	tamper := func(b []byte) []byte {
		return bytes.Replace(b, []byte(`"text":"ok"`), []byte(`"text":"OK"`), 1)
	}
	// A forged request is answered with its refusal.
	forged := bytes.Replace(data, []byte(`"xxxx`), []byte(`"yyyy`), 1)
	if err := checkSignedAnswer(signedAnswer(forged, rk), req, rk.Public()); classify(err) != (load.Failure{Code: string(errs.IdentityMismatch)}) {
		t.Errorf("forged request: %v", err)
	}
	// A forged answer is refused by the caller.
	if err := checkSignedAnswer(tamper(signedAnswer(data, rk)), req, rk.Public()); classify(err) != (load.Failure{Code: string(errs.IdentityMismatch)}) {
		t.Errorf("forged answer: %v", err)
	}
	// Another responder's answer, or one to another request, is not this one's.
	other, _ := keys.Generate[keys.AgentRole]()
	if err := checkSignedAnswer(signedAnswer(data, other), req, rk.Public()); classify(err) != (load.Failure{Kind: "bad_answer"}) {
		t.Errorf("answer from another key: %v", err)
	}
	req2, _, _ := signedRequest(requestPayload(16), ck, rk.Public())
	if err := checkSignedAnswer(signedAnswer(data, rk), req2, rk.Public()); classify(err) != (load.Failure{Kind: "bad_answer"}) {
		t.Errorf("answer to another request: %v", err)
	}
}
