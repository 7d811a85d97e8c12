package engagement_test

import (
	"testing"

	"agentmesh.dev/mesh/shared/engagement"
	"agentmesh.dev/mesh/shared/errs"
)

// The decoders of the signed acts take untrusted bytes: they never panic,
// and what they refuse they refuse with a code a caller can act on.
func fuzzAct(f *testing.F, parse func([]byte) error) {
	f.Add([]byte(`{"v":1,"client":"U","seller":"U","offering":"o","sow_id":"sow_x","by":"U","at":"2026-01-01T00:00:00Z","sig":"x"}`))
	f.Add([]byte(`{"v":1,"for_cause":true,"verdict":"rejected","act":"deny","version":2}`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`{"v":1e400}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		err := parse(b)
		if err == nil {
			return // only a valid signature passes
		}
		switch errs.CodeOf(err) {
		case errs.InvalidRequest, errs.IdentityMismatch, errs.PayloadTooLarge:
		default:
			t.Fatalf("refused with %s: %v", errs.CodeOf(err), err)
		}
	})
}

func FuzzParseTermination(f *testing.F) {
	fuzzAct(f, func(b []byte) error { _, err := engagement.ParseTermination(b); return err })
}

func FuzzParseReview(f *testing.F) {
	fuzzAct(f, func(b []byte) error { _, err := engagement.ParseReview(b); return err })
}

func FuzzParseResolution(f *testing.F) {
	fuzzAct(f, func(b []byte) error { _, err := engagement.ParseResolution(b); return err })
}

func FuzzParseProposalWithdrawal(f *testing.F) {
	fuzzAct(f, func(b []byte) error { _, err := engagement.ParseProposalWithdrawal(b); return err })
}

func FuzzParseRequestWithdrawal(f *testing.F) {
	fuzzAct(f, func(b []byte) error { _, err := engagement.ParseRequestWithdrawal(b); return err })
}
