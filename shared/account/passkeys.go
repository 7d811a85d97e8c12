package account

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/mail"
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
//
// A registration on an account that already has a passkey needs the
// session to hold a fresh assertion (passkey.FreshFor) with one of them;
// FinishPasskey checks it again. An account's FIRST passkey is registered
// with the session alone. That is a known, accepted risk: there is no
// passkey yet to assert with and the session (a mailed code) is the
// account's only proof, so whoever holds a session of an account without a
// passkey (a guessed or intercepted sign-in code, a leaked ams_ token) can
// register their own authenticator, assert with it and mint agent keys.
// Any stricter rule would leave a new account no way to get its first
// passkey. The exposure is limited to accounts that never registered one,
// and the owner is mailed for every passkey added. Registering never makes
// a session fresh for minting; only an assertion does.
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
		// Adding a passkey to an account that has one needs a fresh
		// assertion with one of its passkeys: a session alone (a mailed
		// code, a leaked ams_ Bearer) must not add its own authenticator
		// and then mint agent keys with it (spec §5). The first passkey is
		// registered with the session alone (see BeginPasskey).
		if len(u.Credentials) > 0 && !s.Fresh(p) {
			return nil, "", errAddNeedsAssertion()
		}
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

// errAddNeedsAssertion refuses a registration on an account that has a
// passkey when the session has no fresh assertion.
func errAddNeedsAssertion() error {
	return errs.New(errs.Forbidden, "confirm with one of your passkeys first: adding a passkey to an account that has one needs a passkey check from the last few minutes").
		WithDetail("passkey_required", true)
}

// PasskeyResult is what a finished ceremony did.
type PasskeyResult struct {
	// Registered is true when the ceremony added a passkey.
	Registered bool
	// Fresh says whether the session's passkey check is fresh afterwards:
	// always after an assertion; after a registration only if an earlier
	// assertion still is (registering never makes a session fresh).
	Fresh bool
}

// FinishPasskey completes a ceremony with the browser's response. An
// assertion updates the credential's sign count and marks the session's
// passkey check fresh (passkey_at); it is the only thing that does. A
// registration stores the new credential and leaves passkey_at alone: on
// an account that already has a passkey it is accepted only while the
// session holds a fresh assertion (checked again here, in the transaction
// that adds the credential), and the account's owner is mailed.
func (s *Service) FinishPasskey(ctx context.Context, p *Principal, ceremonyID string, response []byte) (PasskeyResult, error) {
	if err := s.passkeysOn(); err != nil {
		return PasskeyResult{}, err
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
		return PasskeyResult{}, errs.New(errs.InvalidRequest, "unknown or already used passkey ceremony; start again")
	} else if err != nil {
		return PasskeyResult{}, unavailable(err)
	}
	if now.UnixMilli() >= c.ExpiresAt {
		return PasskeyResult{}, errs.New(errs.InvalidRequest, "the passkey ceremony expired; start again")
	}
	u, err := s.passkeyUser(ctx, p)
	if err != nil {
		return PasskeyResult{}, err
	}
	register := c.Kind == "register"
	var cred passkey.Credential
	if register {
		cred, err = s.cfg.Passkeys.FinishRegistration(u, c.Data, response)
	} else {
		cred, err = s.cfg.Passkeys.FinishLogin(u, c.Data, response)
	}
	if err != nil {
		return PasskeyResult{}, errs.Wrap(errs.Unauthorized, "the passkey did not verify", err)
	}
	var res PasskeyResult
	err = s.st.RunTx(ctx, func(tx store.Tx) error {
		res = PasskeyResult{}
		var sess Session
		if err := tx.Get(CollSessions, p.SessionID, &sess); err != nil {
			return err
		}
		var set passkeySet
		if err := tx.Get(CollPasskeys, p.AccountID, &set); err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		fresh := sess.PasskeyAt > 0 && passkey.IsFresh(time.UnixMilli(sess.PasskeyAt), now)
		if register && len(set.Credentials) > 0 && !fresh {
			// Begin checked this too; the account may have got its first
			// passkey since (another ceremony of the same account), or the
			// assertion may have gone stale.
			return errAddNeedsAssertion()
		}
		set.AccountID = p.AccountID
		replaced := false
		for i := range set.Credentials {
			if string(set.Credentials[i].ID) == string(cred.ID) {
				if register {
					return errs.New(errs.Conflict, "that passkey is already registered to this account")
				}
				set.Credentials[i], replaced = cred, true
			}
		}
		if !replaced {
			if !register {
				return errs.New(errs.Unauthorized, "that passkey is not registered to this account")
			}
			set.Credentials = append(set.Credentials, cred)
		}
		if err := tx.Set(CollPasskeys, p.AccountID, set); err != nil {
			return err
		}
		if register {
			res = PasskeyResult{Registered: true, Fresh: fresh}
			return nil
		}
		res = PasskeyResult{Fresh: true}
		return tx.Update(CollSessions, p.SessionID, map[string]any{"passkey_at": ms(now)})
	})
	if errors.Is(err, store.ErrNotFound) {
		return PasskeyResult{}, errNoSession
	}
	if err != nil {
		return PasskeyResult{}, txErr(err)
	}
	if register {
		s.mailPasskeyAdded(ctx, p, now)
	}
	return res, nil
}

// mailPasskeyAdded tells the account's owner that a passkey was added: a
// passkey lets its holder mint agent keys, so an addition the owner did not
// make must not go unnoticed. The passkey is already stored; a failure to
// mail is logged, not fatal (as for the agent key's copy).
func (s *Service) mailPasskeyAdded(ctx context.Context, p *Principal, at time.Time) {
	body := fmt.Sprintf("A passkey was added to your account %s at %s.\n\n"+
		"A passkey lets whoever holds it mint agent keys for your account.\n"+
		"If you did not add it, someone else has access to your account: revoke unused agent keys in the console%s "+
		"and contact the mesh's operator to disable the account.\n",
		p.Account.Email, at.UTC().Format("2006-01-02 15:04 UTC"), consoleLink(s.cfg.ConsoleURL))
	if err := s.cfg.Mail.Send(ctx, mail.Message{To: p.Account.Email, Subject: "A passkey was added to your account", Text: body, Kind: "passkey-added"}); err != nil {
		s.log.Warn("passkey added but the owner's notice failed", "account", p.AccountID, "err", err)
	}
}

func consoleLink(u string) string {
	if u == "" {
		return ""
	}
	return " (" + strings.TrimRight(u, "/") + "/agent-keys)"
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
