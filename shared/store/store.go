// Package store is the control-plane store: a small transactional document
// interface (DESIGN §6) with two backends, Firestore in the cloud and an
// embedded crash-safe database on one machine, held to one contract suite
// (store/storetest).
//
// Documents are JSON objects. A caller passes any Go value that encodes to a
// JSON object (structs with `json` tags) and reads into a pointer to one;
// both backends round-trip values through encoding/json, so the same struct
// means the same document everywhere. Integers must stay within ±2^53 to
// round-trip exactly (store times as Unix milliseconds or RFC 3339 strings).
// Firestore's limits apply on both backends: no arrays directly inside
// arrays, no empty field names (both ErrInvalid).
package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Errors every backend returns (wrapped with context; test with errors.Is).
var (
	// ErrNotFound: the document does not exist (Get, Update; for Update,
	// Firestore reports it only at commit, so it comes from RunTx).
	ErrNotFound = errors.New("store: document not found")
	// ErrExists: Create found the document already there (Firestore
	// reports it only at commit, so it comes from RunTx).
	ErrExists = errors.New("store: document already exists")
	// ErrReadAfterWrite: a transaction read after it wrote. Firestore
	// forbids it, so the embedded backend refuses it too: code that passes
	// on one machine must pass in the cloud.
	ErrReadAfterWrite = errors.New("store: read after write in a transaction")
	// ErrContention: the transaction kept conflicting and gave up.
	ErrContention = errors.New("store: transaction contention")
	// ErrInvalid: a collection name, id, document or query is malformed.
	// Collection names and ids follow Firestore's rules (CheckID); a bad
	// document id is an *IDError, the caller's error.
	ErrInvalid = errors.New("store: invalid argument")
)

// MaxIDBytes is the longest collection name or document id accepted
// (Firestore's limit on a document id).
const MaxIDBytes = 1500

// IDError is the ErrInvalid of a document id that breaks the naming rules
// of CheckID. Ids are often read from a request (a path segment, a body
// member), so this is the caller's error, not the store's: it carries the
// sentence a caller can act on (InputError, which shared/errs answers as
// 400 INVALID_REQUEST), and a service must never report it as an outage.
type IDError struct {
	// Reason says what is wrong, e.g. "contains '/'"; never the id itself.
	Reason string
}

func (e *IDError) Error() string { return "store: invalid argument: document id " + e.Reason }

// Is makes errors.Is(err, ErrInvalid) hold.
func (e *IDError) Is(target error) bool { return target == ErrInvalid }

// InputError is the refusal as the caller reads it.
func (e *IDError) InputError() string {
	return "an id in this request cannot exist: it " + e.Reason +
		fmt.Sprintf(" (an id is 1 to %d bytes of UTF-8, without '/', not \".\" or \"..\", and not of the form __…__)", MaxIDBytes)
}

// CheckID applies Firestore's rules for document ids (and collection
// names), which both backends enforce alike: non-empty valid UTF-8 of at
// most MaxIDBytes bytes, no '/', not "." or "..", and not of the reserved
// form __.*__ — which Firestore reads as at least one character between
// the underscores: it takes "____" and refuses "_____". Every Tx method
// checks its id; a service may check one at its door with this same
// function.
func CheckID(id string) error {
	switch {
	case id == "":
		return &IDError{Reason: "is empty"}
	case len(id) > MaxIDBytes:
		return &IDError{Reason: fmt.Sprintf("is longer than %d bytes", MaxIDBytes)}
	case strings.Contains(id, "/"):
		return &IDError{Reason: "contains '/'"}
	case id == "." || id == "..":
		return &IDError{Reason: `is "." or ".."`}
	case len(id) >= 5 && strings.HasPrefix(id, "__") && strings.HasSuffix(id, "__"):
		return &IDError{Reason: "has the reserved form __…__"}
	case !utf8.ValidString(id):
		return &IDError{Reason: "is not valid UTF-8"}
	}
	return nil
}

// Store is a transactional document store.
type Store interface {
	// RunTx runs fn in one serializable transaction and commits it when fn
	// returns nil. On contention the backend runs fn again (so fn must not
	// have side effects outside tx); after too many attempts it returns
	// ErrContention. An error from fn rolls back and is returned as is.
	// A transaction in which Create met an existing document, Update a
	// missing one, or a read followed a write never commits, even when fn
	// ignores that error: RunTx returns ErrExists, ErrNotFound or
	// ErrReadAfterWrite. A ctx already done stops RunTx before fn runs.
	RunTx(ctx context.Context, fn func(tx Tx) error) error
	// Close releases the store.
	Close() error
}

// Tx is one transaction. All reads must come before the first write. A Tx
// is used by one goroutine and only while fn runs.
type Tx interface {
	// Get reads coll/id into dst (a pointer); ErrNotFound when absent.
	Get(coll, id string, dst any) error
	// Query reads the documents of coll matching q into dst, a pointer to a
	// slice of the document type.
	Query(coll string, q Query, dst any) error
	// Create writes a new document; ErrExists when it is already there
	// (from Create on the embedded backend, from RunTx on Firestore).
	Create(coll, id string, doc any) error
	// Set writes the whole document, creating or replacing it.
	Set(coll, id string, doc any) error
	// Update sets the given top-level fields of an existing document (a
	// map value replaces the whole field); ErrNotFound when absent (from
	// Update on the embedded backend, from RunTx on Firestore).
	Update(coll, id string, fields map[string]any) error
	// Delete removes the document; deleting an absent one is not an error.
	Delete(coll, id string) error
}

// Query selects documents by equality on top-level fields, ordered by one
// top-level field, with an optional limit. In the real Firestore service,
// equality conditions combined with an OrderBy on another field need a
// composite index (emulators and the embedded backend do not).
type Query struct {
	// Where lists equality conditions, all of which must hold.
	Where []Eq
	// OrderBy names a top-level field (string or number) to sort by, ties
	// by document id; documents without the field are left out, as in
	// Firestore. Empty means document id order.
	OrderBy string
	// Desc reverses the order (ties included).
	Desc bool
	// Limit caps the number of results; 0 means no limit.
	Limit int
}

// Eq is one equality condition: field == Value. Value is a string, bool or
// number (compared numerically: 1 matches 1.0); anything else is
// ErrInvalid. Documents without the field do not match.
type Eq struct {
	Field string
	Value any
}

// Where is a shorthand for a query with equality conditions given as
// field, value pairs.
func Where(pairs ...any) Query {
	var q Query
	for i := 0; i+1 < len(pairs); i += 2 {
		q.Where = append(q.Where, Eq{Field: pairs[i].(string), Value: pairs[i+1]})
	}
	return q
}

// Get is a one-read transaction.
func Get(ctx context.Context, s Store, coll, id string, dst any) error {
	return s.RunTx(ctx, func(tx Tx) error { return tx.Get(coll, id, dst) })
}

// List is a one-query transaction.
func List(ctx context.Context, s Store, coll string, q Query, dst any) error {
	return s.RunTx(ctx, func(tx Tx) error { return tx.Query(coll, q, dst) })
}
