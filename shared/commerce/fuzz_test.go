package commerce_test

import (
	"testing"

	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// FuzzParseSKU: no input panics; a refusal is INVALID_MANIFEST; an
// accepted SKU re-reads from its canonical bytes with the same id and
// digest, and rates any window without panicking.
func FuzzParseSKU(f *testing.F) {
	f.Add([]byte(meteredSKU))
	f.Add([]byte(`{"sku":"t","covers":{"agent":true},"price":{"model":"tiered","currency":"USD","meter":"t","per":1000,"period":"month",
	 "tiers":[{"up_to":100000,"amount_micro":2000},{"up_to":1000000,"amount_micro":1500},{"amount_micro":1000}]},"provider":{"id":"internal"}}`))
	f.Add([]byte(`{"sku":"p","covers":{"offerings":["a"]},"price":{"model":"package","currency":"XCR","meter":"requests","size":100,"amount_micro":250000,"period":"day"},"provider":{"id":"ext","checkout_url":"https://pay.example/p"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := commerce.ParseSKU(data)
		if err != nil {
			if c := errs.CodeOf(err); c != errs.InvalidManifest {
				t.Fatalf("refused with %s: %v", c, err)
			}
			return
		}
		c, err := protocol.Canonical(s.Value())
		if err != nil {
			t.Fatal(err)
		}
		again, err := commerce.ParseSKU(c)
		if err != nil || again.ID != s.ID || again.Digest() != s.Digest() {
			t.Fatalf("re-read %+v %v", again, err)
		}
		if _, err := commerce.Rate(s.Price, nil, commerce.RateOptions{Agreed: true}); err != nil {
			t.Fatalf("rating nothing: %v", err)
		}
	})
}

// FuzzParseAgreement: no input panics; shape faults are INVALID_ENVELOPE;
// an accepted agreement re-reads from its canonical bytes unchanged, and
// verification fails closed with IDENTITY_MISMATCH, never a panic.
func FuzzParseAgreement(f *testing.F) {
	f.Add([]byte(`{"v":1,"consumer_owner":"UBMBH4BK6EIHQFVMHLSABFSQXB3JXUFZOXVZQTIERO33AD4HHAI3D7QP","seller_agent":"UAKQRYZBYFOC65OQZVJ3QPCIERDTRNNZPMOJUYXC3DGPRCDWSKD4HV5A",
	 "sku":"caselaw-metered","sku_digest":"LQGAJJ9tQ7U185dmHGSztJzvPN55p_V_j-XcauUNDKk","agreed_at":"2026-08-02T15:00:00Z",
	 "evidence":{"provider":"internal","ref":"console-approval-8f3d"},"sig":"jm0sARWINIux_frCmtkVMGvfs9Plj-MBNJFNt-WzSHQC8B9N51sfufZhui-K9rbICdoxZ-iSk9_rQXe41IX_BA"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := commerce.ParseAgreement(data)
		if err != nil {
			if c := errs.CodeOf(err); c != errs.InvalidEnvelope {
				t.Fatalf("refused with %s: %v", c, err)
			}
			return
		}
		c, err := protocol.Canonical(a)
		if err != nil {
			t.Fatal(err)
		}
		again, err := commerce.ParseAgreement(c)
		if err != nil || again.Sig != a.Sig || again.SKUDigest != a.SKUDigest {
			t.Fatalf("re-read %+v %v", again, err)
		}
		if err := a.Verify(); err != nil && errs.CodeOf(err) != errs.IdentityMismatch {
			t.Fatalf("verify failed with %v", err)
		}
	})
}
