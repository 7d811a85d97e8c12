package sow

import (
	"fmt"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/jsonv"
	"agentmesh.dev/mesh/shared/protocol"
)

// Operator fee basis kinds (§5.5.8): a closed two.
const (
	FeeKindPercent = "percent"
	FeeKindFixed   = "fixed"
)

// FeeBasis is what an operator fee is computed from: a whole percentage of
// the base, or a fixed charge. Exactly the member its kind names is set.
type FeeBasis struct {
	Kind    string `json:"kind"`
	Percent *int64 `json:"percent,omitempty"`
	Fixed   *int64 `json:"fixed,omitempty"`
}

// PercentBasis and FixedBasis build the two kinds.
func PercentBasis(p int64) FeeBasis { return FeeBasis{Kind: FeeKindPercent, Percent: &p} }

// FixedBasis is a fixed charge, whatever the base.
func FixedBasis(f int64) FeeBasis { return FeeBasis{Kind: FeeKindFixed, Fixed: &f} }

func (b FeeBasis) validate() error {
	switch {
	case b.Kind == FeeKindPercent && b.Percent != nil && *b.Percent >= 0 && b.Fixed == nil:
	case b.Kind == FeeKindFixed && b.Fixed != nil && *b.Fixed >= 0 && b.Percent == nil:
	default:
		return invalid("an operator fee basis is {kind: percent, percent} or {kind: fixed, fixed}, with a non-negative integer, never both (§5.5.8)")
	}
	return nil
}

// FeeBasisFromValue shape-checks a basis: the kind from the closed two, the
// one value member its kind names as a non-negative integer (a fractional
// percentage would put a float in the signed bytes and make the
// arithmetic check inexact; state the charge as a fixed basis instead),
// and nothing else.
func FeeBasisFromValue(v any) (FeeBasis, error) {
	m, err := object(v, "an operator fee basis is an object, a percentage or a fixed charge (§5.5.8)")
	if err != nil {
		return FeeBasis{}, err
	}
	var b FeeBasis
	b.Kind, _ = m["kind"].(string)
	switch b.Kind {
	case FeeKindPercent:
		if err := unknown(m, "a percent basis", "kind", "percent"); err != nil {
			return FeeBasis{}, invalid("a percent basis carries its percentage and nothing else (§5.5.8)")
		}
		n, ok := jsonv.NonNegInt(m["percent"])
		if !ok {
			return FeeBasis{}, invalid("percent is a non-negative integer: a fraction would put a float inside the signed bytes; state the charge as a fixed basis instead (§5.5.8)")
		}
		b.Percent = &n
	case FeeKindFixed:
		if err := unknown(m, "a fixed basis", "kind", "fixed"); err != nil {
			return FeeBasis{}, invalid("a fixed basis carries its charge and nothing else (§5.5.8)")
		}
		n, ok := jsonv.NonNegInt(m["fixed"])
		if !ok {
			return FeeBasis{}, invalid("fixed is a non-negative integer in the settlement currency (§5.5.8)")
		}
		b.Fixed = &n
	default:
		return FeeBasis{}, invalid("an operator fee basis kind is percent or fixed (§5.5.8)")
	}
	return b, nil
}

// OperatorFee is the operator's own cut, disclosed as its own line (§5.5.8):
// the amount, the basis it was computed from and the base the basis was
// applied to (required: ten percent of the provider's price and of the
// client's total are different numbers, and a client must not infer it).
type OperatorFee struct {
	Operator string   `json:"operator,omitempty"`
	Basis    FeeBasis `json:"basis"`
	Base     int64    `json:"base"`
	Amount   int64    `json:"amount"`
}

// OperatorFeeFromValue shape-checks a fee line; whether the amount follows
// from basis and base is CheckOperatorFee's separate question.
func OperatorFeeFromValue(v any) (OperatorFee, error) {
	m, err := object(v, "an operator fee line is an object {amount, basis, base, operator?} (§5.5.8)")
	if err != nil {
		return OperatorFee{}, err
	}
	if err := unknown(m, "an operator fee line", "operator", "basis", "base", "amount"); err != nil {
		return OperatorFee{}, err
	}
	var f OperatorFee
	if raw, present := m["operator"]; present {
		if f.Operator, _ = raw.(string); f.Operator == "" {
			return OperatorFee{}, invalid("operator, when present, names who took the cut (§5.5.8)")
		}
	}
	if f.Basis, err = FeeBasisFromValue(m["basis"]); err != nil {
		return OperatorFee{}, err
	}
	raw, present := m["base"]
	if !present {
		return OperatorFee{}, invalid("base is required: a percentage is not checkable until the buyer knows what it was applied to, and a client node must not infer it (§5.5.8)")
	}
	var ok bool
	if f.Base, ok = jsonv.NonNegInt(raw); !ok {
		return OperatorFee{}, invalid("base is a non-negative integer (§5.5.8)")
	}
	if f.Amount, ok = jsonv.NonNegInt(m["amount"]); !ok {
		return OperatorFee{}, invalid("amount is a non-negative integer in the settlement currency: a negative fee is a refund wearing the wrong line (§5.5.8)")
	}
	return f, nil
}

// FeeAmount is the fee a basis takes on base: floor(base * percent / 100),
// or exactly the fixed charge whatever the base. One rule, no rounding
// argument: a percentage of a base too small to earn a unit takes nothing.
func FeeAmount(b FeeBasis, base int64) (int64, error) {
	if err := b.validate(); err != nil {
		return 0, err
	}
	if base < 0 {
		return 0, invalid("the fee base is a non-negative integer (§5.5.8)")
	}
	if b.Kind == FeeKindFixed {
		return *b.Fixed, nil
	}
	return mulDiv(base, *b.Percent, 100)
}

// CheckOperatorFee reports whether a fee line closes: its amount is exactly
// FeeAmount(basis, base). There is no tolerance of any size.
func CheckOperatorFee(f OperatorFee) error {
	want, err := FeeAmount(f.Basis, f.Base)
	if err != nil {
		return err
	}
	if f.Amount == want {
		return nil
	}
	if f.Basis.Kind == FeeKindFixed {
		return invalid("the operator fee states %d against a fixed basis of %d; a fixed charge is rounded by nothing (§5.5.8)", f.Amount, want)
	}
	return invalid("the operator fee states %d, and %d%% of %d floors to %d; there is no tolerance of any size (§5.5.8)", f.Amount, *f.Basis.Percent, f.Base, want)
}

// FitRule names the boundary rule MaxRatedTotal implements.
const FitRule = "maximal_fit"

// MaxRatedTotal is the largest rated total whose sum with its own fee fits
// in capRemaining: the maximal fit (§5.5.8 as pinned by the fixtures). With
// no basis it is capRemaining; a fixed charge comes off the top, and where
// it does not fit nothing does; under a percentage it is not the closed
// form floor(cap * 100 / (100 + percent)), because the fee floors and can
// hide one more unit of headroom.
func MaxRatedTotal(capRemaining int64, b *FeeBasis) int64 {
	if capRemaining <= 0 {
		return 0
	}
	if b == nil {
		return capRemaining
	}
	if b.Kind == FeeKindFixed {
		return max(0, capRemaining-*b.Fixed)
	}
	p := *b.Percent
	fits := func(t int64) bool {
		fee, err := mulDiv(t, p, 100)
		return err == nil && t+fee <= capRemaining
	}
	fit, err := mulDiv(capRemaining, 100, 100+p)
	if err != nil {
		return 0
	}
	for fits(fit + 1) {
		fit++
	}
	return fit
}

// OperatorFeeBasisGrade is the grade of a disclosed basis, always evidence:
// a client can check the arithmetic, not that the percentage is the rate
// the operator agreed with the provider.
const OperatorFeeBasisGrade = Evidence

// OperatorFeeGrade is the grade §5.5.8 earns on a money path: enforced only
// when the operator both built the quote and settled the charge (two
// records the client holds); anything less is recorded, never guessed up.
func OperatorFeeGrade(builtQuote, settled bool) Grade {
	if builtQuote && settled {
		return Enforced
	}
	return Recorded
}

// Quote is a total offered before commitment and the fee inside it; no
// fee line asserts that no operator fee is inside the total.
type Quote struct {
	Total       int64
	Currency    string
	OperatorFee *OperatorFee
}

// SettlementRecord is what was charged, line by line; Total is what the
// client pays, the fee inside it.
type SettlementRecord struct {
	Engagement  string
	At          string
	Total       int64
	Currency    string
	Lines       []SettlementLine
	OperatorFee *OperatorFee
}

func totalAndFee(m map[string]any, what string) (int64, string, *OperatorFee, error) {
	total, ok := jsonv.NonNegInt(m["total"])
	if !ok {
		return 0, "", nil, invalid("a %s's total is a non-negative integer", what)
	}
	var cur string
	if raw, present := m["currency"]; present {
		if cur, _ = raw.(string); !protocol.IsCurrency(cur) {
			return 0, "", nil, invalid("a %s's currency is a three-letter uppercase code", what)
		}
	}
	var fee *OperatorFee
	if raw, present := m["operator_fee"]; present {
		f, err := OperatorFeeFromValue(raw)
		if err != nil {
			return 0, "", nil, err
		}
		fee = &f
	}
	return total, cur, fee, nil
}

// QuoteFromValue shape-checks a quote {total, currency?, operator_fee?}.
func QuoteFromValue(v any) (Quote, error) {
	m, err := object(v, "a quote is an object {total, currency?, operator_fee?} (§5.5.8)")
	if err != nil {
		return Quote{}, err
	}
	if err := unknown(m, "a quote", "total", "currency", "operator_fee"); err != nil {
		return Quote{}, err
	}
	var q Quote
	q.Total, q.Currency, q.OperatorFee, err = totalAndFee(m, "quote")
	return q, err
}

// SettlementRecordFromValue shape-checks a settlement record {engagement?,
// at?, total, currency?, lines, operator_fee?}.
func SettlementRecordFromValue(v any) (SettlementRecord, error) {
	m, err := object(v, "a settlement record is an object {total, lines, currency?, operator_fee?} (§5.5)")
	if err != nil {
		return SettlementRecord{}, err
	}
	if err := unknown(m, "a settlement record", "engagement", "at", "total", "currency", "lines", "operator_fee"); err != nil {
		return SettlementRecord{}, err
	}
	var r SettlementRecord
	if r.Total, r.Currency, r.OperatorFee, err = totalAndFee(m, "settlement record"); err != nil {
		return SettlementRecord{}, err
	}
	if raw, present := m["engagement"]; present {
		if r.Engagement, _ = raw.(string); r.Engagement == "" {
			return SettlementRecord{}, invalid("a settlement record's engagement is the engagement id it cites")
		}
	}
	if raw, present := m["at"]; present {
		r.At, _ = raw.(string)
		if _, err := protocol.ParseTime(r.At); err != nil {
			return SettlementRecord{}, invalid("a settlement record's at is an RFC 3339 instant")
		}
	}
	lines, ok := jsonv.Array(m["lines"])
	if !ok {
		return SettlementRecord{}, invalid("a settlement record carries its lines")
	}
	for _, raw := range lines {
		l, err := SettlementLineFromValue(raw)
		if err != nil {
			return SettlementRecord{}, err
		}
		r.Lines = append(r.Lines, l)
	}
	return r, nil
}

// Accounted is what a record's own lines account for: the rated lines and
// the operator's cut.
func (r SettlementRecord) Accounted() int64 {
	var sum int64
	for _, l := range r.Lines {
		sum += l.Amount
	}
	if r.OperatorFee != nil {
		sum += r.OperatorFee.Amount
	}
	return sum
}

// ProviderNet is what the provider receives: the total less the operator's
// cut, the number disclosure reveals.
func (r SettlementRecord) ProviderNet() int64 {
	if r.OperatorFee != nil {
		return r.Total - r.OperatorFee.Amount
	}
	return r.Total
}

// Why a settlement is disputed (§5.5.8).
const (
	DisputeFeeMissing       = "operator_fee_missing"
	DisputeFeeUndisclosed   = "operator_fee_undisclosed"
	DisputeFeeArithmetic    = "operator_fee_arithmetic"
	DisputeTotalUnaccounted = "total_unaccounted"
)

// Dispute is a disputed settlement: the client node records it holding both
// documents as compared, raises it under the disputes clause, and never
// repairs the record (a record the client rewrote is no longer evidence of
// what the operator claimed).
type Dispute struct {
	Reason string
	Detail string
}

func (d *Dispute) Error() string { return d.Reason + ": " + d.Detail }

// CheckSettlement is the client node's read of a record against the quote
// it holds, in order: a fee line the quote carried must be present; a fee
// line the quote did not carry contradicts the quote; the fee must close;
// the total must be what the lines account for. nil means settled.
func CheckSettlement(q Quote, r SettlementRecord) *Dispute {
	switch {
	case q.OperatorFee != nil && r.OperatorFee == nil:
		return &Dispute{DisputeFeeMissing, "the quote disclosed an operator fee and the settlement record carries no operator fee line (§5.5.8)"}
	case q.OperatorFee == nil && r.OperatorFee != nil:
		return &Dispute{DisputeFeeUndisclosed, "the settlement record discloses an operator fee the quote did not, contradicting the quote's assertion that none was inside its total (§5.5.8)"}
	}
	if r.OperatorFee != nil {
		if err := CheckOperatorFee(*r.OperatorFee); err != nil {
			return &Dispute{DisputeFeeArithmetic, errs.As(err).Message}
		}
	}
	if got := r.Accounted(); got != r.Total {
		return &Dispute{DisputeTotalUnaccounted, fmt.Sprintf("the settlement record states a total of %d and its own lines account for %d (§5.5.8)", r.Total, got)}
	}
	return nil
}

// DisputesBeforeRefusing is how many disputed settlements under one
// operator make a client node refuse further work under it (SHOULD).
const DisputesBeforeRefusing = 2

// RefuseFurtherWork reports whether, after disputes disputed settlements
// under one operator, further work under it should be refused: one
// discrepancy alone is not grounds to stop.
func RefuseFurtherWork(disputes int) bool { return disputes >= DisputesBeforeRefusing }
