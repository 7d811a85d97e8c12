package metering_test

import (
	"testing"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/metering"
	"agentmesh.dev/mesh/shared/protocol"
)

// FuzzReceiptAndEvent: the receipt (payload.usage) and event readers never
// panic and refuse only with INVALID_ENVELOPE; an accepted receipt has
// distinct declared meters with non-negative quantities, and an accepted
// event round-trips through its canonical form.
func FuzzReceiptAndEvent(f *testing.F) {
	f.Add([]byte(`[{"meter":"tokens_out","quantity":4210},{"meter":"tool_calls","quantity":3}]`))
	f.Add([]byte(event(`,"meter":"requests","class":"observed","quantity":0,"refused":true,"refusal_code":"AGREEMENT_REQUIRED"`)))
	f.Add([]byte(`[{"meter":"requests","quantity":1}]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := protocol.ParseJSON(data)
		if err != nil {
			return
		}
		if usage, err := metering.UsageFromValue(v); err != nil {
			if errs.CodeOf(err) != errs.InvalidEnvelope {
				t.Fatalf("receipt refused with %v", err)
			}
		} else {
			seen := map[string]bool{}
			for _, u := range usage {
				if seen[u.Meter] || u.Quantity < 0 || metering.IsObserved(u.Meter) || !metering.ValidName(u.Meter) {
					t.Fatalf("accepted receipt %v", usage)
				}
				seen[u.Meter] = true
			}
		}
		e, err := metering.EventFromValue(v)
		if err != nil {
			if errs.CodeOf(err) != errs.InvalidEnvelope {
				t.Fatalf("event refused with %v", err)
			}
			return
		}
		b, err := protocol.Canonical(e)
		if err != nil {
			t.Fatal(err)
		}
		again, err := metering.ParseEvent(b)
		if err != nil || again != e {
			t.Fatalf("event re-read %+v %v", again, err)
		}
	})
}
