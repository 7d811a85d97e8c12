package protocol

import (
	"fmt"
)

// The accept signal and the queued ack (upstream-notes §3.2). They certify
// different things and must never be confused: "accepted" says a live
// handler admitted the request and is about to run it; "queued" says only
// that a mailbox holds the message. One message never gets both.

// StatusAccepted is payload.status of the accept. It is not a task state.
const StatusAccepted = "accepted"

// acceptPayload is the accept's payload, {"status":"accepted"}, already
// canonical: newEnvelope copies it rather than canonicalising a map.
var acceptPayload = canonicalPayload(`{"status":"` + StatusAccepted + `"}`)

// OfferingDescribe is the reserved pre-admission read; like register and
// discover it never carries an accept.
const OfferingDescribe = "describe"

// NewAccept builds the accept a responder emits the moment a live handler
// admits req, before the handler runs: a respond from from with payload
// {"status":"accepted"}, in_reply_to req's id, addressed to req's sender, on
// a child span of req's trace, and with no task_id member (the accept does
// not choose between bare and task mode). Sign it before sending.
//
// Only requests are accepted, and never describe; the caller must also not
// accept on a mailbox-drain dispatch, which this function cannot see.
func NewAccept(req *Envelope, from string) (*Envelope, error) {
	if req == nil {
		return nil, fmt.Errorf("accept: no request")
	}
	if req.Type != TypeRequest {
		return nil, fmt.Errorf("accept: only a request is accepted, not a %s", req.Type)
	}
	if req.ID == "" {
		return nil, fmt.Errorf("accept: request has no id to reply to")
	}
	if isDescribe(req) {
		return nil, fmt.Errorf("accept: describe is answered without an accept")
	}
	e, err := newEnvelope(TypeRespond, from, acceptPayload, req)
	if err != nil {
		return nil, fmt.Errorf("accept: %w", err)
	}
	e.TaskID = "" // absent on the wire; "null" is an API-level reading only
	return e, nil
}

// isDescribe reports whether req's payload is an object whose offering
// (OfferingOf) is describe. A decoded payload is read off its canonical
// bytes without parsing it.
func isDescribe(req *Envelope) bool {
	if !req.decodedPayload() {
		v, err := req.PayloadView()
		m, ok := v.(map[string]any)
		return err == nil && ok && OfferingOf(m) == OfferingDescribe
	}
	if req.Payload[0] != '{' {
		return false
	}
	const describe = `"` + OfferingDescribe + `"`
	if v, ok := canonMember(req.Payload, "offering"); ok && v[0] == '"' && len(v) > 2 {
		return string(v) == describe
	}
	v, ok := canonMember(req.Payload, "skill")
	return ok && string(v) == describe
}

// ResponseStatus is payload.status of e, or "" when the payload is not an
// object with a string status.
func ResponseStatus(e *Envelope) string {
	if e == nil {
		return ""
	}
	if e.decodedPayload() {
		// Read off the canonical bytes: no parse, and no allocation for the
		// statuses the protocol defines.
		v, ok := canonMember(e.Payload, "status")
		if !ok || v[0] != '"' {
			return ""
		}
		return canonStatus(v)
	}
	v, err := e.PayloadView()
	if err != nil {
		return ""
	}
	m, _ := v.(map[string]any)
	s, _ := m["status"].(string)
	return s
}

// IsAccepted reports whether e is an accept. A requester does not resolve
// its request on one (it may reset its timeout); the request completes on
// the first respond whose status is anything else.
func IsAccepted(e *Envelope) bool {
	return e != nil && e.Type == TypeRespond && ResponseStatus(e) == StatusAccepted
}

// QueuedAck is the node-level acknowledgement an attended inbox sends
// instead of an accept. It is identical whether the message was queued,
// held or refused, so a refused sender learns nothing; Text is informative
// prose and never parsed.
type QueuedAck struct {
	Queued  bool   `json:"queued"`
	InboxID string `json:"inbox_id"`
	Text    string `json:"text"`
}

// NewQueuedAck builds a queued ack with a fresh inbox id.
func NewQueuedAck(text string) QueuedAck {
	return QueuedAck{Queued: true, InboxID: NewID(), Text: text}
}

// ParseQueuedAck reads a decoded queued-ack object. It requires queued to be
// the boolean true (the string "true" is not) and inbox_id a non-empty
// string; text is taken when it is a string and otherwise ignored.
func ParseQueuedAck(v any) (QueuedAck, bool) {
	m, ok := v.(map[string]any)
	if !ok {
		return QueuedAck{}, false
	}
	if q, ok := m["queued"].(bool); !ok || !q {
		return QueuedAck{}, false
	}
	id, ok := m["inbox_id"].(string)
	if !ok || id == "" {
		return QueuedAck{}, false
	}
	text, _ := m["text"].(string)
	return QueuedAck{Queued: true, InboxID: id, Text: text}, true
}

// canonStatus is the text of a canonical JSON string, the protocol's own
// statuses without allocating.
func canonStatus(v []byte) string {
	switch string(v[1 : len(v)-1]) {
	case StatusAccepted:
		return StatusAccepted
	case StateSubmitted:
		return StateSubmitted
	case StateWorking:
		return StateWorking
	case StateInputRequired:
		return StateInputRequired
	case StateAuthRequired:
		return StateAuthRequired
	case StateCompleted:
		return StateCompleted
	case StateFailed:
		return StateFailed
	case StateCanceled:
		return StateCanceled
	case StateRejected:
		return StateRejected
	case StateExhausted:
		return StateExhausted
	}
	return string(appendUnquoted(nil, v))
}

// QueuedAckOf finds a queued ack in a reply: at payload.output, where an
// attended node puts it, or as the payload itself.
func QueuedAckOf(e *Envelope) (QueuedAck, bool) {
	if e == nil || e.Type != TypeRespond {
		return QueuedAck{}, false
	}
	if e.decodedPayload() && !canonQueued(e.Payload) {
		// Most answers are not queued acks: their canonical bytes say so
		// without a parse.
		return QueuedAck{}, false
	}
	v, err := e.PayloadView()
	if err != nil {
		return QueuedAck{}, false
	}
	if m, ok := v.(map[string]any); ok {
		if ack, ok := ParseQueuedAck(m["output"]); ok {
			return ack, true
		}
	}
	return ParseQueuedAck(v)
}

// canonQueued reports whether a canonical payload may hold a queued ack:
// queued is true in it or in its output object. ParseQueuedAck refuses
// every other payload.
func canonQueued(payload []byte) bool {
	if v, ok := canonMember(payload, "queued"); ok && string(v) == "true" {
		return true
	}
	out, ok := canonMember(payload, "output")
	if !ok {
		return false
	}
	v, ok := canonMember(out, "queued")
	return ok && string(v) == "true"
}
