package sow

import (
	"time"

	"agentmesh.dev/mesh/shared/jsonv"
	"agentmesh.dev/mesh/shared/metering"
	"agentmesh.dev/mesh/shared/protocol"
)

// Pricing arrangements (§5.5): exactly one per engagement, no default.
const (
	FixedFee         = "fixed_fee"
	TimeAndMaterials = "time_and_materials"
	NoCharge         = "no_charge"
)

// Arrangements lists the closed set.
func Arrangements() []string { return []string{FixedFee, TimeAndMaterials, NoCharge} }

// Price is the price clause (§5.5). Money is an integer in the smallest
// unit of Currency: the specification's own field names (per_task,
// per_unit, cap.amount, ceiling.amount), not the mesh's amount_micro.
type Price struct {
	Arrangement string
	Currency    string
	// Rates and Ceiling are fixed_fee's: a price per task per offering, and
	// an optional spend ceiling per month (operator fee included).
	Rates   []FixedRate
	Ceiling *Ceiling
	// Schedule, Cap and ReservationDays are time_and_materials': the rate
	// schedule over meters, the mandatory not-to-exceed cap (the most the
	// client pays, fee included) and the mandatory reservation window.
	Schedule        []ScheduleLine
	Cap             int64
	ReservationDays int64
	Grade           Grade
}

// FixedRate is one published fixed fee.
type FixedRate struct {
	Offering string
	PerTask  int64
}

// Ceiling is a fixed-fee spend ceiling per period (always "month").
type Ceiling struct {
	Amount int64
	Period string
}

// ScheduleLine prices one meter: floor(count * PerUnit / Divisor()). Unit
// is a label for people and is never parsed.
type ScheduleLine struct {
	Meter       string
	Unit        string
	Per         int64 // 0: not stated, meaning 1
	PerUnit     int64
	PassThrough bool
}

// Divisor is the line's per, or 1 when it states none.
func (l ScheduleLine) Divisor() int64 {
	if l.Per == 0 {
		return 1
	}
	return l.Per
}

// PriceFromValue shape-checks the price clause (§5.5). It refuses: a clause
// naming no arrangement (there is no undeclared default, and a 0.3 clause is
// not a fixed fee with a member missing) or one outside the closed three; a
// missing or unknown grade; a no_charge clause carrying anything but its
// arrangement and grade (§5.5.7 refuses every price field, named or not); a
// currency that is not three capital letters; a fixed_fee clause with no
// rates, two rates for one offering, a schedule or a cap; a
// time_and_materials clause with an empty schedule, a meter priced twice,
// a line without its unit, a per that is not a positive integer, a
// pass_through other than the literal true, no cap or a cap that is not a
// positive integer, no reservation or a window that is not a positive
// number of days, rates, or a per-period ceiling (two numbers competing to
// be the committed price); money that is not a non-negative integer; and
// any member this version does not know.
func PriceFromValue(v any) (Price, error) {
	m, err := object(v, "the price clause is an object carrying its arrangement and grade (§5.5)")
	if err != nil {
		return Price{}, err
	}
	var p Price
	raw, present := m["arrangement"]
	if !present {
		return Price{}, invalid("every engagement declares a pricing arrangement; there is no undeclared default (§5.5)")
	}
	switch p.Arrangement, _ = raw.(string); p.Arrangement {
	case FixedFee, TimeAndMaterials, NoCharge:
	default:
		return Price{}, invalid("arrangement is fixed_fee, time_and_materials or no_charge (§5.5)")
	}
	if p.Grade, err = readGrade(m, "the price clause"); err != nil {
		return Price{}, err
	}
	if p.Arrangement == NoCharge {
		if k, bad := jsonv.Unknown(m, "arrangement", "grade"); bad {
			return Price{}, invalid("a no_charge clause carries its arrangement and grade and nothing else, so it must not carry %q: there is no rate to state, no ceiling to test and no cap to reserve against (§5.5.7)", k)
		}
		return p, nil
	}
	if p.Currency, _ = m["currency"].(string); !protocol.IsCurrency(p.Currency) {
		return Price{}, invalid("currency is a three-letter uppercase code; private-use X codes are legal (§5.5)")
	}
	if p.Arrangement == FixedFee {
		return p, fixedFee(&p, m)
	}
	return p, timeAndMaterials(&p, m)
}

func fixedFee(p *Price, m map[string]any) error {
	for _, k := range []string{"schedule", "cap", "reservation"} {
		if _, present := m[k]; present {
			return invalid("a fixed_fee clause carries no %s: its price is known before the task runs, and a schedule is the other arrangement (§5.5.1)", k)
		}
	}
	if err := unknown(m, "a fixed_fee clause", "arrangement", "currency", "rates", "ceiling", "grade"); err != nil {
		return err
	}
	rates, ok := jsonv.Array(m["rates"])
	if !ok || len(rates) == 0 {
		return invalid("fixed_fee prices work per offering: rates must be a non-empty list (§5.5.1)")
	}
	for _, raw := range rates {
		r, err := object(raw, "each rate is an object {offering, per_task} (§5.5.1)")
		if err != nil {
			return err
		}
		if err := unknown(r, "a rate", "offering", "per_task"); err != nil {
			return err
		}
		var fr FixedRate
		if fr.Offering, _ = r["offering"].(string); fr.Offering == "" {
			return invalid("each rate names an offering (§5.5.1)")
		}
		for _, prev := range p.Rates {
			if prev.Offering == fr.Offering {
				return invalid("two rates for offering %q are two answers to one question (§5.5.1)", fr.Offering)
			}
		}
		if fr.PerTask, ok = jsonv.NonNegInt(r["per_task"]); !ok {
			return invalid("per_task is a non-negative integer in the smallest unit of the currency, never a float (§5.5.1)")
		}
		p.Rates = append(p.Rates, fr)
	}
	if raw, present := m["ceiling"]; present {
		c, err := object(raw, "ceiling is an object {amount, period} (§5.5.1)")
		if err != nil {
			return err
		}
		if err := unknown(c, "the ceiling", "amount", "period"); err != nil {
			return err
		}
		p.Ceiling = &Ceiling{}
		if p.Ceiling.Amount, ok = jsonv.PosInt(c["amount"]); !ok {
			return invalid("ceiling.amount is a positive integer (§5.5.1)")
		}
		if p.Ceiling.Period, _ = c["period"].(string); p.Ceiling.Period != "month" {
			return invalid("ceiling.period is month (§5.5.1)")
		}
	}
	return nil
}

func timeAndMaterials(p *Price, m map[string]any) error {
	if _, present := m["rates"]; present {
		return invalid("a time_and_materials clause carries no rates: the schedule is its price (§5.5.2)")
	}
	if _, present := m["ceiling"]; present {
		return invalid("a time_and_materials clause bounds itself with its cap, not a per-period ceiling: carrying both leaves two numbers competing to be the committed price (§5.5.3)")
	}
	if err := unknown(m, "a time_and_materials clause", "arrangement", "currency", "schedule", "cap", "reservation", "grade"); err != nil {
		return err
	}
	lines, ok := jsonv.Array(m["schedule"])
	if !ok || len(lines) == 0 {
		return invalid("time_and_materials is a rate schedule: schedule must be a non-empty list (§5.5.2)")
	}
	for _, raw := range lines {
		l, err := object(raw, "each schedule line is an object {meter, unit, per?, per_unit, pass_through?} (§5.5.2)")
		if err != nil {
			return err
		}
		if err := unknown(l, "a schedule line", "meter", "unit", "per", "per_unit", "pass_through"); err != nil {
			return err
		}
		var sl ScheduleLine
		if sl.Meter, _ = l["meter"].(string); !metering.ValidName(sl.Meter) {
			return invalid("each schedule line names a meter matching %s (§5.5.2)", metering.NamePattern)
		}
		for _, prev := range p.Schedule {
			if prev.Meter == sl.Meter {
				return invalid("the schedule prices %q twice: two prices for one meter are two answers to one question (§5.5.2)", sl.Meter)
			}
		}
		if sl.Unit, ok = jsonv.Text(l["unit"], 64); !ok {
			return invalid("each schedule line names the unit its meter counts, a label for the people reading it (§5.5.2)")
		}
		if raw, present := l["per"]; present {
			if sl.Per, ok = jsonv.PosInt(raw); !ok {
				return invalid("per is the divisor, how many raw counts make one billable unit: a positive integer, 1 when absent (§5.5.2)")
			}
		}
		if sl.PerUnit, ok = jsonv.NonNegInt(l["per_unit"]); !ok {
			return invalid("per_unit is a non-negative integer in the smallest unit of the currency, never a float (§5.5.2)")
		}
		if raw, present := l["pass_through"]; present {
			if raw != true {
				return invalid("pass_through, when present, is the literal true; absence says a line is not pass-through (§5.5.6)")
			}
			sl.PassThrough = true
		}
		p.Schedule = append(p.Schedule, sl)
	}
	rawCap, present := m["cap"]
	if !present {
		return invalid("a time_and_materials engagement carries a not-to-exceed cap; there is no uncapped one (§5.5.3)")
	}
	c, err := object(rawCap, "cap is an object {amount} (§5.5.3)")
	if err != nil {
		return err
	}
	if err := unknown(c, "the cap", "amount"); err != nil {
		return err
	}
	if p.Cap, ok = jsonv.PosInt(c["amount"]); !ok {
		return invalid("cap.amount is a positive integer: a zero cap admits no work at all, and an empty cap is not a cap (§5.5.3)")
	}
	rawRes, present := m["reservation"]
	if !present {
		return invalid("a time_and_materials engagement carries a reservation with a stated window: a purchase order that commits no funds and names no period has no defined settlement (§5.5.4)")
	}
	r, err := object(rawRes, "reservation is an object {window_days} (§5.5.4)")
	if err != nil {
		return err
	}
	if err := unknown(r, "the reservation", "window_days"); err != nil {
		return err
	}
	if p.ReservationDays, ok = jsonv.PosInt(r["window_days"]); !ok {
		return invalid("reservation.window_days is a positive integer: a zero window releases the reservation the instant it is taken (§5.5.4)")
	}
	return nil
}

// Settles reports whether work under p is rated and settled at all: false
// for no_charge, which rates nothing, draws nothing and writes no record.
func (p Price) Settles() bool { return p.Arrangement != NoCharge }

// CommittedPrice is the single number a mandate ceiling tests before
// formation: the cap under time and materials, zero under no_charge, the
// ceiling under a fixed fee that states one; false when a fixed fee states
// no ceiling and so commits to no bounded total.
func (p Price) CommittedPrice() (int64, bool) {
	switch {
	case p.Arrangement == TimeAndMaterials:
		return p.Cap, true
	case p.Arrangement == NoCharge:
		return 0, true
	case p.Ceiling != nil:
		return p.Ceiling.Amount, true
	}
	return 0, false
}

// ReleaseAt is when a reservation taken at startsAt releases: window days
// later (days of 24 hours; the unused remainder returns to the client).
func ReleaseAt(windowDays int64, startsAt string) (time.Time, error) {
	start, err := protocol.ParseTime(startsAt)
	if err != nil {
		return time.Time{}, invalid("starts_at must be an RFC 3339 instant (§5.5.4)")
	}
	return start.Add(time.Duration(windowDays) * 24 * time.Hour), nil
}

// ReservationWithinTerm reports whether the reservation window ends no
// later than ends_at (§5.5.4: the window must not extend past the term).
func ReservationWithinTerm(windowDays int64, startsAt, endsAt string) (bool, error) {
	release, err := ReleaseAt(windowDays, startsAt)
	if err != nil {
		return false, err
	}
	end, err := protocol.ParseTime(endsAt)
	if err != nil {
		return false, invalid("ends_at must be an RFC 3339 instant (§5.7)")
	}
	return !release.After(end), nil
}
