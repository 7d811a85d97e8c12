// Package health is the health route of the HTTP surface, deployed as its
// own Cloud Function and mounted on meshd's mux. It answers whether the
// function instance is up and which protocol version it speaks; the bus
// health of one machine is meshd's /healthz.
package health

import (
	"encoding/json"
	"net/http"

	"github.com/GoogleCloudPlatform/functions-framework-go/functions"

	"agentmesh.dev/mesh/shared/protocol"
)

// Route is one HTTP route of this group: the Cloud Function entry point and
// the method and path it serves.
type Route struct {
	EntryPoint string
	Method     string
	Path       string
}

// Routes lists this group's routes; Terraform's function map and the local
// mux are both derived from it.
var Routes = []Route{
	{EntryPoint: "Health", Method: http.MethodGet, Path: "/v1/health"},
}

func init() {
	functions.HTTP("Health", Handle)
}

// Mount registers every route of the group on mux.
func Mount(mux *http.ServeMux) {
	for _, r := range Routes {
		mux.HandleFunc(r.Method+" "+r.Path, Handle)
	}
}

// Handle answers {ok, protocol}.
func Handle(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		http.Error(w, `{"ok":false,"error":"method not allowed","code":"INVALID_REQUEST"}`, http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(map[string]any{"ok": true, "protocol": protocol.Version})
}
