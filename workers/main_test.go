package workers

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/mailbox"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/rooms"
)

const wait = 10 * time.Second

// credsFiles writes a worker's service credential, minted as the cloud
// mints it (MintServiceUser("worker-"+name)), and the services seed, both
// 0600, and returns their paths.
func credsFiles(t *testing.T, b *bustest.Bus, name string) (credsPath, keyPath string) {
	t.Helper()
	dir := t.TempDir()
	svc, err := b.Trust().MintServiceUser("worker-" + name)
	if err != nil {
		t.Fatal(err)
	}
	file, err := jwt.FormatUserConfig(svc.JWT, svc.Key.Seed())
	if err != nil {
		t.Fatal(err)
	}
	credsPath, keyPath = filepath.Join(dir, name+".creds"), filepath.Join(dir, "services.nk")
	if err := os.WriteFile(credsPath, file, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := b.ServicesKey().WriteSeedFile(keyPath); err != nil {
		t.Fatal(err)
	}
	return credsPath, keyPath
}

// healthAddr reads the worker's log until it says where /healthz answers.
func healthAddr(t *testing.T, logs io.Reader) string {
	t.Helper()
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(logs)
		for sc.Scan() {
			var line struct{ Message, Health string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Message == "worker running" {
				found <- line.Health
				break
			}
		}
		_, _ = io.Copy(io.Discard, logs)
	}()
	select {
	case addr := <-found:
		return addr
	case <-time.After(wait):
		t.Fatal("the worker never said it was running")
		return ""
	}
}

func healthz(addr string) (int, error) {
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// echo is a row whose worker answers mesh.test.echo.
var echo = Worker{Name: "echo", Description: "answers mesh.test.echo",
	Start: func(ctx context.Context, env bus.Env, _ Config) (Stopper, error) {
		s, err := bus.NewServiceIn(env, "echo", "test")
		if err != nil {
			return nil, err
		}
		return s, s.Endpoint("echo", "mesh.test.echo", func(context.Context, *bus.Request) (any, error) {
			return map[string]any{"status": "ok"}, nil
		})
	}}

// A worker main connects with its creds file, signs with the services key,
// answers on the bus, serves /healthz truthfully (503 once the bus is
// gone), and stops on cancel.
func TestRunServesAWorker(t *testing.T) {
	b := bustest.Start(t)
	credsPath, keyPath := credsFiles(t, b, "echo")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	logs, logw := io.Pipe()
	go func() {
		done <- Run(ctx, echo, []string{"--nats-url", b.ClientURL(), "--creds", credsPath, "--services-key", keyPath,
			"--health-addr", "127.0.0.1:0"}, func(string) string { return "" }, logw)
		logw.Close()
	}()
	addr := healthAddr(t, logs)

	client := bustest.Client(t, b)
	rep, err := bus.Call(ctx, client, bustest.Agent(t), "mesh.test.echo", protocol.TypeRequest, "", map[string]any{})
	if err != nil {
		t.Fatalf("the worker does not answer: %v", err)
	}
	if rep.From != b.ServicesKey().Public() {
		t.Errorf("answer signed by %s, not the services key", rep.From)
	}
	if code, err := healthz(addr); err != nil || code != http.StatusOK {
		t.Fatalf("healthz with the bus up: %d %v", code, err)
	}

	// The broker goes away: the worker's connection is down, and /healthz
	// says so.
	b.Kill()
	deadline := time.Now().Add(wait)
	for {
		code, err := healthz(addr)
		if err != nil {
			t.Fatal(err)
		}
		if code == http.StatusServiceUnavailable {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("healthz still %d with the broker gone", code)
		}
		time.Sleep(20 * time.Millisecond)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(wait):
		t.Fatal("Run did not return after cancel")
	}
}

func TestRunNeedsCredentials(t *testing.T) {
	if err := Run(t.Context(), echo, nil, func(string) string { return "" }, io.Discard); err == nil ||
		!strings.Contains(err.Error(), "--creds") {
		t.Fatalf("started without credentials: %v", err)
	}
}

// A binary runs its row's production configuration, changed by MESH_*
// variables, and by flags over those.
func TestParseStartsFromProduction(t *testing.T) {
	mb, err := Lookup("mailbox")
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"MESH_CREDS_FILE": "c", "MESH_SERVICES_KEY_FILE": "k", "MESH_LIMIT_MAILBOX_PER_AGENT": "10", "MESH_REPLICAS": "1"}
	_, cfg, err := parse(mb, nil, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := mailbox.DefaultLimits
	want.MaxMsgsPerAgent = 10
	if cfg.Replicas != 1 || cfg.Mailbox.Limits != want || cfg.Mailbox.SweepEvery != mailbox.DefaultSweepEvery {
		t.Fatalf("config %+v", cfg)
	}
	_, cfg, err = parse(mb, []string{"--replicas", "3", "--limit-mailbox-per-agent", "20"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Replicas != 3 || cfg.Mailbox.Limits.MaxMsgsPerAgent != 20 {
		t.Fatalf("flags did not win: %+v", cfg)
	}

	act, err := Lookup("activity")
	if err != nil {
		t.Fatal(err)
	}
	official := bustest.Agent(t).Public()
	_, cfg, err = parse(act, []string{"--catalog-official", " " + official + " ,"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Activity.Official) != 1 || cfg.Activity.Official[0] != official {
		t.Fatalf("official %q", cfg.Activity.Official)
	}
	for _, bad := range [][]string{{"--catalog-official", "not-an-agent"}, {"--replicas", "0"}, {"stray"}} {
		if _, _, err := parse(act, bad, func(k string) string { return env[k] }, io.Discard); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}

	// The rooms worker resolves room creators with the registrar it is
	// given; without one its Owners is unset (provision answers
	// UNAVAILABLE).
	rw, err := Lookup("rooms")
	if err != nil {
		t.Fatal(err)
	}
	if _, cfg, err = parse(rw, nil, func(k string) string { return env[k] }, io.Discard); err != nil || cfg.Rooms.Owners != nil ||
		cfg.Rooms.Limits != rooms.DefaultLimits {
		t.Fatalf("rooms without a registrar: %+v %v", cfg.Rooms, err)
	}
	renv := map[string]string{"MESH_CREDS_FILE": "c", "MESH_SERVICES_KEY_FILE": "k", "MESH_REGISTRAR_URL": "https://mesh.example.org"}
	if _, cfg, err = parse(rw, nil, func(k string) string { return renv[k] }, io.Discard); err != nil {
		t.Fatal(err)
	}
	if _, ok := cfg.Rooms.Owners.(*rooms.RegistrarOwners); !ok {
		t.Fatalf("rooms owners %T", cfg.Rooms.Owners)
	}
	if _, _, err := parse(rw, []string{"--registrar-url", "mesh.example.org"}, func(k string) string { return env[k] }, io.Discard); err == nil {
		t.Error("a registrar URL without a scheme accepted")
	}
}
