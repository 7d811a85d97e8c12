package sow_test

import (
	"testing"

	"agentmesh.dev/mesh/shared/sow"
)

// The maximal fit, checked against brute force: the largest total whose
// sum with its own floored fee fits, for every small cap and percentage.
func TestMaxRatedTotalIsTheMaximalFit(t *testing.T) {
	for pct := int64(0); pct <= 150; pct++ {
		b := sow.PercentBasis(pct)
		for capLeft := int64(0); capLeft <= 400; capLeft++ {
			want := int64(0)
			for total := int64(0); total <= capLeft; total++ {
				if total+total*pct/100 <= capLeft {
					want = total
				}
			}
			if got := sow.MaxRatedTotal(capLeft, &b); got != want {
				t.Fatalf("cap %d at %d%%: %d, want %d", capLeft, pct, got, want)
			}
		}
	}
	for _, c := range [][3]int64{{100, 9, 91}, {5, 9, 0}, {9, 9, 0}, {10, 9, 1}} {
		b := sow.FixedBasis(c[1])
		if got := sow.MaxRatedTotal(c[0], &b); got != c[2] {
			t.Errorf("cap %d, fixed %d: %d, want %d", c[0], c[1], got, c[2])
		}
	}
	if got := sow.MaxRatedTotal(77, nil); got != 77 {
		t.Errorf("no operator: %d", got)
	}
}

// Rating bills lines in order until the client's exposure is spent, the
// fee inside it, and never bills past the cap however the batch is split.
func TestRateNeverPassesTheCap(t *testing.T) {
	p := sow.Price{Arrangement: sow.TimeAndMaterials, Currency: "XCR", Cap: 1000, ReservationDays: 7, Grade: sow.Enforced,
		Schedule: []sow.ScheduleLine{{Meter: "a", Unit: "u", PerUnit: 7}, {Meter: "b", Unit: "u", Per: 3, PerUnit: 10}}}
	b := sow.PercentBasis(10)
	var billed int64
	for i := 0; i < 40; i++ {
		r, err := sow.Rate(p, []sow.Count{{Meter: "a", Count: 5}, {Meter: "b", Count: 7}}, sow.RateOptions{AlreadyBilled: billed, FeeBasis: &b})
		if err != nil {
			t.Fatal(err)
		}
		billed += r.ClientTotal
		if billed > p.Cap || r.CapRemaining != p.Cap-billed {
			t.Fatalf("batch %d: billed %d of a %d cap, remaining %d", i, billed, p.Cap, r.CapRemaining)
		}
		if r.Exhausted {
			if sow.MaxRatedTotal(r.CapRemaining, &b) != 0 {
				t.Fatal("exhausted while work still fits")
			}
			return
		}
	}
	t.Fatal("never exhausted")
}

func TestDurationMillis(t *testing.T) {
	for s, want := range map[string]int64{"P1W": 604_800_000, "PT1M": 60_000, "P1DT1H1M1S": 90_061_000, "PT999999S": 999_999_000} {
		if got, err := sow.DurationMillis(s); err != nil || got != want {
			t.Errorf("%s: %d %v, want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"P1H", "PT1D", "PT1H1H", "P1D1D", "P01", "PW", "P1WT", "P 1D"} {
		if _, err := sow.DurationMillis(s); err == nil {
			t.Errorf("%q accepted", s)
		}
	}
}
