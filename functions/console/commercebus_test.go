package console_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/functions/console"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/registry"
)

// sellerManifest is a registration of agent on node publishing skus over
// the fixture's two offerings.
func sellerManifest(t *testing.T, agent, node keys.Signer, visibility string, skus ...any) map[string]any {
	t.Helper()
	now := time.Now()
	v, err := protocol.NewVouch(node, agent.Public(), now.Add(-time.Second), now.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(v)
	var vouch map[string]any
	_ = json.Unmarshal(b, &vouch)
	return map[string]any{
		"id": agent.Public(), "name": "seller " + agent.Public()[:6], "description": "a seller", "version": "1.0.0",
		"protocol_version": protocol.Version, "endpoint": protocol.InboxSubject(agent.Public()), "visibility": visibility,
		"node":         map[string]any{"id": node.Public(), "attestation": vouch},
		"capabilities": []any{"law"},
		"offerings":    []any{map[string]any{"id": "caselaw-summary", "name": "Summary"}, map[string]any{"id": "caselaw-cite-check", "name": "Cite check"}},
		"skus":         skus,
	}
}

// BusCommerce reads what the pages show from a real registry worker and
// the commerce bucket on a real broker: a registration's SKUs as stored,
// the public listing (not the unlisted or private ones), a private
// registration as none, and an owner's agreements only, live ones only,
// with a bucket not made yet holding none.
func TestBusCommerceReadsTheBus(t *testing.T) {
	m := bustest.Start(t)
	w, err := registry.Start(t.Context(), bustest.Env(t, m, "registry", nil), registry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop() })
	nc := bustest.Client(t, m)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	c := &console.BusCommerce{Bus: &bus.Caller{NC: nc, Key: m.ServicesKey()}, JS: js}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()

	sku, digest := caselawSKU(t, 1500)
	node := bustest.Node(t)
	public, unlisted, private := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)
	for _, a := range []struct {
		k   *keys.Agent
		vis string
	}{{public, "public"}, {unlisted, "unlisted"}, {private, "private"}} {
		if _, err := bus.Call(ctx, nc, a.k, protocol.SubjRegister, protocol.TypeRegister, "", sellerManifest(t, a.k, node, a.vis, sku)); err != nil {
			t.Fatalf("register %s: %v", a.vis, err)
		}
	}

	for _, a := range []*keys.Agent{public, unlisted} {
		rec, err := c.Agent(ctx, a.Public())
		if err != nil || rec == nil {
			t.Fatalf("get %s: %v %v", a.Public(), rec, err)
		}
		skus, err := commerce.SKUsFromValue(rec["skus"])
		if err != nil || len(skus) != 1 || skus[0].Digest() != digest {
			t.Errorf("the SKUs of %s as read: %v %v", a.Public(), skus, err)
		}
	}
	for _, a := range []string{private.Public(), bustest.Agent(t).Public(), "not-a-key"} {
		if rec, err := c.Agent(ctx, a); rec != nil || err != nil {
			t.Errorf("get %s: %v %v, want none", a, rec, err)
		}
	}
	recs, complete, err := c.Listing(ctx)
	if err != nil || !complete || len(recs) != 1 || recs[0]["id"] != public.Public() {
		t.Fatalf("listing: %v %v %v", recs, complete, err)
	}

	owner, other := bustest.Agent(t).Public(), bustest.Agent(t).Public()
	if held, err := c.Agreements(ctx, owner); held != nil || err != nil {
		t.Fatalf("before the bucket is made: %v %v", held, err)
	}
	kv, err := js.CreateKeyValue(ctx, commerce.BucketConfig(1))
	if err != nil {
		t.Fatal(err)
	}
	filed := time.Now().UTC().Truncate(time.Second)
	put := func(seller, who, sku string) {
		b, _ := json.Marshal(commerce.AgreementRecord{Agreement: json.RawMessage(`{"v":1}`), FiledAt: filed})
		if _, err := kv.Put(ctx, commerce.AgreementKey(seller, who, sku), b); err != nil {
			t.Fatal(err)
		}
	}
	put(public.Public(), owner, "caselaw-metered")
	put(unlisted.Public(), owner, "caselaw-metered")
	put(unlisted.Public(), owner, "withdrawn-later")
	put(public.Public(), other, "caselaw-metered")
	if _, err := kv.Put(ctx, commerce.EngagementKey(public.Public(), owner, "caselaw-summary"), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(ctx, commerce.AgreementKey(unlisted.Public(), owner, "withdrawn-later")); err != nil {
		t.Fatal(err)
	}
	held, err := c.Agreements(ctx, owner)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, h := range held {
		if h.Owner != owner || !h.Record.FiledAt.Equal(filed) || string(h.Record.Agreement) != `{"v":1}` {
			t.Errorf("held %+v", h)
		}
		got = append(got, h.Seller+"/"+h.SKU)
	}
	slices.Sort(got)
	want := []string{public.Public() + "/caselaw-metered", unlisted.Public() + "/caselaw-metered"}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("agreements of the owner: %v, want %v", got, want)
	}
	if a, err := c.HandleAgent(ctx, "law.ana@example.org"); a != "" || err != nil {
		t.Errorf("a handle without a registrar: %q %v", a, err)
	}
}

// On meshd (devenv), the console reads the real registry with the control
// plane's bus connection: the address an AGREEMENT_REQUIRED names, on the
// console's host, forwards to the approval page, which shows the seller
// registered with the SKU, its digest and the command; the seller's
// offers page lists it; the signed-in agreements page answers.
func TestConsoleCommerceOnMeshd(t *testing.T) {
	w := startWorld(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	sku, digest := caselawSKU(t, 1500)
	seller, node := bustest.Agent(t), bustest.Node(t)
	if _, err := bus.Call(ctx, w.m.Control().Bus.NC, seller, protocol.SubjRegister, protocol.TypeRegister, "",
		sellerManifest(t, seller, node, "public", sku)); err != nil {
		t.Fatalf("register: %v", err)
	}
	b := newBrowser(t, w.console)
	approval := commerce.ApprovalURL(b.origin, mustSKU(t, sku))
	first := b.get(approval)
	if first.status != http.StatusFound || first.location != "/console/agreements/approve?sku=caselaw-metered" {
		t.Fatalf("%s: %d %q", approval, first.status, first.location)
	}
	page := b.get(first.location)
	if page.status != 200 || !strings.Contains(page.body, `class="agree-command">mesh-adapter agree `+seller.Public()+` caselaw-metered --digest `+digest+`<`) ||
		!strings.Contains(page.body, `class="id digest">`+digest+`<`) {
		t.Fatalf("approval page: %d\n%s", page.status, text(page))
	}
	if page := b.get("offers/" + seller.Public()); page.status != 200 || !strings.Contains(page.body, digest) ||
		!strings.Contains(text(page), "0.0015 USD per 1000 tokens_out.") {
		t.Errorf("offers page: %d\n%s", page.status, text(page))
	}
	b.signIn(w, "ana@example.org")
	if page := b.get("agreements"); page.status != 200 ||
		!strings.Contains(text(page), "None of your agents is registered now, so no owner key is known to hold agreements.") {
		t.Errorf("agreements page: %d\n%s", page.status, text(page))
	}
}
