package commerce

import (
	"fmt"
	"math/bits"

	"agentmesh.dev/mesh/shared/jsonv"
)

// MaxMarkupPct bounds the platform markup of the resale path
// (CREDITS_PLATFORM_MARKUP_PCT): a whole percentage from 0 to 100. meshd,
// the workers and the cloud refuse any other value at startup.
const MaxMarkupPct = 100

// CheckMarkup is nil for a markup in 0..MaxMarkupPct, else the one line to
// show at startup.
func CheckMarkup(pct int) error {
	if pct < 0 || pct > MaxMarkupPct {
		return fmt.Errorf("the platform markup (CREDITS_PLATFORM_MARKUP_PCT) is a whole percentage from 0 to %d, not %d", MaxMarkupPct, pct)
	}
	return nil
}

// Split is who pays and who receives for one rated charge (spec §8).
type Split struct {
	// Rate is the seller's rate: what the seller's owner receives.
	Rate int64 `json:"rate_micro"`
	// Retail is what the buyer owes: the rate, plus the markup on the
	// resale path.
	Retail int64 `json:"retail_micro"`
	// Markup is the platform's part of Retail (0 off the resale path).
	Markup int64 `json:"markup_micro"`
}

// SplitOf is the split of rate: on an agent's own SKU (resale false) the
// buyer pays the declared price and the seller's owner receives all of it;
// on the resale path (the seller is an official catalog agent, the platform
// the seller of record) the buyer pays retail = rate + floor(rate ×
// markupPct / 100), the seller's owner receives the full rate and the
// platform keeps the markup. Integer-only; an error means the result left
// the exactly representable range.
func SplitOf(rate int64, markupPct int, resale bool) (Split, error) {
	if rate < 0 || rate > jsonv.MaxSafeInteger || markupPct < 0 || markupPct > MaxMarkupPct {
		return Split{}, fmt.Errorf("split: operands out of range")
	}
	s := Split{Rate: rate, Retail: rate}
	if !resale || markupPct == 0 {
		return s, nil
	}
	hi, lo := bits.Mul64(uint64(rate), uint64(markupPct))
	if hi >= 100 {
		return Split{}, fmt.Errorf("split: markup out of range")
	}
	m, _ := bits.Div64(hi, lo, 100)
	if m > jsonv.MaxSafeInteger || rate+int64(m) > jsonv.MaxSafeInteger {
		return Split{}, fmt.Errorf("split: retail out of range")
	}
	s.Markup = int64(m)
	s.Retail = rate + s.Markup
	return s, nil
}

// Apportion divides what was actually taken from the buyer (charged, at
// most s.Retail) between the seller's owner and the platform: the seller's
// owner is paid first, up to the full rate, and the platform keeps the
// rest. When the buyer's balance could not pay everything, the shortfall
// is recorded as unpaid and no balance goes below zero: credits are never
// made by a settlement, only moved (grants are the one source).
func (s Split) Apportion(charged int64) (toSeller, toPlatform, unpaid int64) {
	charged = max(0, min(charged, s.Retail))
	toSeller = min(charged, s.Rate)
	return toSeller, charged - toSeller, s.Retail - charged
}
