// Package node is the agent runtime library: a Node holds one connection to
// the mesh with one credential and hosts agents on it. It registers them
// (with a vouch signed by the node key), serves their inboxes (accept signal,
// handler, bare or Task-mode answers, streaming, cancel), drains their
// offline mailboxes, lets them call other agents, publishes heartbeats, and
// renews the node credential and the vouches before they run out.
//
// Every envelope goes through shared/protocol: protocol.Inbox runs the whole
// receive order before a handler sees anything, protocol.Preflight refuses
// locally before a request is signed and sent, and the accept, cancel and
// budget shapes come from there too. docs/runtime.md describes the choices.
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// Credential is the connection credential: a user JWT and the signer of the
// broker's nonce. For a node credential (POST /v1/node-credential) the
// signer is the node key (keys.Node.SignNonce); for a bootstrap credential
// it is the credential's own key.
type Credential struct {
	JWT  string
	Sign func(nonce []byte) ([]byte, error)
}

// Renewer obtains a fresh node credential for the hosted agents.
// NodeCredentialRenewer is the HTTP implementation.
type Renewer interface {
	Renew(ctx context.Context, agents []*keys.Agent) (jwt string, expiresAt time.Time, err error)
}

// Config is what Start needs.
type Config struct {
	// NATSURL is the broker (mesh_tcp_url or mesh_ws_url).
	NATSURL string
	// NodeKey is the node's identity: it signs vouches and heartbeats, and
	// the nonce of a node credential.
	NodeKey *keys.Node
	// Credential connects the node.
	Credential Credential
	// Renewer renews the credential at two thirds of its lifetime; nil
	// means no renewal.
	Renewer Renewer
	// Log receives the runtime's logs; nil discards them.
	Log *slog.Logger
	// Now is the clock of every schedule and freshness check; nil is
	// time.Now.
	Now func() time.Time
	// Journal remembers answered requests across restarts; nil keeps them
	// in memory only (NewMemJournal). A long-lived node wants a FileJournal.
	Journal Journal
	// Health receives the credential and vouch health whenever it changes.
	Health func(Health)
	// Warn is the security warning sink: "vouch_renewal_failed",
	// "credential_renewal_failed", "credential_revoked", "inbound_oversize",
	// "inbound_decode", "inbound_freshness", "inbound_address",
	// "inbound_hops". Without it the warnings are only logged.
	Warn func(Warning)
	// HeartbeatEvery (30 s), DrainEvery (60 s), RequestTimeout (30 s).
	HeartbeatEvery time.Duration
	DrainEvery     time.Duration
	RequestTimeout time.Duration
	// CheckEvery is how often the renewal deadlines are compared with Now
	// (1 minute).
	CheckEvery time.Duration
	// ServicesKey, when set, pins the key the bus workers sign with: a
	// registry answer signed by any other key is refused.
	ServicesKey string
	// Name names the connection in the broker's listings.
	Name string
	// NATSOptions are added to the connection options (TLS, dialers).
	NATSOptions []nats.Option
	// InboxPrefix is the reply prefix the credential may subscribe (the
	// inbox_prefix of its answer). Empty means the one the credential's JWT
	// grants (ReplyPrefixOf), or NATS's default _INBOX when it grants none
	// (a credential with only the shared _INBOX.> grant).
	InboxPrefix string
	// Profile is what the node declares of itself in the node object of
	// every registration it makes; mesh.registry.nodes.list shows it.
	Profile Profile
}

// Profile is a node's self-description (docs/bus-registry.md "Nodes
// list"). Empty members are not declared. A trust tier is not declared
// here: the registry decides sandbox, and any other tier is the agent's
// claim (AgentConfig has none).
type Profile struct {
	Role         string // what the node is for, free text
	Reachability string // how it is reached, e.g. "direct" or "relay"
	// Capacity is how many tasks the node takes at once; 0 is not declared.
	// It is also reported in every heartbeat.
	Capacity int
	// Device: kind (laptop, server, phone, …), host name and platform
	// (GOOS/GOARCH), each at most 80 bytes.
	Device Device
}

// Device is the device fields of a node profile.
type Device struct {
	Kind, Host, Platform string
}

// nodeObject is the node member of a manifest: the node id, the vouch and
// the declared profile.
func (p Profile) nodeObject(id string, v protocol.Vouch) map[string]any {
	m := map[string]any{"id": id, "attestation": v}
	if p.Role != "" {
		m["role"] = p.Role
	}
	if p.Reachability != "" {
		m["reachability"] = p.Reachability
	}
	if p.Capacity > 0 {
		m["capacity"] = p.Capacity
	}
	d := map[string]any{}
	for k, v := range map[string]string{"kind": p.Device.Kind, "host": p.Device.Host, "platform": p.Device.Platform} {
		if v != "" {
			d[k] = v
		}
	}
	if len(d) > 0 {
		m["device"] = d
	}
	return m
}

// Warning is one security warning.
type Warning struct {
	Code    string
	Agent   string // the agent concerned; "" for the node
	Message string
	Err     error
	// Envelope is the verified envelope an inbound refusal concerns, when
	// there is one.
	Envelope *protocol.Envelope
}

// Health is the credential and vouch health of a node (spec §6).
type Health struct {
	Node       string
	Connected  bool
	Credential CredentialHealth
	// Vouch is each hosted agent's vouch, by agent id.
	Vouch map[string]VouchHealth
}

// CredentialHealth describes the connection credential. Zero ExpiresAt
// and RenewAt mean the credential does not expire.
type CredentialHealth struct {
	ExpiresAt time.Time
	RenewAt   time.Time
	Expired   bool
	LastError string
	// Revoked is set when the mesh refused a renewal: the node stopped
	// renewing.
	Revoked bool
}

// VouchHealth describes one agent's vouch.
type VouchHealth struct {
	ExpiresAt time.Time
	RenewAt   time.Time
	LastError string
}

// Defaults.
const (
	DefaultHeartbeatEvery = 30 * time.Second
	DefaultDrainEvery     = 60 * time.Second
	DefaultRequestTimeout = 30 * time.Second
	DefaultCheckEvery     = time.Minute
	// RenewRetry is the pause between renewal attempts in the last third.
	RenewRetry = time.Hour
)

// Node is one connection to the mesh hosting agents. It is safe for
// concurrent use.
type Node struct {
	cfg     Config
	id      string
	log     *slog.Logger
	journal Journal
	nc      *nats.Conn
	started time.Time

	ctx    context.Context
	cancel context.CancelFunc
	loops  sync.WaitGroup

	credMu sync.RWMutex
	cred   Credential
	cs     credState

	// renewMu makes renewals and roster changes one at a time: RenewNow
	// and the schedule hold it while they read the roster and renew, Host
	// from its duplicate check through the renewal that adds its agent to
	// the insertion and registration. Order: renewMu, then mu or credMu.
	renewMu sync.Mutex

	mu     sync.Mutex
	agents map[string]*Agent
	closed bool

	// Replies to this node's requests arrive on respPrefix + <request id>.
	respPrefix string
	pendMu     sync.Mutex
	pending    map[string]*waiter

	// Publishes made while a forced reconnect is under way are recorded
	// and sent again once the connection is back (renew).
	pubMu     sync.RWMutex
	recording bool
	recMu     sync.Mutex
	recorded  []*nats.Msg

	// testPublishErr, set only by tests, fails the publishes it returns an
	// error for.
	testPublishErr atomic.Pointer[func(*nats.Msg) error]
}

type credState struct {
	issued, expires, renewAt time.Time
	lastAttempt              time.Time
	lastErr                  string
	revoked                  bool
	claims                   *jwt.UserClaims
}

// Start connects the node. The connection reconnects forever; after every
// reconnect the hosted agents' mailboxes are drained.
func Start(ctx context.Context, cfg Config) (*Node, error) {
	switch {
	case cfg.NATSURL == "":
		return nil, errors.New("node: NATSURL is required")
	case cfg.NodeKey == nil:
		return nil, errors.New("node: NodeKey is required")
	case cfg.Credential.JWT == "" || cfg.Credential.Sign == nil:
		return nil, errors.New("node: Credential needs both JWT and Sign")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.HeartbeatEvery <= 0 {
		cfg.HeartbeatEvery = DefaultHeartbeatEvery
	}
	if cfg.DrainEvery <= 0 {
		cfg.DrainEvery = DefaultDrainEvery
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	if cfg.CheckEvery <= 0 {
		cfg.CheckEvery = DefaultCheckEvery
	}
	if cfg.Name == "" {
		cfg.Name = "mesh-node " + cfg.NodeKey.Public()
	}
	n := &Node{
		cfg:     cfg,
		id:      cfg.NodeKey.Public(),
		log:     cfg.Log.With("node", cfg.NodeKey.Public()),
		journal: cfg.Journal,
		agents:  map[string]*Agent{},
		pending: map[string]*waiter{},
		started: cfg.Now(),
	}
	if n.journal == nil {
		n.journal = NewMemJournal(cfg.Now)
	}
	if err := n.setCredential(cfg.Credential); err != nil {
		return nil, err
	}
	if cfg.InboxPrefix == "" {
		cfg.InboxPrefix = ReplyPrefixOf(n.cs.claims)
	}
	var inbox []nats.Option
	if cfg.InboxPrefix != "" {
		// Every reply this node receives (request answers, mailbox
		// fetches) arrives under its own prefix, which no other credential
		// may subscribe (docs/security.md).
		inbox = append(inbox, nats.CustomInboxPrefix(cfg.InboxPrefix))
	}
	n.cfg.InboxPrefix = cfg.InboxPrefix
	opts := append([]nats.Option{
		nats.Name(cfg.Name),
		nats.UserJWT(n.userJWT, n.signNonce),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(500 * time.Millisecond),
		// A first connection gets 5 s rather than nats.go's 2: a busy
		// machine answering slowly is not a mesh that is down, and the
		// person reads "is meshd running?" on a timeout.
		nats.Timeout(ConnectTimeout),
		// An expired credential is refused until it is renewed; keep trying,
		// the renewal loop supplies the new JWT to the next attempt.
		nats.IgnoreAuthErrorAbort(),
		nats.ReconnectHandler(func(*nats.Conn) { n.onReconnect() }),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			n.log.Info("disconnected", "err", err)
			n.reportHealth()
		}),
		nats.ErrorHandler(func(_ *nats.Conn, s *nats.Subscription, err error) {
			subj := ""
			if s != nil {
				subj = s.Subject
			}
			n.log.Warn("connection error", "subject", subj, "err", err)
		}),
	}, append(inbox, cfg.NATSOptions...)...)
	nc, err := nats.Connect(cfg.NATSURL, opts...)
	if err != nil {
		return nil, fmt.Errorf("node: connect: %w", err)
	}
	n.nc = nc
	n.respPrefix = nc.NewInbox() + "."
	if _, err := nc.Subscribe(n.respPrefix+"*", n.onReplyMsg); err != nil {
		nc.Close()
		return nil, fmt.Errorf("node: reply subscription: %w", err)
	}
	fctx, fcancel := context.WithTimeout(ctx, 10*time.Second)
	err = nc.FlushWithContext(fctx)
	fcancel()
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("node: connect: %w", err)
	}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.loops.Add(2)
	go n.heartbeatLoop()
	go n.checkLoop()
	return n, nil
}

// ID is the node's public key.
func (n *Node) ID() string { return n.id }

// Conn is the node's connection, for calls the runtime does not wrap.
func (n *Node) Conn() *nats.Conn { return n.nc }

func (n *Node) now() time.Time { return n.cfg.Now() }

func (n *Node) userJWT() (string, error) {
	n.credMu.RLock()
	defer n.credMu.RUnlock()
	return n.cred.JWT, nil
}

func (n *Node) signNonce(nonce []byte) ([]byte, error) {
	n.credMu.RLock()
	sign := n.cred.Sign
	n.credMu.RUnlock()
	return sign(nonce)
}

// setCredential installs c and recomputes the renewal point from the JWT's
// own issued-at and expiry.
func (n *Node) setCredential(c Credential) error {
	claims, err := jwt.DecodeUserClaims(c.JWT)
	if err != nil {
		return fmt.Errorf("node: credential JWT: %w", err)
	}
	n.credMu.Lock()
	defer n.credMu.Unlock()
	n.cred = c
	n.cs.claims = claims
	n.cs.issued = time.Unix(claims.IssuedAt, 0)
	n.cs.expires, n.cs.renewAt = time.Time{}, time.Time{}
	if claims.Expires > 0 {
		n.cs.expires = time.Unix(claims.Expires, 0)
		n.cs.renewAt = twoThirds(n.cs.issued, n.cs.expires)
	}
	return nil
}

// twoThirds is the renewal point of a lifetime (spec §3.3, §8).
func twoThirds(from, to time.Time) time.Time {
	return from.Add(to.Sub(from) * 2 / 3)
}

// covers reports whether the current credential lets agent's inbox be
// subscribed. A JWT without an explicit allow list inherits the account's
// defaults and covers everything.
func (n *Node) covers(agent string) bool {
	n.credMu.RLock()
	defer n.credMu.RUnlock()
	c := n.cs.claims
	if c == nil || len(c.Sub.Allow) == 0 {
		return true
	}
	return slices.Contains([]string(c.Sub.Allow), protocol.InboxSubject(agent))
}

// Health is the current credential and vouch health.
func (n *Node) Health() Health {
	now := n.now()
	n.credMu.RLock()
	h := Health{Node: n.id, Connected: n.nc != nil && n.nc.IsConnected(), Credential: CredentialHealth{
		ExpiresAt: n.cs.expires, RenewAt: n.cs.renewAt, LastError: n.cs.lastErr, Revoked: n.cs.revoked,
		Expired: !n.cs.expires.IsZero() && now.After(n.cs.expires),
	}}
	n.credMu.RUnlock()
	h.Vouch = map[string]VouchHealth{}
	for _, a := range n.hosted() {
		h.Vouch[a.id] = a.vouchHealth()
	}
	return h
}

func (n *Node) reportHealth() {
	if n.cfg.Health != nil {
		n.cfg.Health(n.Health())
	}
}

func (n *Node) warn(w Warning) {
	n.log.Warn("security warning", "code", w.Code, "agent", w.Agent, "msg", w.Message, "err", w.Err)
	if n.cfg.Warn != nil {
		n.cfg.Warn(w)
	}
}

// hosted lists the hosted agents.
func (n *Node) hosted() []*Agent {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]*Agent, 0, len(n.agents))
	for _, a := range n.agents {
		out = append(out, a)
	}
	slices.SortFunc(out, func(x, y *Agent) int { return compareStrings(x.id, y.id) })
	return out
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Agent returns a hosted agent by id.
func (n *Node) Agent(id string) *Agent {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.agents[id]
}

// settleDrain is when the second drain after a reconnect runs: the broker
// stores published messages asynchronously, so mail sent in the last
// moments of the gap may not be in the stream yet when the first drain
// reads its bound.
const settleDrain = time.Second

func (n *Node) onReconnect() {
	n.log.Info("reconnected")
	for _, a := range n.hosted() {
		a.kickDrain()
		time.AfterFunc(settleDrain, a.kickDrain)
	}
	n.heartbeat("online")
	n.reportHealth()
}

// heartbeatLoop emits a heartbeat every HeartbeatEvery.
func (n *Node) heartbeatLoop() {
	defer n.loops.Done()
	n.heartbeat("online")
	t := time.NewTicker(n.cfg.HeartbeatEvery)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
			n.heartbeat("online")
		}
	}
}

// heartbeat emits one signed heartbeat on mesh.heartbeat.<node>: payload
// {availability, agents, active_tasks, uptime_seconds, capacity?} (bus.md).
func (n *Node) heartbeat(availability string) {
	ids := []string{}
	active := 0
	for _, a := range n.hosted() {
		ids = append(ids, a.id)
		active += a.activeTasks()
	}
	up := int64(n.now().Sub(n.started) / time.Second)
	if up < 0 {
		up = 0
	}
	beat := map[string]any{"availability": availability, "agents": ids, "active_tasks": active, "uptime_seconds": up}
	if c := n.cfg.Profile.Capacity; c > 0 {
		beat["capacity"] = c
	}
	e, err := protocol.New(protocol.TypeEmit, n.id, beat)
	if err == nil {
		err = e.Sign(n.cfg.NodeKey)
	}
	var b []byte
	if err == nil {
		b, err = e.Marshal()
	}
	if err == nil {
		err = n.publish(protocol.HeartbeatSubject(n.id), b)
	}
	if err != nil {
		n.log.Warn("heartbeat", "err", err)
	}
}

// checkLoop compares the renewal deadlines with Now every CheckEvery.
func (n *Node) checkLoop() {
	defer n.loops.Done()
	t := time.NewTicker(n.cfg.CheckEvery)
	defer t.Stop()
	for {
		select {
		case <-n.ctx.Done():
			return
		case <-t.C:
			n.checkDeadlines()
		}
	}
}

func (n *Node) checkDeadlines() {
	now := n.now()
	n.credMu.RLock()
	cs := n.cs
	n.credMu.RUnlock()
	if n.cfg.Renewer != nil && !cs.revoked && !cs.renewAt.IsZero() && !now.Before(cs.renewAt) &&
		(cs.lastAttempt.IsZero() || now.Sub(cs.lastAttempt) >= RenewRetry) && len(n.hosted()) > 0 {
		ctx, cancel := context.WithTimeout(n.ctx, RenewTimeout+30*time.Second)
		if err := n.RenewNow(ctx); err != nil {
			n.log.Warn("credential renewal", "err", err)
		}
		cancel()
	}
	for _, a := range n.hosted() {
		a.maybeRevouch(now)
	}
}

// Close leaves the mesh: a last heartbeat says "offline", running handlers'
// contexts are canceled and the connection closes. Registrations stay (the
// registry reclaims them by its own rules); Agent.Deregister removes one.
func (n *Node) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	agents := make([]*Agent, 0, len(n.agents))
	for _, a := range n.agents {
		agents = append(agents, a)
	}
	n.mu.Unlock()
	// The loops stop first, so no periodic "online" beat can follow the
	// "offline" one (seen under -race with a 50 ms heartbeat).
	n.cancel()
	n.loops.Wait()
	if n.nc.IsConnected() {
		n.heartbeat("offline")
	}
	for _, a := range agents {
		a.stop()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_ = n.nc.FlushWithContext(ctx)
	cancel()
	n.nc.Close()
	return nil
}

// publish sends data on subject. (A request carries a Nats-Msg-Id for the
// mailbox's dedupe and is published by Agent.Request itself.)
func (n *Node) publish(subject string, data []byte) error {
	return n.publishMsg(&nats.Msg{Subject: subject, Data: data})
}

// publishMsg publishes m, and remembers it while a forced reconnect is in
// progress (see renew).
func (n *Node) publishMsg(m *nats.Msg) error {
	n.pubMu.RLock()
	if n.recording {
		n.recMu.Lock()
		n.recorded = append(n.recorded, m)
		n.recMu.Unlock()
	}
	err := n.failPublish(m)
	if err == nil && len(m.Data) > n.maxPayload() {
		// Over the credential's own limit (a guest's is smaller than the
		// transport's): the broker would close the connection for it.
		err = nats.ErrMaxPayload
	}
	if err == nil {
		err = n.nc.PublishMsg(m)
	}
	n.pubMu.RUnlock()
	switch {
	case errors.Is(err, nats.ErrMaxPayload):
		// Data and headers together are over the limit: no retry will help.
		limit := n.maxPayload()
		return errs.Wrap(errs.ContextTooLarge, fmt.Sprintf("the message on %s is over the transport maximum of %d bytes; send large content by reference", m.Subject, limit), err).
			WithDetails(map[string]any{"limit": "transport_max_payload", "max_payload_bytes": limit})
	case err != nil:
		return errs.Wrap(errs.TransportTimeout, "publish on "+m.Subject+" failed", err)
	}
	return nil
}

// maxPayload is the largest message this node may publish: the broker's
// maximum, or the credential's own limit when that is smaller (guest and
// unowned credentials carry one, creds.ClassLimits).
func (n *Node) maxPayload() int {
	limit := int(n.nc.MaxPayload())
	n.credMu.RLock()
	defer n.credMu.RUnlock()
	if c := n.cs.claims; c != nil && c.Limits.Payload > 0 && int(c.Limits.Payload) < limit {
		limit = int(c.Limits.Payload)
	}
	return limit
}

// failPublish is the tests' way to make a publish fail (testPublishErr).
func (n *Node) failPublish(m *nats.Msg) error {
	if f := n.testPublishErr.Load(); f != nil {
		return (*f)(m)
	}
	return nil
}

// startRecording makes every later publish remembered; every earlier one
// has been handed to the connection when it returns.
func (n *Node) startRecording() {
	n.pubMu.Lock()
	n.recording = true
	n.pubMu.Unlock()
}

// stopRecording returns what was published since startRecording.
func (n *Node) stopRecording() []*nats.Msg {
	n.pubMu.Lock()
	n.recording = false
	n.pubMu.Unlock()
	n.recMu.Lock()
	defer n.recMu.Unlock()
	out := n.recorded
	n.recorded = nil
	return out
}
