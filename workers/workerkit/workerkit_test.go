package workerkit

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/protocol"
)

// A worker main connects with its creds file, signs with the services key,
// answers on the bus, serves /healthz, and stops on cancel.
func TestRunServesAWorker(t *testing.T) {
	m := bustest.Start(t)
	dir := t.TempDir()
	svc, err := m.Trust().MintServiceUser("test-worker")
	if err != nil {
		t.Fatal(err)
	}
	credsFile, err := jwt.FormatUserConfig(svc.JWT, svc.Key.Seed())
	if err != nil {
		t.Fatal(err)
	}
	credsPath, keyPath := filepath.Join(dir, "worker.creds"), filepath.Join(dir, "services.nk")
	if err := os.WriteFile(credsPath, credsFile, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := m.ServicesKey().WriteSeedFile(keyPath); err != nil {
		t.Fatal(err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	var stderr bytes.Buffer
	go func() {
		done <- Run(ctx, "echo", []string{"--nats-url", m.ClientURL(), "--creds", credsPath, "--services-key", keyPath, "--health-addr", addr},
			func(string) string { return "" }, &stderr, func(ctx context.Context, env bus.Env) (Stopper, error) {
				s, err := bus.NewServiceIn(env, "echo", "test")
				if err != nil {
					return nil, err
				}
				return s, s.Endpoint("echo", "mesh.test.echo", func(context.Context, *bus.Request) (any, error) {
					return map[string]any{"status": "ok"}, nil
				})
			})
	}()
	client := bustest.Client(t, m)
	deadline := time.Now().Add(5 * time.Second)
	for {
		rep, err := bus.Call(ctx, client, bustest.Agent(t), "mesh.test.echo", protocol.TypeRequest, "", map[string]any{})
		if err == nil {
			if rep.From != m.ServicesKey().Public() {
				t.Errorf("answer signed by %s, not the services key", rep.From)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("worker never answered: %v\n%s", err, stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz: %v %v", err, resp)
	}
	resp.Body.Close()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

func TestRunNeedsCredentials(t *testing.T) {
	var stderr bytes.Buffer
	err := Run(t.Context(), "echo", nil, func(string) string { return "" }, &stderr, nil)
	if err == nil {
		t.Fatal("started without credentials")
	}
}
