// Command meshgen writes the generated part of terraform/ from the tables
// the code is built from (DESIGN §2, "Composition is one tested layer"):
//
//   - routes.tf.json: from functions/routes.All(), one Cloud Function per
//     row (all from one source zip, each with its own entry point, running
//     as the runtime service account); for every row on the public host a
//     serverless NEG, a backend service, an allUsers invoker binding and a
//     route rule of the load balancer's URL map; for every scheduled row an
//     invoker binding for the scheduler's account and a Cloud Scheduler job;
//   - workers.tf.json: from the worker table, one Cloud Run service per
//     worker with its replica counts, its own service account and read
//     access to exactly its credential and the services seed.
//
// Run it with `go generate ./terraform` (or `go run ./cmd/meshgen -out
// terraform` from the module root). The package's tests regenerate the
// files in memory and fail on any difference with what is committed.
package main

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"agentmesh.dev/mesh/functions/routes"
)

func main() {
	out := flag.String("out", "terraform", "the directory the generated files are written to")
	flag.Parse()
	files, err := Files(routes.All(), workerRows())
	if err != nil {
		fmt.Fprintf(os.Stderr, "meshgen: %v\n", err)
		os.Exit(1)
	}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		path := filepath.Join(*out, name)
		if err := os.WriteFile(path, files[name], 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "meshgen: %v\n", err)
			os.Exit(1)
		}
	}
}
