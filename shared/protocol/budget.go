package protocol

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/errs"
)

// Money is an amount in integer micro-units (1,000,000 = one unit) of an ISO
// 4217 currency. Floats never come near money.
type Money struct {
	AmountMicro int64  `json:"amount_micro"`
	Currency    string `json:"currency"`
}

// String renders m for people: "2.00 USD", "0.0015 USD".
func (m Money) String() string { return FormatMicro(m.AmountMicro) + " " + m.Currency }

// FormatMicro renders micro-units as a decimal with at least two and at most
// six fraction digits.
func FormatMicro(micro int64) string {
	neg := micro < 0
	if neg {
		micro = -micro
	}
	whole, frac := micro/1_000_000, micro%1_000_000
	f := strings.TrimRight(fmt.Sprintf("%06d", frac), "0")
	for len(f) < 2 {
		f += "0"
	}
	s := strconv.FormatInt(whole, 10) + "." + f
	if neg {
		s = "-" + s
	}
	return s
}

// Budget is the envelope budget block of a request (spec §2.5,
// upstream-notes §4.1). Revisions are absolute: each states the whole budget.
type Budget struct {
	Deadline    string `json:"deadline,omitempty"`
	Revision    int64  `json:"revision"`
	CostCeiling *Money `json:"cost_ceiling,omitempty"`
}

// DeadlineSkew is the clock-skew tolerance deadlines are compared under
// (upstream-notes §4.1: 300,000 ms at one-second granularity).
const DeadlineSkew = 5 * time.Minute

func budgetErr(format string, args ...any) *errs.Error {
	return errs.Newf(errs.InvalidEnvelope, "budget: "+format, args...)
}

// ParseBudget validates a budget block given as JSON text.
func ParseBudget(data []byte) (Budget, error) {
	v, err := ParseJSON(data)
	if err != nil {
		return Budget{}, budgetErr("%v", err)
	}
	return BudgetFromValue(v)
}

// BudgetFromValue validates a decoded budget block. It refuses: a missing,
// fractional or negative revision; a block with neither axis; a null axis; a
// deadline that is not a full RFC 3339 instant (a date alone is not); a
// ceiling whose amount is fractional, negative or missing, or whose currency
// is missing or not three capital letters.
func BudgetFromValue(v any) (Budget, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return Budget{}, budgetErr("must be an object")
	}
	var b Budget
	rv, ok := m["revision"]
	if !ok {
		return Budget{}, budgetErr("revision is required")
	}
	rev, ok := nonNegInt(rv)
	if !ok {
		return Budget{}, budgetErr("revision must be a non-negative integer")
	}
	b.Revision = rev
	if dv, ok := m["deadline"]; ok {
		s, ok := dv.(string)
		if !ok {
			return Budget{}, budgetErr("deadline must be an RFC 3339 instant string")
		}
		if _, err := ParseTime(s); err != nil {
			return Budget{}, budgetErr("deadline %q is not a full RFC 3339 instant", s)
		}
		b.Deadline = s
	}
	if cv, ok := m["cost_ceiling"]; ok {
		money, err := MoneyFromValue(cv)
		if err != nil {
			return Budget{}, budgetErr("cost_ceiling: %v", err)
		}
		b.CostCeiling = &money
	}
	if b.Deadline == "" && b.CostCeiling == nil {
		return Budget{}, budgetErr("at least one of deadline and cost_ceiling is required")
	}
	return b, nil
}

// MoneyFromValue validates a decoded {amount_micro, currency} object.
func MoneyFromValue(v any) (Money, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return Money{}, fmt.Errorf("must be an object {amount_micro, currency}")
	}
	av, ok := m["amount_micro"]
	if !ok {
		return Money{}, fmt.Errorf("amount_micro is required")
	}
	amt, ok := nonNegInt(av)
	if !ok {
		return Money{}, fmt.Errorf("amount_micro must be a non-negative integer of micro-units")
	}
	cur, _ := m["currency"].(string)
	if !IsCurrency(cur) {
		return Money{}, fmt.Errorf("currency is required, as an ISO 4217 code such as USD")
	}
	return Money{AmountMicro: amt, Currency: cur}, nil
}

// IsCurrency reports whether s has the shape of an ISO 4217 code (three
// capital letters; private-use X codes such as XCR included).
func IsCurrency(s string) bool {
	if len(s) != 3 {
		return false
	}
	for i := range 3 {
		if s[i] < 'A' || s[i] > 'Z' {
			return false
		}
	}
	return true
}

// nonNegInt accepts a decoded JSON number that is a whole, non-negative,
// exactly representable integer.
func nonNegInt(v any) (int64, bool) {
	f, ok := v.(float64)
	if !ok || f < 0 || f != math.Trunc(f) || f > MaxSafeInteger {
		return 0, false
	}
	return int64(f), true
}

// Validate re-checks a Budget built in Go before it is sent.
func (b Budget) Validate() error {
	v, err := ParseJSON(mustCanonical(b))
	if err != nil {
		return budgetErr("%v", err)
	}
	_, err = BudgetFromValue(v)
	return err
}

func mustCanonical(v any) []byte {
	b, err := Canonical(v)
	if err != nil {
		return []byte("null")
	}
	return b
}

// DeadlineTime returns the parsed deadline, if any.
func (b Budget) DeadlineTime() (time.Time, bool) {
	if b.Deadline == "" {
		return time.Time{}, false
	}
	t, err := ParseTime(b.Deadline)
	return t, err == nil
}

// DeadlinePast is the protocol's deadline predicate: under the 300 s skew
// tolerance at one-second granularity with inclusive bounds, a deadline is
// past only once now exceeds deadline + 300 s by a whole second.
func DeadlinePast(deadline, now time.Time) bool {
	return now.Unix()-deadline.Unix() >= int64(DeadlineSkew/time.Second)+1
}

// ApplyRevision returns the budget that stands after next arrives while cur
// stands. Revisions are absolute and strictly-greater wins: an equal or lower
// revision is ignored (first writer wins on ties). cur may be nil.
func ApplyRevision(cur *Budget, next Budget) (Budget, bool) {
	if cur != nil && next.Revision <= cur.Revision {
		return *cur, false
	}
	return next, true
}

// CheckRevision is the task manager's refusal of a retroactive revision: one
// that is not newer, whose deadline is already past, or whose ceiling is
// below what has already been spent (TASK_INVALID_TRANSITION).
func CheckRevision(cur *Budget, next Budget, now time.Time, spent *Money) error {
	if cur != nil && next.Revision <= cur.Revision {
		return errs.Newf(errs.TaskInvalidTransition, "budget revision %d is not newer than revision %d", next.Revision, cur.Revision)
	}
	if d, ok := next.DeadlineTime(); ok && DeadlinePast(d, now) {
		return errs.Newf(errs.TaskInvalidTransition, "budget revision %d has a deadline already past", next.Revision)
	}
	if next.CostCeiling != nil && spent != nil && next.CostCeiling.Currency == spent.Currency &&
		next.CostCeiling.AmountMicro < spent.AmountMicro {
		return errs.Newf(errs.TaskInvalidTransition, "budget revision %d sets a ceiling below the %s already spent", next.Revision, spent)
	}
	return nil
}

// Line renders the one provenance line the adapter shows outside the
// sender-content fence (spec §2.5):
//
//	budget: ceiling 2.00 USD . due 2026-07-27 16:00:00 UTC (1h0m0s from now) . revision 0
//
// An absent axis is left out rather than shown empty.
func (b Budget) Line(now time.Time) string {
	parts := []string{}
	if b.CostCeiling != nil {
		parts = append(parts, "ceiling "+b.CostCeiling.String())
	}
	if d, ok := b.DeadlineTime(); ok {
		rel := d.Sub(now).Round(time.Second)
		when := rel.String() + " from now"
		if rel < 0 {
			when = (-rel).String() + " ago"
		}
		parts = append(parts, fmt.Sprintf("due %s UTC (%s)", d.UTC().Format("2006-01-02 15:04:05"), when))
	}
	parts = append(parts, "revision "+strconv.FormatInt(b.Revision, 10))
	return "budget: " + strings.Join(parts, " . ")
}

// BudgetInsufficient is the admission refusal carrying the responder's price
// as details.estimate (wire-identical for budget and allowance refusals).
func BudgetInsufficient(estimate Money, msg string) *errs.Error {
	if msg == "" {
		msg = "the budget does not cover this work; the estimate is the price"
	}
	return errs.New(errs.BudgetInsufficient, msg).WithDetail("estimate", moneyWire(estimate))
}

// DeadlineUnmeetable is the admission refusal carrying
// details.earliest_completion as an RFC 3339 instant.
func DeadlineUnmeetable(earliest time.Time, msg string) *errs.Error {
	if msg == "" {
		msg = "the deadline cannot be met"
	}
	return errs.New(errs.DeadlineUnmeetable, msg).WithDetail("earliest_completion", FormatTime(earliest))
}

// BudgetExhaustedPause is the non-terminal mid-work pause: details.spent and
// details.estimate_to_finish.
func BudgetExhaustedPause(spent, toFinish Money) *errs.Error {
	return errs.New(errs.BudgetExhausted, "the budget ceiling was reached; revise the budget or cancel").
		WithDetails(map[string]any{"spent": moneyWire(spent), "estimate_to_finish": moneyWire(toFinish)})
}

func moneyWire(m Money) map[string]any {
	return map[string]any{"amount_micro": m.AmountMicro, "currency": m.Currency}
}
