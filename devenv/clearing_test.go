package devenv_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/adapter/daemon"
	"agentmesh.dev/mesh/adapter/node"
	"agentmesh.dev/mesh/devenv"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/clearing"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// sellingSKU is one credit per answer of the offering chat, billed by the
// mesh's own clearing.
const sellingSKU = `{"sku":"chat-answers","covers":{"offerings":["chat"]},"price":{"model":"flat","currency":"XCR","amount_micro":1000000},"provider":{"id":"internal"}}`

// ownedAgent is an agent of the account on its own node, registered with
// owner (attested: docs/commerce.md "SKUs in the manifest and the owner of
// an agent"; nil leaves the node's key its owner) and selling skus.
func (c *cp) ownedAgent(acct, name string, owner *keys.Agent, skus []commerce.SKU, handler node.Handler) (*node.Agent, *keys.Agent) {
	c.t.Helper()
	k := newAgent(c.t)
	red, err := daemon.Bootstrap(c.t.Context(), c.base, c.agentKey(acct, name), k, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	nk, err := keys.FromSeed[keys.NodeRole]([]byte(red.Credential.Seed))
	if err != nil {
		c.t.Fatal(err)
	}
	n, err := node.Start(c.t.Context(), node.Config{NATSURL: c.m.URLs().MeshTCP, NodeKey: nk,
		Credential: node.Credential{JWT: red.Credential.JWT, Sign: nk.SignNonce}, HeartbeatEvery: time.Second, DrainEvery: time.Second})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = n.Close() })
	if handler == nil {
		handler = func(context.Context, *node.Call) error { return errors.New("this agent sells nothing") }
	}
	cfg := node.AgentConfig{Key: k, Name: name, Handler: handler, Visibility: "public",
		Offerings: []node.Offering{{ID: "chat"}}, AvailabilityClass: "always_on", SKUs: skus}
	if owner != nil {
		cfg.Owner = owner
	}
	a, err := n.Host(c.t.Context(), cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	return a, k
}

// Credits end to end, on a mesh with three copies of every worker: the
// operator grants credits to the buyer's owner through the admin socket's
// handler; the owner signs an agreement to the seller's paid SKU; each
// answered request moves exactly the price, once: on the seller's own SKU
// all of it to the seller's owner, and, once the operator marks the
// seller official, the retail price with the 10 % markup, the full rate to
// the seller's owner and the markup to the platform. A request without an
// agreement moves nothing. The agent reads its owner's balance and
// history; /v1/capabilities reports the clearing.
func TestClearingEndToEnd(t *testing.T) {
	c := startCP(t, func(cfg *devenv.Config) { cfg.Workers.Copies = 3 })
	acct, _ := c.signIn("shop@example.org")
	sku, err := commerce.ParseSKU([]byte(sellingSKU))
	if err != nil {
		t.Fatal(err)
	}
	bobOwner, aliceOwner := newAgent(t), newAgent(t)
	// Bob publishes the SKU in his manifest, registered with his owner.
	bob, _ := c.ownedAgent(acct, "bob", bobOwner, []commerce.SKU{sku}, func(ctx context.Context, call *node.Call) error {
		return call.Reply(map[string]any{"text": "an answer worth a credit"})
	})
	alice, aliceKey := c.ownedAgent(acct, "alice", aliceOwner, nil, nil)
	carol, _ := c.ownedAgent(acct, "carol", nil, nil, nil)

	nc, err := c.m.ConnectService("clearing-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()

	// The operator grants alice's owner 5 credits.
	if st, out := c.adminPost("/admin/credits/"+aliceOwner.Public()+"/grant", map[string]any{"credits": 5_000_000, "reason": "welcome"}); st != 200 || out["credits"] != 5_000_000.0 {
		t.Fatalf("grant: %d %v", st, out)
	}

	// Alice's owner signs the agreement to the SKU's current digest, and
	// alice files it (mesh.agreements.file: the owner's signature inside is
	// the authority).
	a := commerce.Agreement{SellerAgent: bob.ID(), SKU: sku.ID, SKUDigest: sku.Digest(), AgreedAt: protocol.FormatTime(time.Now().Add(-time.Minute))}
	if err := commerce.Sign(&a, aliceOwner); err != nil {
		t.Fatal(err)
	}
	signed, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bus.Call(ctx, alice.Node().Conn(), aliceKey, protocol.AgreementVerbSubject("file"), protocol.TypeRequest, "", json.RawMessage(signed)); err != nil {
		t.Fatalf("file the agreement: %v", err)
	}
	kv, err := js.KeyValue(ctx, commerce.Bucket)
	if err != nil {
		t.Fatal(err)
	}

	credits := func(owner string) int64 {
		t.Helper()
		b, _, err := bus.GetJSON[commerce.Balance](ctx, kv, commerce.BalancePrefix+owner)
		if err != nil {
			t.Fatal(err)
		}
		return b.Credits
	}
	ask := func(from *node.Agent) clearing.Settlement {
		t.Helper()
		res, err := from.Request(ctx, bob.ID(), "chat", "a question", node.RequestOptions{})
		if err != nil || res.Status != "completed" {
			t.Fatalf("request: %v %+v", err, res)
		}
		var s clearing.Settlement
		eventually(t, "the settlement of "+res.RequestID, func() bool {
			var found bool
			s, found, _ = bus.GetJSON[clearing.Settlement](ctx, kv, clearing.SettlementKey(bob.ID(), res.RequestID))
			return found && s.State == clearing.StateSettled
		})
		return s
	}

	// The seller's own SKU: 1 credit from alice's owner to bob's.
	s := ask(alice)
	if s.Resale || s.Charged != 1_000_000 || s.ToSeller != 1_000_000 || s.ConsumerOwner != aliceOwner.Public() || s.SellerOwner != bobOwner.Public() {
		t.Fatalf("own SKU settlement: %+v", s)
	}
	if a, b, p := credits(aliceOwner.Public()), credits(bobOwner.Public()), credits(clearing.PlatformOwner); a != 4_000_000 || b != 1_000_000 || p != 0 {
		t.Fatalf("after the own-SKU sale: alice's owner %d, bob's owner %d, platform %d", a, b, p)
	}

	// The operator marks bob official: the resale path.
	eventually(t, "bob in the catalog", func() bool {
		_, err := c.m.Control().Bus.Call(ctx, protocol.SubjCatalogAdmin, protocol.TypeRequest, map[string]any{"agent_id": bob.ID(), "official": true})
		return err == nil
	})
	s = ask(alice)
	if !s.Resale || s.Retail != 1_100_000 || s.Charged != 1_100_000 || s.ToSeller != 1_000_000 || s.ToPlatform != 100_000 {
		t.Fatalf("resale settlement: %+v", s)
	}
	if a, b, p := credits(aliceOwner.Public()), credits(bobOwner.Public()), credits(clearing.PlatformOwner); a != 2_900_000 || b != 2_000_000 || p != 100_000 {
		t.Fatalf("after the resale: alice's owner %d, bob's owner %d, platform %d", a, b, p)
	}

	// Carol's owner holds no agreement: where the seller's node asks
	// admission she is refused before any work (AGREEMENT_REQUIRED);
	// answered or refused, nothing moves.
	res, err := carol.Request(ctx, bob.ID(), "chat", "a question", node.RequestOptions{})
	switch {
	case err == nil && res.Status == "completed":
		eventually(t, "carol's answer seen by the clearing", func() bool {
			var n uint64
			for _, w := range c.m.Workers().Clearing {
				n += w.Stats().NotCharged
			}
			return n == 1
		})
		if _, found, _ := bus.GetJSON[clearing.Settlement](ctx, kv, clearing.SettlementKey(bob.ID(), res.RequestID)); found {
			t.Fatal("carol's request was settled")
		}
	case res != nil && res.Error != nil && res.Error.Code == errs.AgreementRequired:
	default:
		t.Fatalf("carol's request: %v %+v", err, res)
	}
	if a, b, p := credits(aliceOwner.Public()), credits(bobOwner.Public()), credits(clearing.PlatformOwner); a != 2_900_000 || b != 2_000_000 || p != 100_000 {
		t.Fatalf("after carol's request: %d %d %d", a, b, p)
	}

	// Alice, the agent, reads her owner's balance and history.
	rep, err := bus.Call(ctx, alice.Node().Conn(), aliceKey, protocol.CreditVerbSubject("balance"), protocol.TypeRequest, "", map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	var bal clearing.BalanceView
	if err := rep.DecodePayload(&bal); err != nil || bal.Owner != aliceOwner.Public() || bal.Credits != 2_900_000 || bal.Currency != "XCR" {
		t.Fatalf("balance: %+v %v", bal, err)
	}

	st, caps := c.do(http.MethodGet, "/v1/capabilities", nil, "")
	cl, _ := caps["clearing"].(map[string]any)
	if st != 200 || caps["clearing_service"] != true || caps["markup_pct"] != 10.0 || cl["markup_pct"] != 10.0 || cl["currency"] != "XCR" {
		t.Fatalf("capabilities: %d %v", st, caps)
	}
}
