package node

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"agentmesh.dev/mesh/shared/errs"
)

// rooms.invite is the runtime's, like describe: the hook answers it before
// admission, without an accept, and the handler never sees it.
func TestRoomInviteIsAnsweredByTheRuntime(t *testing.T) {
	var seen atomic.Pointer[Call]
	p, w := newWorkerPair(t, func(c *AgentConfig) {
		c.RoomInvite = func(ctx context.Context, call *Call) (any, error) {
			seen.Store(call)
			var in struct {
				Rooms string `json:"rooms"`
			}
			if err := call.DecodeInput(&in); err != nil {
				return nil, err
			}
			if in.Rooms != "v1" {
				return nil, errs.New(errs.InputInvalid, "not a v1 invite")
			}
			return map[string]any{"accepted": true}, nil
		}
	})
	res, err := p.a.Request(t.Context(), p.b.ID(), OfferingRoomsInvite, map[string]any{"rooms": "v1"}, RequestOptions{ContextID: "room-1"})
	if err != nil {
		t.Fatal(err)
	}
	out, _ := res.Output.(map[string]any)
	if res.Status != "completed" || out["accepted"] != true || res.Accepted {
		t.Fatalf("result %+v", res)
	}
	if c := seen.Load(); c == nil || c.Env.ContextID != "room-1" || c.Sender() != p.a.ID() {
		t.Fatalf("the hook saw %+v", c)
	}
	// The hook's refusal is the answer.
	_, err = p.a.Request(t.Context(), p.b.ID(), OfferingRoomsInvite, map[string]any{"rooms": "v9"}, RequestOptions{})
	mustCode(t, err, errs.InputInvalid)
	if w.calls.Load() != 0 {
		t.Fatal("the handler saw a room invite")
	}
}

func TestRoomInviteWithoutAHook(t *testing.T) {
	p, w := newWorkerPair(t, nil)
	_, err := p.a.Request(t.Context(), p.b.ID(), OfferingRoomsInvite, map[string]any{"rooms": "v1"}, RequestOptions{})
	mustCode(t, err, errs.OfferingNotFound)
	if !strings.Contains(err.Error(), "does not take room invites") || w.calls.Load() != 0 {
		t.Fatalf("without a hook: %v (handler calls %d)", err, w.calls.Load())
	}
	// The offering is reserved: an agent cannot declare it.
	if err := checkAgentConfig(AgentConfig{Key: agentKey(t), Name: "x", Handler: refuseAll, Offerings: []Offering{{ID: OfferingRoomsInvite}}}); err == nil ||
		!strings.Contains(err.Error(), "reserved") {
		t.Fatalf("declaring rooms.invite: %v", err)
	}
}
