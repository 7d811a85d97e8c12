package account

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/passkey"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/store"
)

// passkeySet is every passkey of one account (one document: an account has
// a handful, and a ceremony reads them all anyway).
type passkeySet struct {
	AccountID   string               `json:"account_id"`
	Credentials []passkey.Credential `json:"credentials"`
}

// ceremony is the server half of a WebAuthn ceremony between begin and
// finish, bound to the session that began it.
type ceremony struct {
	ID        string `json:"id"`
	Kind      string `json:"kind"` // "register" or "assert"
	AccountID string `json:"account_id"`
	SessionID string `json:"session_id"`
	Data      []byte `json:"data"`
	ExpiresAt int64  `json:"expires_at"`
}

const ceremonyTTL = 5 * time.Minute

func (s *Service) passkeysOn() error {
	if s.cfg.Passkeys == nil {
		return errs.New(errs.NotImplemented, "passkeys are not configured on this instance")
	}
	return nil
}

func (s *Service) passkeyUser(ctx context.Context, p *Principal) (passkey.User, error) {
	var set passkeySet
	err := store.Get(ctx, s.st, CollPasskeys, p.AccountID, &set)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return passkey.User{}, unavailable(err)
	}
	return passkey.User{ID: []byte(p.AccountID), Name: p.Account.Email, DisplayName: p.Account.Email, Credentials: set.Credentials}, nil
}

// BeginPasskey starts a registration ("register") or assertion ("assert")
// ceremony for the signed-in session and returns the browser's options and
// the ceremony id to send back with the result.
func (s *Service) BeginPasskey(ctx context.Context, p *Principal, kind string) (json.RawMessage, string, error) {
	if err := s.passkeysOn(); err != nil {
		return nil, "", err
	}
	if p.Via != "session" {
		return nil, "", errs.New(errs.Forbidden, "passkeys are used from a signed-in session")
	}
	u, err := s.passkeyUser(ctx, p)
	if err != nil {
		return nil, "", err
	}
	var opts json.RawMessage
	var data []byte
	switch kind {
	case "register":
		opts, data, err = s.cfg.Passkeys.BeginRegistration(u)
	case "assert":
		if len(u.Credentials) == 0 {
			return nil, "", errs.New(errs.InvalidRequest, "this account has no passkey yet; register one first")
		}
		opts, data, err = s.cfg.Passkeys.BeginLogin(u)
	default:
		return nil, "", errs.Newf(errs.InvalidRequest, "unknown passkey ceremony %q", kind)
	}
	if err != nil {
		return nil, "", errs.Wrap(errs.InternalError, "passkey ceremony could not start", err)
	}
	c := ceremony{ID: protocol.NewID(), Kind: kind, AccountID: p.AccountID, SessionID: p.SessionID, Data: data,
		ExpiresAt: ms(s.now().Add(ceremonyTTL))}
	if err := s.st.RunTx(ctx, func(tx store.Tx) error { return tx.Create(CollCeremonies, c.ID, c) }); err != nil {
		return nil, "", unavailable(err)
	}
	return opts, c.ID, nil
}

// FinishPasskey completes a ceremony with the browser's response. A
// registration stores the new credential; an assertion updates the sign
// count and marks the session's passkey as fresh. Either way the session
// counts as freshly verified afterwards (registering needs the
// authenticator, too).
func (s *Service) FinishPasskey(ctx context.Context, p *Principal, ceremonyID string, response []byte) error {
	if err := s.passkeysOn(); err != nil {
		return err
	}
	now := s.now()
	var c ceremony
	err := s.st.RunTx(ctx, func(tx store.Tx) error {
		// Take the ceremony: it works once.
		if err := tx.Get(CollCeremonies, ceremonyID, &c); err != nil {
			return err
		}
		return tx.Delete(CollCeremonies, ceremonyID)
	})
	if errors.Is(err, store.ErrNotFound) || (err == nil && (c.SessionID != p.SessionID || c.AccountID != p.AccountID)) {
		return errs.New(errs.InvalidRequest, "unknown or already used passkey ceremony; start again")
	} else if err != nil {
		return unavailable(err)
	}
	if now.UnixMilli() >= c.ExpiresAt {
		return errs.New(errs.InvalidRequest, "the passkey ceremony expired; start again")
	}
	u, err := s.passkeyUser(ctx, p)
	if err != nil {
		return err
	}
	var cred passkey.Credential
	switch c.Kind {
	case "register":
		cred, err = s.cfg.Passkeys.FinishRegistration(u, c.Data, response)
	default:
		cred, err = s.cfg.Passkeys.FinishLogin(u, c.Data, response)
	}
	if err != nil {
		return errs.Wrap(errs.Unauthorized, "the passkey did not verify", err)
	}
	err = s.st.RunTx(ctx, func(tx store.Tx) error {
		var set passkeySet
		if err := tx.Get(CollPasskeys, p.AccountID, &set); err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		set.AccountID = p.AccountID
		replaced := false
		for i := range set.Credentials {
			if string(set.Credentials[i].ID) == string(cred.ID) {
				set.Credentials[i], replaced = cred, true
			}
		}
		if !replaced {
			if c.Kind != "register" {
				return errs.New(errs.Unauthorized, "that passkey is not registered to this account")
			}
			set.Credentials = append(set.Credentials, cred)
		}
		if err := tx.Set(CollPasskeys, p.AccountID, set); err != nil {
			return err
		}
		return tx.Update(CollSessions, p.SessionID, map[string]any{"passkey_at": ms(now)})
	})
	return txErr(err)
}

// PasskeyCount says how many passkeys an account has.
func (s *Service) PasskeyCount(ctx context.Context, accountID string) (int, error) {
	var set passkeySet
	err := store.Get(ctx, s.st, CollPasskeys, accountID, &set)
	if errors.Is(err, store.ErrNotFound) {
		return 0, nil
	}
	return len(set.Credentials), txErr(err)
}
