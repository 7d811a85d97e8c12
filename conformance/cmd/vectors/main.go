// Command vectors runs the upstream conformance fixtures in a directory
// against this project's code:
//
//	go run ./conformance/cmd/vectors ../shared/conformance
//
// It prints one line per vector, one "file: N passed, M failed" line per
// fixture file, and finally "N passed, M failed", and exits 1 when anything
// failed or a known file could not be parsed.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"agentmesh.dev/mesh/conformance/vectors"
)

func main() {
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, `usage: vectors DIR

Runs every known conformance fixture file in DIR against this project's own
protocol code and prints one line per vector, one summary line per file, then
"N passed, M failed".
Known files: %s.
Cases that need a running mesh are listed as deferred and not counted as passed.
Exit status: 0 when nothing failed, 1 on a failure, 2 on a usage error.
`, strings.Join(vectors.KnownFiles(), ", "))
	}
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	r, err := vectors.Run(flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, "vectors:", err)
		os.Exit(2)
	}
	if len(r.Files) == 0 {
		fmt.Fprintf(os.Stderr, "vectors: no known fixture file in %s\n", flag.Arg(0))
		os.Exit(1)
	}
	r.Write(os.Stdout)
	if !r.OK() {
		os.Exit(1)
	}
}
