// Package feeds keeps the latest envelope of every feed and the ordered
// history of stream feeds (spec §4.3, §5, §6, upstream-notes §6.4). An
// agent publishes a signed emit {topic, kind, data} on
// mesh.feed.<agent>.<topic>; the worker stores the envelope's exact wire
// bytes in KV mesh_feeds under <agent>.<topic>, for state and stream feeds
// alike, never letting an older envelope replace a newer one; the stream
// MESH_FEED keeps each feed's newest envelopes in the order they arrived
// (history.go). mesh.feed.get {agent, topic} answers the latest envelope,
// and with since or limit a page of the history.
package feeds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// Name is the worker's name (micro service mesh-feeds, queue group
// bus.QueueGroup(Name)).
const Name = "feeds"

// Bucket is the KV bucket of latest envelopes, keyed <agent>.<topic>.
const Bucket = "mesh_feeds"

// Feed kinds (protocol.FeedKindState, protocol.FeedKindStream).
const (
	KindState  = protocol.FeedKindState
	KindStream = protocol.FeedKindStream
)

// Config tunes the worker; zero values take the defaults.
type Config struct {
	// Replicas of the worker's bucket and stream (bus.Replicas: 0 is 1,
	// one server; the cloud's cluster runs 3, set by the workers table).
	Replicas int
	// History bounds the history stream (DefaultHistory).
	History History
}

// Stats counts what one copy did with the publishes it received.
type Stats struct {
	Stored     uint64 // became the latest envelope of its feed
	Superseded uint64 // valid, but not newer than the stored one
	Dropped    uint64 // refused: bad subject, envelope, sender, freshness or payload
}

// Worker is one running copy of the feeds worker.
type Worker struct {
	svc *bus.Service
	kv  jetstream.KeyValue
	now func() time.Time
	sub *nats.Subscription

	stored, superseded, dropped atomic.Uint64
	stopErr                     error
	stopOnce                    sync.Once
}

// Start runs one copy of the worker in env: binds the bucket, serves
// mesh.feed.get and subscribes mesh.feed.*.* in the worker's queue group.
func Start(ctx context.Context, env bus.Env, cfg Config) (*Worker, error) {
	svc, err := bus.NewServiceIn(env, Name, "latest envelope and history of every feed")
	if err != nil {
		return nil, err
	}
	kv, err := bus.Bucket(ctx, svc.JS, jetstream.KeyValueConfig{Bucket: Bucket, Description: "latest envelope of every feed, keyed <agent>.<topic>",
		Replicas: bus.Replicas(cfg.Replicas)})
	if err != nil {
		_ = svc.Stop()
		return nil, err
	}
	h, err := ensureStream(ctx, svc.JS, cfg.History, cfg.Replicas)
	if err != nil {
		_ = svc.Stop()
		return nil, err
	}
	if want := cfg.History.orDefault().MaxBytes; h.MaxBytes < want {
		svc.Log.Warn("feed history bound lowered: the broker could not reserve the configured bytes on its disk",
			"stream", Stream, "configured_bytes", want, "bytes", h.MaxBytes)
	}
	w := &Worker{svc: svc, kv: kv, now: svc.Now}
	if err := svc.Endpoint("get", protocol.SubjFeedGet, w.get); err != nil {
		_ = svc.Stop()
		return nil, fmt.Errorf("%s: endpoint: %w", Name, err)
	}
	// mesh.feed.get has three tokens, so it never matches the four-token
	// publish wildcard.
	w.sub, err = env.NC.QueueSubscribe(protocol.FeedSubject("*", "*"), bus.QueueGroup(Name), w.onPublish)
	if err != nil {
		_ = svc.Stop()
		return nil, fmt.Errorf("%s: subscribe feeds: %w", Name, err)
	}
	if err := env.NC.Flush(); err != nil {
		w.Stop()
		return nil, fmt.Errorf("%s: flush: %w", Name, err)
	}
	return w, nil
}

// Stop ends the copy. It is safe to call more than once; the first call's
// error is returned every time.
func (w *Worker) Stop() error {
	w.stopOnce.Do(func() {
		var errs []error
		if w.sub != nil {
			errs = append(errs, w.sub.Unsubscribe())
		}
		errs = append(errs, w.svc.Stop())
		w.stopErr = errors.Join(errs...)
	})
	return w.stopErr
}

// Stats reports this copy's counters.
func (w *Worker) Stats() Stats {
	return Stats{Stored: w.stored.Load(), Superseded: w.superseded.Load(), Dropped: w.dropped.Load()}
}

// Key is the KV key of a feed.
func Key(agent, topic string) string { return agent + "." + topic }

var errDrop = errors.New("feed publish dropped")

func (w *Worker) onPublish(msg *nats.Msg) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stored, err := w.publish(ctx, msg.Subject, msg.Data)
	switch {
	case err != nil:
		w.dropped.Add(1)
		if !errors.Is(err, errDrop) {
			w.svc.Log.Warn("feed publish", "subject", msg.Subject, "err", err)
		}
	case stored:
		w.stored.Add(1)
	default:
		w.superseded.Add(1)
	}
}

// publish checks one publish and stores it if it is the newest envelope
// of its feed. The broker already lets only the owner publish on its own
// feeds; the checks here are defence in depth.
func (w *Worker) publish(ctx context.Context, subject string, data []byte) (bool, error) {
	agent, topic, err := protocol.ParseFeedSubject(subject)
	if err != nil {
		return false, errDrop
	}
	env, err := protocol.Decode(data)
	if err != nil || env.Type != protocol.TypeEmit || env.From != agent {
		return false, errDrop
	}
	if protocol.CheckFreshness(env.TS, w.now(), protocol.SourceLive) != nil {
		return false, errDrop
	}
	if _, err := PayloadOf(env, topic); err != nil {
		return false, errDrop
	}
	ts, err := protocol.ParseTime(env.TS)
	if err != nil {
		return false, errDrop
	}
	return w.store(ctx, Key(agent, topic), data, ts, env.ID)
}

// store writes wire under key unless the stored envelope is as new or newer
// (by ts, then id). The bytes are stored exactly as received, hence
// bus.CASBytes (bus.CAS re-encodes through encoding/json).
func (w *Worker) store(ctx context.Context, key string, wire []byte, ts time.Time, id string) (bool, error) {
	_, stored, err := bus.CASBytes(ctx, w.kv, key, func(cur []byte, exists bool) ([]byte, error) {
		if exists && !newer(ts, id, cur) {
			return nil, bus.ErrNoChange
		}
		return wire, nil
	})
	return stored, err
}

// newer reports whether (ts, id) orders after the stored envelope. A stored
// value that does not parse is replaced.
func newer(ts time.Time, id string, stored []byte) bool {
	var cur struct {
		TS string `json:"ts"`
		ID string `json:"id"`
	}
	if json.Unmarshal(stored, &cur) != nil {
		return true
	}
	ct, err := protocol.ParseTime(cur.TS)
	if err != nil {
		return true
	}
	if c := ts.Compare(ct); c != 0 {
		return c > 0
	}
	return id > cur.ID
}

// get answers mesh.feed.get {agent, topic} with {found:true, envelope} or
// {found:false, envelope:null}; with since or limit, {agent, topic, since?,
// limit?}, with a page of the feed's history (readHistory).
func (w *Worker) get(ctx context.Context, r *bus.Request) (any, error) {
	if r.Env.Type != protocol.TypeDiscover && r.Env.Type != protocol.TypeRequest {
		return nil, errs.New(errs.InvalidEnvelope, "mesh.feed.get takes a discover or request envelope")
	}
	q := r.Object()
	agent, _ := q["agent"].(string)
	topic, _ := q["topic"].(string)
	if !keys.IsUserPublicKey(agent) {
		return nil, errs.New(errs.InvalidQuery, "agent must be an agent public key")
	}
	if !protocol.ValidToken(topic) {
		return nil, errs.New(errs.InvalidQuery, "topic must be one subject token: [A-Za-z0-9_-]{1,128}")
	}
	hq, history, err := parseHistoryQuery(q)
	if err != nil {
		return nil, err
	}
	if history {
		ans, err := w.readHistory(ctx, agent, topic, hq)
		if err != nil {
			return nil, errs.OrUnavailable(err, "the feed history could not be read; try again")
		}
		return ans, nil
	}
	e, err := w.kv.Get(ctx, Key(agent, topic))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return LookupAnswer(false, nil), nil
	}
	if err != nil {
		return nil, fmt.Errorf("kv %s: get: %w", Bucket, err)
	}
	return LookupAnswer(true, e.Value()), nil
}
