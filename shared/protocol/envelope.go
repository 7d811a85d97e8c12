// Package protocol is the wire core of the mesh: canonical JSON, the signed
// envelope, the other signed strings, the decode order every receiver
// follows, sender pre-flight, budgets, owner allowances and cancel payloads.
// It links no cloud SDK and no NATS server: the adapter, the workers and the
// conformance runner all build on it.
package protocol

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/errs"
)

// Version is the protocol version this implementation emits. Receivers
// accept any version with the same major (spec §9).
const (
	Version      = "0.3.0"
	VersionMajor = 0
)

// Type is the envelope type.
type Type string

// The six envelope types of spec §2.4.
const (
	TypeRegister  Type = "register"
	TypeDiscover  Type = "discover"
	TypeRequest   Type = "request"
	TypeRespond   Type = "respond"
	TypeEmit      Type = "emit"
	TypeSubscribe Type = "subscribe"
)

// Valid reports whether t is one of the six types.
func (t Type) Valid() bool {
	switch t {
	case TypeRegister, TypeDiscover, TypeRequest, TypeRespond, TypeEmit, TypeSubscribe:
		return true
	}
	return false
}

// Trace is the W3C-compatible trace block. ParentSpanID nil is a root span
// and is written as an explicit null, which is signed (upstream-notes §1.5).
type Trace struct {
	TraceID      string
	SpanID       string
	ParentSpanID *string
	TraceState   string
	// OmitParent writes no parent_span_id member at all instead of null.
	// Some senders omit it; the decoder records that so the envelope
	// re-encodes to exactly the bytes its author signed.
	OmitParent bool
}

// NewRootTrace starts a new interaction.
func NewRootTrace() Trace { return Trace{TraceID: NewTraceID(), SpanID: NewSpanID()} }

// Child continues the trace from a handler: same trace id and state, a new
// span whose parent is t's span.
func (t Trace) Child() Trace {
	parent := t.SpanID
	return Trace{TraceID: t.TraceID, SpanID: NewSpanID(), ParentSpanID: &parent, TraceState: t.TraceState}
}

// Envelope is one signed protocol message (spec §2.4, upstream-notes §1.1).
//
// Payload and Meta hold canonical JSON text. Members this version does not
// know (artifacts, error, future fields) are kept in Extra so that nothing a
// sender signed is lost; an envelope received off the wire also keeps its
// exact bytes (Raw), which is what relays forward.
type Envelope struct {
	V         string
	ID        string
	Type      Type
	TS        string
	From      string
	To        string
	Trace     Trace
	TaskID    string
	InReplyTo string
	ContextID string
	Budget    *Budget
	Payload   json.RawMessage
	Meta      json.RawMessage
	Sig       string
	Extra     map[string]any

	raw []byte
	// view is the payload as the decoder parsed it, kept for the
	// protocol's own read-only looks at it (status, the queued ack, the
	// offering) so they do not parse it again; it belongs to the Payload
	// bytes whose first byte viewOf points at.
	view   any
	viewOf *byte
}

// keepView records v as the parsed form of the current Payload.
func (e *Envelope) keepView(v any) {
	if len(e.Payload) > 0 {
		e.view, e.viewOf = v, &e.Payload[0]
	}
}

// PayloadView is the payload's value for reading only: the decoder's
// parse when Payload is still the bytes it was parsed from, else a fresh
// parse. Callers must not modify it; code that hands the value on uses
// PayloadValue.
func (e *Envelope) PayloadView() (any, error) {
	if e.viewOf != nil && len(e.Payload) > 0 && &e.Payload[0] == e.viewOf {
		return e.view, nil
	}
	return e.PayloadValue()
}

// New starts an envelope of type typ from the key from, with a fresh id, the
// current time, a new root trace and payload (any Go or decoded JSON value).
func New(typ Type, from string, payload any) (*Envelope, error) {
	e := &Envelope{
		V:     Version,
		ID:    NewID(),
		Type:  typ,
		TS:    FormatTime(time.Now()),
		From:  from,
		Trace: NewRootTrace(),
	}
	if err := e.SetPayload(payload); err != nil {
		return nil, err
	}
	if typ == TypeRespond {
		e.mirrorError()
	}
	return e, nil
}

// mirrorError copies the error object of a respond's payload (payload.error,
// beside payload.status: spec §7.1) to the envelope member error, where a
// protocol 0.3 reader looks for it (upstream-notes §15). Both places carry
// the same object, so readers of either form understand the answer.
func (e *Envelope) mirrorError() {
	var p struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(e.Payload, &p) != nil || len(p.Error) == 0 || string(p.Error) == "null" {
		return
	}
	v, err := ParseJSON(p.Error)
	if err != nil {
		return
	}
	if e.Extra == nil {
		e.Extra = map[string]any{}
	}
	e.Extra["error"] = v
}

// ErrorObject is the error object an envelope carries, from payload.error
// (this mesh, protocol 0.2) or the envelope member error (protocol 0.3),
// or nil.
func ErrorObject(e *Envelope) any {
	var p struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(e.Payload, &p) == nil && len(p.Error) > 0 && string(p.Error) != "null" {
		if v, err := ParseJSON(p.Error); err == nil {
			return v
		}
	}
	if v, ok := e.Extra["error"]; ok && v != nil {
		return v
	}
	return nil
}

// IsAnswer reports whether e answers an earlier request: a respond, or a
// request whose in_reply_to names one (the protocol 0.3 late answer of a
// node that queued the original: upstream-notes §15).
func IsAnswer(e *Envelope) bool {
	return e.Type == TypeRespond || (e.Type == TypeRequest && e.InReplyTo != "")
}

// AnswersAtInbox reports whether a request of protocol version v wants its
// answers (the accept and the substantive respond) at the requester's own
// inbox, correlated by in_reply_to: protocol 0.3 and later (upstream-notes
// §15). An earlier requester reads them on the request's reply subject.
func AnswersAtInbox(v string) bool {
	major, rest, _ := strings.Cut(v, ".")
	minor, _, _ := strings.Cut(rest, ".")
	ma, err1 := strconv.Atoi(major)
	mi, err2 := strconv.Atoi(minor)
	if err1 != nil || err2 != nil {
		return false
	}
	return ma > 0 || mi >= 3
}

// NewReply starts a respond to req from the key from: same trace (a child
// span), in_reply_to the request id, addressed to the requester.
func NewReply(req *Envelope, from string, payload any) (*Envelope, error) {
	e, err := New(TypeRespond, from, payload)
	if err != nil {
		return nil, err
	}
	e.Trace = req.Trace.Child()
	e.InReplyTo = req.ID
	e.To = req.From
	e.ContextID = req.ContextID
	return e, nil
}

// SetPayload canonicalises v into the payload. The signature is cleared:
// the bytes it covered have changed.
func (e *Envelope) SetPayload(v any) error {
	if v == nil {
		e.Payload = json.RawMessage("{}")
		e.Sig = ""
		return nil
	}
	b, err := Canonical(v)
	if err != nil {
		return fmt.Errorf("envelope payload: %w", err)
	}
	e.Payload = b
	e.Sig = ""
	return nil
}

// DecodePayload unmarshals the payload into dst.
func (e *Envelope) DecodePayload(dst any) error {
	if len(e.Payload) == 0 {
		return errs.New(errs.InvalidEnvelope, "envelope has no payload")
	}
	if err := json.Unmarshal(e.Payload, dst); err != nil {
		return errs.Wrap(errs.InvalidEnvelope, "payload does not have the expected shape", err)
	}
	return nil
}

// PayloadValue parses the payload into the generic value model.
func (e *Envelope) PayloadValue() (any, error) {
	if len(e.Payload) == 0 {
		return nil, nil
	}
	return ParseJSON(e.Payload)
}

// Raw is the exact wire form an envelope was decoded from (nil for one built
// locally). Forward these bytes rather than re-encoding.
func (e *Envelope) Raw() []byte { return e.raw }

// Hops is meta.hops, the relay counter (0 when absent).
func (e *Envelope) Hops() int {
	if len(e.Meta) == 0 {
		return 0
	}
	v, err := ParseJSON(e.Meta)
	if err != nil {
		return 0
	}
	m, _ := v.(map[string]any)
	h, _ := m["hops"].(float64)
	return int(h)
}

// Marshal returns the wire form: the canonical JSON of the whole envelope,
// signature included. Being canonical, it is also the exact text a receiver
// re-derives when it drops sig to verify.
func (e *Envelope) Marshal() ([]byte, error) {
	if e.Sig == "" {
		return nil, errs.New(errs.IdentityMismatch, "envelope is not signed")
	}
	return e.appendCanonical(make([]byte, 0, 256+len(e.Payload)), true)
}

// CanonicalUnsigned is the canonical JSON of the envelope without sig: the
// bytes (after the domain tag) that the signature covers.
func (e *Envelope) CanonicalUnsigned() ([]byte, error) {
	return e.appendCanonical(make([]byte, 0, 256+len(e.Payload)), false)
}

// AppendCanonicalUnsigned appends the canonical unsigned form to dst.
func (e *Envelope) AppendCanonicalUnsigned(dst []byte) ([]byte, error) {
	return e.appendCanonical(dst, false)
}

// appendCanonical writes the envelope in canonical member order. The common
// case, no unknown members, is written field by field without building an
// intermediate map; with unknown members it falls back to the generic path.
func (e *Envelope) appendCanonical(dst []byte, withSig bool) ([]byte, error) {
	if len(e.Extra) > 0 {
		m, err := e.members(withSig)
		if err != nil {
			return dst, err
		}
		return appendMap(dst, m, 0)
	}
	var err error
	sep := byte('{')
	member := func(name string) {
		dst = append(dst, sep, '"')
		dst = append(dst, name...)
		dst = append(dst, '"', ':')
		sep = ','
	}
	str := func(name, v string) {
		if err != nil {
			return
		}
		member(name)
		dst, err = appendString(dst, v)
	}
	// Members in UTF-16 order: budget, context_id, from, id, in_reply_to,
	// meta, payload, sig, task_id, to, trace, ts, type, v.
	if e.Budget != nil {
		member("budget")
		dst, err = appendBudget(dst, e.Budget)
	}
	if e.ContextID != "" {
		str("context_id", e.ContextID)
	}
	str("from", e.From)
	str("id", e.ID)
	if e.InReplyTo != "" {
		str("in_reply_to", e.InReplyTo)
	}
	if len(e.Meta) > 0 && err == nil {
		member("meta")
		dst = append(dst, e.Meta...)
	}
	if len(e.Payload) > 0 && err == nil {
		member("payload")
		dst = append(dst, e.Payload...)
	}
	if withSig {
		str("sig", e.Sig)
	}
	if e.TaskID != "" {
		str("task_id", e.TaskID)
	}
	if e.To != "" {
		str("to", e.To)
	}
	if err == nil {
		member("trace")
		dst, err = appendTrace(dst, &e.Trace)
	}
	str("ts", e.TS)
	str("type", string(e.Type))
	str("v", e.V)
	if err != nil {
		return dst, err
	}
	return append(dst, '}'), nil
}

func appendTrace(dst []byte, t *Trace) ([]byte, error) {
	var err error
	switch {
	case t.ParentSpanID != nil:
		dst = append(dst, `{"parent_span_id":`...)
		if dst, err = appendString(dst, *t.ParentSpanID); err != nil {
			return dst, err
		}
		dst = append(dst, ',')
	case t.OmitParent:
		dst = append(dst, '{')
	default:
		dst = append(dst, `{"parent_span_id":null,`...)
	}
	dst = append(dst, `"span_id":`...)
	if dst, err = appendString(dst, t.SpanID); err != nil {
		return dst, err
	}
	dst = append(dst, `,"trace_id":`...)
	if dst, err = appendString(dst, t.TraceID); err != nil {
		return dst, err
	}
	if t.TraceState != "" {
		dst = append(dst, `,"tracestate":`...)
		if dst, err = appendString(dst, t.TraceState); err != nil {
			return dst, err
		}
	}
	return append(dst, '}'), nil
}

func appendBudget(dst []byte, b *Budget) ([]byte, error) {
	var err error
	sep := byte('{')
	if b.CostCeiling != nil {
		dst = append(dst, sep)
		dst = append(dst, `"cost_ceiling":{"amount_micro":`...)
		if dst, err = appendInt(dst, b.CostCeiling.AmountMicro); err != nil {
			return dst, err
		}
		dst = append(dst, `,"currency":`...)
		if dst, err = appendString(dst, b.CostCeiling.Currency); err != nil {
			return dst, err
		}
		dst = append(dst, '}')
		sep = ','
	}
	if b.Deadline != "" {
		dst = append(dst, sep)
		dst = append(dst, `"deadline":`...)
		if dst, err = appendString(dst, b.Deadline); err != nil {
			return dst, err
		}
		sep = ','
	}
	dst = append(dst, sep)
	dst = append(dst, `"revision":`...)
	if dst, err = appendInt(dst, b.Revision); err != nil {
		return dst, err
	}
	return append(dst, '}'), nil
}

// members renders the envelope as a generic object (slow path, used only
// when unknown members must be carried along).
func (e *Envelope) members(withSig bool) (map[string]any, error) {
	m := make(map[string]any, len(e.Extra)+14)
	for k, v := range e.Extra {
		m[k] = v
	}
	m["v"], m["id"], m["type"], m["ts"], m["from"] = e.V, e.ID, string(e.Type), e.TS, e.From
	for k, v := range map[string]string{"to": e.To, "task_id": e.TaskID, "in_reply_to": e.InReplyTo, "context_id": e.ContextID} {
		if v != "" {
			m[k] = v
		}
	}
	tr := map[string]any{"trace_id": e.Trace.TraceID, "span_id": e.Trace.SpanID}
	if e.Trace.ParentSpanID != nil {
		tr["parent_span_id"] = *e.Trace.ParentSpanID
	} else if !e.Trace.OmitParent {
		tr["parent_span_id"] = nil
	}
	if e.Trace.TraceState != "" {
		tr["tracestate"] = e.Trace.TraceState
	}
	m["trace"] = tr
	if e.Budget != nil {
		m["budget"] = e.Budget
	}
	if len(e.Payload) > 0 {
		m["payload"] = e.Payload
	}
	if len(e.Meta) > 0 {
		m["meta"] = e.Meta
	}
	if withSig {
		m["sig"] = e.Sig
	}
	return m, nil
}

// versionMajor returns the major component of a semver-like version string.
func versionMajor(v string) (int, bool) {
	head, _, _ := strings.Cut(v, ".")
	n, err := strconv.Atoi(head)
	if err != nil || n < 0 || head == "" || head[0] == '+' {
		return 0, false
	}
	return n, true
}
