package devenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A second mesh on a data directory in use is refused before it opens
// anything, with the holder's pid; the first one goes on serving, its
// admin socket included.
func TestSecondMeshOnTheSameDataDirIsRefused(t *testing.T) {
	dir := t.TempDir()
	first := startMesh(t, dir)

	done := make(chan error, 1)
	go func() {
		m, err := Start(context.Background(), Config{DataDir: dir})
		if err == nil {
			_ = m.Close()
		}
		done <- err
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("a second Start on a data dir in use did not return (it waits on a store the first one holds)")
	}
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second Start: %v, want ErrLocked", err)
	}
	want := fmt.Sprintf("another meshd is running on this data dir, pid %d", os.Getpid())
	if !strings.Contains(err.Error(), want) {
		t.Errorf("second Start: %q, want it to say %q", err, want)
	}

	resp, err := http.Get(first.URLs().Control + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("the first mesh after the refused start: /healthz %d", resp.StatusCode)
	}
	if _, err := os.Stat(filepath.Join(dir, AdminSocket)); err != nil {
		t.Errorf("the first mesh's admin socket: %v", err)
	}
}

// The admin commands' way into a stopped mesh never opens the store of a
// running one: it is refused on the lock, naming the meshd.
func TestOpenControlRefusesARunningMesh(t *testing.T) {
	dir := t.TempDir()
	m := startMesh(t, dir)

	_, closeFn, err := OpenControl(dir, nil)
	if err == nil {
		_ = closeFn()
		t.Fatal("OpenControl opened the store of a running mesh")
	}
	var locked *LockedError
	if !errors.As(err, &locked) || locked.Role != "meshd" || locked.PID != os.Getpid() {
		t.Fatalf("OpenControl on a running mesh: %v, want a LockedError naming meshd, pid %d", err, os.Getpid())
	}

	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	c, closeFn, err := OpenControl(dir, nil)
	if err != nil {
		t.Fatalf("OpenControl on the stopped mesh: %v", err)
	}
	// While the admin command works, no meshd starts there.
	if _, err := Start(context.Background(), Config{DataDir: dir}); !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "meshd admin") {
		t.Errorf("Start while an admin command holds the directory: %v", err)
	}
	if c.Accounts == nil {
		t.Error("no account service")
	}
	if err := closeFn(); err != nil {
		t.Fatal(err)
	}
	l, err := LockDataDir(dir, "meshd")
	if err != nil {
		t.Fatalf("the lock after the admin command closed: %v", err)
	}
	_ = l.Unlock()
}

// lockHolderEnv makes the test binary a process that takes a data
// directory's lock and waits to be killed.
const lockHolderEnv = "DEVENV_TEST_HOLD_LOCK"

func TestMain(m *testing.M) {
	if dir := os.Getenv(lockHolderEnv); dir != "" {
		if _, err := LockDataDir(dir, "meshd"); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println("locked")
		select {}
	}
	os.Exit(m.Run())
}

// The lock dies with its process, even by kill -9, and the file it leaves
// (with the dead pid in it) does not block the next one.
func TestDataDirLockDiesWithItsProcess(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), lockHolderEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "locked\n" {
		t.Fatalf("the lock holder said %q, %v", line, err)
	}

	_, err = LockDataDir(dir, "meshd")
	var locked *LockedError
	if !errors.As(err, &locked) || locked.PID != cmd.Process.Pid {
		t.Fatalf("lock held by pid %d: %v", cmd.Process.Pid, err)
	}

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	stale, err := os.ReadFile(filepath.Join(dir, LockFile))
	if err != nil || !strings.HasPrefix(string(stale), strconv.Itoa(cmd.Process.Pid)+" ") {
		t.Fatalf("the lock file after kill -9: %q, %v (want the dead pid left in it)", stale, err)
	}
	l, err := LockDataDir(dir, "meshd")
	if err != nil {
		t.Fatalf("lock after its holder was killed: %v", err)
	}
	defer l.Unlock()
	now, _ := os.ReadFile(filepath.Join(dir, LockFile))
	if want := strconv.Itoa(os.Getpid()) + " meshd\n"; string(now) != want {
		t.Errorf("lock file = %q, want %q", now, want)
	}
}
