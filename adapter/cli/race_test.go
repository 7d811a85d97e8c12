//go:build race

package cli_test

// raceBuild builds the binary under test with the race detector too, so
// the daemon's goroutines are checked when the suite runs with -race.
func init() { buildFlags = append(buildFlags, "-race") }
