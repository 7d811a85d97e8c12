package allowance

import (
	"errors"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

func TestParseMoney(t *testing.T) {
	for _, c := range []struct {
		in    string
		micro int64
		cur   string
		err   string // substring of the error; "" means success
	}{
		{"$5.00", 5_000_000, "USD", ""},
		{"$5", 5_000_000, "USD", ""},
		{"  $5.5  ", 5_500_000, "USD", ""},
		{"$ 5.00", 5_000_000, "USD", ""},
		{"$0", 0, "USD", ""},
		{"$0.000001", 1, "USD", ""},
		{"$0.0015", 1500, "USD", ""},
		{"$007.50", 7_500_000, "USD", ""},
		{"5.00 EUR", 5_000_000, "EUR", ""},
		{"EUR 5.00", 5_000_000, "EUR", ""},
		{"5.00 eur", 5_000_000, "EUR", ""},
		{"5.00\tGBP", 5_000_000, "GBP", ""},
		{"0.0009 EUR", 900, "EUR", ""},
		{"12.345678 XCR", 12_345_678, "XCR", ""},
		{"9007199254.740991 USD", protocol.MaxSafeInteger, "USD", ""},

		{"5.00", 0, "", "names no currency"},
		{"5", 0, "", "write $5.00 for US dollars, or 5.00 EUR"},
		{".5", 0, "", "names no currency"},
		{"", 0, "", "empty amount"},
		{"   ", 0, "", "empty amount"},
		{"-5.00 USD", 0, "", "negative"},
		{"USD -5", 0, "", "negative"},
		{"-$5", 0, "", "negative"},
		{"$-5", 0, "", "negative"},
		{"-5", 0, "", "negative"},
		{"$5.1234567", 0, "", "at most 6"},
		{"5.0000000 USD", 0, "", "at most 6"},
		{"$5.", 0, "", "not a decimal number"},
		{"$.5", 0, "", "not a decimal number"},
		{"$", 0, "", "number is missing"},
		{"$1,000", 0, "", "not a decimal number"},
		{"$1e3", 0, "", "not a decimal number"},
		{"$+5", 0, "", "not a decimal number"},
		{"$5.0.0", 0, "", "not a decimal number"},
		{"$５", 0, "", "not a decimal number"}, // a full-width digit is not ASCII
		{"$5 USD", 0, "", "either $ or a currency code"},
		{"$5 EUR", 0, "", "either $ or a currency code"},
		{"5 EURO", 0, "", "cannot read"},
		{"5 US", 0, "", "cannot read"},
		{"5EUR", 0, "", "cannot read"},
		{"5 EUR extra", 0, "", "cannot read"},
		{"EUR USD", 0, "", "not a decimal number"},
		{"five dollars", 0, "", "cannot read"},
		{"9007199254.740992 USD", 0, "", "too large"},
		{"$99999999999999999999999", 0, "", "too large"},
	} {
		t.Run(c.in, func(t *testing.T) {
			m, err := ParseMoney(c.in)
			if c.err != "" {
				if err == nil {
					t.Fatalf("accepted as %+v, want error containing %q", m, c.err)
				}
				if !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %q does not contain %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if m.AmountMicro != c.micro || m.Currency != c.cur {
				t.Fatalf("got %d %s, want %d %s", m.AmountMicro, m.Currency, c.micro, c.cur)
			}
		})
	}
}

// A bare amount is refused as ambiguous, and the message shows both
// accepted forms so the fix is on screen.
func TestParseMoneyAmbiguousExplains(t *testing.T) {
	_, err := ParseMoney("5.00")
	if !errors.Is(err, ErrAmbiguous) {
		t.Fatalf("err %v is not ErrAmbiguous", err)
	}
	for _, want := range []string{"$5.00", "5.00 EUR"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q does not show the form %s", err, want)
		}
	}
}

func TestParseEstimate(t *testing.T) {
	now := at("2026-07-27T16:00:00Z")
	for _, c := range []struct {
		in       string
		kind     EstimateKind
		money    protocol.Money
		earliest string
		err      string
	}{
		{"$5.00", KindMoney, usd(5_000_000), "", ""},
		{"5.00 EUR", KindMoney, protocol.Money{AmountMicro: 5_000_000, Currency: "EUR"}, "", ""},
		{"EUR 0.5", KindMoney, protocol.Money{AmountMicro: 500_000, Currency: "EUR"}, "", ""},
		{"2h", KindTime, protocol.Money{}, "2026-07-27T18:00:00Z", ""},
		{"90m", KindTime, protocol.Money{}, "2026-07-27T17:30:00Z", ""},
		{"1h30m", KindTime, protocol.Money{}, "2026-07-27T17:30:00Z", ""},
		{" 45s ", KindTime, protocol.Money{}, "2026-07-27T16:00:45Z", ""},
		{"2026-07-27T17:30:00Z", KindTime, protocol.Money{}, "2026-07-27T17:30:00Z", ""},
		{"2026-07-27T12:30:00-05:00", KindTime, protocol.Money{}, "2026-07-27T17:30:00Z", ""},
		{"2026-07-27T17:30:00.250Z", KindTime, protocol.Money{}, "2026-07-27T17:30:00.25Z", ""},

		{"5.00", "", protocol.Money{}, "", "no currency or unit"},
		{"5", "", protocol.Money{}, "", "no currency or unit"},
		{"0", "", protocol.Money{}, "", "no currency or unit"},
		{"-5", "", protocol.Money{}, "", "no currency or unit"},
		{"", "", protocol.Money{}, "", "empty estimate"},
		{"$0", "", protocol.Money{}, "", "is zero"},
		{"0 EUR", "", protocol.Money{}, "", "is zero"},
		{"-$5", "", protocol.Money{}, "", "negative"},
		{"$5.1234567", "", protocol.Money{}, "", "at most 6"},
		{"$5 EUR", "", protocol.Money{}, "", "either $ or a currency code"},
		{"0s", "", protocol.Money{}, "", "must be positive"},
		{"-2h", "", protocol.Money{}, "", "must be positive"},
		{"2d", "", protocol.Money{}, "", "cannot read"},
		{"1h 30m", "", protocol.Money{}, "", "cannot read"},
		{"soon", "", protocol.Money{}, "", "cannot read"},
		{"2026-07-27", "", protocol.Money{}, "", "a date, not an instant"},
		{"2026-07-27T17:30:00", "", protocol.Money{}, "", "cannot read"}, // no offset: not RFC 3339
		{"2026-07-27T15:00:00Z", "", protocol.Money{}, "", "not in the future"},
		{"2026-07-27T16:00:00Z", "", protocol.Money{}, "", "not in the future"},
	} {
		t.Run(c.in, func(t *testing.T) {
			e, err := ParseEstimate(c.in, now)
			if c.err != "" {
				if err == nil {
					t.Fatalf("accepted as %+v, want error containing %q", e, c.err)
				}
				if !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %q does not contain %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if e.Kind != c.kind || e.Money != c.money {
				t.Fatalf("got %+v, want kind %s money %+v", e, c.kind, c.money)
			}
			if c.earliest != "" && !e.Earliest.Equal(at(c.earliest)) {
				t.Fatalf("earliest %s, want %s", e.Earliest, c.earliest)
			}
			if c.kind == KindTime && e.Earliest.Location() != time.UTC {
				t.Fatalf("earliest %s is not UTC", e.Earliest)
			}
		})
	}
}

func TestParseEstimateAmbiguousExplains(t *testing.T) {
	_, err := ParseEstimate("5.00", at("2026-07-27T16:00:00Z"))
	if !errors.Is(err, ErrAmbiguous) {
		t.Fatalf("err %v is not ErrAmbiguous", err)
	}
	for _, want := range []string{"$5.00", "5.00 EUR", "2h", "RFC 3339"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q does not show the form %s", err, want)
		}
	}
}

// The refusals an estimate answers with have exactly the shapes budget.json
// pins: details.estimate {amount_micro, currency} for money, and
// details.earliest_completion (an RFC 3339 instant, not "estimate") for
// time.
func TestEstimateRefusalMatchesBudgetFixture(t *testing.T) {
	refusals := obj(fixture(t, "budget.json")["refusals"])
	now := at("2026-07-27T16:00:00Z")

	bi := obj(refusals["budget_insufficient"])
	est := obj(path(bi, "details", "estimate"))
	amount := protocol.FormatMicro(num(est["amount_micro"])) + " " + str(est["currency"])
	e, err := ParseEstimate(amount, now)
	if err != nil {
		t.Fatal(err)
	}
	requireRefusal(t, e.Refusal(""), bi)

	du := obj(refusals["deadline_unmeetable"])
	want := str(path(du, "details", "earliest_completion"))
	e, err = ParseEstimate(want, now)
	if err != nil {
		t.Fatal(err)
	}
	r := e.Refusal("back after the holiday")
	if string(r.Code) != str(du["error_code"]) {
		t.Fatalf("code %s, want %s", r.Code, du["error_code"])
	}
	if len(r.Details) != 1 {
		t.Fatalf("details %v, want only earliest_completion", r.Details)
	}
	got, _ := r.Details["earliest_completion"].(string)
	if g, err := protocol.ParseTime(got); err != nil || !g.Equal(at(want)) {
		t.Fatalf("earliest_completion %q, want the instant %s", got, want)
	}
	if r.Message != "back after the holiday" {
		t.Fatalf("message %q: the note is the message", r.Message)
	}

	// Durations land on the same instant as the fixture's.
	e, err = ParseEstimate("1h30m", now)
	if err != nil {
		t.Fatal(err)
	}
	if got := e.Refusal("").Details["earliest_completion"]; got != protocol.FormatTime(at(want)) {
		t.Fatalf("1h30m from %s gives %v, want %s", now, got, want)
	}
}

func TestEstimateRefusalDefaults(t *testing.T) {
	if r := (Estimate{}).Refusal("x"); r != nil {
		t.Fatalf("zero Estimate refused with %v", r)
	}
	r := Estimate{Kind: KindMoney, Money: usd(1)}.Refusal("   ")
	if r.Code != errs.BudgetInsufficient || r.Message == "" || strings.TrimSpace(r.Message) != r.Message {
		t.Fatalf("blank note gave %+v; want protocol's default message", r)
	}
}
