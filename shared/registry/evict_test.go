package registry_test

import (
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/registry"
)

// mesh.internal.guest.evict is for the control plane, which signs with the
// services key. The broker keeps agents off mesh.internal.>; should a
// credential ever get through, an envelope signed by any other key (an
// agent's, even the guest's own) is refused with FORBIDDEN and removes
// nothing.
func TestGuestEvictNeedsServicesKey(t *testing.T) {
	f := setup(t, registry.Config{})
	guest := bustest.Agent(t)
	f.lease(guest)
	f.mustRegister(guest, manifest(t, guest, guest, 72*time.Hour, nil)) // a leased guest: sandbox
	evict := func(signer keys.Signer) (map[string]any, error) {
		t.Helper()
		return f.call(signer, protocol.SubjGuestEvict, protocol.TypeRequest, map[string]any{"keys": []string{guest.Public()}})
	}
	for _, k := range []keys.Signer{bustest.Agent(t), guest} {
		if out, err := evict(k); errs.CodeOf(err) != errs.Forbidden {
			t.Fatalf("evict signed by an agent: %v %v, want FORBIDDEN", out, err)
		}
	}
	if _, found := f.stored(guest.Public()); !found {
		t.Fatal("a refused evict removed the registration")
	}
	f.events.expect(t, registry.EventReaped, guest.Public(), 0)
	out, err := evict(f.m.ServicesKey())
	if err != nil {
		t.Fatal(err)
	}
	if ev, _ := out["evicted"].([]any); len(ev) != 1 || ev[0] != guest.Public() {
		t.Fatalf("evict signed by the services key: %v", out)
	}
	if _, found := f.stored(guest.Public()); found {
		t.Fatal("the guest's registration is still stored")
	}
	f.events.expect(t, registry.EventReaped, guest.Public(), 1)
}
