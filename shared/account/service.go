package account

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/passkey"
	"agentmesh.dev/mesh/shared/secret"
	"agentmesh.dev/mesh/shared/store"
)

// Config is what the service needs; New fills defaults.
type Config struct {
	Store    store.Store
	Mail     mail.Sender
	Passkeys *passkey.Service // nil: passkeys unavailable, so no agent key can be minted over HTTP
	Log      *slog.Logger
	Now      func() time.Time
	// ConsoleURL and ControlURL appear in mail and in the command a new
	// agent key comes with.
	ConsoleURL string
	ControlURL string
	SessionTTL time.Duration
	CodeTTL    time.Duration
	// Limits bound sign-up, sign-in and connect per client address, per
	// network, overall and per recipient (limits.go); zero fields take
	// DefaultLimits.
	Limits Limits
}

// Service is the account service.
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
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	if cfg.CodeTTL <= 0 {
		cfg.CodeTTL = DefaultCodeTTL
	}
	cfg.Limits = cfg.Limits.withDefaults()
	return &Service{cfg: cfg, st: cfg.Store, now: cfg.Now, log: cfg.Log}
}

// ConsoleURL is where the web console is served, as configured (mail links
// point there); "" when none is.
func (s *Service) ConsoleURL() string { return s.cfg.ConsoleURL }

// OutboxDir is the directory this service's mail is written to when it is
// not sent at all (meshd with no mail server: a mail.Outbox), so that pages
// can say where a person finds it; "" when mail goes to a mail server.
func (s *Service) OutboxDir() string {
	if o, ok := s.cfg.Mail.(*mail.Outbox); ok {
		return o.Dir()
	}
	return ""
}

const storeDown = "the account store is unavailable; retry shortly"

// unavailable is the 503 of a store that cannot answer.
func unavailable(err error) error {
	if e := errs.FromInput(err); e != nil {
		return e // an id no store can hold came from the request
	}
	return errs.Wrap(errs.Unavailable, storeDown, err)
}

// txErr passes protocol errors through and turns store failures into 503.
func txErr(err error) error { return errs.OrUnavailable(err, storeDown) }

// CreateAccount makes the account for email, or returns the existing one
// (created=false). Used by the operator command and the sign-up route.
func (s *Service) CreateAccount(ctx context.Context, email string) (acct Account, created bool, err error) {
	email, err = NormalizeEmail(email)
	if err != nil {
		return Account{}, false, err
	}
	err = s.st.RunTx(ctx, func(tx store.Tx) error {
		created = false
		var idx emailIndex
		switch err := tx.Get(CollEmails, email, &idx); {
		case err == nil:
			return tx.Get(CollAccounts, idx.AccountID, &acct)
		case !errors.Is(err, store.ErrNotFound):
			return err
		}
		created = true
		acct, err = s.newAccount(tx, email)
		return err
	})
	return acct, created, txErr(err)
}

// newAccount writes a new account for email, an address with none, in tx
// (after its reads).
func (s *Service) newAccount(tx store.Tx, email string) (Account, error) {
	acct := newAccount(email, s.now())
	return acct, createIn(tx, acct)
}

// GetAccount reads an account.
func (s *Service) GetAccount(ctx context.Context, id string) (Account, error) {
	var a Account
	err := store.Get(ctx, s.st, CollAccounts, id, &a)
	if errors.Is(err, store.ErrNotFound) {
		return a, errs.Newf(errs.NotFound, "no account %s", id)
	}
	return a, txErr(err)
}

// AccountByEmail finds the account of an address.
func (s *Service) AccountByEmail(ctx context.Context, email string) (Account, error) {
	email, err := NormalizeEmail(email)
	if err != nil {
		return Account{}, err
	}
	var a Account
	err = s.st.RunTx(ctx, func(tx store.Tx) error {
		var idx emailIndex
		if err := tx.Get(CollEmails, email, &idx); err != nil {
			return err
		}
		return tx.Get(CollAccounts, idx.AccountID, &a)
	})
	if errors.Is(err, store.ErrNotFound) {
		return a, errs.New(errs.NotFound, "no account for that address")
	}
	return a, txErr(err)
}

// StartLogin mails a one-time code to email for the client at from (its
// httpx.ClientKey). With create set (sign-up) the account is made when
// missing; without it an unknown address gets no mail but the same answer,
// so the route cannot be used to probe who has an account. Either way the
// request counts against the route's limits and the recipient's (see
// Limits), in the transaction that records the code, before any mail.
func (s *Service) StartLogin(ctx context.Context, email string, create bool, from string) (string, error) {
	email, err := NormalizeEmail(email)
	if err != nil {
		return "", err
	}
	rt := routeSignIn
	if create {
		rt = routeSignUp
	}
	code := secret.Digits(6)
	now := s.now()
	rec := loginCode{Code: secret.NewCode(email, code, now.Add(s.cfg.CodeTTL), CodeAttempts), Email: email}
	send := false
	err = s.st.RunTx(ctx, func(tx store.Tx) error {
		send = false
		var idx emailIndex
		found := true
		if err := tx.Get(CollEmails, email, &idx); errors.Is(err, store.ErrNotFound) {
			found = false
		} else if err != nil {
			return err
		}
		if err := s.take(tx, rt, from, email, now); err != nil {
			return err
		}
		if !found {
			if !create {
				return nil // counted, but an unknown address is not mailed
			}
			if _, err := s.newAccount(tx, email); err != nil {
				return err
			}
		}
		send = true
		return tx.Set(CollCodes, codeID(email), rec)
	})
	if err != nil {
		return email, txErr(err)
	}
	if !send {
		return email, nil
	}
	link := ""
	if s.cfg.ConsoleURL != "" {
		link = fmt.Sprintf("\nOr open %s/login?email=%s and enter it there.\n", strings.TrimRight(s.cfg.ConsoleURL, "/"), url.QueryEscape(email))
	}
	body := fmt.Sprintf("Your sign-in code is %s\n\nIt works once, for %d minutes.%s\nIf you did not ask to sign in, ignore this message.\n",
		code, int(s.cfg.CodeTTL/time.Minute), link)
	if err := s.cfg.Mail.Send(ctx, mail.Message{To: email, Subject: "Your sign-in code", Text: body, Kind: "login-code"}); err != nil {
		return email, errs.Wrap(errs.DependencyFailed, "the sign-in code could not be mailed; try again", err)
	}
	return email, nil
}

func codeID(email string) string { return secret.Hash("login\x00" + email) }

// VerifyLogin exchanges a mailed code for a session. A code works once;
// five wrong tries burn it.
func (s *Service) VerifyLogin(ctx context.Context, email, code string) (token string, sess Session, acct Account, err error) {
	email, err = NormalizeEmail(email)
	if err != nil {
		return "", Session{}, Account{}, err
	}
	code = strings.TrimSpace(code)
	now := s.now()
	token = secret.Token(SessionPrefix)
	var outcome error
	err = s.st.RunTx(ctx, func(tx store.Tx) error {
		outcome = nil
		var rec loginCode
		if err := tx.Get(CollCodes, codeID(email), &rec); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				outcome = errs.New(errs.Unauthorized, "no sign-in code is pending for that address; request a new one")
				return nil
			}
			return err
		}
		var idx emailIndex
		if err := tx.Get(CollEmails, email, &idx); err != nil {
			return err
		}
		if err := tx.Get(CollAccounts, idx.AccountID, &acct); err != nil {
			return err
		}
		switch rec.Check(email, code, now) {
		case secret.CodeExpired:
			outcome = errs.New(errs.Unauthorized, "that sign-in code has expired; request a new one")
			return tx.Delete(CollCodes, codeID(email))
		case secret.CodeBurned:
			outcome = errs.New(errs.Unauthorized, "wrong code, and that was the last try; request a new one")
			return tx.Delete(CollCodes, codeID(email))
		case secret.CodeWrong:
			outcome = errs.Newf(errs.Unauthorized, "wrong code; %d tries left", rec.AttemptsLeft)
			return tx.Set(CollCodes, codeID(email), rec)
		}
		switch {
		case acct.Disabled:
			outcome = errs.New(errs.Forbidden, "this account is disabled")
			return nil
		}
		sess = Session{ID: secret.Hash(token), AccountID: acct.ID, CreatedAt: ms(now), ExpiresAt: ms(now.Add(s.cfg.SessionTTL))}
		if err := tx.Delete(CollCodes, codeID(email)); err != nil {
			return err
		}
		if !acct.Verified {
			acct.Verified = true
			if err := tx.Update(CollAccounts, acct.ID, map[string]any{"verified": true}); err != nil {
				return err
			}
		}
		return tx.Create(CollSessions, sess.ID, sess)
	})
	if err != nil {
		return "", Session{}, Account{}, txErr(err)
	}
	if outcome != nil {
		return "", Session{}, Account{}, outcome
	}
	return token, sess, acct, nil
}

// SignOut ends the session behind token.
func (s *Service) SignOut(ctx context.Context, token string) error {
	id := secret.Hash(token)
	err := s.st.RunTx(ctx, func(tx store.Tx) error {
		var sess Session
		if err := tx.Get(CollSessions, id, &sess); err != nil {
			return err
		}
		return tx.Update(CollSessions, id, map[string]any{"revoked": true})
	})
	if errors.Is(err, store.ErrNotFound) {
		return errNoSession
	}
	return txErr(err)
}

// Principal is who an account route is acting for.
type Principal struct {
	AccountID string
	Account   Account
	// Via is "session" or "api_token".
	Via       string
	SessionID string
	Scopes    []string
	PasskeyAt time.Time
}

// HasScope reports whether an API token carries scope (sessions carry all).
func (p *Principal) HasScope(scope string) bool {
	return p.Via == "session" || slices.Contains(p.Scopes, scope)
}

// errNoSession is the one 401 every account route answers with, whatever
// was wrong (no token, a bad one, another account's, an unknown account):
// the answer must not tell a prober which.
var errNoSession = errs.New(errs.Unauthorized, "sign in required: send Authorization: Bearer <session token>")

// Authenticate resolves a bearer token for the account in the path.
// allowAPIScope names the scope an amt_ token must carry to be accepted on
// this route; "" means sessions only.
func (s *Service) Authenticate(ctx context.Context, accountID, bearer, allowAPIScope string) (*Principal, error) {
	if bearer == "" || accountID == "" {
		return nil, errNoSession
	}
	now := s.now()
	p := &Principal{AccountID: accountID}
	err := s.st.RunTx(ctx, func(tx store.Tx) error {
		switch {
		case strings.HasPrefix(bearer, SessionPrefix):
			var sess Session
			if err := tx.Get(CollSessions, secret.Hash(bearer), &sess); err != nil {
				return err
			}
			if sess.Revoked || now.UnixMilli() >= sess.ExpiresAt || sess.AccountID != accountID {
				return errNoSession
			}
			p.Via, p.SessionID = "session", sess.ID
			if sess.PasskeyAt > 0 {
				p.PasskeyAt = time.UnixMilli(sess.PasskeyAt)
			}
		case strings.HasPrefix(bearer, APITokenPrefix) && allowAPIScope != "":
			var t APIToken
			if err := tx.Get(CollAPITokens, secret.Hash(bearer), &t); err != nil {
				return err
			}
			if t.RevokedAt != 0 || t.AccountID != accountID || !slices.Contains(t.Scopes, allowAPIScope) {
				return errNoSession
			}
			p.Via, p.Scopes = "api_token", t.Scopes
		default:
			return errNoSession
		}
		return tx.Get(CollAccounts, accountID, &p.Account)
	})
	switch {
	case err == nil:
	case errors.Is(err, store.ErrNotFound), errors.Is(err, errNoSession):
		return nil, errNoSession
	default:
		return nil, unavailable(err)
	}
	if p.Account.Disabled {
		return nil, errNoSession
	}
	return p, nil
}

// SessionAccount resolves a session token on its own (for routes without an
// account id in the path, such as sign-out and "who am I").
func (s *Service) SessionAccount(ctx context.Context, bearer string) (*Principal, error) {
	if !strings.HasPrefix(bearer, SessionPrefix) {
		return nil, errNoSession
	}
	var sess Session
	err := store.Get(ctx, s.st, CollSessions, secret.Hash(bearer), &sess)
	if errors.Is(err, store.ErrNotFound) {
		return nil, errNoSession
	} else if err != nil {
		return nil, unavailable(err)
	}
	return s.Authenticate(ctx, sess.AccountID, bearer, "")
}

// Known API token scopes.
var Scopes = []string{"audit", "read"}

// CreateAPIToken makes an amt_ token. Only a session may create one.
func (s *Service) CreateAPIToken(ctx context.Context, p *Principal, name string, scopes []string) (string, APIToken, error) {
	if p.Via != "session" {
		return "", APIToken{}, errs.New(errs.Forbidden, "API tokens are created from a signed-in session, not with another token")
	}
	name, err := CheckLabel(name)
	if err != nil {
		return "", APIToken{}, err
	}
	for _, sc := range scopes {
		if !slices.Contains(Scopes, sc) {
			return "", APIToken{}, errs.Newf(errs.InvalidRequest, "unknown scope %q (known: %s)", sc, strings.Join(Scopes, ", "))
		}
	}
	tok := secret.Token(APITokenPrefix)
	h := secret.Hash(tok)
	t := APIToken{ID: publicID(h), Hash: h, AccountID: p.AccountID, Name: name, Scopes: append([]string{}, scopes...), CreatedAt: ms(s.now())}
	if err := s.st.RunTx(ctx, func(tx store.Tx) error { return tx.Create(CollAPITokens, h, t) }); err != nil {
		return "", APIToken{}, unavailable(err)
	}
	return tok, t, nil
}

// ListAPITokens lists an account's tokens, newest first.
func (s *Service) ListAPITokens(ctx context.Context, p *Principal) ([]APIToken, error) {
	var out []APIToken
	err := store.List(ctx, s.st, CollAPITokens, store.Query{Where: []store.Eq{{Field: "account_id", Value: p.AccountID}}, OrderBy: "created_at", Desc: true}, &out)
	return out, txErr(err)
}

// RevokeAPIToken revokes one of the account's tokens by its public id.
func (s *Service) RevokeAPIToken(ctx context.Context, p *Principal, id string) error {
	if p.Via != "session" {
		return errs.New(errs.Forbidden, "API tokens are revoked from a signed-in session")
	}
	err := s.st.RunTx(ctx, func(tx store.Tx) error {
		var ts []APIToken
		if err := tx.Query(CollAPITokens, store.Where("account_id", p.AccountID, "id", id), &ts); err != nil {
			return err
		}
		if len(ts) == 0 {
			return errs.Newf(errs.NotFound, "no API token %s on this account", id)
		}
		return tx.Update(CollAPITokens, ts[0].Hash, map[string]any{"revoked_at": ms(s.now())})
	})
	return txErr(err)
}
