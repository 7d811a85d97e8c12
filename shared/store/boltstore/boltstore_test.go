package boltstore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/store"
	"agentmesh.dev/mesh/shared/store/boltstore"
	"agentmesh.dev/mesh/shared/store/storetest"
)

func open(t *testing.T) store.Store {
	t.Helper()
	s, err := boltstore.Open(filepath.Join(t.TempDir(), "data", "store.db"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestContract(t *testing.T) {
	storetest.Run(t, open, storetest.Options{Isolated: true})
}

type doc struct {
	V string `json:"v"`
}

func TestReopenKeepsData(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nested", "dir", "store.db")
	s, err := boltstore.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := s.RunTx(ctx, func(tx store.Tx) error { return tx.Create("c", "k", doc{"kept"}) }); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct {
		path string
		mode os.FileMode
	}{{path, 0o600}, {filepath.Dir(path), 0o700}} {
		fi, err := os.Stat(p.path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != p.mode {
			t.Errorf("%s mode = %v; want %v", p.path, fi.Mode().Perm(), p.mode)
		}
	}

	s, err = boltstore.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var d doc
	if err := store.Get(ctx, s, "c", "k", &d); err != nil || d.V != "kept" {
		t.Fatalf("after reopen: %+v, %v", d, err)
	}
}

func TestSecondOpenFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "store.db")
	s, err := boltstore.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	start := time.Now()
	s2, err := boltstore.Open(path, boltstore.WithLockTimeout(200*time.Millisecond))
	took := time.Since(start)
	if err == nil {
		s2.Close()
		t.Fatal("second Open succeeded while the first is open")
	}
	if !errors.Is(err, boltstore.ErrLocked) || !strings.Contains(err.Error(), "data dir in use by another meshd") {
		t.Errorf("err = %v; want ErrLocked with a clear message", err)
	}
	if took > 5*time.Second {
		t.Errorf("second Open took %v", took)
	}
	t.Logf("second Open failed after %v: %v", took.Round(time.Millisecond), err)

	// Once the first is closed the file opens again.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s3, err := boltstore.Open(path, boltstore.WithLockTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatalf("Open after Close: %v", err)
	}
	s3.Close()
}

// BenchmarkCreate measures durable single-document transactions: each
// iteration is one RunTx with one Create, committed with fsync.
func BenchmarkCreate(b *testing.B) {
	s, err := boltstore.Open(filepath.Join(b.TempDir(), "store.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	d := map[string]any{"owner": "alice", "active": true, "n": 42, "name": "a typical small control-plane record"}
	i := 0
	for b.Loop() {
		id := fmt.Sprintf("k%09d", i)
		if err := s.RunTx(ctx, func(tx store.Tx) error { return tx.Create("bench", id, d) }); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64(i)/b.Elapsed().Seconds(), "tx/s")
}

// TestGetMissReadsAsBefore: a Get of an absent document is ErrNotFound,
// with the text it always had, in a collection that exists and in one
// that does not.
func TestGetMissReadsAsBefore(t *testing.T) {
	s := open(t)
	defer s.Close()
	ctx := context.Background()
	if err := s.RunTx(ctx, func(tx store.Tx) error { return tx.Set("c", "here", doc{V: "x"}) }); err != nil {
		t.Fatal(err)
	}
	for _, coll := range []string{"c", "none"} {
		var d doc
		err := store.Get(ctx, s, coll, "absent", &d)
		if !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("Get %s/absent = %v, want ErrNotFound", coll, err)
		}
		if want := fmt.Errorf("boltstore: get %s/absent: %w", coll, store.ErrNotFound).Error(); err.Error() != want {
			t.Fatalf("Get %s/absent: %q, want %q", coll, err, want)
		}
	}
}
