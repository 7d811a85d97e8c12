// Package closure is the account closure surface of the control plane
// (spec §4.4): what closing will and will not remove, the close action,
// and the scheduled row that finishes closures left unfinished. The
// decisions are shared/closure's; these handlers call one method and
// render.
package closure

import (
	"context"
	"net/http"
	"time"

	"agentmesh.dev/mesh/functions/api"
	"agentmesh.dev/mesh/shared/closure"
	"agentmesh.dev/mesh/shared/httpx"
	"agentmesh.dev/mesh/shared/protocol"
)

// Routes is the group's route table. The preview is a read (a session, or
// an amt_ token with scope "read"); closing takes a signed-in session
// whose passkey was confirmed in the last five minutes, never an API token
// (the service checks the passkey, as for minting an agent key).
var Routes = []api.Route{
	{EntryPoint: "AccountClosePreview", Method: "GET", Path: "/v1/accounts/{id}/close", Auth: api.SessionOrToken("read"), Handler: svc(preview)},
	{EntryPoint: "AccountClose", Method: "POST", Path: "/v1/accounts/{id}/close", Auth: api.Session, Handler: svc(closeAccount)},
	api.JobRoute("AccountClosureResume", "/jobs/account-closure-resume", closure.ResumeEvery, func(d *api.Deps) api.Job {
		if d.Closure == nil {
			return nil
		}
		return d.Closure.Resume
	}),
}

func svc(h func(s *closure.Service, w http.ResponseWriter, r *http.Request) error) api.Handler {
	return func(d *api.Deps) httpx.HandlerFunc {
		if d.Closure == nil {
			return api.NotConfigured("account closure")
		}
		return func(w http.ResponseWriter, r *http.Request) error { return h(d.Closure, w, r) }
	}
}

func preview(s *closure.Service, w http.ResponseWriter, r *http.Request) error {
	p := api.PrincipalOf(r)
	pv, err := s.Preview(r.Context(), p)
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, map[string]any{"ok": true, "account_id": pv.AccountID, "will_remove": pv.WillRemove,
		"will_not_remove": pv.WillNotRemove, "steps": pv.Steps, "passkey_fresh": pv.PasskeyFresh,
		"close": "POST /v1/accounts/" + pv.AccountID + "/close from a signed-in session that confirmed a passkey in the last five minutes"})
	return nil
}

// closeAccount begins the closure and runs its steps for up to
// closure.RunBudget, whether or not the caller stays: done, it answers 200
// with the outstanding list; otherwise 202, and the scheduled row finishes
// it and the list is mailed.
func closeAccount(s *closure.Service, w http.ResponseWriter, r *http.Request) error {
	p := api.PrincipalOf(r)
	job, err := s.Begin(r.Context(), p)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), closure.RunBudget)
	defer cancel()
	if j, err := s.Run(ctx, p.AccountID); err == nil || j.AccountID != "" {
		job = j
	}
	out := map[string]any{"ok": true, "account_id": p.AccountID, "state": job.State, "steps": steps(job)}
	if job.Done() {
		out["outstanding"] = job.Outstanding
		out["message"] = "Your account is closed. What closure does not remove is listed under outstanding, and was mailed to " + p.Account.Email + "."
		httpx.WriteJSON(w, http.StatusOK, out)
		return nil
	}
	out["message"] = "Closing has begun and continues in the background; when it ends, what closure does not remove is mailed to " + p.Account.Email + "."
	httpx.WriteJSON(w, http.StatusAccepted, out)
	return nil
}

// steps renders the job's checkpoints.
func steps(job closure.Job) []map[string]any {
	out := make([]map[string]any, 0, len(job.Steps))
	for _, st := range job.Steps {
		m := map[string]any{"name": st.Name, "runs": st.Runs, "done": st.DoneAt != 0}
		if st.DoneAt != 0 {
			m["done_at"] = protocol.FormatTime(time.UnixMilli(st.DoneAt))
		}
		if st.Note != "" {
			m["note"] = st.Note
		}
		if st.Skipped {
			m["skipped"] = true
		}
		out = append(out, m)
	}
	return out
}
