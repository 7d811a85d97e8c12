package workers_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/cloudsecrets"
	"agentmesh.dev/mesh/shared/cloudsecrets/secretfake"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/workers"
)

const binWait = 15 * time.Second

// calls are one cheap signed request per worker whose subjects answer a
// request with no state behind it; every worker is also pinged.
var calls = map[string]struct {
	subject string
	typ     protocol.Type
	payload func(t *testing.T) any
}{
	"registry": {protocol.SubjDiscover, protocol.TypeDiscover, func(*testing.T) any { return map[string]any{} }},
	"presence": {protocol.SubjPresenceGet, protocol.TypeRequest, func(*testing.T) any { return map[string]any{} }},
	"feeds": {protocol.SubjFeedGet, protocol.TypeRequest, func(t *testing.T) any {
		return map[string]any{"agent": bustest.Agent(t).Public(), "topic": "log"}
	}},
	"activity": {protocol.SubjCatalogList, protocol.TypeRequest, func(*testing.T) any { return map[string]any{} }},
}

// Every worker binary builds, starts against an in-process broker with the
// credential the cloud mints for it, answers GET /healthz with 200, serves
// its micro service and its subjects on the bus, and exits 0 on SIGTERM.
// Its keys come the cloud's way: `meshd cloud init` (cloudsecrets.Init)
// writes the trust chain, the services seed and one credential per worker
// (MintServiceUser("worker-<name>")) to Secret Manager — here the real
// client against an in-process fake — the broker trusts that chain, and
// the binary reads its credential and the services key from there at
// start. One more run reads them from 0600 files instead.
func TestWorkerBinaries(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every worker binary")
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	bin := t.TempDir()
	build := exec.Command(goTool, "build", "-o", bin+string(filepath.Separator), "./cmd/...")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./workers/cmd/...: %v\n%s", err, out)
	}
	var built, want []string
	entries, err := os.ReadDir(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		built = append(built, e.Name())
	}
	table := workers.Table()
	for _, w := range table {
		want = append(want, w.Name+"-worker")
	}
	slices.Sort(want)
	if !slices.Equal(built, want) {
		t.Fatalf("binaries %q, want one per row of the table: %q", built, want)
	}

	fake, err := secretfake.Start(cloudsecrets.EmulatorToken)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	sm, err := fake.NewClient(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer sm.Close()
	var names []string
	for _, w := range table {
		names = append(names, w.Name)
	}
	if _, err := cloudsecrets.Init(t.Context(), sm, cloudsecrets.InitOptions{Project: "mesh-p", Workers: names, CreateMissing: true}); err != nil {
		t.Fatal(err)
	}
	ks, err := cloudsecrets.Load(t.Context(), sm, "mesh-p")
	if err != nil {
		t.Fatal(err)
	}
	b := bustest.StartWith(t, ks.Trust, ks.Services)
	client := bustest.Client(t, b)
	fromSecrets := []string{"MESH_SECRETS_PROJECT=mesh-p", "MESH_SECRETMANAGER_EMULATOR_HOST=" + fake.Addr}
	for _, w := range table {
		t.Run(w.Name, func(t *testing.T) {
			p := startBinary(t, filepath.Join(bin, w.Name+"-worker"), b, w.Name, fromSecrets)
			if code, err := get(p.health); err != nil || code != http.StatusOK {
				t.Fatalf("GET /healthz: %d %v\n%s", code, err, p.logs())
			}
			ping(t, client, w.Name)
			if c, ok := calls[w.Name]; ok {
				ctx, cancel := context.WithTimeout(t.Context(), binWait)
				defer cancel()
				rep, err := bus.Call(ctx, client, bustest.Agent(t), c.subject, c.typ, "", c.payload(t))
				if err != nil {
					t.Fatalf("%s: %v\n%s", c.subject, err, p.logs())
				}
				if rep.From != b.ServicesKey().Public() {
					t.Fatalf("%s answered by %s, not the services key", c.subject, rep.From)
				}
			}
			p.stop(t)
		})
	}
	// The same binary with its keys in files (a deployment that mounts
	// them, or a worker run by hand).
	t.Run("files", func(t *testing.T) {
		keyPath := filepath.Join(t.TempDir(), "services.nk")
		if err := b.ServicesKey().WriteSeedFile(keyPath); err != nil {
			t.Fatal(err)
		}
		p := startBinary(t, filepath.Join(bin, "registry-worker"), b, "registry", []string{"MESH_SERVICES_KEY_FILE=" + keyPath,
			"MESH_CREDS_FILE=" + credsFile(t, b, "registry")})
		if code, err := get(p.health); err != nil || code != http.StatusOK {
			t.Fatalf("GET /healthz: %d %v\n%s", code, err, p.logs())
		}
		ping(t, client, "registry")
		p.stop(t)
	})
}

// ping asks the worker's micro service for its name and endpoints.
func ping(t *testing.T, nc *nats.Conn, name string) {
	t.Helper()
	msg, err := nc.Request("$SRV.INFO.mesh-"+name, nil, binWait)
	if err != nil {
		t.Fatalf("$SRV.INFO.mesh-%s: %v", name, err)
	}
	var info micro.Info
	if err := json.Unmarshal(msg.Data, &info); err != nil || info.Name != "mesh-"+name || len(info.Endpoints) == 0 {
		t.Fatalf("$SRV.INFO.mesh-%s answered %s (%v)", name, msg.Data, err)
	}
	for _, ep := range info.Endpoints {
		if ep.QueueGroup != bus.QueueGroup(name) {
			t.Errorf("endpoint %s in queue group %q, want %q", ep.Name, ep.QueueGroup, bus.QueueGroup(name))
		}
	}
}

type process struct {
	cmd    *exec.Cmd
	health string
	done   chan struct{} // closed once the process has exited
	err    error         // cmd.Wait's, once done is closed

	mu  sync.Mutex
	log strings.Builder
}

func (p *process) logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// startBinary runs path as Cloud Run would: configured by the environment,
// with its own credential file, and its health port on a random loopback
// port (read back from its "worker running" line).
func startBinary(t *testing.T, path string, b *bustest.Bus, name string, keysEnv []string) *process {
	t.Helper()
	cmd := exec.Command(path, "--health-addr", "127.0.0.1:0")
	cmd.Env = append([]string{
		"MESH_NATS_URL=" + b.ClientURL(),
		"MESH_REPLICAS=1", // one server here; the cloud's cluster runs the table's 3
	}, keysEnv...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	running := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.mu.Lock()
			p.log.Write(sc.Bytes())
			p.log.WriteByte('\n')
			p.mu.Unlock()
			var line struct{ Message, Health string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Message == "worker running" {
				running <- line.Health
			}
		}
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	select {
	case p.health = <-running:
	case <-p.done:
		t.Fatalf("%s exited before running: %v\n%s", name, p.err, p.logs())
	case <-time.After(binWait):
		t.Fatalf("%s not running\n%s", name, p.logs())
	}
	if !strings.HasPrefix(p.health, "127.0.0.1:") {
		t.Fatalf("health address %q", p.health)
	}
	return p
}

// stop sends SIGTERM and expects a clean exit.
func (p *process) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
		if p.err != nil {
			t.Fatalf("exit after SIGTERM: %v\n%s", p.err, p.logs())
		}
	case <-time.After(binWait):
		t.Fatalf("no exit after SIGTERM\n%s", p.logs())
	}
	if !strings.Contains(p.logs(), `"message":"worker stopped"`) {
		t.Fatalf("no clean stop in the log:\n%s", p.logs())
	}
}

func get(addr string) (int, error) {
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// credsFile writes the credential the cloud mints for a worker as a 0600
// creds file.
func credsFile(t *testing.T, b *bustest.Bus, name string) string {
	t.Helper()
	svc, err := b.Trust().MintServiceUser("worker-" + name)
	if err != nil {
		t.Fatal(err)
	}
	file, err := jwt.FormatUserConfig(svc.JWT, svc.Key.Seed())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), name+".creds")
	if err := os.WriteFile(path, file, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
