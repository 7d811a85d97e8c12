package vectors

import (
	"fmt"

	"agentmesh.dev/mesh/shared/protocol"
)

// Ordering cases are behaviour of a live responder: which reply comes first
// on the requester's reply channel. They are judged by the agent runtime's
// end-to-end suite against a running mesh, not here.
const orderingCoveredBy = "the agent-runtime end-to-end tests in adapter/node: TestRequestAcceptThenBareReply (accept first, then the reply), " +
	"TestBudgetRefusalReplacesAccept, TestOversizeRefusedLocallyAndByReceiver, TestUnverifiedInboundNeverReachesTheHandler " +
	"(stale and misaddressed: silent), TestUnknownOfferingFailsAfterAccept; the queued ack (never an accept) in shared/admission's relay tests"

func checkAcceptSignal(t *T, doc map[string]any) {
	k, err := senderKey(doc)
	if err != nil {
		t.Run("identities", func() error { return err })
	}
	if acc, ok := doc["accept"].(map[string]any); ok {
		env, _ := acc["envelope"].(map[string]any)
		req, _ := acc["required"].(map[string]any)
		t.Run("accept/envelope", func() error {
			e, err := checkSignedEnvelope(env["signed"], optStr(env, "canonical"), k)
			if err != nil {
				return err
			}
			if want := optStr(req, "type"); want != "" && string(e.Type) != want {
				return fmt.Errorf("type %s, want %s", e.Type, want)
			}
			if want := optStr(req, "payload_status"); want != "" && protocol.ResponseStatus(e) != want {
				return fmt.Errorf("payload.status %q, want %q", protocol.ResponseStatus(e), want)
			}
			if !protocol.IsAccepted(e) {
				return fmt.Errorf("IsAccepted is false for the accept")
			}
			if e.InReplyTo == "" {
				return fmt.Errorf("accept has no in_reply_to")
			}
			if _, present := obj(env["signed"])["task_id"]; present {
				return fmt.Errorf("task_id is on the wire")
			}
			return nil
		})
		t.Run("accept/built_by_us", func() error {
			// Our own accept for a request from the requester must have the
			// same shape: respond, status accepted, in_reply_to, no task_id.
			signed := obj(env["signed"])
			reqEnv, err := protocol.New(protocol.TypeRequest, str(signed["to"]), map[string]any{"offering": "chat", "input": "hi"})
			if err != nil {
				return err
			}
			a, err := protocol.NewAccept(reqEnv, str(signed["from"]))
			if err != nil {
				return err
			}
			if a.Type != protocol.TypeRespond || a.InReplyTo != reqEnv.ID || a.TaskID != "" || !protocol.IsAccepted(a) {
				return fmt.Errorf("our accept has the wrong shape: %+v", a)
			}
			if k != nil && k.Public() == a.From {
				if err := a.Sign(k); err != nil {
					return err
				}
				b, err := a.Marshal()
				if err != nil {
					return err
				}
				back, err := protocol.Decode(b)
				if err != nil {
					return err
				}
				if back.TaskID != "" {
					return fmt.Errorf("task_id on the wire")
				}
			}
			return nil
		})
	}
	if ord, ok := doc["ordering"].(map[string]any); ok {
		for i, c := range asArray(ord["cases"]) {
			t.Defer("ordering/"+caseName(obj(c), fmt.Sprint(i)), orderingCoveredBy)
		}
	}
	if qa, ok := doc["queued_ack"].(map[string]any); ok {
		t.Run("queued_ack/shape", func() error {
			shape := obj(qa["shape"])
			if _, ok := protocol.ParseQueuedAck(shape); !ok {
				return fmt.Errorf("the fixture's shape is not read as a queued ack")
			}
			ours := protocol.NewQueuedAck("queued for the agent")
			got, err := protocol.ParseJSON([]byte(canon(ours)))
			if err != nil {
				return err
			}
			gm := obj(got)
			for k, v := range shape {
				gv, present := gm[k]
				if !present {
					return fmt.Errorf("our queued ack lacks %q", k)
				}
				if b, isBool := v.(bool); isBool && gv != b {
					return fmt.Errorf("%s is %v, want boolean %v", k, gv, b)
				}
			}
			if ack, ok := protocol.ParseQueuedAck(got); !ok || ack.InboxID == "" {
				return fmt.Errorf("our own ack does not parse back")
			}
			// "queued" as a string is not a queued ack.
			if _, ok := protocol.ParseQueuedAck(map[string]any{"queued": "true", "inbox_id": "x", "text": ""}); ok {
				return fmt.Errorf("a string queued was accepted")
			}
			return nil
		})
	}
}
