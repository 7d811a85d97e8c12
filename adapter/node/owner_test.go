package node

import (
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/registry"
)

const paidEcho = `{"sku":"echo-metered","covers":{"offerings":["echo"]},
 "price":{"model":"per_unit","currency":"XCR","meter":"tokens_out","per":1000,"amount_micro":1500,"included":{"quantity":10000,"period":"day"}},
 "provider":{"id":"internal"}}`

func mustSKU(t *testing.T, s string) commerce.SKU {
	t.Helper()
	sku, err := commerce.ParseSKU([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return sku
}

// An agent hosted with an owner key and SKUs is registered with both: the
// registry records the attested owner, and the SKUs it stored read back
// with the digests they were published with. The owner attestation lives
// as long as the vouch and is renewed with it.
func TestRegistrationCarriesOwnerAndSKUs(t *testing.T) {
	tm := newMesh(t)
	k, owner := agentKey(t), agentKey(t)
	sku := mustSKU(t, paidEcho)
	n := tm.startNode(t, nodeKey(t), []*keys.Agent{k}, nil)
	a := tm.host(t, n, AgentConfig{Key: k, Name: "seller", Offerings: []Offering{{ID: "echo"}}, Handler: refuseAll,
		AvailabilityClass: "always_on", Owner: owner, SKUs: []commerce.SKU{sku}})

	rec := tm.registered(t, k, k.Public())
	if registry.OwnerOf(rec, time.Now()) != owner.Public() {
		t.Fatalf("registered owner %v, want %s", rec["owner"], owner.Public())
	}
	skus, err := registry.SKUsOf(rec)
	if err != nil || len(skus) != 1 || skus[0].Digest() != sku.Digest() {
		t.Fatalf("registered skus %v (%v), want digest %s", rec["skus"], err, sku.Digest())
	}
	if got := a.SKUs(); len(got) != 1 || got[0].ID != sku.ID {
		t.Fatalf("Agent.SKUs %v", got)
	}
	att1, _ := rec["owner_attestation"].(map[string]any)
	v := a.Vouch()
	if att1["node"] != owner.Public() || att1["agent"] != k.Public() || att1["issued_at"] != v.IssuedAt || att1["expires_at"] != v.ExpiresAt {
		t.Fatalf("owner attestation %v, vouch %+v", att1, v)
	}

	time.Sleep(2 * time.Millisecond)
	if err := a.RevouchNow(t.Context()); err != nil {
		t.Fatal(err)
	}
	att2, _ := tm.registered(t, k, k.Public())["owner_attestation"].(map[string]any)
	if att2["sig"] == att1["sig"] || att2["expires_at"] != a.Vouch().ExpiresAt {
		t.Fatalf("owner attestation not renewed with the vouch: %v then %v", att1, att2)
	}

	// Without an owner key the node is the owner, and no SKU is published.
	k2 := agentKey(t)
	n2 := tm.startNode(t, nodeKey(t), []*keys.Agent{k2}, nil)
	tm.host(t, n2, AgentConfig{Key: k2, Name: "plain", Handler: refuseAll})
	rec2 := tm.registered(t, k2, k2.Public())
	if rec2["owner"] != n2.ID() || rec2["skus"] != nil || rec2["owner_attestation"] != nil {
		t.Fatalf("plain registration owner %v skus %v attestation %v", rec2["owner"], rec2["skus"], rec2["owner_attestation"])
	}
}

func TestCheckSKUs(t *testing.T) {
	free := mustSKU(t, `{"sku":"all","covers":{"agent":true},"price":{"model":"free"},"provider":{"id":"internal"}}`)
	paidAll := mustSKU(t, `{"sku":"all-paid","covers":{"agent":true},"price":{"model":"flat","currency":"XCR","amount_micro":5},"provider":{"id":"internal"}}`)
	other := mustSKU(t, `{"sku":"tr","covers":{"offerings":["translate"]},"price":{"model":"free"},"provider":{"id":"internal"}}`)
	echo := mustSKU(t, paidEcho)
	base := AgentConfig{Key: agentKey(t), Name: "a", Handler: refuseAll, Offerings: []Offering{{ID: "echo"}}}
	for _, tc := range []struct {
		name    string
		skus    []commerce.SKU
		sandbox bool
		says    string // "" admits
	}{
		{"none", nil, false, ""},
		{"paid over a declared offering", []commerce.SKU{echo}, false, ""},
		{"free in the sandbox", []commerce.SKU{free}, true, ""},
		{"paid in the sandbox", []commerce.SKU{echo}, true, "may not sell"},
		{"an offering not declared", []commerce.SKU{other}, false, `covers offering "translate"`},
		{"two agent-wide", []commerce.SKU{free, paidAll}, false, "both cover the whole agent"},
		{"the same id twice", []commerce.SKU{echo, echo}, false, "duplicate sku id"},
	} {
		cfg := base
		cfg.SKUs, cfg.Sandbox = tc.skus, tc.sandbox
		err := checkAgentConfig(cfg)
		switch {
		case tc.says == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.says != "" && (err == nil || !strings.Contains(err.Error(), tc.says)):
			t.Errorf("%s: %v, want it to say %q", tc.name, err, tc.says)
		}
	}
}

// The attestation is the vouch's shape, signed by the owner under the
// owner attestation's own tag: protocol's own verification accepts it, and
// it is not a vouch (review 18 #15).
func TestOwnerAttestationVerifies(t *testing.T) {
	owner, k := agentKey(t), agentKey(t)
	a := &Agent{id: k.Public(), cfg: AgentConfig{Owner: owner}}
	now := time.Now()
	v, err := protocol.NewVouch(nodeKey(t), k.Public(), now, now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	att, err := a.ownerAttestation(v)
	if err != nil || att == nil {
		t.Fatal(att, err)
	}
	if att.Node != owner.Public() || att.Agent != k.Public() || att.IssuedAt != v.IssuedAt || att.ExpiresAt != v.ExpiresAt || att.Verify(now) != nil {
		t.Fatalf("attestation %+v: %v", att, att.Verify(now))
	}
	if protocol.Vouch(*att).Verify(now) == nil {
		t.Fatal("the owner attestation verifies as a vouch by the owner")
	}
	if none, err := (&Agent{id: k.Public()}).ownerAttestation(v); none != nil || err != nil {
		t.Fatalf("no owner key: %v %v", none, err)
	}
}
