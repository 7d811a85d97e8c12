package devenv

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/functions/accounts"
	"agentmesh.dev/mesh/functions/api"
	"agentmesh.dev/mesh/functions/console"
	"agentmesh.dev/mesh/functions/credentials"
	guestfn "agentmesh.dev/mesh/functions/guest"
	"agentmesh.dev/mesh/functions/health"
	registrarfn "agentmesh.dev/mesh/functions/registrar"
	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/accountview"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/credential"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/guest"
	"agentmesh.dev/mesh/shared/httpx"
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/mailbox"
	"agentmesh.dev/mesh/shared/passkey"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/registrar"
	"agentmesh.dev/mesh/shared/registry"
	"agentmesh.dev/mesh/shared/store"
	"agentmesh.dev/mesh/shared/store/boltstore"
)

// Data-directory entries of the control plane.
const (
	storeFile = "control.db"
	outboxDir = "outbox"
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
}

// Groups are every HTTP function group, in the order they are mounted.
var Groups = []api.Group{health.Group, accounts.Group, credentials.Group, guestfn.Group, registrarfn.Group, console.Group}

// startControlPlane opens the store, builds the services and mounts every
// function group on the mux, the same handlers the cloud runs one per
// function.
func (m *Mesh) startControlPlane(dataDir string, cfg Config, base string) error {
	st, err := boltstore.Open(filepath.Join(dataDir, storeFile))
	if err != nil {
		return fmt.Errorf("devenv: control store: %w", err)
	}
	m.closers = append(m.closers, st.Close)
	mailer := cfg.Mail
	if mailer == nil {
		ob, err := mail.NewOutbox(filepath.Join(dataDir, outboxDir), m.log)
		if err != nil {
			return fmt.Errorf("devenv: mail outbox: %w", err)
		}
		mailer = ob
	}
	// WebAuthn needs a domain for its relying party, and browsers treat
	// localhost as a secure context over plain http: the console is served
	// as http://localhost:<port>.
	pk, err := passkey.New(passkey.Config{RPID: "localhost", RPDisplayName: "agentmesh (" + cfg.meshName() + ")",
		RPOrigins: []string{strings.Replace(base, "127.0.0.1", "localhost", 1)}})
	if err != nil {
		return fmt.Errorf("devenv: passkeys: %w", err)
	}
	meshInfo := credential.MeshInfo{Name: cfg.meshName(), Protocol: "0.3", TCP: []string{m.urls.MeshTCP}, WS: []string{m.urls.MeshWS}}
	c := &Control{Store: st}
	c.Accounts = account.New(account.Config{Store: st, Mail: mailer, Passkeys: pk, Log: m.log.With("service", "account"),
		ConsoleURL: m.urls.Console, ControlURL: m.urls.Control, Now: cfg.Now, Limits: cfg.AccountLimits})
	// The control plane's own way onto the bus, for the account views, for
	// recording guests and clearing ended ones, and for asking whether an
	// agent key is new.
	cpNC, err := m.ConnectService("control-plane")
	if err != nil {
		return fmt.Errorf("devenv: control plane bus connection: %w", err)
	}
	m.closers = append(m.closers, func() error { cpNC.Close(); return nil })
	cpBus := &bus.Caller{NC: cpNC, Key: m.servicesKey}
	c.Credentials = credential.New(credential.Config{Store: st, Trust: m.trust, Revoker: m, Mesh: meshInfo,
		ControlURL: m.urls.Control, NoExpiry: cfg.NoExpiry, Now: cfg.Now, Log: m.log.With("service", "credential"),
		History: mailbox.History{Bus: cpBus}, Unowned: cfg.Unowned, Classes: cfg.Classes})
	var guestClass *creds.ClassLimits
	if l, ok := cfg.Classes[creds.ClassGuest]; ok {
		guestClass = &l
	}
	cpJS, err := jetstream.New(cpNC)
	if err != nil {
		return fmt.Errorf("devenv: control plane jetstream: %w", err)
	}
	c.Guests = guest.New(guest.Config{Store: st, Trust: m.trust, Revoker: m, Evictor: &guest.BusEvictor{Bus: cpBus},
		Roster: &registry.GuestRoster{JS: cpJS}, Mesh: meshInfo, IdleTTL: cfg.GuestIdleTTL, Limits: cfg.GuestLimits, Class: guestClass, Now: cfg.Now, Log: m.log.With("service", "guest")})
	idle := cfg.GuestIdleTTL
	if idle <= 0 {
		idle = guest.DefaultIdleTTL
	}
	limit := cfg.RateLimit
	if limit <= 0 {
		limit = 600 // one person clicking through the console never meets this
	}
	c.Deps = &api.Deps{Log: m.log.With("component", "http"), Accounts: c.Accounts, Credentials: c.Credentials, Guests: c.Guests,
		RateLimit: httpx.NewLimiter(limit, time.Minute, cfg.Now), TrustedProxyHops: max(cfg.TrustedProxyHops, 0), BodyTimeout: cfg.BodyTimeout,
		Capabilities: map[string]any{
			"protocol": protocol.Version, "mesh": meshInfo.Name, "markup_pct": cfg.MarkupPct, "clearing_service": false,
			"credentials":     []string{"guest", "bootstrap", "node", "app", "job"},
			"node_credential": map[string]any{"minting": true, "no_expiry": cfg.NoExpiry, "max_agents": credential.MaxRoster},
			"guest":           map[string]any{"idle_ttl_seconds": int(idle / time.Second)},
			"passkeys":        true,
			"nats_endpoints":  []string{m.urls.MeshTCP, m.urls.MeshWS},
		}}
	c.Deps.Views = &accountview.Service{Store: st, Credentials: c.Credentials, Bus: cpBus, Now: cfg.Now}
	if c.Registrar, err = m.startRegistrar(dataDir, cfg, st, mailer); err != nil {
		return err
	}
	c.Deps.Registrar = c.Registrar
	m.control = c
	for _, g := range Groups {
		g.Mount(m.mux, c.Deps)
	}
	if err := m.applyStoredRevocations(context.Background(), st); err != nil {
		return err
	}
	if err := m.startAdmin(dataDir); err != nil {
		return err
	}
	m.startSweeper(time.Minute, "guest leases lapsed", c.Guests.Sweep)
	every := cfg.RegistrarSweepInterval
	if every <= 0 {
		every = RegistrarSweepInterval
	}
	m.startSweeper(every, "expired registrar documents deleted", c.Registrar.Sweep)
	m.startSweeper(every, "expired credential rate-limit counters deleted", c.Credentials.SweepLimits)
	m.startSweeper(every, "expired account rate-limit counters deleted", c.Accounts.Sweep)
	return nil
}

// RegistrarSweepInterval is how often meshd deletes the registrar's expired
// documents (codes, sessions, pairing codes, rate-limit counters).
const RegistrarSweepInterval = 10 * time.Minute

// startSweeper runs sweep every interval until shutdown: ending idle guest
// leases (every minute), deleting the registrar's expired documents
// (every ten minutes). done is what it logs when a sweep did something.
func (m *Mesh) startSweeper(every time.Duration, done string, sweep func(context.Context) (int, error)) {
	ctx, cancel := context.WithCancel(context.Background())
	m.closers = append(m.closers, func() error { cancel(); return nil })
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if n, err := sweep(ctx); err != nil {
					if ctx.Err() == nil {
						m.log.Warn("sweep failed", "sweep", done, "err", err)
					}
				} else if n > 0 {
					m.log.Info(done, "count", n)
				}
			}
		}
	}()
}

// Control returns the control plane.
func (m *Mesh) Control() *Control { return m.control }

// Revoke revokes credential keys at the broker at once (credential.Revoker).
func (m *Mesh) Revoke(ctx context.Context, keys []string, at time.Time) error {
	return m.UpdateMeshAccount(ctx, func(ac *jwt.AccountClaims) error {
		return creds.RevokeCredentials(ac, at, keys...)
	})
}
