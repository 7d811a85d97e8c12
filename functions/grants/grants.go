// Package grants is the cloud grant surface of the control plane (spec
// §4.7): record and verify a grant, list and read them, forget one, deploy
// an agent into a verified grant's project, read the actions log, and the
// published role list. The decisions are shared/grant's; these handlers
// decode, call one method and render.
package grants

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"

	"agentmesh.dev/mesh/functions/api"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/grant"
	"agentmesh.dev/mesh/shared/httpx"
)

// Routes is the group's route table. The grant routes take a signed-in
// session only, never an API token (spec §5); the actions log also takes
// an amt_ token carrying scope "audit". The role list is public: customers
// read it before they have an account here. The scheduled row re-checks
// unreachable grants.
var Routes = []api.Route{
	{EntryPoint: "CloudGrantCreate", Method: "POST", Path: "/v1/accounts/{id}/cloud/grants", Auth: api.Session, Handler: svc(create)},
	{EntryPoint: "CloudGrantList", Method: "GET", Path: "/v1/accounts/{id}/cloud/grants", Auth: api.Session, Handler: svc(list)},
	{EntryPoint: "CloudGrantGet", Method: "GET", Path: "/v1/accounts/{id}/cloud/grants/{provider}", Auth: api.Session, Handler: svc(get)},
	{EntryPoint: "CloudGrantVerify", Method: "POST", Path: "/v1/accounts/{id}/cloud/grants/{provider}/verify", Auth: api.Session, Handler: svc(verify)},
	{EntryPoint: "CloudGrantDelete", Method: "DELETE", Path: "/v1/accounts/{id}/cloud/grants/{provider}", Auth: api.Session, Handler: svc(remove)},
	{EntryPoint: "CloudDeploy", Method: "POST", Path: "/v1/accounts/{id}/cloud/grants/{provider}/deploys", Auth: api.Session, Handler: svc(deploy)},
	{EntryPoint: "CloudActions", Method: "GET", Path: "/v1/accounts/{id}/cloud/actions", Auth: api.SessionOrToken("audit"), Handler: svc(actions)},
	{EntryPoint: "CloudGrantRoles", Method: "GET", Path: grant.RolesPath, Auth: api.Public, HTML: true, Handler: roles},
	api.JobRoute("CloudGrantRecheck", "/jobs/cloud-grant-recheck", grant.RecheckEvery, func(d *api.Deps) api.Job {
		if d.Grants == nil {
			return nil
		}
		return d.Grants.Recheck
	}),
}

// svc builds a route that needs the grant service.
func svc(h func(s *grant.Service, w http.ResponseWriter, r *http.Request) error) api.Handler {
	return func(d *api.Deps) httpx.HandlerFunc {
		if d.Grants == nil {
			return api.NotConfigured("cloud grants (no deployer service account: MESH_DEPLOYER_SA, or meshd --grant-deployer)")
		}
		return func(w http.ResponseWriter, r *http.Request) error { return h(d.Grants, w, r) }
	}
}

func ok(w http.ResponseWriter, status int, v map[string]any) error {
	v["ok"] = true
	httpx.WriteJSON(w, status, v)
	return nil
}

// answer is a grant as every grant route answers it (spec §4.7).
func answer(s *grant.Service, v grant.View) map[string]any {
	return map[string]any{"grant": v, "grant_to": s.GrantTo(), "permissions": s.PermissionsURL()}
}

// postBody is exactly the three members of spec §4.7; the members the
// service writes are declared only to be refused by name.
type postBody struct {
	Provider       string `json:"provider"`
	ProjectID      string `json:"project_id"`
	ServiceAccount string `json:"service_account"`

	State       json.RawMessage `json:"state"`
	VerifiedAt  json.RawMessage `json:"verified_at"`
	LastError   json.RawMessage `json:"last_error"`
	GrantedAt   json.RawMessage `json:"granted_at"`
	DeploysHere json.RawMessage `json:"deploys_here"`
	AccountID   json.RawMessage `json:"account_id"`
}

// decodeGrant reads a POST body: strict JSON, and a member the service
// writes is refused with its own message rather than ignored.
func decodeGrant(w http.ResponseWriter, r *http.Request) (grant.Request, error) {
	var b postBody
	if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true}); err != nil {
		return grant.Request{}, err
	}
	for name, v := range map[string]json.RawMessage{"state": b.State, "verified_at": b.VerifiedAt, "last_error": b.LastError,
		"granted_at": b.GrantedAt, "deploys_here": b.DeploysHere, "account_id": b.AccountID} {
		if v != nil {
			return grant.Request{}, errs.Newf(errs.InvalidRequest, "%s is written by the service only; send exactly provider, project_id and service_account", name)
		}
	}
	return grant.Request{Provider: b.Provider, ProjectID: b.ProjectID, ServiceAccount: b.ServiceAccount}, nil
}

func create(s *grant.Service, w http.ResponseWriter, r *http.Request) error {
	req, err := decodeGrant(w, r)
	if err != nil {
		return err
	}
	res, err := s.Create(r.Context(), api.PrincipalOf(r).AccountID, req)
	if err != nil {
		return err
	}
	status := http.StatusCreated
	if !res.Created {
		status = http.StatusOK
	}
	return ok(w, status, answer(s, res.Grant))
}

func list(s *grant.Service, w http.ResponseWriter, r *http.Request) error {
	gs, err := s.List(r.Context(), api.PrincipalOf(r).AccountID)
	if err != nil {
		return err
	}
	return ok(w, http.StatusOK, map[string]any{"grants": gs, "grant_to": s.GrantTo(), "permissions": s.PermissionsURL()})
}

func get(s *grant.Service, w http.ResponseWriter, r *http.Request) error {
	v, err := s.Get(r.Context(), api.PrincipalOf(r).AccountID, r.PathValue("provider"))
	if err != nil {
		return err
	}
	return ok(w, http.StatusOK, answer(s, v))
}

// verify takes no body at all (spec §4.7): not even {}.
func verify(s *grant.Service, w http.ResponseWriter, r *http.Request) error {
	if r.Body != nil {
		var one [1]byte
		if n, _ := io.ReadFull(r.Body, one[:]); n > 0 {
			return errs.New(errs.InvalidRequest, "verify takes no body at all; send the POST empty")
		}
	}
	v, err := s.Verify(r.Context(), api.PrincipalOf(r).AccountID, r.PathValue("provider"))
	if err != nil {
		return err
	}
	return ok(w, http.StatusOK, answer(s, v))
}

func remove(s *grant.Service, w http.ResponseWriter, r *http.Request) error {
	g, err := s.Delete(r.Context(), api.PrincipalOf(r).AccountID, r.PathValue("provider"))
	if err != nil {
		return err
	}
	return ok(w, http.StatusOK, map[string]any{"forgotten": g.Provider,
		"note": "The record is gone. Nothing was changed in project " + g.ProjectID + ": the TokenCreator binding on " + g.ServiceAccount +
			" and anything deployed there stay until you remove them (docs/grants.md)."})
}

func deploy(s *grant.Service, w http.ResponseWriter, r *http.Request) error {
	var b grant.DeployRequest
	if err := httpx.Decode(w, r, &b, httpx.DecodeOptions{Strict: true}); err != nil {
		return err
	}
	res, err := s.Deploy(r.Context(), api.PrincipalOf(r), r.PathValue("provider"), b)
	if err != nil {
		return err
	}
	return ok(w, http.StatusCreated, map[string]any{"deploy": res})
}

func actions(s *grant.Service, w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	limit := 0
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return errs.Newf(errs.InvalidRequest, "limit must be a whole number from 1 to %d", grant.MaxActionsLimit)
		}
		limit = n
	}
	as, err := s.Actions(r.Context(), api.PrincipalOf(r).AccountID, q.Get("provider"), limit)
	if err != nil {
		return err
	}
	return ok(w, http.StatusOK, map[string]any{"actions": as})
}

// roles serves the published role list, with this instance's deployer
// filled in when it has one.
func roles(d *api.Deps) httpx.HandlerFunc {
	deployer := ""
	if d.Grants != nil {
		deployer = d.Grants.GrantTo()
	}
	page := grant.RolesHTML(deployer)
	return func(w http.ResponseWriter, r *http.Request) error {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "public, max-age=300")
		_, _ = w.Write(page)
		return nil
	}
}
