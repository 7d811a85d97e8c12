package activity_test

import (
	"context"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// mesh.internal.guest.erase is for the control plane, which signs with the
// services key. The broker keeps agents off mesh.internal.>; should a
// credential ever get through, an envelope signed by any other key (here
// an agent's, even the guest's own) is refused with FORBIDDEN and erases
// nothing.
func TestGuestEraseNeedsServicesKey(t *testing.T) {
	h := start(t)
	guest, peer := bustest.Agent(t), bustest.Agent(t)
	req, _ := request(t, guest, peer.Public())
	_, answer := response(t, peer, req, map[string]any{"status": "completed"})
	h.publish(protocol.OutboxSubject(peer.Public()), answer, 2)
	rows := func() int {
		t.Helper()
		deadline := time.Now().Add(3 * time.Second)
		for {
			l := h.activity(map[string]any{"from": guest.Public()})
			if l.Total > 0 || time.Now().After(deadline) {
				return l.Total
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if n := rows(); n != 1 {
		t.Fatalf("the guest's request is not in the timeline: %d rows", n)
	}

	erase := func(signer keys.Signer) (map[string]any, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		c := &bus.Caller{NC: h.nc, Key: signer}
		return c.Call(ctx, protocol.SubjGuestErase, protocol.TypeRequest, map[string]any{"keys": []string{guest.Public()}})
	}
	for _, k := range []keys.Signer{bustest.Agent(t), guest} {
		if out, err := erase(k); errs.CodeOf(err) != errs.Forbidden {
			t.Fatalf("erase signed by an agent: %v %v, want FORBIDDEN", out, err)
		}
	}
	if n := rows(); n != 1 {
		t.Fatalf("a refused erase removed rows: %d left", n)
	}
	out, err := erase(h.m.ServicesKey())
	// One record: the request, carrying its answer.
	if err != nil || out["erased"] != 1.0 {
		t.Fatalf("erase signed by the services key: %v %v, want the record of the request and its answer erased", out, err)
	}
	if l := h.activity(map[string]any{"from": guest.Public()}); l.Total != 0 {
		t.Fatalf("%d rows left after the erase", l.Total)
	}
}
