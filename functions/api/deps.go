package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/accountview"
	"agentmesh.dev/mesh/shared/activity"
	"agentmesh.dev/mesh/shared/audit"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/closure"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/credential"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/engagement"
	"agentmesh.dev/mesh/shared/grant"
	"agentmesh.dev/mesh/shared/guest"
	"agentmesh.dev/mesh/shared/httpx"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/mailbox"
	"agentmesh.dev/mesh/shared/passkey"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/registrar"
	"agentmesh.dev/mesh/shared/registry"
	"agentmesh.dev/mesh/shared/store"
)

// Backends are what differs between the cloud and one machine: where the
// control plane keeps its documents, how it mails, where its keys came
// from and how it reaches the bus. NewDeps builds the same services from
// either (functions/cloud for the Cloud Functions, devenv for meshd).
type Backends struct {
	Log   *slog.Logger
	Store store.Store
	Mail  mail.Sender
	// Trust is the operator and account key chain; nil makes the minting
	// doors answer 501 (an instance without its keys still serves
	// accounts).
	Trust *creds.Trust
	// Revoker revokes credential keys at the broker; nil records
	// revocations in the store only.
	Revoker credential.Revoker
	// Bus is the control plane's signed way onto the bus (its services
	// key): the account views, the guest roster and eviction, the
	// mailbox history that tells a new agent key from a used one, and the
	// app records the activity worker answers apps from. nil
	// without a bus connection: the views answer 501 and guests get the
	// pinned permission set.
	Bus *bus.Caller
	// RegistrarKey signs cards; nil makes resolve answer 503.
	RegistrarKey keys.Signer
	// Now is the clock; nil is time.Now.
	Now func() time.Time
	// Mesh is what credential answers tell clients about the bus.
	Mesh credential.MeshInfo
	// ControlURL, ConsoleURL and RegistrarURL are the public bases.
	ControlURL, ConsoleURL, RegistrarURL string
	Settings                             Settings
	// Grants is what the cloud grants need; without a deployer the grant
	// routes answer 501.
	Grants Grants
	// Audit configures the audit records' routes (anchors, export).
	Audit Audit
}

// Audit configures the audit records (docs/audit.md "The control plane").
// The rows live on the bus (Backends.Bus), the anchor records in the
// store.
type Audit struct {
	// Authorities stamp the daily anchors: audit.MinAuthorities or more
	// (MESH_TIMESTAMP_AUTHORITIES in the cloud; meshd's two local
	// test-only ones), or none, and the anchor job answers 501.
	Authorities []audit.Authority
	// TestOnly says the authorities are local test-only ones: every
	// anchor answer says so.
	TestOnly bool
	// Client asks the authorities; nil is http.DefaultClient.
	Client *http.Client
	// ExportKey signs audit exports (the mesh-export-seed secret in the
	// cloud, keys/export.nk in meshd); nil: the export answers 501.
	ExportKey keys.Signer
	// Now is the anchor job's clock when it must differ from the control
	// plane's (tests anchor a date that has not ended); nil is
	// Backends.Now.
	Now func() time.Time
}

// Grants configures the cloud grants (spec §4.7, DESIGN §11).
type Grants struct {
	// Deployer is the deployer service account's address: the middle of
	// the impersonation chain, and what customers bind (MESH_DEPLOYER_SA,
	// set by Terraform; meshd --grant-deployer).
	Deployer string
	// Google reaches Google's APIs; nil is grant.ADC(), the real APIs as
	// the instance's application default credentials. Tests give the
	// in-process world (shared/grant/googlefake).
	Google *grant.Google
	// CallTimeout is each Google call's deadline (grant.DefaultCallTimeout
	// when 0).
	CallTimeout time.Duration
}

// Settings are the control plane's knobs: the same ones, with the same
// defaults, in the cloud (environment variables) and in meshd (flags).
type Settings struct {
	NoExpiry bool
	// MarkupPct is the platform markup on the resale path
	// (CREDITS_PLATFORM_MARKUP_PCT), the one the clearing charges.
	MarkupPct int
	// ClearingService says the clearing worker runs on this mesh's bus
	// (shared/clearing): set by devenv when it runs the workers and by the
	// cloud configuration, which deploys every row of the workers table.
	// /v1/capabilities reports it as it is.
	ClearingService  bool
	RateLimit        int // per client address per minute
	TrustedProxyHops int
	BodyTimeout      time.Duration
	GuestIdleTTL     time.Duration // 0: guest.DefaultIdleTTL
	GuestLimits      guest.Limits
	AccountLimits    account.Limits
	Unowned          credential.UnownedLimits
	// Classes are the fence classes' limits (creds.DefaultClassLimits when
	// nil).
	Classes map[string]creds.ClassLimits
}

// NewDeps builds the control plane's services from b: the one constructor
// for the Cloud Functions and meshd (DESIGN §2).
func NewDeps(b Backends) (*Deps, error) {
	if b.Store == nil || b.Mail == nil || b.Log == nil {
		return nil, errors.New("control plane: a store, a mailer and a logger are required")
	}
	console, err := url.Parse(b.ConsoleURL)
	if err != nil || console.Host == "" || (console.Scheme != "http" && console.Scheme != "https") {
		return nil, fmt.Errorf("control plane: the console URL %q is not an http(s) URL", b.ConsoleURL)
	}
	if b.RegistrarURL == "" {
		b.RegistrarURL = b.ControlURL
	}
	s := b.Settings
	pk, err := passkey.New(passkey.Config{RPID: console.Hostname(), RPDisplayName: "agentmesh (" + b.Mesh.Name + ")",
		RPOrigins: []string{console.Scheme + "://" + console.Host}})
	if err != nil {
		return nil, fmt.Errorf("control plane: passkeys: %w", err)
	}
	d := &Deps{Log: b.Log.With("component", "http"), TrustedProxyHops: max(s.TrustedProxyHops, 0), BodyTimeout: s.BodyTimeout, Bus: b.Bus}
	d.Accounts = account.New(account.Config{Store: b.Store, Mail: b.Mail, Passkeys: pk, Log: b.Log.With("service", "account"),
		ConsoleURL: b.ConsoleURL, ControlURL: b.ControlURL, Now: b.Now, Limits: s.AccountLimits})
	if b.Grants.Deployer != "" {
		d.Grants, err = grant.New(grant.Config{Store: b.Store, Google: b.Grants.Google, Deployer: b.Grants.Deployer, Accounts: d.Accounts,
			ControlURL: b.ControlURL, RegistrarURL: b.RegistrarURL, CallTimeout: b.Grants.CallTimeout, Now: b.Now,
			Log: b.Log.With("service", "grant")})
		if err != nil {
			return nil, fmt.Errorf("control plane: %w", err)
		}
	}
	var history credential.History
	var js jetstream.JetStream
	var apps credential.AppMirror
	if b.Bus != nil {
		history = mailbox.History{Bus: b.Bus}
		if js, err = jetstream.New(b.Bus.NC); err != nil {
			return nil, fmt.Errorf("control plane: jetstream: %w", err)
		}
		// The activity worker answers apps from these records, never
		// from the store (in the cloud it cannot read Firestore).
		apps = &activity.AppAgentsMirror{JS: js}
	}
	auditNow := b.Audit.Now
	if auditNow == nil {
		auditNow = b.Now
	}
	d.Audit, err = audit.NewService(audit.ServiceConfig{Mesh: b.Mesh.Name, JS: js, Anchors: audit.StoreAnchors{Store: b.Store},
		Authorities: b.Audit.Authorities, TestOnly: b.Audit.TestOnly, Client: b.Audit.Client, ExportKey: b.Audit.ExportKey,
		Now: auditNow, Log: b.Log.With("service", "audit")})
	if err != nil {
		return nil, fmt.Errorf("control plane: %w", err)
	}
	var actions credential.ActionLog
	if js != nil {
		actions = accountActions{d.Audit}
	}
	d.Credentials = credential.New(credential.Config{Store: b.Store, Trust: b.Trust, Revoker: b.Revoker, Mesh: b.Mesh,
		ControlURL: b.ControlURL, NoExpiry: s.NoExpiry, Now: b.Now, Log: b.Log.With("service", "credential"),
		History: history, Unowned: s.Unowned, Classes: s.Classes, Apps: apps, Actions: actions})
	// With a bus connection, guests are recorded on the registry's guest
	// roster (so they may register on the plain subject) and cleared when
	// their leases end; without one they get the pinned set.
	var evictor guest.Evictor
	var roster guest.Roster
	if b.Bus != nil {
		evictor, roster = &guest.BusEvictor{Bus: b.Bus}, &registry.GuestRoster{JS: js}
		d.Views = &accountview.Service{Store: b.Store, Credentials: d.Credentials, Bus: b.Bus, Now: b.Now}
	}
	var guestClass *creds.ClassLimits
	if l, ok := s.Classes[creds.ClassGuest]; ok {
		guestClass = &l
	}
	d.Guests = guest.New(guest.Config{Store: b.Store, Trust: b.Trust, Revoker: b.Revoker, Evictor: evictor, Roster: roster,
		Mesh: b.Mesh, IdleTTL: s.GuestIdleTTL, Limits: s.GuestLimits, Class: guestClass, Now: b.Now, Log: b.Log.With("service", "guest")})
	d.Registrar = registrar.New(registrar.Config{Store: b.Store, Mail: b.Mail, Signer: b.RegistrarKey, URL: b.RegistrarURL,
		Now: b.Now, Log: b.Log.With("service", "registrar")})
	// Engagements read the registry and mirror their terms onto the bus,
	// where the seller's node is answered at admission.
	ecfg := engagement.Config{Store: b.Store, Now: b.Now, Log: b.Log.With("service", "engagement")}
	if b.Bus != nil {
		ecfg.Directory, ecfg.Terms = engagement.BusDirectory{NC: b.Bus.NC}, &engagement.BusTerms{JS: js}
	}
	d.Engagements = engagement.New(ecfg)
	d.Closure, err = newClosure(b, d)
	if err != nil {
		return nil, err
	}
	limit := s.RateLimit
	if limit <= 0 {
		limit = DefaultRateLimit
	}
	d.RateLimit = httpx.NewLimiter(limit, time.Minute, b.Now)
	idle := s.GuestIdleTTL
	if idle <= 0 {
		idle = guest.DefaultIdleTTL
	}
	d.Capabilities = map[string]any{
		"protocol": protocol.Version, "mesh": b.Mesh.Name, "markup_pct": s.MarkupPct, "clearing_service": s.ClearingService,
		"credentials":     []string{"guest", "bootstrap", "node", "app", "job"},
		"node_credential": map[string]any{"minting": b.Trust != nil, "no_expiry": s.NoExpiry, "max_agents": credential.MaxRoster},
		"guest":           map[string]any{"idle_ttl_seconds": int(idle / time.Second), "minting": b.Trust != nil},
		"passkeys":        true,
		"cloud_grants":    map[string]any{"providers": []string{grant.ProviderGCP}, "configured": d.Grants != nil},
		"nats_endpoints":  append(append([]string{}, b.Mesh.TCP...), b.Mesh.WS...),
		"account_closure": d.Closure.Capabilities(),
		"audit":           auditCapabilities(d.Audit),
	}
	if s.ClearingService {
		d.Capabilities["clearing"] = clearingCapabilities(s.MarkupPct)
	}
	if b.Bus != nil {
		// The key every bus worker signs with: their answers and events,
		// and the rooms' dossiers (shared/rooms.VerifyDossier).
		d.Capabilities["services_key"] = b.Bus.Key.Public()
	}
	return d, nil
}

// clearingCapabilities is what /v1/capabilities says of the clearing
// (docs/commerce.md "Metering, rating, credits and the markup"): credits
// (XCR, micro-credits) are spent inside the mesh only, a SKU of provider
// internal priced in XCR is settled by it, and on the resale path the
// caller pays the rate plus markup_pct while the seller's owner receives
// the full rate.
func clearingCapabilities(markupPct int) map[string]any {
	return map[string]any{
		"currency":      commerce.Credits,
		"unit":          "micro-credits (1 credit = 1,000,000)",
		"provider":      commerce.ProviderInternal,
		"markup_pct":    markupPct,
		"resale_path":   "official catalog agents: the platform is the seller of record; the caller pays the rate plus markup_pct (floored to the micro-credit), the seller's owner receives the full rate",
		"own_sku":       "the buyer pays the declared price and the seller's owner receives all of it; the operator takes nothing",
		"charged":       "only a request admitted by the mesh (an admission ticket), on the terms, owner and time of its admission; the request's budget cost_ceiling in XCR clamps the charge",
		"payout":        false,
		"grants":        "operator only (meshd admin credits grant)",
		"balance_verbs": []string{protocol.CreditVerbSubject("balance"), protocol.CreditVerbSubject("history")},
	}
}

// auditCapabilities is what /v1/capabilities says of the audit records:
// the key that signs exports (which a verifier pins: audit-verify -key),
// and whether anchors are made and by what kind of authorities.
func auditCapabilities(s *audit.Service) map[string]any {
	out := map[string]any{"anchors": s.Anchoring(), "timestamp_authorities": len(s.Authorities()),
		"test_only_authorities": s.TestOnly(), "anchors_url": "/v1/anchors", "authorities_url": "/v1/anchors/authorities"}
	if key, ok := s.Exporting(); ok {
		out["export_key"] = key
	}
	return out
}

// accountActions keeps the credential service's actions on an account's
// agents as rows of their audit chains (role account).
type accountActions struct{ s *audit.Service }

func (l accountActions) AgentAction(ctx context.Context, a credential.AgentAction) error {
	at, err := protocol.ParseTime(a.At)
	if err != nil {
		return err
	}
	entries, err := audit.AccountEntries(a.Account, a.Action, a.ID, a.Agents, a, at)
	if err != nil {
		return err
	}
	return l.s.Record(ctx, entries...)
}

// DefaultRateLimit is the per-address limit per minute of every route when
// none is configured: one person clicking through the console never meets
// it, a script hammering one route does.
const DefaultRateLimit = 600

// newClosure builds account closure from the services d already holds.
// Without a bus connection the steps that need the bus (registry, catalog,
// activity) and the audit purge are skipped, and closure says so.
func newClosure(b Backends, d *Deps) (*closure.Service, error) {
	cfg := closure.Config{Store: b.Store, Accounts: d.Accounts, Credentials: d.Credentials, Registrar: d.Registrar, Mail: b.Mail,
		BrokerRevokes: b.Revoker != nil, ConsoleURL: b.ConsoleURL, Now: b.Now, Log: b.Log.With("service", "closure")}
	if d.Grants != nil {
		cfg.Deployer = d.Grants.GrantTo()
	}
	if b.Bus != nil {
		js, err := jetstream.New(b.Bus.NC)
		if err != nil {
			return nil, fmt.Errorf("control plane: jetstream: %w", err)
		}
		cfg.Bus, cfg.Chains = b.Bus, &closure.BusChains{JS: js}
	}
	return closure.New(cfg), nil
}
