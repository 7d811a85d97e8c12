package activity_test

import (
	"context"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/feeds"
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

// Erasing a key erases its feeds too: the history MESH_FEED keeps of
// mesh.feed.<key>.* and the latest envelopes in mesh_feeds, so mesh.feed.get
// answers nothing for it afterwards; another agent's feeds stay.
func TestGuestEraseFeeds(t *testing.T) {
	h := start(t)
	fw, err := feeds.Start(t.Context(), bustest.Env(t, h.m, "feeds", nil), feeds.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fw.Stop() })
	guest, other, reader := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)
	get := func(agent, topic string, history bool) map[string]any {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		q := map[string]any{"agent": agent, "topic": topic}
		if history {
			q["since"] = 0
		}
		rep, err := bus.Call(ctx, h.nc, reader, protocol.SubjFeedGet, protocol.TypeRequest, "", q)
		if err != nil {
			t.Fatalf("feed get %v: %v", q, err)
		}
		var out map[string]any
		if err := rep.DecodePayload(&out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	held := func(agent, topic string) bool {
		latest, hist := get(agent, topic, false), get(agent, topic, true)
		l, _ := hist["history"].([]any)
		return latest["found"] == true && len(l) > 0
	}
	for _, k := range []*keys.Agent{guest, other} {
		for _, topic := range []string{"log", "notes"} {
			e, _ := protocol.New(protocol.TypeEmit, k.Public(), map[string]any{"topic": topic, "kind": "stream", "data": 1})
			_ = e.Sign(k)
			b, _ := e.Marshal()
			if err := h.nc.Publish(protocol.FeedSubject(k.Public(), topic), b); err != nil {
				t.Fatal(err)
			}
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for !held(guest.Public(), "log") || !held(guest.Public(), "notes") || !held(other.Public(), "log") {
		if time.Now().After(deadline) {
			t.Fatal("the feeds never held the emits")
		}
		time.Sleep(10 * time.Millisecond)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	c := &bus.Caller{NC: h.nc, Key: h.m.ServicesKey()}
	if _, err := c.Call(ctx, protocol.SubjGuestErase, protocol.TypeRequest, map[string]any{"keys": []string{guest.Public()}}); err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{"log", "notes"} {
		if latest := get(guest.Public(), topic, false); latest["found"] != false {
			t.Errorf("the erased key's latest %s: %v", topic, latest)
		}
		if hist := get(guest.Public(), topic, true); len(hist["history"].([]any)) != 0 {
			t.Errorf("the erased key's %s history: %v", topic, hist)
		}
	}
	if !held(other.Public(), "log") {
		t.Error("another agent's feed was erased")
	}
}
