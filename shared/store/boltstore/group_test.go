package boltstore

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/store"
)

func openInternal(t *testing.T) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "store.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// queued waits until n calls wait for the next commit.
func (s *Store) queued(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s.mu.Lock()
		got := len(s.queue)
		s.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d calls queued, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func (s *Store) commitCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.commits
}

type counter struct {
	N int `json:"n"`
}

// holdFirst starts a call whose function waits for release, so that the
// calls started after it queue for one shared commit.
func holdFirst(t *testing.T, s *Store) (release func(), done chan error) {
	t.Helper()
	started, hold := make(chan struct{}), make(chan struct{})
	done = make(chan error, 1)
	go func() {
		done <- s.RunTx(context.Background(), func(tx store.Tx) error {
			close(started)
			<-hold
			return tx.Set("c", "first", counter{1})
		})
	}()
	<-started
	return func() { close(hold) }, done
}

// Calls that arrive during a commit share the next one, and each sees the
// writes of those before it: 32 read-modify-write increments of one
// document, all but the first in one commit, count to 32.
func TestGroupCommit(t *testing.T) {
	s := openInternal(t)
	release, first := holdFirst(t, s)
	const n = 32
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- s.RunTx(context.Background(), func(tx store.Tx) error {
				var c counter
				if err := tx.Get("c", "n", &c); err != nil && !errors.Is(err, store.ErrNotFound) {
					return err
				}
				c.N++
				return tx.Set("c", "n", c)
			})
		}()
		s.queued(t, i+1)
	}
	release()
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got := s.commitCount(); got != 2 {
		t.Fatalf("%d commits, want 2 (the first call's, then one for the other %d)", got, n)
	}
	var c counter
	if err := s.RunTx(context.Background(), func(tx store.Tx) error { return tx.Get("c", "n", &c) }); err != nil || c.N != n {
		t.Fatalf("counter %d (%v), want %d", c.N, err, n)
	}
}

// Inside one shared commit every call keeps its own outcome: a failed
// function's writes are not applied and later ones do not see them, a
// Create of a document an earlier call created fails alone, a function
// that panics panics on its caller's goroutine, and a canceled context
// stops only its own call.
func TestGroupCommitKeepsEachOutcome(t *testing.T) {
	s := openInternal(t)
	release, first := holdFirst(t, s)
	boom := errors.New("boom")
	// Canceled once queued, before its commit runs.
	canceled, cancel := context.WithCancel(context.Background())
	type result struct {
		err      error
		panicked any
	}
	calls := []struct {
		name string
		ctx  context.Context
		fn   func(tx store.Tx) error
		want func(result) error
	}{
		{"fails after writing", context.Background(), func(tx store.Tx) error {
			if err := tx.Set("c", "x", counter{1}); err != nil {
				return err
			}
			return boom
		}, func(r result) error {
			if !errors.Is(r.err, boom) {
				return fmt.Errorf("got %v", r.err)
			}
			return nil
		}},
		{"does not see it", context.Background(), func(tx store.Tx) error {
			var c counter
			if err := tx.Get("c", "x", &c); !errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("saw x: %v", err)
			}
			return tx.Create("c", "y", counter{2})
		}, func(r result) error { return r.err }},
		{"creates what the previous created", context.Background(), func(tx store.Tx) error {
			return tx.Create("c", "y", counter{3})
		}, func(r result) error {
			if !errors.Is(r.err, store.ErrExists) {
				return fmt.Errorf("got %v", r.err)
			}
			return nil
		}},
		{"panics", context.Background(), func(tx store.Tx) error {
			_ = tx.Set("c", "z", counter{4})
			panic("fn panicked")
		}, func(r result) error {
			if r.panicked != "fn panicked" {
				return fmt.Errorf("panicked with %v", r.panicked)
			}
			return nil
		}},
		{"canceled", canceled, func(tx store.Tx) error { return tx.Set("c", "w", counter{5}) }, func(r result) error {
			if !errors.Is(r.err, context.Canceled) {
				return fmt.Errorf("got %v", r.err)
			}
			return nil
		}},
		{"updates after all that", context.Background(), func(tx store.Tx) error {
			return tx.Update("c", "y", map[string]any{"n": 6})
		}, func(r result) error { return r.err }},
	}
	results := make([]chan result, len(calls))
	for i, c := range calls {
		results[i] = make(chan result, 1)
		go func() {
			var r result
			defer func() { r.panicked = recover(); results[i] <- r }()
			r.err = s.RunTx(c.ctx, c.fn)
		}()
		s.queued(t, i+1)
	}
	cancel()
	release()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for i, c := range calls {
		if err := c.want(<-results[i]); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	if got := s.commitCount(); got != 2 {
		t.Fatalf("%d commits, want 2", got)
	}
	docs := map[string]int{}
	_ = s.RunTx(context.Background(), func(tx store.Tx) error {
		for _, id := range []string{"x", "y", "z", "w"} {
			var c counter
			if tx.Get("c", id, &c) == nil {
				docs[id] = c.N
			}
		}
		return nil
	})
	if len(docs) != 1 || docs["y"] != 6 {
		t.Fatalf("documents %v, want only y = 6", docs)
	}
}

// A function that ends its goroutine inside a shared commit (a test's
// t.Fatal does) abandons that commit: every call in it is answered with an
// error, nothing of it is written, and the store goes on serving.
func TestGroupCommitSurvivesAnEndedGoroutine(t *testing.T) {
	s := openInternal(t)
	release, first := holdFirst(t, s)
	results := make(chan error, 2)
	go func() {
		results <- s.RunTx(context.Background(), func(tx store.Tx) error {
			_ = tx.Set("c", "goexit", counter{1})
			runtime.Goexit()
			return nil
		})
	}()
	s.queued(t, 1)
	go func() {
		results <- s.RunTx(context.Background(), func(tx store.Tx) error { return tx.Set("c", "other", counter{2}) })
	}()
	s.queued(t, 2)
	release()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-results; err == nil {
			t.Fatal("a call of the abandoned commit succeeded")
		}
	}
	done := make(chan error, 1)
	go func() {
		done <- s.RunTx(context.Background(), func(tx store.Tx) error {
			var c counter
			if err := tx.Get("c", "other", &c); !errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("the abandoned commit wrote: %v", err)
			}
			return nil
		})
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the store stopped serving after an abandoned commit")
	}
}
