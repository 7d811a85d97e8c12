// Package registrar is the handle registrar's HTTP surface (spec §4.1,
// docs/registrar.md): email codes, sessions, claims, pairing, resolution
// with signed cards, the key set, WebFinger and the human-readable card
// page. Each route is its own Cloud Function; meshd mounts them all on one
// mux. The service is shared/registrar; this package only decodes, calls
// it and renders.
package registrar

import (
	"encoding/json"
	"net/http"

	"agentmesh.dev/mesh/functions/api"
	"agentmesh.dev/mesh/shared/httpx"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/registrar"
)

// Routes is the group's route table. The registrar's routes prove who is
// calling themselves (a mailed code, a registrar session in the body, an
// agent's signature), which the service checks.
var Routes = []api.Route{
	{EntryPoint: "HandleStart", Method: "POST", Path: "/api/handles/start", Auth: api.Public, Handler: reg((*handlers).start)},
	{EntryPoint: "HandleVerify", Method: "POST", Path: "/api/handles/verify", Auth: api.Public, Handler: reg((*handlers).verify)},
	{EntryPoint: "HandleClaim", Method: "POST", Path: "/api/handles/claim", Auth: api.Public, Handler: reg((*handlers).claim)},
	{EntryPoint: "PairStart", Method: "POST", Path: "/api/pair/start", Auth: api.Public, Handler: reg((*handlers).pairStart)},
	{EntryPoint: "PairComplete", Method: "POST", Path: "/api/pair/complete", Auth: api.Public, Handler: reg((*handlers).pairComplete)},
	{EntryPoint: "Resolve", Method: "GET", Path: "/api/resolve", Auth: api.Public, Handler: reg((*handlers).resolve)},
	{EntryPoint: "RegistrarKey", Method: "GET", Path: "/api/registrar-key", Auth: api.Public, Handler: reg((*handlers).keySet)},
	{EntryPoint: "WebFinger", Method: "GET", Path: "/.well-known/webfinger", Auth: api.Public, Handler: reg((*handlers).webFinger)},
	{EntryPoint: "CardPage", Method: "GET", Path: "/a/{handle...}", HTML: true, Auth: api.Public, Handler: reg((*handlers).cardPage)},
	api.JobRoute("RegistrarSweep", "/jobs/registrar-sweep", registrar.SweepInterval, func(d *api.Deps) api.Job {
		if d.Registrar == nil {
			return nil
		}
		return d.Registrar.Sweep
	}),
}

// cardCache is the Cache-Control of a resolved card (upstream-notes §12.4).
const cardCache = "public, max-age=360"

// reg makes a row's handler from a method of handlers.
func reg(m func(h *handlers, w http.ResponseWriter, r *http.Request) error) api.Handler {
	return func(d *api.Deps) httpx.HandlerFunc {
		if d.Registrar == nil {
			return api.NotConfigured("the handle registrar")
		}
		h := &handlers{d: d, svc: d.Registrar}
		return func(w http.ResponseWriter, r *http.Request) error { return m(h, w, r) }
	}
}

type handlers struct {
	d   *api.Deps
	svc *registrar.Service
}

func ok(w http.ResponseWriter, v map[string]any) error {
	v["ok"] = true
	httpx.WriteJSON(w, http.StatusOK, v)
	return nil
}

// ip is the client's key for the per-IP limits (an IPv6 client by its /64).
func (h *handlers) ip(r *http.Request) string { return httpx.ClientKey(r, h.d.TrustedProxyHops) }

func (h *handlers) start(w http.ResponseWriter, r *http.Request) error {
	var b struct {
		Email string `json:"email"`
	}
	if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true}); err != nil {
		return err
	}
	st, err := h.svc.StartEmail(r.Context(), b.Email, h.ip(r))
	if err != nil {
		return err
	}
	return ok(w, map[string]any{"email": st.Email, "delivery": st.Delivery})
}

func (h *handlers) verify(w http.ResponseWriter, r *http.Request) error {
	var b struct {
		Email string `json:"email"`
		Code  string `json:"code"`
	}
	if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true}); err != nil {
		return err
	}
	v, err := h.svc.Verify(r.Context(), b.Email, b.Code, h.ip(r))
	if err != nil {
		return err
	}
	return ok(w, map[string]any{"token": v.Token, "expires_at": protocol.FormatTime(v.ExpiresAt)})
}

func (h *handlers) claim(w http.ResponseWriter, r *http.Request) error {
	var b struct {
		Name         string `json:"name"`
		OperatorName string `json:"operator_name"`
	}
	if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true}); err != nil {
		return err
	}
	c, err := h.svc.Claim(r.Context(), httpx.BearerToken(r), b.Name, b.OperatorName)
	if err != nil {
		return err
	}
	return ok(w, map[string]any{"handle": c.Handle, "operator_name": c.OperatorName})
}

func (h *handlers) pairStart(w http.ResponseWriter, r *http.Request) error {
	var b struct {
		Handle string `json:"handle"`
	}
	if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true}); err != nil {
		return err
	}
	p, err := h.svc.StartPairing(r.Context(), httpx.BearerToken(r), b.Handle)
	if err != nil {
		return err
	}
	return ok(w, map[string]any{"code": p.Code, "handle": p.Handle, "expires_at": protocol.FormatTime(p.ExpiresAt)})
}

func (h *handlers) pairComplete(w http.ResponseWriter, r *http.Request) error {
	var b struct {
		Code      string `json:"code"`
		AgentID   string `json:"agent_id"`
		Signature string `json:"signature"`
	}
	if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true}); err != nil {
		return err
	}
	handle, err := h.svc.CompletePairing(r.Context(), b.Code, b.AgentID, b.Signature, h.ip(r))
	if err != nil {
		return err
	}
	return ok(w, map[string]any{"handle": handle})
}

func (h *handlers) resolve(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	res, err := h.svc.Resolve(r.Context(), q.Get("handle"), q.Get("agent_id"))
	if err != nil {
		return err
	}
	w.Header().Set("Cache-Control", cardCache)
	// The card goes out as the exact canonical bytes that were signed: no
	// HTML escaping of & < > (or U+2028/9) inside it.
	httpx.WriteJSONExact(w, http.StatusOK, map[string]any{"ok": true, "card": json.RawMessage(res.CardJSON),
		"registrar_key": res.Key, "registrar_kid": res.Kid, "registrar_sig": res.Sig})
	return nil
}

func (h *handlers) keySet(w http.ResponseWriter, r *http.Request) error {
	ks, err := h.svc.Keys()
	if err != nil {
		return err
	}
	w.Header().Set("Cache-Control", cardCache)
	return ok(w, map[string]any{"registrar": ks.Registrar, "keys": ks.Keys, "key_set": ks.KeySet})
}

func (h *handlers) webFinger(w http.ResponseWriter, r *http.Request) error {
	jrd, err := h.svc.WebFinger(r.Context(), r.URL.Query().Get("resource"))
	if err != nil {
		return err
	}
	hd := w.Header()
	hd.Set("Content-Type", "application/jrd+json")
	hd.Set("Cache-Control", cardCache)
	hd.Set("Access-Control-Allow-Origin", "*") // RFC 7033 §5
	w.WriteHeader(http.StatusOK)
	_ = json.NewEncoder(w).Encode(jrd)
	return nil
}
