//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package registrar

import (
	"os"
	"syscall"
)

// lockFile takes an exclusive advisory lock (flock) on path, creating it
// (0600) if needed, and waits for it. The lock ends with release, or with
// the process.
func lockFile(path string) (release func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
