package commerce

import (
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/jsonv"
	"agentmesh.dev/mesh/shared/metering"
	"agentmesh.dev/mesh/shared/protocol"
)

// Price models: a closed five (§19.1).
const (
	ModelFree    = "free"
	ModelFlat    = "flat"
	ModelPerUnit = "per_unit"
	ModelPackage = "package"
	ModelTiered  = "tiered"
)

// Aggregation periods: UTC calendar days and months.
const (
	PeriodDay   = "day"
	PeriodMonth = "month"
)

// modelMembers are the members each model names. Anything else on a price
// refuses it: a price that says more than its model does is malformed, not
// generous.
var modelMembers = map[string][]string{
	ModelFree:    {"model"},
	ModelFlat:    {"model", "currency", "amount_micro"},
	ModelPerUnit: {"model", "currency", "meter", "per", "amount_micro", "included"},
	ModelPackage: {"model", "currency", "meter", "size", "amount_micro", "period", "included"},
	ModelTiered:  {"model", "currency", "meter", "per", "period", "tiers", "included"},
}

// Price is one SKU's price. Money is integer micro-units of Currency (ISO
// 4217 shape; private-use X codes such as XCR, credits, included).
type Price struct {
	Model       string
	Currency    string
	AmountMicro int64
	// Meter is the meter the price rates, as written; a flat price names
	// none and rates requests (RatedMeter).
	Meter string
	// Per is the divisor turning raw counts into priced units; 0 when the
	// price does not state it, which means 1 (Divisor).
	Per int64
	// Size is a package's size in units.
	Size int64
	// Period is the aggregation period of package and tiered prices.
	Period string
	// Tiers of a tiered price, graduated; the last has UpTo 0 (unbounded).
	Tiers []Tier
	// Included is a free allowance deducted before rating.
	Included *Included
}

// Tier is one band of a tiered price: units up to UpTo (cumulative, 0 on
// the last band meaning unbounded) at AmountMicro per Per units.
type Tier struct {
	UpTo        int64
	AmountMicro int64
}

// Included is an allowance of Quantity units per Period, free.
type Included struct {
	Quantity int64
	Period   string
}

// Paid reports whether the price charges anything at all. A free SKU still
// states terms, but no agreement is required to use it.
func (p Price) Paid() bool { return p.Model != ModelFree }

// RatedMeter is the meter the price rates: a flat price rates requests by
// definition.
func (p Price) RatedMeter() string {
	if p.Model == ModelFlat {
		return metering.Requests
	}
	return p.Meter
}

// Divisor is Per, or 1 when the price states none.
func (p Price) Divisor() int64 {
	if p.Per == 0 {
		return 1
	}
	return p.Per
}

func priceErr(format string, args ...any) *errs.Error {
	return errs.Newf(errs.InvalidManifest, "SKU price: "+format, args...)
}

func validPeriod(v any) (string, bool) {
	s, _ := v.(string)
	return s, s == PeriodDay || s == PeriodMonth
}

// PriceFromValue shape-checks a decoded price (§19.1), refusing as
// INVALID_MANIFEST: a model outside the closed five; any member its model
// does not name (so a free price names no money, and a flat price names no
// meter); a currency that is not three capital letters; an amount_micro,
// size, per, tier or included quantity that is not an integer (no floats
// near money) or is negative, or a size or per of zero; a metered model
// without its meter; a package or tiered price without its period, or an
// allowance without one (an allowance without a period never resets); a
// tier list that is empty, whose up_to bounds do not strictly increase, or
// whose last tier is bounded (a price with a quantity ceiling is a refusal
// waiting to be discovered).
func PriceFromValue(v any) (Price, error) {
	m, ok := jsonv.Object(v)
	if !ok {
		return Price{}, priceErr("must be an object")
	}
	var p Price
	p.Model, _ = m["model"].(string)
	allowed, known := modelMembers[p.Model]
	if !known {
		return Price{}, priceErr("model is a closed five: free, flat, per_unit, package, tiered")
	}
	if k, bad := jsonv.Unknown(m, allowed...); bad {
		switch {
		case p.Model == ModelFree:
			return Price{}, priceErr("a free price names no money fields (found %q)", k)
		case p.Model == ModelFlat && k == "meter":
			return Price{}, priceErr("a flat price rates the requests meter by definition; naming a meter is a shape error")
		}
		return Price{}, priceErr("%q is not a member of the %s model", k, p.Model)
	}
	if p.Model == ModelFree {
		return p, nil
	}
	p.Currency, _ = m["currency"].(string)
	if !protocol.IsCurrency(p.Currency) {
		return Price{}, priceErr("currency must be an ISO 4217 code such as USD (private-use X codes such as XCR are legal)")
	}
	if p.Model != ModelTiered {
		if p.AmountMicro, ok = jsonv.NonNegInt(m["amount_micro"]); !ok {
			return Price{}, priceErr("amount_micro must be a non-negative integer of micro-units; no floats near money")
		}
	}
	if p.Model == ModelFlat {
		return p, nil
	}
	if p.Meter, _ = m["meter"].(string); !metering.ValidName(p.Meter) {
		return Price{}, priceErr("a %s price requires the meter it rates, matching %s", p.Model, metering.NamePattern)
	}
	if raw, present := m["per"]; present {
		if p.Per, ok = jsonv.PosInt(raw); !ok {
			return Price{}, priceErr("per must be a positive integer")
		}
	}
	if raw, present := m["included"]; present {
		inc, ok := jsonv.Object(raw)
		if !ok {
			return Price{}, priceErr("included must be an object {quantity, period}")
		}
		if k, bad := jsonv.Unknown(inc, "quantity", "period"); bad {
			return Price{}, priceErr("included has unknown member %q", k)
		}
		q, ok := jsonv.NonNegInt(inc["quantity"])
		if !ok {
			return Price{}, priceErr("included.quantity must be a non-negative integer")
		}
		per, ok := validPeriod(inc["period"])
		if !ok {
			return Price{}, priceErr("included requires a period, day or month: an allowance without a period never resets")
		}
		p.Included = &Included{Quantity: q, Period: per}
	}
	if p.Model == ModelPackage || p.Model == ModelTiered {
		if p.Period, ok = validPeriod(m["period"]); !ok {
			return Price{}, priceErr("a %s price aggregates over a period, day or month (UTC calendar)", p.Model)
		}
	}
	switch p.Model {
	case ModelPackage:
		if p.Size, ok = jsonv.PosInt(m["size"]); !ok {
			return Price{}, priceErr("a package price requires a positive integer size")
		}
	case ModelTiered:
		tiers, ok := jsonv.Array(m["tiers"])
		if !ok || len(tiers) == 0 {
			return Price{}, priceErr("a tiered price requires a non-empty tiers array")
		}
		var prev int64
		for i, raw := range tiers {
			t, ok := jsonv.Object(raw)
			if !ok {
				return Price{}, priceErr("tiers[%d] must be an object {up_to?, amount_micro}", i)
			}
			if k, bad := jsonv.Unknown(t, "up_to", "amount_micro"); bad {
				return Price{}, priceErr("tiers[%d] has unknown member %q", i, k)
			}
			var tier Tier
			if tier.AmountMicro, ok = jsonv.NonNegInt(t["amount_micro"]); !ok {
				return Price{}, priceErr("tiers[%d].amount_micro must be a non-negative integer", i)
			}
			up, bounded := t["up_to"]
			if i == len(tiers)-1 {
				if bounded {
					return Price{}, priceErr("the last tier must be unbounded: a price with a quantity ceiling is not a price, it is a refusal waiting to be discovered")
				}
			} else {
				if tier.UpTo, ok = jsonv.PosInt(up); !ok {
					return Price{}, priceErr("tiers[%d].up_to must be a positive integer", i)
				}
				if tier.UpTo <= prev {
					return Price{}, priceErr("tier up_to bounds must strictly increase")
				}
				prev = tier.UpTo
			}
			p.Tiers = append(p.Tiers, tier)
		}
	}
	return p, nil
}

// ParsePrice shape-checks a price given as JSON text.
func ParsePrice(data []byte) (Price, error) {
	v, err := protocol.ParseJSON(data)
	if err != nil {
		return Price{}, errs.Wrap(errs.InvalidManifest, "SKU price is not valid JSON", err)
	}
	return PriceFromValue(v)
}
