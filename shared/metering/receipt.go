package metering

import (
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/jsonv"
	"agentmesh.dev/mesh/shared/protocol"
)

// Usage is one receipt entry: quantity units of a declared meter.
type Usage struct {
	Meter    string `json:"meter"`
	Quantity int64  `json:"quantity"`
}

// MaxReceiptEntries bounds one receipt: a responder declaring more meters
// than this on one task is not reporting usage, it is flooding the ledger.
const MaxReceiptEntries = 64

func receiptErr(format string, args ...any) *errs.Error {
	return errs.Newf(errs.InvalidEnvelope, "usage receipt: "+format, args...)
}

// UsageFromValue shape-checks payload.usage: an array of {meter, quantity}
// objects, each a declared meter (never an observed name: the platform
// counts those itself) with a non-negative integer quantity, no meter twice
// (a receipt is cumulative per meter, so a second entry would be a second
// answer), at most MaxReceiptEntries entries, no other member.
func UsageFromValue(v any) ([]Usage, error) {
	list, ok := jsonv.Array(v)
	if !ok {
		return nil, receiptErr("usage must be an array of {meter, quantity}")
	}
	if len(list) > MaxReceiptEntries {
		return nil, receiptErr("usage declares %d meters; at most %d", len(list), MaxReceiptEntries)
	}
	out := make([]Usage, 0, len(list))
	for i, item := range list {
		m, ok := jsonv.Object(item)
		if !ok {
			return nil, receiptErr("usage[%d] must be an object {meter, quantity}", i)
		}
		if k, bad := jsonv.Unknown(m, "meter", "quantity"); bad {
			return nil, receiptErr("usage[%d] has unknown member %q", i, k)
		}
		name, _ := m["meter"].(string)
		if !ValidName(name) {
			return nil, receiptErr("usage[%d].meter must match %s", i, NamePattern)
		}
		if IsObserved(name) {
			return nil, receiptErr("usage[%d].meter %q is an observed meter; a responder declares only its own meters", i, name)
		}
		q, ok := jsonv.NonNegInt(m["quantity"])
		if !ok {
			return nil, receiptErr("usage[%d].quantity must be a non-negative integer", i)
		}
		for _, u := range out {
			if u.Meter == name {
				return nil, receiptErr("usage names meter %q twice", name)
			}
		}
		out = append(out, Usage{Meter: name, Quantity: q})
	}
	return out, nil
}

// Receipt is what one respond says the task consumed. It carries no
// signature of its own: the respond's envelope signature covers it, so a
// receipt is only ever read from an envelope that verified.
type Receipt struct {
	// EnvelopeID is the respond's id; with each meter it is the idempotency
	// key of the events the receipt becomes.
	EnvelopeID string
	// Responder signed the respond; Requester is its addressee.
	Responder, Requester string
	InReplyTo, TaskID    string
	TS                   string
	// Terminal is true for a respond whose status ends the task; a
	// non-terminal report is cumulative and superseded by a later one.
	Terminal bool
	Usage    []Usage
}

// ReceiptFrom reads the receipt of a verified respond envelope. A respond
// without payload.usage has an empty receipt, not an error: most responders
// declare nothing.
func ReceiptFrom(e *protocol.Envelope) (Receipt, error) {
	if e.Type != protocol.TypeRespond {
		return Receipt{}, receiptErr("a receipt is carried by a respond, not a %s", e.Type)
	}
	v, err := e.PayloadView()
	if err != nil {
		return Receipt{}, errs.Wrap(errs.InvalidEnvelope, "usage receipt: the payload is not valid JSON", err)
	}
	p, ok := jsonv.Object(v)
	if !ok {
		return Receipt{}, receiptErr("a respond carrying usage has an object payload")
	}
	status, _ := p["status"].(string)
	r := Receipt{EnvelopeID: e.ID, Responder: e.From, Requester: e.To, InReplyTo: e.InReplyTo, TaskID: e.TaskID,
		TS: e.TS, Terminal: protocol.Terminal(status)}
	if raw, present := p["usage"]; present {
		if r.Usage, err = UsageFromValue(raw); err != nil {
			return Receipt{}, err
		}
	}
	return r, nil
}

// Events lifts the receipt into declared meter events, one per meter, each
// keyed (meter, the respond's id). offering may be empty.
func (r Receipt) Events(offering string) []Event {
	out := make([]Event, 0, len(r.Usage))
	for _, u := range r.Usage {
		out = append(out, Event{Meter: u.Meter, Class: Declared, Quantity: u.Quantity, Provider: r.Responder,
			Consumer: r.Requester, Offering: offering, TaskID: r.TaskID, EnvelopeID: r.EnvelopeID, TS: r.TS})
	}
	return out
}

// Report is one receipt in the order a task's responds arrived.
type Report struct {
	Terminal bool
	Usage    []Usage
}

// Current folds a task's reports into what it consumed: every report is
// cumulative, so a later one replaces an earlier one whole (4210 after
// 2000 is 4210, not 6210), and nothing after the terminal report counts.
func Current(reports []Report) map[string]int64 {
	out := map[string]int64{}
	for _, r := range reports {
		clear(out)
		for _, u := range r.Usage {
			out[u.Meter] = u.Quantity
		}
		if r.Terminal {
			break
		}
	}
	return out
}
