package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/creds"
)

// Member is a broker's place in a JetStream cluster: the cluster's name,
// its own route listener and every member's route URL.
type Member struct {
	// ClusterName names the cluster; every member has the same.
	ClusterName string
	// RouteAddr is this member's route listener (host:port, a fixed port:
	// the other members route to it).
	RouteAddr string
	// Routes are the route URLs (nats-route://host:port) of every member,
	// this one included (a server skips a route to itself). The server sizes
	// the JetStream meta group by them, so a member that starts first waits
	// for a quorum instead of electing itself.
	Routes []string
	// ResolverSync is how often the members' account resolvers compare
	// their directories and take each other's newer account JWTs
	// (DefaultResolverSync when zero).
	ResolverSync time.Duration
	// MeshAccountJWT and SystemAccountJWT, when set, are stored as the two
	// accounts' JWTs before the server starts. When empty, the member keeps
	// the JWT it has stored (a restart), which must exist.
	//
	// A member never signs an account JWT itself, unlike a lone broker. A
	// JWT it signed would be newer than every other member's, and the
	// resolvers would hand it to the whole cluster at their next sync: a
	// mesh account JWT without the revocations the member missed while it
	// was down would undo them everywhere, and a system account JWT would
	// be applied again to every member's running system account for
	// nothing. StartCluster signs one of each for all members.
	MeshAccountJWT, SystemAccountJWT string
}

// DefaultResolverSync is how often cluster members compare their account
// JWTs: a member that was down when an account update was pushed takes it
// from the others within this long of its return (nats-server's own
// default, when a configuration's resolver block sets no interval, is a
// minute).
const DefaultResolverSync = 2 * time.Second

func (m *Member) resolverSync() time.Duration {
	if m.ResolverSync > 0 {
		return m.ResolverSync
	}
	return DefaultResolverSync
}

// apply sets the cluster listener and routes on the server's options.
func (m *Member) apply(opts *server.Options) error {
	if m.ClusterName == "" || m.RouteAddr == "" || len(m.Routes) == 0 {
		return errors.New("a cluster name, a route address and the members' routes are required")
	}
	host, portStr, err := net.SplitHostPort(m.RouteAddr)
	if err != nil {
		return fmt.Errorf("route address: %w", err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port <= 0 {
		return fmt.Errorf("route address %q: a fixed port is required", m.RouteAddr)
	}
	opts.Cluster = server.ClusterOpts{Name: m.ClusterName, Host: host, Port: port}
	opts.Routes = server.RoutesFromStr(strings.Join(m.Routes, ","))
	return nil
}

// storeMemberAccountJWTs stores the account JWTs the member was given, or
// checks that it has its own.
func (b *Broker) storeMemberAccountJWTs(m *Member) error {
	pk := b.trust.PublicKeys()
	for _, a := range []struct{ name, key, jwt string }{
		{"system", pk.SystemAccount, m.SystemAccountJWT},
		{"mesh", pk.MeshAccount, m.MeshAccountJWT},
	} {
		if a.jwt != "" {
			if err := b.dirRes.SaveAcc(a.key, a.jwt); err != nil {
				return fmt.Errorf("broker: store %s account jwt: %w", a.name, err)
			}
			continue
		}
		stored, err := b.dirRes.LoadAcc(a.key)
		if err != nil || stored == "" {
			return fmt.Errorf("broker: cluster member %s has no %s account jwt stored: %w", b.cfg.Name, a.name, err)
		}
	}
	return nil
}

// MeshAccountClaims are the mesh account's claims as this broker's
// resolver holds them now (with their revocations).
func (b *Broker) MeshAccountClaims() (*jwt.AccountClaims, error) {
	stored, err := b.dirRes.LoadAcc(b.trust.PublicKeys().MeshAccount)
	if err != nil {
		return nil, fmt.Errorf("mesh account jwt: %w", err)
	}
	return jwt.DecodeAccountClaims(stored)
}

// ServerName is the name the broker's server goes by in the cluster and in
// stream info.
func (b *Broker) ServerName() string { return b.cfg.Name }

// ClusterConfig is what StartCluster needs. Zero ports are random free
// loopback ports, chosen once: a member restarted later listens on the
// same ones, with the same data directory.
type ClusterConfig struct {
	// Size is the number of servers (3 when zero). A JetStream cluster of
	// three keeps working with one server down.
	Size int
	// DataDir holds one directory per member, <DataDir>/<Name>-<i>, each
	// laid out as a lone broker's (nats/accounts, jetstream).
	DataDir string
	// Trust is the trust chain every member trusts.
	Trust *creds.Trust
	// Name names the cluster; member i is <Name>-<i> (DefaultName).
	Name string
	// Host is where every listener binds (127.0.0.1 when empty).
	Host string
	// NATSPort, when not zero, is member 0's client port, member i's being
	// NATSPort+i; WSPort likewise for the WebSocket listeners.
	NATSPort, WSPort int
	// ResolverSync is the members' account resolver sync interval
	// (DefaultResolverSync when zero).
	ResolverSync time.Duration
	// Logger receives every member's logs (with "server": its name); nil
	// discards them.
	Logger *slog.Logger
	// ReadyTimeout bounds how long StartCluster and Restart wait (30 s
	// when zero).
	ReadyTimeout time.Duration
}

// memberAddrs are the listeners of one member, fixed at StartCluster.
type memberAddrs struct {
	name             string
	dir              string
	nats, ws, route  string
	clientURL, wsURL string
	routeURL         string
}

// Cluster is a JetStream cluster of brokers in this process, all in
// operator mode with the full directory resolver, for devenv, meshd
// --cluster, tests and meshbench. Members can be killed and restarted one
// at a time. It is safe for concurrent use.
type Cluster struct {
	cfg     ClusterConfig
	log     *slog.Logger
	members []memberAddrs

	mu      sync.Mutex
	servers []*Broker // nil while a member is down

	// sys is the cluster's own system-account connection, over TCP to
	// every member, so it outlives any one of them.
	sys *nats.Conn

	// accountMu makes account pushes one at a time; pending are the edits
	// waiting for the next push (UpdateMeshAccount).
	accountMu    sync.Mutex
	pendMu       sync.Mutex
	pending      []*pendingEdit
	shutdownOnce sync.Once
}

// StartCluster starts cfg.Size brokers as one JetStream cluster and
// returns once every member accepts connections and the mesh account has
// JetStream. Every member starts with the same mesh account JWT, signed
// now from this code's definition with the revocations of every member's
// stored JWT, so a cluster restarted whole keeps what any member knew.
func StartCluster(ctx context.Context, cfg ClusterConfig) (*Cluster, error) {
	if cfg.DataDir == "" || cfg.Trust == nil {
		return nil, errors.New("broker: a data directory and a trust chain are required")
	}
	if cfg.Size <= 0 {
		cfg.Size = 3
	}
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = 30 * time.Second
	}
	c := &Cluster{cfg: cfg, log: cfg.Logger, servers: make([]*Broker, cfg.Size)}
	if err := c.assignAddrs(); err != nil {
		return nil, err
	}
	meshJWT, err := c.unionMeshAccountJWT()
	if err != nil {
		return nil, err
	}
	sysJWT, err := cfg.Trust.SystemAccountJWT()
	if err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	for i := range c.members {
		b, err := c.startMember(ctx, i, accountJWTs{mesh: meshJWT, system: sysJWT})
		if err != nil {
			c.Shutdown()
			return nil, err
		}
		c.servers[i] = b
	}
	if err := c.connectSystem(); err != nil {
		c.Shutdown()
		return nil, err
	}
	if err := c.waitJetStream(ctx); err != nil {
		c.Shutdown()
		return nil, err
	}
	c.log.Info("cluster ready", "cluster", cfg.Name, "servers", cfg.Size, "urls", c.ClientURL())
	return c, nil
}

// assignAddrs fixes every member's listeners: the configured ports, or
// free loopback ports picked now.
func (c *Cluster) assignAddrs() error {
	n := c.cfg.Size
	// Random ports are taken by listening on port 0 and closing again; all
	// are held open together so no two members get the same one.
	var free []int
	want := n // routes
	if c.cfg.NATSPort == 0 {
		want += n
	}
	if c.cfg.WSPort == 0 {
		want += n
	}
	var lns []net.Listener
	for range want {
		ln, err := net.Listen("tcp", net.JoinHostPort(c.cfg.Host, "0"))
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return fmt.Errorf("broker: pick a free port: %w", err)
		}
		lns = append(lns, ln)
		free = append(free, ln.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range lns {
		l.Close()
	}
	take := func() int { p := free[0]; free = free[1:]; return p }
	for i := range n {
		m := memberAddrs{name: fmt.Sprintf("%s-%d", c.cfg.Name, i)}
		m.dir = filepath.Join(c.cfg.DataDir, m.name)
		natsPort, wsPort := c.cfg.NATSPort+i, c.cfg.WSPort+i
		if c.cfg.NATSPort == 0 {
			natsPort = take()
		}
		if c.cfg.WSPort == 0 {
			wsPort = take()
		}
		routePort := take()
		m.nats = net.JoinHostPort(c.cfg.Host, strconv.Itoa(natsPort))
		m.ws = net.JoinHostPort(c.cfg.Host, strconv.Itoa(wsPort))
		m.route = net.JoinHostPort(c.cfg.Host, strconv.Itoa(routePort))
		m.clientURL = "nats://" + AdvertiseAddr(c.cfg.Host, natsPort)
		m.wsURL = "ws://" + AdvertiseAddr(c.cfg.Host, wsPort)
		m.routeURL = "nats-route://" + AdvertiseAddr(c.cfg.Host, routePort)
		c.members = append(c.members, m)
	}
	return nil
}

// unionMeshAccountJWT signs the mesh account from this code's definition
// with every revocation any member has stored.
func (c *Cluster) unionMeshAccountJWT() (string, error) {
	pk := c.cfg.Trust.PublicKeys()
	claims := c.cfg.Trust.MeshAccountClaims()
	for _, m := range c.members {
		stored, err := readStoredJWT(filepath.Join(m.dir, filepath.FromSlash(AccountsDir)), pk.MeshAccount)
		if err != nil || stored == "" {
			continue // a new member, or nothing readable: nothing to carry over
		}
		prev, err := jwt.DecodeAccountClaims(stored)
		if err != nil || prev.Issuer != pk.Operator {
			c.log.Warn("a member's stored mesh account jwt is unreadable or from another operator; not carried over", "server", m.name)
			continue
		}
		for key, at := range prev.Revocations {
			if cur, ok := claims.Revocations[key]; !ok || at > cur {
				claims.RevokeAt(key, time.Unix(at, 0))
			}
		}
	}
	signed, err := c.cfg.Trust.EncodeAccount(claims)
	if err != nil {
		return "", fmt.Errorf("broker: %w", err)
	}
	return signed, nil
}

// readStoredJWT reads an account's JWT from a resolver directory that no
// server has open.
func readStoredJWT(dir, account string) (string, error) {
	if _, err := os.Stat(dir); err != nil {
		return "", err
	}
	st, err := server.NewDirJWTStore(dir, false, false)
	if err != nil {
		return "", err
	}
	defer st.Close()
	return st.LoadAcc(account)
}

// accountJWTs are the account JWTs a member starts with; an empty one is
// the member's own stored JWT.
type accountJWTs struct{ mesh, system string }

// member is member i's broker configuration.
func (c *Cluster) member(i int, jwts accountJWTs) Config {
	m := c.members[i]
	routes := make([]string, len(c.members))
	for j, o := range c.members {
		routes[j] = o.routeURL
	}
	return Config{DataDir: m.dir, Trust: c.cfg.Trust, NATSAddr: m.nats, WSAddr: m.ws, Name: m.name,
		Logger: c.log.With("server", m.name), ReadyTimeout: c.cfg.ReadyTimeout,
		Cluster: &Member{ClusterName: c.cfg.Name, RouteAddr: m.route, Routes: routes,
			ResolverSync: c.cfg.ResolverSync, MeshAccountJWT: jwts.mesh, SystemAccountJWT: jwts.system}}
}

func (c *Cluster) startMember(ctx context.Context, i int, jwts accountJWTs) (*Broker, error) {
	if err := os.MkdirAll(c.members[i].dir, 0o700); err != nil {
		return nil, fmt.Errorf("broker: %w", err)
	}
	b, err := Start(ctx, c.member(i, jwts))
	if err != nil {
		return nil, fmt.Errorf("broker: start %s: %w", c.members[i].name, err)
	}
	return b, nil
}

// connectSystem opens the cluster's own system connection.
func (c *Cluster) connectSystem() error {
	sysCreds, err := c.cfg.Trust.MintSystemUser(c.cfg.Name + "-cluster-system")
	if err != nil {
		return fmt.Errorf("broker: %w", err)
	}
	c.sys, err = c.dial(sysCreds, c.cfg.Name+"-cluster-system")
	if err != nil {
		return fmt.Errorf("broker: cluster system connection: %w", err)
	}
	return nil
}

// waitJetStream waits until the members have elected a meta leader and the
// mesh account's JetStream answers.
func (c *Cluster) waitJetStream(ctx context.Context) error {
	nc, err := c.ConnectService(c.cfg.Name + "-startup-check")
	if err != nil {
		return fmt.Errorf("broker: mesh account connection: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("broker: jetstream: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ReadyTimeout)
	defer cancel()
	for {
		actx, acancel := context.WithTimeout(ctx, time.Second)
		_, err := js.AccountInfo(actx)
		acancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("broker: the cluster's JetStream did not answer within %s: %w", c.cfg.ReadyTimeout, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Size is the number of members.
func (c *Cluster) Size() int { return len(c.members) }

// ClientURLs are the members' TCP addresses (nats://host:port).
func (c *Cluster) ClientURLs() []string {
	out := make([]string, len(c.members))
	for i, m := range c.members {
		out[i] = m.clientURL
	}
	return out
}

// ClientURL is every member's TCP address, comma-separated: the form
// nats.Connect and every client of the mesh takes a server list in.
func (c *Cluster) ClientURL() string { return strings.Join(c.ClientURLs(), ",") }

// WebSocketURLs are the members' WebSocket addresses.
func (c *Cluster) WebSocketURLs() []string {
	out := make([]string, len(c.members))
	for i, m := range c.members {
		out[i] = m.wsURL
	}
	return out
}

// WebSocketURL is every member's WebSocket address, comma-separated.
func (c *Cluster) WebSocketURL() string { return strings.Join(c.WebSocketURLs(), ",") }

// Trust is the trust chain the cluster was started with.
func (c *Cluster) Trust() *creds.Trust { return c.cfg.Trust }

// Server is member i while it runs, nil while it is down.
func (c *Cluster) Server(i int) *Broker {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.servers[i]
}

// ServerName is member i's server name (as stream info names peers).
func (c *Cluster) ServerName(i int) string { return c.members[i].name }

// Running counts the members that are up.
func (c *Cluster) Running() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, b := range c.servers {
		if b != nil && b.ns.Running() {
			n++
		}
	}
	return n
}

// Healthy reports whether the bus is usable: a majority of the members
// runs and the cluster's system connection is up.
func (c *Cluster) Healthy() bool {
	return c.Running() > len(c.members)/2 && c.sys != nil && c.sys.IsConnected()
}

// System is the cluster's system-account connection (over TCP to every
// member; it reconnects to another when its server goes). Closed by
// Shutdown; do not close it.
func (c *Cluster) System() *nats.Conn { return c.sys }

// ConnectService connects to the mesh account as a "service" user (the
// identity of the workers, broker.Broker.ConnectService) over TCP with
// every member's address, reconnecting to another member, without limit,
// when its server goes.
func (c *Cluster) ConnectService(name string, opts ...nats.Option) (*nats.Conn, error) {
	svc, err := c.cfg.Trust.MintServiceUser(name)
	if err != nil {
		return nil, err
	}
	return c.dial(svc, name, append([]nats.Option{creds.ServiceInbox()}, opts...)...)
}

// ConnectSystem connects to the system account over TCP to every member.
func (c *Cluster) ConnectSystem(name string, opts ...nats.Option) (*nats.Conn, error) {
	u, err := c.cfg.Trust.MintSystemUser(name)
	if err != nil {
		return nil, err
	}
	return c.dial(u, name, opts...)
}

// ReconnectWait is how long a cluster connection waits between attempts
// on the same server; it tries the others in between.
const ReconnectWait = 250 * time.Millisecond

func (c *Cluster) dial(u creds.UserCreds, name string, opts ...nats.Option) (*nats.Conn, error) {
	all := append([]nats.Option{
		nats.Name(name),
		u.NATSOption(),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(ReconnectWait),
		// A write to a member that just went away fails asynchronously;
		// the connection reconnects to another. Logged, not printed.
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			c.log.Debug("cluster connection error", "conn", name, "err", err)
		}),
	}, opts...)
	nc, err := nats.Connect(c.ClientURL(), all...)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", name, err)
	}
	return nc, nil
}

// UpdateMeshAccount applies edit to the mesh account's newest claims among
// the running members, signs them and pushes them once; every running
// member takes the update (their resolvers all subscribe the update
// subject), and a member that is down takes it from the others at its
// first resolver sync after it returns.
//
// The members' resolvers keep, of two JWTs, the one issued later, and
// take either when both were issued in the same second (a JWT's issue time
// has whole seconds), so two updates in one second could each win on some
// members and undo each other at every sync. Every push is therefore
// issued in a later second than the JWT it replaces, and the edits of
// callers that arrive while one push waits for that second go out
// together in the next one: concurrent revocations cost one push, not one
// second each.
func (c *Cluster) UpdateMeshAccount(ctx context.Context, edit func(*jwt.AccountClaims) error) error {
	p := &pendingEdit{edit: edit, done: make(chan error, 1)}
	c.pendMu.Lock()
	c.pending = append(c.pending, p)
	c.pendMu.Unlock()

	c.accountMu.Lock()
	defer c.accountMu.Unlock()
	select {
	case err := <-p.done: // pushed by the caller that held the lock before
		return err
	default:
	}
	c.pendMu.Lock()
	batch := c.pending
	c.pending = nil
	c.pendMu.Unlock()
	errs := c.pushEdits(ctx, batch)
	for i, q := range batch {
		q.done <- errs[i]
	}
	return <-p.done
}

// pendingEdit is one caller's edit waiting for a push.
type pendingEdit struct {
	edit func(*jwt.AccountClaims) error
	done chan error
}

// pushEdits applies the edits in order, signs once and pushes; it returns
// each edit's outcome. An edit that fails is left out of the push (the
// claims are decoded again without it); one that returns ErrUnchanged
// succeeds without a push, as on one broker (Broker.UpdateMeshAccount).
func (c *Cluster) pushEdits(ctx context.Context, batch []*pendingEdit) []error {
	errs := make([]error, len(batch))
	fail := func(err error) []error {
		for i := range errs {
			if errs[i] == nil {
				errs[i] = fmt.Errorf("update mesh account: %w", err)
			}
		}
		return errs
	}
	current, err := c.newestMeshAccount()
	if err != nil {
		return fail(err)
	}
	claims := current
	changed := false
	for i, p := range batch {
		before, err := cloneClaims(claims)
		if err != nil {
			return fail(err)
		}
		switch err := p.edit(claims); {
		case errors.Is(err, ErrUnchanged):
			// As on one broker: nothing to push for it, and no error.
			claims = before
		case err != nil:
			errs[i] = fmt.Errorf("update mesh account: %w", err)
			claims = before
		default:
			changed = true
		}
	}
	if !changed {
		return errs
	}
	// Issued in a later second than the JWT it replaces (see above).
	for time.Now().Unix() <= current.IssuedAt {
		wait := time.Until(time.Unix(current.IssuedAt+1, 0))
		select {
		case <-ctx.Done():
			return fail(ctx.Err())
		case <-time.After(wait):
		}
	}
	updated, err := c.cfg.Trust.EncodeAccount(claims)
	if err != nil {
		return fail(err)
	}
	if err := creds.PushAccountJWT(ctx, c.sys, updated); err != nil {
		return fail(err)
	}
	return errs
}

// cloneClaims copies claims through their JSON form.
func cloneClaims(ac *jwt.AccountClaims) (*jwt.AccountClaims, error) {
	b, err := json.Marshal(ac)
	if err != nil {
		return nil, err
	}
	var out jwt.AccountClaims
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// newestMeshAccount is the mesh account as the running member with the
// newest JWT holds it: a member that missed an update has an older one.
func (c *Cluster) newestMeshAccount() (*jwt.AccountClaims, error) {
	c.mu.Lock()
	running := make([]*Broker, 0, len(c.servers))
	for _, b := range c.servers {
		if b != nil {
			running = append(running, b)
		}
	}
	c.mu.Unlock()
	var newest *jwt.AccountClaims
	var firstErr error
	for _, b := range running {
		ac, err := b.MeshAccountClaims()
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		if newest == nil || ac.IssuedAt > newest.IssuedAt {
			newest = ac
		}
	}
	if newest == nil {
		if firstErr == nil {
			firstErr = errors.New("no member is running")
		}
		return nil, firstErr
	}
	return newest, nil
}

// Kill stops member i at once: its clients' connections drop and they
// reconnect to the others, which elect new leaders for whatever it led.
// In this process that is the server's own shutdown (which first steps
// down from what it leads and flushes its files); a crash of the whole
// process is what the reliability suite's SIGKILL test covers.
func (c *Cluster) Kill(i int) error {
	c.mu.Lock()
	b := c.servers[i]
	c.servers[i] = nil
	c.mu.Unlock()
	if b == nil {
		return fmt.Errorf("broker: %s is not running", c.members[i].name)
	}
	b.Shutdown()
	c.log.Info("cluster member stopped", "server", c.members[i].name)
	return nil
}

// Restart starts member i again on its ports and data directory and
// returns once it accepts connections. It keeps the mesh account JWT it
// stored: an update pushed while it was down reaches it from the others
// at its first resolver sync (ClusterConfig.ResolverSync), which also
// disconnects any revoked credential that connected to it meanwhile. A
// member whose directory lost its JWT starts with the newest a running
// member holds.
func (c *Cluster) Restart(ctx context.Context, i int) error {
	c.mu.Lock()
	up := c.servers[i] != nil
	c.mu.Unlock()
	if up {
		return fmt.Errorf("broker: %s is already running", c.members[i].name)
	}
	// Its own stored JWTs, or (a directory that lost them) the newest a
	// running member holds, never freshly signed ones (Member).
	var jwts accountJWTs
	pk := c.cfg.Trust.PublicKeys()
	dir := filepath.Join(c.members[i].dir, filepath.FromSlash(AccountsDir))
	if stored, err := readStoredJWT(dir, pk.MeshAccount); err != nil || stored == "" {
		ac, err := c.newestMeshAccount()
		if err != nil {
			return fmt.Errorf("broker: restart %s: it has no mesh account jwt and no member has one: %w", c.members[i].name, err)
		}
		if jwts.mesh, err = c.cfg.Trust.EncodeAccount(ac); err != nil {
			return fmt.Errorf("broker: restart %s: %w", c.members[i].name, err)
		}
	}
	if stored, err := readStoredJWT(dir, pk.SystemAccount); err != nil || stored == "" {
		if jwts.system, err = c.runningSystemJWT(); err != nil {
			return fmt.Errorf("broker: restart %s: it has no system account jwt and no member has one: %w", c.members[i].name, err)
		}
	}
	b, err := c.startMember(ctx, i, jwts)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.servers[i] = b
	c.mu.Unlock()
	c.log.Info("cluster member restarted", "server", c.members[i].name)
	return nil
}

// runningSystemJWT is the system account JWT a running member holds.
func (c *Cluster) runningSystemJWT() (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, b := range c.servers {
		if b == nil {
			continue
		}
		if j, err := b.dirRes.LoadAcc(c.cfg.Trust.PublicKeys().SystemAccount); err == nil && j != "" {
			return j, nil
		}
	}
	return "", errors.New("no member is running")
}

// Shutdown stops every member and the cluster's connection. It is safe to
// call more than once.
func (c *Cluster) Shutdown() {
	c.shutdownOnce.Do(func() {
		if c.sys != nil {
			c.sys.Close()
		}
		c.mu.Lock()
		servers := append([]*Broker(nil), c.servers...)
		c.mu.Unlock()
		// Stopping members one after another lets each hand its leaderships
		// to the others; all at once, each waits on the others' elections.
		for _, b := range servers {
			if b != nil {
				b.Shutdown()
			}
		}
	})
}

// Routes counts the broker's open routes to other servers.
func (b *Broker) Routes() int { return b.ns.NumRoutes() }
