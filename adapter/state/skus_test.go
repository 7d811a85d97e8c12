package state

import (
	"os"
	"strings"
	"testing"
)

const meteredSKUs = `[{"sku":"chat-metered","covers":{"offerings":["chat"]},
 "price":{"model":"per_unit","currency":"XCR","meter":"tokens_out","per":1000,"amount_micro":1500,"included":{"quantity":10000,"period":"day"}},
 "provider":{"id":"internal"}}]`

func TestSKUsFile(t *testing.T) {
	d, err := Open(t.TempDir() + "/s")
	if err != nil {
		t.Fatal(err)
	}
	if skus, err := d.SKUs(); err != nil || skus != nil {
		t.Fatalf("no file: %v %v", skus, err)
	}
	if err := d.SaveSKUs([]byte(meteredSKUs)); err != nil {
		t.Fatal(err)
	}
	skus, err := d.SKUs()
	if err != nil || len(skus) != 1 || skus[0].ID != "chat-metered" || skus[0].Digest() == "" {
		t.Fatalf("read back %v %v", skus, err)
	}
	// A refused document is not saved over the good one.
	if err := d.SaveSKUs([]byte(`[{"sku":"X"}]`)); err == nil || !strings.Contains(err.Error(), "SKU: sku must match") {
		t.Fatalf("bad save: %v", err)
	}
	if again, _ := d.SKUs(); len(again) != 1 {
		t.Fatal("a refused document replaced skus.json")
	}
	// A damaged file says where and how to get out.
	if err := os.WriteFile(d.File(SKUsFile), []byte(`{"sku":1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := d.SKUs(); err == nil || !strings.Contains(err.Error(), "skus must be an array") || !strings.Contains(err.Error(), "--skus none") {
		t.Fatalf("damaged: %v", err)
	}
	if err := d.SaveSKUs(nil); err != nil {
		t.Fatal(err)
	}
	if skus, err := d.SKUs(); err != nil || skus != nil {
		t.Fatalf("removed: %v %v", skus, err)
	}
}

func TestParseSKUs(t *testing.T) {
	for _, tc := range []struct{ in, says string }{
		{meteredSKUs, ""},
		{`[]`, ""},
		{`not json`, "is not JSON"},
		{`[{"sku":"a","covers":{"agent":true},"price":{"model":"flat","currency":"XCR","amount_micro":1.5},"provider":{"id":"internal"}}]`, "amount_micro"},
		{`[{"sku":"a","covers":{"agent":true},"price":{"model":"free"}}]`, "provider"},
	} {
		_, err := ParseSKUs([]byte(tc.in), "f.json")
		if tc.says == "" && err != nil || tc.says != "" && (err == nil || !strings.Contains(err.Error(), tc.says) || !strings.HasPrefix(err.Error(), "f.json")) {
			t.Errorf("%s: %v, want %q", tc.in, err, tc.says)
		}
	}
}
