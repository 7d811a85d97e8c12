// Command agreements-worker runs the agreements bus worker on its own: one
// Cloud Run service, every copy in the same queue group, with the
// production configuration of its row in the workers table. meshd runs the
// same row in-process.
//
//	agreements-worker --nats-url tls://nats.example:4222 --creds worker.creds --services-key services.nk --console-url https://mesh.example.org/console/
//
// agreements-worker --help lists the flags and their MESH_* variables.
package main

import "agentmesh.dev/mesh/workers"

func main() { workers.Main("agreements") }
