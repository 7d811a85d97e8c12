package registrar

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/keys"
)

const pinsBase = "https://names.example.org"

// pinnedHandles is how many handles the pins file holds for pinsBase.
func pinnedHandles(t *testing.T, path string) int {
	t.Helper()
	f, err := OpenPins(path).load()
	if err != nil {
		t.Fatal(err)
	}
	r := f.Registrars[normalizeBase(pinsBase)]
	if r == nil {
		return 0
	}
	return len(r.Handles)
}

// Concurrent sends each open their own Pins (the running adapter opens one
// per send) and must not lose each other's pins: a lost pin silently turns
// trust on first use back on for that handle.
func TestPinsConcurrentInOneProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state", PinsFile)
	reg := genKey[keys.RegistrarRole](t)
	agent := genKey[keys.AgentRole](t).Public()
	const n = 40
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			// Half by the same path spelled differently, which must share
			// the lock too.
			p := path
			if i%2 == 1 {
				p = filepath.Join(filepath.Dir(path), ".", PinsFile)
			}
			if _, err := OpenPins(p).Pin(pinsBase, reg.Public(), fmt.Sprintf("h%d.ana@example.org", i), agent, false, time.Now()); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := pinnedHandles(t, path); got != n {
		t.Fatalf("%d of %d handles pinned", got, n)
	}
	fi, err := os.Stat(path + LockSuffix)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("lock file: %v %v", fi, err)
	}
}

// The helper process of TestPinsConcurrentAcrossProcesses: it pins
// MESH_PINS_HELPER_COUNT handles named after MESH_PINS_HELPER_NAME.
func TestPinsHelperProcess(t *testing.T) {
	path := os.Getenv("MESH_PINS_HELPER_PATH")
	if path == "" {
		t.Skip("helper process of TestPinsConcurrentAcrossProcesses")
	}
	count, _ := strconv.Atoi(os.Getenv("MESH_PINS_HELPER_COUNT"))
	name, key, agent := os.Getenv("MESH_PINS_HELPER_NAME"), os.Getenv("MESH_PINS_HELPER_KEY"), os.Getenv("MESH_PINS_HELPER_AGENT")
	var wg sync.WaitGroup
	for i := range count {
		wg.Go(func() {
			if _, err := OpenPins(path).Pin(pinsBase, key, fmt.Sprintf("%s%d.ana@example.org", name, i), agent, false, time.Now()); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
}

// Two processes pinning at once (the running adapter and a one-shot send)
// keep every pin: the file lock serialises them.
func TestPinsConcurrentAcrossProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two processes")
	}
	path := filepath.Join(t.TempDir(), PinsFile)
	reg := genKey[keys.RegistrarRole](t)
	agent := genKey[keys.AgentRole](t).Public()
	const each = 20
	var cmds []*exec.Cmd
	for _, name := range []string{"a", "b"} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestPinsHelperProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), "MESH_PINS_HELPER_PATH="+path, "MESH_PINS_HELPER_COUNT="+strconv.Itoa(each),
			"MESH_PINS_HELPER_NAME="+name, "MESH_PINS_HELPER_KEY="+reg.Public(), "MESH_PINS_HELPER_AGENT="+agent)
		out, err := os.CreateTemp(t.TempDir(), "out")
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	for _, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			out, _ := os.ReadFile(cmd.Stdout.(*os.File).Name())
			t.Fatalf("helper: %v\n%s", err, out)
		}
	}
	if got := pinnedHandles(t, path); got != 2*each {
		t.Fatalf("%d of %d handles pinned", got, 2*each)
	}
}
