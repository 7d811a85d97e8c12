// Command clearing-worker runs the clearing bus worker on its own: one Cloud Run
// service, every copy in the same queue group, with the production
// configuration of its row in the workers table. meshd runs the same row
// in-process.
//
//	clearing-worker --nats-url tls://nats.example:4222 --creds worker.creds --services-key services.nk
//
// clearing-worker --help lists the flags and their MESH_* variables.
package main

import "agentmesh.dev/mesh/workers"

func main() { workers.Main("clearing") }
