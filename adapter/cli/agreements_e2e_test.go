package cli_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/adapter/daemon"
	"agentmesh.dev/mesh/adapter/node"
	"agentmesh.dev/mesh/adapter/state"
	"agentmesh.dev/mesh/shared/agreements"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/keys"
)

// seller hosts an agent on this project's runtime whose manifest sells
// the whole agent under an internal flat SKU in credits.
func (w *world) seller(name string) (*node.Agent, commerce.SKU) {
	w.t.Helper()
	s, err := commerce.ParseSKU([]byte(`{"sku":"whole-agent","covers":{"agent":true},"price":{"model":"flat","currency":"XCR","amount_micro":250000},"provider":{"id":"internal"}}`))
	if err != nil {
		w.t.Fatal(err)
	}
	k, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		w.t.Fatal(err)
	}
	red, err := daemon.Bootstrap(w.t.Context(), w.m.URLs().Control, w.agentKey(name), k, nil)
	if err != nil {
		w.t.Fatal(err)
	}
	nk, err := keys.FromSeed[keys.NodeRole]([]byte(red.Credential.Seed))
	if err != nil {
		w.t.Fatal(err)
	}
	n, err := node.Start(w.t.Context(), node.Config{NATSURL: w.m.URLs().MeshTCP, NodeKey: nk,
		Credential: node.Credential{JWT: red.Credential.JWT, Sign: nk.SignNonce}})
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { _ = n.Close() })
	a, err := n.Host(w.t.Context(), node.AgentConfig{Key: k, Name: name, SKUs: []commerce.SKU{s},
		Handler: func(_ context.Context, c *node.Call) error { return c.Reply(map[string]any{"text": "paid work"}) }})
	if err != nil {
		w.t.Fatal(err)
	}
	return a, s
}

// A buyer's adapter meets a paid seller: send prints the refusal as one
// line with the approval URL and the command; agree files an agreement to
// the seller's current terms signed by the owner key (the owner the
// registry holds for the buyer, by the adapter's attestation); agreements
// lists it; the same send is then answered; agree revoke revokes it, and
// the send is refused again.
func TestAgreeAndAgreements(t *testing.T) {
	w := newWorld(t)
	seller, s := w.seller("shop")
	buyer := w.state("buyer")
	p, buyerID := w.start(buyer, "up", w.agentKey("buyer"))
	defer p.stop()

	_, errOut, code := w.run(buyer, "send", seller.ID(), "do the paid thing", "--wait", "20")
	approve := strings.TrimSuffix(w.m.URLs().Console, "/") + "/agreements/approve?sku=whole-agent"
	if code != 4 || strings.Count(strings.TrimSpace(errOut), "\n") != 0 ||
		!strings.Contains(errOut, "AGREEMENT_REQUIRED: whole-agent is a paid offering (0.25 credits per unit)") ||
		!strings.Contains(errOut, "approve at "+approve) || !strings.Contains(errOut, "`mesh-adapter agree "+seller.ID()+" whole-agent --digest "+s.Digest()+"`") {
		t.Fatalf("send to a paid seller: exit %d\n%s", code, errOut)
	}

	out := w.must(buyer, "agree", seller.ID(), "whole-agent", "--expires", "30d")
	dir, err := state.Open(buyer)
	if err != nil {
		t.Fatal(err)
	}
	id, err := dir.Identity()
	if err != nil {
		t.Fatal(err)
	}
	ks, err := id.Keys()
	if err != nil {
		t.Fatal(err)
	}
	owner := ks.Owner.Public()
	if !strings.HasPrefix(out, "terms: whole-agent of agent "+seller.ID()+" at 0.25 XCR per request, terms digest "+s.Digest()+"\nagreed: owner "+owner+" accepts whole-agent of agent "+seller.ID()+" at 0.25 XCR per request, terms digest "+s.Digest()+", until ") {
		t.Fatalf("agree printed:\n%s", out)
	}
	if _, errOut, code := w.run(buyer, "agree", seller.ID(), "no-such-sku"); code != 1 || !strings.Contains(errOut, "publishes no SKU \"no-such-sku\"; it publishes whole-agent") {
		t.Fatalf("agree to a SKU the seller does not sell: exit %d %s", code, errOut)
	}

	// The agreement as the service keeps it.
	nc, err := w.m.ConnectService("test-agreements")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	b, found, err := bus.LeaderGet(t.Context(), nc, commerce.Bucket, commerce.AgreementKey(seller.ID(), owner, "whole-agent"))
	if err != nil || !found {
		t.Fatalf("the filed agreement: %v %v", found, err)
	}
	var rec commerce.AgreementRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatal(err)
	}
	a, err := commerce.ParseAgreement(rec.Agreement)
	if err != nil || a.Verify() != nil || a.SKUDigest != s.Digest() || a.ConsumerOwner != owner || a.ExpiresAt == "" {
		t.Fatalf("filed: %+v %v", a, err)
	}

	// The adapter registers the buyer with its owner's attestation: the
	// registry's owner is the state's owner key, and agreements lists what
	// it agreed.
	rb, _, err := bus.LeaderGet(t.Context(), nc, agreements.RegistryBucket, buyerID)
	if err != nil {
		t.Fatal(err)
	}
	var reg agreements.Record
	if err := json.Unmarshal(rb, &reg); err != nil {
		t.Fatal(err)
	}
	if reg.Owner(time.Now()) != owner {
		t.Fatalf("the registry names owner %s for the buyer, not the state's owner key %s", reg.Owner(time.Now()), owner)
	}
	if out, errOut, code := w.run(buyer, "agreements"); code != 0 || !strings.HasPrefix(out, "active   whole-agent of agent "+seller.ID()+", digest "+s.Digest()) {
		t.Fatalf("agreements: exit %d\n%s%s", code, out, errOut)
	}

	// Agreed, and with the credits the price needs, the same send is
	// answered.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(t.Context(), commerce.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	bal, _ := json.Marshal(commerce.Balance{Credits: 10_000_000, UpdatedAt: time.Now()})
	if _, err := kv.Put(t.Context(), commerce.BalancePrefix+owner, bal); err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := w.run(buyer, "send", seller.ID(), "do the paid thing", "--wait", "20"); code != 0 || !strings.Contains(out, "paid work") {
		t.Fatalf("send once agreed: exit %d\n%s%s", code, out, errOut)
	}

	out = w.must(buyer, "agree", "revoke", seller.ID(), "whole-agent")
	if !strings.HasPrefix(out, "revoked the agreement of owner "+owner+" to whole-agent of agent "+seller.ID()) {
		t.Fatalf("revoke printed:\n%s", out)
	}
	// Revoked: refused again.
	if _, errOut, code := w.run(buyer, "send", seller.ID(), "do the paid thing", "--wait", "20"); code != 4 || !strings.Contains(errOut, "AGREEMENT_REQUIRED: whole-agent") {
		t.Fatalf("send after the revocation: exit %d\n%s", code, errOut)
	}
	if _, errOut, code := w.run(buyer, "agree", seller.ID(), "whole-agent", "--expires", "yesterday"); code != 2 || !strings.Contains(errOut, "--expires") {
		t.Fatalf("a bad --expires: exit %d %s", code, errOut)
	}
}
