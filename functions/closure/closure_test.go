package closure_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"agentmesh.dev/mesh/functions/api"
	closurefn "agentmesh.dev/mesh/functions/closure"
	"agentmesh.dev/mesh/shared/closure"
)

// The rows: the preview takes a session or a read token, closing a session
// only (the passkey is the service's check), and the resume row is a job
// on closure.ResumeEvery. An instance without the closure service answers
// 501 on each, the job included. (The routes' behaviour end to end is
// devenv's TestClosingAnAccount.)
func TestRows(t *testing.T) {
	if err := api.Check(closurefn.Routes); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		method, path string
		auth         api.Auth
	}{
		{"GET", "/v1/accounts/{id}/close", api.SessionOrToken("read")},
		{"POST", "/v1/accounts/{id}/close", api.Session},
		{"POST", "/jobs/account-closure-resume", api.Scheduled(closure.ResumeEvery)},
	}
	if len(closurefn.Routes) != len(want) {
		t.Fatalf("%d rows", len(closurefn.Routes))
	}
	d := &api.Deps{Log: slog.New(slog.DiscardHandler)}
	for i, w := range want {
		rt := closurefn.Routes[i]
		if rt.Method != w.method || rt.Path != w.path || rt.Auth != w.auth {
			t.Errorf("row %s: %s %s %v", rt.EntryPoint, rt.Method, rt.Path, rt.Auth)
		}
		if rt.Auth.Kind != api.AuthScheduled {
			continue // the account routes authenticate first (no account service here: 501 too)
		}
		rec := httptest.NewRecorder()
		d.Function(rt).ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/jobs/account-closure-resume", nil))
		if rec.Code != http.StatusNotImplemented || !strings.Contains(rec.Body.String(), "not configured") {
			t.Errorf("%s without the service: %d %s", rt.EntryPoint, rec.Code, rec.Body)
		}
	}
}
