package protocol

import (
	"slices"

	"agentmesh.dev/mesh/shared/errs"
)

// RecipientLimits is what a sender knows of a recipient's declared limits,
// read from its manifest.
type RecipientLimits struct {
	// MaxInboundChars is the manifest's limits.max_inbound_chars: nil when
	// undeclared (the default cap governs), 0 for an explicit "no cap".
	MaxInboundChars *int
	// OutputModes and InputModes are the offering's declared media types;
	// empty means undeclared, which refuses nothing.
	OutputModes []string
	InputModes  []string
}

// sigMemberLen is what signing adds to the canonical unsigned form:
// `,"sig":"` + 86 base64url characters + `"`.
const sigMemberLen = len(`,"sig":""`) + 86

// WireSize is the size in bytes the envelope will have on the wire once
// signed, computed without signing it.
func (e *Envelope) WireSize() (int, error) {
	bp := getBuf()
	defer putBuf(bp)
	b, err := e.appendCanonical((*bp)[:0], false)
	*bp = b
	if err != nil {
		return 0, err
	}
	if e.Sig != "" {
		return len(b) + len(`,"sig":""`) + len(e.Sig), nil
	}
	return len(b) + sigMemberLen, nil
}

// Preflight makes the sender's local refusals (upstream-notes §5): the
// recipient's sender-text cap, the content types it accepts, and the
// transport's maximum payload (maxPayload bytes, 0 for the NATS default).
// A refusal carries the same code and retryable the recipient would answer
// with; the caller must then publish, sign and retry nothing.
func Preflight(e *Envelope, lim RecipientLimits, maxPayload int) error {
	if e.Type == TypeRequest {
		// One parse serves the size cap and the content types; neither
		// changes it.
		payload, err := e.PayloadView()
		if err != nil {
			return errs.Wrap(errs.InvalidEnvelope, "payload is not valid JSON", err)
		}
		input, err := requestInput(payload)
		if err != nil {
			return err
		}
		limit := DefaultMaxInbound
		if lim.MaxInboundChars != nil {
			limit = *lim.MaxInboundChars
		}
		if err := CheckSize(input, limit); err != nil {
			return err
		}
		if err := checkContentType(payload, lim); err != nil {
			return err
		}
	}
	if maxPayload <= 0 {
		maxPayload = TransportMaxPayload
	}
	n, err := e.WireSize()
	if err != nil {
		return errs.Wrap(errs.InvalidEnvelope, "envelope cannot be encoded", err)
	}
	return CheckEnvelopeSize(n, maxPayload)
}

// CheckEnvelopeSize refuses an envelope larger than the transport's maximum
// payload; equal is allowed.
func CheckEnvelopeSize(n, maxPayload int) error {
	if n > maxPayload {
		return errs.Newf(errs.ContextTooLarge, "envelope is %d bytes, over the transport maximum of %d; send large content by reference", n, maxPayload).
			WithDetails(map[string]any{"limit": "transport_max_payload", "max_payload_bytes": maxPayload, "envelope_bytes": n})
	}
	return nil
}

// CheckAcceptedOutput refuses a request whose config.accepted_output shares
// no media type with the offering's output modes. Either list empty refuses
// nothing.
func CheckAcceptedOutput(outputModes, accepted []string) error {
	if len(outputModes) == 0 || len(accepted) == 0 {
		return nil
	}
	for _, a := range accepted {
		if slices.Contains(outputModes, a) {
			return nil
		}
	}
	return errs.Newf(errs.ContentTypeNotSupported, "the offering produces %v; none of the accepted outputs %v", outputModes, accepted).
		WithDetails(map[string]any{"output_modes": outputModes, "accepted_output": accepted})
}

func checkContentType(v any, lim RecipientLimits) error {
	p, _ := v.(map[string]any)
	cfg, _ := p["config"].(map[string]any)
	if err := CheckAcceptedOutput(lim.OutputModes, stringList(cfg["accepted_output"])); err != nil {
		return err
	}
	// The input's own media type, when the sender declares one.
	if ct, ok := cfg["content_type"].(string); ok && len(lim.InputModes) > 0 && !slices.Contains(lim.InputModes, ct) {
		return errs.Newf(errs.ContentTypeNotSupported, "the offering accepts %v, not %s", lim.InputModes, ct).
			WithDetails(map[string]any{"input_modes": lim.InputModes, "content_type": ct})
	}
	return nil
}

func stringList(v any) []string {
	a, _ := v.([]any)
	out := make([]string, 0, len(a))
	for _, x := range a {
		if s, ok := x.(string); ok {
			out = append(out, s)
		}
	}
	return out
}
