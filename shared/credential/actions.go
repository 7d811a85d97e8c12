package credential

import (
	"context"
	"time"

	"agentmesh.dev/mesh/shared/protocol"
)

// ActionLog keeps an account's actions on its agents once they are
// committed: the control plane appends them to the agents' audit chains
// as rows of role "account" (docs/audit.md "Account rows"). Keeping them
// is best effort: the action is done whether or not it is kept.
type ActionLog interface {
	AgentAction(ctx context.Context, a AgentAction) error
}

// The actions of AgentAction.
const (
	ActionMint   = "credential.mint"
	ActionRevoke = "credential.revoke"
)

// AgentAction is one action on agents of one account. Its JSON is what
// the audit rows' input_sha256 digests (the canonical JSON of it).
type AgentAction struct {
	// Action is ActionMint or ActionRevoke.
	Action string `json:"action"`
	// ID names the action: the mint's record id, or a fresh id for a
	// revocation.
	ID      string   `json:"id"`
	Account string   `json:"account"`
	Agents  []string `json:"agents"`
	// Kind is the minted credential's kind (bootstrap, node, job).
	Kind string `json:"kind,omitempty"`
	// Keys are the credential keys minted or revoked.
	Keys []string `json:"keys"`
	// At is when it was done; ExpiresAt when the minted credential
	// expires (RFC 3339, ms).
	At        string `json:"at"`
	ExpiresAt string `json:"expires_at,omitempty"`
	// Reason is a revocation's reason.
	Reason string `json:"reason,omitempty"`
}

// actionTimeout bounds keeping one action.
const actionTimeout = 5 * time.Second

// keep hands a to the action log, if any, when it concerns agents of an
// account; a failure is logged.
func (s *Service) keep(ctx context.Context, a AgentAction) {
	if s.cfg.Actions == nil || a.Account == "" || len(a.Agents) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), actionTimeout)
	defer cancel()
	if err := s.cfg.Actions.AgentAction(ctx, a); err != nil {
		s.log.Warn("an account action was not kept in its agents' audit chains", "action", a.Action, "id", a.ID, "account", a.Account, "err", err)
	}
}

// keepMint keeps a committed mint of agents' credentials.
func (s *Service) keepMint(ctx context.Context, m Mint) {
	if m.ID == "" {
		return
	}
	a := AgentAction{Action: ActionMint, ID: m.ID, Account: m.AccountID, Agents: m.Agents, Kind: m.Kind, Keys: []string{m.Key},
		At: protocol.FormatTime(time.UnixMilli(m.IssuedAt))}
	if m.ExpiresAt != 0 {
		a.ExpiresAt = protocol.FormatTime(time.UnixMilli(m.ExpiresAt))
	}
	s.keep(ctx, a)
}

// keepRevocation keeps a committed revocation of agents' credentials.
func (s *Service) keepRevocation(ctx context.Context, account string, agents, keys []string, reason string, at time.Time) {
	s.keep(ctx, AgentAction{Action: ActionRevoke, ID: protocol.NewID(), Account: account, Agents: agents, Keys: keys,
		At: protocol.FormatTime(at), Reason: reason})
}
