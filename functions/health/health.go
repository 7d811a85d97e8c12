// Package health is the health route of the HTTP surface, deployed as its
// own Cloud Function and mounted on meshd's mux. It answers whether the
// function instance is up and which protocol version it speaks; the bus
// health of one machine is meshd's /healthz.
package health

import (
	"net/http"

	"github.com/GoogleCloudPlatform/functions-framework-go/functions"

	"agentmesh.dev/mesh/functions/api"
	"agentmesh.dev/mesh/shared/httpx"
	"agentmesh.dev/mesh/shared/protocol"
)

// Routes is the group's route table.
var Routes = []httpx.Route{
	{EntryPoint: "Health", Method: http.MethodGet, Path: "/v1/health"},
}

// Group is the function group. It needs no dependencies.
var Group = api.Group{Routes: Routes, Handler: func(*api.Deps, httpx.Route) httpx.HandlerFunc { return handle }}

// The health function must answer even when nothing else is configured, so
// it registers directly instead of through the lazy dependency builder.
func init() {
	functions.HTTP(Routes[0].EntryPoint, httpx.SingleRoute(Routes[0], nil, httpx.Handle(nil, handle)).ServeHTTP)
}

func handle(w http.ResponseWriter, r *http.Request) error {
	httpx.WriteJSON(w, http.StatusOK, map[string]any{"ok": true, "protocol": protocol.Version})
	return nil
}
