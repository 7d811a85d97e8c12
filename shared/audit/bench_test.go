package audit_test

import (
	"fmt"
	"testing"

	"agentmesh.dev/mesh/shared/audit"
	"agentmesh.dev/mesh/shared/audit/audittest"
	"agentmesh.dev/mesh/shared/bus/bustest"
)

// BenchmarkAppend is one writer appending to one chain on the embedded
// broker: a head read and a compare-and-set publish per row.
func BenchmarkAppend(b *testing.B) {
	bus := bustest.Start(b)
	c := openChains(b, bus, "bench", nil)
	agent := bustest.Agent(b).Public()
	for i := 0; b.Loop(); i++ {
		if _, _, err := c.Append(b.Context(), entry(agent, fmt.Sprint(i))); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVerifyBundle checks the fixture's bundle (11 rows, 2 anchors,
// 4 tokens, 4 proofs).
func BenchmarkVerifyBundle(b *testing.B) {
	f := audittest.NewFixture(b)
	for b.Loop() {
		if _, err := audit.Check(f.Bundle, f.Trust); err != nil {
			b.Fatal(err)
		}
	}
}
