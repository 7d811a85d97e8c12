package devenv_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/store"
	"agentmesh.dev/mesh/shared/store/firestorestore"
)

// cpStore, when set, makes the store of every control plane startCP
// starts; nil keeps bbolt in the data directory. TestControlPlaneOnFirestore
// sets it for the tests it runs again.
var cpStore func(t *testing.T) store.Store

// emulatorAttempts is the transaction attempt budget against Google's
// Firestore emulator, which settles lock conflicts only by a 2-second
// timeout (as in shared/store/firestorestore's tests): a 50-way race there
// may take many rounds, and must not answer 503 for it.
const emulatorAttempts = 20

// The control plane's end-to-end tests that hinge on the store run once
// more with the control plane on Firestore (Google's emulator), as in the
// cloud: an am_ key exchanged by 50 racing requests (exactly one wins,
// nothing half-written), the registrar's pairing, and sign-in and sign-out
// with sessions, all through HTTP. Only with Google's emulator: the npm one
// does not isolate transactions, so a race proves nothing on it.
func TestControlPlaneOnFirestore(t *testing.T) {
	host, kind := os.Getenv("FIRESTORE_EMULATOR_HOST"), os.Getenv("FIRESTORE_EMULATOR_KIND")
	switch {
	case host == "":
		t.Skip("skipped: FIRESTORE_EMULATOR_HOST is not set; .ci/run starts Google's Firestore emulator and runs the control plane on it")
	case kind != "google":
		t.Skipf("skipped: FIRESTORE_EMULATOR_KIND=%q, not google: only Google's emulator isolates transactions, so the races cannot be checked on the one at %s", kind, host)
	}
	project := os.Getenv("FIRESTORE_PROJECT_ID")
	if project == "" {
		project = "mesh-test"
	}
	run := fmt.Sprintf("cp%d_", time.Now().UnixNano())
	var opened []*countingStore
	cpStore = func(t *testing.T) store.Store {
		t.Helper()
		s, err := firestorestore.New(context.Background(), project)
		if err != nil {
			t.Fatal(err)
		}
		// Registered before startCP's Close of the mesh, so it runs after it.
		t.Cleanup(func() { s.Close() })
		// Every mesh its own collections: each test expects an empty store.
		cs := &countingStore{Store: s.WithPrefix(fmt.Sprintf("%s%d_", run, len(opened)+1)).WithMaxAttempts(emulatorAttempts), name: t.Name()}
		opened = append(opened, cs)
		return cs
	}
	t.Cleanup(func() { cpStore = nil })
	t.Logf("control plane on Google's Firestore emulator at %s (project %s)", host, project)
	for _, c := range []struct {
		name string
		fn   func(*testing.T)
	}{
		{"BootstrapSingleUseUnderConcurrency", TestBootstrapSingleUseUnderConcurrency},
		{"RegistrarFlow", TestRegistrarFlow},
		{"SignInByMailedCode", TestSignInByMailedCode},
	} {
		t.Run(c.name, c.fn)
	}
	// Each mesh really ran on Firestore, not on a bbolt file of its own.
	for _, cs := range opened {
		if n := cs.n.Load(); n == 0 {
			t.Errorf("%s: the control plane never used its Firestore store", cs.name)
		} else {
			t.Logf("%s: %d transactions on Firestore", cs.name, n)
		}
	}
}

// countingStore counts the transactions run on a store.
type countingStore struct {
	store.Store
	name string
	n    atomic.Int64
}

func (c *countingStore) RunTx(ctx context.Context, fn func(store.Tx) error) error {
	c.n.Add(1)
	return c.Store.RunTx(ctx, fn)
}
