//go:build unix

package daemon

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func cmdAdapter(command string, timeout time.Duration) *adapter {
	return &adapter{cfg: Config{Command: command, CommandTimeout: timeout}, log: slog.New(slog.DiscardHandler)}
}

// alive reports whether pid is a running process: kill(pid, 0) finds it
// and it is not a zombie waiting for a parent (in a container whose init
// does not reap, a killed orphan stays a zombie; it runs nothing).
func alive(t *testing.T, pid int) bool {
	t.Helper()
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	} else if err != nil {
		t.Fatalf("kill(%d, 0): %v", pid, err)
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !errors.Is(err, os.ErrNotExist) // no /proc: trust kill
	}
	// pid (comm) state ...: the state follows the last ')'.
	s := string(stat)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}

// waitGone waits a little for pid to stop running (SIGKILL is delivered
// asynchronously), and kills it if it does not, so a failing test leaves
// nothing behind either.
func waitGone(t *testing.T, pid int) bool {
	t.Helper()
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if !alive(t, pid) {
			return true
		}
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	return false
}

func readPID(t *testing.T, file string) int {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("the command wrote no pid: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		t.Fatalf("pid %q: %v", b, err)
	}
	return pid
}

// The review's M3: a command that times out is killed with everything it
// started. Here the shell starts a sleep (a grandchild of the adapter) and
// waits for it; after the timeout neither is left running.
func TestCommandTimeoutKillsTheWholeGroup(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	a := cmdAdapter(`sleep 987 & echo $! > `+pidFile+`; wait; echo done`, time.Second)
	start := time.Now()
	out, err := a.run(context.Background(), "")
	if err == nil || !strings.Contains(err.Error(), "did not finish within 1s") {
		t.Fatalf("run: %q %v", out, err)
	}
	if took := time.Since(start); took > 4*time.Second {
		t.Errorf("run took %s after a 1 s timeout (the wait was on the grandchild's pipes)", took)
	}
	if pid := readPID(t, pidFile); !waitGone(t, pid) {
		t.Errorf("the command's sleep (pid %d) outlived the timeout", pid)
	}
}

// A command that prints without end is stopped as soon as its output goes
// over the limit, long before the timeout.
func TestCommandStoppedAtTheOutputLimit(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	a := cmdAdapter(`yes & echo $! > `+pidFile+`; wait`, time.Minute)
	start := time.Now()
	out, err := a.run(context.Background(), "")
	if err == nil || !strings.Contains(err.Error(), "printed more than") {
		t.Fatalf("run: %d bytes, %v", len(out), err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("stopping the command at the output limit took %s", took)
	}
	if pid := readPID(t, pidFile); !waitGone(t, pid) {
		t.Errorf("yes (pid %d) outlived the output limit", pid)
	}
}

// A command that answers normally still answers; what it left running in
// the background is stopped once it has exited.
func TestCommandLeavesNothingBehind(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	a := cmdAdapter(`sleep 987 >/dev/null 2>&1 & echo $! > `+pidFile+`; tr a-z A-Z`, time.Minute)
	out, err := a.run(context.Background(), "hello")
	if err != nil || out != "HELLO" {
		t.Fatalf("run: %q %v", out, err)
	}
	if pid := readPID(t, pidFile); !waitGone(t, pid) {
		t.Errorf("the background sleep (pid %d) outlived the run", pid)
	}
}
