package workers

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/cloudsecrets"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/rooms"
)

// ReadsTrust reports whether the worker named name holds the mesh's trust
// chain: only the rooms worker, which mints acl room credentials (with the
// mesh account's signing key) and revokes them at the broker on expel and
// leave (re-signing the mesh account JWT with the operator key and pushing
// it over a system-account connection, as the control plane does).
// Every other worker holds its own service credential and the services
// key, nothing more. The Terraform generator grants the rooms worker's
// account the four trust seeds (docs/security.md, docs/secrets.md).
func ReadsTrust(name string) bool { return name == rooms.Name }

// trustDirFlag registers --trust-dir (MESH_TRUST_DIR) on the binaries of
// the workers that read the trust chain, for a deployment that keeps the
// keys in files (meshd's data directory's keys/) instead of Secret Manager.
func trustDirFlag(w Worker, fs *flag.FlagSet, o *Options, getenv func(string) string) {
	if ReadsTrust(w.Name) {
		fs.StringVar(&o.TrustDir, "trust-dir", getenv("MESH_TRUST_DIR"),
			"directory of the trust chain's seed files (operator.nk, system-account.nk, mesh-account.nk, mesh-signing.nk), when not read from --secrets-project (env MESH_TRUST_DIR)")
	}
}

// roomCredentials gives the rooms worker of a worker binary its
// Credentials: the trust chain from Secret Manager (the four trust seeds
// only) or from --trust-dir, and a system-account connection of its own
// for the revocations. Other workers get nothing. stop closes the
// connection; call it after the worker has stopped.
func roomCredentials(ctx context.Context, w Worker, o Options, cfg *Config, log *slog.Logger) (stop func(), err error) {
	if !ReadsTrust(w.Name) {
		return func() {}, nil
	}
	var t *creds.Trust
	switch {
	case o.SecretsProject != "":
		sopts, err := cloudsecrets.EmulatorOptions(o.secretManagerHost)
		if err != nil {
			return nil, err
		}
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if t, err = cloudsecrets.OpenTrust(ctx, o.SecretsProject, sopts...); err != nil {
			return nil, fmt.Errorf("trust chain: %w", err)
		}
	case o.TrustDir != "":
		if t, err = creds.Load(o.TrustDir); err != nil {
			return nil, fmt.Errorf("trust chain: %w", err)
		}
	default:
		return nil, errors.New("the rooms worker mints and revokes acl room credentials, so it needs the trust chain: --trust-dir (MESH_TRUST_DIR), or --secrets-project")
	}
	sysCreds, err := t.MintSystemUser(w.Name + "-worker-revoker")
	if err != nil {
		return nil, err
	}
	sys, err := nats.Connect(o.NATSURL, sysCreds.NATSOption(), nats.Name(w.Name+"-worker-revoker"),
		nats.MaxReconnects(-1), nats.ReconnectWait(time.Second))
	if err != nil {
		return nil, fmt.Errorf("connect %s as the system account: %w", o.NATSURL, err)
	}
	cfg.Rooms.Credentials = &rooms.TrustCredentials{Trust: t, Revoker: &creds.Revoker{Trust: t, Sys: sys}}
	log.Info("room credentials minted and revoked with the trust chain", "trust", t)
	return sys.Close, nil
}
