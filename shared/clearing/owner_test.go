package clearing

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// The clearing reads owners through registry.OwnerOf (review 18 #1, #2):
// a seller whose owner attestation has expired has no owner to pay, so its
// paid answer is not charged (the node is not paid instead); an agent that
// is its own node has no owner, so an agreement and credits on its own
// agent key buy nothing, and it has no credits to read.
func TestNoOwnerNoCredits(t *testing.T) {
	t.Run("seller's owner attestation expired", func(t *testing.T) {
		h := start(t, 1, 10, flatSKU)
		h.agree(flatSKU)
		h.fund(h.buyerOwn.Public(), 5_000_000)
		rec, _, err := bus.GetJSON[map[string]any](t.Context(), h.reg, h.seller.Public())
		if err != nil {
			t.Fatal(err)
		}
		rec["owner_expires_at"] = protocol.FormatTime(time.Now().Add(-time.Second))
		h.put(h.reg, h.seller.Public(), rec)
		id, data, hdr := h.answer("answer")
		h.copyOut(data, hdr)
		waitFor(t, "the answer seen", func() bool { return h.workers[0].Stats().NotCharged == 1 })
		if _, found, _ := bus.GetJSON[Settlement](t.Context(), h.kv, SettlementKey(id)); found {
			t.Fatal("an answer of a seller with no owner was settled")
		}
		if b, n := h.credits(h.buyerOwn.Public()), h.credits(h.seller.Public()); b != 5_000_000 || n != 0 {
			t.Fatalf("balances: buyer %d, seller's own key %d", b, n)
		}
	})

	t.Run("buyer is its own node", func(t *testing.T) {
		h := start(t, 1, 10, flatSKU)
		h.put(h.reg, h.buyer.Public(), map[string]any{"id": h.buyer.Public(), "node": map[string]any{"id": h.buyer.Public()}})
		k := sku(t, flatSKU)
		a := commerce.Agreement{SellerAgent: h.seller.Public(), SKU: k.ID, SKUDigest: k.Digest(), AgreedAt: protocol.FormatTime(time.Now().Add(-time.Hour))}
		if err := commerce.Sign(&a, h.buyer); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(a)
		h.put(h.kv, commerce.AgreementKey(h.seller.Public(), h.buyer.Public(), k.ID), commerce.AgreementRecord{Agreement: b, FiledAt: time.Now()})
		h.fund(h.buyer.Public(), 5_000_000)

		id, data, hdr := h.answer("answer")
		h.copyOut(data, hdr)
		waitFor(t, "the answer seen", func() bool { return h.workers[0].Stats().NotCharged == 1 })
		if _, found, _ := bus.GetJSON[Settlement](t.Context(), h.kv, SettlementKey(id)); found {
			t.Fatal("an answer to an agent that is its own owner was settled")
		}
		if got := h.credits(h.buyer.Public()); got != 5_000_000 {
			t.Fatalf("the agent key's balance moved: %d", got)
		}
		_, err := h.call(h.buyer, protocol.CreditVerbSubject("balance"), map[string]any{})
		if e := errs.As(err); e.Code != errs.Forbidden || !strings.Contains(e.Message, "has no owner") {
			t.Fatalf("balance of an agent with no owner: %v", err)
		}
	})
}
