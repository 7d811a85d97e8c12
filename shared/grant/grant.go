// Package grant is the cloud grants of spec §2.10, §3.2 and §4.7: an
// account lets the mesh deploy and operate its agent inside the account
// owner's own Google Cloud project, by letting the mesh's deployer service
// account impersonate a service account the customer created there. No key
// changes hands.
//
// The service records grants, checks them (check.go: one token generation
// through the two-hop chain runtime → deployer → customer account, then one
// read of the named project, DESIGN §11), re-checks unreachable ones on a
// schedule, deploys agents into the project of a verified grant
// (deploy.go), and writes one line of the actions log for every call made
// in a customer's project (actions.go). The roles the customer grants are
// published from one table (roles.go).
//
// States move only as spec §3.2 says: a check sets verified, revoked or
// unreachable; a deploy refused inside the customer's project lowers a
// verified grant to revoked and never raises one; DELETE forgets the record
// and makes no call at all.
package grant

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	credentials "cloud.google.com/go/iam/credentials/apiv1"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/store"
)

// ProviderGCP is the one supported provider.
const ProviderGCP = "gcp"

// State is a grant's state (spec §3.2).
type State string

// The states. Only the service writes them.
const (
	Pending     State = "pending"     // recorded, not yet proven
	Verified    State = "verified"    // the chain works and the project read names the project
	Revoked     State = "revoked"     // the customer took the binding back, or deleted the account (no retries)
	Unreachable State = "unreachable" // anything else; re-checked on a schedule
)

// Collections of the control-plane store this package owns.
const (
	CollGrants  = "cloud_grants"  // id: <account id>.<provider>
	CollActions = "cloud_actions" // id: UUIDv7
)

// Defaults.
const (
	// DefaultCallTimeout is the deadline of each call to Google. Without
	// one, the clients retry Unavailable for up to 60 s.
	DefaultCallTimeout = 10 * time.Second
	// DefaultDeployBudget is a deploy's overall deadline: five calls of
	// up to CallTimeout each would otherwise outlast the function's 60 s
	// timeout (cmd/meshgen), with room left for revoking the key.
	DefaultDeployBudget = 45 * time.Second
	// RecheckEvery is how often the scheduled row re-checks unreachable
	// grants; a grant that stays unreachable waits longer each time, up to
	// MaxRecheckWait.
	RecheckEvery   = 5 * time.Minute
	MaxRecheckWait = 6 * time.Hour
	// recheckBatch and recheckBudget bound one run (a scheduled function
	// has a timeout): no check starts after either is reached; the rest
	// wait for the next run.
	recheckBatch  = 50
	recheckBudget = 40 * time.Second
	// stalePending is how long a pending record may wait for the check of
	// the call that made it (which may have died with its instance) before
	// the scheduled row checks it.
	stalePending = 5 * time.Minute
)

// Grant is a grant as stored.
type Grant struct {
	// ID names this record: a new one on every POST, so that a check's
	// result is written only to the record it checked.
	ID             string `json:"id"`
	AccountID      string `json:"account_id"`
	Provider       string `json:"provider"`
	ProjectID      string `json:"project_id"`
	ServiceAccount string `json:"service_account"`
	GrantedAt      int64  `json:"granted_at"`            // Unix ms
	VerifiedAt     int64  `json:"verified_at,omitempty"` // the last check that verified it
	CheckedAt      int64  `json:"checked_at,omitempty"`  // the last check of any outcome
	State          State  `json:"state"`
	LastError      string `json:"last_error,omitempty"`
	// Failures counts the checks in a row that ended unreachable;
	// NextCheckAt is when the scheduled row takes the grant up again.
	Failures    int   `json:"failures,omitempty"`
	NextCheckAt int64 `json:"next_check_at,omitempty"`
}

func docID(accountID, provider string) string { return accountID + "." + provider }

// View is a grant as the routes answer it: the fields of spec §2.10, with
// null for a timestamp or error that has none.
type View struct {
	AccountID      string  `json:"account_id"`
	Provider       string  `json:"provider"`
	ProjectID      string  `json:"project_id"`
	ServiceAccount string  `json:"service_account"`
	GrantedAt      string  `json:"granted_at"`
	VerifiedAt     *string `json:"verified_at"`
	CheckedAt      *string `json:"checked_at"`
	State          State   `json:"state"`
	LastError      *string `json:"last_error"`
	DeploysHere    bool    `json:"deploys_here"`
}

func (g Grant) view(deploysHere bool) View {
	ts := func(ms int64) *string {
		if ms == 0 {
			return nil
		}
		s := protocol.FormatTime(time.UnixMilli(ms))
		return &s
	}
	v := View{AccountID: g.AccountID, Provider: g.Provider, ProjectID: g.ProjectID, ServiceAccount: g.ServiceAccount,
		GrantedAt: protocol.FormatTime(time.UnixMilli(g.GrantedAt)), VerifiedAt: ts(g.VerifiedAt), CheckedAt: ts(g.CheckedAt),
		State: g.State, DeploysHere: deploysHere}
	if g.LastError != "" {
		v.LastError = &g.LastError
	}
	return v
}

// Accounts is what a deploy needs from the account service: the agent key
// is minted there, under its rules (a session with a fresh passkey), as a
// placed key: the owner is mailed a notice with its id, never the key,
// which exists only in the customer's secret.
type Accounts interface {
	Fresh(p *account.Principal) bool
	MintPlacedAgentKey(ctx context.Context, p *account.Principal, name, placedIn string) (account.AgentKeyGrant, error)
	RevokeAgentKey(ctx context.Context, p *account.Principal, id string) error
}

// Config is what the service needs.
type Config struct {
	Store store.Store
	// Google reaches Google's APIs; nil is ADC(): the real APIs, as the
	// instance's application default credentials.
	Google *Google
	// Deployer is the deployer service account's address: the middle of
	// the chain, and what customers bind (the grant_to of every answer).
	Deployer string
	// Accounts mints the agent keys of deploys; nil refuses deploys (501).
	Accounts Accounts
	// ControlURL is the control plane's public base: the permissions URL
	// is under it, and deployed adapters reach it.
	ControlURL string
	// RegistrarURL is the registrar's public base, given to deployed
	// adapters (ControlURL when empty).
	RegistrarURL string
	// CallTimeout is each Google call's deadline (DefaultCallTimeout).
	CallTimeout time.Duration
	// DeployBudget bounds a whole deploy, every call in it included
	// (DefaultDeployBudget); the revocation of a failed deploy's key has
	// its own deadline after it.
	DeployBudget time.Duration
	Now          func() time.Time
	Log          *slog.Logger
}

// Service is the grant service.
type Service struct {
	cfg     Config
	st      store.Store
	google  *Google
	timeout time.Duration
	now     func() time.Time
	log     *slog.Logger

	mu   sync.Mutex
	self *credentials.IamCredentialsClient // the runtime's own IAM Credentials client, made on first use
}

// New builds the service; the deployer address and the control URL must be
// well formed.
func New(cfg Config) (*Service, error) {
	if cfg.Store == nil {
		return nil, errors.New("grant: a store is required")
	}
	if err := checkServiceAccountShape(cfg.Deployer); err != nil {
		return nil, fmt.Errorf("grant: the deployer %q is not a service account address: %w", cfg.Deployer, err)
	}
	if u, err := url.Parse(cfg.ControlURL); err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("grant: the control URL %q is not an http(s) URL", cfg.ControlURL)
	}
	if cfg.RegistrarURL == "" {
		cfg.RegistrarURL = cfg.ControlURL
	}
	s := &Service{cfg: cfg, st: cfg.Store, google: cfg.Google, timeout: cfg.CallTimeout, now: cfg.Now, log: cfg.Log}
	if s.google == nil {
		s.google = ADC()
	}
	if s.timeout <= 0 {
		s.timeout = DefaultCallTimeout
	}
	if s.cfg.DeployBudget <= 0 {
		s.cfg.DeployBudget = DefaultDeployBudget
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	return s, nil
}

// Close releases the service's own Google client.
func (s *Service) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.self == nil {
		return nil
	}
	err := s.self.Close()
	s.self = nil
	return err
}

// GrantTo is the deployer's address: what a customer lets impersonate
// their account (the grant_to of every answer).
func (s *Service) GrantTo() string { return s.cfg.Deployer }

// PermissionsURL is where the published role list is served.
func (s *Service) PermissionsURL() string {
	return strings.TrimRight(s.cfg.ControlURL, "/") + RolesPath
}

const storeDown = "the grant store is unavailable; retry shortly"

func txErr(err error) error { return errs.OrUnavailable(err, storeDown) }

// CheckProvider refuses, by name, a provider other than the supported one.
func CheckProvider(p string) error {
	if p != ProviderGCP {
		return errs.Newf(errs.InvalidRequest, "provider %q is not supported: the only provider is %q", clip(p, 40), ProviderGCP)
	}
	return nil
}

// Request is the body of POST grants: exactly these three members.
type Request struct {
	Provider       string `json:"provider"`
	ProjectID      string `json:"project_id"`
	ServiceAccount string `json:"service_account"`
}

// Result is what recording or checking a grant answers.
type Result struct {
	Grant View
	// Created is false when the POST replaced an earlier record.
	Created bool
}

// Create records a grant for the account (replacing its earlier grant with
// the same provider, if any) and checks it in the same call (spec §3.2).
// The request is refused at the door, before anything is recorded or
// called, when it names another provider or an account that cannot be the
// customer's own (CheckRequest).
func (s *Service) Create(ctx context.Context, accountID string, req Request) (Result, error) {
	req, err := CheckRequest(req)
	if err != nil {
		return Result{}, err
	}
	now := s.now()
	g := Grant{ID: protocol.NewID(), AccountID: accountID, Provider: req.Provider, ProjectID: req.ProjectID,
		ServiceAccount: req.ServiceAccount, GrantedAt: now.UnixMilli(), State: Pending}
	created := true
	err = s.st.RunTx(ctx, func(tx store.Tx) error {
		var old Grant
		switch err := tx.Get(CollGrants, docID(accountID, req.Provider), &old); {
		case err == nil:
			created = false
		case errors.Is(err, store.ErrNotFound):
			created = true
		default:
			return err
		}
		return tx.Set(CollGrants, docID(accountID, req.Provider), g)
	})
	if err != nil {
		return Result{}, txErr(err)
	}
	g, err = s.checkAndSettle(ctx, g, "create", nil)
	if err != nil {
		return Result{}, err
	}
	v, err := s.viewOf(ctx, g)
	return Result{Grant: v, Created: created}, err
}

// List is the account's grants, each with deploys_here.
func (s *Service) List(ctx context.Context, accountID string) ([]View, error) {
	gs, err := s.grantsOf(ctx, accountID)
	if err != nil {
		return nil, err
	}
	here := deploysHere(gs)
	out := make([]View, 0, len(gs))
	for _, g := range gs {
		out = append(out, g.view(g.ID == here))
	}
	return out, nil
}

// Get is one grant, whole.
func (s *Service) Get(ctx context.Context, accountID, provider string) (View, error) {
	g, err := s.grant(ctx, accountID, provider)
	if err != nil {
		return View{}, err
	}
	return s.viewOf(ctx, g)
}

// Verify checks the grant again now. It may raise a revoked grant to
// verified: IAM changes take 2–7 minutes to propagate, so a grant posted
// right after the binding was made can read as revoked (DESIGN §11).
func (s *Service) Verify(ctx context.Context, accountID, provider string) (View, error) {
	g, err := s.grant(ctx, accountID, provider)
	if err != nil {
		return View{}, err
	}
	g, err = s.checkAndSettle(ctx, g, "verify", nil)
	if err != nil {
		return View{}, err
	}
	return s.viewOf(ctx, g)
}

// Delete forgets the grant. It makes no call at all: the binding in the
// customer's project and whatever was deployed there stay as they are
// (the customer removes them; spec §3.2). The actions log is kept.
func (s *Service) Delete(ctx context.Context, accountID, provider string) (Grant, error) {
	if err := CheckProvider(provider); err != nil {
		return Grant{}, err
	}
	var g Grant
	err := s.st.RunTx(ctx, func(tx store.Tx) error {
		if err := tx.Get(CollGrants, docID(accountID, provider), &g); err != nil {
			return err
		}
		return tx.Delete(CollGrants, docID(accountID, provider))
	})
	if errors.Is(err, store.ErrNotFound) {
		return Grant{}, noGrant(provider)
	}
	return g, txErr(err)
}

func noGrant(provider string) error {
	return errs.Newf(errs.NotFound, "this account has no %s grant; add one with POST .../cloud/grants", provider)
}

// grant reads one grant.
func (s *Service) grant(ctx context.Context, accountID, provider string) (Grant, error) {
	if err := CheckProvider(provider); err != nil {
		return Grant{}, err
	}
	var g Grant
	err := store.Get(ctx, s.st, CollGrants, docID(accountID, provider), &g)
	if errors.Is(err, store.ErrNotFound) {
		return Grant{}, noGrant(provider)
	}
	return g, txErr(err)
}

func (s *Service) grantsOf(ctx context.Context, accountID string) ([]Grant, error) {
	var gs []Grant
	if err := store.List(ctx, s.st, CollGrants, store.Where("account_id", accountID), &gs); err != nil {
		return nil, txErr(err)
	}
	slices.SortFunc(gs, func(a, b Grant) int { return strings.Compare(a.Provider, b.Provider) })
	return gs, nil
}

// viewOf renders g with deploys_here, which depends on the account's other
// grants.
func (s *Service) viewOf(ctx context.Context, g Grant) (View, error) {
	gs, err := s.grantsOf(ctx, g.AccountID)
	if err != nil {
		return View{}, err
	}
	return g.view(deploysHere(gs) == g.ID), nil
}

// deploysHere names the grant an account's deploys go to: its oldest. With
// one provider an account has at most one grant, and its deploys go there
// whatever its state: a grant that is not verified withholds the work, and
// nothing ever falls back to the mesh's own machines.
func deploysHere(gs []Grant) string {
	best := ""
	var at int64
	for _, g := range gs {
		if best == "" || g.GrantedAt < at {
			best, at = g.ID, g.GrantedAt
		}
	}
	return best
}

// clip shortens text from a request or from Google for a message.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
