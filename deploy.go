// Package mesh is the root of the source tree Cloud Functions deploys. The
// Go buildpack builds only the package at the root of the uploaded source,
// so this file is the one place that registers functions: in its init it
// walks the route table and registers every row under its entry point; the
// deployment picks one by --entry-point (DESIGN §3). The dependencies are
// built once per instance, on its first request, by functions/cloud from
// the environment, and every log line carries the request's trace. The
// function groups have no init side effects, so meshd
// and the tests link neither the Functions Framework nor Firestore.
package mesh

import (
	"log/slog"
	"os"

	"github.com/GoogleCloudPlatform/functions-framework-go/functions"

	"agentmesh.dev/mesh/functions/api"
	"agentmesh.dev/mesh/functions/cloud"
	"agentmesh.dev/mesh/functions/routes"
	"agentmesh.dev/mesh/shared/cloudlog"
)

func init() {
	lazy := api.NewLazy(cloud.Deps)
	// A standalone row (health) needs no dependency: it is served without
	// them, behind no limiter, so it answers whatever else is broken.
	bare := &api.Deps{Log: cloudlog.New(os.Stderr, slog.LevelInfo, os.Getenv("GOOGLE_CLOUD_PROJECT"))}
	for _, rt := range routes.All() {
		h := lazy.Handler(rt)
		if rt.Standalone {
			h = bare.Function(rt).ServeHTTP
		}
		functions.HTTP(rt.EntryPoint, cloudlog.Trace(h).ServeHTTP)
	}
}
