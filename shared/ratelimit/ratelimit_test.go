package ratelimit_test

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/ratelimit"
	"agentmesh.dev/mesh/shared/store"
	"agentmesh.dev/mesh/shared/store/boltstore"
)

func TestSlidingWindow(t *testing.T) {
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	lim := ratelimit.Limit{Name: "test", Key: "192.0.2.1", Max: 3, Window: time.Hour}
	other := ratelimit.Limit{Name: "test", Key: "192.0.2.2", Max: 3, Window: time.Hour}
	take := func(at time.Time, ls ...ratelimit.Limit) error {
		return st.RunTx(t.Context(), func(tx store.Tx) error { return ratelimit.Take(tx, "limits", at, ls...) })
	}
	start := time.Date(2026, 8, 1, 12, 0, 0, 0, time.UTC)
	for i := range 3 {
		if err := take(start.Add(time.Duration(i)*time.Minute), lim); err != nil {
			t.Fatalf("event %d: %v", i+1, err)
		}
	}
	var ex *ratelimit.Exceeded
	if err := take(start.Add(10*time.Minute), lim); !errors.As(err, &ex) || ex.RetryAfter != 50*time.Minute || ex.Limit.Name != "test" {
		t.Fatalf("fourth: %v", err)
	}
	// Another key, and a refusal by one limit writes nothing for the others.
	if err := take(start.Add(10*time.Minute), other, lim); !errors.As(err, &ex) || ex.Limit.Key != "192.0.2.1" {
		t.Fatalf("two limits: %v", err)
	}
	for i := range 3 {
		if err := take(start.Add(11*time.Minute), other); err != nil {
			t.Fatalf("other key, event %d: %v", i+1, err)
		}
	}
	// At the start of the next window the last one still weighs fully;
	// half way through it weighs half (1.5 of 3), so two more fit.
	if err := take(start.Add(time.Hour), lim); err == nil {
		t.Fatal("the previous window was forgotten at once")
	}
	for i := range 2 {
		if err := take(start.Add(90*time.Minute), lim); err != nil {
			t.Fatalf("half way, event %d: %v", i+1, err)
		}
	}
	if err := take(start.Add(90*time.Minute), lim); err == nil {
		t.Fatal("a third event half way through fit")
	}
	// Two windows later, nothing is remembered.
	for i := range 3 {
		if err := take(start.Add(3*time.Hour), lim); err != nil {
			t.Fatalf("later, event %d: %v", i+1, err)
		}
	}
	// The store holds no key in the clear.
	var docs []map[string]any
	if err := store.List(t.Context(), st, "limits", store.Query{}, &docs); err != nil || len(docs) != 2 {
		t.Fatalf("%d counters, %v", len(docs), err)
	}
	if ratelimit.ID("test", "192.0.2.1") == "192.0.2.1" {
		t.Fatal("ids must be hashes")
	}
}

// Check answers like Take but counts nothing.
func TestCheckCountsNothing(t *testing.T) {
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	lim := ratelimit.Limit{Name: "test", Key: "192.0.2.1", Max: 2, Window: time.Hour}
	now := time.Date(2026, 8, 1, 12, 0, 0, 0, time.UTC)
	run := func(f func(store.Tx, string, time.Time, ...ratelimit.Limit) error) error {
		return st.RunTx(t.Context(), func(tx store.Tx) error { return f(tx, "limits", now, lim) })
	}
	for range 5 {
		if err := run(ratelimit.Check); err != nil {
			t.Fatalf("check on an empty counter: %v", err)
		}
	}
	var docs []map[string]any
	if err := store.List(t.Context(), st, "limits", store.Query{}, &docs); err != nil || len(docs) != 0 {
		t.Fatalf("Check wrote %d counters, %v", len(docs), err)
	}
	for range 2 {
		if err := run(ratelimit.Take); err != nil {
			t.Fatal(err)
		}
	}
	var ex *ratelimit.Exceeded
	if err := run(ratelimit.Check); !errors.As(err, &ex) || ex.Limit.Name != "test" {
		t.Fatalf("check on a full counter: %v", err)
	}
}
