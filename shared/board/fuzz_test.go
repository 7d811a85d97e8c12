package board

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/rooms"
)

var verbs = []string{VerbPost, VerbList, VerbClaim, VerbComplete, VerbAbandon, VerbWithdraw}

// The board's payload decoder takes any bytes a caller sends: it never
// panics, refuses with INPUT_INVALID only, and what it accepts keeps every
// rule (an item id safe in a key, texts within their limits, a lease of at
// least a minute). The descriptor it passes on goes to rooms.ParseDescriptor,
// which must refuse with a protocol error too.
func FuzzDecodeRequest(f *testing.F) {
	id := "01a21047-7c3e-732b-bbd8-39f9014add74"
	for _, seed := range []string{
		`{"descriptor":{"rooms":"v1"},"title":"fix the build","detail":"CI is red","offering":"build","lease_ms":3600000}`,
		`{"descriptor":"eyJyb29tcyI6InYxIn0","item_id":"` + id + `","lease_ms":60000}`,
		`{"item_id":"` + id + `","note":"done","artifacts":["sha256:00"]}`,
		`{"after":"` + id + `"}`,
		`{"title":7}`, `{"lease_ms":1e9}`, `{"lease_ms":"x"}`, `{"artifacts":[1]}`, `[]`, `null`, `"s"`, `{`, ``,
	} {
		for i := range verbs {
			f.Add(uint8(i), []byte(seed))
		}
	}
	f.Fuzz(func(t *testing.T, v uint8, payload []byte) {
		verb := verbs[int(v)%len(verbs)]
		r, err := decodeRequest(verb, payload)
		if err != nil {
			if e, ok := err.(*errs.Error); !ok || e.Code != errs.InputInvalid || e.Message == "" {
				t.Fatalf("%s refused %q with %v", verb, payload, err)
			}
			return
		}
		switch verb {
		case VerbPost:
			if strings.TrimSpace(r.Title) == "" || utf8.RuneCountInString(r.Title) > MaxTitle || utf8.RuneCountInString(r.Detail) > MaxDetail {
				t.Fatalf("post accepted %+v", r)
			}
		case VerbClaim, VerbComplete, VerbAbandon, VerbWithdraw:
			if !itemID.MatchString(r.ItemID) || strings.ContainsAny(r.ItemID, ".*> ") {
				t.Fatalf("%s accepted item id %q", verb, r.ItemID)
			}
		}
		if r.LeaseMS != 0 && r.LeaseMS < MinLease.Milliseconds() {
			t.Fatalf("%s accepted lease %d", verb, r.LeaseMS)
		}
		if utf8.RuneCountInString(r.Note) > MaxNote || len(r.Artifacts) > MaxArtifacts {
			t.Fatalf("%s accepted %+v", verb, r)
		}
		if r.After != "" && !itemID.MatchString(r.After) {
			t.Fatalf("list accepted after %q", r.After)
		}
		if _, err := rooms.ParseDescriptor(r.Descriptor); err != nil {
			if e, ok := err.(*errs.Error); !ok || e.Message == "" {
				t.Fatalf("descriptor %s refused with %v", r.Descriptor, err)
			}
		}
		// What was accepted encodes again (the worker stores and answers it).
		if _, err := json.Marshal(r); err != nil {
			t.Fatal(err)
		}
	})
}
