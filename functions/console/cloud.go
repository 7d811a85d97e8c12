package console

import (
	"net/http"
	"net/url"
	"regexp"
	"strings"

	"agentmesh.dev/mesh/shared/grant"
)

// The Cloud page (docs/console.md, docs/grants.md): the deployer to bind,
// the exact gcloud commands of the setup, the account's grant with its
// state in plain words, Verify, deploys into the grant's project, and the
// actions log. Each form calls one method of shared/grant, in process, so
// it passes the same checks as the JSON routes of functions/grants.

// cloudLogShown is how many lines of the actions log the page shows; the
// deployed agents are read from up to grant.MaxActionsLimit lines.
const cloudLogShown = 100

// cloudNotConfigured is what the page says on an instance without a deployer.
const cloudNotConfigured = "Cloud grants are not configured on this instance."

// setupFieldRE is what a value of the setup form may be before it is put
// into a command: Google's names for projects, accounts, regions, buckets
// and repositories are all within it. Anything else (a space, a quote, a
// semicolon) is dropped, so a link to this page can never show "exact
// commands" that do something else.
var setupFieldRE = regexp.MustCompile(`^[a-z0-9][-a-z0-9_.]{0,62}$`)

type cloudData struct {
	Configured  bool
	GrantTo     string
	Permissions string
	// Setup fills the commands; SetupForm are the setup form's values.
	Setup grant.Setup
	Steps []grant.Step
	// Revoke is the command that takes the grant back.
	Revoke string
	Grant  *grant.View
	// StateWords says what the grant's state means, in plain words.
	StateWords string
	Passkeys   int
	Deploys    []deployRow
	Actions    []grant.ActionView
	More       bool // the log has more lines than the page shows
}

// deployRow is one worker pool the mesh wrote, as the actions log tells.
type deployRow struct {
	Name, Region, Project, Resource, At string
}

// stateWords is a grant state in plain words: what it means and what
// happens next.
func stateWords(s grant.State) string {
	switch s {
	case grant.Verified:
		return "The mesh can act as your service account and read your project: deploys go ahead."
	case grant.Revoked:
		return "Your project refused the mesh: the deployer's binding is missing, the account was deleted, or a deploy was refused for want of a role. Nothing is retried. Fix it (the last error says what), wait a few minutes if you just changed IAM, and press Verify."
	case grant.Unreachable:
		return "The check could not finish. The mesh checks again on its own, every few minutes at first; the last error says whose side failed."
	case grant.Pending:
		return "Recorded, not checked yet. Press Verify to check it now."
	}
	return string(s)
}

// setupOf is the setup the commands are filled from: the form's values
// when it was sent, else the grant's project and account. Values that
// cannot be Google names are dropped (their placeholder stays) and named
// in the returned message.
func (s *Server) setupOf(q url.Values, g *grant.View) (grant.Setup, map[string]string, string) {
	form := map[string]string{}
	for _, k := range []string{"project", "account", "region", "bucket", "repository"} {
		form[k] = strings.TrimSpace(q.Get(k))
	}
	if q.Get("project") == "" && q.Get("account") == "" && g != nil {
		form["project"] = g.ProjectID
		form["account"], _, _ = strings.Cut(g.ServiceAccount, "@")
	}
	// An address is taken for its account id, the part before the '@'.
	form["account"], _, _ = strings.Cut(form["account"], "@")
	var bad []string
	for _, k := range []string{"project", "account", "region", "bucket", "repository"} {
		if v := form[k]; v != "" && !setupFieldRE.MatchString(v) {
			bad = append(bad, k)
			form[k] = ""
		}
	}
	msg := ""
	if len(bad) > 0 {
		msg = "Not a Google Cloud name, so left as a placeholder: " + strings.Join(bad, ", ") + ". Use lower-case letters, digits, '-', '_' and '.'."
	}
	return grant.Setup{ProjectID: form["project"], Account: form["account"], Deployer: s.grants.GrantTo(),
		Region: form["region"], Bucket: form["bucket"], Repository: form["repository"]}, form, msg
}

// cloudView reads everything the page shows. The query fills the setup
// form (and from it the add and deploy forms).
func (s *Server) cloudView(r *http.Request, ss *session, q url.Values) (*view, error) {
	d := &cloudData{Configured: s.grants != nil}
	v := &view{Title: "Cloud", Nav: "cloud", sess: ss, Data: d, Form: map[string]string{}, Err: map[string]string{}}
	if s.grants == nil {
		return v, nil
	}
	ctx := r.Context()
	d.GrantTo, d.Permissions = s.grants.GrantTo(), s.grants.PermissionsURL()
	gs, err := s.grants.List(ctx, ss.p.AccountID)
	if err != nil {
		return nil, err
	}
	for i := range gs {
		if gs[i].Provider == grant.ProviderGCP {
			d.Grant = &gs[i]
			d.StateWords = stateWords(gs[i].State)
		}
	}
	setup, form, bad := s.setupOf(q, d.Grant)
	setup.MeshAccount = ss.p.AccountID // the project's label names this account
	d.Setup, d.Steps, d.Revoke = setup, setup.Steps(), setup.RevokeCommand()
	for k, val := range form {
		v.Form["setup_"+k] = val
	}
	if bad != "" {
		v.Err["setup"] = bad
	}
	// The add form starts from the setup; the deploy form from the setup
	// too (the region and the bucket the commands created).
	if setup.ProjectID != "" && setup.Account != "" {
		v.Form["project_id"], v.Form["service_account"] = setup.ProjectID, setup.ServiceAccount()
	}
	v.Form["region"], v.Form["bucket"] = setup.Region, setup.Bucket
	if d.Passkeys, err = s.acc.PasskeyCount(ctx, ss.p.AccountID); err != nil {
		return nil, err
	}
	acts, err := s.grants.Actions(ctx, ss.p.AccountID, "", grant.MaxActionsLimit)
	if err != nil {
		return nil, err
	}
	d.Deploys = deploysOf(acts)
	d.Actions, d.More = acts, len(acts) > cloudLogShown
	if d.More {
		d.Actions = acts[:cloudLogShown]
	}
	return v, nil
}

// deploysOf reads the worker pools the mesh wrote from the actions log
// (newest first): the last successful write of each.
func deploysOf(acts []grant.ActionView) []deployRow {
	var out []deployRow
	seen := map[string]bool{}
	for _, a := range acts {
		if a.Call != "run.UpdateWorkerPool" || a.Outcome != "ok" || seen[a.Resource] {
			continue
		}
		seen[a.Resource] = true
		// projects/P/locations/L/workerPools/mesh-NAME
		parts := strings.Split(a.Resource, "/")
		if len(parts) != 6 {
			continue
		}
		out = append(out, deployRow{Name: strings.TrimPrefix(parts[5], "mesh-"), Region: parts[3], Project: parts[1], Resource: a.Resource, At: a.At})
	}
	return out
}

func (s *Server) cloudPage(w http.ResponseWriter, r *http.Request, ss *session) {
	q := r.URL.Query()
	v, err := s.cloudView(r, ss, q)
	if err != nil {
		s.fail(w, r, ss, err)
		return
	}
	d := v.Data.(*cloudData)
	switch {
	case d.Grant != nil && q.Get("added") == "1":
		v.Notice = "Grant recorded and checked just now: it is " + string(d.Grant.State) + "."
	case d.Grant != nil && q.Get("checked") == "1":
		v.Notice = "Checked just now: the grant is " + string(d.Grant.State) + "."
	case d.Grant == nil && q.Get("forgotten") == "1":
		v.Notice = "The grant is forgotten. Nothing was changed in your project: the deployer's binding and anything deployed there stay until you remove them."
	case q.Get("deployed") != "":
		for _, dep := range d.Deploys {
			if dep.Name == q.Get("deployed") {
				v.Notice = "Deployed " + dep.Name + ": Cloud Run runs the worker pool mesh-" + dep.Name + " in " + dep.Region + " of " + dep.Project +
					" as your service account, and its first start redeems the agent key. The key is listed under Agent keys as " + dep.Name + "."
				break
			}
		}
	}
	s.render(w, r, http.StatusOK, "cloud", v)
}

// cloudRefused renders the page with a form's refusal next to that form,
// keeping the form's values (never the model API key).
func (s *Server) cloudRefused(w http.ResponseWriter, r *http.Request, ss *session, form string, err error, keep ...string) {
	v, verr := s.cloudView(r, ss, url.Values{})
	if verr != nil {
		s.fail(w, r, ss, verr)
		return
	}
	status, msg := http.StatusNotImplemented, cloudNotConfigured
	if err != nil {
		status, msg = s.messageOf(err)
	}
	v.Err[form] = msg
	for _, k := range keep {
		v.Form[k] = r.PostFormValue(k)
	}
	s.render(w, r, status, "cloud", v)
}

func (s *Server) addGrant(w http.ResponseWriter, r *http.Request, ss *session) {
	keep := []string{"project_id", "service_account"}
	if s.grants == nil {
		s.cloudRefused(w, r, ss, "grant", nil, keep...)
		return
	}
	_, err := s.grants.Create(r.Context(), ss.p.AccountID, grant.Request{Provider: r.PostFormValue("provider"),
		ProjectID: r.PostFormValue("project_id"), ServiceAccount: r.PostFormValue("service_account")})
	if err != nil {
		s.cloudRefused(w, r, ss, "grant", err, keep...)
		return
	}
	redirect(w, r, Prefix+"cloud?added=1")
}

func (s *Server) verifyGrant(w http.ResponseWriter, r *http.Request, ss *session) {
	if s.grants == nil {
		s.cloudRefused(w, r, ss, "current", nil)
		return
	}
	if _, err := s.grants.Verify(r.Context(), ss.p.AccountID, grant.ProviderGCP); err != nil {
		s.cloudRefused(w, r, ss, "current", err)
		return
	}
	redirect(w, r, Prefix+"cloud?checked=1")
}

// forgetGrant deletes the record only: no call is made in the customer's
// project (the service's Delete makes none).
func (s *Server) forgetGrant(w http.ResponseWriter, r *http.Request, ss *session) {
	if s.grants == nil {
		s.cloudRefused(w, r, ss, "current", nil)
		return
	}
	if _, err := s.grants.Delete(r.Context(), ss.p.AccountID, grant.ProviderGCP); err != nil {
		s.cloudRefused(w, r, ss, "current", err)
		return
	}
	redirect(w, r, Prefix+"cloud?forgotten=1")
}

// deployAgent deploys through the grant service, which refuses unless the
// session passed a passkey check in the last five minutes (a deploy mints
// an agent key) and the grant is verified. The page's script runs that
// check just before it sends this form. The model API key goes to the
// service and nowhere else: it is never put back into the form, shown, or
// logged.
func (s *Server) deployAgent(w http.ResponseWriter, r *http.Request, ss *session) {
	keep := []string{"name", "region", "image", "bucket", "model_api_key_env"}
	if s.grants == nil {
		s.cloudRefused(w, r, ss, "deploy", nil, keep...)
		return
	}
	res, err := s.grants.Deploy(r.Context(), ss.p, grant.ProviderGCP, grant.DeployRequest{
		Name: r.PostFormValue("name"), Region: r.PostFormValue("region"), Image: r.PostFormValue("image"),
		Bucket: r.PostFormValue("bucket"), ModelAPIKey: r.PostFormValue("model_api_key"),
		ModelAPIKeyEnv: strings.TrimSpace(r.PostFormValue("model_api_key_env"))})
	if err != nil {
		s.cloudRefused(w, r, ss, "deploy", err, keep...)
		return
	}
	name := strings.TrimPrefix(res.WorkerPool[strings.LastIndexByte(res.WorkerPool, '/')+1:], "mesh-")
	redirect(w, r, Prefix+"cloud?deployed="+url.QueryEscape(name))
}
