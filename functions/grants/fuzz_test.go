package grants

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"testing"
)

// FuzzDecodeGrant: the POST body decoder never panics, and what it accepts
// is one JSON object of at most the three members, each a string.
func FuzzDecodeGrant(f *testing.F) {
	f.Add([]byte(`{"provider":"gcp","project_id":"acme-agents","service_account":"mesh-agent@acme-agents.iam.gserviceaccount.com"}`))
	f.Add([]byte(`{"provider":"gcp","state":"verified"}`))
	f.Add([]byte(`{"provider":"gcp","verified_at":null}`))
	f.Add([]byte(`{"Provider":"gcp"}`))
	f.Add([]byte(`{"provider":"gcp","provider":"aws"}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		r := httptest.NewRequest("POST", "/v1/accounts/a/cloud/grants", bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		req, err := decodeGrant(httptest.NewRecorder(), r)
		if err != nil {
			return
		}
		var m map[string]any
		if err := json.Unmarshal(body, &m); err != nil {
			t.Fatalf("accepted a body that is not a JSON object: %q", body)
		}
		for k, v := range m {
			if k != "provider" && k != "project_id" && k != "service_account" {
				t.Fatalf("accepted member %q in %q", k, body)
			}
			if _, ok := v.(string); !ok && v != nil {
				t.Fatalf("accepted a %T for %s", v, k)
			}
		}
		if s, _ := m["provider"].(string); s != req.Provider {
			t.Fatalf("provider %q decoded as %q", s, req.Provider)
		}
	})
}
