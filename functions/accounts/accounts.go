// Package accounts is the account surface of the control plane: sign-up and
// sign-in by mailed code, sessions, API tokens, passkeys, agent keys, apps
// and capabilities. Each route is its own Cloud Function; meshd mounts them
// all on one mux.
package accounts

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"agentmesh.dev/mesh/functions/api"
	"agentmesh.dev/mesh/functions/cloud"
	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/httpx"
	"agentmesh.dev/mesh/shared/protocol"
)

// Routes is the group's route table.
var Routes = []httpx.Route{
	{EntryPoint: "AccountCreate", Method: "POST", Path: "/v1/accounts"},
	{EntryPoint: "Login", Method: "POST", Path: "/v1/login"},
	{EntryPoint: "LoginVerify", Method: "POST", Path: "/v1/login/verify"},
	{EntryPoint: "Logout", Method: "POST", Path: "/v1/logout"},
	{EntryPoint: "SessionInfo", Method: "GET", Path: "/v1/session"},
	{EntryPoint: "APITokenCreate", Method: "POST", Path: "/v1/accounts/{id}/api-tokens"},
	{EntryPoint: "APITokenList", Method: "GET", Path: "/v1/accounts/{id}/api-tokens"},
	{EntryPoint: "APITokenRevoke", Method: "DELETE", Path: "/v1/accounts/{id}/api-tokens/{token}"},
	{EntryPoint: "PasskeyBegin", Method: "POST", Path: "/v1/accounts/{id}/passkeys/{kind}/begin"},
	{EntryPoint: "PasskeyFinish", Method: "POST", Path: "/v1/accounts/{id}/passkeys/{kind}/finish"},
	{EntryPoint: "AgentTokenCreate", Method: "POST", Path: "/v1/accounts/{id}/agent-tokens"},
	{EntryPoint: "AgentTokenList", Method: "GET", Path: "/v1/accounts/{id}/agent-tokens"},
	{EntryPoint: "AgentTokenRevoke", Method: "DELETE", Path: "/v1/accounts/{id}/agent-tokens/{key}"},
	{EntryPoint: "AppCreate", Method: "POST", Path: "/v1/accounts/{id}/apps"},
	{EntryPoint: "AppList", Method: "GET", Path: "/v1/accounts/{id}/apps"},
	{EntryPoint: "AppRefresh", Method: "POST", Path: "/v1/accounts/{id}/apps/{app}/refresh"},
	{EntryPoint: "AppRevoke", Method: "DELETE", Path: "/v1/accounts/{id}/apps/{app}"},
	{EntryPoint: "AccountAgents", Method: "GET", Path: "/v1/accounts/{id}/agents"},
	{EntryPoint: "AccountActivity", Method: "GET", Path: "/v1/accounts/{id}/activity"},
	{EntryPoint: "SubscriptionList", Method: "GET", Path: "/v1/accounts/{id}/subscriptions"},
	{EntryPoint: "SubscriptionAdd", Method: "POST", Path: "/v1/accounts/{id}/subscriptions"},
	{EntryPoint: "SubscriptionRemove", Method: "DELETE", Path: "/v1/accounts/{id}/subscriptions/{agent}"},
	{EntryPoint: "Capabilities", Method: "GET", Path: "/v1/capabilities"},
	{EntryPoint: "Connect", Method: "POST", Path: "/v1/connect"},
	{EntryPoint: "ConnectStatus", Method: "POST", Path: "/v1/connect/status"},
}

// Group is the function group.
var Group = api.Group{Routes: Routes, Handler: handler}

// Each route is its own Cloud Function, built on its first request.
func init() { Group.RegisterFunctions(cloud.Deps) }

func handler(d *api.Deps, rt httpx.Route) httpx.HandlerFunc {
	if d.Accounts == nil && rt.EntryPoint != "Capabilities" {
		return api.NotConfigured("the account service")
	}
	h := &handlers{d: d, acc: d.Accounts}
	switch rt.EntryPoint {
	case "AccountCreate":
		return h.startLogin(true)
	case "Login":
		return h.startLogin(false)
	case "LoginVerify":
		return h.verify
	case "Logout":
		return h.logout
	case "SessionInfo":
		return h.session
	case "APITokenCreate":
		return h.authed("", h.createAPIToken)
	case "APITokenList":
		return h.authed("", h.listAPITokens)
	case "APITokenRevoke":
		return h.authed("", h.revokeAPIToken)
	case "PasskeyBegin":
		return h.authed("", h.passkeyBegin)
	case "PasskeyFinish":
		return h.authed("", h.passkeyFinish)
	case "AgentTokenCreate":
		return h.authed("", h.createAgentToken)
	case "AgentTokenList":
		return h.authed("read", h.listAgentTokens)
	case "AgentTokenRevoke":
		return h.authed("", h.revokeAgentToken)
	case "AccountAgents", "AccountActivity", "SubscriptionList", "SubscriptionAdd", "SubscriptionRemove":
		if d.Views == nil {
			return api.NotConfigured("the account views (no bus connection)")
		}
		scope := map[string]string{"AccountAgents": "read", "AccountActivity": "read", "SubscriptionList": "read"}[rt.EntryPoint]
		return h.authed(scope, h.viewRoute(rt.EntryPoint))
	case "AppCreate", "AppList", "AppRefresh", "AppRevoke":
		if d.Credentials == nil {
			return api.NotConfigured("the credential service")
		}
		return h.authed(map[string]string{"AppList": "read"}[rt.EntryPoint], h.appRoute(rt.EntryPoint))
	case "Capabilities":
		return h.capabilities
	case "Connect", "ConnectStatus":
		if d.Credentials == nil {
			return api.NotConfigured("the credential service")
		}
		if rt.EntryPoint == "Connect" {
			return h.connect
		}
		return h.connectStatus
	}
	panic("accounts: no handler for " + rt.EntryPoint)
}

type handlers struct {
	d   *api.Deps
	acc *account.Service
}

func ok(w http.ResponseWriter, status int, v map[string]any) error {
	v["ok"] = true
	httpx.WriteJSON(w, status, v)
	return nil
}

func (h *handlers) startLogin(create bool) httpx.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		var b struct {
			Email string `json:"email"`
		}
		if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true}); err != nil {
			return err
		}
		email, err := h.acc.StartLogin(r.Context(), b.Email, create, httpx.ClientKey(r, h.d.TrustedProxyHops))
		if err != nil {
			return err
		}
		return ok(w, http.StatusAccepted, map[string]any{"email": email, "delivery": "email",
			"next": "POST /v1/login/verify with {email, code} from the mail"})
	}
}

func (h *handlers) verify(w http.ResponseWriter, r *http.Request) error {
	var b struct {
		Email string `json:"email"`
		Code  string `json:"code"`
	}
	if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true}); err != nil {
		return err
	}
	tok, sess, acct, err := h.acc.VerifyLogin(r.Context(), b.Email, b.Code)
	if err != nil {
		return err
	}
	return ok(w, http.StatusOK, map[string]any{"token": tok, "account_id": acct.ID, "email": acct.Email,
		"expires_at": protocol.FormatTime(msTime(sess.ExpiresAt))})
}

func (h *handlers) logout(w http.ResponseWriter, r *http.Request) error {
	if err := h.acc.SignOut(r.Context(), httpx.BearerToken(r)); err != nil {
		return err
	}
	return ok(w, http.StatusOK, map[string]any{})
}

func (h *handlers) session(w http.ResponseWriter, r *http.Request) error {
	p, err := h.acc.SessionAccount(r.Context(), httpx.BearerToken(r))
	if err != nil {
		return err
	}
	n, err := h.acc.PasskeyCount(r.Context(), p.AccountID)
	if err != nil {
		return err
	}
	return ok(w, http.StatusOK, map[string]any{"account_id": p.AccountID, "email": p.Account.Email,
		"operator_name": p.Account.OperatorName, "passkeys": n, "passkey_fresh": h.acc.Fresh(p)})
}

// authed resolves the principal for the account in the path. scope names
// the amt_ scope that may stand in for a session ("" = sessions only).
func (h *handlers) authed(scope string, fn func(w http.ResponseWriter, r *http.Request, p *account.Principal) error) httpx.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		p, err := h.acc.Authenticate(r.Context(), r.PathValue("id"), httpx.BearerToken(r), scope)
		if err != nil {
			return err
		}
		return fn(w, r, p)
	}
}

func (h *handlers) createAPIToken(w http.ResponseWriter, r *http.Request, p *account.Principal) error {
	var b struct {
		Name   string   `json:"name"`
		Scopes []string `json:"scopes"`
	}
	if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true}); err != nil {
		return err
	}
	tok, t, err := h.acc.CreateAPIToken(r.Context(), p, b.Name, b.Scopes)
	if err != nil {
		return err
	}
	return ok(w, http.StatusCreated, map[string]any{"token": tok, "id": t.ID, "name": t.Name, "scopes": t.Scopes})
}

func (h *handlers) listAPITokens(w http.ResponseWriter, r *http.Request, p *account.Principal) error {
	ts, err := h.acc.ListAPITokens(r.Context(), p)
	if err != nil {
		return err
	}
	out := make([]map[string]any, 0, len(ts))
	for _, t := range ts {
		out = append(out, map[string]any{"id": t.ID, "name": t.Name, "scopes": t.Scopes,
			"created_at": protocol.FormatTime(msTime(t.CreatedAt)), "revoked": t.RevokedAt != 0})
	}
	return ok(w, http.StatusOK, map[string]any{"tokens": out})
}

func (h *handlers) revokeAPIToken(w http.ResponseWriter, r *http.Request, p *account.Principal) error {
	if err := h.acc.RevokeAPIToken(r.Context(), p, r.PathValue("token")); err != nil {
		return err
	}
	return ok(w, http.StatusOK, map[string]any{})
}

func (h *handlers) passkeyBegin(w http.ResponseWriter, r *http.Request, p *account.Principal) error {
	opts, id, err := h.acc.BeginPasskey(r.Context(), p, r.PathValue("kind"))
	if err != nil {
		return err
	}
	return ok(w, http.StatusOK, map[string]any{"ceremony": id, "options": opts})
}

func (h *handlers) passkeyFinish(w http.ResponseWriter, r *http.Request, p *account.Principal) error {
	var b struct {
		Ceremony string          `json:"ceremony"`
		Response json.RawMessage `json:"response"`
	}
	if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true}); err != nil {
		return err
	}
	if b.Ceremony == "" || len(b.Response) == 0 {
		return errs.New(errs.InvalidRequest, "ceremony and response are required")
	}
	res, err := h.acc.FinishPasskey(r.Context(), p, b.Ceremony, b.Response)
	if err != nil {
		return err
	}
	return ok(w, http.StatusOK, map[string]any{"registered": res.Registered, "passkey_fresh": res.Fresh})
}

func (h *handlers) createAgentToken(w http.ResponseWriter, r *http.Request, p *account.Principal) error {
	var b struct {
		Name         string `json:"name"`
		OperatorName string `json:"operator_name"`
	}
	if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true}); err != nil {
		return err
	}
	g, err := h.acc.MintAgentKey(r.Context(), p, b.Name, b.OperatorName)
	if err != nil {
		return err
	}
	// handle_note says which handle the agent will claim when it starts,
	// or plainly why none (spec §4.4: the label stands as a claim).
	out := map[string]any{"token": g.Token, "id": g.ID, "label": g.Label, "expires_in": g.ExpiresIn, "command": g.Command,
		"handle_note": g.HandleNote, "operator_name": g.OperatorName}
	if g.HandleClaim != "" {
		out["handle_claim"] = g.HandleClaim
	}
	return ok(w, http.StatusCreated, out)
}

func (h *handlers) listAgentTokens(w http.ResponseWriter, r *http.Request, p *account.Principal) error {
	ks, err := h.acc.ListAgentKeys(r.Context(), p)
	if err != nil {
		return err
	}
	out := make([]map[string]any, 0, len(ks))
	for _, k := range ks {
		item := map[string]any{"id": k.ID, "label": k.Label, "state": h.acc.KeyState(k),
			"created_at": protocol.FormatTime(msTime(k.CreatedAt)), "expires_at": protocol.FormatTime(msTime(k.ExpiresAt))}
		if k.AgentID != "" {
			item["agent_id"] = k.AgentID
		}
		out = append(out, item)
	}
	return ok(w, http.StatusOK, map[string]any{"agent_tokens": out})
}

func (h *handlers) revokeAgentToken(w http.ResponseWriter, r *http.Request, p *account.Principal) error {
	if err := h.acc.RevokeAgentKey(r.Context(), p, r.PathValue("key")); err != nil {
		return err
	}
	return ok(w, http.StatusOK, map[string]any{})
}

func (h *handlers) capabilities(w http.ResponseWriter, r *http.Request) error {
	out := map[string]any{}
	for k, v := range h.d.Capabilities {
		out[k] = v
	}
	return ok(w, http.StatusOK, out)
}

func msTime(ms int64) time.Time { return time.UnixMilli(ms) }

// appRoute serves the app and agent listing routes of an account.
func (h *handlers) appRoute(entry string) func(w http.ResponseWriter, r *http.Request, p *account.Principal) error {
	cs := h.d.Credentials
	return func(w http.ResponseWriter, r *http.Request, p *account.Principal) error {
		ctx := r.Context()
		switch entry {
		case "AppCreate":
			if p.Via != "session" {
				return errs.New(errs.Forbidden, "apps are created from a signed-in session")
			}
			var b struct {
				Name string `json:"name"`
			}
			if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true}); err != nil {
				return err
			}
			res, err := cs.CreateApp(ctx, p.AccountID, b.Name)
			if err != nil {
				return err
			}
			httpx.WriteJSON(w, http.StatusCreated, res)
			return nil
		case "AppRefresh":
			if p.Via != "session" {
				return errs.New(errs.Forbidden, "apps are refreshed from a signed-in session")
			}
			res, err := cs.RefreshApp(ctx, p.AccountID, r.PathValue("app"))
			if err != nil {
				return err
			}
			httpx.WriteJSON(w, http.StatusOK, res)
			return nil
		case "AppRevoke":
			if p.Via != "session" {
				return errs.New(errs.Forbidden, "apps are revoked from a signed-in session")
			}
			if err := cs.RevokeApp(ctx, p.AccountID, r.PathValue("app")); err != nil {
				return err
			}
			return ok(w, http.StatusOK, map[string]any{})
		case "AppList":
			apps, err := cs.ListApps(ctx, p.AccountID)
			if err != nil {
				return err
			}
			out := make([]map[string]any, 0, len(apps))
			for _, a := range apps {
				out = append(out, map[string]any{"app_id": a.ID, "name": a.Name, "public_key": a.Key,
					"created_at": protocol.FormatTime(msTime(a.CreatedAt)), "revoked": a.RevokedAt != 0})
			}
			return ok(w, http.StatusOK, map[string]any{"apps": out})
		}
		panic("accounts: no app route " + entry)
	}
}

// viewRoute serves the account views that ask the bus.
func (h *handlers) viewRoute(entry string) func(w http.ResponseWriter, r *http.Request, p *account.Principal) error {
	v := h.d.Views
	return func(w http.ResponseWriter, r *http.Request, p *account.Principal) error {
		ctx := r.Context()
		switch entry {
		case "AccountAgents":
			ags, err := v.Agents(ctx, p.AccountID)
			if err != nil {
				return err
			}
			return ok(w, http.StatusOK, map[string]any{"agents": ags})
		case "AccountActivity":
			limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
			items, err := v.Activity(ctx, p.AccountID, limit)
			if err != nil {
				return err
			}
			return ok(w, http.StatusOK, map[string]any{"items": items})
		case "SubscriptionList":
			subs, err := v.Subscriptions(ctx, p.AccountID)
			if err != nil {
				return err
			}
			return ok(w, http.StatusOK, map[string]any{"subscriptions": subs})
		case "SubscriptionAdd":
			if p.Via != "session" {
				return errs.New(errs.Forbidden, "subscriptions are changed from a signed-in session")
			}
			var b struct {
				AgentID string `json:"agent_id"`
			}
			if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true}); err != nil {
				return err
			}
			if err := v.Subscribe(ctx, p.AccountID, b.AgentID); err != nil {
				return err
			}
			return ok(w, http.StatusCreated, map[string]any{"agent_id": b.AgentID})
		default: // SubscriptionRemove
			if p.Via != "session" {
				return errs.New(errs.Forbidden, "subscriptions are changed from a signed-in session")
			}
			if err := v.Unsubscribe(ctx, p.AccountID, r.PathValue("agent")); err != nil {
				return err
			}
			return ok(w, http.StatusOK, map[string]any{})
		}
	}
}
