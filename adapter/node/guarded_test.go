package node

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/admission"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// signedRoster is an owner-signed admission roster: the fixture's defaults
// (contact→allow, registered→hold, anonymous→block) and an allow entry for
// each key in allow.
func signedRoster(t *testing.T, owner *keys.Agent, allow ...string) map[string]any {
	t.Helper()
	list := []any{}
	for _, k := range allow {
		list = append(list, map[string]any{"subject": k, "stance": "allow", "note": "", "updated_at": "2026-07-27T15:00:00.000Z"})
	}
	r := map[string]any{"admission": "v1", "owner_key": owner.Public(),
		"defaults": map[string]any{"contact": "allow", "registered": "hold", "anonymous": "block"},
		"entries":  list, "updated_at": "2026-07-27T15:00:00.000Z"}
	sig, err := protocol.SignRoster(r, owner)
	if err != nil {
		t.Fatal(err)
	}
	r["sig"] = sig
	return r
}

// A guarded agent in the runtime, through the real admission service:
//
//   - a protocol 0.3 request from an allowed sender is relayed; the agent
//     answers at the sender's inbox and publishes its first answer on the
//     relay's reply subject too (Call.answer), which the relay passes to
//     the sender's reply subject at once instead of the queued ack it
//     would send after RelayTimeout (35 s);
//   - the agent calls a performer its roster holds (registered → hold):
//     the answer, at the agent's public inbox, never gets past the
//     admission service, and the agent takes it there, live, on its
//     answers-only subscription;
//   - that performer's request to the agent is not served from the public
//     inbox: the admission service holds it and acknowledges it as queued;
//   - a late answer of that performer (inbox mode: a fresh request naming
//     the original) is kept for the owner in mesh_admission_held.
func TestGuardedAgentInTheRuntime(t *testing.T) {
	tm := newMesh(t)
	owner, allowed := agentKey(t), agentKey(t)
	var served atomic.Int32
	var heldRaw atomic.Pointer[[]byte]
	kG, kP := agentKey(t), agentKey(t)
	nG := tm.startNode(t, nodeKey(t), []*keys.Agent{kG}, nil)
	nP := tm.startNode(t, nodeKey(t), []*keys.Agent{kP}, nil)
	g := tm.host(t, nG, AgentConfig{Key: kG, Name: "guarded", Handler: func(_ context.Context, c *Call) error {
		served.Add(1)
		return c.Reply(map[string]any{"text": "guarded says hi"})
	}})
	p := tm.host(t, nP, AgentConfig{Key: kP, Name: "performer",
		Admit: func(_ context.Context, c *Call, _ *protocol.Budget) error {
			if c.Offering == "later" {
				raw := c.Env.Raw()
				heldRaw.Store(&raw)
				return Hold("entry-1")
			}
			return nil
		},
		Handler: func(_ context.Context, c *Call) error { return c.Reply(map[string]any{"text": "performed"}) }})
	if guarded, err := g.Guard(t.Context(), signedRoster(t, owner, allowed.Public())); err != nil || !guarded {
		t.Fatalf("guard: %v %v", guarded, err)
	}

	t.Run("an allowed 0.3 request is relayed and answered at the sender's inbox", func(t *testing.T) {
		atInbox := tm.collect(t, protocol.InboxSubject(allowed.Public()))
		req := requestEnv03(t, allowed, kG.Public(), "chat", map[string]any{"text": "hi"})
		onReply := tm.rawRequest(t, protocol.InboxSubject(kG.Public()), req)
		eventually(t, "the accept and the answer at the sender's inbox", func() bool { return atInbox.len() == 2 })
		got := atInbox.envelopes(t)
		if s := statuses(got); s[0] != protocol.StatusAccepted || s[1] != protocol.StateCompleted || got[1].InReplyTo != req.ID {
			t.Fatalf("at the inbox: %v", s)
		}
		// The relay forwards the first answer, long before it would say
		// "queued".
		eventually(t, "the relay's copy on the reply subject", func() bool { return onReply.len() == 1 })
		if e := onReply.envelopes(t)[0]; !protocol.IsAccepted(e) || e.From != kG.Public() {
			t.Fatalf("reply subject carried %s from %s", e.Payload, e.From)
		}
		if served.Load() != 1 {
			t.Fatalf("handler ran %d times", served.Load())
		}
	})

	t.Run("an answer from a held performer is taken live at the public inbox", func(t *testing.T) {
		res, err := g.Request(t.Context(), kP.Public(), "chat", nil, RequestOptions{Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != protocol.StateCompleted || res.From != kP.Public() || res.Output.(map[string]any)["text"] != "performed" {
			t.Fatalf("result %+v", res)
		}
	})

	t.Run("the held performer's request is queued, not served", func(t *testing.T) {
		res, err := p.Request(t.Context(), kG.Public(), "chat", nil, RequestOptions{Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if !res.Queued || res.Accepted {
			t.Fatalf("result %+v, want the queued ack", res)
		}
		if served.Load() != 1 {
			t.Fatalf("the guarded agent served a request its roster holds (%d runs)", served.Load())
		}
	})

	t.Run("the held performer's late answer is kept for the owner", func(t *testing.T) {
		res, err := g.Request(t.Context(), kP.Public(), "later", nil, RequestOptions{Timeout: 10 * time.Second})
		if err != nil || !res.Queued {
			t.Fatalf("result %+v %v, want the performer's queued ack", res, err)
		}
		raw := heldRaw.Load()
		if raw == nil {
			t.Fatal("the performer did not hold the request")
		}
		if err := p.AnswerHeld(*raw, map[string]any{"text": "much later"}); err != nil {
			t.Fatal(err)
		}
		kv, err := tm.js.KeyValue(t.Context(), admission.HeldBucket)
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, "the late answer held for the owner", func() bool {
			lister, err := kv.ListKeysFiltered(t.Context(), kG.Public()+".>")
			if err != nil {
				return false
			}
			for k := range lister.Keys() {
				e, err := kv.Get(t.Context(), k)
				if err != nil {
					continue
				}
				var h admission.Held
				if json.Unmarshal(e.Value(), &h) != nil || h.From != kP.Public() {
					continue
				}
				env, err := protocol.Decode(h.Envelope)
				if err == nil && env.Type == protocol.TypeRequest && env.InReplyTo == res.RequestID {
					return true
				}
			}
			return false
		})
	})
}
