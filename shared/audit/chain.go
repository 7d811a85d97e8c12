package audit

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/keys"
)

// JetStream names. Every agent's chain, every anchored head's proof and
// every anchor record live in one stream (DESIGN §5: streams are counted),
// each under its own subject, which only service credentials reach.
const (
	Stream        = "MESH_AUDIT"
	SubjectPrefix = "mesh.internal.audit."
	// RowPrefix + <agent> holds the agent's chain, one row per message,
	// in chain order. An append is a compare-and-set on the subject's last
	// sequence (DESIGN §6).
	RowPrefix = SubjectPrefix + "row."
	// ProofPrefix + <agent> holds one Proof per anchor that first
	// committed to a new head of the agent's chain.
	ProofPrefix = SubjectPrefix + "proof."
	// AnchorPrefix + <date> holds the anchor record of a date
	// (StreamAnchors), the last message being the current one.
	AnchorPrefix = SubjectPrefix + "anchor."
)

// Limits bound the audit stream. The stream discards new messages when
// full: an append then fails loudly rather than an old row silently
// disappearing and breaking its chain.
type Limits struct {
	// MaxBytes bounds the whole stream.
	MaxBytes int64
	// MaxMsgSize bounds one message; an anchor record with its tokens is
	// the largest (a few KB per authority).
	MaxMsgSize int32
}

// DefaultLimits: 8 GiB in all (about 16 million rows), 256 KiB per message.
var DefaultLimits = Limits{MaxBytes: 8 << 30, MaxMsgSize: 256 << 10}

// DedupWindow is how long a publish's Nats-Msg-Id is remembered: an append
// whose acknowledgement was lost is sent again, identically, within it, and
// the stream then answers with the first one's acknowledgement; and an
// entry's Key is recognised within it. 15 minutes covers what a writer
// that checks the protocol's freshness window (10 minutes old, 5 ahead)
// can see twice.
const DedupWindow = 15 * time.Minute

// StreamConfig is the one definition of the audit stream every creator uses.
func StreamConfig(l Limits, replicas int) jetstream.StreamConfig {
	if l.MaxBytes == 0 {
		l.MaxBytes = DefaultLimits.MaxBytes
	}
	if l.MaxMsgSize == 0 {
		l.MaxMsgSize = DefaultLimits.MaxMsgSize
	}
	return jetstream.StreamConfig{
		Name:        Stream,
		Description: "audit chains (one subject per agent), their anchored heads' proofs, and anchor records",
		Subjects:    []string{SubjectPrefix + ">"},
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardNew,
		MaxBytes:    l.MaxBytes,
		MaxMsgSize:  l.MaxMsgSize,
		Duplicates:  DedupWindow,
		Storage:     jetstream.FileStorage,
		Replicas:    bus.Replicas(replicas),
		// Direct gets serve the batch reads (jetstreamext) of heads and
		// chains; rollups keep one message per anchor record.
		AllowDirect: true,
		AllowRollup: true,
	}
}

// Chains is the audit stream: the per-agent chains and what the anchors
// record about them. Several copies (one per worker or function instance)
// may append to the same chain at once; each append is a compare-and-set on
// the chain's last sequence, so a chain never forks or skips.
type Chains struct {
	js     jetstream.JetStream
	stream jetstream.Stream
	now    func() time.Time

	// heads remembers, per chain, the last row this Chains appended and
	// its stream sequence, so that the next append to the chain skips
	// reading its head: a writer that sees the chain's traffic appends
	// with one round trip, not two. A stale entry (another writer
	// appended since) costs one refused compare-and-set, after which the
	// head is read again.
	headMu sync.Mutex
	heads  map[string]cachedHead
}

// cachedHead is a chain's last row as this Chains last wrote it.
type cachedHead struct {
	head Head
	seq  uint64
}

// maxCachedHeads bounds Chains.heads; past it the map starts again.
const maxCachedHeads = 1 << 16

// cachedHeadOf returns the remembered head of agent's chain.
func (c *Chains) cachedHeadOf(agent string) (*Head, uint64, bool) {
	c.headMu.Lock()
	defer c.headMu.Unlock()
	h, ok := c.heads[agent]
	if !ok {
		return nil, 0, false
	}
	return &h.head, h.seq, true
}

// remember keeps h, stored at stream sequence seq, as agent's head; a zero
// seq forgets it.
func (c *Chains) remember(agent string, h Head, seq uint64) {
	c.headMu.Lock()
	defer c.headMu.Unlock()
	if seq == 0 {
		delete(c.heads, agent)
		return
	}
	if c.heads == nil || len(c.heads) >= maxCachedHeads {
		c.heads = map[string]cachedHead{}
	}
	c.heads[agent] = cachedHead{head: h, seq: seq}
}

// ChainsConfig is what OpenChains needs.
type ChainsConfig struct {
	JS       jetstream.JetStream
	Limits   Limits
	Replicas int
	// Now stamps rows whose entry has no time (time.Now when nil).
	Now func() time.Time
}

// OpenChains creates or updates the audit stream and binds it: what the
// stream's owner (the activity worker, which writes the request rows)
// does at start.
func OpenChains(ctx context.Context, cfg ChainsConfig) (*Chains, error) {
	st, err := cfg.JS.CreateOrUpdateStream(ctx, StreamConfig(cfg.Limits, cfg.Replicas))
	if err != nil {
		return nil, fmt.Errorf("audit: stream %s: %w", Stream, err)
	}
	return newChains(cfg, st), nil
}

func newChains(cfg ChainsConfig, st jetstream.Stream) *Chains {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Chains{js: cfg.JS, stream: st, now: cfg.Now}
}

// Attempt bounds of an append.
const (
	// maxConflicts bounds the appends lost to other writers of one chain.
	maxConflicts = 64
	// maxResends bounds the resends of a publish nobody acknowledged.
	maxResends = 40
)

// ErrContention is returned when an append lost every attempt to other
// writers of the same chain.
var ErrContention = errors.New("audit: the chain stayed contended")

// errCodeDuplicateInProcess is a replicated stream's answer to a publish
// whose Nats-Msg-Id is being stored right now (a resend racing the first).
const errCodeDuplicateInProcess = 10158

// ErrDuplicate is returned by Append, with the row already stored, for an
// entry whose Key was appended to the same chain within DedupWindow.
var ErrDuplicate = errors.New("audit: that event is already recorded")

// Append adds the entry to its agent's chain and returns the row and its
// hash. A lost compare-and-set (another writer appended first) reads the
// new head and tries again; a publish nobody acknowledged is sent again
// unchanged, under the same Nats-Msg-Id, so it is stored at most once. An
// entry with a Key already recorded returns that row and ErrDuplicate.
func (c *Chains) Append(ctx context.Context, e Entry) (Row, string, error) {
	if err := e.Check(); err != nil {
		return Row{}, "", err
	}
	at := e.At
	if at.IsZero() {
		at = c.now()
	}
	subj := RowPrefix + e.Agent
	head, lastSeq, cached := c.cachedHeadOf(e.Agent)
	for conflicts := 0; ; {
		fromCache := cached
		if !cached {
			var err error
			if head, lastSeq, err = c.lastRow(ctx, subj); err != nil {
				return Row{}, "", err
			}
		}
		cached = false // a retry reads the head
		row := e.row(head, at)
		data, err := row.Canonical()
		if err != nil {
			return Row{}, "", err
		}
		hash := hashCanonicalRow(data)
		// The id names the row itself: a resend of this exact row within
		// the stream's duplicate window is acknowledged as the first. With
		// a key it names the event instead, whatever row it became.
		id := fmt.Sprintf("%s:%d:%s", e.Agent, row.Seq, hash[:32])
		if e.Key != "" {
			id = keyID(e.Agent, e.Key)
		}
		ack, resent, err := c.publishOnce(ctx, &nats.Msg{Subject: subj, Data: data}, jetstream.WithExpectLastSequencePerSubject(lastSeq), jetstream.WithMsgID(id))
		if err == nil && ack != nil && ack.Duplicate && e.Key != "" {
			// The key was recorded, by this call's lost first send (the
			// same row) or by another: the row the stream holds says.
			c.remember(e.Agent, Head{}, 0)
			stored, shash, err := c.rowAt(ctx, ack.Sequence)
			if err != nil {
				return Row{}, "", fmt.Errorf("audit: append to %s: %w", e.Agent, err)
			}
			if shash == hash {
				return row, hash, nil
			}
			return stored, shash, ErrDuplicate
		}
		if err != nil && resent && bus.IsConflict(err) {
			// The stream checks the expected sequence before the
			// duplicate id (on one server), so a resend of a row that was
			// stored is refused as a conflict: the row after lastSeq then
			// says whether it was this one.
			landed, lerr := c.slotIs(ctx, subj, lastSeq, hash)
			if lerr != nil {
				return Row{}, "", fmt.Errorf("audit: append to %s: %w", e.Agent, lerr)
			}
			if landed {
				err = nil
			}
		}
		switch {
		case err == nil:
			if ack != nil && !ack.Duplicate {
				c.remember(e.Agent, Head{Agent: e.Agent, Seq: row.Seq, Hash: hash}, ack.Sequence)
			} else {
				c.remember(e.Agent, Head{}, 0) // stored, at a sequence not known here
			}
			return row, hash, nil
		case bus.IsConflict(err):
			c.remember(e.Agent, Head{}, 0)
			if fromCache {
				// A remembered head gone stale is no contention: read
				// the head and try again at once.
				continue
			}
			if conflicts++; conflicts >= maxConflicts {
				return Row{}, "", fmt.Errorf("audit: append to %s: %w", e.Agent, ErrContention)
			}
			if err := sleep(ctx, jitter(conflicts)); err != nil {
				return Row{}, "", err
			}
		default:
			return Row{}, "", fmt.Errorf("audit: append to %s: %w", e.Agent, err)
		}
	}
}

// publishOnce publishes msg, sending it again, unchanged, while nobody
// acknowledges it; resent reports whether it did. A message resent after
// it was stored comes back as a duplicate of it (its Nats-Msg-Id) or, when
// it also expects a last sequence, as a conflict the caller must look into
// (Append's slotIs): either way it is stored once.
func (c *Chains) publishOnce(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (ack *jetstream.PubAck, resent bool, err error) {
	for resends := 0; ; resends++ {
		ack, err := c.js.PublishMsg(ctx, msg, opts...)
		var apiErr *jetstream.APIError
		inProcess := errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeDuplicateInProcess
		if err == nil || (!inProcess && !bus.Transient(err)) || ctx.Err() != nil || resends == maxResends {
			return ack, resends > 0, err
		}
		if err := sleep(ctx, min(50*time.Millisecond<<min(resends, 4), 500*time.Millisecond)); err != nil {
			return nil, true, err
		}
	}
}

// keyID is the Nats-Msg-Id of an entry with a key: a digest of the agent
// and the key (128 bits), short because the stream keeps every id of its
// duplicate window in memory (at 2,000 answered requests a second, 15
// minutes of ids are 3.6 million).
func keyID(agent, key string) string {
	h := sha256.New()
	h.Write([]byte(agent))
	h.Write([]byte{0})
	h.Write([]byte(key))
	return "k" + base64.RawURLEncoding.EncodeToString(h.Sum(nil)[:16])
}

// rowAt reads the row stored at stream sequence seq and its hash.
func (c *Chains) rowAt(ctx context.Context, seq uint64) (Row, string, error) {
	m, err := c.stream.GetMsg(ctx, seq)
	if err != nil {
		return Row{}, "", fmt.Errorf("read the row at %d: %w", seq, err)
	}
	r, err := DecodeRow(m.Data)
	if err != nil {
		return Row{}, "", err
	}
	return r, hashCanonicalRow(m.Data), nil
}

// slotIs reports whether the first message on subj after stream sequence
// after is a row hashing to hash. It asks the stream's leader (the
// JetStream API's message get, not a direct get a follower may answer
// before it has the newest write).
func (c *Chains) slotIs(ctx context.Context, subj string, after uint64, hash string) (bool, error) {
	req, err := json.Marshal(struct {
		Seq  uint64 `json:"seq"`
		Next string `json:"next_by_subj"`
	}{after + 1, subj})
	if err != nil {
		return false, err
	}
	msg, err := c.js.Conn().RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+Stream, req)
	if err != nil {
		return false, fmt.Errorf("read the row after %d: %w", after, err)
	}
	var resp struct {
		Message *struct {
			Data []byte `json:"data"`
		} `json:"message"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return false, fmt.Errorf("read the row after %d: %w", after, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return false, nil
	case resp.Error != nil:
		return false, fmt.Errorf("read the row after %d: %w", after, resp.Error)
	case resp.Message == nil:
		return false, fmt.Errorf("read the row after %d: an answer with no message", after)
	}
	return hashCanonicalRow(resp.Message.Data) == hash, nil
}

// lastRow reads the head of a chain: the last row and its stream sequence
// (nil and 0 for a chain not begun).
func (c *Chains) lastRow(ctx context.Context, subj string) (*Head, uint64, error) {
	var msg *jetstream.RawStreamMsg
	var err error
	for attempt := 1; ; attempt++ {
		msg, err = c.stream.GetLastMsgForSubject(ctx, subj)
		if err == nil || errors.Is(err, jetstream.ErrMsgNotFound) || !bus.Transient(err) || ctx.Err() != nil || attempt == maxResends {
			break
		}
		if err := sleep(ctx, min(50*time.Millisecond<<min(attempt, 4), 500*time.Millisecond)); err != nil {
			return nil, 0, err
		}
	}
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return nil, 0, nil
	case err != nil:
		return nil, 0, fmt.Errorf("audit: read the head of %s: %w", subj, err)
	}
	row, err := DecodeRow(msg.Data)
	if err != nil {
		return nil, 0, fmt.Errorf("audit: the head of %s: %w", subj, err)
	}
	return &Head{Agent: row.Agent, Seq: row.Seq, Hash: hashCanonicalRow(msg.Data)}, msg.Sequence, nil
}

// Head returns the head of an agent's chain; found is false for a chain not
// begun.
func (c *Chains) Head(ctx context.Context, agent string) (h Head, found bool, err error) {
	if !keys.IsUserPublicKey(agent) {
		return Head{}, false, fmt.Errorf("%w: agent must be an agent key", ErrInvalidEntry)
	}
	p, _, err := c.lastRow(ctx, RowPrefix+agent)
	if err != nil || p == nil {
		return Head{}, false, err
	}
	return *p, true, nil
}

// readBatch is how many messages one batch read asks for (a variable so
// that a test reads in small batches).
var readBatch = 512

// each calls f with every message on subj in stream order, a batch read
// (jetstreamext.GetBatch) at a time.
func (c *Chains) each(ctx context.Context, subj string, f func(*jetstream.RawStreamMsg) error) error {
	next := uint64(1)
	for {
		msgs, err := jetstreamext.GetBatch(ctx, c.js, Stream, readBatch, jetstreamext.GetBatchSubject(subj), jetstreamext.GetBatchSeq(next))
		if err != nil {
			return fmt.Errorf("audit: read %s: %w", subj, err)
		}
		n := 0
		for m, err := range msgs {
			if errors.Is(err, jetstreamext.ErrNoMessages) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("audit: read %s: %w", subj, err)
			}
			n++
			next = m.Sequence + 1
			if err := f(m); err != nil {
				return err
			}
		}
		// A batch may stop short of readBatch (the server bounds its bytes),
		// so only an empty one ends the read.
		if n == 0 {
			return nil
		}
	}
}

// ErrBrokenChain is wrapped when a chain read from the stream does not
// link: the stream was written by something other than Append.
var ErrBrokenChain = errors.New("audit: broken chain")

// Rows returns an agent's whole chain, first row first, checking as it
// reads that every row is canonical and links to the one before.
func (c *Chains) Rows(ctx context.Context, agent string) ([]Row, error) {
	if !keys.IsUserPublicKey(agent) {
		return nil, fmt.Errorf("%w: agent must be an agent key", ErrInvalidEntry)
	}
	var rows []Row
	prev := GenesisPrev
	err := c.each(ctx, RowPrefix+agent, func(m *jetstream.RawStreamMsg) error {
		r, err := DecodeRow(m.Data)
		if err != nil {
			return err
		}
		canon, err := r.Canonical()
		if err != nil {
			return err
		}
		if string(canon) != string(m.Data) || r.Agent != agent || r.Seq != int64(len(rows))+1 || r.Prev != prev {
			return fmt.Errorf("%w: %s at row %d", ErrBrokenChain, agent, len(rows)+1)
		}
		prev = hashCanonicalRow(m.Data)
		rows = append(rows, r)
		return nil
	})
	return rows, err
}

// maxMultiLast is how many subjects one GetLastMsgsFor names: the server
// answers at most 1,024 subjects per request.
const maxMultiLast = 1000

// lastOf returns the last message of each subject in subjects, up to t
// when t is not zero, keyed by subject.
func (c *Chains) lastOf(ctx context.Context, subjects []string, t time.Time) (map[string]*jetstream.RawStreamMsg, error) {
	out := make(map[string]*jetstream.RawStreamMsg, len(subjects))
	for chunk := range slices.Chunk(subjects, maxMultiLast) {
		var opts []jetstreamext.GetLastForOpt
		if !t.IsZero() {
			opts = append(opts, jetstreamext.GetLastMsgsUpToTime(t))
		}
		msgs, err := jetstreamext.GetLastMsgsFor(ctx, c.js, Stream, chunk, opts...)
		if err != nil {
			return nil, fmt.Errorf("audit: read the last messages: %w", err)
		}
		for m, err := range msgs {
			if errors.Is(err, jetstreamext.ErrNoMessages) {
				break
			}
			if err != nil {
				return nil, fmt.Errorf("audit: read the last messages: %w", err)
			}
			out[m.Subject] = m
		}
	}
	return out, nil
}

// subjects lists the subjects under prefix that hold messages, sorted.
func (c *Chains) subjects(ctx context.Context, prefix string) ([]string, error) {
	info, err := c.stream.Info(ctx, jetstream.WithSubjectFilter(prefix+"*"))
	if err != nil {
		return nil, fmt.Errorf("audit: list %s*: %w", prefix, err)
	}
	out := make([]string, 0, len(info.State.Subjects))
	for s := range info.State.Subjects {
		out = append(out, s)
	}
	slices.Sort(out)
	return out, nil
}

// HeadsAt returns the head of every chain as it stood at t: for each agent,
// the last row the stream stored before t (by the stream's clock), sorted
// by agent. The answer for a t in the past does not change as rows are
// appended, so the anchor of a date can be computed again.
func (c *Chains) HeadsAt(ctx context.Context, t time.Time) ([]Head, error) {
	subjects, err := c.subjects(ctx, RowPrefix)
	if err != nil || len(subjects) == 0 {
		return nil, err
	}
	last, err := c.lastOf(ctx, subjects, t)
	if err != nil {
		return nil, err
	}
	heads := make([]Head, 0, len(last))
	for _, subj := range subjects {
		m, ok := last[subj]
		if !ok {
			continue // begun after t
		}
		r, err := DecodeRow(m.Data)
		if err != nil {
			return nil, fmt.Errorf("audit: the head of %s: %w", subj, err)
		}
		if RowPrefix+r.Agent != subj {
			return nil, fmt.Errorf("%w: a row of %s on %s", ErrBrokenChain, r.Agent, subj)
		}
		heads = append(heads, Head{Agent: r.Agent, Seq: r.Seq, Hash: hashCanonicalRow(m.Data)})
	}
	return heads, nil
}

// RecordProofs keeps the inclusion proof of each head of an anchor whose
// chain moved since the anchor that last proved it: an export ships, per
// chain, one proof per head some anchor first committed to. It is
// idempotent: a proof already recorded (by this or another copy) is not
// recorded again, and each agent's proofs are appended with a
// compare-and-set, so two anchor jobs racing record each proof once.
func (c *Chains) RecordProofs(ctx context.Context, proofs []Proof) error {
	subjects := make([]string, len(proofs))
	for i, p := range proofs {
		subjects[i] = ProofPrefix + p.Agent
	}
	last, err := c.lastOf(ctx, subjects, time.Time{})
	if err != nil {
		return err
	}
	for _, p := range proofs {
		if err := c.recordProof(ctx, p, last[ProofPrefix+p.Agent]); err != nil {
			return err
		}
	}
	return nil
}

// recordProof appends p to its agent's proofs unless the last one (m, nil
// for none) already proves the same head or is of a later anchor.
func (c *Chains) recordProof(ctx context.Context, p Proof, m *jetstream.RawStreamMsg) error {
	subj := ProofPrefix + p.Agent
	data, err := json.Marshal(p)
	if err != nil {
		return err
	}
	for conflicts := 0; ; {
		var lastSeq uint64
		if m != nil {
			var prev Proof
			if err := json.Unmarshal(m.Data, &prev); err != nil {
				return fmt.Errorf("audit: the last proof of %s: %w", p.Agent, err)
			}
			if prev.Hash == p.Hash || prev.Date >= p.Date {
				return nil
			}
			lastSeq = m.Sequence
		}
		// A resend of a proof that was stored is refused as a conflict;
		// the proof read again then shows it.
		_, _, err := c.publishOnce(ctx, &nats.Msg{Subject: subj, Data: data}, jetstream.WithExpectLastSequencePerSubject(lastSeq),
			jetstream.WithMsgID("proof:"+p.Agent+":"+p.Date))
		switch {
		case err == nil:
			return nil
		case bus.IsConflict(err):
			if conflicts++; conflicts >= maxConflicts {
				return fmt.Errorf("audit: record the proof of %s: %w", p.Agent, ErrContention)
			}
			if m, err = c.stream.GetLastMsgForSubject(ctx, subj); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
				return fmt.Errorf("audit: read the proofs of %s: %w", p.Agent, err)
			}
		default:
			return fmt.Errorf("audit: record the proof of %s: %w", p.Agent, err)
		}
	}
}

// Proofs returns the recorded proofs of an agent's chain, oldest first.
func (c *Chains) Proofs(ctx context.Context, agent string) ([]Proof, error) {
	if !keys.IsUserPublicKey(agent) {
		return nil, fmt.Errorf("%w: agent must be an agent key", ErrInvalidEntry)
	}
	var out []Proof
	err := c.each(ctx, ProofPrefix+agent, func(m *jetstream.RawStreamMsg) error {
		var p Proof
		if err := json.Unmarshal(m.Data, &p); err != nil {
			return fmt.Errorf("audit: a proof of %s: %w", agent, err)
		}
		out = append(out, p)
		return nil
	})
	return out, err
}

// Purge removes an agent's chain and proofs (account closure). Anchors
// already made still commit to the purged heads; closure says so.
func (c *Chains) Purge(ctx context.Context, agent string) error {
	if !keys.IsUserPublicKey(agent) {
		return fmt.Errorf("%w: agent must be an agent key", ErrInvalidEntry)
	}
	c.remember(agent, Head{}, 0)
	for _, subj := range []string{RowPrefix + agent, ProofPrefix + agent} {
		if err := c.stream.Purge(ctx, jetstream.WithPurgeSubject(subj)); err != nil {
			return fmt.Errorf("audit: purge %s: %w", subj, err)
		}
	}
	return nil
}

// jitter is the wait after the n-th lost compare-and-set: up to 1, 2, 4 …
// ms, capped at 64 ms, so writers that keep colliding spread out.
func jitter(n int) time.Duration {
	return time.Duration(rand.Int64N(int64(time.Millisecond) << min(n, 6)))
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
