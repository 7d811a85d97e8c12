// Package guest is the guest (sandbox) credential surface: lease, keep
// alive, release, and the pool's health. Each route is its own Cloud
// Function; meshd mounts them all on one mux.
package guest

import (
	"net/http"

	"agentmesh.dev/mesh/functions/api"
	"agentmesh.dev/mesh/shared/guest"
	"agentmesh.dev/mesh/shared/httpx"
)

// Routes is the group's route table. A guest proves nothing but its
// address (issue) or the lease key's signature (heartbeat, release), which
// the service checks.
var Routes = []api.Route{
	{EntryPoint: "GuestIssue", Method: "POST", Path: "/v1/guest", Auth: api.Public, Handler: needGuests(issue)},
	{EntryPoint: "GuestHeartbeat", Method: "POST", Path: "/v1/guest/heartbeat", Auth: api.Public, Handler: needGuests(heartbeat)},
	{EntryPoint: "GuestRelease", Method: "POST", Path: "/v1/guest/release", Auth: api.Public, Handler: needGuests(release)},
	{EntryPoint: "AuthStatus", Method: "GET", Path: "/auth/status", Auth: api.Public, Handler: needGuests(status)},
	api.JobRoute("GuestSweep", "/jobs/guest-sweep", guest.SweepInterval, func(d *api.Deps) api.Job {
		if d.Guests == nil {
			return nil
		}
		return d.Guests.Sweep
	}),
}

func needGuests(h func(d *api.Deps, gs *guest.Service) httpx.HandlerFunc) api.Handler {
	return func(d *api.Deps) httpx.HandlerFunc {
		if d.Guests == nil {
			return api.NotConfigured("guest credentials")
		}
		return h(d, d.Guests)
	}
}

func issue(d *api.Deps, gs *guest.Service) httpx.HandlerFunc {
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
}

func heartbeat(_ *api.Deps, gs *guest.Service) httpx.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		var b guest.Signed
		if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true}); err != nil {
			return err
		}
		until, err := gs.Heartbeat(r.Context(), b)
		if err != nil {
			return err
		}
		httpx.WriteJSON(w, http.StatusOK, map[string]any{"ok": true, "expires_at": until})
		return nil
	}
}

func release(_ *api.Deps, gs *guest.Service) httpx.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		var b guest.Signed
		if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true}); err != nil {
			return err
		}
		if err := gs.Release(r.Context(), b); err != nil {
			return err
		}
		httpx.WriteJSON(w, http.StatusOK, map[string]any{"ok": true})
		return nil
	}
}

func status(_ *api.Deps, gs *guest.Service) httpx.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		avail, issued, err := gs.Status(r.Context())
		if err != nil {
			return err
		}
		httpx.WriteJSON(w, http.StatusOK, map[string]any{"available": avail, "issued": issued})
		return nil
	}
}
