package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"agentmesh.dev/mesh/shared/devenv"
	"agentmesh.dev/mesh/shared/mail"
)

// meshbench against a real mesh: every request completes and the report
// line carries the numbers.
func TestMeshbenchRuns(t *testing.T) {
	dir := t.TempDir()
	ob, _ := mail.NewOutbox(t.TempDir(), slog.New(slog.DiscardHandler))
	m, err := devenv.Start(t.Context(), devenv.Config{DataDir: dir, Mail: ob})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	b, _ := json.Marshal(m.URLs())
	if err := os.WriteFile(filepath.Join(dir, "meshd.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"--data-dir", dir, "--requests", "200", "--concurrency", "8"}, &out, &errOut); err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	if !strings.Contains(out.String(), "done: 200 requests") || !strings.Contains(out.String(), "0 failed") || !strings.Contains(out.String(), "p99") {
		t.Errorf("report: %s", out.String())
	}
	if err := run(context.Background(), []string{"--data-dir", t.TempDir()}, &out, &errOut); err == nil || !strings.Contains(err.Error(), "is meshd running") {
		t.Errorf("no meshd: %v", err)
	}
}
