//go:build !unix

package daemon

import "os/exec"

// ownGroup: without process groups, cancelling kills the command only.
func ownGroup(*exec.Cmd) {}

func killGroup(cmd *exec.Cmd) error { return nil }
