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
	if v, err := req.PayloadView(); err == nil {
		if m, ok := v.(map[string]any); ok && OfferingOf(m) == OfferingDescribe {
			return nil, fmt.Errorf("accept: describe is answered without an accept")
		}
	}
	e, err := NewReply(req, from, map[string]any{"status": StatusAccepted})
	if err != nil {
		return nil, fmt.Errorf("accept: %w", err)
	}
	e.TaskID = "" // absent on the wire; "null" is an API-level reading only
	return e, nil
}

// ResponseStatus is payload.status of e, or "" when the payload is not an
// object with a string status.
func ResponseStatus(e *Envelope) string {
	if e == nil {
		return ""
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

// QueuedAckOf finds a queued ack in a reply: at payload.output, where an
// attended node puts it, or as the payload itself.
func QueuedAckOf(e *Envelope) (QueuedAck, bool) {
	if e == nil || e.Type != TypeRespond {
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
