package cli_test

import (
	"testing"

	"agentmesh.dev/mesh/adapter/cli"
	"agentmesh.dev/mesh/shared/commerce"
)

func TestPriceInWords(t *testing.T) {
	for _, tc := range []struct{ price, want string }{
		{`{"model":"free"}`, "free"},
		{`{"model":"flat","currency":"USD","amount_micro":20000}`, "20,000 µUSD per request"},
		{`{"model":"per_unit","currency":"XCR","meter":"tokens_out","per":1000,"amount_micro":1500,"included":{"quantity":10000,"period":"day"}}`,
			"1,500 µXCR per 1000 tokens_out, first 10,000 a day included"},
		{`{"model":"per_unit","currency":"XCR","meter":"tool_calls","amount_micro":3}`, "3 µXCR per tool_calls"},
		{`{"model":"package","currency":"XCR","meter":"requests","size":100,"amount_micro":250000,"period":"month"}`,
			"250,000 µXCR per package of 100 requests, counted per UTC month"},
		{`{"model":"tiered","currency":"USD","meter":"t","per":1000,"period":"month","tiers":[{"up_to":100000,"amount_micro":2000},{"up_to":1000000,"amount_micro":1500},{"amount_micro":1000}]}`,
			"tiered per 1000 t, counted per UTC month: up to 100,000 at 2,000 µUSD, up to 1,000,000 at 1,500 µUSD, then 1,000 µUSD"},
	} {
		p, err := commerce.ParsePrice([]byte(tc.price))
		if err != nil {
			t.Fatalf("%s: %v", tc.price, err)
		}
		if got := cli.PriceInWords(p); got != tc.want {
			t.Errorf("%s:\n got %q\nwant %q", tc.price, got, tc.want)
		}
	}
}
