package broker_test

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/broker"
	"agentmesh.dev/mesh/shared/creds"
)

func start(t *testing.T, dir string, trust *creds.Trust) *broker.Broker {
	t.Helper()
	b, err := broker.Start(t.Context(), broker.Config{DataDir: dir, Trust: trust, Name: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Shutdown)
	return b
}

// The broker serves the mesh account with JetStream over TCP to a minted
// credential, in-process to its own connections, and revokes a key at once
// and for good: the revocation survives a restart on the same directory.
func TestServesAndRevokesAcrossRestart(t *testing.T) {
	trust, err := creds.Generate()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	b := start(t, dir, trust)
	if !b.Healthy() {
		t.Fatal("a started broker is not healthy")
	}
	if !strings.HasPrefix(b.ClientURL(), "nats://127.0.0.1:") || !strings.HasPrefix(b.WebSocketURL(), "ws://127.0.0.1:") {
		t.Fatalf("urls %q %q", b.ClientURL(), b.WebSocketURL())
	}
	svc, err := b.ConnectService("svc")
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	js, err := jetstream.New(svc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.AccountInfo(t.Context()); err != nil {
		t.Fatalf("mesh account has no JetStream: %v", err)
	}

	user, err := trust.MintServiceUser("worker-test")
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	nc, err := nats.Connect(b.ClientURL(), user.NATSOption(), nats.NoReconnect(), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}),
		nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	if err != nil {
		t.Fatalf("minted credential refused over TCP: %v", err)
	}
	defer nc.Close()
	if err := b.UpdateMeshAccount(t.Context(), func(ac *jwt.AccountClaims) error {
		return creds.RevokeCredentials(ac, time.Now(), user.Key.Public())
	}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the revoked credential's connection stayed open")
	}

	b.Shutdown()
	b = start(t, dir, trust)
	if nc, err := nats.Connect(b.ClientURL(), user.NATSOption(), nats.NoReconnect()); err == nil {
		nc.Close()
		t.Fatal("a credential revoked before the restart connects after it")
	}

	b.Kill()
	if b.Healthy() {
		t.Fatal("a killed broker reports healthy")
	}
}

// A listener that cannot bind is Start's error, not a wait for the timeout.
func TestBusyPortIsAnError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	trust, err := creds.Generate()
	if err != nil {
		t.Fatal(err)
	}
	b, err := broker.Start(t.Context(), broker.Config{DataDir: t.TempDir(), Trust: trust, NATSAddr: ln.Addr().String(), ReadyTimeout: time.Minute})
	if err == nil {
		b.Shutdown()
		t.Fatal("started on a busy port")
	}
}

func TestNeedsTrustAndDir(t *testing.T) {
	if _, err := broker.Start(t.Context(), broker.Config{DataDir: t.TempDir()}); err == nil {
		t.Fatal("started without a trust chain")
	}
}
