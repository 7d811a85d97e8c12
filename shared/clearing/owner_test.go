package clearing

import (
	"strings"
	"testing"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// Balances are read through registry.OwnerOf (review 18 #1, #2): an agent
// that is its own node has no owner, so it has no credits to read, even
// when a balance sits under its own agent key. (Who pays and who is paid
// is the admission ticket's: TestNoTicketNothingMoves, TestTicketOwnerPays.)
func TestNoOwnerNoCredits(t *testing.T) {
	h := start(t, 1, 10, flatSKU)
	h.put(h.reg, h.buyer.Public(), map[string]any{"id": h.buyer.Public(), "node": map[string]any{"id": h.buyer.Public()}})
	h.fund(h.buyer.Public(), 5_000_000)
	_, err := h.call(h.buyer, protocol.CreditVerbSubject("balance"), map[string]any{})
	if e := errs.As(err); e == nil || e.Code != errs.Forbidden || !strings.Contains(e.Message, "has no owner") {
		t.Fatalf("balance of an agent with no owner: %v", err)
	}
}
