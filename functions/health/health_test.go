package health

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"agentmesh.dev/mesh/functions/api"
)

func TestHealthRoute(t *testing.T) {
	mux := http.NewServeMux()
	(&api.Deps{}).Mount(mux, Routes)
	for _, c := range []struct {
		method string
		status int
	}{{http.MethodGet, 200}, {http.MethodPost, 405}} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(c.method, "/v1/health", nil))
		if rec.Code != c.status {
			t.Errorf("%s: status %d, want %d", c.method, rec.Code, c.status)
		}
		if c.status == 200 {
			var body struct {
				OK       bool   `json:"ok"`
				Protocol string `json:"protocol"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || !body.OK || body.Protocol == "" {
				t.Errorf("body %s (%v)", rec.Body, err)
			}
		}
	}
}
