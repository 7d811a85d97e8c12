// Package firestorestore is the cloud backend of store.Store on Cloud
// Firestore (cloud.google.com/go/firestore), one Firestore collection per
// store collection, document id = store id.
//
// Documents go through encoding/json on the way in and out, exactly as in
// the embedded backend: the JSON object becomes a Firestore map (integral
// numbers as integers, others as doubles), and what Firestore returns
// (integers, doubles, strings, bools, timestamps, arrays, maps, null) is
// encoded to JSON again and decoded into the caller's value.
//
// Transactions use Client.RunTransaction, which runs fn again when
// Firestore aborts the transaction for contention (up to
// firestore.DefaultTransactionMaxAttempts times, or as WithMaxAttempts
// says, with the client's jittered exponential backoff between them; then
// RunTx returns store.ErrContention). The caller's context bounds the
// whole.
//
// Create's "already exists" and Update's "not found" are preconditions
// that Firestore checks at commit: tx.Create and tx.Update return nil and
// RunTx returns store.ErrExists or store.ErrNotFound.
//
// Indexes: an equality query on one field, or ordered by one field, is
// served by Firestore's automatic single-field indexes. A query with Where
// conditions and an OrderBy on another field needs a composite index in
// the real service (deploy it with the project's index configuration);
// without one Firestore answers FAILED_PRECONDITION with a link to create
// it. Emulators do not check this.
//
// Document-id order descending (a Query with Desc and no OrderBy) is never
// sent as such: Firestore refuses a query ordered by document id
// descending ("Firestore does not support descending key scans",
// FAILED_PRECONDITION, not a missing index; Google's emulator refuses it in
// the same words, and projects that shipped such a query report the same
// refusal from the service). The backend reads those documents in
// ascending id order, reverses them and applies the limit itself, so such
// a query reads every matching document; order by a field to page through
// a large collection newest first.
package firestorestore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"cloud.google.com/go/firestore"
	"google.golang.org/api/option"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"agentmesh.dev/mesh/shared/store"
	"agentmesh.dev/mesh/shared/store/internal/jsondoc"
)

// Store is the Firestore-backed store.Store. Its methods are safe for
// concurrent use.
type Store struct {
	c        *firestore.Client
	prefix   string
	attempts int // 0: the client's default
}

var _ store.Store = (*Store)(nil)

// New connects to Firestore in projectID (the default database). When
// FIRESTORE_EMULATOR_HOST is set the client talks to that emulator instead
// (the Firestore client's own rule).
func New(ctx context.Context, projectID string, opts ...option.ClientOption) (*Store, error) {
	c, err := firestore.NewClient(ctx, projectID, opts...)
	if err != nil {
		return nil, fmt.Errorf("firestorestore: %w", err)
	}
	return &Store{c: c}, nil
}

// NewFromClient wraps an existing client. The Store takes it over: Close
// closes it.
func NewFromClient(c *firestore.Client) *Store {
	return &Store{c: c}
}

// WithPrefix returns a Store on the same client that puts prefix in front
// of every collection name (tests use it to isolate runs sharing one
// emulator or project). Closing either Store closes the shared client.
func (s *Store) WithPrefix(prefix string) *Store {
	return &Store{c: s.c, prefix: s.prefix + prefix, attempts: s.attempts}
}

// WithMaxAttempts returns a Store on the same client whose transactions
// run at most n times under contention (n < 1: the client's default,
// firestore.DefaultTransactionMaxAttempts, 5). Production keeps the
// default: Firestore settles contention by delaying or failing one of the
// contending operations. Google's emulator settles a lock conflict only by
// a fixed 2-second lock timeout that fails every waiting commit, and a
// 50-way race on one document there now and then stalls for about a minute
// before it drains (measured; docs/control-plane.md, "The store"): tests
// against it raise this.
func (s *Store) WithMaxAttempts(n int) *Store {
	return &Store{c: s.c, prefix: s.prefix, attempts: n}
}

// Client returns the underlying Firestore client.
func (s *Store) Client() *firestore.Client { return s.c }

// Close closes the Firestore client.
func (s *Store) Close() error { return s.c.Close() }

func (s *Store) coll(name string) *firestore.CollectionRef {
	return s.c.Collection(s.prefix + name)
}

// RunTx runs fn in a Firestore read-write transaction; see store.Store.
func (s *Store) RunTx(ctx context.Context, fn func(tx store.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("firestorestore: transaction not started: %w", err)
	}
	var opts []firestore.TransactionOption
	if s.attempts > 0 {
		opts = append(opts, firestore.MaxAttempts(s.attempts))
	}
	err := s.c.RunTransaction(ctx, func(ctx context.Context, ft *firestore.Transaction) error {
		t := &tx{s: s, ft: ft, ctx: ctx}
		if err := fn(t); err != nil {
			return &fnError{err}
		}
		return t.spoiled
	}, opts...)
	if err == nil {
		return nil
	}
	if fe, ok := errors.AsType[*fnError](err); ok {
		return fe.err // an error from fn is returned as is
	}
	return mapErr(ctx, "commit", err)
}

// fnError marks an error returned by the caller's function. It unwraps, so
// RunTransaction still retries when it wraps an ABORTED read.
type fnError struct{ err error }

func (e *fnError) Error() string { return e.err.Error() }
func (e *fnError) Unwrap() error { return e.err }

// mapErr translates Firestore errors to the store's. The original error
// stays in the chain so that RunTransaction still sees ABORTED from reads
// and retries.
func mapErr(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	for _, e := range []error{store.ErrNotFound, store.ErrExists, store.ErrReadAfterWrite, store.ErrContention, store.ErrInvalid} {
		if errors.Is(err, e) {
			return err
		}
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("firestorestore: %s: %w (%w)", op, cerr, err)
	}
	var sentinel error
	switch status.Code(err) {
	case codes.NotFound:
		sentinel = store.ErrNotFound
	case codes.AlreadyExists:
		sentinel = store.ErrExists
	case codes.Aborted:
		sentinel = store.ErrContention
	case codes.InvalidArgument:
		sentinel = store.ErrInvalid
	default:
		return fmt.Errorf("firestorestore: %s: %w", op, err)
	}
	return fmt.Errorf("firestorestore: %s: %w: %w", op, sentinel, err)
}

type tx struct {
	s       *Store
	ft      *firestore.Transaction
	ctx     context.Context
	wrote   bool
	spoiled error
}

func (t *tx) read() error {
	if t.wrote {
		err := fmt.Errorf("firestorestore: %w", store.ErrReadAfterWrite)
		if t.spoiled == nil {
			t.spoiled = err
		}
		return err
	}
	return nil
}

func (t *tx) Get(coll, id string, dst any) error {
	if err := jsondoc.CheckPath(coll, id); err != nil {
		return fmt.Errorf("firestorestore: get: %w", err)
	}
	if err := jsondoc.CheckDst(dst); err != nil {
		return fmt.Errorf("firestorestore: get: %w", err)
	}
	if err := t.read(); err != nil {
		return err
	}
	snap, err := t.ft.Get(t.s.coll(coll).Doc(id))
	if err != nil {
		return mapErr(t.ctx, "get "+coll+"/"+id, err)
	}
	return decodeInto(snap.Data(), dst, "get "+coll+"/"+id)
}

func (t *tx) Query(coll string, q store.Query, dst any) error {
	if err := jsondoc.CheckName("collection name", coll); err != nil {
		return fmt.Errorf("firestorestore: query: %w", err)
	}
	if err := jsondoc.CheckSliceDst(dst); err != nil {
		return fmt.Errorf("firestorestore: query: %w", err)
	}
	vals, err := jsondoc.CheckQuery(q)
	if err != nil {
		return fmt.Errorf("firestorestore: query %s: %w", coll, err)
	}
	if err := t.read(); err != nil {
		return err
	}
	fq := t.s.coll(coll).Query
	for i, w := range q.Where {
		fq = fq.WherePath(firestore.FieldPath{w.Field}, "==", jsondoc.ToNative(vals[i]))
	}
	// Document-id order is Firestore's default. Descending, it would be a
	// descending key scan, which Firestore refuses (package doc): the
	// documents are read ascending and reversed below, and the limit can
	// only be applied after that.
	idDesc := q.OrderBy == "" && q.Desc
	if q.OrderBy != "" {
		dir := firestore.Asc
		if q.Desc {
			dir = firestore.Desc
		}
		fq = fq.OrderByPath(firestore.FieldPath{q.OrderBy}, dir)
	}
	if q.Limit > 0 && !idDesc {
		fq = fq.Limit(q.Limit)
	}
	snaps, err := t.ft.Documents(fq).GetAll()
	if err != nil {
		return mapErr(t.ctx, "query "+coll, err)
	}
	// Firestore itself leaves out documents without the order field and
	// orders by document id when no order is given. The first step and the
	// ascending sort below are no-ops against it; they make emulators that
	// sort missing fields last or return insertion order agree with it. The
	// descending sort is the reversal of an id-order query (idDesc).
	if q.OrderBy != "" {
		kept := snaps[:0]
		for _, sn := range snaps {
			if _, err := sn.DataAtPath(firestore.FieldPath{q.OrderBy}); err == nil {
				kept = append(kept, sn)
			}
		}
		snaps = kept
	} else {
		sort.SliceStable(snaps, func(i, j int) bool {
			c := strings.Compare(snaps[i].Ref.ID, snaps[j].Ref.ID)
			if q.Desc {
				return c > 0
			}
			return c < 0
		})
	}
	if q.Limit > 0 && len(snaps) > q.Limit {
		snaps = snaps[:q.Limit]
	}
	docs := make([]map[string]any, len(snaps))
	for i, sn := range snaps {
		docs[i] = sn.Data()
	}
	return decodeInto(docs, dst, "query "+coll)
}

// decodeInto re-encodes Firestore data as JSON and decodes it into dst.
func decodeInto(v any, dst any, op string) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("firestorestore: %s: encode: %w", op, err)
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		return fmt.Errorf("firestorestore: %s: decode: %w", op, err)
	}
	return nil
}

func (t *tx) doc(op, coll, id string, doc any) (*firestore.DocumentRef, map[string]any, error) {
	if err := jsondoc.CheckPath(coll, id); err != nil {
		return nil, nil, fmt.Errorf("firestorestore: %s: %w", op, err)
	}
	_, m, err := jsondoc.Encode(doc)
	if err != nil {
		return nil, nil, fmt.Errorf("firestorestore: %s %s/%s: %w", op, coll, id, err)
	}
	return t.s.coll(coll).Doc(id), jsondoc.ToNative(m).(map[string]any), nil
}

func (t *tx) Create(coll, id string, doc any) error {
	ref, m, err := t.doc("create", coll, id, doc)
	if err != nil {
		return err
	}
	t.wrote = true
	return t.write("create", coll, id, t.ft.Create(ref, m))
}

func (t *tx) Set(coll, id string, doc any) error {
	ref, m, err := t.doc("set", coll, id, doc)
	if err != nil {
		return err
	}
	t.wrote = true
	return t.write("set", coll, id, t.ft.Set(ref, m))
}

func (t *tx) Update(coll, id string, fields map[string]any) error {
	if err := jsondoc.CheckPath(coll, id); err != nil {
		return fmt.Errorf("firestorestore: update: %w", err)
	}
	if len(fields) == 0 {
		return fmt.Errorf("firestorestore: update %s/%s: %w: no fields", coll, id, store.ErrInvalid)
	}
	ups := make([]firestore.Update, 0, len(fields))
	for k, fv := range fields {
		if err := jsondoc.CheckField(k); err != nil {
			return fmt.Errorf("firestorestore: update %s/%s: %w", coll, id, err)
		}
		v, err := jsondoc.EncodeValue(fv)
		if err != nil {
			return fmt.Errorf("firestorestore: update %s/%s field %q: %w", coll, id, k, err)
		}
		ups = append(ups, firestore.Update{FieldPath: firestore.FieldPath{k}, Value: jsondoc.ToNative(v)})
	}
	sort.Slice(ups, func(i, j int) bool { return ups[i].FieldPath[0] < ups[j].FieldPath[0] })
	t.wrote = true
	return t.write("update", coll, id, t.ft.Update(t.s.coll(coll).Doc(id), ups))
}

func (t *tx) Delete(coll, id string) error {
	if err := jsondoc.CheckPath(coll, id); err != nil {
		return fmt.Errorf("firestorestore: delete: %w", err)
	}
	t.wrote = true
	return t.write("delete", coll, id, t.ft.Delete(t.s.coll(coll).Doc(id)))
}

func (t *tx) write(op, coll, id string, err error) error {
	if err == nil {
		return nil
	}
	err = mapErr(t.ctx, op+" "+coll+"/"+id, err)
	if t.spoiled == nil {
		t.spoiled = err
	}
	return err
}
