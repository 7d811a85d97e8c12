package fence_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/fence"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

const wait = 5 * time.Second

// testClass is a guest class small enough to meet in a test.
var testClass = creds.ClassLimits{ConnLimits: creds.ConnLimits{Payload: 4 << 10, Subs: 10},
	Conns: 2, MsgsPerSec: 50, BytesPerSec: 64 << 10}

// testMesh is a broker with a fence of the test class on it.
type testMesh struct {
	*bustest.Bus
	fence *fence.Fence
}

func (m *testMesh) Fence() *fence.Fence { return m.fence }

func startMesh(t *testing.T) *testMesh {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	b := bustest.Start(t)
	f, err := fence.Start(ctx, fence.Config{Sys: b.System(), Account: b.Trust().PublicKeys().MeshAccount,
		Classes: map[string]creds.ClassLimits{creds.ClassGuest: testClass, creds.ClassUnowned: testClass},
		Window:  200 * time.Millisecond,
		Log:     slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Stop)
	return &testMesh{Bus: b, fence: f}
}

// guest mints a guest credential of the test class, as the guest door does.
func guest(t *testing.T, m *testMesh) (string, *keys.Agent) {
	t.Helper()
	k, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		t.Fatal(err)
	}
	jwt, err := m.Trust().MintUser(creds.UserSpec{PublicKey: k.Public(), Name: "guest", Kind: creds.KindGuest,
		Hosted: []string{k.Public()}, Permissions: creds.GuestPermissions(k.Public()), Expires: time.Now().Add(time.Hour),
		Class: creds.ClassGuest, Limits: testClass.ConnLimits})
	if err != nil {
		t.Fatal(err)
	}
	return jwt, k
}

type watched struct {
	*nats.Conn
	mu     sync.Mutex
	errs   []error
	closed chan struct{}
}

func dial(t *testing.T, m *testMesh, jwt string, k *keys.Agent) *watched {
	t.Helper()
	w := &watched{closed: make(chan struct{})}
	nc, err := nats.Connect(m.ClientURL(),
		nats.UserJWT(func() (string, error) { return jwt, nil }, func(n []byte) ([]byte, error) { return k.Sign(n), nil }),
		creds.PrivateInbox(k.Public()), nats.NoReconnect(),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			w.mu.Lock()
			w.errs = append(w.errs, err)
			w.mu.Unlock()
		}),
		nats.ClosedHandler(func(*nats.Conn) { close(w.closed) }))
	if err != nil {
		t.Fatal(err)
	}
	w.Conn = nc
	t.Cleanup(nc.Close)
	return w
}

// closedSoon connects with jwt and reports whether the connection is
// closed within wait; the fence's close may come before the client's
// connect has even completed.
func closedSoon(m *testMesh, jwt string, k *keys.Agent) bool {
	nc, err := nats.Connect(m.ClientURL(), nats.UserJWT(func() (string, error) { return jwt, nil }, func(n []byte) ([]byte, error) { return k.Sign(n), nil }),
		creds.PrivateInbox(k.Public()), nats.NoReconnect())
	if err != nil {
		return true
	}
	defer nc.Close()
	for deadline := time.Now().Add(wait); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if nc.IsClosed() {
			return true
		}
	}
	return false
}

func (w *watched) isClosed(d time.Duration) bool {
	select {
	case <-w.closed:
		return true
	case <-time.After(d):
		return false
	}
}

func (w *watched) sawError(substr string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range w.errs {
		if strings.Contains(strings.ToLower(e.Error()), strings.ToLower(substr)) {
			return true
		}
	}
	return false
}

// The broker enforces the JWT's part: one subscription past the class's
// count is refused, one message past its payload closes the connection.
// On the old code one guest credential held 100,000 subscriptions.
func TestBrokerEnforcesTheClassLimits(t *testing.T) {
	m := startMesh(t)
	jwt, k := guest(t, m)

	w := dial(t, m, jwt, k)
	for i := range testClass.Subs {
		if _, err := w.SubscribeSync(protocol.EventSubject("s" + string(rune('a'+i)))); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	_, _ = w.SubscribeSync(protocol.EventSubject("one-too-many"))
	_ = w.Flush()
	deadline := time.Now().Add(wait)
	for !w.sawError("maximum subscriptions") {
		if time.Now().After(deadline) {
			t.Fatalf("the broker accepted subscription %d; errors: %v", testClass.Subs+1, w.errs)
		}
		time.Sleep(10 * time.Millisecond)
	}

	w2 := dial(t, m, jwt, k)
	err := w2.Publish(protocol.EventSubject("big"), make([]byte, testClass.Payload+1))
	if errors.Is(err, nats.ErrMaxPayload) {
		// The broker had already told the client the credential's limit
		// (it can, in the INFO after the connect): the client refused the
		// message itself, which is the limit enforced too.
		if got := w2.MaxPayload(); got != int64(testClass.Payload) {
			t.Fatalf("the client refused locally against a limit of %d, not the class's %d", got, testClass.Payload)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	_ = w2.Flush()
	if !w2.isClosed(wait) {
		t.Fatal("a message over the class's payload was accepted")
	}
}

// The fence's part: a key holds at most Conns connections (the newest is
// closed); a connection publishing over the class's rate is closed, and
// the key's next connection too while it cools off. An unclassed
// credential is never touched. On the old code one guest credential held
// 1,000 connections.
func TestFenceClosesWhatTheJWTCannotLimit(t *testing.T) {
	m := startMesh(t)
	jwt, k := guest(t, m)

	a, b := dial(t, m, jwt, k), dial(t, m, jwt, k)
	if !closedSoon(m, jwt, k) {
		t.Fatal("a third connection of one guest key stayed open")
	}
	if a.isClosed(300*time.Millisecond) || b.isClosed(0) {
		t.Fatal("the first two connections were closed")
	}
	if s := m.Fence().Stats(); s.Kicked["connections"] != 1 {
		t.Fatalf("fence stats %+v", s)
	}

	// Flood from a: well over 50 messages a second.
	stop := time.Now().Add(wait)
	for !a.isClosed(0) && time.Now().Before(stop) {
		_ = a.Publish(protocol.EventSubject("flood"), []byte("x"))
		time.Sleep(time.Millisecond)
	}
	if !a.isClosed(wait) {
		t.Fatal("a flooding guest connection stayed open")
	}
	// Cooling off: the key's next connection is closed at once; b, which
	// stayed quiet, was left alone.
	if !closedSoon(m, jwt, k) {
		t.Fatal("the flooding key connected again during its cooling-off")
	}
	if b.isClosed(0) {
		t.Fatal("the quiet connection of the same key was closed")
	}
	if s := m.Fence().Stats(); s.Kicked["rate"] != 1 || s.Kicked["cooling"] < 1 {
		t.Fatalf("fence stats %+v", s)
	}

	// An unclassed node credential publishing as fast: untouched.
	nk, _ := keys.Generate[keys.NodeRole]()
	ak, _ := keys.Generate[keys.AgentRole]()
	njwt, err := m.Trust().MintUser(creds.UserSpec{PublicKey: nk.Public(), Kind: creds.KindNode, Hosted: []string{ak.Public()},
		Permissions: creds.NodePermissions([]string{ak.Public()}, creds.PrivateOnly(nk.Public())), Expires: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	node, err := nats.Connect(m.ClientURL(), nats.UserJWT(func() (string, error) { return njwt, nil }, nk.SignNonce), nats.NoReconnect())
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	for range 2000 {
		_ = node.Publish(protocol.EventSubject("busy"), []byte("x"))
	}
	_ = node.Flush()
	time.Sleep(600 * time.Millisecond)
	if !node.IsConnected() {
		t.Fatal("the fence closed an unclassed connection")
	}
}
