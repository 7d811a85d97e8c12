package node

import (
	"errors"
	"fmt"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// An attended inbox (accept-signal fixture, case "attended_inbox") holds a
// request instead of handling it: no handler runs at delivery time, so no
// accept is sent; a live request is answered at once with the node-level
// queued acknowledgement, and the real answer goes later to the sender's
// own inbox with in_reply_to, when the person or program behind the inbox
// replies (AnswerHeld, RefuseHeld). Whoever holds the request keeps it
// durably; the runtime keeps nothing, and the request is journaled only
// once it is answered, so a restart can still answer it.

// HeldError is what an AdmitFunc returns (through Hold) to hold a request.
type HeldError struct {
	// InboxID names the held message in the queued acknowledgement.
	InboxID string
}

func (h *HeldError) Error() string { return "node: the request is held in inbox entry " + h.InboxID }

// Hold is the AdmitFunc result that holds the admitted request under
// inboxID (a non-empty id the holder can find it by).
func Hold(inboxID string) error { return &HeldError{InboxID: inboxID} }

// ErrAlreadyAnswered is returned by AnswerHeld and RefuseHeld for a request
// whose answer the journal already holds.
var ErrAlreadyAnswered = errors.New("node: the request was already answered")

// heldText is the queued acknowledgement's prose: informative only.
const heldText = "The recipient holds this message in its inbox; its answer will arrive at your inbox."

// hold answers a held call: the queued acknowledgement on a live request's
// reply subject, nothing for one drained from the mailbox (the sender is
// not waiting).
func (a *Agent) hold(c *Call, inboxID string) error {
	if inboxID == "" {
		return c.fail(errs.New(errs.InternalError, "the request could not be held"))
	}
	if c.o.src != protocol.SourceLive || c.o.reply == "" {
		return nil
	}
	ack := protocol.QueuedAck{Queued: true, InboxID: inboxID, Text: heldText}
	env, err := protocol.NewReply(c.Env, a.id, ack)
	if err != nil {
		return err
	}
	return a.sendRespond(c.o.reply, env, nil)
}

// AnswerHeld answers a held request, given the request envelope as it was
// received (Call.Env.Raw()), with a terminal {status:"completed", output}
// sent to the sender's inbox.
func (a *Agent) AnswerHeld(raw []byte, output any) error {
	// A protocol 0.3 sender gets it as a fresh request (heldAnswer).
	return a.answerHeld(raw, map[string]any{"status": protocol.StateCompleted, "output": output})
}

// RefuseHeld answers a held request with a refusal (for example
// protocol.BudgetInsufficient or protocol.DeadlineUnmeetable).
func (a *Agent) RefuseHeld(raw []byte, e *errs.Error) error {
	if e == nil {
		return errors.New("node: RefuseHeld needs an error")
	}
	return a.answerHeld(raw, e.BusPayload())
}

func (a *Agent) answerHeld(raw []byte, payload map[string]any) error {
	// Verified again: the stored copy is the holder's file, and an answer
	// is addressed from what it says.
	req, err := protocol.DefaultDecoder.Decode(raw)
	if err != nil {
		return fmt.Errorf("node: the held request does not verify: %w", err)
	}
	if req.Type != protocol.TypeRequest || (req.To != "" && req.To != a.id) {
		return fmt.Errorf("node: the held envelope is not a request to agent %s", a.id)
	}
	if a.n.journal.Answered(req.From, req.ID) {
		return ErrAlreadyAnswered
	}
	env, err := heldAnswer(req, a.id, payload)
	if err != nil {
		return err
	}
	// The late answer ends the request: its duration counts from the
	// request's own time, the runtime having kept nothing of it.
	started := a.n.now()
	if ts, err := protocol.ParseTime(req.TS); err == nil {
		started = ts
	}
	if err := a.sendRespond(protocol.InboxSubject(req.From), env, a.auditHeader(req, offeringOf(req), started)); err != nil {
		return fmt.Errorf("node: answer %s: %w", req.ID, err)
	}
	if err := a.n.journal.Record(req.From, req.ID); err != nil {
		a.n.log.Error("journal", "err", err)
	}
	return nil
}

// heldAnswer is the late answer to a held request req. A protocol 0.3
// requester takes a late answer only as a fresh request whose in_reply_to
// names the original (it drops a respond that matches no open wait:
// upstream-notes §15): for it the answer is a request offering what the
// original asked for, with payload.input the output (and payload.error,
// mirrored to the envelope member, for a refusal). An earlier requester
// gets a respond in reply, as before.
func heldAnswer(req *protocol.Envelope, from string, payload map[string]any) (*protocol.Envelope, error) {
	if !protocol.AnswersAtInbox(req.V) {
		return protocol.NewReply(req, from, payload)
	}
	p := map[string]any{"offering": offeringOf(req)}
	if out, ok := payload["output"]; ok {
		p["input"] = out
	} else {
		p["input"] = map[string]any{}
	}
	for _, k := range []string{"status", "error"} {
		if v, ok := payload[k]; ok {
			p[k] = v
		}
	}
	env, err := protocol.New(protocol.TypeRequest, from, p)
	if err != nil {
		return nil, err
	}
	env.Trace, env.InReplyTo, env.To, env.ContextID = req.Trace.Child(), req.ID, req.From, req.ContextID
	if e, ok := payload["error"]; ok {
		if env.Extra == nil {
			env.Extra = map[string]any{}
		}
		env.Extra["error"] = e
	}
	return env, nil
}

// offeringOf is the offering a request asked for ("" when none).
func offeringOf(req *protocol.Envelope) string {
	v, err := req.PayloadValue()
	if err != nil {
		return ""
	}
	p, _ := v.(map[string]any)
	return protocol.OfferingOf(p)
}
