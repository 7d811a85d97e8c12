// Package artifacts is the mesh's artifact store (upstream-notes §14: the
// artifact service mesh.artifacts.{put,fetch,stat,remove,usage,put.begin,
// put.commit,link}), for files larger than a room's drive holds (512 KB)
// and for artifacts a task answers with by reference.
//
// The bytes are in the JetStream object store mesh_artifacts (spec's
// storage table), one object per part of at most Limits.ChunkBytes (512 KiB,
// what fits in one message with its base64 and envelope), named
// <object id>/<index>. A file is put whole in one message when it fits, or
// in parts: put.begin declares its size and digest and reserves the quota,
// each part is one mesh.artifacts.put {object_id, index, data_b64}, and
// put.commit checks the parts against the declared digest. Reads are in
// parts as well: fetch answers one part from an offset, and says where the
// next begins.
//
// What the store knows about each artifact, each owner's usage and each
// link is in the KV bucket mesh_artifacts_index, changed by compare-and-set
// so any copy may answer any call. An artifact's ref is its read capability:
// whoever holds it may fetch, stat and link it; only its owner (the agent
// that put it) may remove it. docs/artifacts.md has the payloads.
package artifacts

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/ratelimit"
)

// Name is the worker's name (micro service mesh-artifacts, queue group
// bus.QueueGroup(Name)).
const Name = "artifacts"

// ObjectStore holds the artifacts' bytes (spec's object store name);
// Bucket what the store knows about them.
const (
	ObjectStore = "mesh_artifacts"
	Bucket      = "mesh_artifacts_index"
)

// Keys of the bucket:
//
//	obj.<id>       object: one artifact's owner, size, digest, state, expiry
//	usage.<owner>  usage: what one owner's artifacts hold against the quota
//	link.<id>      link: a reference to an artifact that expires
func objKey(id string) string      { return "obj." + id }
func usageKey(owner string) string { return "usage." + owner }
func linkKey(id string) string     { return "link." + id }

// partName is the object holding part index of artifact id.
func partName(id string, index int) string { return id + "/" + strconv.Itoa(index) }

// Limits of the store. The zero value of a member takes its default.
type Limits struct {
	// ChunkBytes is the most bytes one put or one fetch answer carries:
	// 512 KiB, whose base64 and envelope stay well inside the transport's
	// 1 MiB message.
	ChunkBytes int64
	// ObjectBytes is the largest artifact: 256 MiB.
	ObjectBytes int64
	// OwnerBytes and OwnerObjects bound one owner's artifacts (an owner is
	// the agent key that put them; the mesh cannot tell which operator an
	// agent is): 1 GiB and 1,000. Begun uploads count from put.begin.
	OwnerBytes   int64
	OwnerObjects int
	// Retain is how long an artifact is kept when put without retain_days:
	// 8 days, the task retention window (7 days) and a day's grace;
	// MaxRetain bounds retain_days: 30 days.
	Retain, MaxRetain time.Duration
	// UploadTTL is how long a begun upload waits for its put.commit: 1 h.
	UploadTTL time.Duration
	// LinkTTL is a link's life when none is asked for (1 h); MaxLinkTTL
	// bounds the asked (7 days). A link never outlives its artifact.
	LinkTTL, MaxLinkTTL time.Duration
	// Tombstone is how long a removed or expired artifact answers
	// ARTIFACT_GONE rather than NOT_FOUND: 30 days.
	Tombstone time.Duration
	// StoreBytes bounds the object store as a whole (its MaxBytes), a
	// backstop behind the owners' quotas: 4 GiB. A put past it is
	// QUOTA_EXCEEDED. Every server reserves a stream's MaxBytes of its
	// JetStream storage and refuses a stream that does not fit beside the
	// others' (the audit chain's 8 GiB, the mailbox's 1 GiB, the feeds'
	// 256 MiB; the cloud's servers have 15G, about 14 GiB), so the worker
	// would not start with more than they have left.
	StoreBytes int64
}

// Defaults.
const (
	DefaultChunkBytes   = 512 << 10
	DefaultObjectBytes  = 256 << 20
	DefaultOwnerBytes   = 1 << 30
	DefaultOwnerObjects = 1000
	DefaultRetain       = 8 * 24 * time.Hour
	DefaultMaxRetain    = 30 * 24 * time.Hour
	DefaultUploadTTL    = time.Hour
	DefaultLinkTTL      = time.Hour
	DefaultMaxLinkTTL   = 7 * 24 * time.Hour
	DefaultTombstone    = 30 * 24 * time.Hour
	DefaultStoreBytes   = 4 << 30
	DefaultSweepEvery   = 10 * time.Minute
)

// DefaultLimits are the limits of the reference deployment.
var DefaultLimits = Limits{ChunkBytes: DefaultChunkBytes, ObjectBytes: DefaultObjectBytes, OwnerBytes: DefaultOwnerBytes,
	OwnerObjects: DefaultOwnerObjects, Retain: DefaultRetain, MaxRetain: DefaultMaxRetain, UploadTTL: DefaultUploadTTL,
	LinkTTL: DefaultLinkTTL, MaxLinkTTL: DefaultMaxLinkTTL, Tombstone: DefaultTombstone, StoreBytes: DefaultStoreBytes}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits
	set := func(v int64, dst *int64) {
		if v > 0 {
			*dst = v
		}
	}
	setD := func(v time.Duration, dst *time.Duration) {
		if v > 0 {
			*dst = v
		}
	}
	set(l.ChunkBytes, &d.ChunkBytes)
	set(l.ObjectBytes, &d.ObjectBytes)
	set(l.OwnerBytes, &d.OwnerBytes)
	if l.OwnerObjects > 0 {
		d.OwnerObjects = l.OwnerObjects
	}
	setD(l.Retain, &d.Retain)
	setD(l.MaxRetain, &d.MaxRetain)
	setD(l.UploadTTL, &d.UploadTTL)
	setD(l.LinkTTL, &d.LinkTTL)
	setD(l.MaxLinkTTL, &d.MaxLinkTTL)
	setD(l.Tombstone, &d.Tombstone)
	set(l.StoreBytes, &d.StoreBytes)
	return d
}

// Knobs are the limits as a worker binary's flags and MESH_* variables.
func (l *Limits) Knobs() []ratelimit.Knob {
	return []ratelimit.Knob{
		ratelimit.SizeKnob("limit-artifact-bytes", "largest artifact the store keeps", 1<<20, &l.ObjectBytes),
		ratelimit.SizeKnob("limit-artifact-owner-bytes", "bytes one agent's artifacts hold in all", 1<<20, &l.OwnerBytes),
		ratelimit.SizeKnob("limit-artifact-store-bytes", "bytes the artifact store holds in all, every agent's artifacts together", 1<<20, &l.StoreBytes),
		ratelimit.DurationKnob("limit-artifact-retain", "how long an artifact put without retain_days is kept", time.Hour, &l.Retain),
		ratelimit.DurationKnob("limit-artifact-max-retain", "the longest retain_days honours", time.Hour, &l.MaxRetain),
	}
}

// Config configures the worker.
type Config struct {
	// Replicas of the object store and the bucket (bus.Replicas: 0 is 1).
	Replicas int
	Limits   Limits
	// SweepEvery is how often each copy drops expired artifacts, abandoned
	// uploads and expired links (DefaultSweepEvery when 0; never when
	// negative, for tests that call Sweep).
	SweepEvery time.Duration
}

// Worker is one running copy of the artifacts worker.
type Worker struct {
	svc    *bus.Service
	kv     jetstream.KeyValue
	obj    jetstream.ObjectStore
	limits Limits
	now    func() time.Time

	cancel   context.CancelFunc
	done     chan struct{}
	stopOnce sync.Once
	stopErr  error
}

// Start runs one copy of the artifacts worker in env.
func Start(ctx context.Context, env bus.Env, cfg Config) (*Worker, error) {
	svc, err := bus.NewServiceIn(env, Name, "artifact store: put, fetch, stat, remove, usage, chunked uploads, links")
	if err != nil {
		return nil, err
	}
	w := &Worker{svc: svc, limits: cfg.Limits.withDefaults(), now: svc.Now, done: make(chan struct{})}
	fail := func(err error) (*Worker, error) {
		close(w.done)
		_ = svc.Stop()
		return nil, err
	}
	w.kv, err = bus.Bucket(ctx, svc.JS, jetstream.KeyValueConfig{Bucket: Bucket,
		Description: "artifact store: artifacts, owners' usage, links", Replicas: bus.Replicas(cfg.Replicas)})
	if err != nil {
		return fail(err)
	}
	w.obj, err = svc.JS.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: ObjectStore,
		Description: "artifact bytes, one object per part: <id>/<index>", Storage: jetstream.FileStorage,
		MaxBytes: w.limits.StoreBytes, Replicas: bus.Replicas(cfg.Replicas)})
	if err != nil {
		return fail(fmt.Errorf("%s: object store %s: %w", Name, ObjectStore, err))
	}
	for _, ep := range []struct {
		name, verb string
		h          bus.Handler
	}{
		{"put", "put", w.put}, {"put-begin", "put.begin", w.begin}, {"put-commit", "put.commit", w.commit},
		{"fetch", "fetch", w.fetch}, {"stat", "stat", w.stat}, {"remove", "remove", w.remove},
		{"usage", "usage", w.usage}, {"link", "link", w.link},
	} {
		if err := svc.Endpoint(ep.name, protocol.ArtifactVerbSubject(ep.verb), ep.h); err != nil {
			return fail(fmt.Errorf("%s: endpoint %s: %w", Name, ep.verb, err))
		}
	}
	if err := env.NC.Flush(); err != nil {
		return fail(fmt.Errorf("%s: flush: %w", Name, err))
	}
	sctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	every := cfg.SweepEvery
	if every == 0 {
		every = DefaultSweepEvery
	}
	go func() {
		defer close(w.done)
		if every > 0 {
			bus.Every(sctx, every, func(ctx context.Context) {
				if err := w.Sweep(ctx); err != nil {
					w.svc.Log.Warn("artifacts: sweep", "err", err)
				}
			})
		}
	}()
	return w, nil
}

// Stop ends the copy; safe to call more than once.
func (w *Worker) Stop() error {
	w.stopOnce.Do(func() {
		if w.cancel != nil {
			w.cancel()
		}
		<-w.done
		w.stopErr = w.svc.Stop()
	})
	return w.stopErr
}

// States of an artifact.
const (
	statePending = "pending" // begun, its parts arriving
	stateStored  = "stored"  // committed: fetchable until it expires
	stateGone    = "gone"    // removed, expired, abandoned or refused at commit
)

// object is what the store knows about one artifact, key obj.<id>.
type object struct {
	ID        string `json:"id"`
	Owner     string `json:"owner"`
	Name      string `json:"name,omitempty"`
	MediaType string `json:"media_type"`
	Size      int64  `json:"size"`
	// DigestHex is the sha256 of the whole file: computed by put, declared
	// by put.begin and checked by put.commit.
	DigestHex string `json:"digest"`
	// PartDigests are the sha256 of each part as the commit read and
	// hashed it, recorded by the same compare-and-set that seals the
	// artifact. A part put that was checked while the upload was pending
	// may still land after the commit hashed it; fetch serves a part only
	// if its bytes hash to what is recorded here, so the bytes served
	// always are the bytes the digest was computed over. (Empty on an
	// artifact sealed before they were recorded.)
	PartDigests []string `json:"part_digests,omitempty"`
	ChunkBytes  int64    `json:"chunk_bytes"`
	State       string   `json:"state"`
	// Retain is the life the owner asked for, counted from the commit.
	Retain    time.Duration `json:"retain"`
	CreatedAt time.Time     `json:"created_at"`
	// UploadBy is a pending upload's deadline.
	UploadBy  time.Time `json:"upload_by"`
	ExpiresAt time.Time `json:"expires_at"`
	GoneAt    time.Time `json:"gone_at"`
	GoneWhy   string    `json:"gone_why,omitempty"`
	// Cleaned is set once a gone artifact's parts are deleted and its
	// quota given back.
	Cleaned bool `json:"cleaned,omitempty"`
}

// parts is how many parts the artifact has.
func (o *object) parts() int {
	if o.Size == 0 {
		return 1
	}
	return int((o.Size + o.ChunkBytes - 1) / o.ChunkBytes)
}

// partLen is the length of part i.
func (o *object) partLen(i int) int64 {
	return min(o.ChunkBytes, o.Size-int64(i)*o.ChunkBytes)
}

// usage is one owner's artifacts against the quota, key usage.<owner>.
// Held names each artifact counted, so counting is idempotent: an artifact
// is counted once however often its reservation is retried, and given back
// once however many copies clean it.
type usage struct {
	Bytes   int64            `json:"bytes"`
	Objects int              `json:"objects"`
	Held    map[string]int64 `json:"held"`
}

// link is a reference to an artifact that expires, key link.<id>.
type link struct {
	Object       string    `json:"object"`
	ExpiresAt    time.Time `json:"expires_at"`
	DownloadName string    `json:"download_name,omitempty"`
	By           string    `json:"by"`
}

// newID is 18 random bytes in base64url: an unguessable id.
func newID() string {
	var b [18]byte
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// reserve counts artifact id of size bytes against owner's quota (a no-op
// when it is counted already), refusing with QUOTA_EXCEEDED past it.
func (w *Worker) reserve(ctx context.Context, owner, id string, size int64) error {
	_, _, err := bus.CAS(ctx, w.kv, usageKey(owner), func(cur *usage, exists bool) (*usage, error) {
		u := usage{Held: map[string]int64{}}
		if exists {
			u = *cur
			if u.Held == nil {
				u.Held = map[string]int64{}
			}
		}
		if _, ok := u.Held[id]; ok {
			return nil, bus.ErrNoChange
		}
		if u.Objects+1 > w.limits.OwnerObjects {
			return nil, errs.Newf(errs.QuotaExceeded, "you hold %d artifacts, the most one agent may: remove some with mesh.artifacts.remove", u.Objects)
		}
		if u.Bytes+size > w.limits.OwnerBytes {
			return nil, errs.Newf(errs.QuotaExceeded, "your artifacts hold %d of %d bytes; this %d-byte file does not fit: remove some with mesh.artifacts.remove",
				u.Bytes, w.limits.OwnerBytes, size)
		}
		u.Held[id] = size
		u.Bytes += size
		u.Objects++
		return &u, nil
	})
	return err
}

// release gives back what artifact id holds of owner's quota (a no-op when
// it holds nothing).
func (w *Worker) release(ctx context.Context, owner, id string) error {
	_, _, err := bus.CAS(ctx, w.kv, usageKey(owner), func(cur *usage, exists bool) (*usage, error) {
		if !exists {
			return nil, bus.ErrNoChange
		}
		size, ok := cur.Held[id]
		if !ok {
			return nil, bus.ErrNoChange
		}
		delete(cur.Held, id)
		cur.Bytes -= size
		cur.Objects--
		return cur, nil
	})
	return err
}

// load reads artifact id through the bucket's stream leader: a call just
// after the one that wrote it, answered by another copy through another
// server, sees the write.
func (w *Worker) load(ctx context.Context, id string) (object, bool, error) {
	raw, found, err := bus.LeaderGet(ctx, w.svc.NC, Bucket, objKey(id))
	if err != nil || !found {
		return object{}, false, err
	}
	var o object
	if err := json.Unmarshal(raw, &o); err != nil {
		return object{}, false, fmt.Errorf("artifacts: decode %s: %w", objKey(id), err)
	}
	return o, true, nil
}

// transition moves artifact id from one of the states from to the state
// change sets, by compare-and-set; it reports the artifact as it now is
// and whether this call moved it.
func (w *Worker) transition(ctx context.Context, id string, from []string, change func(o *object)) (object, bool, error) {
	next, changed, err := bus.CAS(ctx, w.kv, objKey(id), func(cur *object, exists bool) (*object, error) {
		if !exists {
			return nil, errs.Newf(errs.NotFound, "no artifact %s", Ref(id))
		}
		for _, s := range from {
			if cur.State == s {
				change(cur)
				return cur, nil
			}
		}
		return nil, bus.ErrNoChange
	})
	if err != nil {
		return object{}, false, err
	}
	return *next, changed, nil
}

// drop makes artifact id gone (why says how) unless it is gone already,
// then cleans it: its parts are deleted and its quota given back.
func (w *Worker) drop(ctx context.Context, id, why string, from ...string) (object, bool, error) {
	o, changed, err := w.transition(ctx, id, from, func(o *object) {
		o.State, o.GoneAt, o.GoneWhy = stateGone, w.now(), why
	})
	if err != nil {
		return o, false, err
	}
	if o.State == stateGone && !o.Cleaned {
		if err := w.clean(ctx, o); err != nil {
			return o, changed, err
		}
	}
	return o, changed, nil
}

// clean deletes a gone artifact's parts and gives its quota back, then
// marks it cleaned. Every step may be repeated: a copy that stops half way
// leaves the rest to the sweep.
func (w *Worker) clean(ctx context.Context, o object) error {
	for i := range o.parts() {
		if err := w.obj.Delete(ctx, partName(o.ID, i)); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
			return fmt.Errorf("artifacts: delete %s: %w", partName(o.ID, i), err)
		}
	}
	if err := w.release(ctx, o.Owner, o.ID); err != nil {
		return fmt.Errorf("artifacts: release %s: %w", o.ID, err)
	}
	_, _, err := w.transition(ctx, o.ID, []string{stateGone}, func(o *object) { o.Cleaned = true })
	return err
}

// Sweep drops what has run out: stored artifacts past their expiry, begun
// uploads past their deadline, gone artifacts not yet cleaned (a copy
// stopped half way), tombstones past Limits.Tombstone, expired links, and
// quota held for artifacts the store no longer keeps. Every copy sweeps on
// its own; each step is a compare-and-set or a repeatable delete, so copies
// sweeping at once do each thing once.
func (w *Worker) Sweep(ctx context.Context) error {
	objs := map[string]object{}
	var links []string
	usages := map[string]usage{}
	now := w.now()
	var decodeErr error
	err := bus.EachValue(ctx, w.kv, func(key string, v []byte) {
		switch {
		case len(key) > 4 && key[:4] == "obj.":
			var o object
			if err := json.Unmarshal(v, &o); err != nil {
				decodeErr = errors.Join(decodeErr, fmt.Errorf("%s: %w", key, err))
				return
			}
			objs[o.ID] = o
		case len(key) > 5 && key[:5] == "link.":
			var l link
			if json.Unmarshal(v, &l) == nil && now.After(l.ExpiresAt) {
				links = append(links, key)
			}
		case len(key) > 6 && key[:6] == "usage.":
			var u usage
			if json.Unmarshal(v, &u) == nil {
				usages[key[6:]] = u
			}
		}
	})
	if err != nil {
		return err
	}
	var all []error
	for _, o := range objs {
		var err error
		switch {
		case o.State == statePending && now.After(o.UploadBy):
			_, _, err = w.drop(ctx, o.ID, "abandoned", statePending)
		case o.State == stateStored && now.After(o.ExpiresAt):
			_, _, err = w.drop(ctx, o.ID, "expired", stateStored)
		case o.State == stateGone && !o.Cleaned:
			err = w.clean(ctx, o)
		case o.State == stateGone && now.After(o.GoneAt.Add(w.limits.Tombstone)):
			err = w.kv.Delete(ctx, objKey(o.ID))
		}
		all = append(all, err)
	}
	for _, k := range links {
		all = append(all, w.kv.Delete(ctx, k))
	}
	// Quota held for an artifact whose record is gone (deleted as a
	// tombstone before a copy stopped half way through cleaning it). A put
	// writes the record before it reserves, so a held artifact missing from
	// this pass may be one put since it began: it is read again first.
	for owner, u := range usages {
		for id := range u.Held {
			if o, ok := objs[id]; ok && !(o.State == stateGone && o.Cleaned) {
				continue
			}
			if o, found, err := w.load(ctx, id); err != nil {
				all = append(all, err)
				continue
			} else if found && !(o.State == stateGone && o.Cleaned) {
				continue
			}
			all = append(all, w.release(ctx, owner, id))
		}
	}
	return errors.Join(append(all, decodeErr)...)
}
