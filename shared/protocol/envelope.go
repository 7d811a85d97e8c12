// Package protocol is the wire core of the mesh: canonical JSON, the signed
// envelope, the other signed strings, the decode order every receiver
// follows, sender pre-flight, budgets, owner allowances and cancel payloads.
// It links no cloud SDK and no NATS server: the adapter, the workers and the
// conformance runner all build on it.
package protocol

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
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
	// view is the payload's parse, for the protocol's own read-only looks
	// at it (status, the queued ack, the offering), made on first use and
	// kept; set by the decoder, it belongs to the Payload bytes the decoder
	// produced, and to no other.
	view *payloadView
}

// payloadView is the lazily parsed payload of a decoded envelope: of and n
// identify the decoder's Payload bytes, v is their parse once made. Several
// goroutines may look at one envelope, so v is set atomically; two racing
// first looks each parse, and one parse wins.
type payloadView struct {
	of *byte
	n  int
	v  atomic.Pointer[any]
}

// decodedPayload reports whether Payload is still the canonical bytes the
// decoder produced (which are valid JSON, parse without error and can be
// read by the canonical scanners).
func (e *Envelope) decodedPayload() bool {
	return e.view != nil && len(e.Payload) == e.view.n && len(e.Payload) > 0 && &e.Payload[0] == e.view.of
}

// PayloadView is the payload's value for reading only: for a decoded
// envelope whose Payload is still the bytes it was decoded to, one parse
// kept for every look; else a fresh parse. Callers must not modify it;
// code that hands the value on uses PayloadValue.
func (e *Envelope) PayloadView() (any, error) {
	if !e.decodedPayload() {
		if len(e.Payload) == 0 {
			return nil, nil
		}
		return ParseJSON(e.Payload)
	}
	if v := e.view.v.Load(); v != nil {
		return *v, nil
	}
	v, err := ParseJSON(e.Payload)
	if err != nil {
		return nil, err
	}
	if !e.view.v.CompareAndSwap(nil, &v) {
		return *e.view.v.Load(), nil
	}
	return v, nil
}

// New starts an envelope of type typ from the key from, with a fresh id, the
// current time, a new root trace and payload (any Go or decoded JSON value).
func New(typ Type, from string, payload any) (*Envelope, error) {
	return newEnvelope(typ, from, payload, nil)
}

// built is what building one envelope allocates besides its payload and
// strings, in one allocation.
type built struct {
	e      Envelope
	parent string
}

// newEnvelope builds an envelope on a new root trace, or, with req, on a
// child span of req's trace. The id, the timestamp and the trace ids come
// from one read of the random source and share one string.
func newEnvelope(typ Type, from string, payload any, req *Envelope) (*Envelope, error) {
	var rnd [34]byte // id tail and sequence start, span id, trace id
	_, _ = rand.Read(rnd[:])
	now := time.Now()
	var sb [128]byte
	s := sb[:0]
	s = ids.appendNext(s, now, [10]byte(rnd[:10]))
	idEnd := len(s)
	s = now.UTC().AppendFormat(s, TimeFormat)
	tsEnd := len(s)
	s = hex.AppendEncode(s, rnd[10:18])
	spanEnd := len(s)
	if req == nil {
		s = hex.AppendEncode(s, rnd[18:34])
	}
	str := string(s)

	b := &built{}
	e := &b.e
	e.V, e.Type, e.From = Version, typ, from
	e.ID, e.TS = str[:idEnd], str[idEnd:tsEnd]
	e.Trace.SpanID = str[tsEnd:spanEnd]
	if req == nil {
		e.Trace.TraceID = str[spanEnd:]
	} else {
		e.Trace.TraceID, e.Trace.TraceState = req.Trace.TraceID, req.Trace.TraceState
		b.parent = req.Trace.SpanID
		e.Trace.ParentSpanID = &b.parent
	}
	if c, ok := payload.(canonicalPayload); ok {
		e.Payload = json.RawMessage(c)
	} else if err := e.SetPayload(payload); err != nil {
		return nil, err
	}
	if typ == TypeRespond {
		// SetPayload wrote canonical JSON: the scanner reads it.
		if v, ok := canonError(e.Payload); ok {
			e.Extra = map[string]any{"error": v}
		}
	}
	if req != nil {
		e.InReplyTo = req.ID
		e.To = req.From
		e.ContextID = req.ContextID
	}
	return e, nil
}

// canonicalPayload is a payload the package already holds in canonical
// form; newEnvelope copies it as it is.
type canonicalPayload string

// canonError is the error object of a respond's canonical payload
// (payload.error, beside payload.status: spec §7.1), which New copies to the
// envelope member error, where a protocol 0.3 reader looks for it
// (upstream-notes §15); both places then carry the same object. The member
// is found as encoding/json, which this replaced, found it: its name
// compared without regard to ASCII case, the last such member winning, and
// null meaning none.
func canonError(payload []byte) (any, bool) {
	var val []byte
	it := canonObject{b: payload}
	for {
		name, v, ok := it.next()
		if !ok {
			break
		}
		if bytes.EqualFold(name, []byte("error")) {
			val = v
		}
	}
	if val == nil || string(val) == "null" {
		return nil, false
	}
	v, err := ParseJSON(val)
	if err != nil {
		return nil, false
	}
	return v, true
}

// ErrorObject is the error object an envelope carries, from payload.error
// (this mesh, protocol 0.2) or the envelope member error (protocol 0.3),
// or nil.
func ErrorObject(e *Envelope) any {
	if e.decodedPayload() {
		if v, ok := canonError(e.Payload); ok {
			return v
		}
	} else {
		var p struct {
			Error json.RawMessage `json:"error"`
		}
		if json.Unmarshal(e.Payload, &p) == nil && len(p.Error) > 0 && string(p.Error) != "null" {
			if v, err := ParseJSON(p.Error); err == nil {
				return v
			}
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
	return newEnvelope(TypeRespond, from, payload, req)
}

// SetPayload canonicalises v into the payload. The signature is cleared:
// the bytes it covered have changed.
func (e *Envelope) SetPayload(v any) error {
	if v == nil {
		e.Payload = json.RawMessage("{}")
		e.Sig = ""
		return nil
	}
	bp := getBuf()
	defer putBuf(bp)
	b, err := AppendCanonical((*bp)[:0], v)
	*bp = b
	if err != nil {
		return fmt.Errorf("envelope payload: %w", err)
	}
	e.Payload = bytes.Clone(b)
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
//
// For a decoded envelope it is a copy of the kept parse (PayloadView): new
// objects and arrays, the same immutable strings, numbers and booleans. A
// receiver reads a payload several times (the handler's input, the
// offering and config, the result's fields), and copying the containers
// costs a fraction of parsing again.
func (e *Envelope) PayloadValue() (any, error) {
	if len(e.Payload) == 0 {
		return nil, nil
	}
	if e.decodedPayload() {
		v, err := e.PayloadView()
		if err != nil {
			return nil, err
		}
		return cloneValue(v), nil
	}
	return ParseJSON(e.Payload)
}

// CloneValue copies the objects and arrays of a generic value (as
// PayloadView returns them, to be read only) so the copy may be changed;
// the leaves (strings, float64, bool, nil) are immutable and shared.
func CloneValue(v any) any { return cloneValue(v) }

func cloneValue(v any) any {
	switch x := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = cloneValue(e)
		}
		return m
	case []any:
		a := make([]any, len(x))
		for i, e := range x {
			a[i] = cloneValue(e)
		}
		return a
	}
	return v
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
	return e.appendCanonical(make([]byte, 0, e.wireSizeHint()), true)
}

// wireSizeHint is about the size of the wire form, so Marshal allocates
// its buffer once: the members' text and the names and punctuation around
// them.
func (e *Envelope) wireSizeHint() int {
	return 256 + len(e.V) + len(e.ID) + len(e.TS) + len(e.From) + len(e.To) + len(e.TaskID) + len(e.InReplyTo) +
		len(e.ContextID) + len(e.Sig) + len(e.Trace.TraceID) + len(e.Trace.SpanID) + len(e.Trace.TraceState) +
		len(e.Payload) + len(e.Meta)
}

// AppendMarshal appends the wire form (Marshal) to dst, so a sender can
// reuse one buffer for every envelope it publishes.
func (e *Envelope) AppendMarshal(dst []byte) ([]byte, error) {
	if e.Sig == "" {
		return dst, errs.New(errs.IdentityMismatch, "envelope is not signed")
	}
	return e.appendCanonical(dst, true)
}

// CanonicalUnsigned is the canonical JSON of the envelope without sig: the
// bytes (after the domain tag) that the signature covers.
func (e *Envelope) CanonicalUnsigned() ([]byte, error) {
	return e.appendCanonical(make([]byte, 0, e.wireSizeHint()), false)
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
