package node

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// Offering is one thing the agent does (manifest offerings[]).
type Offering struct {
	ID, Name, Description   string
	InputModes, OutputModes []string
	Tags                    []string
}

// Limits are the agent's declared inbound limits.
type Limits struct {
	// MaxInboundChars is limits.max_inbound_chars: nil is the protocol
	// default (65,536 UTF-16 code units), 0 declares no cap.
	MaxInboundChars *int
}

// Handler serves one admitted request. It answers through c (Reply, Fail,
// StartTask). Returning an error without having answered fails the request
// with it; returning nil without answering fails it with INTERNAL_ERROR
// ("handler returned without answering"). After StartTask the task is the
// handler's: returning nil leaves it running (deferred work), returning an
// error fails it.
type Handler func(ctx context.Context, c *Call) error

// AdmitFunc is budget admission, run before the accept. It returns nil to
// admit, or the refusal that replaces the accept: build it with
// protocol.BudgetInsufficient or protocol.DeadlineUnmeetable. An attended
// inbox returns Hold(inboxID) instead, having kept the request: the sender
// gets the queued acknowledgement rather than an accept, no handler runs,
// and the answer comes later through AnswerHeld or RefuseHeld.
type AdmitFunc func(ctx context.Context, c *Call, budget *protocol.Budget) error

// AgentConfig describes a hosted agent.
type AgentConfig struct {
	Key                *keys.Agent
	Name, Description  string
	Version            string
	Capabilities, Tags []string
	Offerings          []Offering
	Limits             Limits
	Visibility         string // public | unlisted | private
	AvailabilityClass  string // always_on | intermittent | on_demand
	Meta               map[string]any
	Sandbox            bool // a guest: no mailbox
	Guarded            bool // serve the guarded inbox (the admission service relays)
	Handler            Handler
	Admit              AdmitFunc
	// OnReply receives answers addressed to this agent that no Request is
	// waiting for any more: late replies, answers drained from a mailbox,
	// answers to requests sent before a restart.
	OnReply func(*Result)
	// MaxConcurrent bounds the live requests handled at once (256); beyond
	// it a request is refused with AGENT_OVERLOADED instead of accepted.
	MaxConcurrent int
	// RoomInvite answers the reserved offering rooms.invite (a room
	// invite, upstream-notes §7) before admission and without an accept,
	// like describe: its output is the answer, its error the refusal. nil
	// answers OFFERING_NOT_FOUND. adapter/rooms.Store.AcceptInvite
	// remembers the room.
	RoomInvite func(ctx context.Context, c *Call) (any, error)
	// Owner is the key of the person or account the agent belongs to.
	// When set, every registration carries owner and owner_attestation,
	// a vouch-shaped statement it signs for the vouch's own lifetime and
	// renews with it; without it the registry records the node as the
	// owner (docs/commerce.md "SKUs in the manifest and the owner of an
	// agent"). Agreements to the agent's SKUs are made with this key.
	Owner keys.Signer
	// SKUs are what the agent sells (manifest skus), published as they
	// were parsed: every offering one names must be one of Offerings, and a
	// sandbox agent may publish only free ones.
	// An agent with any SKU asks the agreements service at admission,
	// before the accept, whether each request may proceed.
	SKUs []commerce.SKU
}

// OfferingRoomsInvite is the reserved offering of room invites: the runtime
// answers it (AgentConfig.RoomInvite), never the handler.
const OfferingRoomsInvite = "rooms.invite"

// Vouch lifetimes (upstream-notes §2.1).
const (
	VouchLifetime           = 30 * 24 * time.Hour
	VouchLifetimeUndeclared = 72 * time.Hour
)

// Agent is a hosted agent.
type Agent struct {
	n       *Node
	key     *keys.Agent
	id      string
	cfg     AgentConfig
	sandbox bool
	inbox   *protocol.Inbox // requests: the full receive order
	replies *protocol.Inbox // responds: the same order without the sender-text cap
	sem     chan struct{}
	work    chan *Call // to an idle serving goroutine (dispatch)
	// copies are the accepts' outbox copies waiting for an answer's
	// (answerAccept); nil once the agent stops.
	copyMu   sync.Mutex
	copies   map[*Call]acceptCopy
	manifest map[string]any
	// skus are the manifest's SKUs as registered, parsed once (commerceAdmit).
	skus sells

	ctx    context.Context
	cancel context.CancelFunc
	loops  sync.WaitGroup
	kick   chan struct{}

	drainMu sync.Mutex   // one drain at a time
	drains  atomic.Int64 // drains run by the loop
	// captured counts messages taken live at the inbox (countCaptured).
	captured atomic.Int64
	triesMu  sync.Mutex
	tries    map[uint64]int // failed tries of mailbox messages, by sequence

	mu  sync.Mutex
	sub *nats.Subscription
	// answerSub is a guarded agent's subscription on its public inbox,
	// where protocol 0.3 performers send the answers to its requests
	// (upstream-notes §15); requests there go through the admission
	// service instead.
	answerSub *nats.Subscription
	guarded   bool
	vouch     protocol.Vouch
	vs        vouchState
	tasks     map[string]*Task     // performer side, live and recently finished
	finished  map[string]time.Time // performer side: when a task ended
	// Caller side: the performer of each task this agent requested, at
	// most maxKnownTasks of them (knownOrder is the order they came in,
	// for eviction), and the open task handles, closed when the agent
	// stops.
	known      map[string]string
	knownOrder []string
	handles    map[*TaskHandle]struct{}
}

type vouchState struct {
	issued, expires, renewAt time.Time
	lastAttempt              time.Time
	lastErr                  string
}

// Host registers an agent and starts serving it: a fresh vouch, the
// register call, the inbox subscription and (unless sandboxed) the mailbox
// drain. If the credential does not cover the agent and a Renewer is set,
// the credential is renewed first with the agent on its roster. A refusal
// of that renewal fails this Host only (the error wraps the *ErrRevoked):
// the roster refused is not the one the node holds, so the credential of
// the agents already hosted, and its renewal schedule, are left as they
// were.
func (n *Node) Host(ctx context.Context, cfg AgentConfig) (*Agent, error) {
	if err := checkAgentConfig(cfg); err != nil {
		return nil, err
	}
	a := n.newAgent(cfg)
	// Everything that changes the roster happens under renewMu, which every
	// renewal also holds: a renewal is built from a roster no Host is
	// halfway through changing, and no renewal's forced reconnect cuts this
	// Host's own calls short.
	n.renewMu.Lock()
	defer n.renewMu.Unlock()
	if err := n.admit(ctx, a); err != nil {
		a.stop()
		return nil, err
	}
	if err := a.register(ctx); err != nil {
		a.unhost()
		return nil, err
	}
	if !a.sandbox {
		a.loops.Add(1)
		go a.drainLoop()
	}
	n.heartbeat("online")
	n.reportHealth()
	return a, nil
}

// newAgent builds the hosted agent's state; nothing is on the wire yet.
func (n *Node) newAgent(cfg AgentConfig) *Agent {
	if cfg.MaxConcurrent <= 0 {
		cfg.MaxConcurrent = 256
	}
	id := cfg.Key.Public()
	a := &Agent{
		n: n, key: cfg.Key, id: id, cfg: cfg, sandbox: cfg.Sandbox, guarded: cfg.Guarded,
		sem:    make(chan struct{}, cfg.MaxConcurrent),
		work:   make(chan *Call),
		copies: map[*Call]acceptCopy{},
		kick:   make(chan struct{}, 1),
		tasks:  map[string]*Task{}, known: map[string]string{}, finished: map[string]time.Time{},
		handles: map[*TaskHandle]struct{}{},
	}
	a.ctx, a.cancel = context.WithCancel(n.ctx)
	dedup := protocol.NewDedupMemory(0)
	limit := 0
	if cfg.Limits.MaxInboundChars != nil {
		limit = *cfg.Limits.MaxInboundChars
		if limit == 0 {
			limit = protocol.NoCap
		}
	}
	a.inbox = &protocol.Inbox{Self: id, Dedup: dedup, MaxInboundChars: limit, Now: n.cfg.Now, Warn: a.inboundWarning}
	a.replies = &protocol.Inbox{Self: id, Dedup: dedup, MaxInboundChars: protocol.NoCap, Now: n.cfg.Now, Warn: a.inboundWarning}
	return a
}

// admit adds a to the roster: the duplicate check, the renewal that puts
// it on the credential when the credential does not cover it, its inbox
// subscription and its place in n.agents. The caller holds renewMu, so the
// check and the insertion cannot be interleaved with another Host.
func (n *Node) admit(ctx context.Context, a *Agent) error {
	if err := n.hostable(a.id); err != nil {
		return err
	}
	if !n.covers(a.id) {
		if n.cfg.Renewer == nil {
			return fmt.Errorf("node: the credential does not cover agent %s; mint one that does", a.id)
		}
		if err := n.renewLocked(ctx, append(n.rosterKeys(), a.key), false); err != nil {
			return fmt.Errorf("node: adding agent %s to the credential: %w", a.id, err)
		}
	}
	// Subscribe before registering, so a request sent the moment the
	// registration lands is served live.
	if err := a.subscribe(); err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return errors.New("node: closed")
	}
	n.agents[a.id] = a
	return nil
}

// hostable refuses an agent already hosted, or a closed node.
func (n *Node) hostable(id string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return errors.New("node: closed")
	}
	if _, dup := n.agents[id]; dup {
		return fmt.Errorf("node: agent %s is already hosted", id)
	}
	return nil
}

func checkAgentConfig(cfg AgentConfig) error {
	switch {
	case cfg.Key == nil:
		return errors.New("node: AgentConfig.Key is required")
	case cfg.Name == "":
		return errors.New("node: AgentConfig.Name is required")
	case cfg.Handler == nil:
		return errors.New("node: AgentConfig.Handler is required")
	}
	seen := map[string]bool{}
	for _, o := range cfg.Offerings {
		switch {
		case o.ID == "":
			return errors.New("node: every offering needs an id")
		case o.ID == protocol.OfferingTaskCancel || o.ID == protocol.OfferingDescribe || o.ID == OfferingRoomsInvite:
			return fmt.Errorf("node: offering %q is reserved; the runtime answers it", o.ID)
		case seen[o.ID]:
			return fmt.Errorf("node: offering %q declared twice", o.ID)
		}
		seen[o.ID] = true
	}
	if err := checkSKUs(cfg, seen); err != nil {
		return err
	}
	switch cfg.Visibility {
	case "", "public", "unlisted", "private":
	default:
		return fmt.Errorf("node: visibility %q is not public, unlisted or private", cfg.Visibility)
	}
	switch cfg.AvailabilityClass {
	case "", "always_on", "intermittent", "on_demand":
	default:
		return fmt.Errorf("node: availability class %q is not always_on, intermittent or on_demand", cfg.AvailabilityClass)
	}
	return nil
}

// checkSKUs refuses, before anything is on the wire, what the registry
// would: SKUs that do not read as a manifest's skus (duplicate ids,
// ambiguous coverage), a SKU naming an offering the agent does not declare,
// and a paid SKU on a sandbox agent.
func checkSKUs(cfg AgentConfig, offered map[string]bool) error {
	if len(cfg.SKUs) == 0 {
		return nil
	}
	if _, err := commerce.SKUsFromValue(skuValues(cfg.SKUs)); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	for _, s := range cfg.SKUs {
		for _, o := range s.Covers.Offerings {
			if !offered[o] {
				return fmt.Errorf("node: SKU %s covers offering %q, which the agent does not declare", s.ID, o)
			}
		}
		if cfg.Sandbox && s.Price.Paid() {
			return fmt.Errorf("node: SKU %s is paid, and a sandbox (guest) agent may not sell; register it with an agent key of your own", s.ID)
		}
	}
	return nil
}

// skuValues is the manifest's skus member: each SKU as published.
func skuValues(skus []commerce.SKU) []any {
	out := make([]any, len(skus))
	for i, s := range skus {
		out[i] = s.Value()
	}
	return out
}

// SKUs are the SKUs the agent publishes (AgentConfig.SKUs); none means
// every offering is free and no admission round trip is owed.
func (a *Agent) SKUs() []commerce.SKU { return a.cfg.SKUs }

// ID is the agent's public key.
func (a *Agent) ID() string { return a.id }

// Node is the hosting node.
func (a *Agent) Node() *Node { return a.n }

// Sandbox reports whether the agent runs without a mailbox (a guest, or
// the registry said so).
func (a *Agent) Sandbox() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.sandbox
}

func (a *Agent) inboxSubject() string {
	if a.guarded {
		return protocol.GuardedInboxSubject(a.id)
	}
	return protocol.InboxSubject(a.id)
}

func (a *Agent) subscribe() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.unsubscribeLocked()
	sub, err := a.subscribeInbox(a.inboxSubject(), a.onInboxMsg, inboxPendingBytes)
	if err != nil {
		return err
	}
	a.sub = sub
	if a.guarded {
		// Answers from a performer outside the roster never pass the
		// admission service; the agent takes them here, live, when they
		// answer one of its waiting requests (receive, answersOnly).
		if a.answerSub, err = a.subscribeInbox(protocol.InboxSubject(a.id), a.onAnswerMsg, answerPendingBytes); err != nil {
			a.unsubscribeLocked()
			return err
		}
	}
	return a.n.nc.Flush()
}

// What an inbox subscription may buffer before the client drops messages
// (a slow consumer): a live inbox, 256 MiB; the public inbox of a guarded
// agent, where only answers to its own waiting calls are taken and anyone
// may publish, 16 MiB.
const (
	inboxPendingBytes  = 256 << 20
	answerPendingBytes = 16 << 20
)

func (a *Agent) subscribeInbox(subject string, cb nats.MsgHandler, pendingBytes int) (*nats.Subscription, error) {
	sub, err := a.n.nc.Subscribe(subject, cb)
	if err != nil {
		return nil, fmt.Errorf("node: subscribe %s: %w", subject, err)
	}
	if err := sub.SetPendingLimits(-1, pendingBytes); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	return sub, nil
}

func (a *Agent) unsubscribeLocked() {
	for _, s := range []**nats.Subscription{&a.sub, &a.answerSub} {
		if *s != nil {
			_ = (*s).Unsubscribe()
			*s = nil
		}
	}
}

// newVouch makes a fresh vouch for the agent: 30 days, 72 h without a
// declared availability class.
func (a *Agent) newVouch() (protocol.Vouch, error) {
	life := VouchLifetime
	if a.cfg.AvailabilityClass == "" {
		life = VouchLifetimeUndeclared
	}
	now := a.n.now()
	return protocol.NewVouch(a.n.cfg.NodeKey, a.id, now, now.Add(life))
}

// trustTierSandbox is the node profile's trust_tier of a guest (the
// registry's TierSandbox).
const trustTierSandbox = "sandbox"

// registerSubject is where an agent registers. A sandbox agent (a guest)
// uses the node-bound mesh.registry.register.<node>: the broker lets a
// guest credential publish only on its own, so the guest key must be the
// node key, and the registry files everything arriving there as a sandbox
// registration (docs/bus-registry.md). Every other agent registers on the
// bare mesh.registry.register, which guests cannot reach.
func (a *Agent) registerSubject() string {
	if a.cfg.Sandbox {
		return protocol.SubjRegister + "." + a.n.id
	}
	return protocol.SubjRegister
}

// ownerAttestation is the owner's statement that it owns the agent, for
// exactly the vouch's lifetime: it is made afresh with every vouch, so it
// is renewed at two thirds of its life with it. Nil without an owner key.
// It is signed under the owner attestation's own tag (protocol.TagOwner),
// never the vouch's.
func (a *Agent) ownerAttestation(v protocol.Vouch) (*protocol.OwnerAttestation, error) {
	if a.cfg.Owner == nil {
		return nil, nil
	}
	issued, err := protocol.ParseTime(v.IssuedAt)
	if err != nil {
		return nil, err
	}
	expires, err := protocol.ParseTime(v.ExpiresAt)
	if err != nil {
		return nil, err
	}
	att, err := protocol.NewOwnerAttestation(a.cfg.Owner, a.id, issued, expires)
	if err != nil {
		return nil, fmt.Errorf("node: owner attestation: %w", err)
	}
	return &att, nil
}

// buildManifest is the register payload (docs/bus.md "Manifest"): v is the
// node's vouch, owner the owner's attestation (nil: none).
func (a *Agent) buildManifest(v protocol.Vouch, owner *protocol.OwnerAttestation) map[string]any {
	offerings := make([]any, 0, len(a.cfg.Offerings))
	for _, o := range a.cfg.Offerings {
		m := map[string]any{"id": o.ID, "name": o.Name}
		if m["name"] == "" {
			m["name"] = o.ID
		}
		if o.Description != "" {
			m["description"] = o.Description
		}
		if len(o.InputModes) > 0 {
			m["input_modes"] = o.InputModes
		}
		if len(o.OutputModes) > 0 {
			m["output_modes"] = o.OutputModes
		}
		if len(o.Tags) > 0 {
			m["tags"] = o.Tags
		}
		offerings = append(offerings, m)
	}
	caps := a.cfg.Capabilities
	if caps == nil {
		caps = []string{}
	}
	m := map[string]any{
		"id":               a.id,
		"name":             a.cfg.Name,
		"protocol_version": protocol.Version,
		"endpoint":         protocol.InboxSubject(a.id),
		"node":             a.n.cfg.Profile.nodeObject(a.n.id, v),
		"capabilities":     caps,
		"offerings":        offerings,
	}
	if a.cfg.Description != "" {
		m["description"] = a.cfg.Description
	}
	if a.cfg.Version != "" {
		m["version"] = a.cfg.Version
	}
	if a.cfg.Limits.MaxInboundChars != nil {
		m["limits"] = map[string]any{"max_inbound_chars": *a.cfg.Limits.MaxInboundChars}
	}
	if a.cfg.Visibility != "" {
		m["visibility"] = a.cfg.Visibility
	}
	if a.cfg.Sandbox {
		// The registry reads a guest's sandbox from its node profile; say
		// it, whatever key this node runs with (spec §5).
		m["trust_tier"] = trustTierSandbox
	}
	if a.cfg.AvailabilityClass != "" {
		m["availability_class"] = a.cfg.AvailabilityClass
	}
	if len(a.cfg.Tags) > 0 {
		m["tags"] = a.cfg.Tags
	}
	if len(a.cfg.Meta) > 0 {
		m["meta"] = a.cfg.Meta
	}
	if owner != nil {
		m["owner"] = owner.Owner()
		m["owner_attestation"] = *owner
	}
	if len(a.cfg.SKUs) > 0 {
		m["skus"] = skuValues(a.cfg.SKUs)
	}
	return m
}

// Manifest is the manifest last registered.
func (a *Agent) Manifest() map[string]any {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.manifest
}

// register makes a fresh vouch and registers the manifest with it.
func (a *Agent) register(ctx context.Context) error {
	v, err := a.newVouch()
	if err != nil {
		return err
	}
	owner, err := a.ownerAttestation(v)
	if err != nil {
		return err
	}
	manifest := a.buildManifest(v, owner)
	ctx, cancel := context.WithTimeout(ctx, a.n.cfg.RequestTimeout)
	defer cancel()
	rep, err := bus.Call(ctx, a.n.nc, a.key, a.registerSubject(), protocol.TypeRegister, "", manifest)
	if err != nil {
		return fmt.Errorf("node: register %s: %w", a.id, err)
	}
	if pin := a.n.cfg.ServicesKey; pin != "" && rep.From != pin {
		return errs.Newf(errs.IdentityMismatch, "node: the registry answer is signed by %s, not the services key", rep.From)
	}
	var out struct {
		Status  string `json:"status"`
		Sandbox bool   `json:"sandbox"`
	}
	if err := rep.DecodePayload(&out); err != nil {
		return err
	}
	if out.Status != "registered" {
		return fmt.Errorf("node: register %s: answered %q", a.id, out.Status)
	}
	issued, _ := protocol.ParseTime(v.IssuedAt)
	expires, _ := protocol.ParseTime(v.ExpiresAt)
	skus := manifestSKUs(manifest)
	a.mu.Lock()
	a.vouch, a.manifest, a.skus = v, manifest, skus
	a.vs = vouchState{issued: issued, expires: expires, renewAt: twoThirds(issued, expires)}
	if out.Sandbox {
		a.sandbox = true
	}
	a.mu.Unlock()
	return nil
}

// RevouchNow re-registers with a fresh vouch. A failure keeps the old
// registration, is reported in Health and to Warn as
// "vouch_renewal_failed", and is retried by the schedule.
func (a *Agent) RevouchNow(ctx context.Context) error {
	err := a.register(ctx)
	if err != nil {
		a.mu.Lock()
		a.vs.lastAttempt, a.vs.lastErr = a.n.now(), err.Error()
		a.mu.Unlock()
		a.n.warn(Warning{Code: "vouch_renewal_failed", Agent: a.id, Message: err.Error(), Err: err})
	}
	a.n.reportHealth()
	return err
}

// vouchRetry is how often a due vouch renewal is retried: a quarter of the
// last third of the lifetime, at most an hour (upstream-notes §2.1).
func (vs vouchState) retry() time.Duration {
	d := vs.expires.Sub(vs.renewAt) / 4
	if d > time.Hour || d <= 0 {
		d = time.Hour
	}
	return d
}

func (a *Agent) maybeRevouch(now time.Time) {
	a.mu.Lock()
	vs := a.vs
	a.mu.Unlock()
	if vs.renewAt.IsZero() || now.Before(vs.renewAt) {
		return
	}
	if !vs.lastAttempt.IsZero() && now.Sub(vs.lastAttempt) < vs.retry() {
		return
	}
	ctx, cancel := context.WithTimeout(a.ctx, a.n.cfg.RequestTimeout)
	defer cancel()
	_ = a.RevouchNow(ctx)
}

func (a *Agent) vouchHealth() VouchHealth {
	a.mu.Lock()
	defer a.mu.Unlock()
	return VouchHealth{ExpiresAt: a.vs.expires, RenewAt: a.vs.renewAt, LastError: a.vs.lastErr}
}

// Vouch is the vouch of the current registration.
func (a *Agent) Vouch() protocol.Vouch {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.vouch
}

// Deregister removes the registration (mesh.registry.deregister, payload
// {agent_id}) and stops hosting the agent. The registry deletes its mailbox.
func (a *Agent) Deregister(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, a.n.cfg.RequestTimeout)
	defer cancel()
	rep, err := bus.Call(ctx, a.n.nc, a.key, protocol.SubjDeregister, protocol.TypeRegister, "", map[string]any{"agent_id": a.id})
	if err != nil {
		return fmt.Errorf("node: deregister %s: %w", a.id, err)
	}
	if s := protocol.ResponseStatus(rep); s != "deregistered" {
		return fmt.Errorf("node: deregister %s: answered %q", a.id, s)
	}
	a.unhost()
	return nil
}

// unhost stops serving the agent without touching its registration.
func (a *Agent) unhost() {
	a.n.mu.Lock()
	if a.n.agents[a.id] == a {
		delete(a.n.agents, a.id)
	}
	a.n.mu.Unlock()
	a.stop()
	a.n.heartbeat("online")
}

func (a *Agent) stop() {
	a.cancel()
	a.flushCopies()
	a.mu.Lock()
	a.unsubscribeLocked()
	handles := make([]*TaskHandle, 0, len(a.handles))
	for h := range a.handles {
		handles = append(handles, h)
	}
	a.mu.Unlock()
	// A handle on a task that never ends would otherwise keep its
	// subscriptions and its goroutine for the life of the process.
	for _, h := range handles {
		h.Close()
	}
	a.loops.Wait()
}

// Guard asks the admission service to guard the agent's inbox (with an
// owner-signed roster, or nil to keep the current one) and, when it answers
// guarded, moves the subscription to the guarded inbox.
func (a *Agent) Guard(ctx context.Context, roster any) (bool, error) {
	payload := map[string]any{}
	if roster != nil {
		payload["roster"] = roster
	}
	return a.setGuard(ctx, protocol.SubjAdmissionGuard, payload, true)
}

// Guarded reports whether the agent serves its guarded inbox (the
// admission service guards its public one).
func (a *Agent) Guarded() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.guarded
}

// Unguard withdraws the guard and moves back to the public inbox.
func (a *Agent) Unguard(ctx context.Context) error {
	_, err := a.setGuard(ctx, protocol.SubjAdmissionUnguard, map[string]any{}, false)
	return err
}

func (a *Agent) setGuard(ctx context.Context, subject string, payload map[string]any, want bool) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, a.n.cfg.RequestTimeout)
	defer cancel()
	rep, err := bus.Call(ctx, a.n.nc, a.key, subject, protocol.TypeRequest, "", payload)
	if err != nil {
		return false, err
	}
	var out struct {
		Output struct {
			OK      bool  `json:"ok"`
			Guarded *bool `json:"guarded"`
		} `json:"output"`
	}
	if err := rep.DecodePayload(&out); err != nil || !out.Output.OK {
		return false, errs.New(errs.Unavailable, "the admission service did not confirm")
	}
	guarded := want
	if out.Output.Guarded != nil {
		guarded = *out.Output.Guarded
	}
	a.mu.Lock()
	changed := a.guarded != guarded
	a.guarded = guarded
	a.mu.Unlock()
	if changed {
		return guarded, a.subscribe()
	}
	return guarded, nil
}

// activeTasks counts running performer tasks. The task list is copied
// first: a task takes its own lock, then the agent's, when it ends.
func (a *Agent) activeTasks() int {
	a.mu.Lock()
	tasks := make([]*Task, 0, len(a.tasks))
	for _, t := range a.tasks {
		tasks = append(tasks, t)
	}
	a.mu.Unlock()
	n := 0
	for _, t := range tasks {
		if !protocol.Terminal(t.State()) {
			n++
		}
	}
	return n
}

// inboundWarning forwards the receive order's local warnings. Duplicates
// are not warnings here: every request answered live comes back once more
// from the mailbox, by design.
func (a *Agent) inboundWarning(code string, r *protocol.Refusal) {
	if r.Stage == "duplicate" {
		return
	}
	a.n.warn(Warning{Code: code, Agent: a.id, Message: r.Err.Message, Err: r, Envelope: r.Env})
}

// offering looks up a declared offering; with none declared, every offering
// is the handler's.
func (a *Agent) offering(id string) (Offering, bool) {
	if len(a.cfg.Offerings) == 0 {
		return Offering{ID: id}, id != ""
	}
	i := slices.IndexFunc(a.cfg.Offerings, func(o Offering) bool { return o.ID == id })
	if i < 0 {
		return Offering{}, false
	}
	return a.cfg.Offerings[i], true
}
