// Package boltstore is the embedded backend of store.Store on bbolt: one
// file, one bucket per collection, key = document id, value = the
// document's JSON. It is the default control-plane store on one machine.
//
// Durability: every committed transaction is fsynced before RunTx returns
// (bbolt's defaults; NoSync stays false), so a crash loses no committed
// transaction and never leaves a partial one.
//
// Concurrency: bbolt runs one read-write transaction at a time, so RunTx
// calls are serialised and never conflict; store.ErrContention is never
// returned. Calls that arrive while a commit is under way are committed
// together, in one bbolt transaction and one fsync, as soon as it ends
// (group commit): each function runs in turn, sees the writes of those
// before it, and has its own writes applied only when it succeeds, so
// every call keeps its own outcome, and a call that finds the store idle
// commits at once, alone. Should a batch fail before its commit (a write
// bbolt refuses), every function in it runs again alone (store.Store
// allows a backend to run a function again); should the commit itself
// fail, every call is told so and nothing runs again, since a failed
// commit may have reached the file. A result is returned only after its
// commit is fsynced. Only one process may open the
// file: a second Open waits for the file lock for the lock timeout and
// then fails with ErrLocked.
//
// Queries scan the whole collection (decoding every document) and sort in
// memory. That is deliberate: the control-plane collections are small
// (accounts, agents, keys, leases — thousands, not millions). Do not use
// this backend for bulk data.
//
// The Firestore rules are enforced here too so that code that works on one
// machine works in the cloud: no reads after the first write in a
// transaction (store.ErrReadAfterWrite), and a transaction in which Create
// found the document present (store.ErrExists) or Update found it absent
// (store.ErrNotFound) does not commit, even if fn ignores that error.
package boltstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"agentmesh.dev/mesh/shared/store"
	"agentmesh.dev/mesh/shared/store/internal/jsondoc"
)

// ErrLocked is returned (wrapped) by Open when another process — normally
// another meshd — holds the database file.
var ErrLocked = errors.New("data dir in use by another meshd")

// DefaultLockTimeout is how long Open waits for the file lock.
const DefaultLockTimeout = 2 * time.Second

// Option configures Open.
type Option func(*config)

type config struct {
	lockTimeout time.Duration
}

// WithLockTimeout sets how long Open waits for another process to release
// the file lock before failing with ErrLocked (default DefaultLockTimeout;
// values ≤ 0 are replaced by the default, since bbolt would wait forever).
func WithLockTimeout(d time.Duration) Option {
	return func(c *config) { c.lockTimeout = d }
}

// Store is the bbolt-backed store.Store. Its methods are safe for
// concurrent use.
type Store struct {
	db *bolt.DB

	mu      sync.Mutex
	queue   []*call // calls waiting for the next commit
	leading bool    // a goroutine is committing the queue
	commits int     // transactions committed or attempted (for tests)
}

// call is one RunTx waiting for its commit.
type call struct {
	ctx      context.Context
	fn       func(tx store.Tx) error
	err      error
	panicked any  // what fn panicked with, re-raised on the caller's goroutine
	answered bool // done is closed
	done     chan struct{}
}

// maxBatch bounds the functions one commit runs.
const maxBatch = 64

var _ store.Store = (*Store)(nil)

// Open opens or creates the database file at path (mode 0600), creating
// its parent directory (mode 0700) when missing.
func Open(path string, opts ...Option) (*Store, error) {
	cfg := config{lockTimeout: DefaultLockTimeout}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.lockTimeout <= 0 {
		cfg.lockTimeout = DefaultLockTimeout
	}
	if path == "" {
		return nil, fmt.Errorf("boltstore: %w: empty path", store.ErrInvalid)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("boltstore: create data dir: %w", err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: cfg.lockTimeout})
	if err != nil {
		if errors.Is(err, bolterrors.ErrTimeout) {
			return nil, fmt.Errorf("boltstore: open %s: %w (its lock was not released within %v; stop the other process or use another data dir)", path, ErrLocked, cfg.lockTimeout)
		}
		return nil, fmt.Errorf("boltstore: open %s: %w", path, err)
	}
	return &Store{db: db}, nil
}

// Path returns the database file's path.
func (s *Store) Path() string { return s.db.Path() }

// Close closes the database file and releases its lock.
func (s *Store) Close() error { return s.db.Close() }

// RunTx runs fn in a read-write bbolt transaction and commits (with
// fsync) when fn returns nil; fn may share the commit with other calls
// (see the package comment). A context already done when RunTx is called,
// or done by the time fn returns, stops it without committing.
func (s *Store) RunTx(ctx context.Context, fn func(tx store.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("boltstore: transaction not started: %w", err)
	}
	c := &call{ctx: ctx, fn: fn, done: make(chan struct{})}
	s.mu.Lock()
	s.queue = append(s.queue, c)
	lead := !s.leading
	s.leading = true
	s.mu.Unlock()
	if lead {
		s.lead()
	}
	<-c.done
	if c.panicked != nil {
		panic(c.panicked)
	}
	return c.err
}

// lead commits the queued calls, at most maxBatch at a time, and passes
// the lead to a fresh goroutine when more are waiting, so that no caller
// serves others long after its own commit.
func (s *Store) lead() {
	s.mu.Lock()
	batch := s.queue
	if len(batch) > maxBatch {
		batch = batch[:maxBatch:maxBatch]
	}
	s.queue = append([]*call(nil), s.queue[len(batch):]...)
	s.mu.Unlock()

	// Deferred, so that a function that ends its goroutine (runtime.Goexit,
	// a test's t.Fatal) or a panic outside the functions' own recover
	// still answers every call of the batch and passes the lead on: a lost
	// leader would block every later RunTx.
	defer func() {
		for _, c := range batch {
			if !c.answered {
				c.err = errors.New("boltstore: the transaction was abandoned: a function in its commit ended its goroutine")
				close(c.done)
			}
		}
		s.mu.Lock()
		more := len(s.queue) > 0
		s.leading = more
		s.mu.Unlock()
		if more {
			go s.lead()
		}
	}()
	s.commit(batch)
	for _, c := range batch {
		c.answered = true
		close(c.done)
	}
}

// errApply marks a batch that failed before its commit, while applying a
// function's writes: nothing reached the file.
type errApply struct{ err error }

func (e errApply) Error() string { return e.err.Error() }
func (e errApply) Unwrap() error { return e.err }

// commit runs the batch's functions in one transaction and commits it.
func (s *Store) commit(batch []*call) {
	s.mu.Lock()
	s.commits++
	s.mu.Unlock()
	err := s.db.Update(func(btx *bolt.Tx) error {
		for _, c := range batch {
			if err := c.run(btx); err != nil {
				return errApply{err}
			}
		}
		return nil
	})
	if err == nil {
		return
	}
	var ae errApply
	if len(batch) == 1 || !errors.As(err, &ae) {
		// Alone, the failure is the call's. A failed commit may still
		// have reached the file (bbolt can fail after writing the meta
		// page), so nothing is run again: every call not ended by its
		// own panic or context is told the commit failed.
		for _, c := range batch {
			if c.panicked == nil && c.ctx.Err() == nil {
				c.err = fmt.Errorf("boltstore: commit: %w", err)
			}
		}
		return
	}
	// Rolled back before the commit: every call runs again alone, since
	// an outcome, error included, may rest on writes of calls before it
	// that are now undone. A panicked call keeps its panic.
	for _, c := range batch {
		if c.panicked == nil {
			s.commit([]*call{c})
		}
	}
}

// run runs one function inside the batch's transaction and applies its
// writes when it succeeds. Its own failure is its result; an error
// returned here is the transaction's (a write bbolt refused) and fails the
// whole batch.
func (c *call) run(btx *bolt.Tx) error {
	c.err = nil
	if err := c.ctx.Err(); err != nil {
		c.err = fmt.Errorf("boltstore: transaction not started: %w", err)
		return nil
	}
	t := &tx{btx: btx}
	err := func() (err error) {
		defer func() {
			if r := recover(); r != nil {
				c.panicked, err = r, errors.New("boltstore: transaction function panicked")
			}
		}()
		return c.fn(t)
	}()
	t.done = true
	switch {
	case err != nil:
		c.err = err
	case t.spoiled != nil:
		c.err = t.spoiled
	case c.ctx.Err() != nil:
		c.err = fmt.Errorf("boltstore: transaction not committed: %w", c.ctx.Err())
	default:
		return t.apply()
	}
	return nil
}

type tx struct {
	btx     *bolt.Tx
	wrote   bool  // a write was attempted: no more reads
	spoiled error // the transaction must not commit (Firestore would fail it)
	done    bool  // fn returned; the tx must not be used

	// The function's writes, kept until it succeeds (reads never follow
	// a write, so keeping them changes nothing it sees): ops in order,
	// and the latest value of each document they touch (nil: deleted).
	ops     []op
	written map[string][]byte
}

// op is one staged write; a nil raw deletes.
type op struct {
	coll, id string
	raw      []byte
}

func docKey(coll, id string) string { return coll + "/" + id }

// stage keeps one write.
func (t *tx) stage(coll, id string, raw []byte) {
	t.ops = append(t.ops, op{coll, id, raw})
	if t.written == nil {
		t.written = map[string][]byte{}
	}
	t.written[docKey(coll, id)] = raw
}

// current is a document as the function's writes so far leave it.
func (t *tx) current(coll, id string) []byte {
	if raw, ok := t.written[docKey(coll, id)]; ok {
		return raw
	}
	if b := t.btx.Bucket([]byte(coll)); b != nil {
		return b.Get([]byte(id))
	}
	return nil
}

// apply writes the staged operations into the transaction.
func (t *tx) apply() error {
	for _, o := range t.ops {
		if o.raw == nil {
			if b := t.btx.Bucket([]byte(o.coll)); b != nil {
				if err := b.Delete([]byte(o.id)); err != nil {
					return fmt.Errorf("boltstore: delete %s/%s: %w", o.coll, o.id, err)
				}
			}
			continue
		}
		b, err := t.btx.CreateBucketIfNotExists([]byte(o.coll))
		if err != nil {
			return fmt.Errorf("boltstore: bucket %s: %w", o.coll, err)
		}
		if err := b.Put([]byte(o.id), o.raw); err != nil {
			return fmt.Errorf("boltstore: put %s/%s: %w", o.coll, o.id, err)
		}
	}
	return nil
}

func (t *tx) usable() error {
	if t.done {
		return fmt.Errorf("boltstore: %w: transaction used after its function returned", store.ErrInvalid)
	}
	return nil
}

func (t *tx) read() error {
	if err := t.usable(); err != nil {
		return err
	}
	if t.wrote {
		err := fmt.Errorf("boltstore: %w", store.ErrReadAfterWrite)
		t.spoil(err)
		return err
	}
	return nil
}

func (t *tx) spoil(err error) {
	if t.spoiled == nil {
		t.spoiled = err
	}
}

func (t *tx) Get(coll, id string, dst any) error {
	if err := jsondoc.CheckPath(coll, id); err != nil {
		return fmt.Errorf("boltstore: get: %w", err)
	}
	if err := jsondoc.CheckDst(dst); err != nil {
		return fmt.Errorf("boltstore: get: %w", err)
	}
	if err := t.read(); err != nil {
		return err
	}
	var v []byte
	if b := t.btx.Bucket([]byte(coll)); b != nil {
		v = b.Get([]byte(id))
	}
	if v == nil {
		return &notFound{coll: coll, id: id}
	}
	if err := jsondoc.Unmarshal(v, dst); err != nil {
		return fmt.Errorf("boltstore: get %s/%s: decode: %w", coll, id, err)
	}
	return nil
}

// notFound is Get's answer for an absent document: the error
// fmt.Errorf("boltstore: get %s/%s: %w", coll, id, store.ErrNotFound) would
// make, with its text built only when it is read. Transactions that look
// for what is usually absent (tombstones, revocations) meet it often.
type notFound struct{ coll, id string }

func (e *notFound) Error() string {
	return "boltstore: get " + e.coll + "/" + e.id + ": " + store.ErrNotFound.Error()
}

func (e *notFound) Unwrap() error { return store.ErrNotFound }

type hit struct {
	id  []byte
	raw []byte
	key any // value of the OrderBy field
}

func (t *tx) Query(coll string, q store.Query, dst any) error {
	if err := jsondoc.CheckName("collection name", coll); err != nil {
		return fmt.Errorf("boltstore: query: %w", err)
	}
	if err := jsondoc.CheckSliceDst(dst); err != nil {
		return fmt.Errorf("boltstore: query: %w", err)
	}
	want, err := jsondoc.CheckQuery(q)
	if err != nil {
		return fmt.Errorf("boltstore: query %s: %w", coll, err)
	}
	if err := t.read(); err != nil {
		return err
	}
	var hits []hit
	if b := t.btx.Bucket([]byte(coll)); b != nil {
		err := b.ForEach(func(k, v []byte) error {
			d, err := jsondoc.Decode(v)
			if err != nil {
				return fmt.Errorf("boltstore: query %s: stored document %q is not JSON: %w", coll, k, err)
			}
			m, _ := d.(map[string]any)
			for i, w := range q.Where {
				got, ok := m[w.Field]
				if !ok || !jsondoc.Equal(got, want[i]) {
					return nil
				}
			}
			h := hit{id: k, raw: v}
			if q.OrderBy != "" {
				key, ok := m[q.OrderBy]
				if !ok {
					return nil // like Firestore: no field, not in an ordered query
				}
				h.key = key
			}
			hits = append(hits, h)
			return nil
		})
		if err != nil {
			return err
		}
	}
	// ForEach yields ids in byte order; order by the field, ties by id,
	// all reversed by Desc (Firestore's implicit order by document name
	// follows the direction of the last explicit order).
	sort.SliceStable(hits, func(i, j int) bool {
		c := 0
		if q.OrderBy != "" {
			c = jsondoc.Compare(hits[i].key, hits[j].key)
		}
		if c == 0 {
			c = bytes.Compare(hits[i].id, hits[j].id)
		}
		if q.Desc {
			return c > 0
		}
		return c < 0
	})
	if q.Limit > 0 && len(hits) > q.Limit {
		hits = hits[:q.Limit]
	}
	raws := make([][]byte, len(hits))
	for i, h := range hits {
		raws[i] = h.raw
	}
	if err := json.Unmarshal(jsondoc.JoinArray(raws), dst); err != nil {
		return fmt.Errorf("boltstore: query %s: decode: %w", coll, err)
	}
	return nil
}

func (t *tx) Create(coll, id string, doc any) error {
	if err := t.usable(); err != nil {
		return err
	}
	if err := jsondoc.CheckPath(coll, id); err != nil {
		return fmt.Errorf("boltstore: create: %w", err)
	}
	raw, err := jsondoc.EncodeRaw(doc)
	if err != nil {
		return fmt.Errorf("boltstore: create %s/%s: %w", coll, id, err)
	}
	t.wrote = true
	if t.current(coll, id) != nil {
		err := fmt.Errorf("boltstore: create %s/%s: %w", coll, id, store.ErrExists)
		t.spoil(err)
		return err
	}
	t.stage(coll, id, raw)
	return nil
}

func (t *tx) Set(coll, id string, doc any) error {
	if err := t.usable(); err != nil {
		return err
	}
	if err := jsondoc.CheckPath(coll, id); err != nil {
		return fmt.Errorf("boltstore: set: %w", err)
	}
	raw, err := jsondoc.EncodeRaw(doc)
	if err != nil {
		return fmt.Errorf("boltstore: set %s/%s: %w", coll, id, err)
	}
	t.wrote = true
	t.stage(coll, id, raw)
	return nil
}

func (t *tx) Update(coll, id string, fields map[string]any) error {
	if err := t.usable(); err != nil {
		return err
	}
	if err := jsondoc.CheckPath(coll, id); err != nil {
		return fmt.Errorf("boltstore: update: %w", err)
	}
	if len(fields) == 0 {
		return fmt.Errorf("boltstore: update %s/%s: %w: no fields", coll, id, store.ErrInvalid)
	}
	vals := make(map[string]any, len(fields))
	for k, fv := range fields {
		if err := jsondoc.CheckField(k); err != nil {
			return fmt.Errorf("boltstore: update %s/%s: %w", coll, id, err)
		}
		v, err := jsondoc.EncodeValue(fv)
		if err != nil {
			return fmt.Errorf("boltstore: update %s/%s field %q: %w", coll, id, k, err)
		}
		vals[k] = v
	}
	t.wrote = true
	cur := t.current(coll, id)
	if cur == nil {
		err := fmt.Errorf("boltstore: update %s/%s: %w", coll, id, store.ErrNotFound)
		t.spoil(err)
		return err
	}
	d, err := jsondoc.Decode(cur)
	if err != nil {
		return fmt.Errorf("boltstore: update %s/%s: stored document is not JSON: %w", coll, id, err)
	}
	m, _ := d.(map[string]any)
	if m == nil {
		m = map[string]any{}
	}
	for k, v := range vals {
		m[k] = v
	}
	raw, _, err := jsondoc.Encode(m)
	if err != nil {
		return fmt.Errorf("boltstore: update %s/%s: %w", coll, id, err)
	}
	t.stage(coll, id, raw)
	return nil
}

func (t *tx) Delete(coll, id string) error {
	if err := t.usable(); err != nil {
		return err
	}
	if err := jsondoc.CheckPath(coll, id); err != nil {
		return fmt.Errorf("boltstore: delete: %w", err)
	}
	t.wrote = true
	t.stage(coll, id, nil)
	return nil
}
