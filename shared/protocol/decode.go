package protocol

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"

	"agentmesh.dev/mesh/shared/errs"
)

// Decoder turns wire bytes into a verified Envelope, in the first three
// steps of the decode order (upstream-notes §1.7):
//
//  1. JSON and structure (INVALID_ENVELOPE),
//  2. version major (INVALID_VERSION),
//  3. signature by `from` (IDENTITY_MISMATCH; a missing sig is the same).
//
// Nothing reaches a handler without passing all three. The later steps
// (dedup, freshness, addressing, size cap, fence) belong to a receiver and
// live in Inbox, because they need its identity, clock and memory.
type Decoder struct {
	// RefuseUntagged refuses signatures over the bare canonical JSON (the
	// form the specification describes, from before domain tags). The zero
	// Decoder accepts both forms, so older senders interoperate; a
	// deployment sets this once every sender emits the tagged form.
	RefuseUntagged bool
	// Keys caches decoded sender keys; nil uses a shared bounded cache.
	Keys *KeyCache
}

// DefaultDecoder accepts tagged and untagged signatures.
var DefaultDecoder = &Decoder{}

// Decode parses, checks and verifies one envelope.
func Decode(data []byte) (*Envelope, error) { return DefaultDecoder.Decode(data) }

func invalid(msg string) *errs.Error { return errs.New(errs.InvalidEnvelope, msg) }

// Decode parses, checks and verifies one envelope.
func (d *Decoder) Decode(data []byte) (*Envelope, error) {
	u, err := Parse(data)
	if err != nil {
		return nil, err
	}
	return d.Verify(u)
}

// Unverified is an envelope past steps 1 and 2 of the decode order (JSON,
// structure, version) whose signature has not been checked. What it says
// is the sender's claim: a receiver may use it only to drop the envelope
// or to set it aside unacted-on (an accept no one needs yet), and must pass
// it to Verify before acting on it in any other way. Parsing once and
// verifying later lets a receiver look before paying for the Ed25519
// verification, without parsing twice.
type Unverified struct {
	e *Envelope
	m map[string]any
}

// Parse runs steps 1 and 2 of the decode order.
func Parse(data []byte) (*Unverified, error) {
	e, m, err := parseEnvelope(data)
	if err != nil {
		return nil, err
	}
	return &Unverified{e: e, m: m}, nil
}

// From, ID, InReplyTo, TS and To are the claimed members.
func (u *Unverified) From() string      { return u.e.From }
func (u *Unverified) ID() string        { return u.e.ID }
func (u *Unverified) InReplyTo() string { return u.e.InReplyTo }
func (u *Unverified) TS() string        { return u.e.TS }
func (u *Unverified) To() string        { return u.e.To }

// IsAnswer reports whether the envelope reads as an answer (IsAnswer).
func (u *Unverified) IsAnswer() bool { return IsAnswer(u.e) }

// IsAccept reports whether the envelope reads as an accept (a respond with
// payload.status "accepted").
func (u *Unverified) IsAccept() bool {
	if u.e.Type != TypeRespond {
		return false
	}
	p, _ := u.m["payload"].(map[string]any)
	return p["status"] == StatusAccepted
}

// Verify runs step 3, the signature check, and returns the verified
// envelope. Call it at most once per Unverified.
func (d *Decoder) Verify(u *Unverified) (*Envelope, error) {
	if err := d.verify(u.e, u.m); err != nil {
		return nil, err
	}
	return u.e, nil
}

// DecodeBrokerAttributed runs steps 1 and 2 of the decode order but not the
// signature check. It exists for one kind of reader only: a service tapping
// a subject on which the broker itself attributes the publisher, because
// every credential that may publish there hosts the agent the subject names
// and proved possession of that agent's key when it was minted (the
// outboxes and trace subjects, spec §4.6 rule 4). Such a reader must still
// check that from equals the subject's agent. Anything an agent acts on, and
// anything read from an inbox, goes through Decode.
func DecodeBrokerAttributed(data []byte) (*Envelope, error) {
	e, m, err := parseEnvelope(data)
	if err != nil {
		return nil, err
	}
	for _, f := range []struct {
		name string
		dst  *json.RawMessage
	}{{"payload", &e.Payload}, {"meta", &e.Meta}} {
		if v, ok := m[f.name]; ok {
			c, err := Canonical(v)
			if err != nil {
				return nil, errs.Wrap(errs.InvalidEnvelope, "envelope cannot be canonicalised", err)
			}
			*f.dst = c
		}
	}
	e.keepView(m["payload"])
	return e, nil
}

// parseEnvelope is steps 1 (JSON and structure) and 2 (version major).
func parseEnvelope(data []byte) (*Envelope, map[string]any, error) {
	v, err := ParseJSON(data)
	if err != nil {
		return nil, nil, errs.Wrap(errs.InvalidEnvelope, "envelope is not valid JSON", err)
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, nil, invalid("envelope must be a JSON object")
	}
	e, err := structure(m)
	if err != nil {
		return nil, nil, err
	}
	e.raw = data
	major, ok := versionMajor(e.V)
	if !ok {
		return nil, nil, errs.Newf(errs.InvalidVersion, "envelope version %q is not a version", e.V)
	}
	if major != VersionMajor {
		return nil, nil, errs.Newf(errs.InvalidVersion, "envelope version %s has major %d; this mesh speaks major %d", e.V, major, VersionMajor)
	}
	return e, m, nil
}

// structure checks member types and fills the typed fields. Optional string
// members may be absent or null (the specification's "null" is an API
// normalisation of absent); required ones must be non-empty strings.
func structure(m map[string]any) (*Envelope, error) {
	e := &Envelope{}
	req := func(name string, dst *string) error {
		s, ok := m[name].(string)
		if !ok || s == "" {
			if _, present := m[name]; !present {
				return invalid("envelope is missing " + name)
			}
			return invalid("envelope " + name + " must be a non-empty string")
		}
		*dst = s
		return nil
	}
	opt := func(name string, dst *string) error {
		switch x := m[name].(type) {
		case nil:
			return nil
		case string:
			*dst = x
			return nil
		}
		return invalid("envelope " + name + " must be a string")
	}
	var typ string
	for _, f := range []struct {
		name string
		dst  *string
	}{{"v", &e.V}, {"id", &e.ID}, {"type", &typ}, {"ts", &e.TS}, {"from", &e.From}} {
		if err := req(f.name, f.dst); err != nil {
			return nil, err
		}
	}
	if len(e.ID) > MaxIDBytes {
		return nil, invalid(fmt.Sprintf("envelope id is %d bytes; at most %d are allowed", len(e.ID), MaxIDBytes))
	}
	e.Type = Type(typ)
	if !e.Type.Valid() {
		return nil, invalid("envelope type " + typ + " is not one of register, discover, request, respond, emit, subscribe")
	}
	for _, f := range []struct {
		name string
		dst  *string
	}{{"to", &e.To}, {"task_id", &e.TaskID}, {"in_reply_to", &e.InReplyTo}, {"context_id", &e.ContextID}} {
		if err := opt(f.name, f.dst); err != nil {
			return nil, err
		}
	}
	if len(e.InReplyTo) > MaxIDBytes {
		return nil, invalid(fmt.Sprintf("envelope in_reply_to is %d bytes; no envelope id is longer than %d", len(e.InReplyTo), MaxIDBytes))
	}
	tr, ok := m["trace"].(map[string]any)
	if !ok {
		return nil, invalid("envelope trace must be an object {trace_id, span_id}")
	}
	if e.Trace.TraceID, ok = tr["trace_id"].(string); !ok || e.Trace.TraceID == "" {
		return nil, invalid("envelope trace.trace_id must be a non-empty string")
	}
	if e.Trace.SpanID, ok = tr["span_id"].(string); !ok || e.Trace.SpanID == "" {
		return nil, invalid("envelope trace.span_id must be a non-empty string")
	}
	switch p := tr["parent_span_id"].(type) {
	case nil:
		_, present := tr["parent_span_id"]
		e.Trace.OmitParent = !present
	case string:
		e.Trace.ParentSpanID = &p
	default:
		return nil, invalid("envelope trace.parent_span_id must be a string or null")
	}
	if ts, present := tr["tracestate"]; present {
		s, ok := ts.(string)
		if !ok {
			return nil, invalid("envelope trace.tracestate must be a string")
		}
		e.Trace.TraceState = s
	}
	if _, ok := m["payload"]; !ok {
		return nil, invalid("envelope is missing payload")
	}
	if bv, present := m["budget"]; present && bv != nil {
		b, err := BudgetFromValue(bv)
		if err != nil {
			return nil, err
		}
		e.Budget = &b
	}
	if mv, present := m["meta"]; present && mv != nil {
		if _, ok := mv.(map[string]any); !ok {
			return nil, invalid("envelope meta must be an object")
		}
	}
	if sv, present := m["sig"]; present {
		s, ok := sv.(string)
		if !ok {
			return nil, errs.New(errs.IdentityMismatch, "envelope sig must be a string")
		}
		e.Sig = s
	}
	for k, v := range m {
		if !knownMember[k] {
			if e.Extra == nil {
				e.Extra = map[string]any{}
			}
			e.Extra[k] = v
		}
	}
	return e, nil
}

var knownMember = map[string]bool{
	"v": true, "id": true, "type": true, "ts": true, "from": true, "to": true, "trace": true,
	"task_id": true, "in_reply_to": true, "context_id": true, "budget": true, "payload": true,
	"meta": true, "sig": true,
}

// verify checks the signature over the canonical form of exactly what
// arrived (every member but sig, unknown ones included), and on the way
// captures the canonical payload and meta for the typed envelope.
func (d *Decoder) verify(e *Envelope, m map[string]any) error {
	if e.Sig == "" {
		return errs.New(errs.IdentityMismatch, "envelope is not signed")
	}
	sig, err := base64.RawURLEncoding.Strict().DecodeString(e.Sig)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return errs.New(errs.IdentityMismatch, "envelope sig is not a base64url Ed25519 signature")
	}
	cache := d.Keys
	if cache == nil {
		cache = defaultKeys
	}
	key, err := cache.Get(e.From)
	if err != nil {
		return errs.Newf(errs.IdentityMismatch, "envelope from is not an agent public key: %v", err)
	}

	bp := getBuf()
	defer putBuf(bp)
	msg := append((*bp)[:0], TagEnvelope...)
	msg = append(msg, '\n')
	tagLen := len(msg)
	msg, spans, err := appendEnvelopeMap(msg, m)
	*bp = msg
	if err != nil {
		return errs.Wrap(errs.InvalidEnvelope, "envelope cannot be canonicalised", err)
	}
	if !key.Verify(msg, sig) {
		if d.RefuseUntagged || !key.Verify(msg[tagLen:], sig) {
			return errs.New(errs.IdentityMismatch, "envelope signature does not verify against from")
		}
	}
	if spans.payload[1] > 0 {
		e.Payload = json.RawMessage(append([]byte(nil), msg[spans.payload[0]:spans.payload[1]]...))
		e.keepView(m["payload"])
	}
	if spans.meta[1] > 0 {
		e.Meta = json.RawMessage(append([]byte(nil), msg[spans.meta[0]:spans.meta[1]]...))
	}
	return nil
}

type memberSpans struct{ payload, meta [2]int }

// appendEnvelopeMap canonicalises a decoded envelope without sig and
// records where the payload and meta values landed in dst.
func appendEnvelopeMap(dst []byte, m map[string]any) ([]byte, memberSpans, error) {
	var spans memberSpans
	keys := sortedKeys(m)
	dst = append(dst, '{')
	first := true
	for _, k := range keys {
		if k == "sig" {
			continue
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		var err error
		if dst, err = appendString(dst, k); err != nil {
			return dst, spans, err
		}
		dst = append(dst, ':')
		start := len(dst)
		if dst, err = appendValue(dst, m[k], 1); err != nil {
			return dst, spans, err
		}
		switch k {
		case "payload":
			spans.payload = [2]int{start, len(dst)}
		case "meta":
			if m[k] != nil {
				spans.meta = [2]int{start, len(dst)}
			}
		}
	}
	return append(dst, '}'), spans, nil
}
