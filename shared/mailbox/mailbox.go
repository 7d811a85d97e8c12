// Package mailbox is the offline mailbox of the mesh (spec §3.3, upstream
// notes §6.1, DESIGN §5): one JetStream stream, MESH_MAILBOX, captures every
// publish on every agent inbox, and the mailbox worker reads and deletes an
// agent's mail for it.
//
// Nothing is made per agent at the broker: no stream, no consumer, no
// grant. A node asks mesh.mailbox.fetch, signed by the agent whose mail it
// wants; the worker reads that agent's subject (its open inbox, or its
// guarded inbox while the admission service guards it) and sends each
// message to the caller's reply subject; mesh.mailbox.ack, signed by the
// same agent, deletes what was handled. The signature is the whole of the
// access check, so an agent can never read, acknowledge or delete another
// agent's mail, and no client credential needs any JetStream subject
// (docs/bus.md "Mailboxes", docs/security.md).
//
// The stream is bounded in total bytes and per subject (discard new, so a
// flood can neither evict mail already stored nor grow the disk), and a
// sweep purges mail nobody will read: subjects of keys with no
// registration, or of sandbox agents, quiet for SweepGrace; and the mail
// older than UnreadAge of agents that have not fetched for MaxAge (an
// upstream SDK never does: sweep.go).
//
// Every copy is stateless; N copies in the queue group answer each request
// once.
package mailbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/ratelimit"
)

// Name is the worker's name (micro service mesh-mailbox, queue group
// bus.QueueGroup(Name)).
const Name = "mailbox"

// Buckets the worker reads (their workers own them).
const (
	RegistryBucket  = "mesh_registry"
	AdmissionBucket = "mesh_admission"
)

// ReadersBucket is the worker's own bucket: one key per agent that fetched
// its mail, {fetched_at}, kept Limits.MaxAge after the last write. The
// sweep reads it to tell an agent that reads its mailbox from one that
// never does (sweep.go).
const ReadersBucket = "mesh_mailbox_readers"

// Limits bound the mailbox stream (docs/security.md). JetStream limits a
// subject by message count, not bytes, so the per-agent byte bound is
// MaxMsgsPerAgent × MaxMsgSize.
type Limits struct {
	// MaxBytes bounds the whole stream; past it new mail is not stored
	// (the live delivery of a request is unaffected).
	MaxBytes int64
	// MaxMsgsPerAgent bounds one inbox subject; past it new mail for that
	// agent is not stored until it drains.
	MaxMsgsPerAgent int64
	// MaxMsgSize bounds one stored message.
	MaxMsgSize int64
	// MaxAge is how long unread mail is kept.
	MaxAge time.Duration
	// UnreadAge is how long mail is kept for an agent that has not
	// fetched its mail for MaxAge: an upstream SDK agent never fetches, so
	// its box would otherwise stay at MaxMsgsPerAgent for MaxAge (sweep.go).
	UnreadAge time.Duration
}

// DefaultLimits: 1 GiB in all; 256 messages per agent of at most 256 KiB
// each, so one agent's box holds at most 64 MiB, a sixteenth of the whole
// (a larger message to an offline agent is delivered live only: large
// content goes by reference); seven days; one day for an agent that does
// not fetch its mail.
var DefaultLimits = Limits{MaxBytes: 1 << 30, MaxMsgsPerAgent: 256, MaxMsgSize: 256 << 10, MaxAge: 7 * 24 * time.Hour,
	UnreadAge: 24 * time.Hour}

func (l Limits) orDefault() Limits {
	d := DefaultLimits
	if l.MaxBytes > 0 {
		d.MaxBytes = l.MaxBytes
	}
	if l.MaxMsgsPerAgent > 0 {
		d.MaxMsgsPerAgent = l.MaxMsgsPerAgent
	}
	if l.MaxMsgSize > 0 {
		d.MaxMsgSize = l.MaxMsgSize
	}
	if l.MaxAge > 0 {
		d.MaxAge = l.MaxAge
	}
	if l.UnreadAge > 0 {
		d.UnreadAge = l.UnreadAge
	}
	return d
}

// Knobs are the operator settings of l (meshd flags, and the same
// MESH_LIMIT_* variables for meshd and the mailbox worker); each sets its
// field of l, and its default is the field's value when Knobs is called.
func (l *Limits) Knobs() []ratelimit.Knob {
	return []ratelimit.Knob{
		ratelimit.SizeKnob("limit-mailbox-bytes", "bytes the offline mailboxes hold in all; past it new mail is not stored", 1<<20, &l.MaxBytes),
		ratelimit.Count64Knob("limit-mailbox-per-agent", "messages one agent's mailbox holds; past it new mail for it is not stored", 1, &l.MaxMsgsPerAgent),
		ratelimit.SizeKnob("limit-mailbox-message", "largest message a mailbox stores", 1<<10, &l.MaxMsgSize),
		ratelimit.DurationKnob("limit-mailbox-unread-age", "how long mail waits for an agent that has not fetched its mail for a week (an upstream SDK never does)", time.Minute, &l.UnreadAge),
	}
}

// StreamConfig is the one configuration of the mailbox stream for l and
// replicas (bus.Replicas). Whoever creates the stream uses exactly this, so
// copies that create-or-update it concurrently never flip it back and forth.
func StreamConfig(l Limits, replicas int) jetstream.StreamConfig {
	l = l.orDefault()
	return jetstream.StreamConfig{
		Name:        protocol.MailboxStream,
		Description: "offline mailboxes: every agent inbox, read and deleted through the mailbox worker",
		Subjects:    []string{protocol.InboxSubject("*"), protocol.GuardedInboxSubject("*")},
		Retention:   jetstream.LimitsPolicy,
		// Discard new, in total and per subject: a flood can fill the
		// stream up to its bounds, but never evicts mail already stored.
		Discard:              jetstream.DiscardNew,
		DiscardNewPerSubject: true,
		MaxBytes:             l.MaxBytes,
		MaxAge:               l.MaxAge,
		MaxMsgsPerSubject:    l.MaxMsgsPerAgent,
		MaxMsgSize:           int32(min(l.MaxMsgSize, math.MaxInt32)),
		Storage:              jetstream.FileStorage,
		Replicas:             bus.Replicas(replicas),
		// No publish acks: a JetStream ack on the inbox subject would race
		// the agent's live reply to the requester (upstream §6.1).
		NoAck: true,
	}
}

// EnsureStream creates or updates the mailbox stream. Every copy does it at
// start; concurrent calls with the same config are harmless. The broker
// reserves a stream's byte bound on its disk (three quarters of what is
// free, by default): where it cannot reserve l.MaxBytes, the bound is
// halved until it can (down to minMailboxBytes) and the bound in force is
// returned, so a small disk starts with a smaller mailbox rather than not
// at all.
func EnsureStream(ctx context.Context, js jetstream.JetStream, l Limits, replicas int) (Limits, error) {
	l = l.orDefault()
	var err error
	for range 64 { // halvings from any int64 down to the floor, and retries
		if _, err = js.CreateOrUpdateStream(ctx, StreamConfig(l, replicas)); err == nil {
			return l, nil
		}
		var apiErr *jetstream.APIError
		switch {
		case ctx.Err() != nil:
			return l, fmt.Errorf("mailbox stream %s: %w", protocol.MailboxStream, err)
		case errors.As(err, &apiErr) && apiErr.ErrorCode == jsStorageExceeded && l.MaxBytes/2 >= minMailboxBytes:
			l.MaxBytes /= 2
		default:
			time.Sleep(50 * time.Millisecond) // a concurrent creator may have won
		}
	}
	return l, fmt.Errorf("mailbox stream %s: %w", protocol.MailboxStream, err)
}

// jsStorageExceeded is JetStream's "insufficient storage resources"; the
// smallest byte bound EnsureStream falls back to is minMailboxBytes.
const (
	jsStorageExceeded = 10047
	minMailboxBytes   = 16 << 20
)

// Defaults of Config.
const (
	DefaultSweepEvery = 10 * time.Minute
	DefaultSweepGrace = time.Hour
	// MaxFetch is the most messages one fetch returns.
	MaxFetch = 100
	// maxFetchBytes bounds the bytes one fetch sends (at least one message
	// goes whatever its size).
	maxFetchBytes = 4 << 20
	// MaxAck is the most single sequences one ack names.
	MaxAck = MaxFetch
)

// Config tunes the worker; zero values take the defaults.
type Config struct {
	Limits Limits
	// SweepEvery is how often each copy sweeps (10 min); SweepGrace how long
	// a subject nobody will read must have been quiet before it is purged
	// (1 h).
	SweepEvery, SweepGrace time.Duration
	// Replicas of the mailbox stream and the readers bucket (bus.Replicas:
	// 0 is 1, one server; the cloud's cluster runs 3, set by the workers
	// table).
	Replicas int
	// Now is the worker's clock (nil: the env's).
	Now func() time.Time
}

// Worker is one running copy of the mailbox worker.
type Worker struct {
	svc       *bus.Service
	stream    jetstream.Stream
	registry  bus.LazyBucket
	admission bus.LazyBucket
	readers   jetstream.KeyValue
	noted     readerNotes
	cfg       Config
	now       func() time.Time
	log       *slog.Logger
	fetches   fetchLimiter

	cancel   context.CancelFunc
	done     sync.WaitGroup
	stopOnce sync.Once
	stopErr  error
}

// Start runs one copy in env: makes sure the stream exists with cfg's
// limits, serves fetch, ack and known in the worker's queue group, and
// sweeps every cfg.SweepEvery until ctx ends or Stop.
func Start(ctx context.Context, env bus.Env, cfg Config) (*Worker, error) {
	if cfg.SweepEvery <= 0 {
		cfg.SweepEvery = DefaultSweepEvery
	}
	if cfg.SweepGrace <= 0 {
		cfg.SweepGrace = DefaultSweepGrace
	}
	if cfg.Now == nil {
		cfg.Now = env.Now
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	svc, err := bus.NewServiceIn(env, Name, "offline mailboxes: fetch and acknowledge an agent's mail")
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Worker, error) {
		_ = svc.Stop()
		return nil, err
	}
	inForce, err := EnsureStream(ctx, svc.JS, cfg.Limits, cfg.Replicas)
	if err != nil {
		return fail(err)
	}
	if want := cfg.Limits.orDefault().MaxBytes; inForce.MaxBytes < want {
		svc.Log.Warn("the mailbox stream is smaller than configured: the broker cannot reserve more on this disk",
			"max_bytes", inForce.MaxBytes, "configured", want)
	}
	stream, err := svc.JS.Stream(ctx, protocol.MailboxStream)
	if err != nil {
		return fail(fmt.Errorf("%s: stream: %w", Name, err))
	}
	if n, err := dropLegacyConsumers(ctx, stream); err != nil {
		svc.Log.Warn("mailbox: the per-agent consumers of an earlier version could not all be deleted; the next start tries again", "deleted", n, "err", err)
	} else if n > 0 {
		svc.Log.Info("mailbox: deleted the per-agent consumers of an earlier version", "count", n)
	}
	readers, err := bus.Bucket(ctx, svc.JS, jetstream.KeyValueConfig{Bucket: ReadersBucket, TTL: inForce.MaxAge, Replicas: bus.Replicas(cfg.Replicas),
		Description: "agents that fetch their mail, keyed by agent id (the mailbox sweep)"})
	if err != nil {
		return fail(err)
	}
	cfg.Limits = inForce
	w := &Worker{svc: svc, stream: stream, cfg: cfg, now: cfg.Now, log: svc.Log, readers: readers,
		registry: bus.LazyBucket{JS: svc.JS, Bucket: RegistryBucket}, admission: bus.LazyBucket{JS: svc.JS, Bucket: AdmissionBucket}}
	for _, ep := range []struct {
		name, subject string
		h             bus.Handler
	}{
		{"fetch", protocol.SubjMailboxFetch, w.fetch},
		{"ack", protocol.SubjMailboxAck, w.ack},
		{"known", protocol.SubjMailboxKnown, w.known},
	} {
		if err := svc.Endpoint(ep.name, ep.subject, ep.h); err != nil {
			return fail(fmt.Errorf("%s: endpoint %s: %w", Name, ep.subject, err))
		}
	}
	if err := env.NC.Flush(); err != nil {
		return fail(fmt.Errorf("%s: flush: %w", Name, err))
	}
	w.warnWhenFull(ctx)
	loopCtx, cancel := context.WithCancel(ctx)
	w.cancel = cancel
	w.done.Add(1)
	go w.sweepLoop(loopCtx)
	return w, nil
}

// Stop unsubscribes the endpoints and ends the sweeper. Safe to call twice.
func (w *Worker) Stop() error {
	w.stopOnce.Do(func() {
		w.cancel()
		w.done.Wait()
		w.stopErr = w.svc.Stop()
	})
	return w.stopErr
}

// dropLegacyConsumers deletes the durable consumers inbox_<agent> that
// earlier versions made on the stream, one per registered agent: nothing
// reads them now, and each costs the broker memory and time at every stop.
// The mail they held stays in the stream, where the worker reads it.
func dropLegacyConsumers(ctx context.Context, stream jetstream.Stream) (int, error) {
	names := stream.ConsumerNames(ctx)
	var legacy []string
	for name := range names.Name() {
		if strings.HasPrefix(name, "inbox_") {
			legacy = append(legacy, name)
		}
	}
	if err := names.Err(); err != nil {
		return 0, err
	}
	n := 0
	for _, name := range legacy {
		if err := stream.DeleteConsumer(ctx, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return n, err
		}
		n++
	}
	return n, nil
}

// A drain fetches at most drainRounds (20) batches at once, every minute
// and at each reconnect; fetchBurst per fetchWindow per agent leaves room
// for that and stops a node that asks in a loop (each fetch may send 4 MiB).
// The count is per copy of the worker, kept in memory.
const (
	fetchBurst  = 60
	fetchWindow = 10 * time.Second
	maxLimited  = 100_000 // agents counted at once; the map starts again past it
)

// fetchLimiter counts fetches per agent in fixed windows.
type fetchLimiter struct {
	mu sync.Mutex
	n  map[string]fetchCount
}

type fetchCount struct {
	start time.Time
	n     int
}

// allow counts one fetch by agent at now and reports whether it is within
// the limit.
func (l *fetchLimiter) allow(agent string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n == nil || len(l.n) > maxLimited {
		l.n = map[string]fetchCount{}
	}
	c := l.n[agent]
	if now.Sub(c.start) >= fetchWindow {
		c = fetchCount{start: now}
	}
	c.n++
	l.n[agent] = c
	return c.n <= fetchBurst
}

// Which inbox subject an agent's mail is read from.
const (
	BoxOpen    = "open"
	BoxGuarded = "guarded"
)

// subjectOf is the inbox subject of box for agent, or "" for an unknown box.
func subjectOf(agent, box string) string {
	switch box {
	case BoxOpen:
		return protocol.InboxSubject(agent)
	case BoxGuarded:
		return protocol.GuardedInboxSubject(agent)
	}
	return ""
}

// admissionRecord is the part of a mesh_admission entry the worker reads.
type admissionRecord struct {
	Guarded bool `json:"guarded"`
	// Box is where the admission service last carried the agent's mail.
	Box string `json:"box"`
}

// box says where agent's mail is read from: the box the admission service
// last carried it to (so that, between an unguard and the purge of what
// blocked senders left on the open inbox, that mail is never read), else,
// for a record from before boxes were recorded, its guarded inbox while
// guarded and its open inbox otherwise.
func (w *Worker) box(ctx context.Context, agent string) (string, error) {
	kv, err := w.admission.Get(ctx)
	if err != nil || kv == nil {
		return BoxOpen, err
	}
	rec, found, err := bus.GetJSON[admissionRecord](ctx, kv, agent)
	if err != nil {
		return "", fmt.Errorf("kv %s: get %s: %w", AdmissionBucket, agent, err)
	}
	switch {
	case found && (rec.Box == BoxOpen || rec.Box == BoxGuarded):
		return rec.Box, nil
	case found && rec.Guarded:
		return BoxGuarded, nil
	}
	return BoxOpen, nil
}

// registration is the part of a mesh_registry record the worker reads.
type registration struct {
	Sandbox bool `json:"sandbox"`
}

// registered reports whether agent has a registration, and whether it is
// a sandbox one.
func (w *Worker) registered(ctx context.Context, agent string) (found, sandbox bool, err error) {
	kv, err := w.registry.Get(ctx)
	if err != nil || kv == nil {
		return false, false, err
	}
	rec, found, err := bus.GetJSON[registration](ctx, kv, agent)
	if err != nil {
		return false, false, fmt.Errorf("kv %s: get %s: %w", RegistryBucket, agent, err)
	}
	return found, found && rec.Sandbox, nil
}

// FetchRequest is the payload of mesh.mailbox.fetch: the mail of the
// signing agent stored after sequence After, at most Limit messages
// (MaxFetch when 0).
type FetchRequest struct {
	After uint64 `json:"after"`
	Limit int    `json:"limit,omitempty"`
}

// FetchResult is the answer's output. The messages themselves went before
// it, each to <reply>.<stream sequence>.
type FetchResult struct {
	// Box is the inbox the mail was read from; an ack names it.
	Box   string `json:"box"`
	Count int    `json:"count"`
	// Last is the sequence of the last message sent (After when none).
	Last uint64 `json:"last"`
	// More is true when the fetch stopped at its limit with mail left.
	More bool `json:"more"`
}

// fetch sends the signer's mail after req.After to the reply subject, one
// message each on <reply>.<sequence> with the stored bytes unchanged (the
// sequence travels in the subject the worker chose, never in a header the
// sender could have set), then answers with a FetchResult. The caller
// verifies each message like any inbound envelope.
func (w *Worker) fetch(ctx context.Context, r *bus.Request) (any, error) {
	if !strings.HasPrefix(r.Reply, protocol.PrivateInboxPrefix("")) {
		// Mail goes only where the requester alone can read it: never to
		// the shared _INBOX., which every upstream-style credential may
		// subscribe (docs/security.md).
		return nil, errs.New(errs.InvalidRequest, "mesh.mailbox.fetch answers only on a client's private reply prefix (_MESH_INBOX.<credential key>, the inbox_prefix of the credential answer)")
	}
	var req FetchRequest
	if err := r.Decode(&req); err != nil {
		return nil, err
	}
	if req.Limit <= 0 || req.Limit > MaxFetch {
		req.Limit = MaxFetch
	}
	agent := r.Env.From
	if !w.fetches.allow(agent, w.now()) {
		return nil, errs.Newf(errs.RateLimited, "more than %d mailbox fetches in %s for this agent; a drain needs far fewer", fetchBurst, fetchWindow).
			WithRetryAfter(fetchWindow.Milliseconds())
	}
	box, err := w.box(ctx, agent)
	if err != nil {
		return nil, errs.Wrap(errs.Unavailable, "the mailbox cannot be read now; retry", err)
	}
	w.noteReader(ctx, agent)
	subject := subjectOf(agent, box)
	res := FetchResult{Box: box, Last: req.After}
	sent := 0
	for seq := req.After + 1; ; {
		if res.Count == req.Limit || (res.Count > 0 && sent >= maxFetchBytes) {
			res.More = true
			break
		}
		// The JSON form of the message API: its sequence and subject come
		// from the server, not from stored headers a sender chose.
		m, err := w.stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			if res.Count > 0 {
				res.More = true // what was sent stands; the caller fetches again
				break
			}
			return nil, errs.Wrap(errs.Unavailable, "the mailbox cannot be read now; retry", err)
		}
		if m.Subject != subject || m.Sequence < seq {
			return nil, errs.Newf(errs.InternalError, "mailbox read returned %s #%d for %s from #%d", m.Subject, m.Sequence, subject, seq)
		}
		if err := w.svc.NC.Publish(r.Reply+"."+strconv.FormatUint(m.Sequence, 10), m.Data); err != nil {
			return nil, errs.Wrap(errs.Unavailable, "the mailbox cannot be sent now; retry", err)
		}
		res.Count++
		res.Last = m.Sequence
		sent += len(m.Data)
		seq = m.Sequence + 1
	}
	return map[string]any{"status": "ok", "output": res}, nil
}

// AckRequest is the payload of mesh.mailbox.ack: delete, from the signing
// agent's box, every message below UpTo and the single messages Seqs.
type AckRequest struct {
	Box  string   `json:"box"`
	UpTo uint64   `json:"up_to,omitempty"`
	Seqs []uint64 `json:"seqs,omitempty"`
}

// ack deletes handled mail: a purge of the box's subject below UpTo (one
// call for the usual case, every message of a fetch handled), and single
// deletes, each checked to be on the box's subject, for messages handled
// after one that stays for another try.
func (w *Worker) ack(ctx context.Context, r *bus.Request) (any, error) {
	var req AckRequest
	if err := r.Decode(&req); err != nil {
		return nil, err
	}
	subject := subjectOf(r.Env.From, req.Box)
	switch {
	case subject == "":
		return nil, errs.New(errs.InvalidRequest, `box must be "open" or "guarded"`)
	case len(req.Seqs) > MaxAck:
		return nil, errs.Newf(errs.InvalidRequest, "at most %d seqs per ack", MaxAck)
	}
	deleted := 0
	if req.UpTo > 1 {
		if err := w.stream.Purge(ctx, jetstream.WithPurgeSubject(subject), jetstream.WithPurgeSequence(req.UpTo)); err != nil {
			return nil, errs.Wrap(errs.Unavailable, "the mailbox cannot be acknowledged now; retry", err)
		}
	}
	for _, seq := range req.Seqs {
		m, err := w.stream.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue // already gone
		}
		if err != nil {
			return nil, errs.Wrap(errs.Unavailable, "the mailbox cannot be acknowledged now; retry", err)
		}
		if m.Subject != subject {
			continue // not this agent's: never touched
		}
		if err := w.stream.DeleteMsg(ctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil, errs.Wrap(errs.Unavailable, "the mailbox cannot be acknowledged now; retry", err)
		}
		deleted++
	}
	return map[string]any{"status": "ok", "output": map[string]any{"deleted": deleted}}, nil
}

// KnownRequest is the payload of mesh.internal.mailbox.known.
type KnownRequest struct {
	Agent string `json:"agent"`
}

// Known is its answer's output.
type Known struct {
	Registered bool `json:"registered"`
	Mail       bool `json:"mail"`
}

// known tells the control plane whether the bus knows an agent key: a
// registration, or mail on either of its inbox subjects. Only the
// services may ask.
func (w *Worker) known(ctx context.Context, r *bus.Request) (any, error) {
	if err := w.svc.RequireServices(r); err != nil {
		return nil, err
	}
	var req KnownRequest
	if err := r.Decode(&req); err != nil {
		return nil, err
	}
	if !keys.IsUserPublicKey(req.Agent) {
		return nil, errs.New(errs.InvalidRequest, "agent must be an agent public key")
	}
	found, _, err := w.registered(ctx, req.Agent)
	if err != nil {
		return nil, errs.Wrap(errs.Unavailable, "the registry cannot be read now", err)
	}
	mail, err := w.hasMail(ctx, req.Agent)
	if err != nil {
		return nil, errs.Wrap(errs.Unavailable, "the mailbox cannot be read now", err)
	}
	return map[string]any{"status": "ok", "output": Known{Registered: found, Mail: mail}}, nil
}

// hasMail reports whether either inbox subject of agent holds a message.
func (w *Worker) hasMail(ctx context.Context, agent string) (bool, error) {
	for _, subj := range []string{protocol.InboxSubject(agent), protocol.GuardedInboxSubject(agent)} {
		_, err := w.stream.GetLastMsgForSubject(ctx, subj)
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, jetstream.ErrMsgNotFound) {
			return false, err
		}
	}
	return false, nil
}
