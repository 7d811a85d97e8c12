// Command mesh-adapter gives an agent an inbound address on the mesh (spec
// §4.2). See `mesh-adapter help`.
package main

import (
	"os"

	"agentmesh.dev/mesh/adapter/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Getenv))
}
