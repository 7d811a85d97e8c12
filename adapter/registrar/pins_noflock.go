//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package registrar

// lockFile is a no-op where flock is not available: there only the
// process-wide mutex serialises changes to the pins file, and a one-shot
// send running beside the adapter may still lose a pin.
func lockFile(string) (release func(), err error) { return func() {}, nil }
