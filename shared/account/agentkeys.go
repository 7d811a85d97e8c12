package account

import (
	"context"
	"errors"
	"fmt"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/passkey"
	"agentmesh.dev/mesh/shared/secret"
	"agentmesh.dev/mesh/shared/store"
)

// AgentKeyGrant is what minting an agent key returns, once.
type AgentKeyGrant struct {
	Token       string `json:"token"`
	ID          string `json:"id"`
	Label       string `json:"label"`
	HandleClaim string `json:"handle_claim,omitempty"`
	// HandleNote says in one sentence which handle the agent will claim
	// when it starts, or why it will claim none (HandleNote).
	HandleNote string `json:"handle_note"`
	// OperatorName is the account's operator name after the mint ("" when
	// it has none).
	OperatorName string   `json:"operator_name"`
	ExpiresIn    int64    `json:"expires_in"`
	Command      string   `json:"command"`
	Key          AgentKey `json:"-"`
}

// MintAgentKey mints a single-use am_ key for the signed-in person. It
// needs a session with a fresh passkey; an API token can never mint one
// (spec §5). operatorName, when given, becomes the account's operator name
// for handle claims if it has none yet.
func (s *Service) MintAgentKey(ctx context.Context, p *Principal, name, operatorName string) (AgentKeyGrant, error) {
	if p.Via != "session" {
		return AgentKeyGrant{}, errs.New(errs.Forbidden, "agent keys are minted from a signed-in session with a passkey; API tokens cannot mint them")
	}
	if p.PasskeyAt.IsZero() || !passkey.IsFresh(p.PasskeyAt, s.now()) {
		return AgentKeyGrant{}, errs.New(errs.Forbidden, "confirm with your passkey first: minting an agent key needs a passkey check from the last few minutes").
			WithDetail("passkey_required", true)
	}
	return s.mintAgentKey(ctx, p.AccountID, name, operatorName, "")
}

// MintPlacedAgentKey is MintAgentKey for a key the service places itself
// where the agent runs (a cloud deploy puts it in the customer's Secret
// Manager): the same rules, but the owner's mail is a notice with the
// key's id and where it was placed, never the key, which then exists only
// there. placedIn says where, in words.
func (s *Service) MintPlacedAgentKey(ctx context.Context, p *Principal, name, placedIn string) (AgentKeyGrant, error) {
	if placedIn == "" {
		return AgentKeyGrant{}, errs.New(errs.InvalidRequest, "a placed agent key needs the place it goes to")
	}
	if p.Via != "session" {
		return AgentKeyGrant{}, errs.New(errs.Forbidden, "agent keys are minted from a signed-in session with a passkey; API tokens cannot mint them")
	}
	if p.PasskeyAt.IsZero() || !passkey.IsFresh(p.PasskeyAt, s.now()) {
		return AgentKeyGrant{}, errs.New(errs.Forbidden, "confirm with your passkey first: minting an agent key needs a passkey check from the last few minutes").
			WithDetail("passkey_required", true)
	}
	return s.mintAgentKey(ctx, p.AccountID, name, "", placedIn)
}

// AdminMintAgentKey is the operator's command on the server host: it acts
// for the account without a session (the host's own authority).
func (s *Service) AdminMintAgentKey(ctx context.Context, accountID, name string) (AgentKeyGrant, error) {
	return s.mintAgentKey(ctx, accountID, name, "", "")
}

// AdminMintAgentKeyFor is AdminMintAgentKey giving the account an operator
// name when it has none (meshd admin agent-token --operator).
func (s *Service) AdminMintAgentKeyFor(ctx context.Context, accountID, name, operatorName string) (AgentKeyGrant, error) {
	return s.mintAgentKey(ctx, accountID, name, operatorName, "")
}

// mintAgentKey mints; placedIn, when set, says where the service placed
// the key itself, and the mail then carries no key (MintPlacedAgentKey).
func (s *Service) mintAgentKey(ctx context.Context, accountID, name, operatorName, placedIn string) (AgentKeyGrant, error) {
	label, err := CheckLabel(name)
	if err != nil {
		return AgentKeyGrant{}, err
	}
	if operatorName, err = CheckOperatorName(operatorName); err != nil {
		return AgentKeyGrant{}, err
	}
	tok := secret.Token(AgentKeyPrefix)
	h := secret.Hash(tok)
	now := s.now()
	var acct Account
	var note string
	k := AgentKey{ID: publicID(h), Hash: h, AccountID: accountID, Label: label, CreatedAt: ms(now), ExpiresAt: ms(now.Add(AgentKeyTTL))}
	err = s.st.RunTx(ctx, func(tx store.Tx) error {
		if err := tx.Get(CollAccounts, accountID, &acct); err != nil {
			return err
		}
		if acct.Disabled {
			return errs.New(errs.Forbidden, "this account is disabled")
		}
		k.HandleClaim = HandleClaimOf(label, acct.Email)
		var held *Handle
		if k.HandleClaim != "" {
			var hd Handle
			switch err := tx.Get(CollHandles, HandleID(k.HandleClaim), &hd); {
			case err == nil:
				held = &hd
			case !errors.Is(err, store.ErrNotFound):
				return err
			}
		}
		// Writes. The account is where the operator name lives: one given
		// here counts only when it has none (SetOperatorName).
		opName, err := SetOperatorName(tx, acct.Email, &acct, operatorName, now)
		if err != nil {
			return err
		}
		acct.OperatorName = opName
		note = HandleNote(label, acct, held)
		return tx.Create(CollAgentKeys, h, k)
	})
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return AgentKeyGrant{}, errs.Newf(errs.NotFound, "no account %s", accountID)
		}
		return AgentKeyGrant{}, txErr(err)
	}
	g := AgentKeyGrant{Token: tok, ID: k.ID, Label: label, HandleClaim: k.HandleClaim, HandleNote: note, OperatorName: acct.OperatorName,
		ExpiresIn: int64(AgentKeyTTL.Seconds()), Command: s.upCommand(tok), Key: k}
	// The copy by mail is the owner's record; a failure to send it must not
	// lose the key that was just minted and shown, so it is logged, not fatal.
	body := fmt.Sprintf("An agent key was created for %q on your account.\n\nRun this on the agent's machine within 7 days:\n\n    %s\n\nThe key works once. If you did not create it, revoke it in the console.\n", label, g.Command)
	if placedIn != "" {
		// The key is where the agent runs, and nowhere else: the mail is
		// the owner's notice, not a second copy.
		body = fmt.Sprintf("An agent key (id %s) was created for %q on your account and placed in %s.\n\nThe key is not in this mail. If you did not deploy this agent, revoke the key in the console.\n", k.ID, label, placedIn)
	}
	if err := s.cfg.Mail.Send(ctx, mail.Message{To: acct.Email, Subject: "Your new agent key", Text: body, Kind: "agent-key"}); err != nil {
		s.log.Warn("agent key minted but its mail copy failed", "account", accountID, "key_id", k.ID, "err", err)
	}
	return g, nil
}

func (s *Service) upCommand(tok string) string {
	cmd := "mesh-adapter"
	if s.cfg.ControlURL != "" {
		cmd += " --control-url " + s.cfg.ControlURL
	}
	return cmd + " up " + tok
}

// ListAgentKeys lists an account's agent keys (never the tokens), newest first.
func (s *Service) ListAgentKeys(ctx context.Context, p *Principal) ([]AgentKey, error) {
	var out []AgentKey
	err := store.List(ctx, s.st, CollAgentKeys, store.Query{Where: []store.Eq{{Field: "account_id", Value: p.AccountID}}, OrderBy: "created_at", Desc: true}, &out)
	return out, txErr(err)
}

// RevokeAgentKey revokes an unused agent key by its public id.
func (s *Service) RevokeAgentKey(ctx context.Context, p *Principal, id string) error {
	if p.Via != "session" {
		return errs.New(errs.Forbidden, "agent keys are revoked from a signed-in session")
	}
	err := s.st.RunTx(ctx, func(tx store.Tx) error {
		var ks []AgentKey
		if err := tx.Query(CollAgentKeys, store.Where("account_id", p.AccountID, "id", id), &ks); err != nil {
			return err
		}
		if len(ks) == 0 {
			return errs.Newf(errs.NotFound, "no agent key %s on this account", id)
		}
		if ks[0].ClaimedAt != 0 {
			return errs.New(errs.Conflict, "that agent key was already used; retire the agent instead")
		}
		return tx.Update(CollAgentKeys, ks[0].Hash, map[string]any{"revoked_at": ms(s.now())})
	})
	return txErr(err)
}

// KeyState names an agent key's state for listings: unused, used, revoked
// or expired.
func (s *Service) KeyState(k AgentKey) string {
	switch {
	case k.ClaimedAt != 0:
		return "used"
	case k.RevokedAt != 0:
		return "revoked"
	case s.now().UnixMilli() >= k.ExpiresAt:
		return "expired"
	}
	return "unused"
}

// Fresh reports whether the principal's session passed a passkey check
// recently enough to mint an agent key.
func (s *Service) Fresh(p *Principal) bool {
	return p.Via == "session" && !p.PasskeyAt.IsZero() && passkey.IsFresh(p.PasskeyAt, s.now())
}
