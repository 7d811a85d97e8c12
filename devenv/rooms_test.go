package devenv_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/rooms"
)

// pairHandle claims name under addr at the registrar and pairs agent with
// it, as mesh-adapter join does; it returns the handle.
func (c *cp) pairHandle(addr, name string, agent *keys.Agent) string {
	c.t.Helper()
	tok := c.registrarSession(addr)
	st, out := c.post("/api/handles/claim", map[string]any{"name": name, "operator_name": "Ana"}, tok)
	if st != 200 {
		c.t.Fatalf("claim: %d %v", st, out)
	}
	handle := out["handle"].(string)
	st, out = c.post("/api/pair/start", map[string]any{"handle": handle}, tok)
	if st != 200 {
		c.t.Fatalf("pair/start: %d %v", st, out)
	}
	code := out["code"].(string)
	if st, out := c.post("/api/pair/complete", map[string]any{"code": code, "agent_id": agent.Public(), "signature": protocol.SignPair(agent, code)}, ""); st != 200 {
		c.t.Fatalf("pair/complete: %d %v", st, out)
	}
	return handle
}

// roomCall signs a rooms verb from agent over nc.
func roomCall(t *testing.T, nc *nats.Conn, agent keys.Signer, verb string, payload any) (map[string]any, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	rep, err := bus.Call(ctx, nc, agent, protocol.RoomVerbSubject(verb), protocol.TypeRequest, "", payload)
	if err != nil {
		return nil, err
	}
	v, err := rep.PayloadValue()
	if err != nil {
		t.Fatal(err)
	}
	m, _ := v.(map[string]any)
	return m, nil
}

// A durable room end to end on meshd: an agent paired with a handle at the
// mesh's own registrar provisions a room over its node credential (an
// agent with no handle is NOT_NAMED), says something in it, and reads it
// back from the record.
func TestRoomProvisionSayReplay(t *testing.T) {
	c := startCP(t)
	agent, unnamed := newAgent(t), newAgent(t)
	handle := c.pairHandle("ana@example.org", "coder", agent)
	nc := c.nodeConn(t, newNode(t), agent, unnamed)

	roomID := "e2e-room-" + protocol.RandomToken()[:8]
	desc := func(creator *keys.Agent, id string) map[string]any {
		d := map[string]any{"rooms": "v1", "room_id": id, "name": "e2e", "channels": []any{"main"}, "record": rooms.DurableRecord(id),
			"policy": map[string]any{}, "privacy": rooms.GradeCapability, "creator": creator.Public(), "created_at": protocol.FormatTime(time.Now())}
		sig, err := protocol.SignRoomDescriptor(d, creator)
		if err != nil {
			t.Fatal(err)
		}
		d["sig"] = sig
		return d
	}
	if _, err := roomCall(t, nc, unnamed, "provision", map[string]any{"descriptor": desc(unnamed, "e2e-unnamed")}); errs.CodeOf(err) != errs.NotNamed {
		t.Fatalf("an agent with no handle: %v", err)
	}
	d := desc(agent, roomID)
	out, err := roomCall(t, nc, agent, "provision", map[string]any{"descriptor": d})
	if err != nil || out["created"] != true || out["handle"] != handle {
		t.Fatalf("provision: %v %v", out, err)
	}
	u, err := roomCall(t, nc, agent, "usage", map[string]any{})
	if err != nil || u["operator"] != account.OperatorID("ana@example.org") || u["rooms"] != float64(1) {
		t.Fatalf("usage: %v %v", u, err)
	}

	e, err := protocol.New(protocol.TypeEmit, agent.Public(), map[string]any{"type": "say", "channel": "main", "in_reply_to": nil, "body": "hello, room"})
	if err != nil {
		t.Fatal(err)
	}
	e.ContextID = roomID
	if err := e.Sign(agent); err != nil {
		t.Fatal(err)
	}
	b, _ := e.Marshal()
	if err := nc.Publish(protocol.RoomEventSubject(roomID, "main"), b); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		rep, err := roomCall(t, nc, agent, "replay", map[string]any{"descriptor": d})
		if err != nil {
			t.Fatal(err)
		}
		if msgs := rep["messages"].([]any); len(msgs) == 1 {
			env, _ := json.Marshal(msgs[0].(map[string]any)["envelope"])
			got, err := protocol.Decode(env)
			if err != nil || got.ID != e.ID || got.From != agent.Public() || rep["done"] != true {
				t.Fatalf("replayed %s (%v)", env, err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the say never reached the record: %v", rep)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(c.m.Workers().Rooms) == 0 {
		t.Fatal("devenv runs no rooms worker")
	}
}
