// Package guest is the guest (sandbox) credential surface: lease, keep
// alive, release, and the pool's health. Each route is its own Cloud
// Function; meshd mounts them all on one mux.
package guest

import (
	"net/http"

	"agentmesh.dev/mesh/functions/api"
	"agentmesh.dev/mesh/functions/cloud"
	"agentmesh.dev/mesh/shared/guest"
	"agentmesh.dev/mesh/shared/httpx"
)

// Routes is the group's route table.
var Routes = []httpx.Route{
	{EntryPoint: "GuestIssue", Method: "POST", Path: "/v1/guest"},
	{EntryPoint: "GuestHeartbeat", Method: "POST", Path: "/v1/guest/heartbeat"},
	{EntryPoint: "GuestRelease", Method: "POST", Path: "/v1/guest/release"},
	{EntryPoint: "AuthStatus", Method: "GET", Path: "/auth/status"},
}

// Group is the function group.
var Group = api.Group{Routes: Routes, Handler: handler}

// Each route is its own Cloud Function, built on its first request.
func init() { Group.RegisterFunctions(cloud.Deps) }

func handler(d *api.Deps, rt httpx.Route) httpx.HandlerFunc {
	gs := d.Guests
	if gs == nil {
		return api.NotConfigured("guest credentials")
	}
	switch rt.EntryPoint {
	case "GuestIssue":
		return func(w http.ResponseWriter, r *http.Request) error {
			// POST /v1/guest takes no body: none, or an empty JSON object.
			if err := httpx.Decode(w, r, &struct{}{}, httpx.DecodeOptions{Strict: true, AllowEmpty: true}); err != nil {
				return err
			}
			g, err := gs.Issue(r.Context(), httpx.ClientKey(r, d.TrustedProxyHops))
			if err != nil {
				return err
			}
			httpx.WriteJSON(w, http.StatusOK, g)
			return nil
		}
	case "GuestHeartbeat", "GuestRelease":
		return func(w http.ResponseWriter, r *http.Request) error {
			var b guest.Signed
			if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true}); err != nil {
				return err
			}
			if rt.EntryPoint == "GuestRelease" {
				if err := gs.Release(r.Context(), b); err != nil {
					return err
				}
				httpx.WriteJSON(w, http.StatusOK, map[string]any{"ok": true})
				return nil
			}
			until, err := gs.Heartbeat(r.Context(), b)
			if err != nil {
				return err
			}
			httpx.WriteJSON(w, http.StatusOK, map[string]any{"ok": true, "expires_at": until})
			return nil
		}
	case "AuthStatus":
		return func(w http.ResponseWriter, r *http.Request) error {
			avail, issued, err := gs.Status(r.Context())
			if err != nil {
				return err
			}
			httpx.WriteJSON(w, http.StatusOK, map[string]any{"available": avail, "issued": issued})
			return nil
		}
	}
	panic("guest: no handler for " + rt.EntryPoint)
}
