package devenv

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/nats-io/jwt/v2"

	"agentmesh.dev/mesh/functions/api"
	"agentmesh.dev/mesh/functions/routes"
	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/broker"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/credential"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/guest"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/registrar"
	"agentmesh.dev/mesh/shared/store"
	"agentmesh.dev/mesh/shared/store/boltstore"
)

// Data-directory entries of the control plane.
const (
	storeFile = "control.db"
	outboxDir = "outbox"
	// RegistrarKeyFile is the registrar's card-signing seed under keys/
	// (0600, made on first run). Resolvers pin its public key, so it must
	// survive restarts.
	RegistrarKeyFile = "registrar.nk"
)

// Control is the control plane of a running mesh: its store and services,
// for operator commands and tests.
type Control struct {
	Store       store.Store
	Accounts    *account.Service
	Credentials *credential.Service
	Guests      *guest.Service
	Registrar   *registrar.Service
	Deps        *api.Deps
	// Bus is the control plane's signed way onto the bus (the services
	// key), for the operator commands that act on bus state (the
	// catalog); nil on a stopped mesh.
	Bus *bus.Caller
}

// startControlPlane opens the store (or takes cfg.Store) and builds the
// control plane with the constructor the Cloud Functions use
// (api.NewDeps), mounts the route table on the mux, and runs its scheduled
// rows from a ticker.
func (m *Mesh) startControlPlane(dataDir string, cfg Config, base string) error {
	st := cfg.Store
	if st == nil {
		bst, err := boltstore.Open(filepath.Join(dataDir, storeFile))
		if err != nil {
			return fmt.Errorf("devenv: control store: %w", err)
		}
		m.closers = append(m.closers, bst.Close)
		st = bst
	}
	mailer := cfg.Mail
	if mailer == nil {
		ob, err := mail.NewOutbox(filepath.Join(dataDir, outboxDir), m.log)
		if err != nil {
			return fmt.Errorf("devenv: mail outbox: %w", err)
		}
		mailer = ob
	}
	regKey, err := keys.LoadOrGenerate[keys.RegistrarRole](filepath.Join(dataDir, keysDir, RegistrarKeyFile))
	if err != nil {
		return fmt.Errorf("devenv: registrar key: %w", err)
	}
	// The control plane's own way onto the bus, for the account views, for
	// recording guests and clearing ended ones, and for asking whether an
	// agent key is new.
	cpNC, err := m.ConnectService("control-plane")
	if err != nil {
		return fmt.Errorf("devenv: control plane bus connection: %w", err)
	}
	m.closers = append(m.closers, func() error { cpNC.Close(); return nil })
	tcpURLs, wsURLs := m.meshURLs()
	caller := &bus.Caller{NC: cpNC, Key: m.servicesKey}
	auditCfg, err := m.auditBackends(dataDir, cfg)
	if err != nil {
		return err
	}
	d, err := api.NewDeps(api.Backends{Log: m.log, Store: st, Mail: mailer, Trust: m.trust, Revoker: m,
		Bus: caller, RegistrarKey: regKey, Now: cfg.Now,
		Mesh:       credential.MeshInfo{Name: cfg.meshName(), Protocol: "0.3", TCP: tcpURLs, WS: wsURLs},
		ControlURL: m.urls.Control, ConsoleURL: m.urls.Console, RegistrarURL: m.urls.Registrar,
		Settings: api.Settings{NoExpiry: cfg.NoExpiry, MarkupPct: cfg.MarkupPct, ClearingService: !cfg.Workers.None, RateLimit: cfg.RateLimit, TrustedProxyHops: cfg.TrustedProxyHops,
			BodyTimeout: cfg.BodyTimeout, GuestIdleTTL: cfg.GuestIdleTTL, GuestLimits: cfg.GuestLimits, AccountLimits: cfg.AccountLimits,
			Unowned: cfg.Unowned, Classes: cfg.Classes},
		Grants: cfg.Grants, Audit: auditCfg})
	if err != nil {
		return fmt.Errorf("devenv: %w", err)
	}
	if d.Grants != nil {
		m.closers = append(m.closers, d.Grants.Close)
	}
	m.log.Info("registrar ready", "url", m.urls.Registrar, "registrar_key", regKey.Public(), "kid", registrar.Kid(regKey.Public()))
	if m.roomOwners != nil {
		m.roomOwners.reg.Store(d.Registrar)
	}
	m.control = &Control{Store: st, Accounts: d.Accounts, Credentials: d.Credentials, Guests: d.Guests, Registrar: d.Registrar, Deps: d, Bus: caller}
	d.Mount(m.mux, routes.All())
	if err := m.applyStoredRevocations(context.Background(), st); err != nil {
		return err
	}
	// Apps made before the bus kept their records (an older meshd) are
	// answered from the start, not from the first sweep.
	if _, err := d.Credentials.ResyncApps(context.Background()); err != nil {
		m.log.Warn("app records on the bus; the credential sweep retries", "err", err)
	}
	if err := m.startAdmin(dataDir); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.closers = append(m.closers, func() error { cancel(); return nil })
	d.RunJobs(ctx, routes.All(), cfg.JobInterval)
	return nil
}

// Control returns the control plane.
func (m *Mesh) Control() *Control { return m.control }

// Revoke revokes credential keys at the broker at once (credential.Revoker).
func (m *Mesh) Revoke(ctx context.Context, keys []string, at time.Time) error {
	return m.UpdateMeshAccount(ctx, func(ac *jwt.AccountClaims) error {
		return creds.RevokeCredentials(ac, at, keys...)
	})
}

// SyncRevocations brings the mesh account's revocation list in line with
// the store's records (credential.RevocationSyncer, creds.SyncRevocations).
func (m *Mesh) SyncRevocations(ctx context.Context, keep, forget map[string]time.Time) (added, forgotten int, err error) {
	err = m.UpdateMeshAccount(ctx, func(ac *jwt.AccountClaims) error {
		if added, forgotten = creds.SyncRevocations(ac, keep, forget); added+forgotten == 0 {
			return broker.ErrUnchanged
		}
		return nil
	})
	return added, forgotten, err
}
