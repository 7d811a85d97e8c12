package bus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Bucket binds a KV bucket, creating it when it does not exist yet. Every
// copy of a worker calls it at start; creation races are harmless.
func Bucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("kv bucket %s: %w", cfg.Bucket, err)
	}
	return kv, nil
}

// Replicas is the replica count of a stream or bucket configured as n: 0
// (unset) is 1, a single server. The cloud's three-server cluster runs 3.
// Replicas are configuration, never code (DESIGN §4): every worker takes
// them from its Config, which the workers table fills in.
func Replicas(n int) int { return max(n, 1) }

// ErrNoChange is returned by an update function that leaves the value as it
// is; CAS then writes nothing and reports changed=false.
var ErrNoChange = errors.New("no change")

// maxCASAttempts bounds retries under contention (lost compare-and-sets;
// reads and writes nobody answered are retried until the caller's
// deadline instead). Each loser re-reads the
// winner's value and waits a short random while before trying again, so
// copies that keep colliding spread out instead of retrying in lockstep.
const maxCASAttempts = 24

// ErrContention is returned when a key stayed contended for every attempt.
var ErrContention = errors.New("kv: too much contention")

// CAS reads key into a T, lets update change it, and writes it back only if
// nobody wrote in between (revision check), retrying on conflict. exists
// tells update whether the key was there. Returning (nil, nil) deletes the
// key; returning ErrNoChange writes nothing. It reports whether this call
// changed the value, which is how exactly one copy of a worker learns it
// made a transition (and so emits the event for it).
func CAS[T any](ctx context.Context, kv jetstream.KeyValue, key string, update func(cur *T, exists bool) (*T, error)) (next *T, changed bool, err error) {
	// last is what the deciding attempt saw or wrote: the current value
	// when update made no change, the new one (nil for a delete) otherwise.
	var last *T
	_, changed, err = CASBytes(ctx, kv, key, func(raw []byte, exists bool) ([]byte, error) {
		var curp *T
		if exists {
			var cur T
			if err := json.Unmarshal(raw, &cur); err != nil {
				return nil, fmt.Errorf("kv %s: decode %s: %w", kv.Bucket(), key, err)
			}
			curp = &cur
		}
		last = curp
		next, err := update(curp, exists)
		if err != nil {
			return nil, err // ErrNoChange included: CASBytes reads it
		}
		if last = next; next == nil {
			return nil, nil
		}
		return json.Marshal(next)
	})
	if err != nil {
		return nil, false, err
	}
	return last, changed, nil
}

// CASBytes is CAS on the stored bytes as they are, for a worker that must
// keep a value byte for byte (CAS re-encodes through encoding/json). update
// gets the current value (nil when the key does not exist) and returns the
// value to write: nil deletes the key, ErrNoChange writes nothing (next is
// then the current value).
func CASBytes(ctx context.Context, kv jetstream.KeyValue, key string, update func(cur []byte, exists bool) ([]byte, error)) (next []byte, changed bool, err error) {
	conflicts, unanswered := 0, 0
	var wait time.Duration
	for {
		if wait > 0 {
			select {
			case <-ctx.Done():
				return nil, false, ctx.Err()
			case <-time.After(wait):
			}
		}
		var cur []byte
		var rev uint64
		exists := false
		rctx, cancel := context.WithTimeout(ctx, casReadTimeout)
		e, err := kv.Get(rctx, key)
		cancel()
		switch {
		case err == nil:
			cur, rev, exists = e.Value(), e.Revision(), true
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case ctx.Err() == nil && Transient(err) && unanswered < maxUnanswered:
			// Not answered: on a cluster a stream electing a leader, or a
			// request lost with a server. Reading again is always safe.
			unanswered++
			wait = unansweredBackoff(unanswered)
			continue
		default:
			return nil, false, fmt.Errorf("kv %s: get %s: %w", kv.Bucket(), key, err)
		}
		next, err := update(cur, exists)
		if errors.Is(err, ErrNoChange) {
			return cur, false, nil
		}
		if err != nil {
			return nil, false, err
		}
		switch {
		case next == nil && !exists:
			return nil, false, nil
		case next == nil:
			err = kv.Delete(ctx, key, jetstream.LastRevision(rev))
		case exists:
			_, err = kv.Update(ctx, key, next, rev)
		default:
			_, err = kv.Create(ctx, key, next)
		}
		switch {
		case err == nil:
			return next, true, nil
		case IsConflict(err):
			if conflicts++; conflicts >= maxCASAttempts {
				return nil, false, fmt.Errorf("kv %s: %s: %w", kv.Bucket(), key, ErrContention)
			}
			// Up to 1, 2, 4 … ms of jitter, capped at 64 ms.
			wait = time.Duration(rand.Int64N(int64(time.Millisecond) << min(conflicts, 6)))
		case ctx.Err() == nil && notStored(err) && unanswered < maxUnanswered:
			// The write reached no stream leader, so nothing was stored and
			// it is safe to try again. A write that timed out may have been
			// stored, and trying again would apply update twice: that is
			// the caller's error.
			unanswered++
			wait = unansweredBackoff(unanswered)
		default:
			return nil, false, fmt.Errorf("kv %s: write %s: %w", kv.Bucket(), key, err)
		}
	}
}

// maxUnanswered bounds the retries of unanswered reads and writes of one
// CASBytes (about 20 s of them), for a caller without a deadline.
const maxUnanswered = 40

// casReadTimeout bounds each read of CASBytes: a read whose request was lost
// is made again rather than waiting out the caller's whole deadline.
const casReadTimeout = 5 * time.Second

// unansweredBackoff is the wait before the n-th retry of an unanswered
// read or write: 50, 100, 200, 400 ms, then 500 ms, until the caller's
// deadline.
func unansweredBackoff(n int) time.Duration {
	return min(50*time.Millisecond<<min(n-1, 4), 500*time.Millisecond)
}

// notStored reports whether a write failed before any stream leader took
// it: nobody answered its subject, or JetStream said it is unavailable.
func notStored(err error) bool {
	if errors.Is(err, nats.ErrNoResponders) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.Code == 503
}

// IsConflict reports whether a write was refused because the key (or the
// stream's subject) moved on since it was read: a compare-and-set that
// lost. A lone server reports it as "wrong last sequence: N" (10071,
// jetstream.ErrKeyExists); a replicated stream as "wrong last sequence"
// (10164), which ErrKeyExists does not match, so a check for that alone
// takes every lost race on a cluster for a failure.
func IsConflict(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
		return true
	}
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}

// GetJSON reads key into a T; found is false when the key does not exist.
// A value that does not decode is reported with found true and the error.
func GetJSON[T any](ctx context.Context, kv jetstream.KeyValue, key string) (v T, found bool, err error) {
	v, _, found, err = GetJSONRev[T](ctx, kv, key)
	return v, found, err
}

// GetJSONRev is GetJSON that also returns the value's revision, for a caller
// that reads again later to learn whether anybody wrote in between.
func GetJSONRev[T any](ctx context.Context, kv jetstream.KeyValue, key string) (v T, rev uint64, found bool, err error) {
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return v, 0, false, nil
	}
	if err != nil {
		return v, 0, false, err
	}
	return v, e.Revision(), true, json.Unmarshal(e.Value(), &v)
}

// LazyBucket binds a KV bucket that another worker creates, when it exists:
// until then Get answers (nil, nil), asking the server again at most every
// two seconds.
type LazyBucket struct {
	JS     jetstream.JetStream
	Bucket string

	mu    sync.Mutex
	kv    jetstream.KeyValue
	tried time.Time
}

// Get returns the bucket, or nil while it does not exist.
func (l *LazyBucket) Get(ctx context.Context) (jetstream.KeyValue, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.kv != nil {
		return l.kv, nil
	}
	if !l.tried.IsZero() && time.Since(l.tried) < 2*time.Second {
		return nil, nil
	}
	l.tried = time.Now()
	kv, err := l.JS.KeyValue(ctx, l.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	l.kv = kv
	return kv, nil
}

// EachValue calls f with every live key and value of kv, in the bucket's
// order, and returns once the values present at the call have all been
// delivered. It is how a worker lists a whole bucket in one pass.
func EachValue(ctx context.Context, kv jetstream.KeyValue, f func(key string, v []byte)) error {
	watch, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return fmt.Errorf("kv %s: watch: %w", kv.Bucket(), err)
	}
	defer func() { _ = watch.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-watch.Updates():
			if !ok {
				return fmt.Errorf("kv %s: watch closed", kv.Bucket())
			}
			if e == nil {
				return nil
			}
			f(e.Key(), e.Value())
		}
	}
}

// leaderGetTimeout bounds one attempt of LeaderGet.
const leaderGetTimeout = 2 * time.Second

// LeaderGet reads key from bucket through the bucket's stream leader: the
// JetStream API's message get, answered by the leader alone, not the
// direct get that jetstream.KeyValue.Get makes, which on a replicated
// bucket any replica may answer, a follower before it has applied the
// newest acknowledged write. A reader that must see every acknowledged
// write (a security decision) reads this way; found is false for a key
// never written, deleted, purged or expired.
func LeaderGet(ctx context.Context, nc *nats.Conn, bucket, key string) (value []byte, found bool, err error) {
	value, _, found, err = LeaderGetRev(ctx, nc, bucket, key)
	return value, found, err
}

// LeaderGetRev is LeaderGet with the entry's revision (its stream
// sequence), for a compare-and-set that must start from the leader's view:
// kv.Update with that revision fails if anything was written since.
func LeaderGetRev(ctx context.Context, nc *nats.Conn, bucket, key string) (value []byte, rev uint64, found bool, err error) {
	req, err := json.Marshal(struct {
		LastBy string `json:"last_by_subj"`
	}{"$KV." + bucket + "." + key})
	if err != nil {
		return nil, 0, false, err
	}
	var msg *nats.Msg
	for attempt := 1; ; attempt++ {
		// A request the leader never answers (lost with a server, dropped
		// by a busy API queue, sent while the stream elects a leader) is
		// made again: a read is always safe to repeat.
		actx, cancel := context.WithTimeout(ctx, leaderGetTimeout)
		msg, err = nc.RequestWithContext(actx, "$JS.API.STREAM.MSG.GET.KV_"+bucket, req)
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil || !Transient(err) || attempt == maxUnanswered {
			return nil, 0, false, fmt.Errorf("kv %s: get %s from the leader: %w", bucket, key, err)
		}
		select {
		case <-ctx.Done():
			return nil, 0, false, fmt.Errorf("kv %s: get %s from the leader: %w", bucket, key, ctx.Err())
		case <-time.After(unansweredBackoff(attempt)):
		}
	}
	var resp struct {
		Message *struct {
			Seq  uint64 `json:"seq"`
			Hdrs []byte `json:"hdrs"`
			Data []byte `json:"data"`
		} `json:"message"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return nil, 0, false, fmt.Errorf("kv %s: get %s from the leader: %w", bucket, key, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return nil, 0, false, nil
	case resp.Error != nil:
		return nil, 0, false, fmt.Errorf("kv %s: get %s from the leader: %w", bucket, key, resp.Error)
	case resp.Message == nil:
		return nil, 0, false, fmt.Errorf("kv %s: get %s from the leader: an answer with no message", bucket, key)
	}
	if len(resp.Message.Hdrs) > 0 {
		hdr, err := nats.DecodeHeadersMsg(resp.Message.Hdrs)
		if err != nil {
			return nil, 0, false, fmt.Errorf("kv %s: get %s from the leader: %w", bucket, key, err)
		}
		// A delete or purge marker, or the marker of an expired key.
		if hdr.Get("KV-Operation") != "" || hdr.Get(jetstream.MarkerReasonHeader) != "" {
			return nil, 0, false, nil
		}
	}
	return resp.Message.Data, resp.Message.Seq, true, nil
}
