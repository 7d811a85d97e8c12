// Package credentials is the credential doors of the control plane: the
// am_ key exchange, node credentials (mint and renew) and job credentials.
// Each route is its own Cloud Function; meshd mounts them all on one mux.
package credentials

import (
	"net/http"

	"agentmesh.dev/mesh/functions/api"
	"agentmesh.dev/mesh/functions/cloud"
	"agentmesh.dev/mesh/shared/credential"
	"agentmesh.dev/mesh/shared/httpx"
)

// Routes is the group's route table.
var Routes = []httpx.Route{
	{EntryPoint: "Bootstrap", Method: "POST", Path: "/v1/bootstrap"},
	{EntryPoint: "NodeCredential", Method: "POST", Path: "/v1/node-credential"},
	{EntryPoint: "JobCredential", Method: "POST", Path: "/v1/job-credential"},
}

// Group is the function group.
var Group = api.Group{Routes: Routes, Handler: handler}

// Each route is its own Cloud Function, built on its first request.
func init() { Group.RegisterFunctions(cloud.Deps) }

func handler(d *api.Deps, rt httpx.Route) httpx.HandlerFunc {
	cs := d.Credentials
	if cs == nil {
		return api.NotConfigured("credential minting")
	}
	switch rt.EntryPoint {
	case "Bootstrap":
		return func(w http.ResponseWriter, r *http.Request) error {
			var b credential.BootstrapRequest
			if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true}); err != nil {
				return err
			}
			res, err := cs.Bootstrap(r.Context(), b)
			if err != nil {
				return err
			}
			httpx.WriteJSON(w, http.StatusOK, res)
			return nil
		}
	case "NodeCredential":
		return func(w http.ResponseWriter, r *http.Request) error {
			var b credential.NodeRequest
			if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true}); err != nil {
				return err
			}
			b.Client = httpx.ClientKey(r, d.TrustedProxyHops)
			b.Network = httpx.NetworkKey(b.Client)
			res, err := cs.NodeCredential(r.Context(), b)
			if err != nil {
				return err
			}
			httpx.WriteJSON(w, http.StatusOK, res)
			return nil
		}
	case "JobCredential":
		return func(w http.ResponseWriter, r *http.Request) error {
			var b credential.JobRequest
			if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true}); err != nil {
				return err
			}
			res, err := cs.JobCredential(r.Context(), b)
			if err != nil {
				return err
			}
			httpx.WriteJSON(w, http.StatusOK, res)
			return nil
		}
	}
	panic("credentials: no handler for " + rt.EntryPoint)
}
