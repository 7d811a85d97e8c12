package allowance

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// ErrAmbiguous marks an amount or estimate that could be read more than one
// way (a bare "5.00": which currency? money or time?). Such a value is
// refused locally rather than guessed, because a wrong guess is either
// spending the owner did not authorise or a refusal that quotes the wrong
// thing.
var ErrAmbiguous = errors.New("ambiguous value")

// maxFractionDigits is the precision of micro-units: 1,000,000 per unit.
const maxFractionDigits = 6

// moneyForms is appended to every money error so the fix is on screen.
const moneyForms = "write $5.00 for US dollars, or 5.00 EUR / EUR 5.00 to name an ISO 4217 currency"

// ParseMoney reads an amount typed by a person: "$5.00" is US dollars;
// "5.00 EUR" or "EUR 5.00" names the currency (an ISO 4217 code, any
// letter case). At most six decimals; the value becomes integer
// micro-units by string arithmetic, never through a float. A bare "5.00" is
// refused as ambiguous (ErrAmbiguous); negative, empty and malformed
// amounts, and amounts beyond what the protocol carries exactly (2^53−1
// micro-units), are refused with a message that shows the accepted forms.
func ParseMoney(s string) (protocol.Money, error) {
	in := strings.TrimSpace(s)
	if in == "" {
		return protocol.Money{}, fmt.Errorf("empty amount: %s", moneyForms)
	}
	digits, currency, err := splitMoney(in)
	if err != nil {
		return protocol.Money{}, err
	}
	micro, err := parseMicro(digits)
	if err != nil {
		return protocol.Money{}, fmt.Errorf("amount %q: %w", in, err)
	}
	return protocol.Money{AmountMicro: micro, Currency: currency}, nil
}

// splitMoney separates the number from its currency marker: a leading "$",
// or a three-letter code before or after the number.
func splitMoney(in string) (digits, currency string, err error) {
	fields := strings.Fields(in)
	switch len(fields) {
	case 1:
		f := fields[0]
		switch {
		case strings.HasPrefix(f, "-"):
			return "", "", fmt.Errorf("amount %q is negative: an allowance or estimate is never below zero", in)
		case strings.HasPrefix(f, "$"):
			return f[1:], "USD", nil
		case isBareNumber(f):
			return "", "", fmt.Errorf("amount %q names no currency (%w): %s", in, ErrAmbiguous, moneyForms)
		}
	case 2:
		a, b := fields[0], fields[1]
		if a == "$" { // "$ 5.00": a stray space after the sign
			return b, "USD", nil
		}
		if strings.Contains(in, "$") {
			// "$5.00 EUR" contradicts itself and "$5.00 USD" says it twice;
			// one marker keeps the reading unique.
			return "", "", fmt.Errorf("amount %q: use either $ or a currency code, not both: %s", in, moneyForms)
		}
		switch {
		case isCodeShaped(b):
			return a, strings.ToUpper(b), nil
		case isCodeShaped(a):
			return b, strings.ToUpper(a), nil
		}
	}
	return "", "", fmt.Errorf("cannot read %q as money: %s", in, moneyForms)
}

// isCodeShaped reports three ASCII letters in any case; the caller
// upper-cases them into an ISO 4217 code.
func isCodeShaped(s string) bool {
	return protocol.IsCurrency(strings.ToUpper(s))
}

// isBareNumber reports a decimal with no currency or unit: an optional
// sign, digits, and an optional fraction ("5", "5.00", "-1.5", ".5").
func isBareNumber(s string) bool {
	s = strings.TrimLeft(s, "+-")
	whole, frac, dot := strings.Cut(s, ".")
	if whole == "" && frac == "" {
		return false
	}
	return allDigits(whole) && (!dot || allDigits(frac))
}

func allDigits(s string) bool {
	for i := range len(s) {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// parseMicro converts "12.345" into 12345000 micro-units digit by digit:
// whole units times 10^6 plus the fraction padded to six digits.
func parseMicro(s string) (int64, error) {
	switch {
	case s == "":
		return 0, errors.New("the number is missing")
	case s[0] == '-':
		return 0, errors.New("negative: an allowance or estimate is never below zero")
	}
	whole, frac, dot := strings.Cut(s, ".")
	switch {
	case whole == "" || !allDigits(whole):
		return 0, fmt.Errorf("%q is not a decimal number such as 5 or 5.00", s)
	case dot && (frac == "" || !allDigits(frac)):
		return 0, fmt.Errorf("%q is not a decimal number such as 5 or 5.00", s)
	case len(frac) > maxFractionDigits:
		return 0, fmt.Errorf("%q has %d decimals; at most %d are allowed (one micro-unit is 0.000001)", s, len(frac), maxFractionDigits)
	}
	frac += strings.Repeat("0", maxFractionDigits-len(frac))
	var micro int64
	for _, c := range strings.TrimLeft(whole, "0") + frac {
		micro = micro*10 + int64(c-'0')
		if micro > protocol.MaxSafeInteger {
			return 0, fmt.Errorf("too large: at most %s units", protocol.FormatMicro(protocol.MaxSafeInteger))
		}
	}
	return micro, nil
}

// EstimateKind says which refusal an Estimate answers with.
type EstimateKind string

// The two kinds of estimate `reply --refuse-budget` accepts.
const (
	// KindMoney answers BUDGET_INSUFFICIENT with details.estimate.
	KindMoney EstimateKind = "money"
	// KindTime answers DEADLINE_UNMEETABLE with details.earliest_completion.
	KindTime EstimateKind = "time"
)

// Estimate is the responder's price or earliest completion, as typed after
// `reply <id> --refuse-budget`.
type Estimate struct {
	Kind EstimateKind
	// Money is set for KindMoney: a positive amount.
	Money protocol.Money
	// Earliest is set for KindTime: an instant after the parse time, UTC.
	Earliest time.Time
}

// estimateForms is appended to every estimate error.
const estimateForms = "give money ($5.00, 5.00 EUR) or a time (a duration such as 2h, 90m, 1h30m, or an RFC 3339 instant such as 2026-07-27T17:30:00Z)"

// ParseEstimate reads a budget refusal's estimate. Money forms are
// ParseMoney's and must be positive (a zero price is no reason to refuse).
// A time is an RFC 3339 instant or a Go duration ("2h", "90m", "1h30m")
// added to now, and must lie after now. A bare number ("5", "5.00") could
// be either and is refused with ErrAmbiguous.
func ParseEstimate(s string, now time.Time) (Estimate, error) {
	in := strings.TrimSpace(s)
	switch {
	case in == "":
		return Estimate{}, fmt.Errorf("empty estimate: %s", estimateForms)
	case looksLikeMoney(in):
		return moneyEstimate(in)
	case len(strings.Fields(in)) > 1:
		return Estimate{}, fmt.Errorf("cannot read %q as an estimate: %s", in, estimateForms)
	case isBareNumber(in):
		return Estimate{}, fmt.Errorf("estimate %q has no currency or unit (%w): %s", in, ErrAmbiguous, estimateForms)
	}
	if t, err := protocol.ParseTime(in); err == nil {
		return timeEstimate(in, t, now)
	}
	if d, err := time.ParseDuration(in); err == nil {
		if d <= 0 {
			return Estimate{}, fmt.Errorf("estimate %q: a duration must be positive", in)
		}
		return timeEstimate(in, now.Add(d), now)
	}
	if _, err := time.Parse(time.DateOnly, in); err == nil {
		return Estimate{}, fmt.Errorf("estimate %q is a date, not an instant: add a time and offset, e.g. %sT17:30:00Z", in, in)
	}
	return Estimate{}, fmt.Errorf("cannot read %q as an estimate: %s", in, estimateForms)
}

// looksLikeMoney reports a currency marker: a "$" anywhere, or a
// three-letter code beside one other word. Everything else is read as a
// time or refused.
func looksLikeMoney(in string) bool {
	if strings.Contains(in, "$") {
		return true
	}
	f := strings.Fields(in)
	return len(f) == 2 && (isCodeShaped(f[0]) || isCodeShaped(f[1]))
}

func moneyEstimate(in string) (Estimate, error) {
	m, err := ParseMoney(in)
	if err != nil {
		return Estimate{}, fmt.Errorf("estimate: %w", err)
	}
	if m.AmountMicro == 0 {
		return Estimate{}, fmt.Errorf("estimate %q is zero: a budget that covers nothing is never short of a zero price", in)
	}
	return Estimate{Kind: KindMoney, Money: m}, nil
}

func timeEstimate(in string, earliest, now time.Time) (Estimate, error) {
	if !earliest.After(now) {
		return Estimate{}, fmt.Errorf("estimate %q is not in the future: an earliest completion must come after now (%s)", in, protocol.FormatTime(now))
	}
	return Estimate{Kind: KindTime, Earliest: earliest.UTC()}, nil
}

// Refusal is the wire error for this estimate: BUDGET_INSUFFICIENT with
// details.estimate {amount_micro, currency} for money, DEADLINE_UNMEETABLE
// with details.earliest_completion (RFC 3339) for time. note, when not
// blank, is the message; otherwise protocol's default is used. The zero
// Estimate has no refusal and yields nil.
func (e Estimate) Refusal(note string) *errs.Error {
	note = strings.TrimSpace(note)
	switch e.Kind {
	case KindMoney:
		return protocol.BudgetInsufficient(e.Money, note)
	case KindTime:
		return protocol.DeadlineUnmeetable(e.Earliest, note)
	}
	return nil
}
