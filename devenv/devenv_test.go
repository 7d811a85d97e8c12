package devenv

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/keys"
)

// asyncWait bounds every wait for something the broker does asynchronously.
// Silence until then is a failure, never a pass.
const asyncWait = 5 * time.Second

// startMesh boots a mesh on random loopback ports in dir and stops it when the test ends.
func startMesh(t *testing.T, dir string) *Mesh {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	m, err := Start(ctx, Config{
		DataDir:  dir,
		HTTPAddr: "127.0.0.1:0",
		NATSAddr: "127.0.0.1:0",
		WSAddr:   "127.0.0.1:0",
		Logger:   slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return m
}

// newUser mints a mesh-account user with perms for a fresh key.
func newUser(t *testing.T, m *Mesh, perms creds.Permissions) creds.UserCreds {
	t.Helper()
	key, err := keys.Generate[keys.CredentialRole]()
	if err != nil {
		t.Fatal(err)
	}
	userJWT, err := m.Trust().MintUser(creds.UserSpec{
		PublicKey:   key.Public(),
		Name:        t.Name(),
		Kind:        creds.KindService,
		Permissions: perms,
		Expires:     time.Now().Add(time.Hour),
	})
	if err != nil {
		t.Fatalf("MintUser: %v", err)
	}
	return creds.UserCreds{JWT: userJWT, Key: key}
}

// dial connects over the real TCP (or WebSocket) listener, never reconnecting,
// so a refused or closed connection stays visible to the test.
func dial(url string, opts ...nats.Option) (*nats.Conn, error) {
	return nats.Connect(url, append([]nats.Option{nats.NoReconnect(), nats.Timeout(asyncWait)}, opts...)...)
}

func TestUnauthenticatedConnectionsAreRefused(t *testing.T) {
	m := startMesh(t, t.TempDir())
	urls := m.URLs()

	// A JWT from a different operator is well-formed but not trusted.
	stranger, err := creds.Generate()
	if err != nil {
		t.Fatal(err)
	}
	strangerKey, err := keys.Generate[keys.CredentialRole]()
	if err != nil {
		t.Fatal(err)
	}
	strangerJWT, err := stranger.MintUser(creds.UserSpec{
		PublicKey:   strangerKey.Public(),
		Kind:        creds.KindService,
		Permissions: creds.Permissions{PubAllow: []string{">"}, SubAllow: []string{">"}},
	})
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		url  string
		opts []nats.Option
	}{
		{"anonymous over tcp", urls.MeshTCP, nil},
		{"anonymous over websocket", urls.MeshWS, nil},
		{"user and password over tcp", urls.MeshTCP, []nats.Option{nats.UserInfo("admin", "admin")}},
		{"jwt of another operator", urls.MeshTCP, []nats.Option{creds.UserCreds{JWT: strangerJWT, Key: strangerKey}.NATSOption()}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			expectRefused(t, tc.url, tc.opts...)
		})
	}
}

// expectRefused asserts that the broker refuses the connection with an
// authorization violation. Over WebSocket the client sometimes loses the race
// between reading the broker's -ERR and writing its PING into the closed
// socket, and reports the broken pipe instead; so each attempt must fail, and
// one of a few attempts must show the authorization error itself.
func expectRefused(t *testing.T, url string, opts ...nats.Option) {
	t.Helper()
	var last error
	for range 10 {
		nc, err := dial(url, opts...)
		if err == nil {
			nc.Close()
			t.Fatal("connection accepted, want authorization violation")
		}
		if errors.Is(err, nats.ErrAuthorization) {
			return
		}
		last = err
	}
	t.Fatalf("err = %v, want %v", last, nats.ErrAuthorization)
}

func TestMeshUserCanPubSub(t *testing.T) {
	m := startMesh(t, t.TempDir())
	u := newUser(t, m, creds.Permissions{
		PubAllow: []string{"demo.>"},
		SubAllow: []string{"demo.>"},
	})

	for _, url := range []string{m.URLs().MeshTCP, m.URLs().MeshWS} {
		t.Run(strings.SplitN(url, ":", 2)[0], func(t *testing.T) {
			nc, err := dial(url, u.NATSOption())
			if err != nil {
				t.Fatalf("connect: %v", err)
			}
			defer nc.Close()
			sub, err := nc.SubscribeSync("demo.greeting")
			if err != nil {
				t.Fatal(err)
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			if err := nc.Publish("demo.greeting", []byte("hello")); err != nil {
				t.Fatal(err)
			}
			msg, err := sub.NextMsg(asyncWait)
			if err != nil {
				t.Fatalf("no message: %v", err)
			}
			if string(msg.Data) != "hello" {
				t.Fatalf("got %q, want %q", msg.Data, "hello")
			}
		})
	}
}

func TestBrokerEnforcesUserPermissions(t *testing.T) {
	m := startMesh(t, t.TempDir())

	tests := []struct {
		name  string
		perms creds.Permissions
		// act does the forbidden thing; the refusal arrives asynchronously.
		act func(nc *nats.Conn) error
	}{
		{
			name:  "publish outside allow list",
			perms: creds.Permissions{PubAllow: []string{"demo.>"}, SubAllow: []string{"_INBOX.>"}},
			act:   func(nc *nats.Conn) error { return nc.Publish("other.subject", []byte("x")) },
		},
		{
			name:  "publish to denied subject",
			perms: creds.Permissions{PubAllow: []string{">"}, PubDeny: []string{"secret.>"}, SubAllow: []string{"_INBOX.>"}},
			act:   func(nc *nats.Conn) error { return nc.Publish("secret.plans", []byte("x")) },
		},
		{
			name:  "subscribe outside allow list",
			perms: creds.Permissions{PubAllow: []string{"demo.>"}, SubAllow: []string{"demo.>"}},
			act: func(nc *nats.Conn) error {
				_, err := nc.SubscribeSync("other.>")
				return err
			},
		},
		{
			name:  "subscribe to denied subject",
			perms: creds.Permissions{PubAllow: []string{"demo.>"}, SubAllow: []string{">"}, SubDeny: []string{"secret.>"}},
			act: func(nc *nats.Conn) error {
				_, err := nc.SubscribeSync("secret.plans")
				return err
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u := newUser(t, m, tc.perms)
			asyncErr := make(chan error, 4)
			nc, err := dial(m.URLs().MeshTCP, u.NATSOption(),
				nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
					asyncErr <- err
				}))
			if err != nil {
				t.Fatalf("connect: %v", err)
			}
			defer nc.Close()

			if err := tc.act(nc); err != nil {
				t.Fatalf("client-side error, want the broker to refuse: %v", err)
			}
			select {
			case err := <-asyncErr:
				if !errors.Is(err, nats.ErrPermissionViolation) {
					t.Fatalf("async error = %v, want %v", err, nats.ErrPermissionViolation)
				}
			case <-time.After(asyncWait):
				t.Fatal("no permissions violation reported by the broker")
			}
		})
	}
}

func TestRevocationDisconnectsWithoutRestart(t *testing.T) {
	m := startMesh(t, t.TempDir())
	u := newUser(t, m, creds.Permissions{PubAllow: []string{"demo.>"}, SubAllow: []string{"demo.>"}})
	bystander := newUser(t, m, creds.Permissions{PubAllow: []string{"demo.>"}, SubAllow: []string{"demo.>"}})

	closed := make(chan struct{})
	asyncErr := make(chan error, 4)
	nc, err := dial(m.URLs().MeshTCP, u.NATSOption(),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { asyncErr <- err }),
		nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer nc.Close()
	other, err := dial(m.URLs().MeshTCP, bystander.NATSOption())
	if err != nil {
		t.Fatalf("connect bystander: %v", err)
	}
	defer other.Close()

	ctx, cancel := context.WithTimeout(t.Context(), asyncWait)
	defer cancel()
	err = m.UpdateMeshAccount(ctx, func(ac *jwt.AccountClaims) error {
		ac.Revoke(u.Key.Public())
		return nil
	})
	if err != nil {
		t.Fatalf("UpdateMeshAccount: %v", err)
	}

	select {
	case err := <-asyncErr:
		if !errors.Is(err, nats.ErrAuthRevoked) {
			t.Fatalf("async error = %v, want %v", err, nats.ErrAuthRevoked)
		}
	case <-time.After(asyncWait):
		t.Fatal("no revocation error from the broker")
	}
	select {
	case <-closed:
	case <-time.After(asyncWait):
		t.Fatal("revoked connection still open")
	}
	// The broker kept running and other users were not touched.
	if !other.IsConnected() {
		t.Fatal("bystander connection was dropped")
	}
	if err := other.Flush(); err != nil {
		t.Fatalf("bystander flush: %v", err)
	}
	// The same JWT cannot come back.
	if nc2, err := dial(m.URLs().MeshTCP, u.NATSOption()); err == nil {
		nc2.Close()
		t.Fatal("revoked credential connected again")
	}
}

func TestRestartKeepsKeysStateAndRevocations(t *testing.T) {
	dir := t.TempDir()
	ctx := t.Context()

	first := startMesh(t, dir)
	keysBefore := first.Trust().PublicKeys()
	revoked := newUser(t, first, creds.Permissions{PubAllow: []string{"demo.>"}, SubAllow: []string{"demo.>"}})

	nc, err := first.ConnectService("test-writer")
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:     "EVENTS",
		Subjects: []string{"events.>"},
		Storage:  jetstream.FileStorage,
	}); err != nil {
		t.Fatalf("create stream: %v", err)
	}
	if _, err := js.Publish(ctx, "events.one", []byte("first event")); err != nil {
		t.Fatalf("publish: %v", err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "registry", Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatalf("create kv: %v", err)
	}
	if _, err := kv.Put(ctx, "agent.a", []byte("online")); err != nil {
		t.Fatalf("kv put: %v", err)
	}
	if err := first.UpdateMeshAccount(ctx, func(ac *jwt.AccountClaims) error {
		ac.Revoke(revoked.Key.Public())
		return nil
	}); err != nil {
		t.Fatalf("revoke: %v", err)
	}
	nc.Close()
	if err := first.Close(); err != nil {
		t.Fatalf("close first: %v", err)
	}

	second := startMesh(t, dir)
	if got := second.Trust().PublicKeys(); got != keysBefore {
		t.Fatalf("keys changed across restart:\n got %+v\nwant %+v", got, keysBefore)
	}

	nc, err = second.ConnectService("test-reader")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err = jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, "EVENTS")
	if err != nil {
		t.Fatalf("stream after restart: %v", err)
	}
	msg, err := stream.GetLastMsgForSubject(ctx, "events.one")
	if err != nil {
		t.Fatalf("stream message after restart: %v", err)
	}
	if string(msg.Data) != "first event" {
		t.Fatalf("stream message = %q, want %q", msg.Data, "first event")
	}
	kv, err = js.KeyValue(ctx, "registry")
	if err != nil {
		t.Fatalf("kv after restart: %v", err)
	}
	entry, err := kv.Get(ctx, "agent.a")
	if err != nil {
		t.Fatalf("kv get after restart: %v", err)
	}
	if string(entry.Value()) != "online" {
		t.Fatalf("kv value = %q, want %q", entry.Value(), "online")
	}

	// The mesh account JWT is re-signed at start; the revocation must survive it.
	expectRefused(t, second.URLs().MeshTCP, revoked.NATSOption())
}

func TestHealthz(t *testing.T) {
	m := startMesh(t, t.TempDir())

	resp, err := http.Get(m.URLs().Control + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status = %d, want 200", resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("content type = %q", ct)
	}
	var body map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	if body["ok"] != true || body["nats"] != true {
		t.Fatalf("body = %v, want ok and nats true", body)
	}
	if up, ok := body["uptime_s"].(float64); !ok || up < 0 {
		t.Fatalf("uptime_s = %v", body["uptime_s"])
	}

	// With the broker gone, the same handler answers 503.
	m.Broker().Kill()
	rec := httptest.NewRecorder()
	m.handleHealthz(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("status with broker down = %d, want 503", rec.Code)
	}
	var down healthz
	if err := json.Unmarshal(rec.Body.Bytes(), &down); err != nil {
		t.Fatal(err)
	}
	if down.OK || down.NATS {
		t.Fatalf("body with broker down = %+v", down)
	}
}

func TestMuxAcceptsLaterRoutes(t *testing.T) {
	m := startMesh(t, t.TempDir())
	m.Mux().HandleFunc("GET /v1/ping", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("pong"))
	})
	resp, err := http.Get(m.URLs().Control + "/v1/ping")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status = %d", resp.StatusCode)
	}
}

func TestDataDirLayoutAndModes(t *testing.T) {
	dir := t.TempDir()
	startMesh(t, dir)

	keys := filepath.Join(dir, "keys")
	fi, err := os.Stat(keys)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o700 {
		t.Errorf("keys dir mode = %04o, want 0700", fi.Mode().Perm())
	}
	entries, err := os.ReadDir(keys)
	if err != nil {
		t.Fatal(err)
	}
	// The four trust-chain seeds, the bus workers' services key, the
	// registrar's card-signing key and the audit export key.
	if len(entries) != 7 {
		t.Errorf("keys dir has %d entries, want 7", len(entries))
	}
	for _, e := range entries {
		info, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		if info.Mode().Perm() != 0o600 {
			t.Errorf("%s mode = %04o, want 0600", e.Name(), info.Mode().Perm())
		}
	}
	for _, sub := range []string{"jetstream", "nats/accounts"} {
		if fi, err := os.Stat(filepath.Join(dir, sub)); err != nil || !fi.IsDir() {
			t.Errorf("%s: want a directory, got %v", sub, err)
		}
	}
	// The local test-only timestamp authorities keep their signing keys
	// as the keys are kept.
	for _, name := range LocalAuthorities {
		sub := filepath.Join(dir, TSADir, name)
		if fi, err := os.Stat(sub); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v, %v", sub, fi, err)
		}
		if fi, err := os.Stat(filepath.Join(sub, "tsa-signer.key")); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s's key: %v, %v", name, fi, err)
		}
	}
}

func TestURLs(t *testing.T) {
	m := startMesh(t, t.TempDir())
	u := m.URLs()
	checks := []struct {
		name, got, prefix, suffix string
	}{
		{"control", u.Control, "http://127.0.0.1:", ""},
		{"registrar", u.Registrar, "http://127.0.0.1:", ""},
		// The console is localhost: WebAuthn needs a domain for its relying party.
		{"console", u.Console, "http://localhost:", "/console/"},
		{"mesh tcp", u.MeshTCP, "nats://127.0.0.1:", ""},
		{"mesh ws", u.MeshWS, "ws://127.0.0.1:", ""},
	}
	for _, c := range checks {
		if !strings.HasPrefix(c.got, c.prefix) || !strings.HasSuffix(c.got, c.suffix) || strings.HasSuffix(c.got, ":0") {
			t.Errorf("%s url = %q, want %q...%q with a bound port", c.name, c.got, c.prefix, c.suffix)
		}
	}
	if u.Console != strings.Replace(u.Control, "127.0.0.1", "localhost", 1)+"/console/" {
		t.Errorf("console = %q, want under control %q", u.Console, u.Control)
	}
}

func TestStartFailsFastOnBusyPort(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	busy := ln.Addr().String()

	tests := []struct {
		name string
		cfg  Config
	}{
		{"nats", Config{NATSAddr: busy}},
		{"websocket", Config{WSAddr: busy}},
		{"http", Config{HTTPAddr: busy}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.DataDir = t.TempDir()
			tc.cfg.ReadyTimeout = 20 * time.Second
			start := time.Now()
			m, err := Start(t.Context(), tc.cfg)
			if err == nil {
				m.Close()
				t.Fatal("Start succeeded on a busy port")
			}
			// Far below ReadyTimeout: the bind failure is reported, not waited out.
			if d := time.Since(start); d > 10*time.Second {
				t.Fatalf("Start took %s to fail", d)
			}
			t.Logf("error: %v", err)
			if !strings.Contains(err.Error(), "listen") && !strings.Contains(err.Error(), "address already in use") {
				t.Fatalf("err = %v, want a listen error", err)
			}
		})
	}
}

func TestPushAccountJWTReportsRefusal(t *testing.T) {
	m := startMesh(t, t.TempDir())
	sys, err := m.ConnectSystem("test-admin")
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Close()
	ctx, cancel := context.WithTimeout(t.Context(), asyncWait)
	defer cancel()

	if err := creds.PushAccountJWT(ctx, sys, "not a jwt"); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("garbage jwt: err = %v, want a refusal", err)
	}
	// A valid update is accepted and visible to the next read-modify-write.
	if err := m.UpdateMeshAccount(ctx, func(ac *jwt.AccountClaims) error {
		ac.Tags.Add("updated")
		return nil
	}); err != nil {
		t.Fatalf("update: %v", err)
	}
	err = m.UpdateMeshAccount(ctx, func(ac *jwt.AccountClaims) error {
		if !ac.Tags.Contains("updated") {
			return errors.New("previous update not visible")
		}
		return errors.New("stop here")
	})
	if err == nil || !strings.Contains(err.Error(), "stop here") {
		t.Fatalf("second update: err = %v, want the edit's own error", err)
	}
}
