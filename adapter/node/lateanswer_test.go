package node

import (
	"testing"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// A held request's later answer takes the form its requester reads
// (heldAnswer): a 0.2 requester gets a respond in reply to the request at
// its inbox, a 0.3 requester a fresh request whose in_reply_to names the
// original. A refusal carries its error in the payload and, for either, as
// the envelope member. The requesters are raw peers here, not the runtime.
func TestHeldAnswerFollowsTheRequesterVersion(t *testing.T) {
	tm := newMesh(t)
	p, held := attendedPair(t, tm, refuseAll)
	sender := agentKey(t)
	atInbox := tm.collect(t, protocol.InboxSubject(sender.Public()))
	refusal := errs.New(errs.BudgetInsufficient, "not at that price")

	cases := []struct {
		name   string
		req    *protocol.Envelope
		refuse bool
	}{
		{"0.2 answered", requestEnv(t, sender, p.kB.Public(), "chat", "q1"), false},
		{"0.2 refused", requestEnv(t, sender, p.kB.Public(), "chat", "q2"), true},
		{"0.3 answered", requestEnv03(t, sender, p.kB.Public(), "chat", "q3"), false},
		{"0.3 refused", requestEnv03(t, sender, p.kB.Public(), "chat", "q4"), true},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			onReply := tm.rawRequest(t, protocol.InboxSubject(p.kB.Public()), c.req)
			eventually(t, "the queued ack", func() bool { return onReply.len() == 1 })
			if ack, ok := protocol.QueuedAckOf(onReply.envelopes(t)[0]); !ok || ack.InboxID != "entry-"+c.req.ID {
				t.Fatal("the reply subject did not carry the queued ack")
			}
			raw := held(c.req.ID)
			var err error
			if c.refuse {
				err = p.b.RefuseHeld(raw, refusal)
			} else {
				err = p.b.AnswerHeld(raw, map[string]any{"text": "later"})
			}
			if err != nil {
				t.Fatal(err)
			}
			eventually(t, "the later answer at the sender's inbox", func() bool { return atInbox.len() == i+1 })
			got := atInbox.envelopes(t)[i]
			if got.From != p.kB.Public() || got.To != sender.Public() || got.InReplyTo != c.req.ID {
				t.Fatalf("answer from %s to %s in reply to %s", got.From, got.To, got.InReplyTo)
			}
			pl, _ := got.PayloadValue()
			payload := pl.(map[string]any)
			wantType := protocol.TypeRespond
			if c.req.V == "0.3.0" {
				wantType = protocol.TypeRequest
				if payload["offering"] != "chat" {
					t.Fatalf("a 0.3 late answer offers %v, not the original's offering", payload["offering"])
				}
			}
			if got.Type != wantType {
				t.Fatalf("a %s requester got a %s", c.req.V, got.Type)
			}
			if !c.refuse {
				out := payload["output"]
				if wantType == protocol.TypeRequest {
					out = payload["input"]
				}
				if payload["status"] != protocol.StateCompleted || out.(map[string]any)["text"] != "later" || got.Extra["error"] != nil {
					t.Fatalf("answer payload %s", got.Payload)
				}
				return
			}
			inPayload, _ := payload["error"].(map[string]any)
			member, _ := got.Extra["error"].(map[string]any)
			if payload["status"] != protocol.StateFailed || inPayload["code"] != string(errs.BudgetInsufficient) || member["code"] != string(errs.BudgetInsufficient) {
				t.Fatalf("refusal payload %s, member %v", got.Payload, got.Extra["error"])
			}
		})
	}
}
