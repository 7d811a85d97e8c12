// Package credentials is the credential doors of the control plane: the
// am_ key exchange, node credentials (mint and renew) and job credentials.
// Each route is its own Cloud Function; meshd mounts them all on one mux.
package credentials

import (
	"net/http"
	"time"

	"agentmesh.dev/mesh/functions/api"
	"agentmesh.dev/mesh/shared/credential"
	"agentmesh.dev/mesh/shared/httpx"
)

// Routes is the group's route table. Each door is public: what the body
// proves (a single-use key, signatures by every key the credential speaks
// for, a job token) is the credential service's to check.
var Routes = []api.Route{
	{EntryPoint: "Bootstrap", Method: "POST", Path: "/v1/bootstrap", Auth: api.Public, Handler: mint(bootstrap)},
	{EntryPoint: "NodeCredential", Method: "POST", Path: "/v1/node-credential", Auth: api.Public, Handler: mint(node)},
	{EntryPoint: "JobCredential", Method: "POST", Path: "/v1/job-credential", Auth: api.Public, Handler: mint(job)},
	api.JobRoute("CredentialSweep", "/jobs/credential-sweep", SweepInterval, func(d *api.Deps) api.Job {
		if d.Credentials == nil {
			return nil
		}
		return d.Credentials.Sweep
	}),
}

// SweepInterval is how often the credential service deletes its expired
// rate-limit counters and the revocations whose credentials have all
// expired.
const SweepInterval = 10 * time.Minute

func mint(h func(d *api.Deps, cs *credential.Service) httpx.HandlerFunc) api.Handler {
	return func(d *api.Deps) httpx.HandlerFunc {
		if d.Credentials == nil {
			return api.NotConfigured("credential minting")
		}
		return h(d, d.Credentials)
	}
}

func bootstrap(_ *api.Deps, cs *credential.Service) httpx.HandlerFunc {
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
}

func node(d *api.Deps, cs *credential.Service) httpx.HandlerFunc {
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
}

func job(_ *api.Deps, cs *credential.Service) httpx.HandlerFunc {
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
