// Command board-worker runs the work board bus worker on its own: one Cloud
// Run service, every copy in the same queue group, with the production
// configuration of its row in the workers table. meshd runs the same row
// in-process.
//
//	board-worker --nats-url tls://nats.example:4222 --creds worker.creds --services-key services.nk
//
// board-worker --help lists the flags and their MESH_* variables (the
// board's limits among them: MESH_LIMIT_BOARD_LEASE_MAX and others).
package main

import "agentmesh.dev/mesh/workers"

func main() { workers.Main("board") }
