package clearing

import (
	"context"
	"regexp"
	"testing"
	"time"
)

func TestSplitOf(t *testing.T) {
	for _, c := range []struct {
		name                   string
		rate                   int64
		pct                    int
		resale                 bool
		retail, markup, seller int64
	}{
		// Own SKU: the buyer pays the declared price, the seller's owner
		// receives all of it, the operator takes nothing.
		{"own sku", 1_000_000, 10, false, 1_000_000, 0, 1_000_000},
		// Resale: retail = rate + floor(rate × 10 / 100).
		{"resale 10%", 1_000_000, 10, true, 1_100_000, 100_000, 1_000_000},
		{"resale floors", 999, 10, true, 1_098, 99, 999}, // 99.9 → 99
		{"resale under one micro", 9, 10, true, 9, 0, 9}, // 0.9 → 0
		{"resale 0%", 1_000_000, 0, true, 1_000_000, 0, 1_000_000},
		{"zero rate", 0, 10, true, 0, 0, 0},
		{"resale 15%", 333_333, 15, true, 383_332, 49_999, 333_333}, // 49,999.95 → 49,999
	} {
		s, err := SplitOf(c.rate, c.pct, c.resale)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if s.Retail != c.retail || s.Markup != c.markup || s.Rate != c.seller {
			t.Errorf("%s: got retail %d markup %d rate %d, want %d %d %d", c.name, s.Retail, s.Markup, s.Rate, c.retail, c.markup, c.seller)
		}
		if s.Retail != s.Rate+s.Markup {
			t.Errorf("%s: retail is not rate + markup", c.name)
		}
	}
	if _, err := SplitOf(1<<53, 10, true); err == nil {
		t.Error("a rate beyond 2^53-1 must be refused")
	}
	if _, err := SplitOf(1<<53-1, 10, true); err == nil {
		t.Error("a retail beyond 2^53-1 must be refused")
	}
	if _, err := SplitOf(-1, 10, false); err == nil {
		t.Error("a negative rate must be refused")
	}
}

func TestApportion(t *testing.T) {
	resale, _ := SplitOf(1_000_000, 10, true)
	own, _ := SplitOf(1_000_000, 10, false)
	for _, c := range []struct {
		name                       string
		s                          Split
		charged                    int64
		toSeller, platform, unpaid int64
	}{
		{"resale paid in full", resale, 1_100_000, 1_000_000, 100_000, 0},
		// A short balance pays the seller's owner first, then the platform.
		{"resale short, seller whole", resale, 1_050_000, 1_000_000, 50_000, 50_000},
		{"resale short, seller partly", resale, 300_000, 300_000, 0, 800_000},
		{"resale empty balance", resale, 0, 0, 0, 1_100_000},
		{"own paid", own, 1_000_000, 1_000_000, 0, 0},
		{"own short", own, 400_000, 400_000, 0, 600_000},
		{"more than retail is retail", own, 2_000_000, 1_000_000, 0, 0},
	} {
		s, p, u := c.s.Apportion(c.charged)
		if s != c.toSeller || p != c.platform || u != c.unpaid {
			t.Errorf("%s: got seller %d platform %d unpaid %d, want %d %d %d", c.name, s, p, u, c.toSeller, c.platform, c.unpaid)
		}
	}
}

// tokenShape is a KV key token (commerce.KeyToken's output).
var tokenShape = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

func TestKeyToken(t *testing.T) {
	id := "0198e3c2-7a4b-7c3d-8e9f-0a1b2c3d4e5f"
	if KeyToken(id) != id {
		t.Errorf("a UUID is its own token: %s", KeyToken(id))
	}
	for _, bad := range []string{"a.b", "a b", "*", ">", ""} {
		tok := KeyToken(bad)
		if !tokenShape.MatchString(tok) || tok == bad || len(tok) != 2+64 {
			t.Errorf("%q: token %q", bad, tok)
		}
	}
	if KeyToken("a.b") == KeyToken("a_b") {
		t.Error("two ids, one token")
	}
}

func TestSellerCache(t *testing.T) {
	var c sellerCache
	loads := 0
	load := func(context.Context, string) (seller, error) { loads++; return seller{sells: true}, nil }
	t0 := time.Unix(1_000_000, 0)
	for _, at := range []time.Time{t0, t0.Add(sellerTTL - time.Millisecond)} {
		if s, err := c.get(context.Background(), "a", at, load); err != nil || !s.sells {
			t.Fatal(s, err)
		}
	}
	if loads != 1 {
		t.Fatalf("%d loads within the TTL", loads)
	}
	_, _ = c.get(context.Background(), "a", t0.Add(sellerTTL), load)
	_, _ = c.get(context.Background(), "b", t0.Add(sellerTTL), load)
	if loads != 3 {
		t.Fatalf("%d loads: an expired entry and another agent are read again", loads)
	}
	// A clock that went back reads again rather than trust the entry.
	_, _ = c.get(context.Background(), "a", t0, load)
	if loads != 4 {
		t.Fatalf("%d loads", loads)
	}
}
