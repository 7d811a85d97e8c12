//go:build unix

package daemon

import (
	"errors"
	"os/exec"
	"syscall"
)

// ownGroup runs cmd in a process group of its own (whose id is the
// command's pid) and makes cancelling it kill the whole group with
// SIGKILL: /bin/sh and everything it started, not only the shell.
func ownGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return killGroup(cmd) }
}

// killGroup sends SIGKILL to cmd's process group. A group that no longer
// exists is not an error.
func killGroup(cmd *exec.Cmd) error {
	if cmd.Process == nil {
		return nil
	}
	err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}
