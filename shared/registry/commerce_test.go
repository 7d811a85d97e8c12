package registry_test

import (
	"encoding/json"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/registry"
)

// skuJSON is a paid SKU covering the offering echo.
const skuJSON = `{"sku":"echo-metered","covers":{"offerings":["echo"]},
 "price":{"model":"per_unit","currency":"XCR","meter":"tokens_out","per":1000,"amount_micro":1500,"included":{"quantity":10000,"period":"day"}},
 "provider":{"id":"internal"}}`

const freeSKUJSON = `{"sku":"echo-free","covers":{"agent":true},"price":{"model":"free"},"provider":{"id":"internal"}}`

func jsonValue(t *testing.T, s string) any {
	t.Helper()
	v, err := protocol.ParseJSON([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// ownerAttestation is owner's vouch-shaped statement that it owns agent.
func ownerAttestation(t *testing.T, owner keys.Signer, agent string, issued, expires time.Time) map[string]any {
	t.Helper()
	v, err := protocol.NewVouch(owner, agent, issued, expires)
	if err != nil {
		t.Fatal(err)
	}
	return vouchValue(t, v)
}

// TestRegisterOwnerAndSKUs: a registered manifest's record carries the
// attested owner and the SKUs as sent; get answers both, and the digest a
// reader computes from the record is the SKU's own.
func TestRegisterOwnerAndSKUs(t *testing.T) {
	f := setup(t, registry.Config{})
	a, n, owner := bustest.Agent(t), bustest.Node(t), bustest.Agent(t)
	now := time.Now()
	f.mustRegister(a, manifest(t, a, n, month, map[string]any{
		"owner":             owner.Public(),
		"owner_attestation": ownerAttestation(t, owner, a.Public(), now.Add(-time.Second), now.Add(month)),
		"skus":              jsonValue(t, "["+skuJSON+"]"),
	}))
	rec, found := f.stored(a.Public())
	if !found {
		t.Fatal("no record")
	}
	if rec["owner"] != owner.Public() || registry.OwnerOf(rec) != owner.Public() {
		t.Fatalf("record owner %v, want %s", rec["owner"], owner.Public())
	}
	got, err := registry.SKUsOf(rec)
	if err != nil || len(got) != 1 {
		t.Fatalf("record skus %v: %v", rec["skus"], err)
	}
	want, err := commerce.ParseSKU([]byte(skuJSON))
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Digest() != want.Digest() {
		t.Fatalf("stored SKU digest %s, want %s (stored as sent)", got[0].Digest(), want.Digest())
	}

	rep, err := f.call(bustest.Agent(t), protocol.SubjRegistryGetPfx+a.Public(), protocol.TypeDiscover, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep["owner"] != owner.Public() || rep["skus"] == nil {
		t.Fatalf("get answer owner %v skus %v", rep["owner"], rep["skus"])
	}

	// discover filters by owner.
	for q, wantN := range map[string]int{owner.Public(): 1, n.Public(): 0} {
		res, err := f.discover(map[string]any{"owner": q})
		if err != nil {
			t.Fatal(err)
		}
		if agents, _ := res["agents"].([]any); len(agents) != wantN {
			t.Fatalf("discover owner=%s: %d agents, want %d", q[:6], len(agents), wantN)
		}
	}
	_, err = f.discover(map[string]any{"owner": "someone"})
	wantCode(t, err, errs.InvalidQuery, "owner")
}

// TestOwnerDefaultsToTheNode: without an attestation the owner is the
// hosting node, and a claimed owner is rewritten, not believed.
func TestOwnerDefaultsToTheNode(t *testing.T) {
	f := setup(t, registry.Config{})
	for name, extra := range map[string]map[string]any{
		"no owner":         nil,
		"unattested claim": {"owner": bustest.Agent(t).Public()},
		"claim not a key":  {"owner": "me"},
	} {
		a, n := bustest.Agent(t), bustest.Node(t)
		f.mustRegister(a, manifest(t, a, n, month, extra))
		rec, _ := f.stored(a.Public())
		if rec["owner"] != n.Public() {
			t.Errorf("%s: owner %v, want the node %s", name, rec["owner"], n.Public())
		}
	}
	// A record written before owners were recorded reads as its node's.
	if got := registry.OwnerOf(map[string]any{"node": map[string]any{"id": "UNODE"}}); got != "UNODE" {
		t.Fatalf("OwnerOf without owner = %q", got)
	}
}

func TestOwnerAndSKURefusals(t *testing.T) {
	f := setup(t, registry.Config{})
	a, n, owner, other := bustest.Agent(t), bustest.Node(t), bustest.Agent(t), bustest.Agent(t)
	now := time.Now()
	att := func(signer keys.Signer, agent string, issued, expires time.Time) map[string]any {
		return ownerAttestation(t, signer, agent, issued, expires)
	}
	good := att(owner, a.Public(), now.Add(-time.Second), now.Add(month))
	forged := att(other, a.Public(), now.Add(-time.Second), now.Add(month))
	forged["node"] = owner.Public()
	withExtra := att(owner, a.Public(), now.Add(-time.Second), now.Add(month))
	withExtra["why"] = "x"

	for _, tc := range []struct {
		name  string
		extra map[string]any
		says  string
	}{
		{"expired attestation", map[string]any{"owner_attestation": att(owner, a.Public(), now.Add(-2*time.Hour), now.Add(-time.Hour))}, "expired"},
		{"attestation for another agent", map[string]any{"owner_attestation": att(owner, other.Public(), now, now.Add(month))}, "not for this manifest's id"},
		{"forged signature", map[string]any{"owner_attestation": forged}, "not signed by its owner key"},
		{"owner is not the attester", map[string]any{"owner": other.Public(), "owner_attestation": good}, "the key that signed owner_attestation"},
		{"attestation not an object", map[string]any{"owner_attestation": "yes"}, "owner_attestation must be"},
		{"attestation with unknown member", map[string]any{"owner_attestation": withExtra}, "unknown member"},
		{"attestation too long", map[string]any{"owner_attestation": att(owner, a.Public(), now, now.Add(3*month))}, "longer than"},
		{"attestation from the future", map[string]any{"owner_attestation": att(owner, a.Public(), now.Add(time.Hour), now.Add(month))}, "not valid until"},
		{"skus not an array", map[string]any{"skus": map[string]any{}}, "skus must be an array"},
		{"bad sku", map[string]any{"skus": jsonValue(t, `[{"sku":"X","covers":{"agent":true},"price":{"model":"free"},"provider":{"id":"internal"}}]`)}, "SKU: sku must match"},
		{"duplicate sku", map[string]any{"skus": jsonValue(t, "["+skuJSON+","+skuJSON+"]")}, "duplicate sku id"},
		{"sku covers an offering not offered", map[string]any{"skus": jsonValue(t, `[{"sku":"s","covers":{"offerings":["translate"]},"price":{"model":"free"},"provider":{"id":"internal"}}]`)}, `covers offering "translate"`},
		{"sku covers with no offerings at all", map[string]any{"offerings": nil, "skus": jsonValue(t, "["+skuJSON+"]")}, `covers offering "echo"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.register(a, manifest(t, a, n, month, tc.extra))
			wantCode(t, err, errs.InvalidManifest, tc.says)
			if _, found := f.stored(a.Public()); found {
				t.Fatal("a refused registration was stored")
			}
		})
	}
}

// TestSandboxMayNotSell: a guest (sandbox) registration may publish a
// free SKU but not a paid one; the same manifest on an account's node is
// listed.
func TestSandboxMayNotSell(t *testing.T) {
	f := setup(t, registry.Config{})
	paid := map[string]any{"skus": jsonValue(t, "["+skuJSON+"]")}

	g := bustest.Agent(t)
	f.lease(g)
	_, err := f.register(g, manifest(t, g, g, time.Hour, paid))
	wantCode(t, err, errs.InvalidManifest, "sandbox (guest) registration may not sell")
	if _, found := f.stored(g.Public()); found {
		t.Fatal("a guest's paid SKU was stored")
	}
	// Declared sandbox, and a bound subject: the same rule.
	s, n := bustest.Agent(t), bustest.Node(t)
	_, err = f.register(s, manifest(t, s, n, month, map[string]any{"trust_tier": "sandbox", "skus": paid["skus"]}))
	wantCode(t, err, errs.InvalidManifest, "echo-metered is paid")
	_, err = f.call(s, protocol.SubjRegister+"."+n.Public(), protocol.TypeRegister, manifest(t, s, n, month, paid))
	wantCode(t, err, errs.InvalidManifest, "sandbox")

	// Free terms are allowed in the sandbox.
	rep := f.mustRegister(g, manifest(t, g, g, time.Hour, map[string]any{"skus": jsonValue(t, "["+freeSKUJSON+"]")}))
	if rep["sandbox"] != true {
		t.Fatalf("guest answer %v", rep)
	}
	// A full node sells.
	a := bustest.Agent(t)
	if rep := f.mustRegister(a, manifest(t, a, n, month, paid)); rep["sandbox"] != false {
		t.Fatalf("account node answer %v", rep)
	}
	rec, _ := f.stored(a.Public())
	b, _ := json.Marshal(rec["skus"])
	if got, _ := commerce.SKUsFromValue(jsonValue(t, string(b))); len(got) != 1 || !got[0].Price.Paid() {
		t.Fatalf("stored skus %s", b)
	}
}
