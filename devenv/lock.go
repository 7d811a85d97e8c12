package devenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// LockFile is the data directory's lock: whoever holds an exclusive flock
// on it (a running meshd, or an admin command working on a stopped mesh's
// files) owns the directory, and the file says which process that is.
// The kernel drops the lock when its holder exits, however it exits (kill
// -9 included), so a file left by a dead process never blocks anyone.
const LockFile = "meshd.lock"

// ErrLocked matches (errors.Is) the error of a lock another process holds.
var ErrLocked = errors.New("the data directory is in use")

// LockedError says which process holds a data directory's lock.
type LockedError struct {
	Dir  string
	Role string // "meshd" or "meshd admin"
	PID  int    // 0 when the lock file does not say
}

func (e *LockedError) Error() string {
	pid := ""
	if e.PID > 0 {
		pid = ", pid " + strconv.Itoa(e.PID)
	}
	return fmt.Sprintf("another %s is running on this data dir%s (%s): stop it first, or use another data dir", e.Role, pid, e.Dir)
}

func (e *LockedError) Is(target error) bool { return target == ErrLocked }

// DirLock is a held data-directory lock.
type DirLock struct{ f *os.File }

// LockDataDir takes the data directory's lock without waiting, writing
// this process's pid and role ("meshd", "meshd admin") into the file. When
// another process holds it, the error is a *LockedError naming it.
func LockDataDir(dataDir, role string) (*DirLock, error) {
	path := filepath.Join(dataDir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("devenv: lock %s: %w", path, err)
	}
	held, err := tryLock(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("devenv: lock %s: %w", path, err)
	}
	if held {
		defer f.Close()
		return nil, lockedBy(dataDir, f)
	}
	// The holder's pid, for whoever finds the directory locked. Written
	// once the lock is ours, so it never overwrites another holder's.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+" "+role+"\n"), 0)
	}
	return &DirLock{f: f}, nil
}

// lockedBy reads who holds the lock from its file.
func lockedBy(dataDir string, f *os.File) error {
	b := make([]byte, 128)
	n, _ := f.ReadAt(b, 0)
	pid, role, _ := strings.Cut(strings.TrimSpace(string(b[:n])), " ")
	e := &LockedError{Dir: dataDir, Role: role}
	if e.Role == "" {
		e.Role = "meshd"
	}
	e.PID, _ = strconv.Atoi(pid)
	return e
}

// Unlock releases the lock. The file stays: removing it would let a process
// that opened it before the removal lock a file nobody else sees.
func (l *DirLock) Unlock() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close() // closing the descriptor drops the flock
	l.f = nil
	return err
}
