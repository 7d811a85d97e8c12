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
	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/httpx"
	"agentmesh.dev/mesh/shared/protocol"
)

// Routes is the group's route table. Auth says who may call each route:
// sign-up, sign-in and connect prove themselves with mailed codes (the
// service checks them); the account routes need a session of the account
// in the path, and the read-only ones also take an API token with scope
// "read".
var Routes = []api.Route{
	{EntryPoint: "AccountCreate", Method: "POST", Path: "/v1/accounts", Auth: api.Public, Handler: acc(func(h *handlers) httpx.HandlerFunc { return h.startLogin(true) })},
	{EntryPoint: "Login", Method: "POST", Path: "/v1/login", Auth: api.Public, Handler: acc(func(h *handlers) httpx.HandlerFunc { return h.startLogin(false) })},
	{EntryPoint: "LoginVerify", Method: "POST", Path: "/v1/login/verify", Auth: api.Public, Handler: acc(method((*handlers).verify))},
	{EntryPoint: "Logout", Method: "POST", Path: "/v1/logout", Auth: api.Session, Handler: acc(method((*handlers).logout))},
	{EntryPoint: "SessionInfo", Method: "GET", Path: "/v1/session", Auth: api.Session, Handler: acc(method((*handlers).session))},
	{EntryPoint: "APITokenCreate", Method: "POST", Path: "/v1/accounts/{id}/api-tokens", Auth: api.Session, Handler: acc(method((*handlers).createAPIToken))},
	{EntryPoint: "APITokenList", Method: "GET", Path: "/v1/accounts/{id}/api-tokens", Auth: api.Session, Handler: acc(method((*handlers).listAPITokens))},
	{EntryPoint: "APITokenRevoke", Method: "DELETE", Path: "/v1/accounts/{id}/api-tokens/{token}", Auth: api.Session, Handler: acc(method((*handlers).revokeAPIToken))},
	{EntryPoint: "PasskeyBegin", Method: "POST", Path: "/v1/accounts/{id}/passkeys/{kind}/begin", Auth: api.Session, Handler: acc(method((*handlers).passkeyBegin))},
	{EntryPoint: "PasskeyFinish", Method: "POST", Path: "/v1/accounts/{id}/passkeys/{kind}/finish", Auth: api.Session, Handler: acc(method((*handlers).passkeyFinish))},
	{EntryPoint: "AgentTokenCreate", Method: "POST", Path: "/v1/accounts/{id}/agent-tokens", Auth: api.Session, Handler: acc(method((*handlers).createAgentToken))},
	{EntryPoint: "AgentTokenList", Method: "GET", Path: "/v1/accounts/{id}/agent-tokens", Auth: api.SessionOrToken("read"), Handler: acc(method((*handlers).listAgentTokens))},
	{EntryPoint: "AgentTokenRevoke", Method: "DELETE", Path: "/v1/accounts/{id}/agent-tokens/{key}", Auth: api.Session, Handler: acc(method((*handlers).revokeAgentToken))},
	{EntryPoint: "AppCreate", Method: "POST", Path: "/v1/accounts/{id}/apps", Auth: api.Session, Handler: apps(method((*handlers).createApp))},
	{EntryPoint: "AppList", Method: "GET", Path: "/v1/accounts/{id}/apps", Auth: api.SessionOrToken("read"), Handler: apps(method((*handlers).listApps))},
	{EntryPoint: "AppRefresh", Method: "POST", Path: "/v1/accounts/{id}/apps/{app}/refresh", Auth: api.Session, Handler: apps(method((*handlers).refreshApp))},
	{EntryPoint: "AppRevoke", Method: "DELETE", Path: "/v1/accounts/{id}/apps/{app}", Auth: api.Session, Handler: apps(method((*handlers).revokeApp))},
	{EntryPoint: "AccountAgents", Method: "GET", Path: "/v1/accounts/{id}/agents", Auth: api.SessionOrToken("read"), Handler: views(method((*handlers).agents))},
	{EntryPoint: "AccountActivity", Method: "GET", Path: "/v1/accounts/{id}/activity", Auth: api.SessionOrToken("read"), Handler: views(method((*handlers).activity))},
	{EntryPoint: "AccountUsage", Method: "GET", Path: "/v1/accounts/{id}/usage", Auth: api.SessionOrToken("read"), Handler: views(method((*handlers).usage))},
	{EntryPoint: "SubscriptionList", Method: "GET", Path: "/v1/accounts/{id}/subscriptions", Auth: api.SessionOrToken("read"), Handler: views(method((*handlers).subscriptions))},
	{EntryPoint: "SubscriptionAdd", Method: "POST", Path: "/v1/accounts/{id}/subscriptions", Auth: api.Session, Handler: views(method((*handlers).subscribe))},
	{EntryPoint: "SubscriptionRemove", Method: "DELETE", Path: "/v1/accounts/{id}/subscriptions/{agent}", Auth: api.Session, Handler: views(method((*handlers).unsubscribe))},
	{EntryPoint: "Capabilities", Method: "GET", Path: "/v1/capabilities", Auth: api.Public, Handler: func(d *api.Deps) httpx.HandlerFunc { return (&handlers{d: d}).capabilities }},
	{EntryPoint: "Connect", Method: "POST", Path: "/v1/connect", Auth: api.Public, Handler: apps(method((*handlers).connect))},
	{EntryPoint: "ConnectStatus", Method: "POST", Path: "/v1/connect/status", Auth: api.Public, Handler: apps(method((*handlers).connectStatus))},
	api.JobRoute("AccountSweep", "/jobs/account-sweep", account.SweepInterval, func(d *api.Deps) api.Job {
		if d.Accounts == nil {
			return nil
		}
		return d.Accounts.Sweep
	}),
}

// method adapts a method of handlers to a row's handler.
func method(m func(h *handlers, w http.ResponseWriter, r *http.Request) error) func(h *handlers) httpx.HandlerFunc {
	return func(h *handlers) httpx.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) error { return m(h, w, r) }
	}
}

// acc builds a route that needs the account service.
func acc(mk func(h *handlers) httpx.HandlerFunc) api.Handler {
	return func(d *api.Deps) httpx.HandlerFunc {
		if d.Accounts == nil {
			return api.NotConfigured("the account service")
		}
		return mk(&handlers{d: d, acc: d.Accounts})
	}
}

// apps builds a route that needs the account and credential services.
func apps(mk func(h *handlers) httpx.HandlerFunc) api.Handler {
	return acc(func(h *handlers) httpx.HandlerFunc {
		if h.d.Credentials == nil {
			return api.NotConfigured("the credential service")
		}
		return mk(h)
	})
}

// views builds a route that asks the bus.
func views(mk func(h *handlers) httpx.HandlerFunc) api.Handler {
	return acc(func(h *handlers) httpx.HandlerFunc {
		if h.d.Views == nil {
			return api.NotConfigured("the account views (no bus connection)")
		}
		return mk(h)
	})
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
	p := api.PrincipalOf(r)
	n, err := h.acc.PasskeyCount(r.Context(), p.AccountID)
	if err != nil {
		return err
	}
	return ok(w, http.StatusOK, map[string]any{"account_id": p.AccountID, "email": p.Account.Email,
		"operator_name": p.Account.OperatorName, "passkeys": n, "passkey_fresh": h.acc.Fresh(p)})
}

func (h *handlers) createAPIToken(w http.ResponseWriter, r *http.Request) error {
	p := api.PrincipalOf(r)
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

func (h *handlers) listAPITokens(w http.ResponseWriter, r *http.Request) error {
	p := api.PrincipalOf(r)
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

func (h *handlers) revokeAPIToken(w http.ResponseWriter, r *http.Request) error {
	p := api.PrincipalOf(r)
	if err := h.acc.RevokeAPIToken(r.Context(), p, r.PathValue("token")); err != nil {
		return err
	}
	return ok(w, http.StatusOK, map[string]any{})
}

func (h *handlers) passkeyBegin(w http.ResponseWriter, r *http.Request) error {
	p := api.PrincipalOf(r)
	opts, id, err := h.acc.BeginPasskey(r.Context(), p, r.PathValue("kind"))
	if err != nil {
		return err
	}
	return ok(w, http.StatusOK, map[string]any{"ceremony": id, "options": opts})
}

func (h *handlers) passkeyFinish(w http.ResponseWriter, r *http.Request) error {
	p := api.PrincipalOf(r)
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

func (h *handlers) createAgentToken(w http.ResponseWriter, r *http.Request) error {
	p := api.PrincipalOf(r)
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

func (h *handlers) listAgentTokens(w http.ResponseWriter, r *http.Request) error {
	p := api.PrincipalOf(r)
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

func (h *handlers) revokeAgentToken(w http.ResponseWriter, r *http.Request) error {
	p := api.PrincipalOf(r)
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

func (h *handlers) createApp(w http.ResponseWriter, r *http.Request) error {
	var b struct {
		Name string `json:"name"`
	}
	if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true}); err != nil {
		return err
	}
	res, err := h.d.Credentials.CreateApp(r.Context(), api.PrincipalOf(r).AccountID, b.Name)
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusCreated, res)
	return nil
}

func (h *handlers) refreshApp(w http.ResponseWriter, r *http.Request) error {
	res, err := h.d.Credentials.RefreshApp(r.Context(), api.PrincipalOf(r).AccountID, r.PathValue("app"))
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, res)
	return nil
}

func (h *handlers) revokeApp(w http.ResponseWriter, r *http.Request) error {
	if err := h.d.Credentials.RevokeApp(r.Context(), api.PrincipalOf(r).AccountID, r.PathValue("app")); err != nil {
		return err
	}
	return ok(w, http.StatusOK, map[string]any{})
}

func (h *handlers) listApps(w http.ResponseWriter, r *http.Request) error {
	apps, err := h.d.Credentials.ListApps(r.Context(), api.PrincipalOf(r).AccountID)
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

func (h *handlers) agents(w http.ResponseWriter, r *http.Request) error {
	ags, err := h.d.Views.Agents(r.Context(), api.PrincipalOf(r).AccountID)
	if err != nil {
		return err
	}
	return ok(w, http.StatusOK, map[string]any{"agents": ags})
}

func (h *handlers) activity(w http.ResponseWriter, r *http.Request) error {
	limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
	items, err := h.d.Views.Activity(r.Context(), api.PrincipalOf(r).AccountID, limit)
	if err != nil {
		return err
	}
	return ok(w, http.StatusOK, map[string]any{"items": items})
}

func (h *handlers) usage(w http.ResponseWriter, r *http.Request) error {
	agents, err := h.d.Views.Usage(r.Context(), api.PrincipalOf(r).AccountID)
	if err != nil {
		return err
	}
	return ok(w, http.StatusOK, map[string]any{"agents": agents})
}

func (h *handlers) subscriptions(w http.ResponseWriter, r *http.Request) error {
	subs, err := h.d.Views.Subscriptions(r.Context(), api.PrincipalOf(r).AccountID)
	if err != nil {
		return err
	}
	return ok(w, http.StatusOK, map[string]any{"subscriptions": subs})
}

func (h *handlers) subscribe(w http.ResponseWriter, r *http.Request) error {
	var b struct {
		AgentID string `json:"agent_id"`
	}
	if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true}); err != nil {
		return err
	}
	if err := h.d.Views.Subscribe(r.Context(), api.PrincipalOf(r).AccountID, b.AgentID); err != nil {
		return err
	}
	return ok(w, http.StatusCreated, map[string]any{"agent_id": b.AgentID})
}

func (h *handlers) unsubscribe(w http.ResponseWriter, r *http.Request) error {
	if err := h.d.Views.Unsubscribe(r.Context(), api.PrincipalOf(r).AccountID, r.PathValue("agent")); err != nil {
		return err
	}
	return ok(w, http.StatusOK, map[string]any{})
}
