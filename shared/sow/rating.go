package sow

import (
	"math/big"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/jsonv"
	"agentmesh.dev/mesh/shared/metering"
)

// Money is computed one way throughout: by flooring, in integers wide
// enough that no product overflows (§5.5.2, §5.5.8).

// Count is a raw meter count in the meter's own grain; the schedule's per
// does the conversion, so the buyer hands in the count it reads off its own
// records.
type Count struct {
	Meter string `json:"meter"`
	Count int64  `json:"count"`
}

// SettlementLine is one line of a settlement record: everything the amount
// was computed from (the raw count, the divisor actually applied, written
// even when 1, and the unit price), so a buyer recomputes it without
// holding the engagement.
type SettlementLine struct {
	Meter           string `json:"meter"`
	Unit            string `json:"unit"`
	Count           int64  `json:"count"`
	Per             int64  `json:"per"`
	PerUnit         int64  `json:"per_unit"`
	Amount          int64  `json:"amount"`
	PassThrough     bool   `json:"pass_through,omitempty"`
	UpstreamReceipt string `json:"upstream_receipt,omitempty"`
	UpstreamAmount  *int64 `json:"upstream_amount,omitempty"`
}

// Rating is what rating one batch of counts produced.
type Rating struct {
	Lines []SettlementLine `json:"lines"`
	// Total is the provider's rated total, clamped so that it plus the
	// operator fee on it never exceeds the cap.
	Total int64 `json:"total"`
	// OperatorFee is the fee taken on Total; nil when no basis applies or
	// nothing was rated (a fee is a cut of what the client pays).
	OperatorFee *OperatorFee `json:"operator_fee,omitempty"`
	// ClientTotal is what the client pays: Total plus the fee.
	ClientTotal int64 `json:"client_total"`
	// CapRemaining is the client's remaining exposure: the cap less all it
	// has been billed, fees included.
	CapRemaining int64 `json:"cap_remaining"`
	// Exhausted: no further rated work fits under what remains once the
	// fee on it is counted (§5.5.5). Not a failure.
	Exhausted bool `json:"exhausted"`
	// Unbilled is what the schedule would have charged past the cap: the
	// provider's to bear (§5.5.3).
	Unbilled int64 `json:"unbilled"`
}

// RateOptions qualify one rating.
type RateOptions struct {
	// AlreadyBilled is what the client has been billed under this
	// engagement so far, operator fees included: the cap bounds the
	// engagement, not one batch.
	AlreadyBilled int64
	// Receipts maps a pass-through meter to the upstream receipt that
	// evidences its cost; a pass-through line without one is refused.
	Receipts map[string]string
	// FeeBasis is the operator's cut on this rating, nil when no operator
	// stands in the money path; Operator names who takes it.
	FeeBasis *FeeBasis
	Operator string
}

func mulDiv(a, b, c int64) (int64, error) {
	r := new(big.Int).Mul(big.NewInt(a), big.NewInt(b))
	r.Quo(r, big.NewInt(c))
	if !r.IsInt64() || r.Int64() > jsonv.MaxSafeInteger {
		return 0, invalid("an amount overflows an exact integer; split the settlement")
	}
	return r.Int64(), nil
}

// RateLine is what a line charges for a raw count: floor(count * per_unit /
// per). The floor favours the buyer: a partial unit never charges a partial
// unit's money.
func RateLine(l ScheduleLine, count int64) (int64, error) {
	if count < 0 {
		return 0, invalid("the count for %q must be a non-negative integer", l.Meter)
	}
	return mulDiv(count, l.PerUnit, l.Divisor())
}

// Rate rates raw counts against a time_and_materials schedule (§5.5.2,
// §5.5.3, §5.5.5, §5.5.8): a meter the schedule does not price is refused,
// never billed or dropped; a no_charge clause is refused outright (nothing
// is rated under it, not even to zero); lines are billed in the order given
// until the client's remaining exposure, less the fee the rated total
// carries, is spent (the maximal fit); the rest is unbilled.
func Rate(p Price, usage []Count, o RateOptions) (Rating, error) {
	if p.Arrangement == NoCharge {
		return Rating{}, invalid("this engagement is priced no_charge, so no runtime may rate work under it and there is no settlement record to hold (§5.5.7)")
	}
	if p.Arrangement != TimeAndMaterials {
		return Rating{}, invalid("rating counts needs a time_and_materials clause (§5.5.2)")
	}
	if o.AlreadyBilled < 0 {
		return Rating{}, invalid("already billed is a non-negative integer")
	}
	if o.FeeBasis != nil {
		if err := o.FeeBasis.validate(); err != nil {
			return Rating{}, err
		}
	}
	exposure := max(0, p.Cap-o.AlreadyBilled)
	budget := MaxRatedTotal(exposure, o.FeeBasis)
	r := Rating{Lines: []SettlementLine{}}
	for _, u := range usage {
		var line *ScheduleLine
		for i := range p.Schedule {
			if p.Schedule[i].Meter == u.Meter {
				line = &p.Schedule[i]
			}
		}
		if line == nil {
			return Rating{}, invalid("no runtime may bill %q: the schedule does not price it (§5.5.2)", u.Meter)
		}
		gross, err := RateLine(*line, u.Count)
		if err != nil {
			return Rating{}, err
		}
		billed := min(gross, budget)
		budget -= billed
		r.Total += billed
		r.Unbilled += gross - billed
		sl := SettlementLine{Meter: line.Meter, Unit: line.Unit, Count: u.Count, Per: line.Divisor(), PerUnit: line.PerUnit, Amount: billed}
		if line.PassThrough {
			sl.PassThrough = true
			sl.UpstreamReceipt = o.Receipts[line.Meter]
		}
		if err := sl.validate(); err != nil {
			return Rating{}, err
		}
		r.Lines = append(r.Lines, sl)
	}
	if o.FeeBasis != nil && r.Total > 0 {
		amount, err := FeeAmount(*o.FeeBasis, r.Total)
		if err != nil {
			return Rating{}, err
		}
		r.OperatorFee = &OperatorFee{Operator: o.Operator, Basis: *o.FeeBasis, Base: r.Total, Amount: amount}
	}
	r.ClientTotal = r.Total
	if r.OperatorFee != nil {
		r.ClientTotal += r.OperatorFee.Amount
	}
	r.CapRemaining = exposure - r.ClientTotal
	r.Exhausted = MaxRatedTotal(r.CapRemaining, o.FeeBasis) == 0
	return r, nil
}

var lineMembers = []string{"meter", "unit", "count", "per", "per_unit", "amount", "pass_through", "upstream_receipt", "upstream_amount"}

// SettlementLineFromValue shape-checks one settlement line (§5.5.2,
// §5.5.6): the divisor written out, a pass-through line referencing its
// upstream receipt and priced no higher than upstream_amount when that is
// stated, and no receipt on a line the provider performed itself (it would
// claim a cost basis the line does not have).
func SettlementLineFromValue(v any) (SettlementLine, error) {
	m, err := object(v, "a settlement line is an object (§5.5.2)")
	if err != nil {
		return SettlementLine{}, err
	}
	if err := unknown(m, "a settlement line", lineMembers...); err != nil {
		return SettlementLine{}, err
	}
	var l SettlementLine
	var ok bool
	if l.Meter, _ = m["meter"].(string); !metering.ValidName(l.Meter) {
		return SettlementLine{}, invalid("a settlement line names its meter")
	}
	if l.Unit, ok = jsonv.Text(m["unit"], 64); !ok {
		return SettlementLine{}, invalid("a settlement line carries the unit label")
	}
	if l.Count, ok = jsonv.NonNegInt(m["count"]); !ok {
		return SettlementLine{}, invalid("a settlement line's count is a non-negative integer")
	}
	if l.Per, ok = jsonv.PosInt(m["per"]); !ok {
		return SettlementLine{}, invalid("a settlement line carries the divisor actually applied, written out even when it is 1, so a buyer recomputes the amount from its own counts (§5.5.2)")
	}
	if l.PerUnit, ok = jsonv.NonNegInt(m["per_unit"]); !ok {
		return SettlementLine{}, invalid("a settlement line's per_unit is a non-negative integer")
	}
	if l.Amount, ok = jsonv.NonNegInt(m["amount"]); !ok {
		return SettlementLine{}, invalid("a settlement line's amount is a non-negative integer")
	}
	if raw, present := m["pass_through"]; present {
		if raw != true {
			return SettlementLine{}, invalid("pass_through, when present, is the literal true (§5.5.6)")
		}
		l.PassThrough = true
	}
	if raw, present := m["upstream_receipt"]; present {
		if l.UpstreamReceipt, _ = raw.(string); l.UpstreamReceipt == "" {
			return SettlementLine{}, invalid("upstream_receipt is a non-empty receipt reference (§5.5.6)")
		}
	}
	if raw, present := m["upstream_amount"]; present {
		n, ok := jsonv.NonNegInt(raw)
		if !ok {
			return SettlementLine{}, invalid("upstream_amount is a non-negative integer (§5.5.6)")
		}
		l.UpstreamAmount = &n
	}
	return l, l.validate()
}

// validate applies the §5.5.6 rules to a line built or parsed.
func (l SettlementLine) validate() error {
	if !l.PassThrough {
		if l.UpstreamReceipt != "" || l.UpstreamAmount != nil {
			return invalid("an upstream receipt belongs to a pass_through line: on work the provider performed itself it claims a cost basis the line does not have (§5.5.6)")
		}
		return nil
	}
	if l.UpstreamReceipt == "" {
		return invalid("a pass-through settlement line references the upstream receipt that evidences the cost: at cost, with proof (§5.5.6)")
	}
	if l.UpstreamAmount != nil && l.Amount > *l.UpstreamAmount {
		return invalid("a pass-through line is never priced above the upstream cost; a provider wanting a margin prices its own metered line (§5.5.6)")
	}
	return nil
}

// AdmitSettlement is the client node's refusal of a settlement record that
// cites an engagement priced p: under no_charge every record is refused,
// a total of zero included, because that is the record §5.5.7 keeps out of
// the books.
func AdmitSettlement(p Price) error {
	if p.Arrangement == NoCharge {
		return errs.New(errs.Forbidden, "this engagement is priced no_charge, so nothing is settled under it and a settlement record citing it is refused (§5.5.7)")
	}
	return nil
}
