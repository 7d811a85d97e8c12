package rooms

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"
)

// Batch reads (DESIGN §5): many keys of the bucket, or the last message of
// many record subjects, in one direct-get request each rather than an
// ordered consumer per read.

// kvStream is the stream behind the bucket.
const kvStream = "KV_" + Bucket

// kvSubject is the stream subject of a key (or key pattern) of the bucket.
func kvSubject(key string) string { return "$KV." + Bucket + "." + key }

// maxMultiLast is how many subjects one multi-last direct get names
// (nats-server refuses, 413, a request matching more than 1,024).
const maxMultiLast = 512

// kvEntry is one live key of the bucket.
type kvEntry struct {
	Key   string
	Value []byte
	// Written is when the key's current value was written.
	Written time.Time
}

// kvValues returns the live keys matching patterns (keys, or key patterns
// with wildcards), in one direct get per maxMultiLast patterns. A pattern
// matching more keys than one answer may carry is read with a watch
// instead.
func (w *Worker) kvValues(ctx context.Context, patterns ...string) ([]kvEntry, error) {
	var out []kvEntry
	for start := 0; start < len(patterns); start += maxMultiLast {
		chunk := patterns[start:min(start+maxMultiLast, len(patterns))]
		subjects := make([]string, len(chunk))
		for i, p := range chunk {
			subjects[i] = kvSubject(p)
		}
		got, err := w.lastMsgs(ctx, kvStream, subjects)
		if errors.Is(err, errTooMany) {
			got, err = w.watchValues(ctx, chunk)
		}
		if err != nil {
			return nil, fmt.Errorf("rooms: read %s: %w", Bucket, err)
		}
		for _, m := range got {
			if m.Header.Get("KV-Operation") != "" || m.Header.Get(jetstream.MarkerReasonHeader) != "" {
				continue // a deleted or purged key
			}
			out = append(out, kvEntry{Key: m.Subject[len(kvSubject("")):], Value: m.Data, Written: m.Time})
		}
	}
	return out, nil
}

// errTooMany is a multi-last get whose answer would be too long.
var errTooMany = errors.New("too many messages for one batch read")

// lastMsgs is the last message of every subject matching subjects in
// stream, in one request; none matching is no messages, not an error.
func (w *Worker) lastMsgs(ctx context.Context, stream string, subjects []string) ([]*jetstream.RawStreamMsg, error) {
	if len(subjects) == 0 {
		return nil, nil
	}
	it, err := jetstreamext.GetLastMsgsFor(ctx, w.js, stream, subjects)
	if err != nil {
		return nil, err
	}
	var out []*jetstream.RawStreamMsg
	for m, err := range it {
		switch {
		case errors.Is(err, jetstreamext.ErrNoMessages):
			return nil, nil
		case errors.Is(err, jetstreamext.ErrBatchUnsupported):
			// The server's 413 (too many results) carries no pending
			// count, which is how the client library reports it.
			return nil, errTooMany
		case err != nil:
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

// watchValues reads the keys matching patterns with a watch: for a
// pattern matching more keys than one batch read answers.
func (w *Worker) watchValues(ctx context.Context, patterns []string) ([]*jetstream.RawStreamMsg, error) {
	watch, err := w.kv.WatchFiltered(ctx, patterns, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer func() { _ = watch.Stop() }()
	var out []*jetstream.RawStreamMsg
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-watch.Updates():
			if !ok {
				return nil, errors.New("watch closed")
			}
			if e == nil {
				return out, nil
			}
			out = append(out, &jetstream.RawStreamMsg{Subject: kvSubject(e.Key()), Data: e.Value(), Time: e.Created()})
		}
	}
}

// keysMatching lists the live keys matching pattern.
func (w *Worker) keysMatching(ctx context.Context, pattern string) ([]string, error) {
	l, err := w.kv.ListKeysFiltered(ctx, pattern)
	if err != nil {
		return nil, fmt.Errorf("rooms: list %s: %w", pattern, err)
	}
	defer func() { _ = l.Stop() }()
	var out []string
	for k := range l.Keys() {
		out = append(out, k)
	}
	return out, nil
}
