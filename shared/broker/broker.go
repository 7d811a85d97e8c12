// Package broker is the embedded NATS broker of the mesh: a nats-server in
// operator mode, trusting one operator, with JetStream, a WebSocket
// listener and the directory account resolver that takes account updates
// (revocations) without a restart (DESIGN §4). meshd runs it through devenv;
// worker tests start only this (shared/bus/bustest), not the control plane.
package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/creds"
)

// Config is what Start needs. Empty addresses mean "127.0.0.1:0": a random
// loopback port, which is what tests want.
type Config struct {
	// DataDir holds the broker's state: nats/accounts/ (the account JWTs
	// the resolver serves) and jetstream/ (bus state).
	DataDir string
	// Trust is the trust chain: the operator the broker trusts, the system
	// account it reports to, and the mesh account it serves.
	Trust *creds.Trust
	// NATSAddr is the TCP client listener.
	NATSAddr string
	// WSAddr is the WebSocket listener (plain ws://, no TLS: put a TLS
	// proxy in front to expose it).
	WSAddr string
	// Name names the broker in its logs and server listings, and prefixes
	// its own connections' names ("meshd" when empty).
	Name string
	// Logger receives the broker's logs; nil discards them.
	Logger *slog.Logger
	// ReadyTimeout bounds how long Start waits for the broker; zero means 30s.
	ReadyTimeout time.Duration
	// Cluster, when set, makes the broker one member of a JetStream cluster
	// (StartCluster sets it for each of its servers; cluster.go).
	Cluster *Member
}

// Layout of the data directory.
const (
	// AccountsDir is where the directory resolver keeps the account JWTs.
	AccountsDir = "nats/accounts"
)

// MaxControlLine is the broker's max_control_line: room for the CONNECT of
// the largest credential the control plane mints (creds.MaxControlLine).
// A node credential lists its permissions per hosted agent; a full 16-agent
// roster's JWT is about 18 KiB, over the default 4 KiB. The cluster in the
// cloud needs the same setting.
const MaxControlLine = 64 << 10

// DefaultName names a broker whose Config has none.
const DefaultName = "meshd"

// Broker is a running broker. It is safe for concurrent use.
type Broker struct {
	cfg    Config
	log    *slog.Logger
	trust  *creds.Trust
	ns     *server.Server
	nslog  *natsLogger
	dirRes *server.DirAccResolver

	tcpURL, wsURL string

	// sys is the in-process system-account connection that pushes account
	// updates; its state also says whether the broker is usable.
	sys *nats.Conn

	// accountMu serialises read-modify-write of the mesh account JWT, so two
	// concurrent revocations cannot overwrite each other.
	accountMu sync.Mutex

	stopFlush    chan struct{}
	shutdownOnce sync.Once
}

// Start starts the broker and returns once it accepts connections and the
// mesh account has JetStream. On error, whatever got started is stopped.
func Start(ctx context.Context, cfg Config) (*Broker, error) {
	if cfg.DataDir == "" || cfg.Trust == nil {
		return nil, errors.New("broker: a data directory and a trust chain are required")
	}
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = 30 * time.Second
	}
	b := &Broker{cfg: cfg, log: cfg.Logger, trust: cfg.Trust, stopFlush: make(chan struct{})}
	if err := b.start(ctx); err != nil {
		b.Shutdown()
		return nil, err
	}
	return b, nil
}

func (b *Broker) start(ctx context.Context) error {
	cfg := b.cfg
	natsHost, natsPort, err := listenHostPort(cfg.NATSAddr)
	if err != nil {
		return fmt.Errorf("broker: nats address: %w", err)
	}
	wsHost, wsPort, err := listenHostPort(cfg.WSAddr)
	if err != nil {
		return fmt.Errorf("broker: websocket address: %w", err)
	}
	opJWT, err := b.trust.OperatorJWT()
	if err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	opClaims, err := jwt.DecodeOperatorClaims(opJWT)
	if err != nil {
		return fmt.Errorf("broker: decode operator jwt: %w", err)
	}
	resDir := filepath.Join(cfg.DataDir, filepath.FromSlash(AccountsDir))
	if err := os.MkdirAll(resDir, 0o700); err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	// The "full" directory resolver is the one that accepts account updates on
	// $SYS.REQ.CLAIMS.UPDATE, which is how revocation works without a restart.
	// A lone broker has no peers to ask for an account it does not hold, so a
	// short fetch timeout keeps connections naming unknown accounts from each
	// stalling for the default two seconds.
	//
	// In a cluster every member runs the same resolver: an update pushed to
	// one reaches every member that is up (they all subscribe the update
	// subject), and the members compare their directories every sync
	// interval and take each other's newer JWTs, which is how a member that
	// was down when a revocation was pushed catches up.
	var syncEvery time.Duration
	if cfg.Cluster != nil {
		syncEvery = cfg.Cluster.resolverSync()
	}
	res, err := server.NewDirAccResolver(resDir, 0, syncEvery, server.NoDelete, server.FetchTimeout(250*time.Millisecond))
	if err != nil {
		return fmt.Errorf("broker: account resolver: %w", err)
	}
	b.dirRes = res
	if err := b.storeAccountJWTs(); err != nil {
		return err
	}

	opts := &server.Options{
		ServerName:       cfg.Name,
		Host:             natsHost,
		Port:             natsPort,
		TrustedOperators: []*jwt.OperatorClaims{opClaims},
		SystemAccount:    b.trust.PublicKeys().SystemAccount,
		AccountResolver:  res,
		JetStream:        true,
		// The broker appends "jetstream" to StoreDir, giving <data-dir>/jetstream.
		StoreDir:               cfg.DataDir,
		DisableJetStreamBanner: true,
		MaxControlLine:         MaxControlLine,
		Websocket: server.WebsocketOpts{
			Host:  wsHost,
			Port:  wsPort,
			NoTLS: true,
		},
		// The embedding process owns signal handling; the broker's own
		// handler would exit it on SIGINT before anything drains.
		NoSigs: true,
	}
	if cfg.Cluster != nil {
		if err := cfg.Cluster.apply(opts); err != nil {
			return fmt.Errorf("broker: cluster: %w", err)
		}
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return fmt.Errorf("broker: nats server: %w", err)
	}
	b.ns = ns
	b.nslog = newNATSLogger(b.log)
	ns.SetLoggerV2(b.nslog, b.log.Enabled(ctx, slog.LevelDebug), b.log.Enabled(ctx, LevelTrace), false)
	ns.Start()
	// Counts of suppressed permission violations are written when their
	// window passes quietly, and once more at shutdown.
	go b.flushViolations()

	if err := b.waitReady(ctx); err != nil {
		return err
	}
	natsAddr, ok := ns.Addr().(*net.TCPAddr)
	if !ok {
		return errors.New("broker: nats server has no TCP listener")
	}
	wsPortNum, err := b.websocketPort()
	if err != nil {
		return err
	}
	b.tcpURL = "nats://" + AdvertiseAddr(natsHost, natsAddr.Port)
	b.wsURL = "ws://" + AdvertiseAddr(wsHost, wsPortNum)

	sysCreds, err := b.trust.MintSystemUser(cfg.Name + "-system")
	if err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	if b.sys, err = b.connect(sysCreds, cfg.Name+"-system"); err != nil {
		return fmt.Errorf("broker: system connection: %w", err)
	}
	if cfg.Cluster != nil {
		// JetStream answers only once the members have elected a meta
		// leader, which the first member to start cannot do alone: the
		// cluster checks the account once a quorum is up.
		return nil
	}
	return b.checkMeshAccount(ctx)
}

// flushViolations rolls the violation log every window until Shutdown.
func (b *Broker) flushViolations() {
	t := time.NewTicker(ViolationWindow)
	defer t.Stop()
	for {
		select {
		case <-b.stopFlush:
			return
		case <-t.C:
			b.nslog.violations.flush()
		}
	}
}

// storeAccountJWTs writes the system and mesh account JWTs into the resolver's
// directory before the broker starts, so both accounts resolve locally.
//
// It writes unconditionally (SaveAcc) rather than through the resolver's
// Store, which keeps the stored JWT when the new one has the same claim id,
// and that id hashes only the standard claims: a JWT re-signed within the
// same second as the stored one would be silently dropped.
//
// The mesh account JWT is re-signed from this code's definition on every start
// (so changed limits take effect), but the revocations already stored are
// carried over: dropping them would resurrect revoked credentials on restart.
//
// A cluster member does not re-sign (Member.MeshAccountJWT says why).
func (b *Broker) storeAccountJWTs() error {
	if m := b.cfg.Cluster; m != nil {
		return b.storeMemberAccountJWTs(m)
	}
	pk := b.trust.PublicKeys()
	sysJWT, err := b.trust.SystemAccountJWT()
	if err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	if err := b.dirRes.SaveAcc(pk.SystemAccount, sysJWT); err != nil {
		return fmt.Errorf("broker: store system account jwt: %w", err)
	}

	claims := b.trust.MeshAccountClaims()
	if stored, err := b.dirRes.LoadAcc(pk.MeshAccount); err == nil && stored != "" {
		prev, err := jwt.DecodeAccountClaims(stored)
		switch {
		case err != nil:
			b.log.Warn("stored mesh account jwt is unreadable; replacing it", "err", err)
		case prev.Issuer != pk.Operator:
			b.log.Warn("stored mesh account jwt has another issuer; replacing it", "issuer", prev.Issuer)
		default:
			for key, at := range prev.Revocations {
				claims.RevokeAt(key, time.Unix(at, 0))
			}
		}
	}
	meshJWT, err := b.trust.EncodeAccount(claims)
	if err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	if err := b.dirRes.SaveAcc(pk.MeshAccount, meshJWT); err != nil {
		return fmt.Errorf("broker: store mesh account jwt: %w", err)
	}
	return nil
}

// waitReady polls the broker until its listeners are up. A listener that
// cannot bind is reported through Fatalf; that is returned at once instead of
// waiting out the timeout.
func (b *Broker) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(b.cfg.ReadyTimeout)
	for {
		if msg := b.nslog.fatalMessage(); msg != "" {
			return fmt.Errorf("broker: nats server: %s", msg)
		}
		if b.ns.ReadyForConnections(50 * time.Millisecond) {
			if !b.ns.JetStreamEnabled() {
				return errors.New("broker: nats server started without JetStream")
			}
			return nil
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("broker: waiting for nats server: %w", err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("broker: nats server not ready after %s", b.cfg.ReadyTimeout)
		}
	}
}

// websocketPort returns the bound WebSocket port (the configured one may be random).
func (b *Broker) websocketPort() (int, error) {
	ports := b.ns.PortsInfo(time.Second)
	if ports == nil || len(ports.WebSocket) == 0 {
		return 0, errors.New("broker: nats server has no websocket listener")
	}
	// Each entry is "ws://host:port"; the port is the same in all of them.
	_, portStr, err := net.SplitHostPort(trimScheme(ports.WebSocket[0]))
	if err != nil {
		return 0, fmt.Errorf("broker: websocket address %q: %w", ports.WebSocket[0], err)
	}
	var port int
	if _, err := fmt.Sscan(portStr, &port); err != nil {
		return 0, fmt.Errorf("broker: websocket port %q: %w", portStr, err)
	}
	return port, nil
}

// checkMeshAccount connects as a mesh service user and asks JetStream for the
// account's info: it proves the account JWT resolves, is trusted and has
// JetStream before Start reports success.
func (b *Broker) checkMeshAccount(ctx context.Context) error {
	nc, err := b.ConnectService(b.cfg.Name + "-startup-check")
	if err != nil {
		return fmt.Errorf("broker: mesh account connection: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("broker: jetstream: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := js.AccountInfo(ctx); err != nil {
		return fmt.Errorf("broker: mesh account has no JetStream: %w", err)
	}
	return nil
}

// ClientURL is the TCP address agents and workers dial (nats://host:port),
// with the port actually bound.
func (b *Broker) ClientURL() string { return b.tcpURL }

// WebSocketURL is the WebSocket address (ws://host:port), with the port
// actually bound.
func (b *Broker) WebSocketURL() string { return b.wsURL }

// Trust is the trust chain the broker was started with.
func (b *Broker) Trust() *creds.Trust { return b.trust }

// System is the broker's own system-account connection (the fence watches
// the server's events on it). Closed by Shutdown; do not close it.
func (b *Broker) System() *nats.Conn { return b.sys }

// Healthy reports whether the bus is usable: the server runs and the
// broker's own system connection to it is up.
func (b *Broker) Healthy() bool {
	return b.ns != nil && b.ns.Running() && b.sys != nil && b.sys.IsConnected()
}

// ConnectService returns an in-process connection to the mesh account as a
// "service" user allowed to publish and subscribe everywhere in it: the
// identity of the workers. Its JWT never leaves the process.
func (b *Broker) ConnectService(name string, opts ...nats.Option) (*nats.Conn, error) {
	svc, err := b.trust.MintServiceUser(name)
	if err != nil {
		return nil, err
	}
	// Service replies arrive under the services' prefix, which no client
	// credential may subscribe (docs/security.md).
	return b.connect(svc, name, append([]nats.Option{creds.ServiceInbox()}, opts...)...)
}

// ConnectSystem returns an in-process connection to the system account, for
// broker administration (account updates, server events).
func (b *Broker) ConnectSystem(name string, opts ...nats.Option) (*nats.Conn, error) {
	c, err := b.trust.MintSystemUser(name)
	if err != nil {
		return nil, err
	}
	return b.connect(c, name, opts...)
}

// connect dials the broker in-process (no TCP, but the same authentication).
func (b *Broker) connect(c creds.UserCreds, name string, opts ...nats.Option) (*nats.Conn, error) {
	all := append([]nats.Option{
		nats.InProcessServer(b.ns),
		nats.Name(name),
		c.NATSOption(),
	}, opts...)
	nc, err := nats.Connect("", all...)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", name, err)
	}
	return nc, nil
}

// ErrUnchanged, returned by an UpdateMeshAccount edit, says it changed
// nothing: no update is signed or pushed.
var ErrUnchanged = errors.New("the account claims are unchanged")

// UpdateMeshAccount applies edit to the mesh account's current claims, signs
// them with the operator key and pushes them to the broker, which applies them
// at once (revoked keys are disconnected). Updates are serialised.
func (b *Broker) UpdateMeshAccount(ctx context.Context, edit func(*jwt.AccountClaims) error) error {
	b.accountMu.Lock()
	defer b.accountMu.Unlock()
	meshPub := b.trust.PublicKeys().MeshAccount
	current, err := b.dirRes.LoadAcc(meshPub)
	if err != nil {
		return fmt.Errorf("update mesh account: load current jwt: %w", err)
	}
	claims, err := jwt.DecodeAccountClaims(current)
	if err != nil {
		return fmt.Errorf("update mesh account: decode current jwt: %w", err)
	}
	if err := edit(claims); errors.Is(err, ErrUnchanged) {
		return nil
	} else if err != nil {
		return fmt.Errorf("update mesh account: %w", err)
	}
	updated, err := b.trust.EncodeAccount(claims)
	if err != nil {
		return fmt.Errorf("update mesh account: %w", err)
	}
	if err := creds.PushAccountJWT(ctx, b.sys, updated); err != nil {
		return fmt.Errorf("update mesh account: %w", err)
	}
	return nil
}

// Shutdown stops the broker and waits for it, JetStream flush included.
// Stopping thousands of durable consumers takes a while (about 10 ms each);
// a caller with a deadline runs it on a goroutine (devenv.Mesh.Shutdown).
// It is safe to call more than once.
func (b *Broker) Shutdown() {
	b.shutdownOnce.Do(func() {
		close(b.stopFlush)
		if b.sys != nil {
			b.sys.Close()
		}
		if b.ns != nil {
			// The server closes the resolver it was given.
			b.ns.Shutdown()
			b.ns.WaitForShutdown()
			b.nslog.violations.flush()
			return
		}
		if b.dirRes != nil {
			b.dirRes.Close()
		}
	})
}

// Kill stops the server without closing the broker's own connections, as a
// crashed broker would: for tests of what its clients do then.
func (b *Broker) Kill() {
	b.ns.Shutdown()
	b.ns.WaitForShutdown()
}
