package protocol

import (
	"crypto/ed25519"
	"encoding/base64"
	"fmt"
	"math"
	"strconv"

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
	// msg is the tag, a line feed and the canonical JSON of the envelope
	// without sig: the bytes the signature must cover. Payload and Meta
	// are slices of it.
	msg []byte
}

// decoded is everything decoding one envelope allocates besides its
// strings and canonical bytes, in one allocation.
type decoded struct {
	u      Unverified
	e      Envelope
	parent string
	view   payloadView
	budget Budget
	money  Money
}

// Parse runs steps 1 and 2 of the decode order.
func Parse(data []byte) (*Unverified, error) {
	d, err := decodeEnvelope(data, false)
	if err != nil {
		return nil, err
	}
	return &d.u, nil
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
	v, ok := canonMember(u.e.Payload, "status")
	return ok && string(v) == `"`+StatusAccepted+`"`
}

// Verify runs step 3, the signature check, and returns the verified
// envelope. Call it at most once per Unverified.
func (d *Decoder) Verify(u *Unverified) (*Envelope, error) {
	e := u.e
	if e.Sig == "" {
		return nil, errs.New(errs.IdentityMismatch, "envelope is not signed")
	}
	var sig [ed25519.SignatureSize]byte
	if !decodeSig(sig[:], e.Sig) {
		return nil, errs.New(errs.IdentityMismatch, "envelope sig is not a base64url Ed25519 signature")
	}
	cache := d.Keys
	if cache == nil {
		cache = defaultKeys
	}
	key, err := cache.Get(e.From)
	if err != nil {
		return nil, errs.Newf(errs.IdentityMismatch, "envelope from is not an agent public key: %v", err)
	}
	if !key.Verify(u.msg, sig[:]) {
		if d.RefuseUntagged || !key.Verify(u.msg[envelopeTagLen:], sig[:]) {
			return nil, errs.New(errs.IdentityMismatch, "envelope signature does not verify against from")
		}
	}
	return e, nil
}

// envelopeTagLen is the length of the tag and line feed before the
// canonical JSON in the signed bytes.
const envelopeTagLen = len(TagEnvelope) + 1

// decodeSig decodes a base64url signature (strictly, as
// base64.RawURLEncoding.Strict().DecodeString does) into dst, which it must
// fill exactly, without allocating.
func decodeSig(dst []byte, s string) bool {
	var in [128]byte
	var out [96]byte // base64.RawURLEncoding.DecodedLen(128)
	if len(s) > len(in) {
		// Longer than any signature, but line feeds are ignored by the
		// decoder: decide exactly as it would.
		b, err := base64.RawURLEncoding.Strict().DecodeString(s)
		return err == nil && len(b) == len(dst) && copy(dst, b) == len(dst)
	}
	n := copy(in[:], s)
	m, err := base64.RawURLEncoding.Strict().Decode(out[:], in[:n])
	if err != nil || m != len(dst) {
		return false
	}
	copy(dst, out[:m])
	return true
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
	d, err := decodeEnvelope(data, true)
	if err != nil {
		return nil, err
	}
	return &d.e, nil
}

// The members of an envelope this version knows, as indexes of the
// decoder's table.
const (
	mV = iota
	mID
	mType
	mTS
	mFrom
	mTo
	mTaskID
	mInReplyTo
	mContextID
	mTrace
	mBudget
	mPayload
	mMeta
	mSig
	nMembers
)

func memberIndex(name []byte) int {
	switch string(name) {
	case "v":
		return mV
	case "id":
		return mID
	case "type":
		return mType
	case "ts":
		return mTS
	case "from":
		return mFrom
	case "to":
		return mTo
	case "task_id":
		return mTaskID
	case "in_reply_to":
		return mInReplyTo
	case "context_id":
		return mContextID
	case "trace":
		return mTrace
	case "budget":
		return mBudget
	case "payload":
		return mPayload
	case "meta":
		return mMeta
	case "sig":
		return mSig
	}
	return -1
}

// maxSharedStrings bounds the decoded string members that share one
// allocation: past it each gets its own, so that a long member (a huge
// "to") is not kept alive by a short one (the id) that outlives it.
const maxSharedStrings = 1024

// decodeEnvelope is steps 1 (JSON and structure) and 2 (version major) in
// one walk over data: the walker checks the JSON and writes its canonical
// form after the envelope tag, the structure is read off the top-level
// members, and the canonical bytes without sig become what the signature
// must cover. broker selects DecodeBrokerAttributed's reading of payload
// and meta. The checks and their order, and so every refusal, are those of
// the map-based decoder this replaced (reference_test.go holds it).
func decodeEnvelope(data []byte, broker bool) (*decoded, error) {
	bp := getBuf()
	defer putBuf(bp)
	out := append((*bp)[:0], TagEnvelope...)
	out = append(out, '\n')
	c := getCanon(data, out)
	defer putCanon(c)
	c.keepTop = true
	err := c.document()
	out = c.out
	*bp = out
	if err != nil {
		return nil, errs.Wrap(errs.InvalidEnvelope, "envelope is not valid JSON", err)
	}
	if out[envelopeTagLen] != '{' {
		return nil, invalid("envelope must be a JSON object")
	}

	var at [nMembers]int // 1 + index into c.recs; 0 when absent
	extra := 0
	for i, r := range c.recs {
		if k := memberIndex(c.names[r.nameStart:r.nameEnd]); k >= 0 {
			at[k] = i + 1
		} else {
			extra++
		}
	}
	value := func(k int) []byte {
		if at[k] == 0 {
			return nil
		}
		r := c.recs[at[k]-1]
		return out[r.val:r.end]
	}

	// The string members are unescaped into hb and become strings at the
	// end, in one allocation.
	var hbArr [512]byte
	hb := hbArr[:0]
	var strs [nMembers]span
	str := func(v []byte) span {
		a := len(hb)
		hb = appendUnquoted(hb, v)
		return span{a, len(hb)}
	}
	for _, k := range [...]int{mV, mID, mType, mTS, mFrom} {
		v := value(k)
		if v == nil {
			return nil, invalid("envelope is missing " + memberNames[k])
		}
		if v[0] != '"' || len(v) == 2 {
			return nil, invalid("envelope " + memberNames[k] + " must be a non-empty string")
		}
		strs[k] = str(v)
	}
	if n := strs[mID].b - strs[mID].a; n > MaxIDBytes {
		return nil, invalid(fmt.Sprintf("envelope id is %d bytes; at most %d are allowed", n, MaxIDBytes))
	}
	typ := envelopeType(hb[strs[mType].a:strs[mType].b])
	if typ == "" {
		return nil, invalid("envelope type " + string(hb[strs[mType].a:strs[mType].b]) + " is not one of register, discover, request, respond, emit, subscribe")
	}
	for _, k := range [...]int{mTo, mTaskID, mInReplyTo, mContextID} {
		switch v := value(k); {
		case v == nil || v[0] == 'n':
		case v[0] == '"':
			strs[k] = str(v)
		default:
			return nil, invalid("envelope " + memberNames[k] + " must be a string")
		}
	}
	if n := strs[mInReplyTo].b - strs[mInReplyTo].a; n > MaxIDBytes {
		return nil, invalid(fmt.Sprintf("envelope in_reply_to is %d bytes; no envelope id is longer than %d", n, MaxIDBytes))
	}

	tr := value(mTrace)
	if tr == nil || tr[0] != '{' {
		return nil, invalid("envelope trace must be an object {trace_id, span_id}")
	}
	var traceID, spanID, parentID, traceState []byte
	for it := (canonObject{b: tr}); ; {
		name, v, ok := it.next()
		if !ok {
			break
		}
		switch string(name) {
		case "trace_id":
			traceID = v
		case "span_id":
			spanID = v
		case "parent_span_id":
			parentID = v
		case "tracestate":
			traceState = v
		}
	}
	var traceSpans [4]span // trace_id, span_id, parent_span_id, tracestate
	if traceID == nil || traceID[0] != '"' || len(traceID) == 2 {
		return nil, invalid("envelope trace.trace_id must be a non-empty string")
	}
	traceSpans[0] = str(traceID)
	if spanID == nil || spanID[0] != '"' || len(spanID) == 2 {
		return nil, invalid("envelope trace.span_id must be a non-empty string")
	}
	traceSpans[1] = str(spanID)
	hasParent, omitParent := false, parentID == nil
	switch {
	case parentID == nil || parentID[0] == 'n':
	case parentID[0] == '"':
		hasParent = true
		traceSpans[2] = str(parentID)
	default:
		return nil, invalid("envelope trace.parent_span_id must be a string or null")
	}
	if traceState != nil {
		if traceState[0] != '"' {
			return nil, invalid("envelope trace.tracestate must be a string")
		}
		traceSpans[3] = str(traceState)
	}

	if at[mPayload] == 0 {
		return nil, invalid("envelope is missing payload")
	}
	var budget canonBudget
	bv := value(mBudget)
	hasBudget := bv != nil && bv[0] != 'n'
	if hasBudget {
		var err error
		if budget, hb, err = budgetFromCanon(bv, hb); err != nil {
			return nil, err
		}
	}
	if mv := value(mMeta); mv != nil && mv[0] != 'n' && mv[0] != '{' {
		return nil, invalid("envelope meta must be an object")
	}
	if sv := value(mSig); sv != nil {
		if sv[0] != '"' {
			return nil, errs.New(errs.IdentityMismatch, "envelope sig must be a string")
		}
		strs[mSig] = str(sv)
	}
	var extras map[string]any
	if extra > 0 {
		extras = make(map[string]any, extra)
		for _, r := range c.recs {
			name := c.names[r.nameStart:r.nameEnd]
			if memberIndex(name) >= 0 {
				continue
			}
			v, err := ParseJSON(out[r.val:r.end])
			if err != nil {
				return nil, errs.Wrap(errs.InvalidEnvelope, "envelope is not valid JSON", err)
			}
			extras[string(name)] = v
		}
	}

	// Everything is checked but the version: build the envelope.
	d := &decoded{}
	e := &d.e
	d.u.e = e
	shared := len(hb) <= maxSharedStrings
	var hs string
	if shared {
		hs = string(hb)
	}
	get := func(s span) string {
		if s.a == s.b {
			return ""
		}
		if shared {
			return hs[s.a:s.b]
		}
		return string(hb[s.a:s.b])
	}
	e.V, e.ID, e.Type, e.TS, e.From = get(strs[mV]), get(strs[mID]), typ, get(strs[mTS]), get(strs[mFrom])
	e.To, e.TaskID, e.InReplyTo, e.ContextID = get(strs[mTo]), get(strs[mTaskID]), get(strs[mInReplyTo]), get(strs[mContextID])
	e.Sig = get(strs[mSig])
	e.Trace.TraceID, e.Trace.SpanID, e.Trace.TraceState = get(traceSpans[0]), get(traceSpans[1]), get(traceSpans[3])
	if hasParent {
		d.parent = get(traceSpans[2])
		e.Trace.ParentSpanID = &d.parent
	}
	e.Trace.OmitParent = omitParent
	if hasBudget {
		d.budget.Revision = budget.revision
		d.budget.Deadline = get(span(budget.deadline))
		if budget.hasCeiling {
			d.money = Money{AmountMicro: budget.amount, Currency: get(span(budget.currency))}
			d.budget.CostCeiling = &d.money
		}
		e.Budget = &d.budget
	}
	e.Extra = extras
	e.raw = data

	major, ok := versionMajor(e.V)
	if !ok {
		return nil, errs.Newf(errs.InvalidVersion, "envelope version %q is not a version", e.V)
	}
	if major != VersionMajor {
		return nil, errs.Newf(errs.InvalidVersion, "envelope version %s has major %d; this mesh speaks major %d", e.V, major, VersionMajor)
	}

	// The signed bytes: the canonical form without the sig member (and
	// the comma that joined it), in a buffer of their own that Payload and
	// Meta share.
	pay := c.recs[at[mPayload]-1]
	var meta memberRec
	if at[mMeta] != 0 {
		meta = c.recs[at[mMeta]-1]
	}
	if at[mSig] != 0 && !broker {
		r := c.recs[at[mSig]-1]
		cut0, cut1 := r.start, r.end
		if out[cut0-1] == ',' {
			cut0--
		} else {
			cut1++ // the first member: its following comma goes
		}
		n := cut1 - cut0
		out = append(out[:cut0], out[cut1:]...)
		for _, m := range []*memberRec{&pay, &meta} {
			if m.start >= cut1 {
				m.start, m.val, m.end = m.start-n, m.val-n, m.end-n
			}
		}
	}
	msg := make([]byte, len(out))
	copy(msg, out)
	d.u.msg = msg
	e.Payload = msg[pay.val:pay.end:pay.end]
	if meta.end > 0 && (broker || msg[meta.val] != 'n') {
		e.Meta = msg[meta.val:meta.end:meta.end]
	}
	d.view.of, d.view.n = &e.Payload[0], len(e.Payload)
	e.view = &d.view
	return d, nil
}

var memberNames = [nMembers]string{
	mV: "v", mID: "id", mType: "type", mTS: "ts", mFrom: "from", mTo: "to", mTaskID: "task_id",
	mInReplyTo: "in_reply_to", mContextID: "context_id", mTrace: "trace", mBudget: "budget",
	mPayload: "payload", mMeta: "meta", mSig: "sig",
}

// envelopeType is the Type named by b, or "" when b names none.
func envelopeType(b []byte) Type {
	switch string(b) {
	case string(TypeRegister):
		return TypeRegister
	case string(TypeDiscover):
		return TypeDiscover
	case string(TypeRequest):
		return TypeRequest
	case string(TypeRespond):
		return TypeRespond
	case string(TypeEmit):
		return TypeEmit
	case string(TypeSubscribe):
		return TypeSubscribe
	}
	return ""
}

// span is where a decoded string lies in the decoder's string buffer.
type span struct{ a, b int }

// canonBudget is a budget block read off its canonical bytes, its strings
// still in the decoder's string buffer.
type canonBudget struct {
	revision   int64
	deadline   span
	hasCeiling bool
	amount     int64
	currency   span
}

// budgetFromCanon is BudgetFromValue on the canonical bytes of a non-null
// budget member: the same checks in the same order, the same refusals.
// The deadline and currency are unescaped onto hb, returned grown (a
// pointer to it would make the decoder's stack buffer escape).
func budgetFromCanon(b []byte, hb []byte) (canonBudget, []byte, error) {
	var out canonBudget
	if b[0] != '{' {
		return out, hb, budgetErr("must be an object")
	}
	var rev, deadline, ceiling []byte
	for it := (canonObject{b: b}); ; {
		name, v, ok := it.next()
		if !ok {
			break
		}
		switch string(name) {
		case "revision":
			rev = v
		case "deadline":
			deadline = v
		case "cost_ceiling":
			ceiling = v
		}
	}
	if rev == nil {
		return out, hb, budgetErr("revision is required")
	}
	var ok bool
	if out.revision, ok = canonNonNegInt(rev); !ok {
		return out, hb, budgetErr("revision must be a non-negative integer")
	}
	if deadline != nil {
		if deadline[0] != '"' {
			return out, hb, budgetErr("deadline must be an RFC 3339 instant string")
		}
		a := len(hb)
		hb = appendUnquoted(hb, deadline)
		out.deadline = span{a, len(hb)}
		if ts := string(hb[a:]); !validTime(ts) {
			// A copy in the message, not the bytes: hb must not escape, or
			// the decoder's stack buffer for string members would be a heap
			// allocation on every decode.
			return out, hb, budgetErr("deadline %q is not a full RFC 3339 instant", ts)
		}
	}
	if ceiling != nil {
		if ceiling[0] != '{' {
			return out, hb, budgetErr("cost_ceiling: %v", "must be an object {amount_micro, currency}")
		}
		amount, ok := canonMember(ceiling, "amount_micro")
		if !ok {
			return out, hb, budgetErr("cost_ceiling: %v", "amount_micro is required")
		}
		if out.amount, ok = canonNonNegInt(amount); !ok {
			return out, hb, budgetErr("cost_ceiling: %v", "amount_micro must be a non-negative integer of micro-units")
		}
		a := len(hb)
		if cur, ok := canonMember(ceiling, "currency"); ok && cur[0] == '"' {
			hb = appendUnquoted(hb, cur)
		}
		out.currency = span{a, len(hb)}
		if !isCurrencyBytes(hb[a:]) {
			return out, hb, budgetErr("cost_ceiling: %v", "currency is required, as an ISO 4217 code such as USD")
		}
		out.hasCeiling = true
	}
	if deadline == nil && ceiling == nil {
		return out, hb, budgetErr("at least one of deadline and cost_ceiling is required")
	}
	return out, hb, nil
}

// canonNonNegInt is nonNegInt on a canonical value.
func canonNonNegInt(v []byte) (int64, bool) {
	if v[0] != '-' && (v[0] < '0' || v[0] > '9') {
		return 0, false // not a number
	}
	f, err := strconv.ParseFloat(string(v), 64)
	if err != nil || f < 0 || f != math.Trunc(f) || f > MaxSafeInteger {
		return 0, false
	}
	return int64(f), true
}

// isCurrencyBytes is IsCurrency on bytes.
func isCurrencyBytes(b []byte) bool {
	return len(b) == 3 && b[0] >= 'A' && b[0] <= 'Z' && b[1] >= 'A' && b[1] <= 'Z' && b[2] >= 'A' && b[2] <= 'Z'
}

// validTime reports whether ts parses as the protocol's RFC 3339 instant.
func validTime(ts string) bool {
	_, err := ParseTime(ts)
	return err == nil
}
