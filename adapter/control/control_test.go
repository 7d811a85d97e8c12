package control_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"agentmesh.dev/mesh/adapter/control"
)

func TestSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "ctl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "control.sock")
	if err := control.Call(path, control.Request{Op: "status"}, nil, time.Second); !errors.Is(err, control.ErrNotRunning) {
		t.Fatalf("no adapter: %v", err)
	}
	l, err := control.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode: %v %v", fi.Mode(), err)
	}
	if _, err := control.Listen(path); err == nil {
		t.Fatal("a second adapter listened on the same socket")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- control.Serve(ctx, l, func(_ context.Context, r control.Request) (any, error) {
			if r.Op == "boom" {
				return nil, errors.New("message #9 is not unread")
			}
			return map[string]string{"echo": r.Text}, nil
		}, slog.New(slog.DiscardHandler))
	}()
	var out map[string]string
	if err := control.Call(path, control.Request{Op: "x", Text: "hi"}, &out, time.Second); err != nil || out["echo"] != "hi" {
		t.Fatalf("call: %v %v", out, err)
	}
	if err := control.Call(path, control.Request{Op: "boom"}, nil, time.Second); err == nil || err.Error() != "message #9 is not unread" {
		t.Fatalf("error answer: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := control.Call(path, control.Request{Op: "status"}, nil, time.Second); !errors.Is(err, control.ErrNotRunning) {
		t.Fatalf("after stop: %v", err)
	}
	// A stale socket file left by a crash is replaced.
	l2, err := control.Listen(path)
	if err != nil {
		t.Fatalf("stale socket: %v", err)
	}
	_ = l2.Close()
}
