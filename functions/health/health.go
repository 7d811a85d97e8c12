// Package health is the health route of the HTTP surface, deployed as its
// own Cloud Function and mounted on meshd's mux. It answers whether the
// function instance is up and which protocol version it speaks; the bus
// health of one machine is meshd's /healthz.
package health

import (
	"net/http"

	"agentmesh.dev/mesh/functions/api"
	"agentmesh.dev/mesh/shared/httpx"
	"agentmesh.dev/mesh/shared/protocol"
)

// Routes is the group's route table.
var Routes = []api.Route{
	{EntryPoint: "Health", Method: http.MethodGet, Path: "/v1/health", Auth: api.Public, Standalone: true,
		Handler: func(*api.Deps) httpx.HandlerFunc { return handle }},
}

func handle(w http.ResponseWriter, r *http.Request) error {
	httpx.WriteJSON(w, http.StatusOK, map[string]any{"ok": true, "protocol": protocol.Version})
	return nil
}
