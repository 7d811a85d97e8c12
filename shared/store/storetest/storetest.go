// Package storetest is the contract suite every store.Store backend must
// pass (DESIGN §6). A backend's test calls Run with a function that opens a
// fresh, empty store.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/store"
)

// Options describes the backend under test.
type Options struct {
	// Isolated says concurrent transactions are serializable, so the
	// concurrency cases can run. Emulators that do not isolate
	// transactions set it to false and those cases are skipped.
	Isolated bool

	// Known deviations of an emulator from the real service. Each one
	// skips only the assertion it names, and says so in the test log;
	// real backends leave them false.

	// CommitNotAtomic: when a write's precondition fails at commit (Create
	// of an existing document, Update of a missing one), the writes before
	// it in the same commit stay applied.
	CommitNotAtomic bool
	// SetMerges: Set keeps the fields of the old document that the new one
	// lacks, instead of replacing the document.
	SetMerges bool
}

// SkipNotIsolated is the skip message of the concurrency cases when
// Options.Isolated is false.
const SkipNotIsolated = "skipped: this backend's emulator does not isolate transactions (see DEPENDENCIES.md)"

// Run runs the contract suite. open must return a new, empty store for
// each call; Run closes every store it opens.
func Run(t *testing.T, open func(t *testing.T) store.Store, opts Options) {
	t.Helper()
	cases := []struct {
		name string
		fn   func(t *testing.T, s store.Store, opts Options)
	}{
		{"RoundTrip", testRoundTrip},
		{"CreateExisting", testCreateExisting},
		{"CreateExistingIgnored", testCreateExistingIgnored},
		{"GetMissing", testGetMissing},
		{"Set", testSet},
		{"Update", testUpdate},
		{"UpdateMissing", testUpdateMissing},
		{"Delete", testDelete},
		{"Query", testQuery},
		{"QueryOrderAndLimit", testQueryOrder},
		{"ReadAfterWrite", testReadAfterWrite},
		{"ErrorRollsBack", testErrorRollsBack},
		{"ContextCancelled", testContextCancelled},
		{"Invalid", testInvalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.fn(t, openStore(t, open), opts)
		})
	}
	t.Run("Concurrency", func(t *testing.T) {
		if !opts.Isolated {
			t.Skip(SkipNotIsolated)
		}
		t.Run("SingleUseKey", func(t *testing.T) { testSingleUse(t, openStore(t, open), opts) })
		t.Run("Counter", func(t *testing.T) { testCounter(t, openStore(t, open), opts) })
	})
}

func openStore(t *testing.T, open func(t *testing.T) store.Store) store.Store {
	t.Helper()
	s := open(t)
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

func ctx(t *testing.T) context.Context {
	return ctxFor(t, 30*time.Second)
}

// raceCtx bounds a concurrency case. It is longer than ctx: an emulator
// that settles lock conflicts only by timing them out (Google's Firestore
// emulator: 2 s, aborting every waiting commit) now and then needs a minute
// or more (94 s seen in CI), and many attempts, to drain a 50-way race on
// one document. It is a guard against a hang, not a measure of speed.
func raceCtx(t *testing.T) context.Context {
	return ctxFor(t, 5*time.Minute)
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	c, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return c
}

// tx runs fn and fails the test on error.
func tx(t *testing.T, s store.Store, fn func(tx store.Tx) error) {
	t.Helper()
	if err := s.RunTx(ctx(t), fn); err != nil {
		t.Fatalf("RunTx: %v", err)
	}
}

func create(t *testing.T, s store.Store, coll, id string, doc any) {
	t.Helper()
	tx(t, s, func(tx store.Tx) error { return tx.Create(coll, id, doc) })
}

func getMap(t *testing.T, s store.Store, coll, id string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := store.Get(ctx(t), s, coll, id, &m); err != nil {
		t.Fatalf("Get %s/%s: %v", coll, id, err)
	}
	return m
}

func wantMissing(t *testing.T, s store.Store, coll, id string) {
	t.Helper()
	var m map[string]any
	if err := store.Get(ctx(t), s, coll, id, &m); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get %s/%s = %v, %v; want ErrNotFound", coll, id, m, err)
	}
}

func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: err = %v; want %v", what, err, want)
	}
}

func wantEqual(t *testing.T, what string, got, want any) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s:\n got %#v\nwant %#v", what, got, want)
	}
}

type item struct {
	Name  string `json:"name"`
	Count int    `json:"count"`
}

type richDoc struct {
	ID       string                    `json:"id"`
	Text     string                    `json:"text"`
	Big      int64                     `json:"big"`
	Neg      int64                     `json:"neg"`
	Zero     int64                     `json:"zero"`
	Ratio    float64                   `json:"ratio"`
	On       bool                      `json:"on"`
	Off      bool                      `json:"off"`
	Tags     []string                  `json:"tags"`
	Items    []item                    `json:"items"`
	Nested   map[string]map[string]int `json:"nested"`
	Meta     map[string]any            `json:"meta"`
	Empty    []string                  `json:"empty"`
	Nothing  *string                   `json:"nothing"`
	Omitted  string                    `json:"omitted,omitempty"`
	Stamp    string                    `json:"stamp"`
	MillisAt int64                     `json:"millis_at"`
}

const maxSafe = 1<<53 - 1

func testRoundTrip(t *testing.T, s store.Store, _ Options) {
	in := richDoc{
		ID:     "a1",
		Text:   "héllo, 世界 — \"quoted\" \\ \n\t 🚀 \u00e9\u0301",
		Big:    maxSafe,
		Neg:    -maxSafe,
		Ratio:  0.25,
		On:     true,
		Tags:   []string{"x", "", "ü"},
		Items:  []item{{"one", 1}, {"two", 2}},
		Nested: map[string]map[string]int{"a": {"b": 1, "c": 2}, "d": {}},
		Meta: map[string]any{
			"s": "str", "n": 3.5, "i": float64(7), "b": false, "null": nil,
			"list":       []any{"a", 1.0, true, map[string]any{"k": "v"}},
			"obj":        map[string]any{"deep": map[string]any{"er": "yes"}},
			"dotted.key": "kept", "space key": "kept",
		},
		Empty:    []string{},
		Stamp:    "2026-01-02T03:04:05.678Z",
		MillisAt: 1767323045678,
	}
	create(t, s, "rich", "a1", in)
	var out richDoc
	if err := store.Get(ctx(t), s, "rich", "a1", &out); err != nil {
		t.Fatalf("Get: %v", err)
	}
	wantEqual(t, "round trip", out, in)

	m := getMap(t, s, "rich", "a1")
	if _, ok := m["omitted"]; ok {
		t.Errorf("omitempty field stored: %v", m)
	}
	if v, ok := m["nothing"]; !ok || v != nil {
		t.Errorf("nil pointer field = %v, %v; want present null", v, ok)
	}
	if got := m["big"]; got != float64(maxSafe) {
		t.Errorf("big as any = %v (%T)", got, got)
	}

	// A second collection with the same id is a different document.
	create(t, s, "rich2", "a1", map[string]any{"other": true})
	wantEqual(t, "other collection", getMap(t, s, "rich2", "a1"), map[string]any{"other": true})
	wantEqual(t, "first collection intact", getMap(t, s, "rich", "a1")["id"], "a1")
}

func testCreateExisting(t *testing.T, s store.Store, _ Options) {
	create(t, s, "c", "k", map[string]any{"v": 1})
	err := s.RunTx(ctx(t), func(tx store.Tx) error { return tx.Create("c", "k", map[string]any{"v": 2}) })
	wantErr(t, "second Create", err, store.ErrExists)
	wantEqual(t, "after failed Create", getMap(t, s, "c", "k"), map[string]any{"v": float64(1)})
}

// A transaction in which Create failed does not commit, even when fn
// ignores the error (Firestore fails the whole commit).
func testCreateExistingIgnored(t *testing.T, s store.Store, opts Options) {
	create(t, s, "c", "k", map[string]any{"v": 1})
	err := s.RunTx(ctx(t), func(tx store.Tx) error {
		if err := tx.Set("c", "other", map[string]any{"v": 3}); err != nil {
			return err
		}
		_ = tx.Create("c", "k", map[string]any{"v": 2})
		return nil
	})
	wantErr(t, "tx with ignored Create failure", err, store.ErrExists)
	if opts.CommitNotAtomic {
		t.Log("not checked (Options.CommitNotAtomic): the other write was rolled back")
	} else {
		wantMissing(t, s, "c", "other")
	}
	wantEqual(t, "existing doc", getMap(t, s, "c", "k"), map[string]any{"v": float64(1)})
}

func testGetMissing(t *testing.T, s store.Store, _ Options) {
	create(t, s, "g", "present", map[string]any{"v": 1})
	var m map[string]any
	wantErr(t, "Get missing id", store.Get(ctx(t), s, "g", "absent", &m), store.ErrNotFound)
	wantErr(t, "Get in missing collection", store.Get(ctx(t), s, "never", "absent", &m), store.ErrNotFound)
	// The transaction is still usable after ErrNotFound.
	tx(t, s, func(tx store.Tx) error {
		if err := tx.Get("g", "absent", &m); !errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("Get absent: %v", err)
		}
		return tx.Create("g", "absent", map[string]any{"v": 2})
	})
	wantEqual(t, "created after miss", getMap(t, s, "g", "absent"), map[string]any{"v": float64(2)})
}

func testSet(t *testing.T, s store.Store, opts Options) {
	tx(t, s, func(tx store.Tx) error {
		return tx.Set("s", "k", map[string]any{"a": 1, "b": map[string]any{"x": 1, "y": 2}, "c": "gone"})
	})
	wantEqual(t, "Set creates", getMap(t, s, "s", "k")["a"], float64(1))
	tx(t, s, func(tx store.Tx) error {
		return tx.Set("s", "k", map[string]any{"a": 2, "b": map[string]any{"x": 9}})
	})
	got := getMap(t, s, "s", "k")
	if opts.SetMerges {
		t.Log("not checked (Options.SetMerges): Set removed the fields the new document lacks")
		delete(got, "c")
	}
	wantEqual(t, "Set replaces", got,
		map[string]any{"a": float64(2), "b": map[string]any{"x": float64(9)}})
}

func testUpdate(t *testing.T, s store.Store, _ Options) {
	create(t, s, "u", "k", map[string]any{"a": 1, "b": map[string]any{"x": 1, "y": 2}, "c": "keep"})
	tx(t, s, func(tx store.Tx) error {
		return tx.Update("u", "k", map[string]any{"b": map[string]any{"x": 9}, "d": true, "e": []string{"p", "q"}, "n": int64(maxSafe)})
	})
	var got map[string]any
	if err := store.Get(ctx(t), s, "u", "k", &got); err != nil {
		t.Fatal(err)
	}
	wantEqual(t, "after Update", got, map[string]any{
		"a": float64(1), "b": map[string]any{"x": float64(9)}, "c": "keep", "d": true,
		"e": []any{"p", "q"}, "n": float64(maxSafe),
	})
	type doc struct {
		N int64 `json:"n"`
	}
	var d doc
	if err := store.Get(ctx(t), s, "u", "k", &d); err != nil || d.N != maxSafe {
		t.Errorf("updated int64 = %d, %v; want %d", d.N, err, int64(maxSafe))
	}
}

func testUpdateMissing(t *testing.T, s store.Store, opts Options) {
	err := s.RunTx(ctx(t), func(tx store.Tx) error { return tx.Update("u", "absent", map[string]any{"a": 1}) })
	wantErr(t, "Update absent", err, store.ErrNotFound)
	wantMissing(t, s, "u", "absent")
	// Ignoring the error does not let the transaction commit.
	err = s.RunTx(ctx(t), func(tx store.Tx) error {
		if err := tx.Set("u", "other", map[string]any{"v": 1}); err != nil {
			return err
		}
		_ = tx.Update("u", "absent", map[string]any{"a": 1})
		return nil
	})
	wantErr(t, "tx with ignored Update failure", err, store.ErrNotFound)
	wantMissing(t, s, "u", "absent")
	if opts.CommitNotAtomic {
		t.Log("not checked (Options.CommitNotAtomic): the other write was rolled back")
	} else {
		wantMissing(t, s, "u", "other")
	}
}

func testDelete(t *testing.T, s store.Store, _ Options) {
	create(t, s, "d", "k", map[string]any{"a": 1})
	tx(t, s, func(tx store.Tx) error { return tx.Delete("d", "k") })
	wantMissing(t, s, "d", "k")
	tx(t, s, func(tx store.Tx) error { return tx.Delete("d", "k") })
	tx(t, s, func(tx store.Tx) error { return tx.Delete("never", "k") })
	// Deleted documents can be created again.
	create(t, s, "d", "k", map[string]any{"a": 2})
	wantEqual(t, "recreated", getMap(t, s, "d", "k"), map[string]any{"a": float64(2)})
}

type row struct {
	ID     string `json:"id"`
	Owner  string `json:"owner"`
	Active bool   `json:"active"`
	N      *int64 `json:"n,omitempty"`
	Name   string `json:"name,omitempty"`
}

func n(v int64) *int64 { return &v }

// rows are created out of id order on purpose.
var rows = []row{
	{ID: "r3", Owner: "alice", Active: true, N: n(30), Name: "charlie"},
	{ID: "r1", Owner: "alice", Active: false, N: n(10), Name: "echo"},
	{ID: "r5", Owner: "bob", Active: true, N: n(-5), Name: "alpha"},
	{ID: "r2", Owner: "alice", Active: true, N: n(maxSafe), Name: "delta"},
	{ID: "r4", Owner: "bob", Active: false, Name: "bravo"}, // no n
	{ID: "r6", Owner: "carol", Active: true, N: n(20)},     // no name
}

func seed(t *testing.T, s store.Store, coll string) {
	t.Helper()
	tx(t, s, func(tx store.Tx) error {
		for _, r := range rows {
			if err := tx.Create(coll, r.ID, r); err != nil {
				return err
			}
		}
		return nil
	})
	// An unrelated collection must not leak into queries.
	create(t, s, coll+"_other", "r9", row{ID: "r9", Owner: "alice", Active: true, N: n(1)})
}

func ids(rs []row) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = r.ID
	}
	return strings.Join(s, ",")
}

func testQuery(t *testing.T, s store.Store, _ Options) {
	seed(t, s, "q")
	type myString string
	cases := []struct {
		name string
		q    store.Query
		want string
	}{
		{"all in id order", store.Query{}, "r1,r2,r3,r4,r5,r6"},
		{"all in id order desc", store.Query{Desc: true}, "r6,r5,r4,r3,r2,r1"},
		{"string", store.Where("owner", "alice"), "r1,r2,r3"},
		{"named string type", store.Where("owner", myString("bob")), "r4,r5"},
		{"bool true", store.Where("active", true), "r2,r3,r5,r6"},
		{"bool false", store.Where("active", false), "r1,r4"},
		{"int", store.Where("n", 30), "r3"},
		{"negative int64", store.Where("n", int64(-5)), "r5"},
		{"int64 near 2^53", store.Where("n", int64(maxSafe)), "r2"},
		{"two conditions", store.Where("owner", "alice", "active", true), "r2,r3"},
		{"no match", store.Where("owner", "dave"), ""},
		{"type mismatch", store.Where("owner", 1), ""},
		{"missing field", store.Where("nope", "x"), ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got []row
			if err := store.List(ctx(t), s, "q", c.q, &got); err != nil {
				t.Fatalf("List: %v", err)
			}
			if ids(got) != c.want {
				t.Errorf("ids = %q; want %q", ids(got), c.want)
			}
			if got == nil {
				t.Errorf("result slice is nil; want empty")
			}
		})
	}
	t.Run("full documents", func(t *testing.T) {
		var got []row
		if err := store.List(ctx(t), s, "q", store.Where("owner", "carol"), &got); err != nil {
			t.Fatal(err)
		}
		wantEqual(t, "carol", got, []row{rows[5]})
	})
	t.Run("pointer elements and maps", func(t *testing.T) {
		var ptrs []*row
		if err := store.List(ctx(t), s, "q", store.Where("owner", "bob"), &ptrs); err != nil {
			t.Fatal(err)
		}
		if len(ptrs) != 2 || ptrs[0].ID != "r4" || ptrs[1].ID != "r5" {
			t.Errorf("[]*row = %v", ptrs)
		}
		var maps []map[string]any
		if err := store.List(ctx(t), s, "q", store.Where("owner", "bob"), &maps); err != nil {
			t.Fatal(err)
		}
		if len(maps) != 2 || maps[0]["id"] != "r4" {
			t.Errorf("[]map = %v", maps)
		}
	})
	t.Run("empty collection", func(t *testing.T) {
		got := []row{{ID: "stale"}}
		if err := store.List(ctx(t), s, "never", store.Query{}, &got); err != nil {
			t.Fatal(err)
		}
		if len(got) != 0 {
			t.Errorf("got %v; want empty", got)
		}
	})
}

func testQueryOrder(t *testing.T, s store.Store, _ Options) {
	seed(t, s, "o")
	cases := []struct {
		name string
		q    store.Query
		want string
	}{
		{"int asc, missing excluded", store.Query{OrderBy: "n"}, "r5,r1,r6,r3,r2"},
		{"int desc", store.Query{OrderBy: "n", Desc: true}, "r2,r3,r6,r1,r5"},
		{"string asc, missing excluded", store.Query{OrderBy: "name"}, "r5,r4,r3,r2,r1"},
		{"string desc", store.Query{OrderBy: "name", Desc: true}, "r1,r2,r3,r4,r5"},
		{"limit", store.Query{OrderBy: "n", Limit: 2}, "r5,r1"},
		{"limit desc", store.Query{OrderBy: "n", Desc: true, Limit: 3}, "r2,r3,r6"},
		{"limit larger than result", store.Query{OrderBy: "name", Limit: 10}, "r5,r4,r3,r2,r1"},
		{"where and order", store.Query{Where: []store.Eq{{Field: "owner", Value: "alice"}}, OrderBy: "n", Desc: true}, "r2,r3,r1"},
		{"where, order, limit", store.Query{Where: []store.Eq{{Field: "active", Value: true}}, OrderBy: "name", Limit: 2}, "r5,r3"},
		{"where, order excludes missing", store.Query{Where: []store.Eq{{Field: "owner", Value: "bob"}}, OrderBy: "n"}, "r5"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var got []row
			if err := store.List(ctx(t), s, "o", c.q, &got); err != nil {
				t.Fatalf("List: %v", err)
			}
			if ids(got) != c.want {
				t.Errorf("ids = %q; want %q", ids(got), c.want)
			}
		})
	}
}

func testReadAfterWrite(t *testing.T, s store.Store, _ Options) {
	create(t, s, "raw", "existing", map[string]any{"v": 1})
	reads := []struct {
		name string
		read func(tx store.Tx) error
	}{
		{"Get", func(tx store.Tx) error { var m map[string]any; return tx.Get("raw", "existing", &m) }},
		{"Get missing", func(tx store.Tx) error { var m map[string]any; return tx.Get("raw", "absent", &m) }},
		{"Query", func(tx store.Tx) error { var r []map[string]any; return tx.Query("raw", store.Query{}, &r) }},
	}
	writes := []struct {
		name  string
		write func(tx store.Tx) error
	}{
		{"Create", func(tx store.Tx) error { return tx.Create("raw", "new", map[string]any{"v": 2}) }},
		{"Set", func(tx store.Tx) error { return tx.Set("raw", "new", map[string]any{"v": 2}) }},
		{"Update", func(tx store.Tx) error { return tx.Update("raw", "existing", map[string]any{"v": 2}) }},
		{"Delete", func(tx store.Tx) error { return tx.Delete("raw", "existing") }},
	}
	for _, w := range writes {
		for _, r := range reads {
			for _, swallow := range []bool{false, true} {
				name := w.name + " then " + r.name
				if swallow {
					name += " (error ignored)"
				}
				t.Run(name, func(t *testing.T) {
					var readErr error
					err := s.RunTx(ctx(t), func(tx store.Tx) error {
						if err := w.write(tx); err != nil {
							return fmt.Errorf("write: %w", err)
						}
						readErr = r.read(tx)
						if swallow {
							return nil
						}
						return readErr
					})
					wantErr(t, "read", readErr, store.ErrReadAfterWrite)
					wantErr(t, "RunTx", err, store.ErrReadAfterWrite)
					wantMissing(t, s, "raw", "new")
					wantEqual(t, "existing untouched", getMap(t, s, "raw", "existing"), map[string]any{"v": float64(1)})
				})
			}
		}
	}
}

type boom struct{ msg string }

func (b *boom) Error() string { return b.msg }

func testErrorRollsBack(t *testing.T, s store.Store, _ Options) {
	tx(t, s, func(tx store.Tx) error {
		if err := tx.Create("rb", "upd", map[string]any{"v": 1}); err != nil {
			return err
		}
		if err := tx.Create("rb", "del", map[string]any{"v": 1}); err != nil {
			return err
		}
		return tx.Create("rb", "set", map[string]any{"v": 1})
	})
	want := &boom{"boom"}
	calls := 0
	err := s.RunTx(ctx(t), func(tx store.Tx) error {
		calls++
		var m map[string]any
		if err := tx.Get("rb", "upd", &m); err != nil {
			return err
		}
		for _, w := range []error{
			tx.Create("rb", "new", map[string]any{"v": 2}),
			tx.Create("rb2", "new", map[string]any{"v": 2}),
			tx.Set("rb", "set", map[string]any{"v": 2}),
			tx.Update("rb", "upd", map[string]any{"v": 2}),
			tx.Delete("rb", "del"),
		} {
			if w != nil {
				return w
			}
		}
		return want
	})
	if err != want {
		t.Errorf("RunTx = %v (%T); want the function's error as is", err, err)
	}
	if calls != 1 {
		t.Errorf("fn ran %d times; want 1", calls)
	}
	wantMissing(t, s, "rb", "new")
	wantMissing(t, s, "rb2", "new")
	for _, id := range []string{"upd", "del", "set"} {
		wantEqual(t, id, getMap(t, s, "rb", id), map[string]any{"v": float64(1)})
	}
}

func testContextCancelled(t *testing.T, s store.Store, _ Options) {
	c, cancel := context.WithCancel(t.Context())
	cancel()
	ran := false
	err := s.RunTx(c, func(tx store.Tx) error {
		ran = true
		return tx.Create("ctx", "k", map[string]any{"v": 1})
	})
	wantErr(t, "RunTx on cancelled ctx", err, context.Canceled)
	if ran {
		t.Errorf("fn ran on a cancelled context")
	}
	wantMissing(t, s, "ctx", "k")

	// Cancelled while fn runs: nothing commits.
	c, cancel = context.WithCancel(t.Context())
	err = s.RunTx(c, func(tx store.Tx) error {
		err := tx.Create("ctx", "k2", map[string]any{"v": 1})
		cancel()
		return err
	})
	if err == nil {
		t.Errorf("RunTx cancelled during fn: err = nil")
	}
	wantMissing(t, s, "ctx", "k2")
}

// BadIDs are ids Firestore refuses, and so every backend (store.CheckID):
// firestorestore's tests check the list against the emulator itself,
// without the backend's own check in front.
var BadIDs = []string{"", "a/b", "/", strings.Repeat("x", store.MaxIDBytes+1), ".", "..", "__reserved__", "__x__", "_____", "__ __",
	"bad\xffutf8"}

// GoodIDs are the edges of the rule that Firestore accepts, and so every
// backend.
var GoodIDs = []string{"...", "_", "___", "____", "__x_", "_x__", "a__x__", "__x__a", "a.b", "%2F", " ", "é", ".a"}

func testInvalid(t *testing.T, s store.Store, _ Options) {
	create(t, s, "inv", "ok", map[string]any{"v": 1})
	doc := map[string]any{"v": 1}
	for _, bad := range BadIDs {
		// Every bad id is refused the same way by store.CheckID, the rule
		// both backends apply, so a service can check at its door.
		if store.CheckID(bad) == nil {
			t.Errorf("store.CheckID(%.20q) accepts an id the backends refuse", bad)
		}
		for _, pos := range []string{"coll", "id"} {
			coll, id := "inv", "ok"
			if pos == "coll" {
				coll = bad
			} else {
				id = bad
			}
			ops := map[string]func(tx store.Tx) error{
				"Get":    func(tx store.Tx) error { var m map[string]any; return tx.Get(coll, id, &m) },
				"Create": func(tx store.Tx) error { return tx.Create(coll, id, doc) },
				"Set":    func(tx store.Tx) error { return tx.Set(coll, id, doc) },
				"Update": func(tx store.Tx) error { return tx.Update(coll, id, doc) },
				"Delete": func(tx store.Tx) error { return tx.Delete(coll, id) },
			}
			if pos == "coll" {
				ops["Query"] = func(tx store.Tx) error { var r []map[string]any; return tx.Query(coll, store.Query{}, &r) }
			}
			for op, f := range ops {
				err := s.RunTx(ctx(t), f)
				what := fmt.Sprintf("%s with %s %.20q", op, pos, bad)
				wantErr(t, what, err, store.ErrInvalid)
				// A bad document id is the caller's input error (a service
				// answers 400, not a retryable 503); a bad collection name is
				// the program's.
				var ie *store.IDError
				if isID := errors.As(err, &ie); isID != (pos == "id") {
					t.Errorf("%s: err = %v (%T); an *store.IDError only for a document id", what, err, err)
				} else if isID && ie.InputError() == "" {
					t.Errorf("%s: no sentence for the caller", what)
				}
			}
		}
	}
	// The edges of the rule are accepted alike.
	for _, ok := range GoodIDs {
		if err := store.CheckID(ok); err != nil {
			t.Errorf("store.CheckID(%q): %v", ok, err)
		}
		create(t, s, "inv", ok, doc)
		wantEqual(t, fmt.Sprintf("id %q", ok), getMap(t, s, "inv", ok), map[string]any{"v": float64(1)})
	}
	if !testing.Short() {
		// 1500 bytes is allowed.
		okLong := strings.Repeat("y", 1500)
		create(t, s, "inv", okLong, doc)
		wantEqual(t, "1500-byte id", getMap(t, s, "inv", okLong), map[string]any{"v": float64(1)})
	}

	badDocs := map[string]any{
		"number":        42,
		"array":         []int{1},
		"string":        "s",
		"nil":           nil,
		"nil map":       map[string]any(nil),
		"nested arrays": map[string]any{"a": []any{[]int{1}}},
		"empty key":     map[string]any{"": 1},
		"unencodable":   map[string]any{"f": func() {}},
	}
	for name, d := range badDocs {
		for op, f := range map[string]func(tx store.Tx) error{
			"Create": func(tx store.Tx) error { return tx.Create("inv", "new", d) },
			"Set":    func(tx store.Tx) error { return tx.Set("inv", "new", d) },
		} {
			wantErr(t, op+" "+name, s.RunTx(ctx(t), f), store.ErrInvalid)
		}
	}
	wantMissing(t, s, "inv", "new")

	others := map[string]func(tx store.Tx) error{
		"Update no fields":     func(tx store.Tx) error { return tx.Update("inv", "ok", nil) },
		"Update empty field":   func(tx store.Tx) error { return tx.Update("inv", "ok", map[string]any{"": 1}) },
		"Update nested arrays": func(tx store.Tx) error { return tx.Update("inv", "ok", map[string]any{"a": [][]int{{1}}}) },
		"Get non-pointer":      func(tx store.Tx) error { var m map[string]any; return tx.Get("inv", "ok", m) },
		"Get nil":              func(tx store.Tx) error { return tx.Get("inv", "ok", nil) },
		"Query non-slice":      func(tx store.Tx) error { var m map[string]any; return tx.Query("inv", store.Query{}, &m) },
		"Query negative limit": func(tx store.Tx) error { var r []row; return tx.Query("inv", store.Query{Limit: -1}, &r) },
		"Query empty field":    func(tx store.Tx) error { var r []row; return tx.Query("inv", store.Where("", "x"), &r) },
		"Query object value":   func(tx store.Tx) error { var r []row; return tx.Query("inv", store.Where("v", map[string]any{}), &r) },
		"Query nil value":      func(tx store.Tx) error { var r []row; return tx.Query("inv", store.Where("v", nil), &r) },
	}
	for name, f := range others {
		wantErr(t, name, s.RunTx(ctx(t), f), store.ErrInvalid)
	}
	wantEqual(t, "untouched", getMap(t, s, "inv", "ok"), map[string]any{"v": float64(1)})
}

type claim struct {
	ClaimedBy string `json:"claimed_by"`
}

// testSingleUse: many transactions race to consume one single-use key;
// exactly one wins.
func testSingleUse(t *testing.T, s store.Store, _ Options) {
	create(t, s, "keys", "k", claim{})
	const n = 50
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		winners []string
		saw     int
	)
	c0 := raceCtx(t)
	for i := range n {
		wg.Go(func() {
			me := fmt.Sprintf("g%02d", i)
			var won bool
			err := s.RunTx(c0, func(tx store.Tx) error {
				won = false // fn may run again on contention
				var c claim
				if err := tx.Get("keys", "k", &c); err != nil {
					return err
				}
				if c.ClaimedBy != "" {
					return nil
				}
				won = true
				return tx.Update("keys", "k", map[string]any{"claimed_by": me})
			})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("%s: RunTx: %v", me, err)
				return
			}
			if won {
				winners = append(winners, me)
			} else {
				saw++
			}
		})
	}
	wg.Wait()
	if len(winners) != 1 || saw != n-1 {
		t.Fatalf("winners = %v, saw claimed = %d; want exactly one winner and %d losers", winners, saw, n-1)
	}
	var c claim
	if err := store.Get(ctx(t), s, "keys", "k", &c); err != nil {
		t.Fatal(err)
	}
	if c.ClaimedBy != winners[0] {
		t.Errorf("claimed_by = %q; want the winner %q", c.ClaimedBy, winners[0])
	}
}

// testCounter: concurrent read-modify-write increments are not lost.
func testCounter(t *testing.T, s store.Store, _ Options) {
	type counter struct {
		N int64 `json:"n"`
	}
	create(t, s, "counters", "c", counter{})
	const n = 20
	var wg sync.WaitGroup
	c0 := raceCtx(t)
	for range n {
		wg.Go(func() {
			err := s.RunTx(c0, func(tx store.Tx) error {
				var c counter
				if err := tx.Get("counters", "c", &c); err != nil {
					return err
				}
				c.N++
				return tx.Set("counters", "c", c)
			})
			if err != nil {
				t.Errorf("RunTx: %v", err)
			}
		})
	}
	wg.Wait()
	var c counter
	if err := store.Get(ctx(t), s, "counters", "c", &c); err != nil {
		t.Fatal(err)
	}
	if c.N != n {
		t.Errorf("counter = %d; want %d", c.N, n)
	}
}
