package workers

import (
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/cloudsecrets"
	"agentmesh.dev/mesh/shared/cloudsecrets/secretfake"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/rooms"
)

// The rooms worker's binary reads the trust chain from Secret Manager or
// from --trust-dir, and its Credentials mint room credentials the broker
// accepts and revoke them at the broker over a system-account connection
// of its own (creds.Revoker): the revoked connection closes. No other
// worker reads the trust chain.
func TestRoomCredentialsFromTheTrustChain(t *testing.T) {
	row := Worker{Name: rooms.Name}
	log := slog.New(slog.DiscardHandler)

	t.Run("no trust chain", func(t *testing.T) {
		_, err := roomCredentials(t.Context(), row, Options{NATSURL: "nats://127.0.0.1:1"}, &Config{}, log)
		if err == nil || !strings.Contains(err.Error(), "--trust-dir") {
			t.Fatalf("started without the trust chain: %v", err)
		}
	})
	t.Run("other workers", func(t *testing.T) {
		var cfg Config
		stop, err := roomCredentials(t.Context(), Worker{Name: "feeds"}, Options{}, &cfg, log)
		if err != nil || cfg.Rooms.Credentials != nil {
			t.Fatalf("the feeds worker got room credentials: %v", err)
		}
		stop()
	})
	t.Run("files", func(t *testing.T) {
		b := bustest.Start(t)
		dir := filepath.Join(t.TempDir(), "keys")
		if err := b.Trust().Save(dir); err != nil {
			t.Fatal(err)
		}
		revokesAtTheBroker(t, b, row, Options{NATSURL: b.ClientURL(), TrustDir: dir})
	})
	t.Run("secret manager", func(t *testing.T) {
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
		if _, err := cloudsecrets.Init(t.Context(), sm, cloudsecrets.InitOptions{Project: "mesh-p", Workers: []string{rooms.Name}, CreateMissing: true}); err != nil {
			t.Fatal(err)
		}
		ks, err := cloudsecrets.Load(t.Context(), sm, "mesh-p")
		if err != nil {
			t.Fatal(err)
		}
		b := bustest.StartWith(t, ks.Trust, ks.Services)
		revokesAtTheBroker(t, b, row, Options{NATSURL: b.ClientURL(), SecretsProject: "mesh-p", secretManagerHost: fake.Addr})
	})
}

func revokesAtTheBroker(t *testing.T, b *bustest.Bus, row Worker, o Options) {
	t.Helper()
	var cfg Config
	stop, err := roomCredentials(t.Context(), row, o, &cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	rc := cfg.Rooms.Credentials
	if rc == nil {
		t.Fatal("no Credentials for the rooms worker")
	}
	cred, err := rc.MintRoom("room-1", bustest.Agent(t).Public(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	key, err := keys.FromSeed[keys.CredentialRole]([]byte(cred.Seed))
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan struct{})
	nc, err := nats.Connect(b.ClientURL(), nats.UserJWT(func() (string, error) { return cred.JWT, nil }, key.SignNonce),
		nats.CustomInboxPrefix(protocol.ACLRoomInboxPrefix("room-1")), nats.NoReconnect(),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}), // the revocation, expected
		nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	if err != nil {
		t.Fatalf("the broker refuses the room credential: %v", err)
	}
	defer nc.Close()
	if _, err := nc.SubscribeSync(protocol.ACLRoomSubject("room-1", "main")); err != nil || nc.Flush() != nil {
		t.Fatalf("subscribe the room: %v", err)
	}
	start := time.Now()
	if err := rc.Revoke(t.Context(), []string{cred.UserKey}, cred.Expires); err != nil {
		t.Fatal(err)
	}
	select {
	case <-closed:
		// creds.Revoker pushes in a later second than the JWT it replaces,
		// so this takes up to a second.
		t.Logf("the room connection closed %s after the revocation was asked for", time.Since(start).Round(time.Millisecond))
	case <-time.After(wait):
		t.Fatalf("the revoked room connection is open %s later", wait)
	}
}

// --trust-dir is a flag of the rooms worker's binary only.
func TestTrustDirIsTheRoomsWorkers(t *testing.T) {
	env := func(k string) string {
		return map[string]string{"MESH_CREDS_FILE": "c", "MESH_SERVICES_KEY_FILE": "k", "MESH_TRUST_DIR": "/from/env"}[k]
	}
	o, _, err := parse(Worker{Name: rooms.Name}, nil, env, io.Discard)
	if err != nil || o.TrustDir != "/from/env" {
		t.Fatalf("rooms: %q %v", o.TrustDir, err)
	}
	o, _, err = parse(Worker{Name: rooms.Name}, []string{"--trust-dir", "/keys"}, env, io.Discard)
	if err != nil || o.TrustDir != "/keys" {
		t.Fatalf("rooms --trust-dir: %q %v", o.TrustDir, err)
	}
	if _, _, err := parse(Worker{Name: "feeds"}, []string{"--trust-dir", "/keys"}, env, io.Discard); err == nil {
		t.Fatal("the feeds worker takes --trust-dir")
	}
	if o, _, _ := parse(Worker{Name: "feeds"}, nil, env, io.Discard); o.TrustDir != "" {
		t.Fatalf("the feeds worker read MESH_TRUST_DIR: %q", o.TrustDir)
	}
}
