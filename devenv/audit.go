package devenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"time"

	"agentmesh.dev/mesh/functions/api"
	"agentmesh.dev/mesh/shared/audit"
	"agentmesh.dev/mesh/shared/audit/tsa"
	"agentmesh.dev/mesh/shared/keys"
)

// AuditConfig configures the audit records of a mesh (docs/audit.md).
type AuditConfig struct {
	// Authorities stamp the daily anchors (two or more). None: the mesh
	// runs LocalAuthorities test-only authorities of its own, on loopback
	// ports, keeps their keys under the data directory (tsa/) and says
	// everywhere that they are test-only.
	Authorities []audit.Authority
	// Now is the anchor job's clock, when it must differ from the control
	// plane's: a test anchors today by running the job as if tomorrow had
	// begun. The local test-only authorities keep it too, so their stamps
	// are from after the anchored date ended, as a verifier requires. nil
	// is Config.Now.
	Now func() time.Time
}

// Data-directory entries of the audit records.
const (
	// ExportKeyFile is the seed of the key that signs audit exports,
	// under keys/ (0600, made on first run). Verifiers pin its public key
	// (GET /v1/capabilities, audit.export_key), so it must survive
	// restarts.
	ExportKeyFile = "export.nk"
	// TSADir holds the local test-only authorities, one directory each.
	TSADir = "tsa"
)

// LocalAuthorities are the names of the test-only timestamp authorities a
// mesh without configured ones runs: two, the least the anchors take.
var LocalAuthorities = []string{"meshd-test-tsa-1", "meshd-test-tsa-2"}

// auditBackends makes the control plane's audit configuration: the export
// key, and the configured authorities or the local test-only ones.
func (m *Mesh) auditBackends(dataDir string, cfg Config) (api.Audit, error) {
	exportKey, err := keys.LoadOrGenerate[keys.AgentRole](filepath.Join(dataDir, keysDir, ExportKeyFile))
	if err != nil {
		return api.Audit{}, fmt.Errorf("devenv: export key: %w", err)
	}
	out := api.Audit{Authorities: cfg.Audit.Authorities, ExportKey: exportKey, Now: cfg.Audit.Now}
	if len(out.Authorities) == 0 {
		if out.Authorities, err = m.startLocalAuthorities(dataDir, cfg.Audit.Now); err != nil {
			return api.Audit{}, err
		}
		out.TestOnly = true
	}
	m.log.Info("audit exports are signed by the export key", "export_key", exportKey.Public())
	return out, nil
}

// startLocalAuthorities serves the LocalAuthorities on loopback ports until
// the mesh stops, on the anchor job's clock (time.Now when nil).
func (m *Mesh) startLocalAuthorities(dataDir string, now func() time.Time) ([]audit.Authority, error) {
	var out []audit.Authority
	for _, name := range LocalAuthorities {
		a, err := tsa.LoadOrCreate(filepath.Join(dataDir, TSADir, name), name)
		if err != nil {
			return nil, fmt.Errorf("devenv: test-only timestamp authority %s: %w", name, err)
		}
		a.Now = now
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("devenv: test-only timestamp authority %s: %w", name, err)
		}
		srv := &http.Server{Handler: a, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				m.log.Error("test-only timestamp authority stopped", "authority", name, "err", err)
			}
		}()
		m.closers = append(m.closers, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return srv.Shutdown(ctx)
		})
		out = append(out, audit.Authority{Name: name, URL: "http://" + ln.Addr().String(), Root: a.Root()})
	}
	m.log.Warn("audit anchors are stamped by local TEST-ONLY timestamp authorities: their stamps prove nothing to anyone who does not trust their roots (GET /v1/anchors/authorities); configure public authorities for a mesh whose anchors must mean something",
		"authorities", LocalAuthorities)
	return out, nil
}
