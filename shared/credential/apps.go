package credential

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/nats-io/jwt/v2"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/store"
)

// AppResult is the answer of app creation and refresh. Seed and Creds are
// present only on creation: the service keeps no seed, so a refresh returns
// a new JWT for the key the app already holds.
type AppResult struct {
	OK        bool           `json:"ok"`
	AppID     string         `json:"app_id"`
	Name      string         `json:"name"`
	PublicKey string         `json:"public_key"`
	JWT       string         `json:"jwt"`
	Seed      string         `json:"seed,omitempty"`
	Creds     string         `json:"creds,omitempty"`
	ExpiresAt string         `json:"expires_at"`
	Mesh      map[string]any `json:"mesh"`
	// InboxPrefix is the app's private reply prefix. An app credential also
	// holds the shared _INBOX.> grant, for programs built on upstream SDKs
	// that cannot set a prefix (docs/security.md).
	InboxPrefix string `json:"inbox_prefix"`
}

// CreateApp makes a durable app credential for an account: a fresh key that
// hosts itself as an agent, listed like any agent (not sandboxed).
func (s *Service) CreateApp(ctx context.Context, accountID, name string) (AppResult, error) {
	name, err := account.CheckLabel(name)
	if err != nil {
		return AppResult{}, err
	}
	if err := s.minting(); err != nil {
		return AppResult{}, err
	}
	k, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		return AppResult{}, errs.Wrap(errs.InternalError, "app key", err)
	}
	now := s.now()
	expires := s.expiry(now)
	app := App{ID: "app_" + strings.ReplaceAll(protocol.NewID(), "-", "")[:20], AccountID: accountID, Name: name, Key: k.Public(), CreatedAt: ms(now)}
	var res AppResult
	err = s.st.RunTx(ctx, func(tx store.Tx) error {
		var acct account.Account
		if err := tx.Get(account.CollAccounts, accountID, &acct); err != nil {
			return err
		}
		var apps []App
		if err := tx.Query(CollApps, store.Where("account_id", accountID), &apps); err != nil {
			return err
		}
		live := 0
		for _, a := range apps {
			if a.RevokedAt == 0 {
				live++
			}
		}
		if acct.Disabled {
			return errs.New(errs.Forbidden, "this account is disabled")
		}
		if !acct.Verified {
			return errs.New(errs.Forbidden, "verify the account's email first (sign in with the mailed code)")
		}
		if live >= MaxAppsPerAccount {
			return errs.Newf(errs.QuotaExceeded, "an account has at most %d apps; revoke one first", MaxAppsPerAccount)
		}
		tok, err := s.mint(mintSpec{kind: creds.KindApp, key: app.Key, name: "app " + name, hosted: []string{app.Key}, expires: expires, shared: true})
		if err != nil {
			return err
		}
		if err := tx.Create(CollApps, app.ID, app); err != nil {
			return err
		}
		m := Mint{ID: protocol.NewID(), Kind: "app", Key: app.Key, Agents: []string{app.Key}, AccountID: accountID, IssuedAt: ms(now), ExpiresAt: ms(expires)}
		if err := tx.Create(CollMints, m.ID, m); err != nil {
			return err
		}
		seed := k.Seed()
		cf, err := jwt.FormatUserConfig(tok, seed)
		if err != nil {
			return err
		}
		res = AppResult{OK: true, AppID: app.ID, Name: name, PublicKey: app.Key, JWT: tok, Seed: string(seed), Creds: string(cf),
			ExpiresAt: protocol.FormatTime(expires), Mesh: s.meshBlock(), InboxPrefix: protocol.PrivateInboxPrefix(app.Key)}
		return nil
	})
	if errors.Is(err, store.ErrNotFound) {
		return AppResult{}, errs.Newf(errs.NotFound, "no account %s", accountID)
	}
	if err != nil {
		return AppResult{}, txErr(err)
	}
	s.mirrorAccount(ctx, accountID)
	return res, nil
}

// RefreshApp mints a new JWT for an app's existing key.
func (s *Service) RefreshApp(ctx context.Context, accountID, appID string) (AppResult, error) {
	if err := s.minting(); err != nil {
		return AppResult{}, err
	}
	now := s.now()
	expires := s.expiry(now)
	var res AppResult
	err := s.st.RunTx(ctx, func(tx store.Tx) error {
		app, err := s.ownApp(tx, accountID, appID)
		if err != nil {
			return err
		}
		var acct account.Account
		if err := tx.Get(account.CollAccounts, accountID, &acct); err != nil {
			return err
		}
		if acct.Disabled {
			return errs.New(errs.Forbidden, "this account is disabled")
		}
		rev, err := revokedAt(tx, app.Key)
		if err != nil {
			return err
		}
		if app.RevokedAt != 0 {
			return errs.New(errs.Forbidden, "this app was revoked; create a new one")
		}
		tok, err := s.mint(mintSpec{kind: creds.KindApp, key: app.Key, name: "app " + app.Name, hosted: []string{app.Key}, expires: expires, revokedAt: rev, shared: true})
		if err != nil {
			return err
		}
		m := Mint{ID: protocol.NewID(), Kind: "app", Key: app.Key, Agents: []string{app.Key}, AccountID: accountID, IssuedAt: ms(now), ExpiresAt: ms(expires)}
		if err := tx.Create(CollMints, m.ID, m); err != nil {
			return err
		}
		res = AppResult{OK: true, AppID: app.ID, Name: app.Name, PublicKey: app.Key, JWT: tok, ExpiresAt: protocol.FormatTime(expires), Mesh: s.meshBlock(),
			InboxPrefix: protocol.PrivateInboxPrefix(app.Key)}
		return nil
	})
	if err != nil {
		return AppResult{}, txErr(err)
	}
	// A refresh changes no answer, but mends a record the bus lost.
	s.mirrorAccount(ctx, accountID)
	return res, nil
}

// RevokeApp revokes an app: recorded, and its key revoked at the broker.
func (s *Service) RevokeApp(ctx context.Context, accountID, appID string) error {
	var now time.Time
	var key string
	err := s.st.RunTx(ctx, func(tx store.Tx) error {
		now = s.now() // inside the transaction: see recordRevocations
		app, err := s.ownApp(tx, accountID, appID)
		if err != nil {
			return err
		}
		key = app.Key
		if err := recordRevocations(tx, []string{key}, now); err != nil {
			return err
		}
		if app.RevokedAt == 0 {
			return tx.Update(CollApps, appID, map[string]any{"revoked_at": ms(now)})
		}
		return nil
	})
	if err != nil {
		return txErr(err)
	}
	s.mirrorAccount(ctx, accountID)
	return s.revoke(ctx, []string{key}, now)
}

// ListApps lists an account's apps.
func (s *Service) ListApps(ctx context.Context, accountID string) ([]App, error) {
	var apps []App
	err := store.List(ctx, s.st, CollApps, store.Query{Where: []store.Eq{{Field: "account_id", Value: accountID}}, OrderBy: "created_at"}, &apps)
	return apps, txErr(err)
}

func (s *Service) ownApp(tx store.Tx, accountID, appID string) (App, error) {
	var app App
	if err := tx.Get(CollApps, appID, &app); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return app, errs.Newf(errs.NotFound, "no app %s on this account", appID)
		}
		return app, err
	}
	if app.AccountID != accountID {
		return app, errs.Newf(errs.NotFound, "no app %s on this account", appID)
	}
	return app, nil
}

// Agents lists an account's agents.
func (s *Service) Agents(ctx context.Context, accountID string) ([]Agent, error) {
	var out []Agent
	err := store.List(ctx, s.st, CollAgents, store.Query{Where: []store.Eq{{Field: "account_id", Value: accountID}}, OrderBy: "created_at"}, &out)
	return out, txErr(err)
}
