package cli_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/adapter/daemon"
	"agentmesh.dev/mesh/adapter/node"
	"agentmesh.dev/mesh/adapter/state"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/keys"
)

// wholeAgentSKU is the seller's whole-agent SKU at amount micro-credits a
// request.
func wholeAgentSKU(t *testing.T, amount int64) commerce.SKU {
	t.Helper()
	s, err := commerce.ParseSKU(fmt.Appendf(nil, `{"sku":"whole-agent","covers":{"agent":true},"price":{"model":"flat","currency":"XCR","amount_micro":%d},"provider":{"id":"internal"}}`, amount))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A seller re-prices between the refusal and agree: agree --digest (the
// command send suggests) signs nothing and says what the terms are now;
// agree without it shows the new terms before it files (review finding 9).
func TestAgreePinsTheDigest(t *testing.T) {
	w := newWorld(t)
	k, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		t.Fatal(err)
	}
	red, err := daemon.Bootstrap(t.Context(), w.m.URLs().Control, w.agentKey("shop"), k, nil)
	if err != nil {
		t.Fatal(err)
	}
	nk, err := keys.FromSeed[keys.NodeRole]([]byte(red.Credential.Seed))
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.Start(t.Context(), node.Config{NATSURL: w.m.URLs().MeshTCP, NodeKey: nk,
		Credential: node.Credential{JWT: red.Credential.JWT, Sign: nk.SignNonce}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	handler := func(_ context.Context, c *node.Call) error { return c.Reply(map[string]any{"text": "paid work"}) }
	cheap, dear := wholeAgentSKU(t, 250000), wholeAgentSKU(t, 25_000_000)
	seller, err := n.Host(t.Context(), node.AgentConfig{Key: k, Name: "shop", SKUs: []commerce.SKU{cheap}, Handler: handler})
	if err != nil {
		t.Fatal(err)
	}
	buyer := w.state("buyer")
	p, _ := w.start(buyer, "up", w.agentKey("buyer"))
	defer p.stop()

	_, errOut, _ := w.run(buyer, "send", seller.ID(), "do the paid thing", "--wait", "20")
	suggested := "mesh-adapter agree " + seller.ID() + " whole-agent --digest " + cheap.Digest()
	if !strings.Contains(errOut, "`"+suggested+"`") {
		t.Fatalf("the refusal does not suggest %q:\n%s", suggested, errOut)
	}

	// The seller re-prices a hundredfold.
	if err := seller.Deregister(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err = n.Host(t.Context(), node.AgentConfig{Key: k, Name: "shop", SKUs: []commerce.SKU{dear}, Handler: handler}); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := w.run(buyer, strings.Fields(suggested)[1:]...)
	if code != 1 || strings.Count(strings.TrimSpace(errOut), "\n") != 0 ||
		!strings.Contains(errOut, "the seller's terms changed: whole-agent of agent "+seller.ID()+" is now 25.00 XCR per request, terms digest "+dear.Digest()+", not "+cheap.Digest()) ||
		!strings.Contains(errOut, "`mesh-adapter agree "+seller.ID()+" whole-agent --digest "+dear.Digest()+"`") {
		t.Fatalf("agree to terms that changed: exit %d\n%s%s", code, out, errOut)
	}
	nc, err := w.m.ConnectService("test-agree-digest")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if kv, err := js.KeyValue(t.Context(), commerce.Bucket); err == nil {
		lister, err := kv.ListKeysFiltered(t.Context(), commerce.AgreementPrefix+seller.ID()+".>")
		if err != nil {
			t.Fatal(err)
		}
		for key := range lister.Keys() {
			t.Errorf("an agreement was filed: %s", key)
		}
	}

	// Without --digest, the terms are shown before they are signed.
	out = w.must(buyer, "agree", seller.ID(), "whole-agent")
	terms := "terms: whole-agent of agent " + seller.ID() + " at 25.00 XCR per request, terms digest " + dear.Digest() + "\n"
	if !strings.HasPrefix(out, terms) || !strings.Contains(out, "\nagreed: owner ") {
		t.Fatalf("agree printed:\n%s", out)
	}
}

// The adapter pins the mesh's services key, learned from GET
// /v1/capabilities at its first start and kept in its state (review
// finding 10): its node then refuses admission, registry and task answers
// signed by any other key (adapter/node TestCommerceAdmissionFailsClosed
// shows the refusal).
func TestAdapterPinsTheServicesKey(t *testing.T) {
	w := newWorld(t)
	buyer := w.state("buyer")
	p, _ := w.start(buyer, "up", w.agentKey("buyer"))
	defer p.stop()
	dir, err := state.Open(buyer)
	if err != nil {
		t.Fatal(err)
	}
	conf, err := dir.Config()
	if err != nil || conf.ServicesKey != w.m.ServicesKey().Public() {
		t.Fatalf("the pinned services key %q (%v), want %s", conf.ServicesKey, err, w.m.ServicesKey().Public())
	}
}
