package feeds

// The ordered history of stream feeds (spec §6: kind stream is "ordered
// history"; upstream-notes §6.4 names a MESH_FEED stream on the feed
// subjects). One stream, MESH_FEED, captures every publish on
// mesh.feed.*.* at the broker, in the order the broker receives them, with
// a per-subject bound, so each feed keeps its newest History.PerFeed
// envelopes. The broker, not a worker, writes it: no copy can reorder two
// publishes, and history keeps arriving while every copy restarts. What the
// broker stored is not verified, so mesh.feed.get with since or limit
// verifies each envelope as it reads (readHistory) and answers only the
// stream-kind emits of the feed's owner that were live when stored.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// Stream is the history stream of every feed.
const Stream = "MESH_FEED"

// History bounds the history stream (docs/bus-presence-feeds.md).
type History struct {
	// PerFeed is how many envelopes one feed keeps; a new one evicts the
	// feed's oldest.
	PerFeed int64
	// MaxAge is how long an envelope is kept.
	MaxAge time.Duration
	// MaxBytes bounds the whole stream; past it the oldest envelopes of
	// any feed go first.
	MaxBytes int64
	// MaxMsgSize is the largest publish kept; a larger one is delivered
	// live (and kept as the feed's latest) but not in its history.
	MaxMsgSize int64
}

// DefaultHistory: 1,000 envelopes per feed, 7 days, 256 MiB in all, 64 KiB
// per envelope (one feed holds at most 64 MiB of history).
var DefaultHistory = History{PerFeed: 1000, MaxAge: 7 * 24 * time.Hour, MaxBytes: 256 << 20, MaxMsgSize: 64 << 10}

func (h History) orDefault() History {
	d := DefaultHistory
	if h.PerFeed > 0 {
		d.PerFeed = h.PerFeed
	}
	if h.MaxAge > 0 {
		d.MaxAge = h.MaxAge
	}
	if h.MaxBytes > 0 {
		d.MaxBytes = h.MaxBytes
	}
	if h.MaxMsgSize > 0 {
		d.MaxMsgSize = h.MaxMsgSize
	}
	return d
}

// Reads of the history.
const (
	// DefaultHistoryLimit is how many envelopes one read answers when the
	// query names no limit; MaxHistoryLimit the most it may ask for.
	DefaultHistoryLimit = 100
	MaxHistoryLimit     = 1000
	// historyPageBytes bounds the stored bytes one read answers (the broker
	// stops after the message that reaches it), so the answer, with one more
	// envelope of at most MaxMsgSize, stays under the transport's 1 MiB.
	historyPageBytes = 256 << 10
	// maxHistoryMsgSize caps History.MaxMsgSize for the same reason.
	maxHistoryMsgSize = 256 << 10
	// numPendingHeader is what a batched direct get says is left after
	// each message, on the query's subject.
	numPendingHeader = "Nats-Num-Pending"
)

// StreamConfig is the one configuration of the history stream for h and
// replicas (bus.Replicas); every copy creates or updates it with exactly
// this, so concurrent starts agree.
func StreamConfig(h History, replicas int) jetstream.StreamConfig {
	h = h.orDefault()
	return jetstream.StreamConfig{
		Name:        Stream,
		Description: "ordered history of every feed, read through mesh.feed.get",
		Subjects:    []string{protocol.FeedSubject("*", "*")},
		Retention:   jetstream.LimitsPolicy,
		// Discard old: a feed is a ring of its newest envelopes.
		Discard:           jetstream.DiscardOld,
		MaxMsgsPerSubject: h.PerFeed,
		MaxAge:            h.MaxAge,
		MaxBytes:          h.MaxBytes,
		MaxMsgSize:        int32(min(h.MaxMsgSize, maxHistoryMsgSize)),
		Storage:           jetstream.FileStorage,
		Replicas:          bus.Replicas(replicas),
		// jetstreamext.GetBatch reads through the direct get API.
		AllowDirect: true,
	}
}

// jsStorageExceeded is JetStream's "insufficient storage resources";
// minHistoryBytes is the smallest bound ensureStream falls back to.
const (
	jsStorageExceeded = 10047
	minHistoryBytes   = 16 << 20
)

// ensureStream creates or updates the history stream. The broker reserves
// a stream's byte bound on its disk: where it cannot reserve h.MaxBytes the
// bound is halved until it can (down to minHistoryBytes), as the mailbox
// does, and the bound in force is returned.
func ensureStream(ctx context.Context, js jetstream.JetStream, h History, replicas int) (History, error) {
	h = h.orDefault()
	var err error
	for range 64 { // halvings down to the floor, and retries
		if _, err = js.CreateOrUpdateStream(ctx, StreamConfig(h, replicas)); err == nil {
			return h, nil
		}
		var apiErr *jetstream.APIError
		switch {
		case ctx.Err() != nil:
			return h, fmt.Errorf("feed stream %s: %w", Stream, err)
		case errors.As(err, &apiErr) && apiErr.ErrorCode == jsStorageExceeded && h.MaxBytes/2 >= minHistoryBytes:
			h.MaxBytes /= 2
		default:
			time.Sleep(50 * time.Millisecond) // a concurrent creator may have won
		}
	}
	return h, fmt.Errorf("feed stream %s: %w", Stream, err)
}

// historyQuery is a read of a feed's history: entries stored after
// sequence after, or (when from is set) stored at or after from; at most
// limit of them.
type historyQuery struct {
	after uint64
	from  time.Time
	limit int
}

// parseHistoryQuery reads since and limit of a mesh.feed.get payload. ok
// is false when neither is present: the query asks for the latest envelope.
func parseHistoryQuery(q map[string]any) (hq historyQuery, ok bool, err error) {
	since, hasSince := q["since"]
	limit, hasLimit := q["limit"]
	hasSince, hasLimit = hasSince && since != nil, hasLimit && limit != nil
	if !hasSince && !hasLimit {
		return hq, false, nil
	}
	hq.limit = DefaultHistoryLimit
	switch v := since.(type) {
	case nil:
	case float64:
		if v < 0 || v != math.Trunc(v) || v > 1<<53 {
			return hq, true, errs.New(errs.InvalidQuery, "since must be a sequence (a non-negative integer) or an RFC 3339 time")
		}
		hq.after = uint64(v)
	case string:
		t, perr := protocol.ParseTime(v)
		if perr != nil {
			return hq, true, errs.New(errs.InvalidQuery, "since must be a sequence (a non-negative integer) or an RFC 3339 time")
		}
		hq.from = t
	default:
		return hq, true, errs.New(errs.InvalidQuery, "since must be a sequence (a non-negative integer) or an RFC 3339 time")
	}
	if hasLimit {
		n, isNum := limit.(float64)
		if !isNum || n < 1 || n != math.Trunc(n) {
			return hq, true, errs.New(errs.InvalidQuery, "limit must be a positive integer")
		}
		hq.limit = int(min(n, MaxHistoryLimit))
	}
	return hq, true, nil
}

// historyEntry is one envelope of a history answer.
type historyEntry struct {
	Seq      uint64          `json:"seq"`
	Envelope json.RawMessage `json:"envelope"`
}

// historyAnswer is mesh.feed.get's answer to a history query.
type historyAnswer struct {
	History []historyEntry `json:"history"`
	// Last is the stream sequence of the last stored message this read
	// looked at (answered or skipped): the since of the next read.
	Last uint64 `json:"last"`
	// More: the feed has stored messages after Last.
	More bool `json:"more"`
}

// readHistory answers one history query in one request to the stream
// (jetstreamext.GetBatch, direct gets filtered to the feed's subject).
// Stored messages that are not stream-kind emits of the feed's owner, live
// when stored, are skipped (the broker stores whatever the publisher's
// credential may publish), as is a repeat of an envelope id already in
// the answer (a publisher's retry).
func (w *Worker) readHistory(ctx context.Context, agent, topic string, q historyQuery) (historyAnswer, error) {
	out := historyAnswer{History: []historyEntry{}, Last: q.after}
	opts := []jetstreamext.GetBatchOpt{
		jetstreamext.GetBatchSubject(protocol.FeedSubject(agent, topic)),
		jetstreamext.GetBatchMaxBytes(historyPageBytes),
	}
	if q.from.IsZero() {
		opts = append(opts, jetstreamext.GetBatchSeq(q.after+1))
	} else {
		opts = append(opts, jetstreamext.GetBatchStartTime(q.from))
	}
	msgs, err := jetstreamext.GetBatch(ctx, w.svc.JS, Stream, q.limit, opts...)
	if err != nil {
		return out, fmt.Errorf("stream %s: get batch: %w", Stream, err)
	}
	seen := map[string]bool{}
	for m, err := range msgs {
		if errors.Is(err, jetstreamext.ErrNoMessages) {
			break
		}
		if err != nil {
			return out, fmt.Errorf("stream %s: get batch: %w", Stream, err)
		}
		out.Last = m.Sequence
		pending, _ := strconv.ParseUint(m.Header.Get(numPendingHeader), 10, 64)
		out.More = pending > 0
		id, ok := historyEnvelope(m.Data, agent, topic, m.Time)
		if !ok || seen[id] {
			continue
		}
		seen[id] = true
		out.History = append(out.History, historyEntry{Seq: m.Sequence, Envelope: json.RawMessage(m.Data)})
	}
	return out, nil
}

// historyEnvelope checks one stored message of agent's feed topic: a
// signed emit from agent, {topic, kind: "stream", data} with the feed's
// topic, whose ts was within the live window of when the broker stored it
// (the check the worker makes of a live publish). It returns the
// envelope's id.
func historyEnvelope(data []byte, agent, topic string, stored time.Time) (string, bool) {
	env, err := protocol.Decode(data)
	if err != nil || env.Type != protocol.TypeEmit || env.From != agent {
		return "", false
	}
	if protocol.CheckFreshness(env.TS, stored, protocol.SourceLive) != nil {
		return "", false
	}
	var p struct {
		Topic string          `json:"topic"`
		Kind  string          `json:"kind"`
		Data  json.RawMessage `json:"data"`
	}
	if env.DecodePayload(&p) != nil || p.Topic != topic || p.Kind != KindStream || p.Data == nil {
		return "", false
	}
	return env.ID, true
}
