package agreements_test

import (
	"testing"

	"agentmesh.dev/mesh/shared/agreements"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
)

const fuzzKey = "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NFCNQO"

// refusedAs fails unless err is a protocol error with code and a message.
func refusedAs(t *testing.T, what string, data []byte, err error, code errs.Code) {
	t.Helper()
	if e, ok := err.(*errs.Error); !ok || e.Code != code || e.Message == "" {
		t.Fatalf("%s refused %q with %v, want %s", what, data, err, code)
	}
}

// The admit question comes from any node: the decoder never panics,
// refuses with INVALID_REQUEST only, and what it accepts keeps its rules.
func FuzzDecodeAdmit(f *testing.F) {
	for _, seed := range []string{
		`{"requester":"` + fuzzKey + `","offering":"paid","request_id":"01a21047-7c3e-732b-bbd8-39f9014add74"}`,
		`{"requester":"` + fuzzKey + `","offering":"paid","request_id":"r","budget":{"revision":1,"cost_ceiling":{"amount_micro":5,"currency":"XCR"}}}`,
		`{"requester":"` + fuzzKey + `","offering":"paid","request_id":"r","budget":{"revision":-1}}`,
		`{"requester":7}`, `{"offering":""}`, `[]`, `null`, `"s"`, `{`, ``, `{"requester":"` + fuzzKey + `","x":1}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		q, err := agreements.DecodeAdmit(data)
		if err != nil {
			refusedAs(t, "DecodeAdmit", data, err, errs.InvalidRequest)
			return
		}
		if !keys.IsUserPublicKey(q.Requester) || q.Offering == "" || len(q.Offering) > 256 || q.RequestID == "" || len(q.RequestID) > 256 {
			t.Fatalf("accepted %q as %+v", data, q)
		}
	})
}

// The list question likewise.
func FuzzDecodeList(f *testing.F) {
	for _, seed := range []string{`{}`, `{"consumer_owner":"` + fuzzKey + `"}`, `{"seller_agent":"` + fuzzKey + `"}`,
		`{"seller_agent":""}`, `{"x":1}`, `[]`, `null`, ``, `{`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		q, err := agreements.DecodeList(data)
		if err != nil {
			refusedAs(t, "DecodeList", data, err, errs.InvalidRequest)
			return
		}
		for _, k := range []string{q.ConsumerOwner, q.SellerAgent} {
			if k != "" && !keys.IsUserPublicKey(k) {
				t.Fatalf("accepted %q as %+v", data, q)
			}
		}
	})
}

// A revocation is signed by an owner and filed by anyone: parsing never
// panics and refuses with INVALID_ENVELOPE only; verification of what it
// accepts refuses with IDENTITY_MISMATCH only (the seeds' signatures are
// not the owner's).
func FuzzParseRevocation(f *testing.F) {
	for _, seed := range []string{
		`{"v":1,"consumer_owner":"` + fuzzKey + `","seller_agent":"` + fuzzKey + `","sku":"paid-flat","agreed_at":"2026-11-25T03:00:00Z","revoked_at":"2026-11-25T04:00:00Z","sig":"AAAA"}`,
		`{"v":2,"consumer_owner":"` + fuzzKey + `"}`, `{"v":1,"sig":""}`, `{"v":1.5}`, `[]`, `null`, ``, `{`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := agreements.ParseRevocation(data)
		if err != nil {
			refusedAs(t, "ParseRevocation", data, err, errs.InvalidEnvelope)
			return
		}
		if err := r.Verify(); err != nil {
			refusedAs(t, "Verify", data, err, errs.IdentityMismatch)
		}
	})
}
