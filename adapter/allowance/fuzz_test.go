package allowance

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// Command-line amounts and estimates, and the ledger file, are untrusted
// input: the decoders must never panic, and what they accept must satisfy
// the invariants the rest of the adapter relies on.

var moneySeeds = []string{
	"$5.00", "$5", "5.00 EUR", "EUR 5.00", "5.00", "5", "", "-5 USD", "$-5", "-$5",
	"$5.1234567", "$0.000001", "9007199254.740991 USD", "9007199254.740992 USD",
	"$ 5", "$5 USD", "5 eur", "$.5", "$5.", "1e3 USD", "$１", "2h", "2026-07-27T17:30:00Z",
}

func FuzzParseMoney(f *testing.F) {
	for _, s := range moneySeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseMoney(s)
		in := strings.TrimSpace(s)
		if isBareNumber(in) && !strings.HasPrefix(in, "-") && !errors.Is(err, ErrAmbiguous) {
			t.Fatalf("bare number %q: err %v, want ErrAmbiguous", s, err)
		}
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		if !protocol.IsCurrency(m.Currency) || m.AmountMicro < 0 || m.AmountMicro > protocol.MaxSafeInteger {
			t.Fatalf("%q accepted as %+v", s, m)
		}
		// What is accepted renders and reads back exactly.
		back, err := ParseMoney(protocol.FormatMicro(m.AmountMicro) + " " + m.Currency)
		if err != nil || back != m {
			t.Fatalf("%q → %+v → %q → %+v, %v", s, m, m.String(), back, err)
		}
	})
}

func FuzzParseEstimate(f *testing.F) {
	for _, s := range append(moneySeeds, "90m", "1h30m", "-2h", "0s", "2026-07-27", "2026-07-27T12:00:00-05:00", "1h 30m") {
		f.Add(s)
	}
	now := at("2026-07-27T16:00:00Z")
	f.Fuzz(func(t *testing.T, s string) {
		e, err := ParseEstimate(s, now)
		if isBareNumber(strings.TrimSpace(s)) && err == nil {
			t.Fatalf("bare number %q accepted as %+v", s, e)
		}
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		r := e.Refusal("")
		switch e.Kind {
		case KindMoney:
			if e.Money.AmountMicro <= 0 || !protocol.IsCurrency(e.Money.Currency) || r.Code != errs.BudgetInsufficient {
				t.Fatalf("%q accepted as %+v with refusal %v", s, e, r)
			}
		case KindTime:
			if !e.Earliest.After(now) || e.Earliest.Location() != time.UTC || r.Code != errs.DeadlineUnmeetable {
				t.Fatalf("%q accepted as %+v with refusal %v", s, e, r)
			}
		default:
			t.Fatalf("%q accepted with kind %q", s, e.Kind)
		}
	})
}

func FuzzDecodeLedger(f *testing.F) {
	f.Add([]byte(`{"v":1,"spent":[{"scope":"day","key":"2026-07-28","currency":"USD","amount_micro":5}]}`))
	f.Add([]byte(`{"v":1,"spent":[]}`))
	f.Add([]byte(`{"v":1,"spent":[{"scope":"task","key":"t","currency":"USD","amount_micro":1.5}]}`))
	f.Add([]byte(`{"v":1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		l, err := decodeLedger(data)
		if err != nil {
			return
		}
		for k, v := range l.spent {
			if k.key == "" || v < 0 || !protocol.IsCurrency(k.currency) {
				t.Fatalf("accepted entry %+v = %d", k, v)
			}
		}
		// Whatever is accepted re-encodes to a fixpoint.
		b1, err := l.encode()
		if err != nil {
			t.Fatal(err)
		}
		l2, err := decodeLedger(b1)
		if err != nil {
			t.Fatalf("re-encoded ledger refused: %v\n%s", err, b1)
		}
		b2, _ := l2.encode()
		if !bytes.Equal(b1, b2) {
			t.Fatalf("encoding is not stable:\n%s\n%s", b1, b2)
		}
	})
}
