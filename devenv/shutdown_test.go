package devenv

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Shutdown returns when its context ends, even while the broker is still
// stopping (it stops durable consumers one at a time, about 10 ms each):
// meshd's SIGTERM is bounded however many mailboxes there are. The
// broker finishes in the background, holding the data directory until
// then, and what it held is all there at the next start.
func TestShutdownReturnsWhenItsContextEnds(t *testing.T) {
	dir := t.TempDir()
	m, err := Start(t.Context(), Config{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := m.ConnectService("test-consumers")
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BOXES", Subjects: []string{"boxes.>"}, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	const consumers = 50
	for i := range consumers {
		if _, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: fmt.Sprintf("box-%d", i),
			FilterSubject: fmt.Sprintf("boxes.%d", i), AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
			t.Fatal(err)
		}
	}
	nc.Close()

	done, stop := context.WithCancel(context.Background())
	stop() // no time left at all
	if err := m.Shutdown(done); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	// The broker is still at it, and still owns the directory.
	if l, err := LockDataDir(dir, "meshd"); !errors.Is(err, ErrLocked) {
		_ = l.Unlock()
		t.Fatalf("lock right after a Shutdown with no time left: %v, want it still held by the stopping broker", err)
	}

	// It lets go once the broker is done; then everything is there.
	deadline := time.Now().Add(30 * time.Second)
	for {
		l, err := LockDataDir(dir, "meshd")
		if err == nil {
			_ = l.Unlock()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stopping broker never released the data directory: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	again := startMesh(t, dir)
	nc, err = again.ConnectService("test-consumers")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ = jetstream.New(nc)
	info, err := js.Stream(ctx, "BOXES")
	if err != nil {
		t.Fatal(err)
	}
	if n := info.CachedInfo().State.Consumers; n != consumers {
		t.Errorf("%d consumers after the restart, want %d", n, consumers)
	}
}
