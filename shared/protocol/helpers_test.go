package protocol_test

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// update rewrites golden files: go test ./shared/protocol -run Golden -update
var update = flag.Bool("update", false, "rewrite golden files in testdata/")

// publishedSeed is the upstream fixtures' published test seed (not a real
// identity); using it makes our golden signatures comparable with theirs.
const publishedSeed = "SUAEGDPNTWXACIF45CA23BUY36RIMWZXW5LEHSEOK2ONS5JWJ7PBC2EWBA"

func seedKey(t testing.TB) *keys.Agent {
	t.Helper()
	k, err := keys.FromSeed[keys.AgentRole]([]byte(publishedSeed))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func freshKey(t testing.TB) *keys.Agent {
	t.Helper()
	k, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// fixedEnvelope is a deterministic ~600-byte request: fixed id, time and
// trace, so its canonical bytes and signature are stable.
func fixedEnvelope(t testing.TB, from, to string) *protocol.Envelope {
	t.Helper()
	parent := "00f067aa0ba902b7"
	e := &protocol.Envelope{
		V: protocol.Version, ID: "019894f0-0000-7000-8000-0000000000aa", Type: protocol.TypeRequest,
		TS: "2026-07-26T12:00:00.000Z", From: from, To: to,
		Trace: protocol.Trace{TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", SpanID: "b7d9b7d9b7d9b7d9", ParentSpanID: &parent},
		Budget: &protocol.Budget{Deadline: "2026-07-26T13:00:00Z", Revision: 0,
			CostCeiling: &protocol.Money{AmountMicro: 2_000_000, Currency: "USD"}},
	}
	err := e.SetPayload(map[string]any{
		"offering": "caselaw-summary",
		"input": map[string]any{
			"text": "Summarise the controlling case law on anticipatory repudiation.",
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden %s (run with -update to create): %v", path, err)
	}
	if string(got) != string(want) {
		t.Errorf("%s differs from golden:\n got  %s\n want %s", name, got, want)
	}
}

func at(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t
}
