package audit

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// Service is the control plane's side of the audit records (docs/audit.md
// "The control plane"): the daily anchor job, the anchors' public
// listing, the signed export of an account's chains, and the rows of the
// account's own actions on its agents. The activity worker creates the
// audit stream and appends the rows of answered requests; the service
// binds the stream as it is, on first use (the control plane does not know
// its replicas), and keeps the anchor records in its own AnchorStore.
type Service struct {
	cfg      ServiceConfig
	anchorer *Anchorer // nil without MinAuthorities authorities
	exporter *Exporter // nil without an export key

	mu     sync.Mutex
	chains *Chains
}

// ServiceConfig is what NewService needs.
type ServiceConfig struct {
	// Mesh is the mesh's name, written in every anchor document and
	// export manifest.
	Mesh string
	// JS reaches the audit stream; nil without a bus connection (every
	// method but the anchors' reads answers ErrUnavailable).
	JS jetstream.JetStream
	// Anchors keeps the anchor records (StoreAnchors in the control
	// plane).
	Anchors AnchorStore
	// Authorities stamp the anchors: MinAuthorities or more, or none
	// (the anchor job is then not configured).
	Authorities []Authority
	// TestOnly says the authorities are local test-only ones (meshd's
	// shared/audit/tsa): the listing says so on every answer.
	TestOnly bool
	// Client asks the authorities (http.DefaultClient when nil).
	Client *http.Client
	// ExportKey signs the exports' manifests; nil: exports are not
	// configured.
	ExportKey keys.Signer
	// Now is the anchor job's and the exports' clock (time.Now when nil).
	Now func() time.Time
	Log *slog.Logger
}

// ErrUnavailable wraps every failure to reach the audit stream.
var ErrUnavailable = errors.New("audit: the audit records cannot be reached")

// ErrNotConfigured is returned by what this instance is not configured
// for (anchors without authorities, exports without an export key).
var ErrNotConfigured = errors.New("audit: not configured on this instance")

// NewService checks the configuration: no authorities, or at least
// MinAuthorities of them.
func NewService(cfg ServiceConfig) (*Service, error) {
	if cfg.Anchors == nil {
		return nil, errors.New("audit: the service needs an anchor store")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Service{cfg: cfg}
	if len(cfg.Authorities) > 0 {
		a, err := NewAnchorer(AnchorerConfig{Mesh: cfg.Mesh, Ledger: ledger{s}, Store: cfg.Anchors, Authorities: cfg.Authorities,
			Client: cfg.Client, Now: cfg.Now, Log: cfg.Log})
		if err != nil {
			return nil, err
		}
		s.anchorer = a
	}
	if cfg.ExportKey != nil {
		s.exporter = &Exporter{Mesh: cfg.Mesh, Chains: ledger{s}, Anchors: cfg.Anchors, Signer: cfg.ExportKey, Now: cfg.Now}
	}
	return s, nil
}

// Chains binds the audit stream on first use (and again after a failure).
func (s *Service) Chains(ctx context.Context) (*Chains, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.chains != nil {
		return s.chains, nil
	}
	if s.cfg.JS == nil {
		return nil, fmt.Errorf("%w: this instance has no bus connection", ErrUnavailable)
	}
	c, err := BindChains(ctx, s.cfg.JS)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	s.chains = c
	return c, nil
}

// ledger is the service's chains, bound on first use, as the anchorer's
// Ledger and the exporter's ChainReader. Before any writer has created
// the stream no chain holds a row: that reads as no heads, rows or proofs.
type ledger struct{ s *Service }

// chains binds the stream; nil, nil when it does not exist yet.
func (l ledger) chains(ctx context.Context) (*Chains, error) {
	c, err := l.s.Chains(ctx)
	if errors.Is(err, ErrNoChains) {
		return nil, nil
	}
	return c, err
}

func (l ledger) HeadsAt(ctx context.Context, t time.Time) ([]Head, error) {
	c, err := l.chains(ctx)
	if c == nil {
		return nil, err
	}
	return c.HeadsAt(ctx, t)
}

func (l ledger) RecordProofs(ctx context.Context, proofs []Proof) error {
	if len(proofs) == 0 {
		return nil
	}
	c, err := l.s.Chains(ctx)
	if err != nil {
		return err
	}
	return c.RecordProofs(ctx, proofs)
}

func (l ledger) Rows(ctx context.Context, agent string) ([]Row, error) {
	c, err := l.chains(ctx)
	if c == nil {
		return nil, err
	}
	return c.Rows(ctx, agent)
}

func (l ledger) Proofs(ctx context.Context, agent string) ([]Proof, error) {
	c, err := l.chains(ctx)
	if c == nil {
		return nil, err
	}
	return c.Proofs(ctx, agent)
}

// Anchoring reports whether the anchor job is configured.
func (s *Service) Anchoring() bool { return s.anchorer != nil }

// Exporting reports whether exports are configured, and with which key.
func (s *Service) Exporting() (key string, ok bool) {
	if s.exporter == nil {
		return "", false
	}
	return s.cfg.ExportKey.Public(), true
}

// RunAnchors is the scheduled job (Anchorer.Run): it reports how many
// anchors it made, finished or stamped again.
func (s *Service) RunAnchors(ctx context.Context) (int, error) {
	if s.anchorer == nil {
		return 0, fmt.Errorf("%w: no timestamp authorities", ErrNotConfigured)
	}
	done, err := s.anchorer.Run(ctx)
	return len(done), err
}

// Anchors lists up to limit anchor records, newest date first.
func (s *Service) Anchors(ctx context.Context, limit int) ([]*Anchor, error) {
	return s.cfg.Anchors.List(ctx, limit)
}

// Anchor is the record of date (ErrNoAnchor when there is none).
func (s *Service) Anchor(ctx context.Context, date string) (*Anchor, error) {
	return s.cfg.Anchors.Get(ctx, date)
}

// AuthorityInfo is a configured authority as the mesh publishes it.
type AuthorityInfo struct {
	Name string `json:"name"`
	// ID is the hex SHA-256 of the root (as in export bundles).
	ID  string `json:"id"`
	URL string `json:"url"`
	// RootPEM and IntermediatesPEM are the certificates a verifier pins.
	RootPEM          string `json:"root_pem"`
	IntermediatesPEM string `json:"intermediates_pem,omitempty"`
	TestOnly         bool   `json:"test_only"`
}

// Authorities are the configured authorities.
func (s *Service) Authorities() []AuthorityInfo {
	out := make([]AuthorityInfo, 0, len(s.cfg.Authorities))
	for _, a := range s.cfg.Authorities {
		info := AuthorityInfo{Name: a.Name, ID: a.ID(), URL: a.URL, RootPEM: string(pemCert(a.Root.Raw)), TestOnly: s.cfg.TestOnly}
		for _, c := range a.Intermediates {
			info.IntermediatesPEM += string(pemCert(c.Raw))
		}
		out = append(out, info)
	}
	return out
}

// TestOnly reports whether the authorities are local test-only ones.
func (s *Service) TestOnly() bool { return s.cfg.TestOnly }

// Export makes the signed bundle of every row of the agents' chains
// (Exporter.Export).
func (s *Service) Export(ctx context.Context, account string, agents []string) (*Bundle, error) {
	if s.exporter == nil {
		return nil, fmt.Errorf("%w: no export key", ErrNotConfigured)
	}
	return s.exporter.Export(ctx, account, agents)
}

// Record appends the rows of an action of an account on its agents (role
// RoleAccount), each entry keyed so that recording it again changes
// nothing. It is best effort: the action is done whether or not its rows
// are kept, so a failure is logged and returned for the caller to log.
func (s *Service) Record(ctx context.Context, entries ...Entry) error {
	c, err := s.Chains(ctx)
	if err != nil {
		return err
	}
	// The entries are of different agents (one action, one row each), so
	// their appends go at once: a roster's mint waits for one round of
	// compare-and-sets, not sixteen in a row.
	errs := make([]error, len(entries))
	var wg sync.WaitGroup
	sem := make(chan struct{}, recordParallel)
	for i, e := range entries {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if _, _, err := c.Append(ctx, e); err != nil && !errors.Is(err, ErrDuplicate) {
				errs[i] = err
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// recordParallel bounds the appends Record makes at once.
const recordParallel = 16

// pemCert is a DER certificate in PEM.
func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// AuthorityConfig is a timestamp authority as configuration names it: the
// JSON of MESH_TIMESTAMP_AUTHORITIES (a list of them) in the cloud.
type AuthorityConfig struct {
	Name string `json:"name"`
	URL  string `json:"url"`
	// RootPEM is the root its signer must chain to; IntermediatesPEM the
	// certificates between them, when its tokens do not carry them.
	RootPEM          string `json:"root_pem"`
	IntermediatesPEM string `json:"intermediates_pem,omitempty"`
}

// ParseAuthorities reads a JSON list of AuthorityConfig: each needs a
// name, an http(s) URL and one root certificate.
func ParseAuthorities(data []byte) ([]Authority, error) {
	var cfgs []AuthorityConfig
	if err := strictUnmarshal(data, &cfgs); err != nil {
		return nil, fmt.Errorf("audit: timestamp authorities: %w", err)
	}
	out := make([]Authority, 0, len(cfgs))
	for _, c := range cfgs {
		a, err := c.Authority()
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

// Authority checks c and makes it an Authority.
func (c AuthorityConfig) Authority() (Authority, error) {
	u, err := url.Parse(c.URL)
	if c.Name == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return Authority{}, fmt.Errorf("audit: timestamp authority %q needs a name and an http(s) URL, not %q", c.Name, c.URL)
	}
	roots, err := parsePEMCerts(c.RootPEM)
	if err != nil || len(roots) != 1 {
		return Authority{}, fmt.Errorf("audit: timestamp authority %q: root_pem must hold one PEM certificate", c.Name)
	}
	inter, err := parsePEMCerts(c.IntermediatesPEM)
	if err != nil {
		return Authority{}, fmt.Errorf("audit: timestamp authority %q: intermediates_pem: %w", c.Name, err)
	}
	return Authority{Name: c.Name, URL: c.URL, Root: roots[0], Intermediates: inter}, nil
}

// parsePEMCerts reads every CERTIFICATE block of s.
func parsePEMCerts(s string) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	rest := []byte(s)
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// AccountOutcome is the outcome of every row of role RoleAccount: the
// action was done (only done actions are recorded).
const AccountOutcome = "completed"

// AccountEntries are the rows of one action of account on its agents, one
// per agent (role RoleAccount): peer is the account, offering names the
// action, request_id is the action's id, input_sha256 the SHA-256 of the
// canonical JSON of facts (what was done: docs/audit.md "Account rows"),
// and each entry's key is the action's id, so the action is recorded once
// however often it is handed in.
func AccountEntries(account, action, id string, agents []string, facts any, at time.Time) ([]Entry, error) {
	b, err := protocol.Canonical(facts)
	if err != nil {
		return nil, fmt.Errorf("audit: the facts of %s %s: %w", action, id, err)
	}
	digest := InputDigest(b)
	out := make([]Entry, 0, len(agents))
	for _, agent := range agents {
		if !keys.IsUserPublicKey(agent) {
			continue
		}
		out = append(out, Entry{Agent: agent, Role: RoleAccount, Peer: account, Offering: action, RequestID: id,
			Outcome: AccountOutcome, InputSHA256: digest, At: at, Key: RoleAccount + ":" + id})
	}
	return out, nil
}
