// Package activity is the observability worker (spec §4.3, upstream-notes
// §6.5): it taps the agent outboxes and trace subjects, keeps a
// content-free timeline and per-agent counters, and answers
// mesh.activity.list, mesh.usage.list and mesh.catalog.list.
//
// Taps are queue subscriptions, so each observed message is handled by one
// copy. They record metadata only (who, to whom, ids, status, error code):
// never an input, output, message or any other payload content. Both
// tapped subjects are attributed by the broker, which lets only a
// credential hosting the named agent publish there (spec §4.6 rule 4, and
// minting such a credential took proof of the agent's key), so the taps
// check from against the subject instead of verifying a signature again.
//
// The timeline is the stream MESH_ACTIVITY on mesh.internal.activity (7 days,
// 100,000 records), one compact JSON record per observed message, published
// with Nats-Msg-Id <kind>:<from>:<id> so a message seen twice (a retry, a
// replay inside the freshness window) is recorded and counted once. The
// counters are KV mesh_usage, updated by compare-and-set by the copy whose
// record was not a duplicate.
package activity

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/audit"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// Name is the worker's name: micro service mesh-activity, queue group
// bus.QueueGroup(Name) for the endpoints and the taps.
const Name = "activity"

// JetStream names.
const (
	// Stream is the timeline. Each record is on SubjectPrefix+<from>.<to>
	// ("_" when to is not an agent key), which only service credentials
	// reach: a listing filters by subject, and a guest's rows are purged
	// by subject when its lease ends.
	Stream        = "MESH_ACTIVITY"
	SubjectPrefix = "mesh.internal.activity."
	// UsageBucket holds one Usage per agent id.
	UsageBucket = "mesh_usage"
	// RegistryBucket is the registry's bucket, read by the catalog; bound
	// when it exists.
	RegistryBucket = "mesh_registry"
)

// Timeline limits.
const (
	MaxAge  = 7 * 24 * time.Hour
	MaxMsgs = 100_000
	// dedupWindow covers the live freshness window (10 min old, 5 min
	// ahead): a replay the taps would accept is recognised as one.
	dedupWindow = 15 * time.Minute
)

// Listing limits of mesh.activity.list.
const (
	DefaultLimit = 100
	MaxLimit     = 1000
)

// Record kinds.
const (
	KindRequest  = "request"
	KindResponse = "response"
	KindTrace    = "trace"
)

// DefaultFlushEvery is how often a copy writes its counter deltas.
const DefaultFlushEvery = 250 * time.Millisecond

// What each tap may hold while its copy is behind (Config.TapPendingMsgs,
// TapPendingBytes). nats.go's own default, 500,000 messages or 64 MiB per
// subscription, would let the two taps of a copy hold about 180 MiB of
// small answers with their overhead, a third of a worker's 512 MiB; these
// hold at most 2 × (32 MiB + 65,536 × ~300 B) ≈ 100 MiB, and 65,536
// answers are 13 s of a copy that takes nothing at 5,000 answers a second
// (docs/bus-admission-activity.md "Bounds").
const (
	DefaultTapPendingMsgs  = 65_536
	DefaultTapPendingBytes = 32 << 20
)

// Config tunes the worker.
type Config struct {
	// Official lists the agent ids the catalog marks official, unless the
	// operator said otherwise for one (meshd admin catalog official).
	Official []string
	// FlushEvery is how often a copy writes the counter deltas it has
	// accumulated (DefaultFlushEvery, 250 ms): counters are eventually
	// consistent within it, and a crash loses at most that much counting.
	FlushEvery time.Duration
	// Replicas of the timeline stream and the usage bucket (bus.Replicas:
	// 0 is 1, one server; the cloud's cluster runs 3, set by the workers
	// table).
	Replicas int
	// Audit configures the audit rows of answered requests (audit.go): on
	// unless Audit.Off.
	Audit AuditConfig
	// TapPendingMsgs and TapPendingBytes bound the messages each tap
	// holds while the copy is behind (DefaultTapPendingMsgs and
	// DefaultTapPendingBytes when 0). Past either, the connection drops
	// what arrives for that tap until it catches up: observability gives
	// way before the worker's memory does, and Stats.Overflow counts it.
	TapPendingMsgs, TapPendingBytes int
}

// delta is what one copy has counted for one agent since its last flush.
type delta struct {
	in, out, errors int64
	first, last     string
}

// Item is one timeline record: the stream message body and one entry of a
// mesh.activity.list answer. Metadata only.
type Item struct {
	// TS is the envelope's ts (checked against the live freshness window);
	// ObservedAt is when a tap saw it, by the worker's clock.
	TS         string `json:"ts"`
	ObservedAt string `json:"observed_at"`
	Kind       string `json:"kind"`
	Type       string `json:"type"`
	From       string `json:"from"`
	To         string `json:"to"`
	ID         string `json:"id"`
	InReplyTo  string `json:"in_reply_to,omitempty"`
	TaskID     string `json:"task_id,omitempty"`
	TraceID    string `json:"trace_id,omitempty"`
	SpanID     string `json:"span_id,omitempty"`
	Status     string `json:"status,omitempty"`
	Error      string `json:"error,omitempty"` // the error code, when the response carries one
}

// record is one timeline message: an Item, and for a request learnt from
// an answer the answer's own Item too, so the usual call (one answer, the
// accept's copy never sent: adapter/node AcceptCopyDelay) costs the
// timeline one write, not two. A listing shows them as two items.
type record struct {
	Item
	Answer *Item `json:"response,omitempty"`
}

// Usage is the value stored under an agent id in mesh_usage and one entry
// of a mesh.usage.list answer.
type Usage struct {
	Agent       string `json:"agent"`
	MessagesIn  int64  `json:"messages_in"`
	MessagesOut int64  `json:"messages_out"`
	Errors      int64  `json:"errors"`
	FirstSeen   string `json:"first_seen"`
	LastActive  string `json:"last_active"`
}

// Stats counts what one copy's taps did.
type Stats struct {
	Recorded   uint64 // new timeline items (a request and the answer it carries are two)
	Duplicates uint64 // messages already recorded (by any copy)
	Dropped    uint64 // undecodable, unsigned, stale, misattributed or not of the tapped kind
	Accepts    uint64 // accepts seen and not recorded (the answer records the request)
	// Overflow counts tapped messages dropped unread because a tap held
	// its Config.TapPending* already (the copy was behind).
	Overflow uint64
	// AuditRows are the audit rows this copy appended; AuditDuplicates
	// the rows it found recorded already (an answer seen twice), and
	// AuditFailed those it could not append.
	AuditRows, AuditDuplicates, AuditFailed uint64
}

// Worker is one running copy of the activity worker.
type Worker struct {
	svc      *bus.Service
	cfg      Config
	official map[string]bool
	stream   jetstream.Stream
	usage    jetstream.KeyValue
	registry bus.LazyBucket
	subs     []*nats.Subscription
	once     sync.Once

	// The catalog's follower of the registry (catalog.go).
	catCancel context.CancelFunc
	catDone   chan struct{}

	// pending are counter deltas not yet written; a copy counts only the
	// messages whose timeline record it wrote (not a duplicate), so deltas
	// of different copies never overlap and add up exactly.
	pendingMu sync.Mutex
	pending   map[string]*delta
	stop      chan struct{}
	flushed   chan struct{}

	// Records are published asynchronously so a tap never waits on a
	// JetStream round trip; acks carries each publish to the goroutine
	// that reads its acknowledgement and counts it. closing guards acks
	// against a tap still running while Stop closes it.
	acks  chan pendingRecord
	acked chan struct{}
	// answerAcks carries the answers recorded on their own (recordAnswer),
	// read by a second loop so that the first never waits on itself.
	answerAcks  chan pendingRecord
	answerAcked chan struct{}
	closing     sync.RWMutex
	closed      bool

	recorded, duplicates, dropped, accepts atomic.Uint64

	// The audit rows (audit.go): nil chains when Config.Audit.Off.
	chains                                  *audit.Chains
	auditQs                                 []chan audit.Entry
	auditDone                               chan struct{}
	auditRows, auditDuplicates, auditFailed atomic.Uint64
	// subsMu guards subs against Stats while Stop closes them; overflow
	// keeps the taps' Stats.Overflow once they are closed.
	subsMu   sync.Mutex
	overflow uint64
}

// Start runs one copy of the worker in env: creates the stream and the
// bucket, serves the three list subjects and starts the taps.
func Start(ctx context.Context, env bus.Env, cfg Config) (*Worker, error) {
	svc, err := bus.NewServiceIn(env, Name, "activity timeline, usage counters and catalog")
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Worker, error) {
		_ = svc.Stop()
		return nil, err
	}
	st, err := svc.JS.CreateOrUpdateStream(ctx, streamConfig(ctx, svc.JS, cfg.Replicas))
	if err != nil {
		return fail(fmt.Errorf("%s: stream %s: %w", Name, Stream, err))
	}
	usage, err := bus.Bucket(ctx, svc.JS, UsageBucketConfig(cfg.Replicas))
	if err != nil {
		return fail(err)
	}
	return start(ctx, svc, cfg, st, usage, env)
}

// streamConfig is the timeline's configuration. Records are flushed to the
// file in batches rather than one write each (about a tenth of the mesh's
// CPU per call: docs/performance.md): the timeline is observability, and a
// record acknowledged in the last moments before the broker is killed may
// be lost, which the mailbox and the control plane's records never may
// (docs/bus.md, the stream table). The broker sets the persist mode only
// when it creates a stream (an update may not change it), so a timeline
// made before keeps its mode. A replicated stream may not persist
// asynchronously (the broker refuses it): with more than one replica the
// timeline is written like every other stream, its replicas being what
// keeps it.
func streamConfig(ctx context.Context, js jetstream.JetStream, replicas int) jetstream.StreamConfig {
	cfg := jetstream.StreamConfig{
		Name:        Stream,
		Description: "content-free timeline of observed requests, responses and span events",
		Subjects:    []string{SubjectPrefix + "*.*"},
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxAge:      MaxAge,
		MaxMsgs:     MaxMsgs,
		Duplicates:  dedupWindow,
		Storage:     jetstream.FileStorage,
		PersistMode: jetstream.AsyncPersistMode,
		Replicas:    bus.Replicas(replicas),
	}
	if cfg.Replicas > 1 {
		cfg.PersistMode = jetstream.DefaultPersistMode
	}
	if st, err := js.Stream(ctx, Stream); err == nil {
		cfg.PersistMode = st.CachedInfo().Config.PersistMode
	}
	return cfg
}

// start runs the copy once its stream and bucket are bound.
func start(ctx context.Context, svc *bus.Service, cfg Config, st jetstream.Stream, usage jetstream.KeyValue, env bus.Env) (*Worker, error) {
	fail := func(err error) (*Worker, error) {
		_ = svc.Stop()
		return nil, err
	}
	if cfg.FlushEvery <= 0 {
		cfg.FlushEvery = DefaultFlushEvery
	}
	if cfg.TapPendingMsgs <= 0 {
		cfg.TapPendingMsgs = DefaultTapPendingMsgs
	}
	if cfg.TapPendingBytes <= 0 {
		cfg.TapPendingBytes = DefaultTapPendingBytes
	}
	w := &Worker{svc: svc, cfg: cfg, official: map[string]bool{}, stream: st, usage: usage,
		registry: bus.LazyBucket{JS: svc.JS, Bucket: RegistryBucket},
		pending:  map[string]*delta{}, stop: make(chan struct{}), flushed: make(chan struct{}),
		acks: make(chan pendingRecord, ackQueue), acked: make(chan struct{}),
		answerAcks: make(chan pendingRecord, ackQueue), answerAcked: make(chan struct{})}
	if err := w.startAudit(ctx); err != nil {
		return fail(fmt.Errorf("%s: %w", Name, err))
	}
	go w.flushLoop()
	go w.ackLoop(w.acks, w.acked)
	go w.ackLoop(w.answerAcks, w.answerAcked)
	for _, id := range cfg.Official {
		w.official[id] = true
	}
	for _, ep := range []struct {
		name, subject string
		h             bus.Handler
	}{
		{"activity", protocol.SubjActivityList, w.listActivity},
		{"usage", protocol.SubjUsageList, w.listUsage},
		{"catalog", protocol.SubjCatalogList, w.listCatalog},
		{"catalog-remove", protocol.SubjCatalogRemove, w.removeOwn},
		{"catalog-admin", protocol.SubjCatalogAdmin, w.admin},
		{"guest-erase", protocol.SubjGuestErase, w.eraseGuests},
	} {
		if err := svc.Endpoint(ep.name, ep.subject, ep.h); err != nil {
			return fail(fmt.Errorf("%s: endpoint %s: %w", Name, ep.subject, err))
		}
	}
	for _, tap := range []struct {
		subject, kind string
	}{
		{protocol.OutboxSubject("*"), KindResponse},
		{protocol.TraceSubject("*"), KindTrace},
	} {
		sub, err := env.NC.QueueSubscribe(tap.subject, bus.QueueGroup(Name), w.tap(tap.kind))
		if err == nil {
			err = sub.SetPendingLimits(cfg.TapPendingMsgs, cfg.TapPendingBytes)
		}
		if err != nil {
			_ = w.Stop()
			return nil, fmt.Errorf("%s: tap %s: %w", Name, tap.subject, err)
		}
		w.subs = append(w.subs, sub)
	}
	if err := env.NC.Flush(); err != nil {
		_ = w.Stop()
		return nil, fmt.Errorf("%s: flush: %w", Name, err)
	}
	catCtx, cancel := context.WithCancel(context.Background())
	w.catCancel, w.catDone = cancel, make(chan struct{})
	go w.catalogLoop(catCtx)
	return w, nil
}

// Stop ends the copy: no more taps or answers, and the counters it still
// holds are written.
func (w *Worker) Stop() error {
	var err error
	w.once.Do(func() {
		if w.catCancel != nil {
			w.catCancel()
			<-w.catDone
		}
		w.subsMu.Lock()
		for _, s := range w.subs {
			if n, err := s.Dropped(); err == nil && n > 0 {
				w.overflow += uint64(n) // the count goes with the subscription
			}
			_ = s.Unsubscribe()
		}
		w.subs = nil
		w.subsMu.Unlock()
		w.closing.Lock()
		w.closed = true
		close(w.acks)
		for _, q := range w.auditQs {
			close(q)
		}
		w.closing.Unlock()
		w.auditStopped()
		<-w.acked
		close(w.answerAcks) // only the first loop sends on it
		<-w.answerAcked
		close(w.stop)
		<-w.flushed
		err = w.svc.Stop()
	})
	return err
}

func (w *Worker) flushLoop() {
	defer close(w.flushed)
	t := time.NewTicker(w.cfg.FlushEvery)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			w.flush()
			return
		case <-t.C:
			w.flush()
		}
	}
}

// flush writes the accumulated deltas, one compare-and-set per agent. A
// delta that cannot be written goes back to be retried next time.
func (w *Worker) flush() {
	w.pendingMu.Lock()
	batch := w.pending
	w.pending = map[string]*delta{}
	w.pendingMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for agent, d := range batch {
		_, _, err := bus.CAS(ctx, w.usage, agent, func(cur *Usage, exists bool) (*Usage, error) {
			u := Usage{Agent: agent, FirstSeen: d.first, LastActive: d.last}
			if exists {
				u = *cur
				if later(u.FirstSeen, d.first) {
					u.FirstSeen = d.first
				}
				if later(d.last, u.LastActive) {
					u.LastActive = d.last
				}
			}
			u.MessagesIn += d.in
			u.MessagesOut += d.out
			u.Errors += d.errors
			return &u, nil
		})
		if err != nil {
			w.svc.Log.Warn("usage counters", "agent", agent, "err", err)
			w.add(agent, *d)
		}
	}
}

// add merges d into agent's pending delta.
func (w *Worker) add(agent string, d delta) {
	w.pendingMu.Lock()
	defer w.pendingMu.Unlock()
	p := w.pending[agent]
	if p == nil {
		w.pending[agent] = &d
		return
	}
	p.in, p.out, p.errors = p.in+d.in, p.out+d.out, p.errors+d.errors
	if later(p.first, d.first) {
		p.first = d.first
	}
	if later(d.last, p.last) {
		p.last = d.last
	}
}

// Stats reports this copy's counters.
func (w *Worker) Stats() Stats {
	s := Stats{Recorded: w.recorded.Load(), Duplicates: w.duplicates.Load(), Dropped: w.dropped.Load(), Accepts: w.accepts.Load(),
		AuditRows: w.auditRows.Load(), AuditDuplicates: w.auditDuplicates.Load(), AuditFailed: w.auditFailed.Load()}
	w.subsMu.Lock()
	defer w.subsMu.Unlock()
	s.Overflow = w.overflow
	for _, sub := range w.subs {
		if n, err := sub.Dropped(); err == nil && n > 0 {
			s.Overflow += uint64(n)
		}
	}
	return s
}

// ---------------------------------------------------------------------------
// Taps

var errDrop = errors.New("dropped")

func (w *Worker) tap(kind string) nats.MsgHandler {
	return func(msg *nats.Msg) {
		err := w.observe(kind, msg.Subject, msg.Data, msg.Header)
		switch {
		case err == nil:
		case errors.Is(err, errDrop):
			w.dropped.Add(1)
		default:
			w.svc.Log.Warn("activity tap", "subject", msg.Subject, "err", err)
		}
	}
}

// observe records one tapped message.
//
//   - outbox (mesh.agent.<from>.outbox): responds only, from must be the
//     token. Each becomes a response record, counted in messages_out of
//     <from> and in errors when the status is failed. An accept yields
//     only the request's record. Each also yields the record of the request it
//     answers (from = the respond's to, to = <from>, id = in_reply_to),
//     counted in messages_in of <from>; the several responds to one
//     request share its message id, so the request is recorded once.
//   - trace (mesh.trace.<from>): any envelope whose from is the token;
//     no counter.
//
// Requests are learnt from the answer and not from the inbox because an
// inbox takes anyone's publish: attributing a request seen there would
// cost an Ed25519 verification per request in this worker on top of the
// recipient's own, a third of the mesh's throughput (docs/bus-admission-
// activity.md). The recipient's respond, attributed by the broker, says it
// verified a request with that id from that sender. What a request record
// cannot say is the offering, which only the unverifiable request carries.
func (w *Worker) observe(kind, subject string, data []byte, hdr nats.Header) error {
	agent, ok := subjectAgent(kind, subject)
	if !ok {
		return errDrop
	}
	env, err := protocol.DecodeBrokerAttributed(data)
	if err != nil || env.From != agent {
		return errDrop
	}
	now := w.svc.Now()
	if protocol.CheckFreshness(env.TS, now, protocol.SourceLive) != nil {
		return errDrop
	}
	if kind == KindResponse {
		// Before the timeline's own checks: a protocol 0.3 late answer,
		// which ends its request, is a request, not a respond.
		w.auditAnswer(env, hdr)
	}
	observed := protocol.FormatTime(now)
	it := Item{TS: env.TS, ObservedAt: observed, Kind: kind, Type: string(env.Type), From: env.From,
		To: env.To, ID: env.ID, InReplyTo: env.InReplyTo, TaskID: token(env.TaskID), TraceID: env.Trace.TraceID}
	d := delta{first: observed, last: observed}
	switch kind {
	case KindResponse:
		if env.Type != protocol.TypeRespond {
			return errDrop
		}
		// Read off the signed bytes, without parsing the payload.
		it.Status = token(protocol.ResponseStatus(env))
		var answer *pendingAnswer
		if it.Status == protocol.StatusAccepted {
			// An accept records the request it acknowledges (so a request
			// accepted and never answered is in the timeline), but is no
			// record of its own: it is neither a message nor an answer.
			// Its own record cost a timeline write a call, about 4% of the
			// mesh's request throughput (docs/performance.md).
			w.accepts.Add(1)
		} else {
			it.Error = errorCode(protocol.ErrorObject(env), env.Extra["error"])
			d.out = 1
			if it.Status == errs.StatusFailed {
				d.errors = 1
			}
			answer = &pendingAnswer{it: it, d: d}
		}
		if keys.IsUserPublicKey(env.To) && env.InReplyTo != "" {
			// The request this answers, and the answer with it: a request
			// already recorded (by its accept, or by an earlier answer of a
			// task) makes this a duplicate, and the answer is then recorded
			// on its own once the ack says so (ackLoop).
			req := record{Item: Item{TS: env.TS, ObservedAt: observed, Kind: KindRequest, Type: string(protocol.TypeRequest),
				From: env.To, To: agent, ID: env.InReplyTo, TraceID: env.Trace.TraceID}}
			if answer != nil {
				req.Answer = &answer.it
			}
			return w.record(req, delta{in: 1, first: observed, last: observed}, agent, true, answer)
		}
		if answer == nil {
			return nil
		}
		return w.record(record{Item: it}, d, agent, true, nil)
	case KindTrace:
		it.SpanID = env.Trace.SpanID
		return w.record(record{Item: it}, d, agent, false, nil)
	}
	return errDrop
}

// pendingAnswer is an answer carried in its request's record, recorded on
// its own if that record turns out to be a duplicate.
type pendingAnswer struct {
	it Item
	d  delta
}

// record publishes one timeline record under the message id
// <kind>:<from>:<id>, and queues its ack so that, unless it was a
// duplicate, d (and answer's delta) is counted for agent; if it was one,
// answer is then published as a record of its own.
func (w *Worker) record(rec record, d delta, agent string, counted bool, answer *pendingAnswer) error {
	body := rec.appendJSON(make([]byte, 0, 512))
	fut, err := w.svc.JS.PublishAsync(recordSubject(rec.From, rec.To), body, jetstream.WithMsgID(rec.Kind+":"+rec.From+":"+rec.ID))
	if err != nil {
		return fmt.Errorf("record: %w", err)
	}
	w.closing.RLock()
	defer w.closing.RUnlock()
	if w.closed {
		return nil // stopping: the record is published; its count is lost with the copy
	}
	w.acks <- pendingRecord{fut: fut, agent: agent, d: d, counted: counted, answer: answer}
	return nil
}

// recordSubject is where a record from → to is kept.
func recordSubject(from, to string) string {
	return SubjectPrefix + subjectToken(from) + "." + subjectToken(to)
}

// subjectToken is an agent key as itself, anything else (an absent or
// sender-chosen to) as "_".
func subjectToken(key string) string {
	if keys.IsUserPublicKey(key) {
		return key
	}
	return "_"
}

// ackQueue bounds the records awaiting acknowledgement; a full queue makes
// the taps wait, which is the back-pressure JetStream asks for.
const ackQueue = 4096

// The client's cap must not bite before the worker's own.
var _ = [bus.MaxPublishAsyncPending - 2*ackQueue]struct{}{}

// pendingRecord is a published timeline record whose ack decides whether
// it is counted.
type pendingRecord struct {
	fut     jetstream.PubAckFuture
	agent   string
	d       delta
	counted bool
	answer  *pendingAnswer // carried by this record; recorded alone if it is a duplicate
}

// ackLoop reads the acknowledgements in publish order. Only a record that
// was not a duplicate is counted, so copies never count the same message.
func (w *Worker) ackLoop(acks <-chan pendingRecord, done chan<- struct{}) {
	defer close(done)
	for p := range acks {
		select {
		case ack := <-p.fut.Ok():
			if ack.Duplicate {
				w.duplicates.Add(1)
				if a := p.answer; a != nil {
					if w.carried(ack.Sequence, &a.it) {
						w.duplicates.Add(1) // the same answer again (a replay): its request's record holds it
					} else {
						w.recordAnswer(p.agent, a)
					}
				}
				continue
			}
			w.recorded.Add(1)
			if p.answer != nil {
				w.recorded.Add(1) // the answer it carries is an item of its own
			}
			if p.counted {
				w.add(p.agent, p.d)
				if a := p.answer; a != nil {
					w.add(p.agent, a.d)
				}
			}
		case err := <-p.fut.Err():
			if inProcess(err) {
				// Another copy is storing the same record right now (on a
				// replicated stream the window is the replication's round
				// trip): a duplicate whose sequence is not known yet, so
				// the answer it carries goes on its own.
				w.duplicates.Add(1)
				if a := p.answer; a != nil {
					w.recordAnswer(p.agent, a)
				}
				continue
			}
			w.svc.Log.Warn("activity record", "agent", p.agent, "err", err)
		}
	}
}

// errCodeDuplicateInProcess is JetStream's refusal of a message whose
// Nats-Msg-Id another publish is still storing ("duplicate message id is
// in process", JSStreamDuplicateMessageConflict).
const errCodeDuplicateInProcess = 10158

// inProcess reports whether err is that refusal.
func inProcess(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeDuplicateInProcess
}

// carried reports whether the record at seq (the request's, which a
// duplicate's ack names) already carries the answer it: an answer
// published again (a node republishing after a forced reconnect, or an
// agent replaying its own respond) is then neither recorded nor counted
// twice. Only a duplicate, which the usual call never makes, pays this
// read.
func (w *Worker) carried(seq uint64, it *Item) bool {
	if seq == 0 {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m, err := w.stream.GetMsg(ctx, seq)
	if err != nil {
		return false // gone (the timeline's limits): record the answer on its own
	}
	var rec record
	return json.Unmarshal(m.Data, &rec) == nil && rec.Answer != nil && rec.Answer.ID == it.ID && rec.Answer.From == it.From
}

// recordAnswer publishes an answer whose request was already recorded as
// a record of its own, for the second ack loop to count. It runs on the
// first ack loop, which it holds back only when the second is 4,096
// records behind.
func (w *Worker) recordAnswer(agent string, a *pendingAnswer) {
	body := (&record{Item: a.it}).appendJSON(make([]byte, 0, 512))
	fut, err := w.svc.JS.PublishAsync(recordSubject(a.it.From, a.it.To), body, jetstream.WithMsgID(a.it.Kind+":"+a.it.From+":"+a.it.ID))
	if err != nil {
		w.svc.Log.Warn("activity record", "agent", agent, "err", err)
		return
	}
	w.answerAcks <- pendingRecord{fut: fut, agent: agent, d: a.d, counted: true}
}

// subjectAgent is the agent token of a tapped subject; it must be an agent
// key (anything may be published on a wildcard inbox).
func subjectAgent(kind, subject string) (string, bool) {
	var agent string
	var ok bool
	switch kind {
	case KindResponse:
		agent, ok = between(subject, "mesh.agent.", ".outbox")
	case KindTrace:
		agent, ok = strings.CutPrefix(subject, "mesh.trace.")
	}
	return agent, ok && keys.IsUserPublicKey(agent)
}

func between(s, prefix, suffix string) (string, bool) {
	rest, ok := strings.CutPrefix(s, prefix)
	if !ok {
		return "", false
	}
	return strings.CutSuffix(rest, suffix)
}

// later reports whether a is after b (an unparseable b is earlier).
func later(a, b string) bool {
	ta, err := protocol.ParseTime(a)
	if err != nil {
		return false
	}
	tb, err := protocol.ParseTime(b)
	return err != nil || ta.After(tb)
}

// Metadata hygiene: identifiers, statuses and codes are kept only when
// they look like identifiers, so no sender-chosen text rides into the
// timeline under their names.
var (
	tokenRe = regexp.MustCompile(`^[A-Za-z0-9._:/@+-]{1,128}$`)
	codeRe  = regexp.MustCompile(`^[A-Z0-9_]{1,64}$`)
)

func token(s string) string {
	if tokenRe.MatchString(s) {
		return s
	}
	return ""
}

func stringOf(v any) string {
	s, _ := v.(string)
	return s
}

// errorCode is the code of the first error object among objs, "" when none
// carries one ("INVALID" when the code is not code-shaped).
func errorCode(objs ...any) string {
	for _, o := range objs {
		m, ok := o.(map[string]any)
		if !ok {
			continue
		}
		c, _ := m["code"].(string)
		if c == "" {
			continue
		}
		if !codeRe.MatchString(c) {
			return "INVALID"
		}
		return c
	}
	return ""
}

// ---------------------------------------------------------------------------
// mesh.internal.guest.erase

// MaxErase bounds one mesh.internal.guest.erase request.
const MaxErase = 1000

// eraseGuests serves mesh.internal.guest.erase, which the control plane
// calls when guest leases end (spec §3.3: "activity rows erased"):
// {keys:[guest keys]} → {erased: n}, the timeline rows purged. Every row
// from or to each key is purged by subject, its counters are removed, and
// so are its feeds' history and latest envelopes (eraseFeeds).
// Erasing twice is harmless, so a retry after a partial failure is safe.
// Only the services key may call it (FORBIDDEN otherwise).
func (w *Worker) eraseGuests(ctx context.Context, r *bus.Request) (any, error) {
	if err := w.svc.RequireServices(r); err != nil {
		return nil, err
	}
	raw, ok := r.Object()["keys"].([]any)
	if !ok || len(raw) > MaxErase {
		return nil, errs.Newf(errs.InvalidRequest, "erase takes {keys: [guest public keys]}, at most %d", MaxErase)
	}
	var erased uint64
	for _, v := range raw {
		key, ok := v.(string)
		if !ok || !keys.IsUserPublicKey(key) {
			return nil, errs.Newf(errs.InvalidRequest, "erase: %v is not a public key", v)
		}
		for _, filter := range []string{SubjectPrefix + key + ".*", SubjectPrefix + "*." + key} {
			n, err := purge(ctx, w.stream, filter)
			if err != nil {
				return nil, errs.OrUnavailable(err, "the activity timeline could not be erased; try again")
			}
			erased += n
		}
		if _, err := w.usage.Get(ctx, key); err == nil {
			if err := w.usage.Purge(ctx, key); err != nil {
				return nil, errs.OrUnavailable(fmt.Errorf("usage %s: %w", key, err), "the usage counters could not be erased; try again")
			}
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, errs.OrUnavailable(fmt.Errorf("usage %s: %w", key, err), "the usage counters could not be read; try again")
		}
		if err := w.eraseFeeds(ctx, key); err != nil {
			return nil, errs.OrUnavailable(err, "the feed history could not be erased; try again")
		}
		w.pendingMu.Lock()
		delete(w.pending, key) // this copy's unwritten counts would bring the row back
		w.pendingMu.Unlock()
	}
	return map[string]any{"erased": erased}, nil
}

// purge removes the records on filter and says how many.
func purge(ctx context.Context, st jetstream.Stream, filter string) (uint64, error) {
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return 0, fmt.Errorf("stream %s: info %s: %w", Stream, filter, err)
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	if n == 0 {
		return 0, nil
	}
	if err := st.Purge(ctx, jetstream.WithPurgeSubject(filter)); err != nil {
		return 0, fmt.Errorf("stream %s: purge %s: %w", Stream, filter, err)
	}
	return n, nil
}

// ---------------------------------------------------------------------------
// mesh.activity.list

// listActivity answers {from?, to?, limit?} with {items, total}: the newest
// matching records first, at most limit (default 100, at most 1000); total
// counts every matching record the timeline holds.
func (w *Worker) listActivity(ctx context.Context, r *bus.Request) (any, error) {
	q := r.Object()
	from, err := keyFilter(q, "from")
	if err != nil {
		return nil, err
	}
	to, err := keyFilter(q, "to")
	if err != nil {
		return nil, err
	}
	limit := DefaultLimit
	switch v := q["limit"].(type) {
	case nil:
	case float64:
		if v < 1 || v != float64(int64(v)) {
			return nil, errs.New(errs.InvalidQuery, "limit must be a positive integer")
		}
		limit = int(min(v, MaxLimit))
	default:
		return nil, errs.New(errs.InvalidQuery, "limit must be a positive integer")
	}
	scope, err := w.scope(ctx, r)
	if err != nil {
		return nil, err
	}
	if scope != nil {
		// An app names one of its account's agents: every item it then
		// reads has that agent at one end.
		switch {
		case from == "" && to == "":
			return nil, errs.New(errs.InvalidQuery, "name one of this app's account's agents in from or to")
		case !scope[from] && !scope[to]:
			if from != "" {
				return nil, notYours(from)
			}
			return nil, notYours(to)
		}
	}
	items, total, err := w.read(ctx, from, to, limit)
	if err != nil {
		return nil, err
	}
	return map[string]any{"items": items, "total": total}, nil
}

// read scans the timeline up to its last record at the time of the call.
// Without a filter only the last limit records are read and the total is
// the stream's record count; with one, every record on the subjects that
// can hold a match is read once (through the broker's filter), keeping the
// last limit matching items.
//
// A request's record may carry its answer (record.Answer), and is kept on
// the request's pair: an answer from X to Y can be on Y.X. So a filter on
// from = X reads X.* and *.X, one on to = Y reads *.Y and Y.*, and one on
// both reads X.Y and Y.X, each subject once, and items are matched one by
// one.
func (w *Worker) read(ctx context.Context, from, to string, limit int) ([]Item, int, error) {
	info, err := w.stream.Info(ctx)
	if err != nil {
		return nil, 0, fmt.Errorf("stream %s: info: %w", Stream, err)
	}
	st := info.State
	items := []Item{}
	if st.Msgs == 0 || st.LastSeq < st.FirstSeq {
		return items, 0, nil
	}
	match := func(it *Item) bool { return (from == "" || it.From == from) && (to == "" || it.To == to) }
	var filters [][2]string // subject tokens <a>.<b>, "*" for any
	switch {
	case from != "" && to != "":
		filters = [][2]string{{from, to}, {to, from}}
	case from != "":
		filters = [][2]string{{from, "*"}, {"*", from}}
	case to != "":
		filters = [][2]string{{"*", to}, {to, "*"}}
	default:
		filters = [][2]string{{"*", "*"}}
	}
	var kept []seqItem
	total := 0
	for i, f := range filters {
		start := st.FirstSeq
		if from == "" && to == "" && st.LastSeq-st.FirstSeq+1 > uint64(limit) {
			start = st.LastSeq - uint64(limit) + 1
		}
		got, n, err := w.scan(ctx, f, filters[:i], start, st.LastSeq, limit, match)
		if err != nil {
			return nil, 0, err
		}
		kept, total = append(kept, got...), total+n
	}
	// The last limit items over every filter, newest first; the items of
	// one record in their order (the request before its answer).
	slices.SortFunc(kept, func(a, b seqItem) int {
		if a.seq != b.seq {
			return cmp.Compare(b.seq, a.seq)
		}
		return cmp.Compare(b.n, a.n)
	})
	for _, k := range kept[:min(len(kept), limit)] {
		items = append(items, k.it)
	}
	if from == "" && to == "" {
		total = int(st.Msgs)
	}
	return items, total, nil
}

// seqItem is a listed item with its record's stream sequence and its place
// in that record.
type seqItem struct {
	seq uint64
	n   int
	it  Item
}

// scan reads the records on subject f from start to last, skipping those
// an earlier filter (done) already read, and returns the last limit items
// that match and how many matched.
func (w *Worker) scan(ctx context.Context, f [2]string, done [][2]string, start, last uint64, limit int, match func(*Item) bool) ([]seqItem, int, error) {
	cfg := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: start}
	if f != [2]string{"*", "*"} {
		// The broker skips every other pair's records.
		cfg.FilterSubjects = []string{SubjectPrefix + f[0] + "." + f[1]}
	}
	cons, err := w.svc.JS.OrderedConsumer(ctx, Stream, cfg)
	if err != nil {
		return nil, 0, fmt.Errorf("stream %s: consumer: %w", Stream, err)
	}
	if ci := cons.CachedInfo(); ci != nil && ci.NumPending == 0 {
		return nil, 0, nil // nothing matches: do not wait for a message
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(500))
	if err != nil {
		return nil, 0, fmt.Errorf("stream %s: read: %w", Stream, err)
	}
	defer it.Stop()
	ring := make([]seqItem, 0, limit) // the last limit matches, oldest first, rotated at next
	next, matched := 0, 0
	keep := func(si seqItem) {
		matched++
		if len(ring) < limit {
			ring = append(ring, si)
		} else {
			ring[next] = si
			next = (next + 1) % limit
		}
	}
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			return nil, 0, fmt.Errorf("stream %s: read: %w", Stream, err)
		}
		meta, err := m.Metadata()
		if err != nil {
			return nil, 0, fmt.Errorf("stream %s: metadata: %w", Stream, err)
		}
		if meta.Sequence.Stream > last {
			break
		}
		var rec record
		if !readBefore(m.Subject(), done) && json.Unmarshal(m.Data(), &rec) == nil {
			if match(&rec.Item) {
				keep(seqItem{seq: meta.Sequence.Stream, it: rec.Item})
			}
			if a := rec.Answer; a != nil && match(a) {
				keep(seqItem{seq: meta.Sequence.Stream, n: 1, it: *a})
			}
		}
		if meta.Sequence.Stream >= last || meta.NumPending == 0 {
			break
		}
	}
	return ring, matched, nil
}

// readBefore reports whether a record's subject matches one of the
// filters already read.
func readBefore(subject string, done [][2]string) bool {
	pair, ok := strings.CutPrefix(subject, SubjectPrefix)
	if !ok {
		return false
	}
	a, b, _ := strings.Cut(pair, ".")
	for _, f := range done {
		if (f[0] == "*" || f[0] == a) && (f[1] == "*" || f[1] == b) {
			return true
		}
	}
	return false
}

// keyFilter reads an optional key filter: absent, null or "" is no filter;
// anything else must be a user public key.
func keyFilter(q map[string]any, name string) (string, error) {
	switch v := q[name].(type) {
	case nil:
		return "", nil
	case string:
		if v == "" || keys.IsUserPublicKey(v) {
			return v, nil
		}
	}
	return "", errs.Newf(errs.InvalidQuery, "%s must be a public key", name)
}

// ---------------------------------------------------------------------------
// mesh.usage.list

// listUsage answers {agent?, agents?} with {agents:[counters]}, sorted by
// agent: one agent's, those of a list (at most MaxUsageAgents), or every
// agent's the caller may read (an app: its account's).
func (w *Worker) listUsage(ctx context.Context, r *bus.Request) (any, error) {
	q := r.Object()
	agent, err := keyFilter(q, "agent")
	if err != nil {
		return nil, err
	}
	var list []string
	switch v := q["agents"].(type) {
	case nil:
	case []any:
		if len(v) > MaxUsageAgents || agent != "" {
			return nil, errs.Newf(errs.InvalidQuery, "agents is a list of at most %d public keys, without agent", MaxUsageAgents)
		}
		for _, x := range v {
			k, ok := x.(string)
			if !ok || !keys.IsUserPublicKey(k) {
				return nil, errs.New(errs.InvalidQuery, "agents must be public keys")
			}
			list = append(list, k)
		}
	default:
		return nil, errs.New(errs.InvalidQuery, "agents must be a list of public keys")
	}
	if agent != "" {
		list = []string{agent}
	}
	scope, err := w.scope(ctx, r)
	if err != nil {
		return nil, err
	}
	for _, a := range list {
		if scope != nil && !scope[a] {
			return nil, notYours(a)
		}
	}
	if list == nil && scope != nil {
		list = slices.Sorted(maps.Keys(scope))
		if len(list) == 0 {
			return map[string]any{"agents": []Usage{}}, nil
		}
	}
	var out []Usage
	if list != nil {
		slices.Sort(list)
		out, err = w.usageOf(ctx, slices.Compact(list))
	} else {
		out, err = w.allUsage(ctx)
	}
	if err != nil {
		return nil, errs.OrUnavailable(err, "the usage counters could not be read; try again")
	}
	slices.SortFunc(out, func(a, b Usage) int { return strings.Compare(a.Agent, b.Agent) })
	return map[string]any{"agents": out}, nil
}

// MaxUsageAgents bounds the agents one mesh.usage.list names.
const MaxUsageAgents = 1000
