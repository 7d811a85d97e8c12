package protocol

import (
	"fmt"
	"time"

	"agentmesh.dev/mesh/shared/errs"
)

// NoCap disables the sender-text cap (a manifest's declared 0).
const NoCap = -1

// Inbox runs the whole receive order for one agent: decode (structure,
// version, signature), then dedup, freshness, addressing, the relay-hop
// guard, the sender-text cap, and finally the fence and frame. A handler
// only ever sees a Delivery.
type Inbox struct {
	// Self is the receiving agent's public key, for addressing.
	Self string
	// Decoder verifies envelopes; nil uses DefaultDecoder.
	Decoder *Decoder
	// Dedup is this agent's (from, id) memory; nil disables dedup, which only
	// tests of a single step should do.
	Dedup *DedupMemory
	// MaxInboundChars is the sender-text cap in UTF-16 code units: 0 means
	// DefaultMaxInbound, NoCap disables it.
	MaxInboundChars int
	// Now is the clock; nil uses time.Now.
	Now func() time.Time
	// NoFrame turns framing off, for a host that frames for itself (never
	// frame twice).
	NoFrame bool
	// Warn receives local warnings (e.g. "inbound_oversize"); may be nil.
	Warn func(code string, r *Refusal)
}

// Delivery is an envelope that passed every check, with the value its
// handler receives.
type Delivery struct {
	Env *Envelope
	// Input is what the handler gets: payload.input for a request, the
	// payload otherwise, framed when it carries sender text.
	Input any
	// SenderText is the extracted text before framing ("" when none).
	SenderText string
	// Framed reports whether Input carries a frame.
	Framed bool
	// Source is the path it arrived on.
	Source Source
}

// Refusal is why an envelope did not reach a handler.
type Refusal struct {
	Stage string // decode, duplicate, freshness, address, hops, size
	Err   *errs.Error
	// Silent refusals send nothing back (duplicate, stale, misaddressed,
	// over the hop bound): answering would help whoever replayed it.
	Silent bool
	// Env is the verified envelope when the refusal came after decoding,
	// so a size refusal can be answered in_reply_to it.
	Env *Envelope
}

func (r *Refusal) Error() string { return fmt.Sprintf("refused at %s: %v", r.Stage, r.Err) }

// Unwrap exposes the protocol error.
func (r *Refusal) Unwrap() error { return r.Err }

// Receive decodes data and runs every check.
func (in *Inbox) Receive(data []byte, src Source) (*Delivery, error) {
	d := in.Decoder
	if d == nil {
		d = DefaultDecoder
	}
	e, err := d.Decode(data)
	if err != nil {
		return nil, &Refusal{Stage: "decode", Err: errs.As(err)}
	}
	return in.Check(e, src)
}

// Check runs the steps after decoding on a verified envelope.
func (in *Inbox) Check(e *Envelope, src Source) (*Delivery, error) {
	now := time.Now()
	if in.Now != nil {
		now = in.Now()
	}
	// Dedup comes before freshness and remembers everything it sees.
	if in.Dedup != nil && in.Dedup.Seen(e.From, e.ID) {
		return nil, in.refuse(&Refusal{Stage: "duplicate", Silent: true, Env: e,
			Err: errs.New(errs.InvalidEnvelope, "duplicate envelope")})
	}
	if err := CheckFreshness(e.TS, now, src); err != nil {
		return nil, in.refuse(&Refusal{Stage: "freshness", Silent: true, Env: e, Err: errs.As(err)})
	}
	if err := CheckAddress(e, in.Self); err != nil {
		return nil, in.refuse(&Refusal{Stage: "address", Silent: true, Env: e, Err: errs.As(err)})
	}
	if e.Hops() > MaxRelayHops {
		return nil, in.refuse(&Refusal{Stage: "hops", Silent: true, Env: e,
			Err: errs.New(errs.InvalidEnvelope, "envelope relayed more than 3 hops")})
	}
	input, err := HandlerInput(e)
	if err != nil {
		return nil, in.refuse(&Refusal{Stage: "decode", Env: e, Err: errs.As(err)})
	}
	limit := in.MaxInboundChars
	if limit == 0 {
		limit = DefaultMaxInbound
	}
	if limit != NoCap {
		if err := CheckSize(input, limit); err != nil {
			r := &Refusal{Stage: "size", Env: e, Err: errs.As(err)}
			if in.Warn != nil {
				in.Warn("inbound_oversize", r)
			}
			return nil, r
		}
	}
	text, _, _ := SenderText(input)
	dl := &Delivery{Env: e, Input: input, SenderText: text, Source: src}
	if !in.NoFrame {
		dl.Input, dl.Framed = FrameInput(input, Provenance{From: e.From, ReceivedAt: now, TraceID: e.Trace.TraceID})
	}
	return dl, nil
}

func (in *Inbox) refuse(r *Refusal) *Refusal {
	if in.Warn != nil {
		in.Warn("inbound_"+r.Stage, r)
	}
	return r
}

// HandlerInput is the value a handler receives: payload.input for a request
// (null when absent), the whole payload for every other type.
func HandlerInput(e *Envelope) (any, error) {
	if e.decodedPayload() {
		// Copy only what the handler gets out of the kept parse.
		v, err := e.PayloadView()
		if err != nil {
			return nil, errs.Wrap(errs.InvalidEnvelope, "payload is not valid JSON", err)
		}
		if e.Type == TypeRequest {
			if v, err = requestInput(v); err != nil {
				return nil, err
			}
		}
		return cloneValue(v), nil
	}
	v, err := e.PayloadValue()
	if err != nil {
		return nil, errs.Wrap(errs.InvalidEnvelope, "payload is not valid JSON", err)
	}
	if e.Type != TypeRequest {
		return v, nil
	}
	return requestInput(v)
}

// requestInput is payload.input of a request's parsed payload.
func requestInput(payload any) (any, error) {
	m, ok := payload.(map[string]any)
	if !ok {
		return nil, errs.New(errs.InvalidEnvelope, "a request payload must be an object {offering, input, config?}")
	}
	return m["input"], nil
}
