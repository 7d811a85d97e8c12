package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"agentmesh.dev/mesh/devenv"
	"agentmesh.dev/mesh/functions/api"
	"agentmesh.dev/mesh/shared/audit"
	"agentmesh.dev/mesh/shared/mailbox"
)

// urlsFile is written into the data directory once the mesh is ready, so
// scripts and adapters can find the addresses without parsing stdout.
const urlsFile = "meshd.json"

// shutdownBudget bounds the whole stop after SIGINT or SIGTERM: in-flight
// HTTP requests get half of it, the broker's JetStream flush the rest (see
// devenv.Mesh.Shutdown). Service managers kill a process that takes much
// longer (Docker after 10 s), and a person pressing Ctrl-C expects it to
// be quick.
const shutdownBudget = 4 * time.Second

// serve runs the mesh until ctx is cancelled.
func serve(ctx context.Context, cfg serveConfig, stdout, stderr io.Writer) error {
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))

	dataDir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	authorities, err := loadAuthorities(cfg.TimestampAuthorities)
	if err != nil {
		return err
	}
	mesh, err := devenv.Start(ctx, devenv.Config{
		DataDir:          dataDir,
		HTTPAddr:         cfg.HTTPAddr,
		NATSAddr:         cfg.NATSAddr,
		WSAddr:           cfg.WSAddr,
		Logger:           log,
		MarkupPct:        cfg.MarkupPct,
		TrustedProxyHops: cfg.TrustedProxyHops,
		GuestLimits:      cfg.GuestLimits,
		AccountLimits:    cfg.AccountLimits,
		Unowned:          cfg.Unowned,
		Classes:          cfg.Classes.Map(),
		Workers:          devenv.WorkerConfig{Mailbox: mailbox.Config{Limits: cfg.Mailbox}},
		Grants:           api.Grants{Deployer: cfg.GrantDeployer},
		Cluster:          cfg.Cluster,
		Audit:            devenv.AuditConfig{Authorities: authorities},
	})
	if err != nil {
		return err
	}
	urls := mesh.URLs()
	path := filepath.Join(dataDir, urlsFile)
	if err := writeJSONAtomic(path, urls); err != nil {
		_ = mesh.Close()
		return fmt.Errorf("write %s: %w", urlsFile, err)
	}
	printURLs(stdout, urls, dataDir, path)

	<-ctx.Done()
	log.Info("shutting down", "cause", context.Cause(ctx))
	shutdownCtx, cancel := context.WithTimeout(context.Background(), shutdownBudget)
	defer cancel()
	return mesh.Shutdown(shutdownCtx)
}

// printURLs shows people where the mesh is.
func printURLs(w io.Writer, u devenv.URLs, dataDir, jsonPath string) {
	fmt.Fprintf(w, `
meshd is running (data in %s)

  control plane     %s
  registrar         %s
  console           %s
  bus (TCP)         %s
  bus (WebSocket)   %s

The same URLs are in %s. Press Ctrl-C to stop.

`, dataDir, u.Control, u.Registrar, u.Console, u.MeshTCP, u.MeshWS, jsonPath)
}

// writeJSONAtomic writes v to path through a temporary file and a rename, so a
// reader never sees a half-written file.
func writeJSONAtomic(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // a no-op after the rename
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	// CreateTemp makes the file 0600; the URLs are not secret.
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// loadAuthorities reads the --timestamp-authorities file: none when path
// is empty (devenv then runs its local test-only ones), else two or more.
func loadAuthorities(path string) ([]audit.Authority, error) {
	if path == "" {
		return nil, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--timestamp-authorities: %w", err)
	}
	as, err := audit.ParseAuthorities(data)
	if err != nil {
		return nil, fmt.Errorf("--timestamp-authorities %s: %w", path, err)
	}
	if len(as) < audit.MinAuthorities {
		return nil, fmt.Errorf("--timestamp-authorities %s names %d authorities; the anchors need at least %d", path, len(as), audit.MinAuthorities)
	}
	return as, nil
}
