package agreements_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/agreements"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/registry"
)

// TestAgentKeyHoldsNoAgreement (review 18 #2): the owner admission takes is
// the one the real registry records, and an agent key is never an owner. A
// guest and a self-vouched agent (its own node, no owner attestation) have
// no owner, so an agreement signed by their own agent key, even one on
// file, never covers their requests: a paid offering is refused
// AGREEMENT_REQUIRED with exactly {sku, sku_digest, approval_url,
// price_credits}, saying the requester has no owner. An agent whose owner
// attested it is admitted under its owner's agreement.
func TestAgentKeyHoldsNoAgreement(t *testing.T) {
	b := bustest.Start(t)
	reg, err := registry.Start(t.Context(), bustest.Env(t, b, "registry", nil), registry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Stop() })
	agr, err := agreements.Start(t.Context(), bustest.Env(t, b, "agreements", nil), agreements.Config{ConsoleURL: "https://console.example.com/console/"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = agr.Stop() })
	nc := bustest.Client(t, b)
	ctx := func() context.Context {
		c, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		t.Cleanup(cancel)
		return c
	}
	now := time.Now()

	// A paid SKU billed by an external provider: no credits are checked,
	// so the agreement is the whole of admission.
	skuValue := map[string]any{"sku": "paid-ext", "covers": map[string]any{"offerings": []any{"paid"}},
		"price": map[string]any{"model": "flat", "currency": "USD", "amount_micro": 5_000_000}, "provider": map[string]any{"id": "acme-billing"}}
	skuBytes, _ := json.Marshal(skuValue)
	sku, err := commerce.ParseSKU(skuBytes)
	if err != nil {
		t.Fatal(err)
	}
	register := func(agent, node keys.Signer, subject string, extra map[string]any) {
		t.Helper()
		v, err := protocol.NewVouch(node, agent.Public(), now.Add(-time.Second), now.Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		var vouch map[string]any
		vb, _ := json.Marshal(v)
		_ = json.Unmarshal(vb, &vouch)
		m := map[string]any{"id": agent.Public(), "name": "a", "node": map[string]any{"id": node.Public(), "attestation": vouch},
			"offerings": []any{map[string]any{"id": "paid"}}}
		for k, x := range extra {
			m[k] = x
		}
		if _, err := bus.Call(ctx(), nc, agent, subject, protocol.TypeRegister, "", m); err != nil {
			t.Fatalf("register %s: %v", agent.Public(), err)
		}
	}
	seller := bustest.Agent(t)
	register(seller, bustest.Node(t), protocol.SubjRegister, map[string]any{"skus": []any{skuValue}})

	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	comm, err := js.KeyValue(t.Context(), commerce.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	// onFile puts signer's agreement to the SKU straight into the bucket,
	// as filed: whether mesh.agreements.file would take it is not what is
	// tested here.
	onFile := func(signer keys.Signer) {
		t.Helper()
		a := commerce.Agreement{SellerAgent: seller.Public(), SKU: sku.ID, SKUDigest: sku.Digest(), AgreedAt: protocol.FormatTime(now)}
		if err := commerce.Sign(&a, signer); err != nil {
			t.Fatal(err)
		}
		raw, _ := json.Marshal(a)
		rec, _ := json.Marshal(commerce.AgreementRecord{Agreement: raw, FiledAt: now})
		if _, err := comm.Put(t.Context(), commerce.AgreementKey(seller.Public(), signer.Public(), sku.ID), rec); err != nil {
			t.Fatal(err)
		}
	}
	admit := func(requester keys.Signer) (map[string]any, *errs.Error) {
		t.Helper()
		rep, err := bus.Call(ctx(), nc, seller, protocol.SubjCommerceAdmit, protocol.TypeRequest, "",
			map[string]any{"requester": requester.Public(), "offering": "paid", "request_id": protocol.NewID()})
		if err != nil {
			return nil, errs.As(err)
		}
		var out map[string]any
		if err := rep.DecodePayload(&out); err != nil {
			t.Fatal(err)
		}
		return out, nil
	}

	self := bustest.Agent(t)
	register(self, self, protocol.SubjRegister, nil)
	guest := bustest.Agent(t)
	register(guest, guest, protocol.SubjRegister+"."+guest.Public(), nil)
	for name, k := range map[string]keys.Signer{"self-vouched": self, "guest": guest} {
		onFile(k)
		_, e := admit(k)
		if e == nil || e.Code != errs.AgreementRequired {
			t.Fatalf("%s with an agreement signed by its own agent key: %v, want AGREEMENT_REQUIRED", name, e)
		}
		var got []string
		for m := range e.Details {
			got = append(got, m)
		}
		slices.Sort(got)
		if !slices.Equal(got, []string{"approval_url", "price_credits", "sku", "sku_digest"}) || e.Details["sku_digest"] != sku.Digest() {
			t.Fatalf("%s: details %v", name, e.Details)
		}
		if !strings.Contains(e.Message, "has no owner") {
			t.Fatalf("%s: message %q does not say the requester has no owner", name, e.Message)
		}
	}

	// An attested agent is covered by its owner's agreement, not by one its
	// own key signed.
	attested, owner, host := bustest.Agent(t), bustest.Agent(t), bustest.Node(t)
	att, err := protocol.NewOwnerAttestation(owner, attested.Public(), now.Add(-time.Second), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	var attValue map[string]any
	ab, _ := json.Marshal(att)
	_ = json.Unmarshal(ab, &attValue)
	register(attested, host, protocol.SubjRegister, map[string]any{"owner_attestation": attValue})
	onFile(attested)
	if _, e := admit(attested); e == nil || e.Code != errs.AgreementRequired || strings.Contains(e.Message, "has no owner") {
		t.Fatalf("attested agent with only its own key's agreement: %v", e)
	}
	onFile(owner)
	out, e := admit(attested)
	if e != nil || out["admitted"] != true || out["sku"] != sku.ID {
		t.Fatalf("attested agent under its owner's agreement: %v %v", out, e)
	}
}
