package registry_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/registry"
)

// mesh.internal.registry.remove (account closure) removes any
// registration of the agents named, sandbox or not, and only those; three
// callers at once over three copies remove each once, with one
// agent_reaped event (reason account_closed) per agent; asking again
// removes nothing and is not an error; and only the services key may ask.
func TestRemoveForClosure(t *testing.T) {
	f := setup(t, registry.Config{})
	a, b, other, n := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t), bustest.Node(t)
	f.mustRegister(a, manifest(t, a, n, month, nil))
	f.mustRegister(other, manifest(t, other, n, month, nil))
	// b is sandbox: registered on a node-bound subject.
	if _, err := f.call(b, protocol.SubjRegister+"."+b.Public(), protocol.TypeRegister, manifest(t, b, b, time.Hour, nil)); err != nil {
		t.Fatal(err)
	}
	never := bustest.Agent(t) // never registered
	body := map[string]any{"agents": []string{a.Public(), b.Public(), never.Public(), a.Public()}}

	for _, k := range []keys.Signer{a, bustest.Agent(t)} {
		if out, err := f.call(k, protocol.SubjRegistryRemove, protocol.TypeRequest, body); errs.CodeOf(err) != errs.Forbidden {
			t.Fatalf("remove signed by an agent: %v %v, want FORBIDDEN", out, err)
		}
	}
	if _, found := f.stored(a.Public()); !found {
		t.Fatal("a refused remove removed a registration")
	}
	_, err := f.call(f.m.ServicesKey(), protocol.SubjRegistryRemove, protocol.TypeRequest, map[string]any{"agents": []string{"not-a-key"}})
	wantCode(t, err, errs.InvalidRequest, "not an agent's public key")

	var mu sync.Mutex
	var got []string
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			out, err := f.call(f.m.ServicesKey(), protocol.SubjRegistryRemove, protocol.TypeRequest, body)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for _, v := range out["removed"].([]any) {
				got = append(got, v.(string))
			}
		})
	}
	wg.Wait()
	slices.Sort(got)
	want := []string{a.Public(), b.Public()}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("removed %v over three calls, want each of %v once", got, want)
	}
	for agent, kept := range map[string]bool{a.Public(): false, b.Public(): false, other.Public(): true} {
		if _, found := f.stored(agent); found != kept {
			t.Errorf("%s stored %v, want %v", agent, found, kept)
		}
	}
	for _, agent := range want {
		if ev := f.events.expect(t, registry.EventReaped, agent, 1); ev[0].Data["reason"] != registry.ReasonAccountClosed {
			t.Errorf("reaped event %v", ev[0].Data)
		}
	}
	out, err := f.call(f.m.ServicesKey(), protocol.SubjRegistryRemove, protocol.TypeRequest, body)
	if err != nil || len(out["removed"].([]any)) != 0 {
		t.Fatalf("asking again: %v %v", out, err)
	}
}
