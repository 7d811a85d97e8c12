// Package routes is the route table: every row of every function group,
// in the order meshd mounts them. It is the single source of meshd's mux,
// the Cloud Function registrations (deploy.go), Terraform's function map,
// the load balancer's URL map and the Cloud Scheduler jobs (cmd/meshgen).
package routes

import (
	"slices"

	"agentmesh.dev/mesh/functions/accounts"
	"agentmesh.dev/mesh/functions/api"
	"agentmesh.dev/mesh/functions/audit"
	"agentmesh.dev/mesh/functions/closure"
	"agentmesh.dev/mesh/functions/console"
	"agentmesh.dev/mesh/functions/credentials"
	"agentmesh.dev/mesh/functions/engagements"
	"agentmesh.dev/mesh/functions/grants"
	"agentmesh.dev/mesh/functions/guest"
	"agentmesh.dev/mesh/functions/health"
	"agentmesh.dev/mesh/functions/registrar"
	"agentmesh.dev/mesh/functions/rooms"
)

// All returns every row. The table is checked (api.Check) by this
// package's tests; a malformed row never reaches a deployment.
func All() []api.Route {
	return slices.Concat(health.Routes, accounts.Routes, credentials.Routes, guest.Routes, registrar.Routes, grants.Routes, closure.Routes, console.Routes, rooms.Routes, audit.Routes, engagements.Routes)
}
