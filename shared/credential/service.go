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
	Now           func() time.Time
	Log           *slog.Logger
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

// mint signs one user JWT through the guarded builder of its kind.
func (s *Service) mint(kind creds.Kind, key, name string, hosted []string, taskID string, expires, revokedAt time.Time) (string, error) {
	var p creds.Permissions
	switch kind {
	case creds.KindBootstrap:
		p = creds.BootstrapPermissions(hosted[0])
	case creds.KindNode:
		p = creds.NodePermissions(hosted)
	case creds.KindApp:
		p = creds.AppPermissions(key)
	case creds.KindJob:
		p = creds.JobPermissions(hosted[0], taskID)
	default:
		return "", errs.Newf(errs.InternalError, "no permission builder for %v", kind)
	}
	tok, err := s.cfg.Trust.MintUser(creds.UserSpec{PublicKey: key, Name: name, Kind: kind, Hosted: hosted, Permissions: p, Expires: expires, RevokedAt: revokedAt})
	if err != nil {
		return "", errs.Wrap(errs.InternalError, "the credential could not be signed", err)
	}
	return tok, nil
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
func rememberHost(tx store.Tx, agentID string, h hosts, key string) error {
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

// Bootstrap exchanges a single-use am_ key for a 30-day connection
// credential for agentID (spec §4.5, §3.3). The key is claimed in the same
// transaction that checks it; when the exchange is refused because the
// account is at its agent ceiling or the agent belongs to another account,
// nothing is written, so the key is still there to retry with.
func (s *Service) Bootstrap(ctx context.Context, token, agentID string) (BootstrapResult, error) {
	if err := CheckAgentID(agentID, "agent_id"); err != nil {
		return BootstrapResult{}, err
	}
	if !strings.HasPrefix(token, account.AgentKeyPrefix) {
		return BootstrapResult{}, errKeyUnusable
	}
	if err := s.minting(); err != nil {
		return BootstrapResult{}, err
	}
	cred, err := keys.Generate[keys.CredentialRole]()
	if err != nil {
		return BootstrapResult{}, errs.Wrap(errs.InternalError, "credential key", err)
	}
	now := s.now()
	expires := s.expiry(now)
	h := secret.Hash(token)
	var res BootstrapResult
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
		if _, err := getOptional(tx, CollHosts, agentID, &hs); err != nil {
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
		tok, err := s.mint(creds.KindBootstrap, cred.Public(), k.Label, []string{agentID}, "", expires, time.Time{})
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
		seed := string(cred.Seed())
		credsFile, err := jwt.FormatUserConfig(tok, []byte(seed))
		if err != nil {
			return errs.Wrap(errs.InternalError, "creds file", err)
		}
		res = BootstrapResult{OK: true, JWT: tok, Seed: seed, Creds: string(credsFile), Label: k.Label,
			AccountEmail: acct.Email, ExpiresAt: protocol.FormatTime(expires), AgentID: agentID,
			RenewURL: strings.TrimRight(s.cfg.ControlURL, "/") + "/v1/node-credential",
			Mesh:     map[string]any{"name": s.cfg.Mesh.Name, "protocol": s.cfg.Mesh.Protocol, "endpoints": append([]string{}, s.cfg.Mesh.WS...)}}
		if bound != "" {
			res.Handle = &bound
		}
		return nil
	})
	if err != nil {
		return BootstrapResult{}, txErr(err)
	}
	s.log.Info("agent key exchanged", "agent", agentID, "credential", cred.Public(), "handle", res.Handle != nil)
	return res, nil
}
