package credential

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/secret"
	"agentmesh.dev/mesh/shared/store"
)

// Config is what the service needs.
type Config struct {
	Store store.Store
	// Trust mints the JWTs; nil means minting is not configured on this
	// instance (the doors answer 501).
	Trust   *creds.Trust
	Revoker Revoker
	Mesh    MeshInfo
	// ControlURL is where renewals go ({control_url}/v1/node-credential).
	ControlURL string
	// CredentialTTL is the lifetime of bootstrap, node and app credentials
	// (30 days by default); NoExpiry mints node credentials without one.
	CredentialTTL time.Duration
	NoExpiry      bool
	// Unowned are the limits on node credentials for rosters no account
	// owns; zero means DefaultUnownedLimits.
	Unowned UnownedLimits
	// History answers whether the bus knows an agent key (a registration
	// or mail); nil refuses every exchange that carries no proof.
	History History
	// Classes are the limits of the fence classes (creds.ClassUnowned for
	// node credentials no account owns); nil means the defaults.
	Classes map[string]creds.ClassLimits
	// Actions keeps the mints and revocations of an account's agents'
	// credentials in their audit chains (actions.go); nil keeps none.
	Actions ActionLog
	Now     func() time.Time
	Log     *slog.Logger

	// Apps keeps, on the bus, which agents each live app may read the
	// activity and usage of (activity.AppAgentsMirror, appmirror.go); nil
	// without a bus connection.
	Apps AppMirror
}

// Service issues and revokes credentials.
type Service struct {
	cfg Config
	st  store.Store
	now func() time.Time
	log *slog.Logger
}

// New builds the service.
func New(cfg Config) *Service {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.CredentialTTL <= 0 {
		cfg.CredentialTTL = DefaultCredentialTTL
	}
	if cfg.Mesh.Protocol == "" {
		cfg.Mesh.Protocol = "0.3"
	}
	return &Service{cfg: cfg, st: cfg.Store, now: cfg.Now, log: cfg.Log}
}

var errNotConfigured = errs.New(errs.NotImplemented, "credential minting not configured on this instance")

func (s *Service) minting() error {
	if s.cfg.Trust == nil {
		return errNotConfigured
	}
	return nil
}

// mintSpec is one credential to sign.
type mintSpec struct {
	kind      creds.Kind
	key, name string
	hosted    []string
	taskID    string
	expires   time.Time
	revokedAt time.Time
	// shared grants the shared _INBOX.> space beside the credential's own
	// reply prefix (for upstream SDKs; docs/security.md).
	shared bool
	// class is the fence class ("" for none); its JWT limits come from
	// Config.Classes.
	class string
}

// mint signs one user JWT through the guarded builder of its kind.
func (s *Service) mint(m mintSpec) (string, error) {
	r := creds.Replies{Key: m.key, Shared: m.shared}
	var p creds.Permissions
	switch m.kind {
	case creds.KindBootstrap:
		p = creds.BootstrapPermissions(m.hosted[0], r)
	case creds.KindNode:
		p = creds.NodePermissions(m.hosted, r)
	case creds.KindApp:
		p = creds.AppPermissions(m.key, m.shared)
	case creds.KindJob:
		p = creds.JobPermissions(m.key, m.hosted[0], m.taskID)
	default:
		return "", errs.Newf(errs.InternalError, "no permission builder for %v", m.kind)
	}
	spec := creds.UserSpec{PublicKey: m.key, Name: m.name, Kind: m.kind, Hosted: m.hosted, Permissions: p,
		Expires: m.expires, RevokedAt: m.revokedAt}
	if m.class != "" {
		spec.Class, spec.Limits = m.class, s.classes()[m.class].ConnLimits
	}
	tok, err := s.cfg.Trust.MintUser(spec)
	if err != nil {
		return "", errs.Wrap(errs.InternalError, "the credential could not be signed", err)
	}
	return tok, nil
}

// classes are the fence classes' limits: the configured ones, else the
// defaults.
func (s *Service) classes() map[string]creds.ClassLimits {
	if s.cfg.Classes != nil {
		return s.cfg.Classes
	}
	return creds.DefaultClassLimits()
}

func (s *Service) expiry(now time.Time) time.Time { return now.Add(s.cfg.CredentialTTL) }

// meshBlock is the `mesh` member of node-credential and app answers.
func (s *Service) meshBlock() map[string]any {
	return map[string]any{"name": s.cfg.Mesh.Name, "protocol": s.cfg.Mesh.Protocol,
		"nats_endpoints": append(append([]string{}, s.cfg.Mesh.TCP...), s.cfg.Mesh.WS...)}
}

const storeDown = "the credential store is unavailable; retry shortly"

// txErr passes protocol errors through and turns store failures into 503.
func txErr(err error) error { return errs.OrUnavailable(err, storeDown) }

func ms(t time.Time) int64 { return t.UnixMilli() }

func isoOrNil(msec int64) any {
	if msec == 0 {
		return nil
	}
	return protocol.FormatTime(time.UnixMilli(msec))
}

// rememberHost records that key carried agent, for revocation on retire.
// Reads must come first in a transaction, so callers pass what they read.
//
// A record that already names the agent and holds key is left as it is:
// writing it again would store what is stored (a renewal by the same node
// is the common case, and sixteen identical writes a mint were most of its
// store work). What a retire must find is then durable already, and the
// record was read in this transaction, so a concurrent change to it still
// conflicts with this one as it did when it was written.
func rememberHost(tx store.Tx, agentID string, h hosts, key string) error {
	if h.AgentID == agentID && slices.Contains(h.Keys, key) {
		return nil
	}
	h.AgentID = agentID
	if !slices.Contains(h.Keys, key) {
		h.Keys = append(h.Keys, key)
		if len(h.Keys) > maxHostKeys {
			h.Keys = h.Keys[len(h.Keys)-maxHostKeys:]
		}
	}
	return tx.Set(CollHosts, agentID, h)
}

// revokedAt reads when key was last revoked (zero if never).
func revokedAt(tx store.Tx, key string) (time.Time, error) {
	var r revocation
	ok, err := getOptional(tx, CollRevocations, key, &r)
	if !ok || err != nil {
		return time.Time{}, err
	}
	return time.UnixMilli(r.At), nil
}

func getOptional(tx store.Tx, coll, id string, dst any) (bool, error) {
	err := tx.Get(coll, id, dst)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// BootstrapRequest is the body of POST /v1/bootstrap (spec §4.5) with this
// mesh's two optional members.
type BootstrapRequest struct {
	Token   string `json:"token"`
	AgentID string `json:"agent_id"`
	// Proof is the agent's signature (standard base64) over
	// protocol.BootstrapString(token, agent_id): possession of the agent
	// key. Without it only a brand-new key is exchanged (Bootstrap).
	Proof string `json:"proof,omitempty"`
	// PrivateInbox asks for a credential whose replies arrive only at its
	// own prefix (inbox_prefix in the answer), without the shared _INBOX.>
	// grant upstream SDKs need. mesh-adapter always sends it.
	PrivateInbox bool `json:"private_inbox,omitempty"`
}

// History is what the bus knows of an agent key: whether the registry has
// a registration for it, and whether its mailbox holds mail. A proof-less
// exchange asks it (Bootstrap).
type History interface {
	AgentHistory(ctx context.Context, agent string) (registered, mail bool, err error)
}

// BootstrapResult is the answer of an am_ key exchange (spec §4.5).
type BootstrapResult struct {
	OK           bool           `json:"ok"`
	JWT          string         `json:"jwt"`
	Seed         string         `json:"seed"`
	Creds        string         `json:"creds"`
	Label        string         `json:"label"`
	AccountEmail string         `json:"account_email"`
	Handle       *string        `json:"handle"`
	ExpiresAt    string         `json:"expires_at"`
	RenewURL     string         `json:"renew_url"`
	Mesh         map[string]any `json:"mesh"`
	AgentID      string         `json:"agent_id"`
	// InboxPrefix is the reply prefix the client must set on its
	// connection (nats.CustomInboxPrefix): the one its credential may
	// subscribe besides, without private_inbox, the shared _INBOX.>.
	InboxPrefix string `json:"inbox_prefix"`
}

// errKeyUnusable is the one answer for an am_ key that is unknown, used,
// revoked or expired: which of them is none of the caller's business.
var errKeyUnusable = errs.New(errs.Unauthorized, "agent key unknown, used or expired; mint a new one in the console")

// CheckAgentID is the shape check of an agent public key in a request. A
// seed is refused by name, because sending one is the mistake that matters.
func CheckAgentID(id, member string) error {
	if strings.HasPrefix(id, "S") && len(id) == 58 {
		return errs.Newf(errs.InvalidRequest, "%s looks like a seed; send the agent's public key (U…) and keep the seed on its machine", member)
	}
	if !keys.IsUserPublicKey(id) {
		return errs.Newf(errs.InvalidRequest, "%s must be an agent public key: U followed by 55 base32 characters", member)
	}
	return nil
}

// errProofRequired refuses a proof-less exchange for a key with history.
var errProofRequired = errs.New(errs.Unauthorized,
	"this agent key already has an owner, a registration, mail or a retirement record; exchanging an agent key (am_) for it needs proof that you hold its seed (send proof, see docs/control-plane.md); the agent key (am_) was not used").
	WithDetail("proof_required", true)

// Bootstrap exchanges a single-use am_ key for a 30-day connection
// credential for the agent r names (spec §4.5, §3.3). The key is claimed in
// the same transaction that checks it; when the exchange is refused because
// the account is at its agent ceiling or the agent belongs to another
// account, nothing is written, so the key is still there to retry with.
//
// The credential reads the agent's inbox and mail, so the agent key must be
// the caller's: with r.Proof the caller proves it holds the agent's seed;
// without it (upstream SDKs send only token and agent_id, for a key they
// just made) the key must be brand new — no owner, no host, no tombstone in
// the store, no registration and no mail on the bus (DESIGN §4).
func (s *Service) Bootstrap(ctx context.Context, r BootstrapRequest) (BootstrapResult, error) {
	token, agentID := r.Token, r.AgentID
	if err := CheckAgentID(agentID, "agent_id"); err != nil {
		return BootstrapResult{}, err
	}
	if !strings.HasPrefix(token, account.AgentKeyPrefix) {
		return BootstrapResult{}, errKeyUnusable
	}
	proven := r.Proof != ""
	if proven && protocol.VerifyBootstrap(token, agentID, r.Proof) != nil {
		return BootstrapResult{}, unauth(errs.IdentityMismatch, "proof does not verify for agent_id; the agent key (am_) was not used")
	}
	if err := s.minting(); err != nil {
		return BootstrapResult{}, err
	}
	h := secret.Hash(token)
	if !proven {
		// The bus is asked only for a key that can be spent: an unknown or
		// used token costs no question to the mailbox worker.
		if err := s.st.RunTx(ctx, func(tx store.Tx) error {
			var k account.AgentKey
			if err := tx.Get(account.CollAgentKeys, h, &k); err != nil {
				if errors.Is(err, store.ErrNotFound) {
					return errKeyUnusable
				}
				return err
			}
			if !k.Usable(s.now()) {
				return errKeyUnusable
			}
			return nil
		}); err != nil {
			return BootstrapResult{}, txErr(err)
		}
		if err := s.brandNewOnBus(ctx, agentID); err != nil {
			return BootstrapResult{}, err
		}
	}
	cred, err := keys.Generate[keys.CredentialRole]()
	if err != nil {
		return BootstrapResult{}, errs.Wrap(errs.InternalError, "credential key", err)
	}
	now := s.now()
	expires := s.expiry(now)
	sharedInbox := !r.PrivateInbox
	var res BootstrapResult
	var minted Mint
	var owner string
	err = s.st.RunTx(ctx, func(tx store.Tx) error {
		res = BootstrapResult{}
		// Reads.
		var k account.AgentKey
		if err := tx.Get(account.CollAgentKeys, h, &k); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return errKeyUnusable
			}
			return err
		}
		if !k.Usable(now) {
			return errKeyUnusable
		}
		var acct account.Account
		if err := tx.Get(account.CollAccounts, k.AccountID, &acct); err != nil {
			return err
		}
		var existing Agent
		known, err := getOptional(tx, CollAgents, agentID, &existing)
		if err != nil {
			return err
		}
		var owned []Agent
		if err := tx.Query(CollAgents, store.Where("account_id", acct.ID, "enabled", true), &owned); err != nil {
			return err
		}
		var tomb Tombstone
		tombstoned, err := getOptional(tx, CollTombstones, agentID, &tomb)
		if err != nil {
			return err
		}
		var hs hosts
		hosted, err := getOptional(tx, CollHosts, agentID, &hs)
		if err != nil {
			return err
		}
		var handle account.Handle
		handleID := account.HandleID(k.HandleClaim)
		handleKnown := false
		if handleID != "" {
			if handleKnown, err = getOptional(tx, account.CollHandles, handleID, &handle); err != nil {
				return err
			}
		}

		// Checks. A refusal here writes nothing: the key stays usable.
		if !proven && (known || tombstoned || hosted) {
			return errProofRequired
		}
		if acct.Disabled {
			return errs.New(errs.Forbidden, "the account that minted this key is disabled")
		}
		if known && existing.AccountID != acct.ID && existing.Enabled {
			return errs.New(errs.Conflict, "this agent key is already owned by another account; the agent key (am_) was not used and can be retried with another agent")
		}
		mine := known && existing.AccountID == acct.ID && existing.Enabled
		if !mine && len(owned) >= acct.Ceiling() {
			return errs.Newf(errs.Conflict, "the account is at its ceiling of %d agents; retire one and retry — the agent key (am_) was not used", acct.Ceiling()).
				WithDetail("agent_ceiling", acct.Ceiling())
		}

		// Mint, then write everything in the same transaction.
		tok, err := s.mint(mintSpec{kind: creds.KindBootstrap, key: cred.Public(), name: k.Label, hosted: []string{agentID}, expires: expires, shared: sharedInbox})
		if err != nil {
			return err
		}
		bound := ""
		if handleID != "" && acct.OperatorName != "" && (!handleKnown || (handle.AccountID == acct.ID && (handle.AgentID == "" || handle.AgentID == agentID))) {
			if !handleKnown {
				handle = account.Handle{Handle: k.HandleClaim, AccountID: acct.ID, Email: acct.Email, OperatorName: acct.OperatorName, ClaimedAt: ms(now)}
			}
			handle.AgentID, handle.BoundAt = agentID, ms(now)
			if err := tx.Set(account.CollHandles, handleID, handle); err != nil {
				return err
			}
			bound = handle.Handle
		}
		if err := tx.Update(account.CollAgentKeys, h, map[string]any{"claimed_at": ms(now), "agent_id": agentID}); err != nil {
			return err
		}
		ag := Agent{ID: agentID, AccountID: acct.ID, Label: k.Label, Handle: bound, CreatedAt: ms(now), Enabled: true}
		owner = acct.ID
		if mine {
			ag.CreatedAt = existing.CreatedAt
			if bound == "" {
				ag.Handle = existing.Handle
			}
		}
		if err := tx.Set(CollAgents, agentID, ag); err != nil {
			return err
		}
		if tombstoned {
			if err := tx.Delete(CollTombstones, agentID); err != nil {
				return err
			}
		}
		if err := rememberHost(tx, agentID, hs, cred.Public()); err != nil {
			return err
		}
		m := Mint{ID: protocol.NewID(), Kind: "bootstrap", Key: cred.Public(), Agents: []string{agentID}, AccountID: acct.ID,
			IssuedAt: ms(now), ExpiresAt: ms(expires)}
		if err := tx.Create(CollMints, m.ID, m); err != nil {
			return err
		}
		minted = m
		seed := string(cred.Seed())
		credsFile, err := jwt.FormatUserConfig(tok, []byte(seed))
		if err != nil {
			return errs.Wrap(errs.InternalError, "creds file", err)
		}
		res = BootstrapResult{OK: true, JWT: tok, Seed: seed, Creds: string(credsFile), Label: k.Label,
			AccountEmail: acct.Email, ExpiresAt: protocol.FormatTime(expires), AgentID: agentID,
			RenewURL: strings.TrimRight(s.cfg.ControlURL, "/") + "/v1/node-credential", InboxPrefix: protocol.PrivateInboxPrefix(cred.Public()),
			Mesh: map[string]any{"name": s.cfg.Mesh.Name, "protocol": s.cfg.Mesh.Protocol, "endpoints": append([]string{}, s.cfg.Mesh.WS...)}}
		if bound != "" {
			res.Handle = &bound
		}
		return nil
	})
	if err != nil {
		return BootstrapResult{}, txErr(err)
	}
	s.log.Info("agent key exchanged", "agent", agentID, "credential", cred.Public(), "handle", res.Handle != nil, "proof", proven)
	// The agent is the account's now: its apps may read about it.
	s.mirrorAccount(ctx, owner)
	s.keepMint(ctx, minted)
	return res, nil
}

// brandNewOnBus refuses a proof-less exchange for a key the bus knows: one
// with a registration or mail. An instance without a view of the bus
// cannot tell, so it refuses every proof-less exchange.
func (s *Service) brandNewOnBus(ctx context.Context, agentID string) error {
	if s.cfg.History == nil {
		return errs.New(errs.Unauthorized, "this instance cannot check an agent key's history; send proof (docs/control-plane.md); the agent key (am_) was not used").
			WithDetail("proof_required", true)
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	registered, mail, err := s.cfg.History.AgentHistory(ctx, agentID)
	if err != nil {
		return errs.Wrap(errs.Unavailable, "cannot check the agent key's history now; retry, or send proof; the agent key (am_) was not used", err)
	}
	if registered || mail {
		return errProofRequired
	}
	return nil
}
