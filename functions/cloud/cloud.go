// Package cloud builds the dependencies of the HTTP routes when they run as
// Cloud Functions: Firestore for the store, SMTP for mail, the keys from
// Secret Manager, and revocation over the managed NATS cluster. It is the
// one place the function binary reads its environment, once, in the lazy
// init of the first request (DESIGN §2, §3).
package cloud

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/functions/api"
	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/audit"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/cloudlog"
	"agentmesh.dev/mesh/shared/cloudsecrets"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/credential"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/fence"
	"agentmesh.dev/mesh/shared/guest"
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/ratelimit"
	"agentmesh.dev/mesh/shared/store/firestorestore"
)

// Config is the function binary's configuration.
type Config struct {
	ProjectID  string // GOOGLE_CLOUD_PROJECT
	MeshName   string // MESH_NAME
	ControlURL string // MESH_CONTROL_URL, e.g. https://api.example.org
	ConsoleURL string // MESH_CONSOLE_URL, e.g. https://console.example.org/
	// RegistrarURL is the registrar's public base, named in every card
	// (MESH_REGISTRAR_URL; the control URL when unset).
	RegistrarURL string
	NATSURLs     []string // MESH_NATS_URLS, comma-separated tls:// or nats:// URLs: what clients are told
	// InternalNATSURLs are what the functions themselves dial
	// (MESH_NATS_INTERNAL_URLS; MESH_NATS_URLS when unset): the cluster's
	// private addresses, reached through the VPC, where clients get the
	// public load balancer's.
	InternalNATSURLs []string
	WSURLs           []string // MESH_WS_URLS, comma-separated wss:// URLs
	// SecretsProject is the project whose Secret Manager holds the keys
	// (MESH_SECRETS_PROJECT; GOOGLE_CLOUD_PROJECT when unset): the trust
	// chain, the registrar's and the services' seeds, written once by
	// `meshd cloud init` (docs/secrets.md).
	SecretsProject string
	// NoKeys runs the instance without keys (MESH_KEYS=none): it mints
	// nothing (the doors answer 501), resolve answers 503, and it has no
	// bus connection. For a deployment that serves accounts only, and for
	// tests.
	NoKeys bool
	// SecretManagerHost, when set (MESH_SECRETMANAGER_EMULATOR_HOST, as
	// FIRESTORE_EMULATOR_HOST is for Firestore), reaches a Secret Manager
	// emulator at that address without TLS, sending the bearer token
	// cloudsecrets.EmulatorToken: for tests only.
	SecretManagerHost string
	SMTP              mail.SMTPConfig // SMTP_ADDR, SMTP_FROM, SMTP_USERNAME, SMTP_PASSWORD, SMTP_TLS
	NoExpiry          bool            // MESH_NODE_CREDENTIAL_NO_EXPIRY=true
	MarkupPct         int             // CREDITS_PLATFORM_MARKUP_PCT (10)
	TrustedProxyHops  int             // MESH_TRUSTED_PROXY_HOPS (1: Google's front end)
	RateLimit         int             // MESH_RATE_LIMIT_PER_MINUTE (30, upstream §16.2)
	// GuestLimits and AccountLimits bound guest leases, sign-up, sign-in
	// and connect per client address, per network and overall; each field
	// is one MESH_LIMIT_* variable (guest.Limits.Knobs,
	// account.Limits.Knobs), the same variables meshd reads.
	GuestLimits   guest.Limits
	AccountLimits account.Limits
	// Unowned bounds node credentials for rosters no account owns, and
	// Classes are the limits minted into guest and unowned credentials
	// (MESH_LIMIT_UNOWNED_*, MESH_LIMIT_GUEST_*: the same variables meshd
	// and the fence read).
	Unowned credential.UnownedLimits
	Classes fence.Classes
	// Deployer is the cloud grants' deployer service account
	// (MESH_DEPLOYER_SA, which Terraform sets to the one it creates); the
	// functions reach Google as their runtime account (application default
	// credentials).
	Deployer string
	// TimestampAuthorities stamp the daily audit anchors
	// (MESH_TIMESTAMP_AUTHORITIES: a JSON list of {name, url, root_pem,
	// intermediates_pem?}, two or more; Terraform's
	// var.timestamp_authorities names public ones). Unset, the anchor
	// job answers 501.
	TimestampAuthorities []audit.Authority
}

// FromEnv reads the configuration through getenv and checks it.
func FromEnv(getenv func(string) string) (Config, error) {
	list := func(k string) []string {
		var out []string
		for _, s := range strings.Split(getenv(k), ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
		return out
	}
	num := func(k string, def int) (int, error) {
		v := getenv(k)
		if v == "" {
			return def, nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("%s must be a non-negative whole number, not %q", k, v)
		}
		return n, nil
	}
	c := Config{
		ProjectID: getenv("GOOGLE_CLOUD_PROJECT"), MeshName: getenv("MESH_NAME"),
		ControlURL: getenv("MESH_CONTROL_URL"), ConsoleURL: getenv("MESH_CONSOLE_URL"),
		NATSURLs: list("MESH_NATS_URLS"), InternalNATSURLs: list("MESH_NATS_INTERNAL_URLS"), WSURLs: list("MESH_WS_URLS"),
		SecretsProject: getenv("MESH_SECRETS_PROJECT"), SecretManagerHost: getenv("MESH_SECRETMANAGER_EMULATOR_HOST"),
		RegistrarURL: getenv("MESH_REGISTRAR_URL"),
		SMTP: mail.SMTPConfig{Addr: getenv("SMTP_ADDR"), From: getenv("SMTP_FROM"), Username: getenv("SMTP_USERNAME"),
			Password: getenv("SMTP_PASSWORD"), TLS: mail.TLSPolicy(getenv("SMTP_TLS"))},
		NoExpiry: getenv("MESH_NODE_CREDENTIAL_NO_EXPIRY") == "true",
		Deployer: strings.TrimSpace(getenv("MESH_DEPLOYER_SA")),
	}
	switch k := getenv("MESH_KEYS"); k {
	case "", "secret-manager":
	case "none":
		c.NoKeys = true
	default:
		return c, fmt.Errorf("MESH_KEYS must be secret-manager (the default) or none, not %q", k)
	}
	var err error
	if c.MarkupPct, err = num("CREDITS_PLATFORM_MARKUP_PCT", 10); err != nil {
		return c, err
	}
	if err := commerce.CheckMarkup(c.MarkupPct); err != nil {
		return c, err // the clearing and admission refuse it too
	}
	if c.TrustedProxyHops, err = num("MESH_TRUSTED_PROXY_HOPS", 1); err != nil {
		return c, err
	}
	if c.RateLimit, err = num("MESH_RATE_LIMIT_PER_MINUTE", 30); err != nil {
		return c, err
	}
	c.GuestLimits, c.AccountLimits = guest.DefaultLimits(), account.DefaultLimits()
	c.Unowned, c.Classes = credential.DefaultUnownedLimits(), fence.DefaultClasses()
	if err := ratelimit.FromEnv(getenv, slices.Concat(c.GuestLimits.Knobs(), c.AccountLimits.Knobs(), c.Unowned.Knobs(), c.Classes.Knobs())...); err != nil {
		return c, err
	}
	if err := c.GuestLimits.Check(); err != nil {
		return c, err
	}
	if v := strings.TrimSpace(getenv("MESH_TIMESTAMP_AUTHORITIES")); v != "" {
		if c.TimestampAuthorities, err = audit.ParseAuthorities([]byte(v)); err != nil {
			return c, fmt.Errorf("MESH_TIMESTAMP_AUTHORITIES: %w", err)
		}
		if len(c.TimestampAuthorities) < audit.MinAuthorities {
			return c, fmt.Errorf("MESH_TIMESTAMP_AUTHORITIES names %d timestamp authorities; the anchors need at least %d", len(c.TimestampAuthorities), audit.MinAuthorities)
		}
	}
	var missing []string
	for k, v := range map[string]string{"GOOGLE_CLOUD_PROJECT": c.ProjectID, "MESH_CONTROL_URL": c.ControlURL,
		"MESH_CONSOLE_URL": c.ConsoleURL, "SMTP_ADDR": c.SMTP.Addr, "SMTP_FROM": c.SMTP.From,
		"MESH_DEPLOYER_SA": c.Deployer} {
		if v == "" {
			missing = append(missing, k)
		}
	}
	if len(c.NATSURLs) == 0 {
		missing = append(missing, "MESH_NATS_URLS")
	}
	if len(missing) > 0 {
		return c, fmt.Errorf("missing configuration: %s", strings.Join(missing, ", "))
	}
	if c.MeshName == "" {
		c.MeshName = c.ProjectID
	}
	if c.RegistrarURL == "" {
		c.RegistrarURL = c.ControlURL
	}
	if c.SecretsProject == "" {
		c.SecretsProject = c.ProjectID
	}
	if len(c.InternalNATSURLs) == 0 {
		c.InternalNATSURLs = c.NATSURLs
	}
	return c, nil
}

// Build makes the route dependencies from c: the cloud's backends
// (Firestore, SMTP, the keys from Secret Manager, revocation and the
// services' calls over the managed NATS cluster) given to the one
// constructor meshd uses too.
func Build(ctx context.Context, c Config, log *slog.Logger) (d *api.Deps, err error) {
	// What a failed build opened is closed again: the next request builds
	// anew, and a leaked connection would reconnect forever.
	var opened []func()
	defer func() {
		if err != nil {
			for i := len(opened) - 1; i >= 0; i-- {
				opened[i]()
			}
		}
	}()
	st, err := firestorestore.New(ctx, c.ProjectID)
	if err != nil {
		return nil, fmt.Errorf("firestore: %w", err)
	}
	opened = append(opened, func() { _ = st.Close() })
	smtp, err := mail.NewSMTP(c.SMTP)
	if err != nil {
		return nil, fmt.Errorf("smtp: %w", err)
	}
	b := api.Backends{Log: log, Store: st, Mail: smtp,
		Mesh:       credential.MeshInfo{Name: c.MeshName, Protocol: "0.3", TCP: c.NATSURLs, WS: c.WSURLs},
		ControlURL: c.ControlURL, ConsoleURL: c.ConsoleURL, RegistrarURL: c.RegistrarURL,
		// The cloud deploys every row of the workers table, the clearing's
		// included (terraform/workers.tf.json).
		Settings: api.Settings{NoExpiry: c.NoExpiry, MarkupPct: c.MarkupPct, ClearingService: true, RateLimit: c.RateLimit, TrustedProxyHops: c.TrustedProxyHops,
			GuestLimits: c.GuestLimits, AccountLimits: c.AccountLimits, Unowned: c.Unowned, Classes: c.Classes.Map()},
		Grants: api.Grants{Deployer: c.Deployer}, Audit: api.Audit{Authorities: c.TimestampAuthorities}}
	if c.NoKeys {
		log.Warn("running without keys (MESH_KEYS=none): nothing is minted, resolve answers 503, and the account views have no bus")
		return api.NewDeps(b)
	}
	opts, err := cloudsecrets.EmulatorOptions(c.SecretManagerHost)
	if err != nil {
		return nil, err
	}
	ks, err := cloudsecrets.Open(ctx, c.SecretsProject, opts...)
	if err != nil {
		return nil, fmt.Errorf("keys: %w", err)
	}
	b.Trust, b.RegistrarKey = ks.Trust, ks.Registrar
	if ks.Export != nil {
		b.Audit.ExportKey = ks.Export
	} else {
		log.Warn("the audit export key (secret mesh-export-seed) has no version yet: exports answer 501 until `meshd cloud init` adds it")
	}
	url := strings.Join(c.InternalNATSURLs, ",")
	sysCreds, err := b.Trust.MintSystemUser("control-plane")
	if err != nil {
		return nil, err
	}
	sys, err := nats.Connect(url, sysCreds.NATSOption(), nats.Name("control-plane"), nats.MaxReconnects(-1), nats.ReconnectWait(time.Second))
	if err != nil {
		return nil, fmt.Errorf("nats: %w", err)
	}
	opened = append(opened, sys.Close)
	b.Revoker = &creds.Revoker{Trust: b.Trust, Sys: sys}
	svc, err := b.Trust.MintServiceUser("control-plane-views")
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(url, svc.NATSOption(), creds.ServiceInbox(), nats.Name("control-plane-views"),
		nats.MaxReconnects(-1), nats.ReconnectWait(time.Second))
	if err != nil {
		return nil, fmt.Errorf("nats: %w", err)
	}
	opened = append(opened, nc.Close)
	b.Bus = &bus.Caller{NC: nc, Key: ks.Services}
	return api.NewDeps(b)
}

// Deps builds the dependencies of a Cloud Function instance from its
// environment; deploy.go's api.Lazy calls it on the first request and
// again after a failure.
func Deps() (*api.Deps, error) {
	c, err := FromEnv(os.Getenv)
	// Cloud Logging reads JSON lines with its own field names, and groups
	// a request's lines under the trace deploy.go put in its context.
	log := cloudlog.New(os.Stderr, slog.LevelInfo, c.ProjectID)
	if err != nil {
		log.Error("function configuration", "err", err)
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, err := Build(ctx, c, log)
	if err != nil {
		log.Error("function dependencies", "err", err)
		return nil, err
	}
	return d, nil
}
