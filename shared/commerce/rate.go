package commerce

import (
	"fmt"
	"math/bits"
	"time"

	"agentmesh.dev/mesh/shared/jsonv"
	"agentmesh.dev/mesh/shared/metering"
)

// RateOptions qualify one rating.
type RateOptions struct {
	// Agreed is whether an agreement to the SKU's digest current at the
	// events covered the consumer. Without one the events rate to zero: a
	// recorded fact, never a retroactive bill (admission should have
	// refused; rating is the second wall).
	Agreed bool
	// CeilingMicro, when set, is the request's budget ceiling: the charge
	// never exceeds it, and the excess is the responder's own account.
	CeilingMicro *int64
}

// Rate is the charge, in micro-units of p.Currency, for the events of one
// aggregation window (one consumer owner, one UTC period of the price).
// Deterministic and integer-only: refused events rate to zero and events
// on other meters are not this price's; the window's quantity has the
// included allowance deducted first; per_unit charges floor(q * amount /
// per); package charges ceil(q / size) * amount (the one place rounding
// favours the seller, which is what buying by the package means); tiered
// rates each band's own span, flooring per band (graduated, never volume);
// flat charges amount per request. The result is clamped to the ceiling.
// An error means the arithmetic left the exactly representable range.
func Rate(p Price, events []metering.Event, o RateOptions) (int64, error) {
	if !o.Agreed || !p.Paid() {
		return 0, nil
	}
	meter := p.RatedMeter()
	var q int64
	for _, e := range events {
		if e.Refused || e.Meter != meter {
			continue
		}
		if q += e.Quantity; q > jsonv.MaxSafeInteger || e.Quantity < 0 {
			return 0, fmt.Errorf("rate %s: quantity out of range", meter)
		}
	}
	if p.Included != nil {
		q = max(0, q-p.Included.Quantity)
	}
	var charge int64
	var err error
	switch p.Model {
	case ModelFlat:
		charge, err = mulDiv(q, p.AmountMicro, 1)
	case ModelPerUnit:
		charge, err = mulDiv(q, p.AmountMicro, p.Divisor())
	case ModelPackage:
		charge, err = mulDiv((q+p.Size-1)/p.Size, p.AmountMicro, 1)
	case ModelTiered:
		var lower int64
		for _, t := range p.Tiers {
			upper := q
			if t.UpTo != 0 {
				upper = min(q, t.UpTo)
			}
			if upper <= lower {
				break
			}
			band, berr := mulDiv(upper-lower, t.AmountMicro, p.Divisor())
			if berr != nil {
				return 0, berr
			}
			if charge += band; charge > jsonv.MaxSafeInteger {
				return 0, fmt.Errorf("rate %s: charge out of range", meter)
			}
			lower = upper
		}
	default:
		return 0, fmt.Errorf("rate: unknown price model %q", p.Model)
	}
	if err != nil {
		return 0, err
	}
	if o.CeilingMicro != nil && charge > *o.CeilingMicro {
		charge = max(0, *o.CeilingMicro)
	}
	return charge, nil
}

// mulDiv is floor(a * b / c) for non-negative a, b and positive c, in
// 128-bit intermediate arithmetic, refused beyond 2^53 - 1.
func mulDiv(a, b, c int64) (int64, error) {
	if a < 0 || b < 0 || c <= 0 {
		return 0, fmt.Errorf("rate: operands out of range")
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return 0, fmt.Errorf("rate: charge out of range")
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	if q > jsonv.MaxSafeInteger {
		return 0, fmt.Errorf("rate: charge out of range")
	}
	return int64(q), nil
}

// PeriodKey names the UTC calendar period of t ("2026-08-02" for a day,
// "2026-08" for a month): usage aggregates per consumer owner per period.
func PeriodKey(period string, t time.Time) string {
	if period == PeriodMonth {
		return t.UTC().Format("2006-01")
	}
	return t.UTC().Format(time.DateOnly)
}
