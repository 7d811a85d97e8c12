package commerce_test

import (
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/metering"
	"agentmesh.dev/mesh/shared/protocol"
)

const meteredSKU = `{"sku":"caselaw-metered","covers":{"offerings":["caselaw-summary","caselaw-cite-check"]},
 "price":{"model":"per_unit","currency":"USD","meter":"tokens_out","per":1000,"amount_micro":1500,"included":{"quantity":10000,"period":"day"}},
 "provider":{"id":"internal","terms_url":"https://example.com/agent-terms/v3"}}`

func mustSKU(t *testing.T, s string) commerce.SKU {
	t.Helper()
	sku, err := commerce.ParseSKU([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return sku
}

func mustKey(t *testing.T) *keys.Agent {
	t.Helper()
	k, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// The digest is the commerce.json vector, and any change to the terms moves
// it, including one the price model does not rate (the terms URL).
func TestDigestIsTheTerms(t *testing.T) {
	base := mustSKU(t, meteredSKU)
	if base.Digest() != "LQGAJJ9tQ7U185dmHGSztJzvPN55p_V_j-XcauUNDKk" {
		t.Fatalf("digest %s", base.Digest())
	}
	for _, change := range [][2]string{
		{`"amount_micro":1500`, `"amount_micro":1501`},
		{`"quantity":10000`, `"quantity":10001`},
		{`agent-terms/v3`, `agent-terms/v4`},
		{`"caselaw-cite-check"]`, `"caselaw-cite-check","extra"]`},
	} {
		moved := mustSKU(t, strings.Replace(meteredSKU, change[0], change[1], 1))
		if moved.Digest() == base.Digest() {
			t.Errorf("changing %s to %s kept the digest", change[0], change[1])
		}
	}
	// Whitespace and member order are not terms.
	same := mustSKU(t, `{"provider":{"terms_url":"https://example.com/agent-terms/v3","id":"internal"},"sku":"caselaw-metered",
	 "price":{"included":{"period":"day","quantity":10000},"amount_micro":1500,"per":1000,"meter":"tokens_out","currency":"USD","model":"per_unit"},
	 "covers":{"offerings":["caselaw-summary","caselaw-cite-check"]}}`)
	if same.Digest() != base.Digest() {
		t.Error("re-ordering members moved the digest")
	}
}

func TestSKURefusals(t *testing.T) {
	for name, s := range map[string]string{
		"unknown member":       strings.Replace(meteredSKU, `"sku":`, `"note":"x","sku":`, 1),
		"agent false":          `{"sku":"x","covers":{"agent":false},"price":{"model":"free"},"provider":{"id":"internal"}}`,
		"duplicate offering":   `{"sku":"x","covers":{"offerings":["a","a"]},"price":{"model":"free"},"provider":{"id":"internal"}}`,
		"checkout not a URL":   `{"sku":"x","covers":{"agent":true},"price":{"model":"free"},"provider":{"id":"stripe","checkout_url":"pay here"}}`,
		"per zero":             strings.Replace(meteredSKU, `"per":1000`, `"per":0`, 1),
		"included period week": strings.Replace(meteredSKU, `"period":"day"`, `"period":"week"`, 1),
		"tier unknown member":  `{"sku":"x","covers":{"agent":true},"price":{"model":"tiered","currency":"USD","meter":"m","period":"month","tiers":[{"amount_micro":1,"note":"x"}]},"provider":{"id":"internal"}}`,
		"empty tiers":          `{"sku":"x","covers":{"agent":true},"price":{"model":"tiered","currency":"USD","meter":"m","period":"month","tiers":[]},"provider":{"id":"internal"}}`,
	} {
		if _, err := commerce.ParseSKU([]byte(s)); errs.CodeOf(err) != errs.InvalidManifest {
			t.Errorf("%s: %v, want INVALID_MANIFEST", name, err)
		}
	}
}

func TestManifestCoverageIsUnambiguous(t *testing.T) {
	parse := func(list string) error {
		v, err := protocol.ParseJSON([]byte(list))
		if err != nil {
			t.Fatal(err)
		}
		_, err = commerce.SKUsFromValue(v)
		return err
	}
	wide := func(id string) string {
		return `{"sku":"` + id + `","covers":{"agent":true},"price":{"model":"flat","currency":"USD","amount_micro":1},"provider":{"id":"internal"}}`
	}
	named := func(id, off string) string {
		return `{"sku":"` + id + `","covers":{"offerings":["` + off + `"]},"price":{"model":"free"},"provider":{"id":"internal"}}`
	}
	if err := parse(`[` + wide("w") + `,` + named("a", "x") + `,` + named("b", "y") + `]`); err != nil {
		t.Fatal(err)
	}
	for name, list := range map[string]string{
		"duplicate id":       `[` + named("a", "x") + `,` + named("a", "y") + `]`,
		"two agent-wide":     `[` + wide("w") + `,` + wide("v") + `]`,
		"offering twice":     `[` + named("a", "x") + `,` + named("b", "x") + `]`,
		"not an array":       wide("w"),
		"an invalid element": `[` + named("A", "x") + `]`,
	} {
		if err := parse(list); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestForMostSpecificWins(t *testing.T) {
	wide := mustSKU(t, `{"sku":"all","covers":{"agent":true},"price":{"model":"flat","currency":"USD","amount_micro":1},"provider":{"id":"internal"}}`)
	one := mustSKU(t, meteredSKU)
	skus := []commerce.SKU{wide, one}
	if s, ok := commerce.For(skus, "caselaw-summary"); !ok || s.ID != one.ID {
		t.Fatalf("named offering: %s %v", s.ID, ok)
	}
	if s, ok := commerce.For(skus, "other"); !ok || s.ID != wide.ID {
		t.Fatalf("other offering: %s %v", s.ID, ok)
	}
	if _, ok := commerce.For([]commerce.SKU{one}, "other"); ok {
		t.Fatal("an offering no SKU covers is free")
	}
}

func signed(t *testing.T, owner *keys.Agent, seller string, s commerce.SKU, expires string) commerce.Agreement {
	t.Helper()
	a := commerce.Agreement{SellerAgent: seller, SKU: s.ID, SKUDigest: s.Digest(), AgreedAt: "2026-08-02T15:00:00Z", ExpiresAt: expires,
		Evidence: &commerce.Evidence{Provider: commerce.ProviderInternal, Ref: "console-1"}}
	if err := commerce.Sign(&a, owner); err != nil {
		t.Fatal(err)
	}
	return a
}

func TestAgreementSignVerifyRoundTrip(t *testing.T) {
	owner, seller := mustKey(t), mustKey(t)
	a := signed(t, owner, seller.Public(), mustSKU(t, meteredSKU), "")
	b, err := protocol.Canonical(a)
	if err != nil {
		t.Fatal(err)
	}
	back, err := commerce.ParseAgreement(b)
	if err != nil || back.Verify() != nil || back.Sig != a.Sig {
		t.Fatalf("round trip: %+v %v", back, err)
	}
	back.SKU = "other-sku"
	if errs.CodeOf(back.Verify()) != errs.IdentityMismatch {
		t.Fatal("a changed SKU still verifies")
	}
	unsigned := a
	unsigned.Sig = ""
	if errs.CodeOf(unsigned.Verify()) != errs.IdentityMismatch {
		t.Fatal("an unsigned agreement verifies")
	}
	bad := a
	bad.SKUDigest = "short"
	if err := commerce.Sign(&bad, owner); err == nil {
		t.Fatal("signed an agreement to no digest")
	}
}

// The admission matrix of issue 18: free, paid without agreement, stale
// digest, expired, another seller, another owner, a forged agreement, and
// the covered case.
func TestAdmitMatrix(t *testing.T) {
	owner, otherOwner, seller, otherSeller := mustKey(t), mustKey(t), mustKey(t), mustKey(t)
	sku := mustSKU(t, meteredSKU)
	repriced := mustSKU(t, strings.Replace(meteredSKU, `"amount_micro":1500`, `"amount_micro":1501`, 1))
	free := mustSKU(t, `{"sku":"free-with-terms","covers":{"offerings":["free-one"]},"price":{"model":"free"},"provider":{"id":"internal","terms_url":"https://example.com/t"}}`)
	now, _ := protocol.ParseTime("2026-08-03T00:00:00Z")
	good := signed(t, owner, seller.Public(), sku, "")
	expired := signed(t, owner, seller.Public(), sku, "2026-08-03T00:00:00Z") // expires exactly now
	forged := good
	forged.ExpiresAt = "2099-01-01T00:00:00Z" // a term added after signing
	approval := func(s commerce.SKU) string { return commerce.ApprovalURL("https://console.example.com", s) }
	for _, c := range []struct {
		name       string
		catalog    []commerce.SKU
		agreements []commerce.Agreement
		owner      string
		offering   string
		refused    bool
	}{
		{"offering no SKU covers", []commerce.SKU{sku}, nil, owner.Public(), "other", false},
		{"free SKU", []commerce.SKU{sku, free}, nil, owner.Public(), "free-one", false},
		{"paid, no agreement", []commerce.SKU{sku}, nil, owner.Public(), "caselaw-summary", true},
		{"paid, agreement", []commerce.SKU{sku}, []commerce.Agreement{good}, owner.Public(), "caselaw-summary", false},
		{"re-priced: stale digest", []commerce.SKU{repriced}, []commerce.Agreement{good}, owner.Public(), "caselaw-summary", true},
		{"expired at this instant", []commerce.SKU{sku}, []commerce.Agreement{expired}, owner.Public(), "caselaw-summary", true},
		{"another owner's agreement", []commerce.SKU{sku}, []commerce.Agreement{good}, otherOwner.Public(), "caselaw-summary", true},
		{"requester without an owner", []commerce.SKU{sku}, []commerce.Agreement{good}, "", "caselaw-summary", true},
		{"forged agreement", []commerce.SKU{sku}, []commerce.Agreement{forged}, owner.Public(), "caselaw-summary", true},
	} {
		d := commerce.Admit(c.catalog, c.agreements, commerce.Request{Seller: seller.Public(), ConsumerOwner: c.owner, Offering: c.offering, Now: now}, approval)
		if (d.Refusal != nil) != c.refused {
			t.Errorf("%s: refusal %v, want refused=%v", c.name, d.Refusal, c.refused)
			continue
		}
		if d.Refusal == nil {
			continue
		}
		r := d.Refusal
		s, _ := commerce.For(c.catalog, c.offering)
		if r.Code != errs.AgreementRequired || r.Retryable || r.Details["sku"] != s.ID || r.Details["sku_digest"] != s.Digest() ||
			r.Details["approval_url"] != "https://console.example.com/agreements/approve?sku="+s.ID || len(r.Details) != 3 {
			t.Errorf("%s: refusal %+v", c.name, r)
		}
	}
	// An agreement for another seller's agent covers nothing here.
	d := commerce.Admit([]commerce.SKU{sku}, []commerce.Agreement{good}, commerce.Request{Seller: otherSeller.Public(),
		ConsumerOwner: owner.Public(), Offering: "caselaw-summary", Now: now}, approval)
	if d.Refusal == nil {
		t.Error("an agreement with one seller covered another")
	}
}

func TestApprovalURLAndPrice(t *testing.T) {
	ext := mustSKU(t, `{"sku":"x","covers":{"agent":true},"price":{"model":"flat","currency":"XCR","amount_micro":5},
	 "provider":{"id":"stripe","checkout_url":"https://pay.example/x"}}`)
	if got := commerce.ApprovalURL("https://console.test", ext); got != "https://pay.example/x" {
		t.Fatalf("checkout provider's approval URL %s", got)
	}
	price := int64(5)
	r := commerce.AgreementRequired(commerce.Required{SKU: "x", SKUDigest: ext.Digest(), ApprovalURL: "u", PriceCredits: &price})
	if r.Details["price_credits"] != int64(5) || len(r.Details) != 4 || !strings.Contains(r.Message, "approve it at u") {
		t.Fatalf("refusal %+v", r)
	}
}

func TestRate(t *testing.T) {
	ceiling := int64(5000)
	usage := func(meter string, q ...int64) []metering.Event {
		var out []metering.Event
		for _, x := range q {
			out = append(out, metering.Event{Meter: meter, Quantity: x})
		}
		return out
	}
	for _, c := range []struct {
		name   string
		price  string
		events []metering.Event
		o      commerce.RateOptions
		want   int64
	}{
		{"flat, refusal rates zero", `{"model":"flat","currency":"USD","amount_micro":20000}`,
			append(usage("requests", 1, 1), metering.Event{Meter: "requests", Refused: true}), commerce.RateOptions{Agreed: true}, 40000},
		{"per_unit floors", `{"model":"per_unit","currency":"USD","meter":"tokens_out","per":1000,"amount_micro":1500}`,
			usage("tokens_out", 999), commerce.RateOptions{Agreed: true}, 1498},
		{"per_unit aggregates the window then floors", `{"model":"per_unit","currency":"USD","meter":"tokens_out","per":1000,"amount_micro":1500}`,
			usage("tokens_out", 500, 499), commerce.RateOptions{Agreed: true}, 1498},
		{"other meters are not this price's", `{"model":"per_unit","currency":"USD","meter":"tokens_out","amount_micro":2}`,
			append(usage("tokens_out", 10), usage("tool_calls", 100)...), commerce.RateOptions{Agreed: true}, 20},
		{"package rounds up", `{"model":"package","currency":"USD","meter":"requests","size":100,"amount_micro":250000,"period":"day"}`,
			usage("requests", 101), commerce.RateOptions{Agreed: true}, 500000},
		{"package, nothing used", `{"model":"package","currency":"USD","meter":"requests","size":100,"amount_micro":250000,"period":"day"}`,
			nil, commerce.RateOptions{Agreed: true}, 0},
		{"tiered within the first band", `{"model":"tiered","currency":"USD","meter":"t","per":1000,"period":"month","tiers":[{"up_to":100000,"amount_micro":2000},{"amount_micro":1000}]}`,
			usage("t", 1500), commerce.RateOptions{Agreed: true}, 3000},
		{"tiered floors per band", `{"model":"tiered","currency":"USD","meter":"t","per":1000,"period":"month","tiers":[{"up_to":1,"amount_micro":999},{"amount_micro":999}]}`,
			usage("t", 2), commerce.RateOptions{Agreed: true}, 0},
		{"included covers part", `{"model":"per_unit","currency":"USD","meter":"t","amount_micro":3,"included":{"quantity":10,"period":"day"}}`,
			usage("t", 12), commerce.RateOptions{Agreed: true}, 6},
		{"ceiling clamps", `{"model":"per_unit","currency":"USD","meter":"t","amount_micro":1000}`,
			usage("t", 8), commerce.RateOptions{Agreed: true, CeilingMicro: &ceiling}, 5000},
		{"no agreement, no charge", `{"model":"flat","currency":"USD","amount_micro":20000}`,
			usage("requests", 3), commerce.RateOptions{}, 0},
		{"free", `{"model":"free"}`, usage("requests", 3), commerce.RateOptions{Agreed: true}, 0},
	} {
		p, err := commerce.ParsePrice([]byte(c.price))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got, err := commerce.Rate(p, c.events, c.o)
		if err != nil || got != c.want {
			t.Errorf("%s: %d (%v), want %d", c.name, got, err, c.want)
		}
	}
	huge, _ := commerce.ParsePrice([]byte(`{"model":"per_unit","currency":"USD","meter":"t","amount_micro":9007199254740991}`))
	if _, err := commerce.Rate(huge, usage("t", 9007199254740991), commerce.RateOptions{Agreed: true}); err == nil {
		t.Error("a charge beyond 2^53 was not refused")
	}
}

func TestPeriodKey(t *testing.T) {
	at := time.Date(2026, 8, 31, 23, 30, 0, 0, time.FixedZone("x", -2*3600)) // 01:30 UTC on 1 September
	if got := commerce.PeriodKey(commerce.PeriodDay, at); got != "2026-09-01" {
		t.Errorf("day %s", got)
	}
	if got := commerce.PeriodKey(commerce.PeriodMonth, at); got != "2026-09" {
		t.Errorf("month %s", got)
	}
}

// A responder's signed receipt, lifted into declared events and rated: the
// path from payload.usage to a charge.
func TestRateASignedReceipt(t *testing.T) {
	responder, requester := mustKey(t), mustKey(t)
	e, err := protocol.New(protocol.TypeRespond, responder.Public(), map[string]any{"status": "completed",
		"usage": []any{map[string]any{"meter": "tokens_out", "quantity": 4210}, map[string]any{"meter": "tool_calls", "quantity": 3}}})
	if err != nil {
		t.Fatal(err)
	}
	e.To = requester.Public()
	if err := e.Sign(responder); err != nil {
		t.Fatal(err)
	}
	wire, _ := e.Marshal()
	env, err := protocol.Decode(wire)
	if err != nil {
		t.Fatal(err)
	}
	r, err := metering.ReceiptFrom(env)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := commerce.ParsePrice([]byte(`{"model":"per_unit","currency":"USD","meter":"tokens_out","per":1000,"amount_micro":1500}`))
	got, err := commerce.Rate(p, r.Events("caselaw-summary"), commerce.RateOptions{Agreed: true})
	if err != nil || got != 6315 {
		t.Fatalf("charge %d (%v), want 6315", got, err)
	}
	// Redelivered, the same receipt folds to the same quantities.
	if totals := metering.Fold(append(r.Events(""), r.Events("")...)); totals["tokens_out"] != 4210 {
		t.Fatalf("fold %v", totals)
	}
}
