package account

// Connect: an app asks for credentials on a person's account by naming the
// person's email address (spec §4.4, POST /v1/connect and
// POST /v1/connect/status).
//
// Two ways in:
//
//   - Session fast path. The request carries the session token of the
//     account that owns the address: the app is issued at once.
//   - Mailed code. Anyone else gets a connect request: the account is made if
//     the address has none (as sign-up does), a 6-digit code is mailed with a
//     sentence naming the app, and the app polls the request, giving the code
//     once the person has told it. The answer is the same whether or not the
//     account existed.
//
// Handing the credentials out exactly once. The credential service makes
// the app (and its seed, which is never stored), but it imports this
// package, so this package cannot call it directly: it names the one method
// it needs (AppIssuer) and the HTTP layer adapts the credential service to
// it. Approval then runs in three steps, each its own store transaction:
//
//  1. approve: the right code flips the request pending → approved and
//     records a random claim token. Only the call whose transaction made
//     that flip holds the claim; every other call, including one racing with
//     the same right code, reads "approved" and creates nothing.
//  2. issue: the claim holder asks the AppIssuer for the app.
//  3. complete: approved → connected with the app id, only if the claim is
//     still the holder's. The holder hands the credentials out only after
//     this committed; if it did not, the app is revoked and nothing is
//     handed out.
//
// When issuing fails (the account is at its app limit, the store is away),
// the claim is released (approved → pending): the code still works until
// the request expires. A holder that dies between steps 1 and 3 leaves the
// request approved; it then reads as expired once its 15 minutes are up and
// the app connects again. No call ever takes a live claim over, so no two
// calls can both issue.
//
// A connected request keeps its app id; later status calls answer
// "connected" with that id and no seed.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/secret"
	"agentmesh.dev/mesh/shared/store"
)

// CollConnects holds connect requests; id: the request id (a UUIDv7).
const CollConnects = "connect_requests"

// Connect request statuses. "approved" is stored while the approving call
// issues the app and reads as pending; "expired" is never stored: a request
// not connected or denied by its deadline reads as expired.
const (
	ConnectPending   = "pending"
	ConnectApproved  = "approved"
	ConnectConnected = "connected"
	ConnectDenied    = "denied"
	ConnectExpired   = "expired"
)

// ConnectPollAfter is how long an app waits between status polls.
const ConnectPollAfter = 2 * time.Second

// ConnectRequest is a connect request as stored. The code is kept only as
// its hash.
type ConnectRequest struct {
	ID           string `json:"id"`
	Email        string `json:"email"`
	AccountID    string `json:"account_id"`
	AppName      string `json:"app_name"`
	CodeHash     string `json:"code_hash"`
	CreatedAt    int64  `json:"created_at"`
	ExpiresAt    int64  `json:"expires_at"`
	AttemptsLeft int    `json:"attempts_left"`
	Status       string `json:"status"`
	// Claim is the token of the call that approved the request and is
	// issuing the app; set only while the status is approved.
	Claim        string `json:"claim,omitempty"`
	ApprovedAt   int64  `json:"approved_at,omitempty"`
	AppID        string `json:"app_id,omitempty"`
	ConnectedAt  int64  `json:"connected_at,omitempty"`
	DeniedReason string `json:"denied_reason,omitempty"` // wrong_code or account_disabled
}

// AppIssuer makes the app a connect is approved for. The credential service
// does the work; the HTTP layer adapts it and keeps the credentials of the
// app it made, to hand them out with its answer.
type AppIssuer interface {
	// IssueApp makes an app called name on the account and returns its id.
	IssueApp(ctx context.Context, accountID, name string) (appID string, err error)
	// RevokeApp revokes an issued app whose credentials will not be handed
	// out after all.
	RevokeApp(ctx context.Context, accountID, appID string) error
}

// ConnectStart is the result of StartConnect: either the app was issued at
// once (session fast path) or a code was mailed and the app polls RequestID.
type ConnectStart struct {
	// Connected: the session fast path; the AppIssuer made AppID in this
	// call and its credentials are handed out with this answer.
	Connected bool
	AccountID string
	AppID     string
	// RequestID and ExpiresAt are set when a code was mailed.
	RequestID string
	ExpiresAt time.Time
}

// ConnectState is a connect request as a status call sees it.
type ConnectState struct {
	RequestID string
	// Status is pending, expired, denied or connected.
	Status    string
	AppName   string
	AppID     string // when connected
	ExpiresAt time.Time
	// Issued: this call approved the request and the AppIssuer made AppID;
	// its credentials go out with this answer and never again.
	Issued    bool
	AccountID string // set when Issued
}

// StartConnect begins connecting an app called appName to the account of
// email, for the client at from (its httpx.ClientKey). bearer is the
// request's bearer token, if any: a session of the account that owns email
// issues the app at once through apps. Anything else (no token, another
// account's, a bad one) takes the mailed-code path, which counts against
// the connect limits and the recipient's (see Limits) in the transaction
// that records the request, before the mail.
func (s *Service) StartConnect(ctx context.Context, email, appName, bearer, from string, apps AppIssuer) (ConnectStart, error) {
	email, err := NormalizeEmail(email)
	if err != nil {
		return ConnectStart{}, err
	}
	appName, err = checkAppName(appName)
	if err != nil {
		return ConnectStart{}, err
	}
	if strings.HasPrefix(bearer, SessionPrefix) {
		p, err := s.SessionAccount(ctx, bearer)
		switch {
		case err == nil && p.Account.Email == email:
			appID, err := apps.IssueApp(ctx, p.AccountID, appName)
			if err != nil {
				return ConnectStart{}, err
			}
			return ConnectStart{Connected: true, AccountID: p.AccountID, AppID: appID}, nil
		case err != nil && !errors.Is(err, errNoSession):
			return ConnectStart{}, err // the store could not answer: retry, rather than mail a code
		}
	}
	now := s.now()
	code := secret.Digits(6)
	req := ConnectRequest{ID: protocol.NewID(), Email: email, AppName: appName,
		CreatedAt: ms(now), ExpiresAt: ms(now.Add(s.cfg.CodeTTL)), AttemptsLeft: CodeAttempts, Status: ConnectPending}
	req.CodeHash = secret.HashCode(connectCodeContext(req.ID), code)
	err = s.st.RunTx(ctx, func(tx store.Tx) error {
		req.AccountID = ""
		var idx emailIndex
		found := true
		if err := tx.Get(CollEmails, email, &idx); errors.Is(err, store.ErrNotFound) {
			found = false
		} else if err != nil {
			return err
		}
		if err := s.take(tx, routeConnect, from, email, now); err != nil {
			return err
		}
		req.AccountID = idx.AccountID
		if !found {
			acct, err := s.newAccount(tx, email)
			if err != nil {
				return err
			}
			req.AccountID = acct.ID
		}
		return tx.Create(CollConnects, req.ID, req)
	})
	if err != nil {
		return ConnectStart{}, txErr(err)
	}
	body := fmt.Sprintf("An app called %q asks to connect to your agentmesh account (%s).\n\n"+
		"If you started this, give the app this code:\n\n    %s\n\n"+
		"The code works once, for %d minutes. With it the app gets its own credentials on your account; you can revoke them in the console at any time.\n"+
		"If you did not ask for this, ignore this message: without the code the app gets nothing.\n",
		appName, email, code, int(s.cfg.CodeTTL/time.Minute))
	if err := s.cfg.Mail.Send(ctx, mail.Message{To: email, Subject: "Approve an app on your agentmesh account", Text: body, Kind: "connect-code"}); err != nil {
		return ConnectStart{}, errs.Wrap(errs.DependencyFailed, "the approval code could not be mailed; try again", err)
	}
	return ConnectStart{RequestID: req.ID, ExpiresAt: time.UnixMilli(req.ExpiresAt)}, nil
}

// ConnectStatus reports a connect request, and with code approves it. The
// right code approves the request once: that call alone issues the app
// through apps (Issued set). A wrong code costs one of five tries, and the
// last wrong try denies the request. A code given for a request that is no
// longer pending is not checked: the answer is its status.
func (s *Service) ConnectStatus(ctx context.Context, id, code string, apps AppIssuer) (ConnectState, error) {
	id = strings.TrimSpace(id)
	if id == "" {
		return ConnectState{}, errs.New(errs.InvalidRequest, "request_id is required: the id POST /v1/connect answered with")
	}
	if !looksLikeUUID(id) {
		return ConnectState{}, errNoConnect(id)
	}
	code = strings.TrimSpace(code)
	if code == "" {
		var r ConnectRequest
		err := store.Get(ctx, s.st, CollConnects, id, &r)
		if errors.Is(err, store.ErrNotFound) {
			return ConnectState{}, errNoConnect(id)
		} else if err != nil {
			return ConnectState{}, unavailable(err)
		}
		return s.connectView(r), nil
	}

	claim := secret.Token("claim_")
	now := s.now()
	var (
		r       ConnectRequest
		outcome error
		claimed bool
	)
	err := s.st.RunTx(ctx, func(tx store.Tx) error {
		outcome, claimed = nil, false
		if err := tx.Get(CollConnects, id, &r); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				outcome = errNoConnect(id)
				return nil
			}
			return err
		}
		if r.Status != ConnectPending || now.UnixMilli() >= r.ExpiresAt {
			if r.Status == ConnectApproved && now.UnixMilli() < r.ExpiresAt {
				outcome = errs.New(errs.Conflict, "another call gave the code and is creating the app; poll without the code").
					WithRetryAfter(ConnectPollAfter.Milliseconds())
			}
			return nil // nothing to approve: the answer is the status
		}
		var acct Account
		switch err := tx.Get(CollAccounts, r.AccountID, &acct); {
		case errors.Is(err, store.ErrNotFound):
			acct.Disabled = true // the account is gone: nothing to connect to
		case err != nil:
			return err
		}
		switch {
		case !secret.Equal(r.CodeHash, secret.HashCode(connectCodeContext(id), code)):
			r.AttemptsLeft--
			if r.AttemptsLeft <= 0 {
				r.Status, r.DeniedReason = ConnectDenied, "wrong_code"
				outcome = errs.New(errs.Unauthorized, "wrong code, and that was the last try: the request is denied; start again with POST /v1/connect")
			} else {
				outcome = errs.Newf(errs.Unauthorized, "wrong code; %d tries left", r.AttemptsLeft).WithDetail("attempts_left", r.AttemptsLeft)
			}
			return tx.Set(CollConnects, id, r)
		case acct.Disabled:
			r.Status, r.DeniedReason = ConnectDenied, "account_disabled"
			outcome = errs.New(errs.Forbidden, "this account is disabled")
			return tx.Set(CollConnects, id, r)
		}
		if !acct.Verified { // the code proved the address, as a sign-in code does
			if err := tx.Update(CollAccounts, acct.ID, map[string]any{"verified": true}); err != nil {
				return err
			}
		}
		r.Status, r.Claim, r.ApprovedAt = ConnectApproved, claim, ms(now)
		claimed = true
		return tx.Set(CollConnects, id, r)
	})
	if err != nil {
		return ConnectState{}, txErr(err)
	}
	if outcome != nil {
		return ConnectState{}, outcome
	}
	if !claimed {
		return s.connectView(r), nil
	}

	// This call holds the claim: issue the app, then record it.
	appID, err := apps.IssueApp(ctx, r.AccountID, r.AppName)
	if err != nil {
		if rerr := s.releaseConnect(context.WithoutCancel(ctx), id, claim); rerr != nil {
			s.log.Warn("connect: issuing the app failed and the claim could not be released", "request", id, "err", rerr)
		}
		return ConnectState{}, err
	}
	done, err := s.completeConnect(ctx, id, claim, appID)
	if err != nil || !done {
		// The credentials must not go out unrecorded: take the app back.
		bg := context.WithoutCancel(ctx)
		if rerr := apps.RevokeApp(bg, r.AccountID, appID); rerr != nil {
			s.log.Error("connect: an app issued for a request that could not record it was not revoked", "request", id, "app", appID, "err", rerr)
		}
		if err != nil {
			if rerr := s.releaseConnect(bg, id, claim); rerr != nil {
				s.log.Warn("connect: claim not released", "request", id, "err", rerr)
			}
			return ConnectState{}, err
		}
		return ConnectState{}, errs.New(errs.Conflict, "this request was completed by another call; poll without the code")
	}
	st := s.connectView(r)
	st.Status, st.AppID, st.Issued, st.AccountID = ConnectConnected, appID, true, r.AccountID
	return st, nil
}

// completeConnect records the issued app on the request: approved →
// connected, if claim is still the holder's. done is false when it is not.
func (s *Service) completeConnect(ctx context.Context, id, claim, appID string) (done bool, err error) {
	now := s.now()
	err = s.st.RunTx(ctx, func(tx store.Tx) error {
		done = false
		var r ConnectRequest
		if err := tx.Get(CollConnects, id, &r); err != nil {
			return err
		}
		if r.Status != ConnectApproved || !secret.Equal(r.Claim, claim) {
			return nil
		}
		r.Status, r.Claim, r.AppID, r.ConnectedAt = ConnectConnected, "", appID, ms(now)
		done = true
		return tx.Set(CollConnects, id, r)
	})
	return done, txErr(err)
}

// releaseConnect gives a claim back (approved → pending), so the code
// works again; a claim that is no longer the holder's is left alone.
func (s *Service) releaseConnect(ctx context.Context, id, claim string) error {
	err := s.st.RunTx(ctx, func(tx store.Tx) error {
		var r ConnectRequest
		if err := tx.Get(CollConnects, id, &r); err != nil {
			return err
		}
		if r.Status != ConnectApproved || !secret.Equal(r.Claim, claim) {
			return nil
		}
		r.Status, r.Claim, r.ApprovedAt = ConnectPending, "", 0
		return tx.Set(CollConnects, id, r)
	})
	return txErr(err)
}

// connectView is what a status call may see of a request.
func (s *Service) connectView(r ConnectRequest) ConnectState {
	st := ConnectState{RequestID: r.ID, Status: r.Status, AppName: r.AppName, AppID: r.AppID, ExpiresAt: time.UnixMilli(r.ExpiresAt)}
	switch r.Status {
	case ConnectPending, ConnectApproved:
		st.Status = ConnectPending
		if s.now().UnixMilli() >= r.ExpiresAt {
			st.Status = ConnectExpired
		}
	}
	return st
}

func connectCodeContext(id string) string { return "connect\x00" + id }

func errNoConnect(id string) error {
	return errs.Newf(errs.NotFound, "no connect request %s", id)
}

// checkAppName validates the name the person sees in the approval mail
// (the rules of CheckLabel, which app creation applies too).
func checkAppName(n string) (string, error) {
	n = strings.TrimSpace(n)
	switch {
	case n == "":
		return "", errs.New(errs.InvalidRequest, "app_name is required: the name the person sees in the approval mail, e.g. \"dashboard\"")
	case len(n) > MaxLabel:
		return "", errs.Newf(errs.InvalidRequest, "app_name is longer than %d bytes", MaxLabel)
	}
	if err := CheckVisible("app_name", n); err != nil {
		return "", err
	}
	return n, nil
}

// looksLikeUUID reports whether id has the 8-4-4-4-12 lower-case hex shape
// of a request id, so that anything else is refused without a store read.
func looksLikeUUID(id string) bool {
	if len(id) != 36 {
		return false
	}
	for i, c := range id {
		switch {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if c != '-' {
				return false
			}
		case '0' <= c && c <= '9', 'a' <= c && c <= 'f':
		default:
			return false
		}
	}
	return true
}
