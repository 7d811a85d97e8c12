package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"agentmesh.dev/mesh/adapter/state"
	"agentmesh.dev/mesh/shared/commerce"
)

const chatMeteredSKU = `{"sku":"chat-metered","covers":{"offerings":["chat"]},
 "price":{"model":"per_unit","currency":"XCR","meter":"tokens_out","per":1000,"amount_micro":1500,"included":{"quantity":10000,"period":"day"}},
 "provider":{"id":"internal"}}`

// ownerOf is the owner key saved in the adapter's state.
func ownerOf(t *testing.T, dir string) string {
	t.Helper()
	d, err := state.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	id, err := d.Identity()
	if err != nil {
		t.Fatal(err)
	}
	ks, err := id.Keys()
	if err != nil {
		t.Fatal(err)
	}
	return ks.Owner.Public()
}

// A seller's adapter publishes SKUs from `up --skus`, and registers with
// its owner key's attestation; `skus` read by handle (a buyer whose adapter
// is not running) and by id (through the seller's running adapter) shows
// each SKU with the digest commerce computes, the price in words and the
// attested owner. A bad SKUs file is refused in one line and changes
// nothing.
func TestSKUsOfASeller(t *testing.T) {
	w := newMailWorld(t)
	reg := w.m.URLs().Registrar
	seller, buyer := w.state("sa"), w.state("sb")
	files := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(files, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("skus.json", "["+chatMeteredSKU+"]")
	want, err := commerce.ParseSKU([]byte(chatMeteredSKU))
	if err != nil {
		t.Fatal(err)
	}

	p, idS := w.start(seller, "--registrar-url", reg, "up", w.agentKey("caselaw"), "--skus", good)
	p.stop()
	handle := w.joinAs(seller, "ana@example.org", "caselaw", "Ana Lopez")
	p, _ = w.start(buyer, "up", w.agentKey("buyer"))
	p.stop()
	ps, _ := w.start(seller, "start", "--inbox", "--name", "caselaw")

	// The buyer's adapter is not running: it comes up for the read.
	out := w.must(buyer, "--registrar-url", reg, "skus", handle)
	for _, s := range []string{
		"caselaw (" + idS + "), owner " + ownerOf(t, seller),
		"chat-metered\n",
		"covers    offering chat",
		"price     1,500 µXCR per 1000 tokens_out, first 10,000 a day included",
		"provider  internal",
		"digest    " + want.Digest(),
	} {
		if !strings.Contains(out, s) {
			t.Errorf("skus %s does not say %q:\n%s", handle, s, out)
		}
	}
	// By id, through the seller's own running adapter, as JSON.
	var rows []map[string]any
	w.jsonOut(seller, &rows, "skus", idS, "--json")
	if len(rows) != 1 || rows[0]["sku"] != "chat-metered" || rows[0]["digest"] != want.Digest() {
		t.Fatalf("skus --json %v", rows)
	}
	price, _ := rows[0]["price"].(map[string]any)
	covers, _ := rows[0]["covers"].(map[string]any)
	provider, _ := rows[0]["provider"].(map[string]any)
	if price["model"] != "per_unit" || price["amount_micro"] != float64(1500) || covers["offerings"] == nil || provider["id"] != "internal" || len(rows[0]) != 5 {
		t.Fatalf("skus --json row %v", rows[0])
	}
	ps.stop()

	// An agent that sells nothing.
	buyerID, _ := identity(t, buyer)
	if out := w.must(seller, "skus", buyerID); !strings.Contains(out, "publishes no SKUs: every offering is free") {
		t.Fatalf("skus of the buyer: %s", out)
	}

	// Refused files: one line naming the file and the rule; skus.json stays.
	for name, tc := range map[string]struct{ body, says string }{
		"bad.json":   {`[{"sku":"Chat","covers":{"agent":true},"price":{"model":"free"},"provider":{"id":"internal"}}]`, "SKU: sku must match"},
		"other.json": {`[{"sku":"tr","covers":{"offerings":["translate"]},"price":{"model":"free"},"provider":{"id":"internal"}}]`, `covers offering "translate"`},
		"obj.json":   {`{"sku":"x"}`, "skus must be an array"},
	} {
		_, errOut, code := w.run(seller, "start", "--inbox", "--name", "caselaw", "--skus", write(name, tc.body))
		if code != 1 || !strings.Contains(errOut, tc.says) || !strings.Contains(errOut, name) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("start --skus %s: exit %d, stderr %q", name, code, errOut)
		}
	}
	if b, err := os.ReadFile(filepath.Join(seller, state.SKUsFile)); err != nil || !strings.Contains(string(b), "chat-metered") {
		t.Fatalf("skus.json after refusals: %s %v", b, err)
	}
	// --skus none stops selling: the next registration publishes none.
	p, _ = w.start(seller, "start", "--inbox", "--name", "caselaw", "--skus", "none")
	if out := w.must(buyer, "skus", idS); !strings.Contains(out, "publishes no SKUs") {
		t.Fatalf("skus after --skus none: %s", out)
	}
	p.stop()
}
