// Package devenv boots the whole mesh in one process: the embedded NATS broker
// (shared/broker), the bus workers (the workers table), and the HTTP server that
// carries the control plane, the registrar and the console. meshd is a thin
// main over it; tests and the conformance suite start the same thing on
// random loopback ports.
package devenv

import (
	"agentmesh.dev/mesh/shared/mail"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/functions/api"
	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/broker"
	"agentmesh.dev/mesh/shared/credential"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/fence"
	"agentmesh.dev/mesh/shared/guest"
	"agentmesh.dev/mesh/shared/httpx"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/store"
)

// Config is what Start needs. Empty addresses mean "127.0.0.1:0": a random
// loopback port, which is what tests want.
type Config struct {
	// DataDir holds everything that survives a restart: keys/ (the trust
	// chain), nats/accounts/ (account JWTs) and jetstream/ (bus state).
	DataDir string
	// HTTPAddr is where the control plane, registrar and console listen.
	HTTPAddr string
	// NATSAddr is the broker's TCP client listener.
	NATSAddr string
	// WSAddr is the broker's WebSocket listener (plain ws://, no TLS: this is
	// the one-machine mesh; put a TLS proxy in front to expose it).
	WSAddr string
	// Logger receives meshd's and the broker's logs; nil discards them.
	Logger *slog.Logger
	// ReadyTimeout bounds how long Start waits for the broker; zero means 30s.
	ReadyTimeout time.Duration

	// MeshName names this mesh in credential answers ("meshd" by default).
	MeshName string
	// Store is the control plane's store; nil opens the bbolt file in
	// DataDir, as meshd does. Tests put Firestore (an emulator) behind the
	// control plane this way, without devenv linking it. The caller owns
	// it: Close leaves it open.
	Store store.Store
	// Mail delivers the control plane's mail; nil writes it to the data
	// directory's outbox (and logs where, never the body).
	Mail mail.Sender
	// Now is the control plane's clock; nil is time.Now.
	Now func() time.Time
	// NoExpiry mints node credentials without an expiry.
	NoExpiry bool
	// GuestIdleTTL is the guest lease idle timeout (10 minutes by default).
	GuestIdleTTL time.Duration
	// RateLimit is the per-address HTTP limit per minute (600 by default).
	RateLimit int
	// BodyTimeout is how long an HTTP request may take to deliver its body
	// (httpx.DefaultBodyTimeout, 10 s, when 0); a slower body is cut off
	// with 408.
	BodyTimeout time.Duration
	// GuestLimits bound guest leases per client address, per network and
	// overall, and the pool; zero fields take guest.DefaultLimits. meshd
	// sets them from its --limit-guest-* flags.
	GuestLimits guest.Limits
	// AccountLimits bound sign-up, sign-in and connect per client address,
	// per network, overall and per recipient; zero fields take
	// account.DefaultLimits. meshd sets them from its --limit-* flags.
	AccountLimits account.Limits
	// JobInterval, when positive, replaces the interval of every scheduled
	// row (the sweeps): tests set it short. 0 keeps each row's own.
	JobInterval time.Duration
	// TrustedProxyHops is how many reverse proxies in front of meshd append
	// to X-Forwarded-For (0 by default: the socket address is the client
	// and the header is ignored, since anyone can write it). Behind one
	// proxy set 1, or every client shares the proxy's per-IP limits. As
	// MESH_TRUSTED_PROXY_HOPS does for the Cloud Functions.
	TrustedProxyHops int
	// Workers tunes the bus workers (one copy of each by default).
	Workers WorkerConfig
	// MarkupPct is the platform markup /v1/capabilities reports; meshd
	// reads it from CREDITS_PLATFORM_MARKUP_PCT (10 when unset).
	MarkupPct int
	// Unowned limits node credentials for rosters no account owns
	// (credential.DefaultUnownedLimits when zero).
	Unowned credential.UnownedLimits
	// Classes are the fence classes' limits (creds.DefaultClassLimits when
	// nil): what guests and unowned rosters may publish and hold open.
	Classes map[string]creds.ClassLimits
	// FenceWindow is how often the fence reads limited connections' rates
	// (fence.DefaultWindow when 0).
	FenceWindow time.Duration
	// Grants configures the cloud grants: the deployer's address (meshd
	// --grant-deployer) and, in tests, the Google world they reach
	// (shared/grant/googlefake); nil Google is the real APIs with the
	// machine's application default credentials. Without a deployer the
	// grant routes answer 501.
	Grants api.Grants
	// Cluster, when 2 or more, runs the bus on that many nats-servers in
	// this process forming one JetStream cluster (broker.StartCluster),
	// their state under <DataDir>/cluster/, instead of one broker. Member
	// i's client port is NATSAddr's port plus i (random when 0), its
	// WebSocket port WSAddr's plus i; the URLs list every member. The
	// workers' streams and buckets are then R3 (Workers.Replicas, when 0),
	// and every connection of the mesh reconnects across the members.
	Cluster int
	// ClusterResolverSync is how often cluster members compare their
	// account JWTs (broker.DefaultResolverSync when 0).
	ClusterResolverSync time.Duration
	// Audit configures the audit records: the anchors' timestamp
	// authorities (two local test-only ones when none) and, for tests,
	// the anchor job's clock.
	Audit AuditConfig
}

// busServer is what the mesh needs of its bus: one broker
// (broker.Broker) or a cluster of them (broker.Cluster).
type busServer interface {
	ClientURL() string
	WebSocketURL() string
	System() *nats.Conn
	ConnectService(name string, opts ...nats.Option) (*nats.Conn, error)
	ConnectSystem(name string, opts ...nats.Option) (*nats.Conn, error)
	UpdateMeshAccount(ctx context.Context, edit func(*jwt.AccountClaims) error) error
	Healthy() bool
	Shutdown()
}

func (c Config) meshName() string {
	if c.MeshName == "" {
		return serverName
	}
	return c.MeshName
}

// URLs are the addresses an adapter needs, as printed by meshd and written to
// meshd.json. On a cluster MeshTCP and MeshWS list every member,
// comma-separated, as NATS clients take a server list.
type URLs struct {
	Control   string `json:"control_url"`
	Registrar string `json:"registrar_url"`
	Console   string `json:"console_url"`
	MeshTCP   string `json:"mesh_tcp_url"`
	MeshWS    string `json:"mesh_ws_url"`
}

// keysDir is the data directory's trust chain (the broker's state is beside
// it: broker.AccountsDir and jetstream/).
const keysDir = "keys"

// LevelTrace is below slog.LevelDebug; a logger enabled at this level also
// receives the broker's protocol trace.
const LevelTrace = broker.LevelTrace

// serverName names the embedded broker in its logs and server listings
// (otherwise it would be a random id that changes on every start).
const serverName = "meshd"

// Mesh is a running mesh. It is safe for concurrent use.
type Mesh struct {
	log    *slog.Logger
	trust  *creds.Trust
	broker busServer
	// cluster is the bus when it is a cluster (Config.Cluster), else nil;
	// broker is then the same.
	cluster *broker.Cluster
	mux     *http.ServeMux
	httpSrv *http.Server
	urls    URLs
	started time.Time

	// servicesKey signs every answer and event of the bus workers.
	servicesKey *keys.Agent

	// fence limits the connections and rates of guest and unowned
	// credentials (package fence).
	fence *fence.Fence

	// workers are the running bus workers.
	workers *Workers
	// roomOwners is the rooms worker's registrar, set once the control
	// plane has built it.
	roomOwners *registrarOwners
	// console is the console's URL (a string) once the HTTP listener is
	// up: the agreements worker's approval URLs point there.
	console atomic.Value

	// control is the control plane (store, services, routes).
	control *Control
	// closers release what the control plane opened, after HTTP stops.
	closers []func() error

	// connMu guards newConns: HTTP connections that sent no request yet.
	connMu   sync.Mutex
	newConns map[net.Conn]struct{}

	// lock is the data directory's lock, held from Start until the broker
	// has stopped.
	lock *DirLock

	shutdownOnce sync.Once
	shutdownErr  error
}

// Start boots the mesh and returns once the broker accepts connections, the
// mesh account has JetStream, and the HTTP server is listening. On error,
// everything already started is stopped again.
func Start(ctx context.Context, cfg Config) (*Mesh, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("devenv: DataDir is required")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	readyTimeout := cfg.ReadyTimeout
	if readyTimeout <= 0 {
		readyTimeout = 30 * time.Second
	}
	dataDir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("devenv: data dir: %w", err)
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("devenv: data dir: %w", err)
	}
	// Nothing in the directory is opened before its lock is ours: a second
	// meshd would otherwise share the broker's JetStream files.
	lock, err := LockDataDir(dataDir, "meshd")
	if err != nil {
		return nil, err
	}

	trust, created, err := creds.LoadOrCreate(filepath.Join(dataDir, keysDir))
	if err != nil {
		_ = lock.Unlock()
		return nil, fmt.Errorf("devenv: %w", err)
	}
	m := &Mesh{log: log, trust: trust, mux: http.NewServeMux(), started: time.Now(), lock: lock}
	// The workers' signing key lives beside the trust chain (0600): clients
	// may pin it, so it must survive restarts.
	if m.servicesKey, err = keys.LoadOrGenerate[keys.AgentRole](filepath.Join(dataDir, keysDir, "services.nk")); err != nil {
		_ = lock.Unlock()
		return nil, fmt.Errorf("devenv: services key: %w", err)
	}
	pk := trust.PublicKeys()
	log.Info("trust chain ready", "created", created, "operator", pk.Operator,
		"system_account", pk.SystemAccount, "mesh_account", pk.MeshAccount)

	if err := m.startNATS(ctx, dataDir, cfg, readyTimeout); err != nil {
		_ = m.Shutdown(context.Background()) // stop whatever got started
		return nil, err
	}
	if err := m.startFence(ctx, cfg); err != nil {
		_ = m.Shutdown(context.Background())
		return nil, err
	}
	if err := m.startWorkers(cfg); err != nil {
		_ = m.Shutdown(context.Background())
		return nil, err
	}
	if err := m.startHTTP(dataDir, cfg); err != nil {
		_ = m.Shutdown(context.Background())
		return nil, err
	}
	log.Info("mesh ready", "control_url", m.urls.Control, "mesh_tcp_url", m.urls.MeshTCP,
		"mesh_ws_url", m.urls.MeshWS)
	return m, nil
}

// startNATS starts the embedded broker (shared/broker) and waits until the
// mesh account is usable.
func (m *Mesh) startNATS(ctx context.Context, dataDir string, cfg Config, readyTimeout time.Duration) error {
	if cfg.Cluster > 1 {
		return m.startCluster(ctx, dataDir, cfg, readyTimeout)
	}
	b, err := broker.Start(ctx, broker.Config{DataDir: dataDir, Trust: m.trust, NATSAddr: cfg.NATSAddr, WSAddr: cfg.WSAddr,
		Name: serverName, Logger: m.log, ReadyTimeout: readyTimeout})
	if err != nil {
		return fmt.Errorf("devenv: %w", err)
	}
	m.broker = b
	m.urls.MeshTCP = b.ClientURL()
	m.urls.MeshWS = b.WebSocketURL()
	return nil
}

// ClusterDir is where a cluster's members keep their state, under the data
// directory: <ClusterDir>/meshd-<i>/.
const ClusterDir = "cluster"

// startCluster starts cfg.Cluster brokers as one JetStream cluster.
func (m *Mesh) startCluster(ctx context.Context, dataDir string, cfg Config, readyTimeout time.Duration) error {
	host, natsPort, err := basePort(cfg.NATSAddr)
	if err != nil {
		return fmt.Errorf("devenv: nats address: %w", err)
	}
	wsHost, wsPort, err := basePort(cfg.WSAddr)
	if err != nil {
		return fmt.Errorf("devenv: websocket address: %w", err)
	}
	if wsHost != host {
		return fmt.Errorf("devenv: a cluster listens on one host; the nats address has %q, the websocket one %q", host, wsHost)
	}
	c, err := broker.StartCluster(ctx, broker.ClusterConfig{Size: cfg.Cluster, DataDir: filepath.Join(dataDir, ClusterDir),
		Trust: m.trust, Name: serverName, Host: host, NATSPort: natsPort, WSPort: wsPort,
		ResolverSync: cfg.ClusterResolverSync, Logger: m.log, ReadyTimeout: readyTimeout})
	if err != nil {
		return fmt.Errorf("devenv: %w", err)
	}
	m.broker, m.cluster = c, c
	m.urls.MeshTCP = c.ClientURL()
	m.urls.MeshWS = c.WebSocketURL()
	return nil
}

// basePort splits a listen address into its host (loopback when empty)
// and port (0: random).
func basePort(addr string) (string, int, error) {
	if addr == "" {
		return "127.0.0.1", 0, nil
	}
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("bad port in %q", addr)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	return host, port, nil
}

// meshURLs are the bus's addresses one by one, for credential answers.
func (m *Mesh) meshURLs() (tcp, ws []string) {
	if m.cluster != nil {
		return m.cluster.ClientURLs(), m.cluster.WebSocketURLs()
	}
	return []string{m.urls.MeshTCP}, []string{m.urls.MeshWS}
}

// startHTTP listens on cfg.HTTPAddr, mounts /healthz and the control
// plane, and serves the mux.
func (m *Mesh) startHTTP(dataDir string, cfg Config) error {
	addr := cfg.HTTPAddr
	if addr == "" {
		addr = defaultAddr
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("devenv: http listener: %w", err)
	}
	host, _, _ := net.SplitHostPort(addr)
	base := "http://" + broker.AdvertiseAddr(host, ln.Addr().(*net.TCPAddr).Port)
	m.urls.Control = base
	m.urls.Registrar = base
	// The console is served as localhost: WebAuthn needs a domain, and
	// browsers treat http://localhost as a secure context.
	m.urls.Console = strings.Replace(base, "127.0.0.1", "localhost", 1) + "/console/"
	m.console.Store(m.urls.Console)

	m.mux.HandleFunc("GET /healthz", m.handleHealthz)
	if err := m.startControlPlane(dataDir, cfg, base); err != nil {
		ln.Close()
		return err
	}
	m.httpSrv = &http.Server{
		ConnState: m.trackConn,
		// The mux's own 404 and 405 answer JSON like every route. A body's
		// read deadline is set per request (httpx.BodyDeadline, on every
		// route), not with ReadTimeout: that one stays armed while a handler
		// works and cancels its context when it fires.
		Handler:           httpx.JSONErrors(m.mux, m.log.With("component", "http")),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(m.log.With("component", "http").Handler(), slog.LevelWarn),
	}
	go func() {
		if err := m.httpSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			m.log.Error("http server stopped", "err", err)
		}
	}()
	return nil
}

// trackConn remembers connections that have not sent a request yet.
func (m *Mesh) trackConn(c net.Conn, state http.ConnState) {
	m.connMu.Lock()
	defer m.connMu.Unlock()
	if m.newConns == nil {
		m.newConns = map[net.Conn]struct{}{}
	}
	if state == http.StateNew {
		m.newConns[c] = struct{}{}
	} else {
		delete(m.newConns, c)
	}
}

func (m *Mesh) closeNewConns() {
	m.connMu.Lock()
	defer m.connMu.Unlock()
	for c := range m.newConns {
		_ = c.Close()
	}
}

// URLs returns the addresses of this mesh, with the ports actually bound.
func (m *Mesh) URLs() URLs { return m.urls }

// Mux is the HTTP mux served at the control URL. Later packages mount their
// routes on it (Go 1.22 method+path patterns); ServeMux allows registering
// while serving.
func (m *Mesh) Mux() *http.ServeMux { return m.mux }

// ServicesKey is the key the bus workers sign with.
func (m *Mesh) ServicesKey() *keys.Agent { return m.servicesKey }

// Trust is the mesh's trust chain, for minting credentials.
func (m *Mesh) Trust() *creds.Trust { return m.trust }

// startFence runs the fence on the system connection (cfg.Classes, or the
// default class limits).
func (m *Mesh) startFence(ctx context.Context, cfg Config) error {
	f, err := fence.Start(ctx, fence.Config{Sys: m.broker.System(), Account: m.trust.PublicKeys().MeshAccount, Classes: cfg.Classes,
		Window: cfg.FenceWindow, Log: m.log})
	if err != nil {
		return fmt.Errorf("devenv: %w", err)
	}
	m.fence = f
	return nil
}

// Fence is the running fence, for its counters.
func (m *Mesh) Fence() *fence.Fence { return m.fence }

// ConnectService returns an in-process connection to the mesh account as a
// "service" user allowed to publish and subscribe everywhere in it: the
// identity of the workers (broker.Broker.ConnectService).
func (m *Mesh) ConnectService(name string, opts ...nats.Option) (*nats.Conn, error) {
	return m.broker.ConnectService(name, opts...)
}

// ConnectSystem returns an in-process connection to the system account, for
// broker administration (account updates, server events).
func (m *Mesh) ConnectSystem(name string, opts ...nats.Option) (*nats.Conn, error) {
	return m.broker.ConnectSystem(name, opts...)
}

// UpdateMeshAccount applies edit to the mesh account's current claims and
// pushes them to the broker, which applies them at once (revoked keys are
// disconnected). Updates are serialised (broker.Broker.UpdateMeshAccount).
func (m *Mesh) UpdateMeshAccount(ctx context.Context, edit func(*jwt.AccountClaims) error) error {
	return m.broker.UpdateMeshAccount(ctx, edit)
}

// Broker is the embedded broker, nil when the bus is a cluster (Cluster).
func (m *Mesh) Broker() *broker.Broker {
	b, _ := m.broker.(*broker.Broker)
	return b
}

// Cluster is the bus when the mesh runs on a cluster (Config.Cluster),
// else nil: for tests and tools that stop and restart its members.
func (m *Mesh) Cluster() *broker.Cluster { return m.cluster }

// Shutdown stops the mesh within ctx: the HTTP server first (in-flight
// requests get at most half of what is left of ctx, then their connections
// are closed), then the control plane and the workers, then the broker,
// whose JetStream flush gets the rest. It is safe to call more than once.
//
// The broker stops its durable consumers one after another and each costs
// about 10 ms (nats-server waits out its consumer store's flusher), so
// with thousands of mailboxes it can take longer than a service manager
// waits. When ctx ends first, Shutdown logs it and returns while the
// broker carries on in the background; a process that exits then leaves
// JetStream as a crash would, and the broker recovers it at the next start
// (the consumers' positions are written at most 100 ms after they change,
// so at worst mail acknowledged in that window is delivered again). The
// data directory's lock is released only once the broker has stopped, so
// no other meshd can open the directory while it still writes there.
func (m *Mesh) Shutdown(ctx context.Context) error {
	m.shutdownOnce.Do(func() {
		start := time.Now()
		var errs []error
		if m.httpSrv != nil {
			// Shutdown waits up to five seconds for connections that never
			// sent a request (clients dialling ahead); they carry nothing in
			// flight, so they are closed at once.
			m.closeNewConns()
			hctx, cancel := halfOf(ctx)
			if err := m.httpSrv.Shutdown(hctx); err != nil {
				errs = append(errs, fmt.Errorf("http shutdown: %w", err))
				_ = m.httpSrv.Close()
			}
			cancel()
		}
		// The control plane's closers run in reverse: the sweeper stops
		// before the store it writes to is closed.
		for i := len(m.closers) - 1; i >= 0; i-- {
			if err := m.closers[i](); err != nil {
				errs = append(errs, err)
			}
		}
		if m.fence != nil {
			m.fence.Stop()
		}
		if m.broker != nil {
			stopped := make(chan struct{})
			go func() {
				defer close(stopped)
				m.broker.Shutdown()
				_ = m.lock.Unlock()
			}()
			select {
			case <-stopped:
			case <-ctx.Done():
				m.log.Warn("the broker is still writing its JetStream state; stopping without waiting for it, and it recovers at the next start",
					"waited", time.Since(start).Round(time.Millisecond))
			}
		} else {
			_ = m.lock.Unlock()
		}
		m.shutdownErr = errors.Join(errs...)
		m.log.Info("mesh stopped", "took", time.Since(start).Round(time.Millisecond))
	})
	return m.shutdownErr
}

// halfOf is ctx with a deadline half as far away as ctx's, if it has one.
func halfOf(ctx context.Context) (context.Context, context.CancelFunc) {
	d, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	return context.WithDeadline(ctx, time.Now().Add(time.Until(d)/2))
}

// Close is Shutdown with a ten-second grace period for HTTP requests.
func (m *Mesh) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return m.Shutdown(ctx)
}
