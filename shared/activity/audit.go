package activity

import (
	"context"
	"errors"
	"hash/fnv"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/audit"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// The audit rows (spec §2.11, docs/audit.md "Where rows come from"). The
// outbox tap sees every answer an agent sends, attributed by the broker;
// the one that ends a request carries its runtime's audit headers
// (protocol.HdrAudit*: the offering, the input's SHA-256, the duration),
// which the signed answer itself cannot. For each such answer the copy
// that took it appends one row, to the responder's chain only, naming the
// requester as its peer, keyed by (role, peer, request id). The requester's
// chain is not written: the answer's to and in_reply_to are the responder's
// word alone, and a row there on that word would let any agent write
// made-up rows into another agent's chain. The tap's queue
// group gives a message to one copy, and the key makes an answer seen twice
// (republished, replayed within the freshness window) one row, whichever
// copy sees it (audit.Entry.Key).
//
// Appends are compare-and-set round trips, so a tap never makes them: it
// queues the entries for the copy's writers (AuditConfig.Writers), and a
// full queue makes the tap wait, as a full ack queue does.

// AuditConfig configures the audit rows a copy writes.
type AuditConfig struct {
	// Off writes no rows: for tests of the timeline alone. The mesh writes
	// them.
	Off bool
	// Limits bound the audit stream (audit.DefaultLimits when zero).
	Limits audit.Limits
	// Writers is how many appends a copy makes at once
	// (DefaultAuditWriters when 0).
	Writers int
	// Queue bounds the rows waiting for the writers, shared among them
	// (DefaultAuditQueue when 0).
	Queue int
}

// Defaults of AuditConfig.
const (
	DefaultAuditWriters = 8
	DefaultAuditQueue   = 4096
	// auditAppendTimeout bounds one append, its retries included.
	auditAppendTimeout = 30 * time.Second
	// maxAuditDuration bounds a stated duration (a longer one is a lie or
	// a broken clock, and is recorded as 0).
	maxAuditDuration = 366 * 24 * time.Hour
)

// auditStats counts what a copy's writers did.
type auditStats struct {
	rows, duplicates, failed uint64
}

// startAudit binds the audit stream and starts the writers, unless off.
func (w *Worker) startAudit(ctx context.Context) error {
	a := w.cfg.Audit
	if a.Off {
		return nil
	}
	chains, err := audit.OpenChains(ctx, audit.ChainsConfig{JS: w.svc.JS, Limits: a.Limits, Replicas: w.cfg.Replicas, Now: w.svc.Now})
	if err != nil {
		return err
	}
	if a.Writers <= 0 {
		a.Writers = DefaultAuditWriters
	}
	if a.Queue <= 0 {
		a.Queue = DefaultAuditQueue
	}
	w.chains = chains
	// One queue per writer, an agent's entries always to the same one: a
	// copy appends to a chain one row at a time, in the order it saw the
	// answers, and its writer's remembered head of the chain stays good
	// (audit.Chains), so an append is one round trip unless another copy
	// appended to the chain in between.
	w.auditQs = make([]chan audit.Entry, a.Writers)
	w.auditDone = make(chan struct{})
	done := make(chan struct{}, a.Writers)
	for i := range w.auditQs {
		q := make(chan audit.Entry, max(a.Queue/a.Writers, 1))
		w.auditQs[i] = q
		go func() {
			defer func() { done <- struct{}{} }()
			for e := range q {
				w.appendRow(e)
			}
		}()
	}
	go func() {
		for range a.Writers {
			<-done
		}
		close(w.auditDone)
	}()
	return nil
}

// appendRow appends one entry and counts the outcome.
func (w *Worker) appendRow(e audit.Entry) {
	ctx, cancel := context.WithTimeout(context.Background(), auditAppendTimeout)
	defer cancel()
	_, _, err := w.chains.Append(ctx, e)
	switch {
	case err == nil:
		w.auditRows.Add(1)
	case errors.Is(err, audit.ErrDuplicate):
		w.auditDuplicates.Add(1)
	default:
		w.auditFailed.Add(1)
		w.svc.Log.Warn("audit row not recorded", "agent", e.Agent, "role", e.Role, "request", e.RequestID, "err", err)
	}
}

// auditAnswer queues the rows of an answer whose copy states that it ends
// its request (the runtime's audit headers). env is from the agent of the
// outbox it was tapped on, and fresh.
func (w *Worker) auditAnswer(env *protocol.Envelope, hdr nats.Header) {
	if w.chains == nil {
		return
	}
	entries := auditEntries(env, hdr)
	if len(entries) == 0 {
		return
	}
	w.closing.RLock()
	defer w.closing.RUnlock()
	if w.closed {
		return
	}
	for _, e := range entries {
		w.auditQs[writerOf(e.Agent, len(w.auditQs))] <- e
	}
}

// auditEntries are the rows of an answer from env.From whose copy states
// that it ends its request (hdr): one, in the responder's chain, naming
// the requester (env.To) as its peer; never one in the requester's chain,
// which env.To alone does not prove. Whatever the statement and the answer say, every
// entry is one audit.Entry.Check accepts (FuzzAuditEntries), or there is
// none.
func auditEntries(env *protocol.Envelope, hdr nats.Header) []audit.Entry {
	if hdr == nil || hdr.Get(protocol.HdrAuditInput) == "" || !keys.IsUserPublicKey(env.From) {
		return nil
	}
	requestID, peer := env.InReplyTo, env.To
	if requestID == "" || peer == "" || !auditText(requestID, 128) || !auditText(peer, 128) {
		return nil // nothing a row could name
	}
	at, err := protocol.ParseTime(env.TS)
	if err != nil {
		return nil
	}
	outcome := errorCode(protocol.ErrorObject(env), env.Extra["error"])
	if outcome == "" {
		outcome = token(protocol.ResponseStatus(env))
	}
	if outcome == "" || len(outcome) > 64 {
		outcome = "answered"
	}
	e := audit.Entry{Agent: env.From, Role: audit.RoleResponder, Peer: peer, RequestID: requestID, Outcome: outcome, At: at,
		Key: audit.RoleResponder + ":" + peer + ":" + requestID}
	if v := hdr.Get(protocol.HdrAuditInput); audit.IsHash(v) {
		e.InputSHA256 = v
	}
	if v := hdr.Get(protocol.HdrAuditOffering); auditText(v, 256) {
		e.Offering = v
	}
	if ms, err := strconv.ParseInt(hdr.Get(protocol.HdrAuditDuration), 10, 64); err == nil && ms >= 0 && ms <= maxAuditDuration.Milliseconds() {
		e.Duration = time.Duration(ms) * time.Millisecond
	}
	if auditText(env.TaskID, 128) {
		e.TaskID = env.TaskID
	}
	return []audit.Entry{e}
}

// writerOf is the writer an agent's entries go to.
func writerOf(agent string, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(agent))
	return int(h.Sum32() % uint32(n))
}

// auditText reports whether s can stand in a row as it is: valid UTF-8 of
// at most n bytes without control characters (the rows' own rule).
func auditText(s string, n int) bool {
	if len(s) > n || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}

// auditStopped waits for the writers to append what is queued, once the
// queue is closed, for at most the append timeout.
func (w *Worker) auditStopped() {
	if w.auditDone == nil {
		return
	}
	select {
	case <-w.auditDone:
	case <-time.After(auditAppendTimeout):
		queued := 0
		for _, q := range w.auditQs {
			queued += len(q)
		}
		w.svc.Log.Warn("audit rows still queued at stop", "queued", queued)
	}
}
