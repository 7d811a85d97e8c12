package cli

import (
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/protocol"
)

func TestPriceText(t *testing.T) {
	for _, c := range []struct {
		price string
		want  string
	}{
		{`{"model":"free"}`, "free"},
		{`{"model":"flat","currency":"XCR","amount_micro":250000}`, "0.25 XCR per request"},
		{`{"model":"per_unit","currency":"USD","meter":"tokens_out","per":1000,"amount_micro":1500}`, "0.0015 USD per 1000 tokens_out"},
		{`{"model":"per_unit","currency":"XCR","meter":"tool_calls","amount_micro":10}`, "0.00001 XCR per tool_calls"},
		{`{"model":"package","currency":"XCR","meter":"pages","size":100,"amount_micro":2000000,"period":"month"}`, "2.00 XCR per 100 pages per month"},
		{`{"model":"tiered","currency":"XCR","meter":"tokens_out","per":1000,"period":"month","tiers":[{"up_to":1000000,"amount_micro":1000},{"amount_micro":500}]}`, "tiered, from 0.001 XCR per 1000 tokens_out"},
		{`{"model":"barter"}`, "an unreadable price"},
	} {
		v, err := protocol.ParseJSON([]byte(c.price))
		if err != nil {
			t.Fatal(err)
		}
		if got := PriceText(v); got != c.want {
			t.Errorf("%s: %q, want %q", c.price, got, c.want)
		}
	}
}

func TestParseExpires(t *testing.T) {
	now := time.Date(2026, 11, 25, 4, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		in, want string
		bad      bool
	}{
		{in: "", want: ""},
		{in: "30d", want: "2026-12-25T04:00:00.000Z"},
		{in: "90m", want: "2026-11-25T05:30:00.000Z"},
		{in: "2027-01-01T00:00:00Z", want: "2027-01-01T00:00:00.000Z"},
		{in: "2026-01-01T00:00:00Z", bad: true}, // past
		{in: "0d", bad: true},
		{in: "-1h", bad: true},
		{in: "yesterday", bad: true},
		{in: "99999d", bad: true},
	} {
		got, err := parseExpires(c.in, now)
		if (err != nil) != c.bad || (!c.bad && got != c.want) {
			t.Errorf("%q: %q %v", c.in, got, err)
		}
	}
}
