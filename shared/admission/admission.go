// Package admission is the admission service (spec §4.3, upstream-notes
// §6.2, docs/bus.md "Admission"): an agent asks it to guard its inbox; the
// agent's node then takes its requests on mesh.agent.<id>.inbox.guarded
// (and at the public inbox only answers to its own waiting calls), and the
// service takes the public inbox mesh.agent.<id>.inbox for it, applies the
// owner-signed roster and relays the requests it allows. Blocked and held
// senders, and requests the agent is not online for, all get the same
// queued ack, so a sender cannot tell a block from an offline agent.
//
// State lives in JetStream: KV mesh_admission (the guard and the roster, per
// agent) and KV mesh_admission_held (held requests and answers, for the owner). Every
// copy subscribes the public inbox of every guarded agent, and only those,
// in one queue group, so each request is judged and relayed by exactly one
// copy, and the traffic of unguarded agents never reaches the service.
package admission

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/mailbox"
	"agentmesh.dev/mesh/shared/protocol"
)

// Name is the worker's name: micro service mesh-admission, queue group
// bus.QueueGroup(Name) for the endpoints and the inbox relay alike.
const Name = "admission"

// Buckets.
const (
	// Bucket holds one Record per agent id.
	Bucket = "mesh_admission"
	// HeldBucket holds held requests, and answers from senders the roster
	// holds, under <agent>.<envelope id> (7 days).
	HeldBucket = "mesh_admission_held"
	// RegistryBucket is the registry's bucket; a sender with a non-sandbox
	// record there is in the "registered" tier. Bound when it exists.
	RegistryBucket = "mesh_registry"
)

// Reply statuses of guard and unguard, and of the queued ack.
const (
	StatusGuarded   = "guarded"
	StatusUnguarded = "unguarded"
	StatusQueued    = "queued"
)

// QueuedText is the text of every queued ack this service sends. It is the
// same whether the request was held, blocked or not deliverable now.
const QueuedText = "Your message has been queued for the recipient."

// Stances a roster assigns, and the sender tiers.
const (
	StanceAllow = "allow"
	StanceHold  = "hold"
	StanceBlock = "block"

	TierContact    = "contact"
	TierRegistered = "registered"
	TierAnonymous  = "anonymous"
)

// Defaults.
const (
	DefaultRelayTimeout  = 35 * time.Second
	DefaultAnswerTimeout = 10 * time.Minute
	DefaultMaxRelays     = 1024
	// DefaultMaxRelaysPerAgent caps one guarded agent's share of a copy's
	// relays, so one agent's traffic (or a node that accepts and never
	// finishes) cannot take every slot.
	DefaultMaxRelaysPerAgent = 64
	// busyRetryAfter is the retry_after_ms of a refusal for want of a slot.
	busyRetryAfter = 1000
	// HeldTTL is how long a held request is kept for the owner: the
	// mailbox window.
	HeldTTL = 7 * 24 * time.Hour
	// guardTTL bounds how long a copy trusts its cached view of an agent's
	// guard. A KV watch drops cache entries as soon as a copy writes; the
	// TTL is the backstop should the watch lag or break.
	guardTTL = time.Second
	// maxCache bounds the guard cache (it is reset when full).
	maxCache = 100_000
	// inboxQueue bounds the guarded inboxes' messages waiting for the
	// copy's one reader; past it the client drops them as a slow
	// consumer, as it would for a subscription of its own.
	inboxQueue = 64 << 10
	// relayQueue bounds the answers one relay holds unread.
	relayQueue = 8
)

// Config tunes the worker; zero values take the defaults.
type Config struct {
	// RelayTimeout is how long a relay waits for the guarded node's first
	// answer before the sender gets the queued ack (35 s, upstream §6.2).
	RelayTimeout time.Duration
	// AnswerTimeout is how long a relay keeps forwarding after the node
	// answered "accepted" and before its substantive answer (10 min).
	AnswerTimeout time.Duration
	// MaxRelays bounds the relays one copy runs at once (1024). A slot is
	// held from the request until its final answer (up to AnswerTimeout
	// after an accept).
	MaxRelays int
	// MaxRelaysPerAgent bounds the relays one copy runs at once for one
	// guarded agent (64, at most MaxRelays). A message that finds no slot
	// is refused at once with a retryable error: AGENT_OVERLOADED for the
	// agent's cap, UNAVAILABLE for the copy's. The inbox subscription
	// never waits, so one agent cannot stall the others.
	MaxRelaysPerAgent int
	// Replicas of the worker's buckets (bus.Replicas: 0 is 1, one
	// server; the cloud's cluster runs 3, set by the workers table).
	Replicas int
}

// Record is the value stored under an agent id in mesh_admission.
type Record struct {
	Guarded bool `json:"guarded"`
	// Roster is the signed roster exactly as verified at guard time
	// (canonical JSON), or null.
	Roster json.RawMessage `json:"roster"`
	// OwnerKey is the roster's owner_key (recorded, not checked against an
	// account: any valid owner signature is accepted).
	OwnerKey  string `json:"owner_key,omitempty"`
	UpdatedAt string `json:"updated_at"`
	// Box is where the agent's waiting mail was last carried (applyBox):
	// mailbox.BoxOpen (also when empty) or mailbox.BoxGuarded.
	Box string `json:"box,omitempty"`
}

// HasRoster reports whether r carries a roster.
func (r *Record) HasRoster() bool {
	return r != nil && len(r.Roster) > 0 && string(r.Roster) != "null"
}

// Held is the value stored under <agent>.<request id> in mesh_admission_held.
type Held struct {
	Agent      string          `json:"agent"`
	From       string          `json:"from"`
	RequestID  string          `json:"request_id"`
	ReceivedAt string          `json:"received_at"`
	Envelope   json.RawMessage `json:"envelope"`
}

// Stats counts what one copy did with the public-inbox traffic of guarded
// agents.
type Stats struct {
	Relayed uint64 // allowed and passed to the guarded inbox
	Answers uint64 // answers of the guarded node forwarded to senders, and allowed answers passed to it
	Queued  uint64 // queued acks sent (held, blocked or offline)
	Held    uint64 // held requests (and answers) recorded
	Blocked uint64 // blocked requests (and answers) dropped
	Dropped uint64 // undecodable, unsigned or stale: dropped silently
	Busy    uint64 // refused for want of a relay slot (retryable error)
	Seen    uint64 // messages taken at guarded agents' public inboxes
}

// Worker is one running copy of the admission service.
type Worker struct {
	svc      *bus.Service
	cfg      Config
	kv       jetstream.KeyValue
	held     jetstream.KeyValue
	registry bus.LazyBucket
	watch    jetstream.KeyWatcher

	// The public inboxes this copy takes: one queue subscription per
	// guarded agent, all feeding inbox, which one goroutine reads (a
	// subscription of its own per agent would be a goroutine per agent).
	// subsMu orders changes to subs against Stop.
	subsMu sync.Mutex
	subs   map[string]*nats.Subscription
	revs   map[string]uint64 // the guard record revision each agent's subscription follows
	inbox  chan *nats.Msg
	seen   atomic.Uint64

	mu    sync.Mutex
	cache map[string]cached

	// Relay slots of this copy: in flight in all, and per guarded agent.
	// Local bounds on local goroutines; no other copy needs them.
	slotMu   sync.Mutex
	inFlight int
	perAgent map[string]int

	relayMu  sync.Mutex // orders relay starts against Stop
	stopping bool
	ctx      context.Context
	cancel   context.CancelFunc
	done     sync.WaitGroup
	once     sync.Once

	relayed, answers, queued, heldN, blocked, dropped, busy atomic.Uint64
}

type cached struct {
	rec    *Record // nil: not guarded (no record)
	policy policy
	at     time.Time
}

// Start runs one copy of the worker in env: binds the buckets, serves
// mesh.admission.guard and mesh.admission.unguard, and subscribes the
// public inboxes in the worker's queue group.
func Start(ctx context.Context, env bus.Env, cfg Config) (*Worker, error) {
	if cfg.RelayTimeout <= 0 {
		cfg.RelayTimeout = DefaultRelayTimeout
	}
	if cfg.AnswerTimeout <= 0 {
		cfg.AnswerTimeout = DefaultAnswerTimeout
	}
	if cfg.MaxRelays <= 0 {
		cfg.MaxRelays = DefaultMaxRelays
	}
	if cfg.MaxRelaysPerAgent <= 0 {
		cfg.MaxRelaysPerAgent = DefaultMaxRelaysPerAgent
	}
	cfg.MaxRelaysPerAgent = min(cfg.MaxRelaysPerAgent, cfg.MaxRelays)
	svc, err := bus.NewServiceIn(env, Name, "inbox guard, roster admission and relay")
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Worker, error) {
		_ = svc.Stop()
		return nil, err
	}
	kv, err := bus.Bucket(ctx, svc.JS, jetstream.KeyValueConfig{Bucket: Bucket, Description: "admission guard and roster, keyed by agent id",
		Replicas: bus.Replicas(cfg.Replicas)})
	if err != nil {
		return fail(err)
	}
	held, err := bus.Bucket(ctx, svc.JS, jetstream.KeyValueConfig{Bucket: HeldBucket, TTL: HeldTTL, Replicas: bus.Replicas(cfg.Replicas),
		Description: "requests held for the owner, keyed by <agent>.<request id>"})
	if err != nil {
		return fail(err)
	}
	wctx, cancel := context.WithCancel(context.Background())
	w := &Worker{svc: svc, cfg: cfg, kv: kv, held: held, registry: bus.LazyBucket{JS: svc.JS, Bucket: RegistryBucket},
		cache: map[string]cached{}, perAgent: map[string]int{}, ctx: wctx, cancel: cancel,
		subs: map[string]*nats.Subscription{}, revs: map[string]uint64{}, inbox: make(chan *nats.Msg, inboxQueue)}
	if err := svc.Endpoint("guard", protocol.SubjAdmissionGuard, w.guard); err != nil {
		cancel()
		return fail(fmt.Errorf("%s: endpoint: %w", Name, err))
	}
	if err := svc.Endpoint("unguard", protocol.SubjAdmissionUnguard, w.unguard); err != nil {
		cancel()
		return fail(fmt.Errorf("%s: endpoint: %w", Name, err))
	}
	// The watch drops cached guard state the moment any copy writes it,
	// and keeps the inbox subscriptions to the guarded agents: those
	// guarded now first (the initial values), then every change.
	if w.watch, err = kv.WatchAll(ctx); err != nil {
		cancel()
		return fail(fmt.Errorf("%s: watch %s: %w", Name, Bucket, err))
	}
	w.done.Add(1)
	go w.inboxLoop()
	if err := w.follow(ctx, true); err != nil {
		w.Stop()
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	w.done.Add(1)
	go w.watchLoop()
	if err := env.NC.Flush(); err != nil {
		w.Stop()
		return nil, fmt.Errorf("%s: flush: %w", Name, err)
	}
	return w, nil
}

// Stop ends the copy: no more requests are taken, relays in flight are
// abandoned, and the answers stop.
func (w *Worker) Stop() error {
	var err error
	w.once.Do(func() {
		w.subsMu.Lock()
		for _, sub := range w.subs {
			_ = sub.Unsubscribe()
		}
		w.subs = nil // takes no more
		w.subsMu.Unlock()
		err = w.svc.Stop()
		w.relayMu.Lock()
		w.stopping = true
		w.relayMu.Unlock()
		w.cancel()
		if w.watch != nil {
			_ = w.watch.Stop()
		}
		w.done.Wait()
	})
	return err
}

// Stats reports this copy's counters.
func (w *Worker) Stats() Stats {
	return Stats{Relayed: w.relayed.Load(), Answers: w.answers.Load(), Queued: w.queued.Load(),
		Held: w.heldN.Load(), Blocked: w.blocked.Load(), Dropped: w.dropped.Load(), Busy: w.busy.Load(), Seen: w.seen.Load()}
}

// watchLoop follows the guard records after the initial ones.
func (w *Worker) watchLoop() {
	defer w.done.Done()
	_ = w.follow(w.ctx, false)
}

// follow applies guard records from the watch: each drops the agent's
// cached state, and subscribes its public inbox when the record says
// guarded or unsubscribes it otherwise. With initial it returns at the end
// of the records stored when the watch began, else when the worker stops.
func (w *Worker) follow(ctx context.Context, initial bool) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-w.watch.Updates():
			if !ok {
				return nil
			}
			if e == nil {
				if initial {
					return nil
				}
				continue
			}
			w.forget(e.Key())
			var rec Record
			guarded := e.Operation() == jetstream.KeyValuePut && json.Unmarshal(e.Value(), &rec) == nil && rec.Guarded
			if err := w.take(e.Key(), guarded, e.Revision()); err != nil {
				w.svc.Log.Warn("admission inbox", "agent", e.Key(), "err", err)
			}
		}
	}
}

// take subscribes (on) or unsubscribes agent's public inbox in the
// worker's queue group, as the agent's guard record at revision rev says.
// A revision no later than the one last applied is ignored: the watch may
// deliver an unguard after guard() has applied the guard that followed it.
func (w *Worker) take(agent string, on bool, rev uint64) error {
	if !keys.IsUserPublicKey(agent) {
		return nil
	}
	w.subsMu.Lock()
	defer w.subsMu.Unlock()
	if w.subs == nil {
		return nil // stopped
	}
	if rev <= w.revs[agent] {
		return nil
	}
	sub, have := w.subs[agent]
	switch {
	case on && !have:
		sub, err := w.svc.NC.ChanQueueSubscribe(protocol.InboxSubject(agent), bus.QueueGroup(Name), w.inbox)
		if err != nil {
			return fmt.Errorf("subscribe %s: %w", agent, err)
		}
		w.subs[agent] = sub
	case !on && have:
		delete(w.subs, agent)
		if err := sub.Unsubscribe(); err != nil {
			return err
		}
	}
	w.revs[agent] = rev
	return nil
}

// inboxLoop hands every message of the guarded inboxes to onInbox, which
// never waits.
func (w *Worker) inboxLoop() {
	defer w.done.Done()
	for {
		select {
		case <-w.ctx.Done():
			return
		case msg := <-w.inbox:
			w.seen.Add(1)
			w.onInbox(msg)
		}
	}
}

// ---------------------------------------------------------------------------
// guard and unguard

// guard answers mesh.admission.guard: the agent is the verified sender;
// a roster, when given, must verify. Payload {} keeps a stored roster,
// {roster: null} removes it.
func (w *Worker) guard(ctx context.Context, r *bus.Request) (any, error) {
	agent, err := caller(r)
	if err != nil {
		return nil, err
	}
	q := r.Object()
	rosterVal, setRoster := q["roster"]
	var roster json.RawMessage
	var owner string
	if setRoster && rosterVal != nil {
		if roster, owner, err = CheckRoster(rosterVal); err != nil {
			return nil, err
		}
	}
	if sandbox, err := w.isSandbox(ctx, agent); err != nil {
		return nil, err
	} else if sandbox {
		return nil, errs.New(errs.Unauthorized, "a sandbox agent has no mailbox and cannot be guarded")
	}
	now := protocol.FormatTime(w.svc.Now())
	if _, _, err := bus.CAS(ctx, w.kv, agent, func(cur *Record, exists bool) (*Record, error) {
		next := Record{Guarded: true, Roster: json.RawMessage("null"), UpdatedAt: now}
		if exists {
			next.Box = cur.Box
		}
		if exists && cur.HasRoster() {
			next.Roster, next.OwnerKey = cur.Roster, cur.OwnerKey
		}
		if setRoster {
			next.Roster, next.OwnerKey = json.RawMessage("null"), ""
			if roster != nil {
				next.Roster, next.OwnerKey = roster, owner
			}
		}
		if exists && cur.Guarded && sameRoster(cur, &next) {
			return nil, bus.ErrNoChange
		}
		return &next, nil
	}); err != nil {
		return nil, err
	}
	w.forget(agent)
	// This copy takes the agent's public inbox before the node hears it is
	// guarded (and stops taking requests there itself); the other copies
	// follow from the watch.
	rec, rev, err := w.read(ctx, agent)
	if err != nil {
		return nil, err
	}
	if err := w.take(agent, rec != nil && rec.Guarded, rev); err != nil {
		return nil, err
	}
	if err := w.svc.NC.FlushWithContext(ctx); err != nil {
		return nil, fmt.Errorf("%s: subscribe %s: %w", Name, agent, err)
	}
	if err := w.applyBox(ctx, agent); err != nil {
		return nil, err
	}
	return map[string]any{"status": StatusGuarded, "output": map[string]any{"ok": true, "guarded": true}}, nil
}

// unguard answers mesh.admission.unguard: guarded becomes false (the roster
// is kept for a later guard) and the waiting mail goes back to .inbox (applyBox).
func (w *Worker) unguard(ctx context.Context, r *bus.Request) (any, error) {
	agent, err := caller(r)
	if err != nil {
		return nil, err
	}
	now := protocol.FormatTime(w.svc.Now())
	if _, _, err := bus.CAS(ctx, w.kv, agent, func(cur *Record, exists bool) (*Record, error) {
		if !exists || !cur.Guarded {
			return nil, bus.ErrNoChange
		}
		next := *cur
		next.Guarded = false
		next.UpdatedAt = now
		return &next, nil
	}); err != nil {
		return nil, err
	}
	w.forget(agent)
	if err := w.applyBox(ctx, agent); err != nil {
		return nil, err
	}
	return map[string]any{"status": StatusUnguarded, "output": map[string]any{"ok": true, "guarded": false}}, nil
}

func caller(r *bus.Request) (string, error) {
	if r.Env.Type != protocol.TypeRequest {
		return "", errs.New(errs.InvalidEnvelope, "admission takes a request envelope")
	}
	if !keys.IsUserPublicKey(r.Env.From) {
		return "", errs.New(errs.InvalidEnvelope, "from is not an agent key")
	}
	return r.Env.From, nil
}

func sameRoster(a, b *Record) bool {
	return a.HasRoster() == b.HasRoster() && (!a.HasRoster() || string(a.Roster) == string(b.Roster))
}

// CheckRoster verifies a roster (protocol.VerifyRoster: the signature by its
// own owner_key under agentmesh-admission-roster-v1) and its shape: admission
// "v1", defaults and entry stances among allow|hold|block, entries a list. It
// returns the roster's canonical JSON and owner_key.
func CheckRoster(v any) (json.RawMessage, string, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return nil, "", errs.New(errs.InvalidEnvelope, "roster must be an object")
	}
	if err := protocol.VerifyRoster(m); err != nil {
		return nil, "", err
	}
	owner, _ := m["owner_key"].(string)
	if !keys.IsUserPublicKey(owner) {
		return nil, "", errs.New(errs.InvalidEnvelope, "roster owner_key is not a public key")
	}
	if a, _ := m["admission"].(string); a != "v1" {
		return nil, "", errs.New(errs.InvalidEnvelope, `roster admission must be "v1"`)
	}
	if d, present := m["defaults"]; present {
		dm, ok := d.(map[string]any)
		if !ok {
			return nil, "", errs.New(errs.InvalidEnvelope, "roster defaults must be an object")
		}
		for _, tier := range []string{TierContact, TierRegistered, TierAnonymous} {
			if s, present := dm[tier]; present && !validStance(s) {
				return nil, "", errs.Newf(errs.InvalidEnvelope, "roster default for %s must be allow, hold or block", tier)
			}
		}
	}
	if e, present := m["entries"]; present {
		list, ok := e.([]any)
		if !ok {
			return nil, "", errs.New(errs.InvalidEnvelope, "roster entries must be a list")
		}
		for _, it := range list {
			em, ok := it.(map[string]any)
			if !ok {
				return nil, "", errs.New(errs.InvalidEnvelope, "roster entry must be an object")
			}
			if s, _ := em["subject"].(string); s == "" {
				return nil, "", errs.New(errs.InvalidEnvelope, "roster entry needs a subject")
			}
			if !validStance(em["stance"]) {
				return nil, "", errs.New(errs.InvalidEnvelope, "roster entry stance must be allow, hold or block")
			}
		}
	}
	b, err := protocol.Canonical(m)
	if err != nil {
		return nil, "", errs.Wrap(errs.InvalidEnvelope, "roster cannot be canonicalised", err)
	}
	return b, owner, nil
}

func validStance(v any) bool {
	s, _ := v.(string)
	return s == StanceAllow || s == StanceHold || s == StanceBlock
}

// applyBox carries the agent's waiting mail to the inbox subject the
// stored guard says the mailbox worker reads (mailbox.BoxGuarded while
// guarded, else mailbox.BoxOpen), and records in Box where it was carried.
// A missing record is nothing to do. The stored state is read again after
// the move so that two copies racing a guard and an unguard leave the mail
// where the last write says.
//
// The worker reads whichever subject the guard names, from its start, so
// the switch carries the mail across (switchMailbox): on guard, offline
// mail that arrived while the agent was open moves to the guarded subject;
// on unguard, what was published to the open inbox while guarded (blocked
// or held senders, and copies of what was relayed) is purged, and relayed
// mail not yet drained moves to the open inbox.
func (w *Worker) applyBox(ctx context.Context, agent string) error {
	for range 4 {
		rec, _, err := w.read(ctx, agent)
		if err != nil || rec == nil {
			return err
		}
		want := rec.wantBox()
		if rec.box() == want {
			return nil
		}
		if err := w.switchMailbox(ctx, agent, want); err != nil {
			return err
		}
		_, _, err = bus.CAS(ctx, w.kv, agent, func(cur *Record, exists bool) (*Record, error) {
			if !exists || cur.wantBox() != want || cur.box() == want {
				return nil, bus.ErrNoChange // changed meanwhile: look again
			}
			next := *cur
			next.Box = want
			return &next, nil
		})
		if err != nil {
			return err
		}
	}
	return fmt.Errorf("mailbox of %s: guard state keeps changing", agent)
}

// wantBox is where the record's guard state says mail is read from.
func (r *Record) wantBox() string {
	if r.Guarded {
		return mailbox.BoxGuarded
	}
	return mailbox.BoxOpen
}

// box is where the mail was last carried (open when never switched).
func (r *Record) box() string {
	if r.Box == "" {
		return mailbox.BoxOpen
	}
	return r.Box
}

// switchMailbox carries agent's waiting mail to the box want, as applyBox
// says. Every step is idempotent (moved copies carry a Nats-Msg-Id, purges
// are bounded by a sequence), so a copy that fails half way, or two copies
// switching at once, converge.
func (w *Worker) switchMailbox(ctx context.Context, agent, want string) error {
	stream, err := w.svc.JS.Stream(ctx, protocol.MailboxStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("mailbox stream: %w", err)
	}
	last := stream.CachedInfo().State.LastSeq
	if last == 0 {
		return nil
	}
	open, guarded := protocol.InboxSubject(agent), protocol.GuardedInboxSubject(agent)
	src := open
	if want == mailbox.BoxOpen {
		src = guarded
	}
	to := dst(src, open, guarded)
	if want == mailbox.BoxOpen {
		// Unguard: what reached the open inbox while guarded (blocked and
		// held senders, copies of what was relayed) is dropped first, so
		// that it neither reaches the agent nor takes the room the relayed
		// mail moving there needs.
		if err := stream.Purge(ctx, jetstream.WithPurgeSubject(open), jetstream.WithPurgeSequence(last+1)); err != nil {
			return fmt.Errorf("mailbox of %s: purge %s: %w", agent, open, err)
		}
	}
	before, err := storedOn(ctx, stream, to)
	if err != nil {
		return err
	}
	// Waiting mail keeps its delivery.
	moved, err := w.moveMail(ctx, src, to, 1, last)
	if err != nil {
		return err
	}
	// The stream discards new mail past its bounds (per box and in all), so
	// the copies are counted before their originals go: a box that could not
	// take them all keeps its originals (the mailbox worker reads the box
	// the mail was carried to, and the agent's journal drops whatever it
	// reads twice).
	if moved > 0 && !waitStored(ctx, stream, to, before+uint64(moved)) {
		w.svc.Log.Warn("mailbox switch: the other box did not take every copy; the originals stay", "agent", agent, "moved", moved)
		return nil
	}
	if err := stream.Purge(ctx, jetstream.WithPurgeSubject(src), jetstream.WithPurgeSequence(last+1)); err != nil {
		return fmt.Errorf("mailbox of %s: purge %s: %w", agent, src, err)
	}
	return nil
}

// storedOn is how many messages the stream holds on subject.
func storedOn(ctx context.Context, stream jetstream.Stream, subject string) (uint64, error) {
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return 0, fmt.Errorf("mailbox stream info: %w", err)
	}
	return info.State.Subjects[subject], nil
}

// waitStored waits (a few seconds at most) until the stream holds at least
// n messages on subject: a no-ack stream stores what it is sent
// asynchronously.
func waitStored(ctx context.Context, stream jetstream.Stream, subject string, n uint64) bool {
	deadline := time.Now().Add(3 * time.Second)
	for {
		if got, err := storedOn(ctx, stream, subject); err == nil && got >= n {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dst is the other one of open and guarded.
func dst(src, open, guarded string) string {
	if src == open {
		return guarded
	}
	return open
}

// moveMail republishes the messages stored on subject src with sequence in
// [from, to] onto dst, unchanged (they are signed envelopes). The copies are
// deduplicated by the stream on moved:<dst>:<sequence>.
func (w *Worker) moveMail(ctx context.Context, src, dst string, from, to uint64) (int, error) {
	if to < from {
		return 0, nil
	}
	cons, err := w.svc.JS.OrderedConsumer(ctx, protocol.MailboxStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{src}, DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: from})
	if err != nil {
		return 0, fmt.Errorf("mailbox: read %s: %w", src, err)
	}
	if ci := cons.CachedInfo(); ci != nil && ci.NumPending == 0 {
		return 0, nil
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(100))
	if err != nil {
		return 0, fmt.Errorf("mailbox: read %s: %w", src, err)
	}
	defer it.Stop()
	moved := 0
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return moved, fmt.Errorf("mailbox: read %s: %w", src, err)
		}
		meta, err := m.Metadata()
		if err != nil {
			return moved, fmt.Errorf("mailbox: read %s: %w", src, err)
		}
		if meta.Sequence.Stream > to {
			return moved, w.svc.NC.FlushWithContext(ctx)
		}
		msg := &nats.Msg{Subject: dst, Data: m.Data(), Header: nats.Header{}}
		msg.Header.Set(nats.MsgIdHdr, fmt.Sprintf("moved:%s:%d", dst, meta.Sequence.Stream))
		if err := w.svc.NC.PublishMsg(msg); err != nil {
			return moved, fmt.Errorf("mailbox: move to %s: %w", dst, err)
		}
		moved++
		if meta.Sequence.Stream >= to || meta.NumPending == 0 {
			return moved, w.svc.NC.FlushWithContext(ctx)
		}
	}
}

// read returns the stored record (nil when none) and its revision.
func (w *Worker) read(ctx context.Context, agent string) (*Record, uint64, error) {
	r, rev, found, err := bus.GetJSONRev[Record](ctx, w.kv, agent)
	switch {
	case err != nil && found:
		return nil, 0, fmt.Errorf("kv %s: decode %s: %w", Bucket, agent, err)
	case err != nil:
		return nil, 0, fmt.Errorf("kv %s: get %s: %w", Bucket, agent, err)
	case !found:
		return nil, 0, nil
	}
	return &r, rev, nil
}

// ---------------------------------------------------------------------------
// The guard cache

// lookup returns the guard state of agent, from the cache when fresh.
func (w *Worker) lookup(ctx context.Context, agent string) (cached, error) {
	now := time.Now()
	w.mu.Lock()
	c, ok := w.cache[agent]
	w.mu.Unlock()
	if ok && now.Sub(c.at) < guardTTL {
		return c, nil
	}
	rec, _, err := w.read(ctx, agent)
	if err != nil {
		return cached{}, err
	}
	c = cached{rec: rec, at: now}
	if rec != nil && rec.Guarded {
		c.policy = policyOf(rec)
	}
	w.mu.Lock()
	if len(w.cache) >= maxCache {
		clear(w.cache)
	}
	w.cache[agent] = c
	w.mu.Unlock()
	return c, nil
}

func (w *Worker) forget(agent string) {
	w.mu.Lock()
	delete(w.cache, agent)
	w.mu.Unlock()
}

// ---------------------------------------------------------------------------
// The registry, bound when it exists

// registration is the part of a registry record admission reads.
type registration struct {
	Sandbox   bool   `json:"sandbox"`
	TrustTier string `json:"trust_tier"`
}

// registered reports whether agent has a registry record, and whether it is
// a sandbox one.
func (w *Worker) registered(ctx context.Context, agent string) (found, sandbox bool, err error) {
	kv, err := w.registry.Get(ctx)
	if err != nil || kv == nil {
		return false, false, err
	}
	reg, found, err := bus.GetJSON[registration](ctx, kv, agent)
	if err != nil || !found {
		return false, false, err
	}
	return true, reg.Sandbox || reg.TrustTier == "sandbox", nil
}

func (w *Worker) isSandbox(ctx context.Context, agent string) (bool, error) {
	_, sandbox, err := w.registered(ctx, agent)
	return sandbox, err
}

// ---------------------------------------------------------------------------
// Roster policy

// policy is a roster reduced to what admission needs.
type policy struct {
	entries  map[string]string // sender key → stance
	defaults map[string]string // tier → stance
}

// Without a roster: registered senders are relayed (upstream c07 describes
// registered→relay) and anonymous ones blocked.
var noRoster = map[string]string{TierContact: StanceAllow, TierRegistered: StanceAllow, TierAnonymous: StanceBlock}

// A roster's missing defaults take the fixture's (contact→allow,
// registered→hold, anonymous→block).
var rosterDefaults = map[string]string{TierContact: StanceAllow, TierRegistered: StanceHold, TierAnonymous: StanceBlock}

// A stored roster that no longer verifies is replaced by the safe defaults:
// hold and block, no entries (upstream §6.2).
var safeDefaults = map[string]string{TierContact: StanceHold, TierRegistered: StanceHold, TierAnonymous: StanceBlock}

func policyOf(rec *Record) policy {
	if !rec.HasRoster() {
		return policy{defaults: noRoster}
	}
	v, err := protocol.ParseJSON(rec.Roster)
	if err != nil {
		return policy{defaults: safeDefaults}
	}
	if _, _, err := CheckRoster(v); err != nil {
		return policy{defaults: safeDefaults}
	}
	m := v.(map[string]any)
	p := policy{entries: map[string]string{}, defaults: map[string]string{}}
	dm, _ := m["defaults"].(map[string]any)
	for tier, def := range rosterDefaults {
		p.defaults[tier] = def
		if s, _ := dm[tier].(string); s != "" {
			p.defaults[tier] = s
		}
	}
	list, _ := m["entries"].([]any)
	for _, it := range list {
		em, _ := it.(map[string]any)
		subject, _ := em["subject"].(string)
		stance, _ := em["stance"].(string)
		// Keys only: a handle entry would need resolving, which this
		// service does not do yet. The first entry for a key wins.
		if !keys.IsUserPublicKey(subject) {
			continue
		}
		if _, dup := p.entries[subject]; !dup {
			p.entries[subject] = stance
		}
	}
	return p
}

// classify decides the stance for sender: its roster entry, else the
// default of its tier.
func (w *Worker) classify(ctx context.Context, p policy, sender string) (stance, tier string, err error) {
	if s, ok := p.entries[sender]; ok {
		return s, TierContact, nil
	}
	found, sandbox, err := w.registered(ctx, sender)
	if err != nil {
		return "", "", err
	}
	// A sandbox registration is a borrowed guest identity: anonymous.
	tier = TierAnonymous
	if found && !sandbox {
		tier = TierRegistered
	}
	return p.defaults[tier], tier, nil
}

// ---------------------------------------------------------------------------
// The public-inbox relay

// onInbox sees every message on the public inbox of a guarded agent (one
// copy per message). Messages to agents no longer guarded (the watch has
// not yet unsubscribed) are left alone: their own node answers. For a guarded agent the message is judged and relayed on a
// goroutine of its own (relays are concurrent; there is no per-agent order)
// when a relay slot is free, and refused with a retryable error when not:
// this callback serves every guarded agent, so it never waits.
func (w *Worker) onInbox(msg *nats.Msg) {
	agent, ok := inboxAgent(msg.Subject)
	if !ok {
		return
	}
	if msg.Reply != "" && !protocol.IsClientReplySubject(msg.Reply) {
		// Every answer of this worker (the relayed answers, the queued ack,
		// a busy refusal) goes to the reply subject with the services'
		// rights: one that names no client's replies ($KV., $JS.API., an
		// inbox) is dropped, and the request served as one without a reply.
		m := *msg
		m.Reply = ""
		msg = &m
	}
	ctx, cancel := context.WithTimeout(w.ctx, 5*time.Second)
	c, err := w.lookup(ctx, agent)
	cancel()
	if err != nil {
		w.svc.Log.Warn("admission lookup", "agent", agent, "err", err)
		return
	}
	if c.rec == nil || !c.rec.Guarded {
		return
	}
	if full := w.takeSlot(agent); full != nil {
		w.refuseBusy(msg, full)
		return
	}
	w.relayMu.Lock()
	if w.stopping {
		w.relayMu.Unlock()
		w.releaseSlot(agent)
		return
	}
	w.done.Add(1)
	w.relayMu.Unlock()
	go func() {
		defer w.done.Done()
		defer w.releaseSlot(agent)
		w.admit(agent, c.policy, msg)
	}()
}

// takeSlot takes a relay slot for agent, or says which bound is reached.
func (w *Worker) takeSlot(agent string) *errs.Error {
	w.slotMu.Lock()
	defer w.slotMu.Unlock()
	switch {
	case w.perAgent[agent] >= w.cfg.MaxRelaysPerAgent:
		return errs.New(errs.AgentOverloaded, "too many requests to this agent are in flight; retry shortly").WithRetryAfter(busyRetryAfter)
	case w.inFlight >= w.cfg.MaxRelays:
		return errs.New(errs.Unavailable, "the admission service is busy; retry shortly").WithRetryAfter(busyRetryAfter)
	}
	w.inFlight++
	w.perAgent[agent]++
	return nil
}

func (w *Worker) releaseSlot(agent string) {
	w.slotMu.Lock()
	defer w.slotMu.Unlock()
	w.inFlight--
	if w.perAgent[agent]--; w.perAgent[agent] <= 0 {
		delete(w.perAgent, agent)
	}
}

// refuseBusy answers a message that found no relay slot with e, signed by
// the services key. The refusal comes before the roster is read, so it is
// the same for every sender and says nothing about its stance. Like every
// answer it goes only to a verified, fresh request; anything else, and a
// message without a reply subject, is dropped.
func (w *Worker) refuseBusy(msg *nats.Msg, e *errs.Error) {
	w.busy.Add(1)
	if msg.Reply == "" {
		return
	}
	env, err := protocol.Decode(msg.Data)
	if err != nil || protocol.CheckFreshness(env.TS, w.svc.Now(), protocol.SourceLive) != nil {
		return
	}
	rep, err := protocol.NewReply(env, w.svc.Key.Public(), e.BusPayload())
	if err == nil {
		err = rep.Sign(w.svc.Key)
	}
	var b []byte
	if err == nil {
		b, err = rep.Marshal()
	}
	if err != nil {
		w.svc.Log.Error("busy refusal", "err", err)
		return
	}
	_ = w.svc.NC.Publish(msg.Reply, b)
}

func inboxAgent(subject string) (string, bool) {
	rest, ok := strings.CutPrefix(subject, "mesh.agent.")
	if !ok {
		return "", false
	}
	agent, ok := strings.CutSuffix(rest, ".inbox")
	if !ok || !keys.IsUserPublicKey(agent) {
		return "", false
	}
	return agent, true
}

func (w *Worker) admit(agent string, p policy, msg *nats.Msg) {
	env, err := protocol.Decode(msg.Data)
	if err != nil || protocol.CheckFreshness(env.TS, w.svc.Now(), protocol.SourceLive) != nil {
		w.dropped.Add(1) // undecodable, unsigned or stale: silent
		return
	}
	ctx, cancel := context.WithTimeout(w.ctx, 10*time.Second)
	stance, tier, err := w.classify(ctx, p, env.From)
	cancel()
	if err != nil {
		// The sender cannot be classified (the store failed): fail
		// closed, as a block.
		w.svc.Log.Warn("admission classify", "agent", agent, "err", err)
		w.ack(msg, env)
		return
	}
	if protocol.IsAnswer(env) {
		w.admitAnswer(agent, stance, tier, env, msg)
		return
	}
	switch stance {
	case StanceAllow:
		w.relay(agent, env, msg)
	case StanceHold:
		w.keep(agent, env)
		w.ack(msg, env)
	default:
		w.blocked.Add(1)
		w.svc.Log.Debug("admission block", "agent", agent, "tier", tier)
		w.ack(msg, env)
	}
}

// keep holds env for agent's owner; a store that fails is logged (the
// sender is not told: a held message is acknowledged, an answer never).
func (w *Worker) keep(agent string, env *protocol.Envelope) {
	ctx, cancel := context.WithTimeout(w.ctx, 10*time.Second)
	defer cancel()
	if err := w.hold(ctx, agent, env); err != nil {
		w.svc.Log.Warn("admission hold", "agent", agent, "err", err)
	}
}

// admitAnswer judges an answer to one of the agent's own requests (a
// respond, or a protocol 0.3 late answer: a fresh request naming the
// original in in_reply_to). An answer is never acknowledged (nobody waits
// for an ack of an answer, and no ack keeps a block and a hold alike):
//
//   - allow: passed on as it is to the guarded inbox, which the mailbox
//     stream captures, so it waits there while the agent is offline;
//   - hold: kept for the owner in mesh_admission_held, like a held request.
//     Since protocol 0.3 every answer travels to the inbox, and "registered
//     → hold" is a roster's default, so dropping these lost every late
//     answer (inbox mode) and every answer published while the agent
//     reconnects from anyone the roster does not allow;
//   - block: dropped.
//
// The agent's node also takes answers live at the public inbox, while a
// call of its waits for that signer (adapter/node receive, answersOnly),
// whatever the stance; what is held reaches the agent when the owner
// releases it (docs/protocol.md "0.2 and 0.3 peers").
func (w *Worker) admitAnswer(agent, stance, tier string, env *protocol.Envelope, msg *nats.Msg) {
	switch stance {
	case StanceAllow:
		w.answers.Add(1)
		out := nats.NewMsg(protocol.GuardedInboxSubject(agent))
		out.Data = msg.Data
		out.Header.Set(jetstream.MsgIDHeader, "admission:"+env.From+":"+env.ID)
		_ = w.svc.NC.PublishMsg(out)
	case StanceHold:
		w.keep(agent, env)
	default:
		w.blocked.Add(1)
		w.svc.Log.Debug("admission block", "agent", agent, "tier", tier, "answer", true)
	}
}

// relay passes the exact request bytes to the guarded inbox and forwards
// every answer, unchanged, to the sender's reply subject: an accept and
// then the substantive answer. No first answer within RelayTimeout (or
// nobody subscribed) means the agent is not online: the message is in its
// mailbox (the stream captures .inbox.guarded), and the sender gets the
// queued ack.
func (w *Worker) relay(agent string, env *protocol.Envelope, msg *nats.Msg) {
	nc := w.svc.NC
	out := nats.NewMsg(protocol.GuardedInboxSubject(agent))
	out.Data = msg.Data
	for k, v := range msg.Header {
		out.Header[k] = v
	}
	// The mailbox stream dedupes on Nats-Msg-Id; the public-inbox copy may
	// already have used the sender's id, so the relayed copy has its own.
	out.Header.Set(jetstream.MsgIDHeader, "admission:"+env.From+":"+env.ID)
	if msg.Reply == "" {
		w.relayed.Add(1)
		_ = nc.PublishMsg(out)
		return
	}
	// The agent answers under the relay's own reply prefix: clients may
	// publish there (to answer) but never subscribe it, and it is not the
	// services' prefix, which clients may not touch at all. The token is
	// random, not a nuid (whose next values two observed ones give away),
	// since any client may publish under the prefix.
	out.Reply = protocol.RelayReplyPrefix + "." + protocol.RandomToken()
	// A relay forwards an accept and one answer: a small channel, not
	// SubscribeSync's 64K slots (half a megabyte for each of up to
	// MaxRelays relays). A node flooding the relay subject overflows it
	// and loses its own excess.
	ch := make(chan *nats.Msg, relayQueue)
	sub, err := nc.ChanSubscribe(out.Reply, ch)
	if err != nil {
		w.svc.Log.Warn("admission relay", "agent", agent, "err", err)
		w.ack(msg, env)
		return
	}
	defer func() { _ = sub.Unsubscribe() }()
	w.relayed.Add(1) // counted first: the answers may reach the sender before this line would
	if err := nc.PublishMsg(out); err != nil {
		w.relayed.Add(^uint64(0))
		w.svc.Log.Warn("admission relay", "agent", agent, "err", err)
		w.ack(msg, env)
		return
	}
	wait, answered := w.cfg.RelayTimeout, false
	for {
		var m *nats.Msg
		t := time.NewTimer(wait)
		select {
		case m = <-ch:
		case <-t.C:
		case <-w.ctx.Done():
		}
		t.Stop()
		if m == nil || (len(m.Data) == 0 && m.Header.Get("Status") == "503") {
			if !answered && w.ctx.Err() == nil {
				w.ack(msg, env) // offline (no responders or silence)
			}
			return
		}
		w.answers.Add(1)
		if err := nc.Publish(msg.Reply, m.Data); err != nil {
			return
		}
		answered = true
		if !isAccept(m.Data) || protocol.AnswersAtInbox(env.V) {
			// A protocol 0.3 request's answers go to the sender's inbox;
			// the agent sends only its first one here, as a sign of life.
			return
		}
		wait = w.cfg.AnswerTimeout
	}
}

// isAccept reports whether data is a respond whose payload.status is
// "accepted": more answers follow it.
func isAccept(data []byte) bool {
	v, err := protocol.ParseJSON(data)
	if err != nil {
		return false
	}
	m, _ := v.(map[string]any)
	p, _ := m["payload"].(map[string]any)
	return m["type"] == string(protocol.TypeRespond) && p["status"] == protocol.StatusAccepted
}

// hold records a held request for the owner under <agent>.<request id>.
func (w *Worker) hold(ctx context.Context, agent string, env *protocol.Envelope) error {
	key := agent + "." + keyToken(env.From, env.ID)
	rec := Held{Agent: agent, From: env.From, RequestID: env.ID, ReceivedAt: protocol.FormatTime(w.svc.Now()),
		Envelope: json.RawMessage(env.Raw())}
	_, changed, err := bus.CAS(ctx, w.held, key, func(cur *Held, exists bool) (*Held, error) {
		if exists {
			return nil, bus.ErrNoChange // a retry of a request already held
		}
		return &rec, nil
	})
	if changed {
		w.heldN.Add(1)
	}
	return err
}

// keyToken is the request id when it is a safe single KV key token, else a
// digest of (from, id).
func keyToken(from, id string) string {
	if protocol.ValidToken(id) {
		return id
	}
	return "h" + digest(from+"\n"+id)
}

func digest(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:16])
}

// ack answers msg with the queued ack: a respond signed by the services
// key, in reply to the request, payload {status:"queued", output:{queued:
// true, inbox_id, text}}. Identical for held, blocked and offline.
func (w *Worker) ack(msg *nats.Msg, env *protocol.Envelope) {
	if msg.Reply == "" {
		return
	}
	rep, err := QueuedAck(w.svc.Key, env)
	if err != nil {
		w.svc.Log.Error("queued ack", "err", err)
		return
	}
	w.queued.Add(1)
	_ = w.svc.NC.Publish(msg.Reply, rep)
}

// QueuedAck builds the signed queued ack to req.
func QueuedAck(key keys.Signer, req *protocol.Envelope) ([]byte, error) {
	e, err := protocol.NewReply(req, key.Public(), map[string]any{"status": StatusQueued, "output": protocol.NewQueuedAck(QueuedText)})
	if err != nil {
		return nil, err
	}
	if err := e.Sign(key); err != nil {
		return nil, err
	}
	return e.Marshal()
}
