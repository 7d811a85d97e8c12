package clearing

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/protocol"
)

// The review's reproductions (issue 18, the clearing), each now a
// regression test: the clearing charges only against the admission ticket
// and takes the sale's terms from it.

// uuidV7At is a syntactically valid UUIDv7 whose time is t.
func uuidV7At(t time.Time) string {
	ms := t.UnixMilli()
	return fmt.Sprintf("%08x-%04x-7abc-8def-0123456789ab", ms>>16, ms&0xffff)
}

// fabricate: the seller signs an answer to inReplyTo, addressed to the
// buyer, its copy naming offering.
func (h *harness) fabricate(inReplyTo, offering string, payload map[string]any) ([]byte, nats.Header) {
	h.t.Helper()
	rep, err := protocol.New(protocol.TypeRespond, h.seller.Public(), payload)
	if err != nil {
		h.t.Fatal(err)
	}
	rep.InReplyTo, rep.To = inReplyTo, h.buyer.Public()
	if err := rep.Sign(h.seller); err != nil {
		h.t.Fatal(err)
	}
	data, _ := rep.Marshal()
	hdr := nats.Header{}
	hdr.Set(protocol.HdrAuditInput, "00")
	hdr.Set(protocol.HdrAuditOffering, offering)
	return data, hdr
}

func tokens(n int64) map[string]any {
	return map[string]any{"status": "completed", "usage": []any{map[string]any{"meter": "tokens_out", "quantity": n}}}
}

func (h *harness) found(seller, id string) bool {
	h.t.Helper()
	_, found, err := bus.GetJSON[Settlement](h.t.Context(), h.kv, SettlementKey(seller, id))
	if err != nil {
		h.t.Fatal(err)
	}
	return found
}

// Review 1: answers to requests never admitted move nothing, whatever
// they declare; an answer to another of the owner's agents, or naming
// another offering than the one admitted, neither. The marker answer
// after them shows the tap has passed them.
func TestNoTicketNothingMoves(t *testing.T) {
	h := start(t, 1, 10, flatSKU, tokensSKU)
	h.agree(flatSKU)
	h.agree(tokensSKU)
	h.fund(h.buyerOwn.Public(), 50_000_000)
	var invented []string
	for range 3 {
		id := protocol.NewID()
		invented = append(invented, id)
		d, hdr := h.fabricate(id, "answer", map[string]any{"status": "completed"})
		h.copyOut(d, hdr)
	}
	id := protocol.NewID()
	invented = append(invented, id)
	d, hdr := h.fabricate(id, "write", tokens(1_000_000_000))
	h.copyOut(d, hdr)
	// Admitted for "answer", answered as "write".
	other := protocol.NewID()
	h.admit(other, "answer", nil)
	invented = append(invented, other)
	d, hdr = h.fabricate(other, "write", tokens(5000))
	h.copyOut(d, hdr)
	// Admitted for the buyer, answered to another agent of its owner.
	sibling := newKey(t)
	h.put(h.reg, sibling.Public(), map[string]any{"id": sibling.Public(), "node": map[string]any{"id": h.buyerOwn.Public()}})
	toSibling := protocol.NewID()
	h.admit(toSibling, "answer", nil)
	invented = append(invented, toSibling)
	rep, _ := protocol.New(protocol.TypeRespond, h.seller.Public(), map[string]any{"status": "completed"})
	rep.InReplyTo, rep.To = toSibling, sibling.Public()
	_ = rep.Sign(h.seller)
	sb, _ := rep.Marshal()
	h.copyOut(sb, hdr)

	real, data, rhdr := h.answer("answer")
	h.copyOut(data, rhdr)
	h.settled(real)
	for _, x := range invented {
		if h.found(h.seller.Public(), x) {
			t.Errorf("request %s was settled", x)
		}
	}
	h.checkBalances(49_000_000, 1_000_000, 0)
	if n := h.workers[0].Stats().NotCharged; n != 6 {
		t.Fatalf("not charged %d, want 6", n)
	}
}

// Review 1 (the ceiling): the request's budget ceiling clamps the charge
// of declared usage; the ticket is consumed with the settlement, so a
// second answer to the same request finds it settled.
func TestCeilingClampsAndTicketConsumed(t *testing.T) {
	h := start(t, 1, 10, tokensSKU)
	h.agree(tokensSKU)
	h.fund(h.buyerOwn.Public(), 50_000_000)
	id := protocol.NewID()
	ceiling := int64(2_500_000)
	h.admit(id, "write", &ceiling)
	d, hdr := h.fabricate(id, "write", tokens(1_000_000_000))
	h.copyOut(d, hdr)
	s := h.settled(id)
	if s.Retail != 2_500_000 || s.Charged != 2_500_000 || s.Clamped <= 0 || s.Unpaid != 0 {
		t.Fatalf("settlement %+v", s)
	}
	if _, err := h.kv.Get(t.Context(), commerce.TicketKey(h.seller.Public(), id)); err == nil {
		t.Fatal("the ticket was not consumed")
	}
	d, hdr = h.fabricate(id, "write", tokens(1_000_000_000))
	h.copyOut(d, hdr)
	waitFor(t, "the second answer seen", func() bool { return h.workers[0].Stats().Duplicates >= 1 })
	h.checkBalances(47_500_000, 2_500_000, 0)
}

// Review 2 and 6: the sale's time is the ticket's (the service's clock at
// admission), never the time inside an id: a backdated id neither moves
// the period nor escapes a revocation filed after admission (a request in
// flight settles on the terms it was admitted under).
func TestTicketTimeNotTheID(t *testing.T) {
	h := start(t, 1, 10, tokensSKU)
	h.agree(tokensSKU)
	h.fund(h.buyerOwn.Public(), 50_000_000)
	today := commerce.PeriodKey(commerce.PeriodDay, time.Now())
	for d := range 7 {
		id := uuidV7At(time.Now().Add(-time.Duration(d)*24*time.Hour - time.Minute))
		h.admit(id, "write", nil)
		data, hdr := h.fabricate(id, "write", tokens(1000))
		h.copyOut(data, hdr)
		if s := h.settled(id); s.Period != today {
			t.Fatalf("day -%d rated in %s, not %s", d, s.Period, today)
		}
	}
	// 7,000 tokens in one day, 1,000 included: 6,000,000.
	if paid := 50_000_000 - h.credits(h.buyerOwn.Public()); paid != 6_000_000 {
		t.Fatalf("paid %d, want 6,000,000", paid)
	}
	// Revoked after admission, answered after: charged, at admission.
	id := "not-a-uuid-" + protocol.NewID()[:8]
	h.admit(id, "write", nil)
	tk, _, _ := bus.GetJSON[commerce.Ticket](t.Context(), h.kv, commerce.TicketKey(h.seller.Public(), id))
	k := sku(t, tokensSKU)
	key := commerce.AgreementKey(h.seller.Public(), h.buyerOwn.Public(), k.ID)
	rec, _, _ := bus.GetJSON[commerce.AgreementRecord](t.Context(), h.kv, key)
	rev := time.Now()
	rec.RevokedAt = &rev
	h.put(h.kv, key, rec)
	data, hdr := h.fabricate(id, "write", tokens(1000))
	h.copyOut(data, hdr)
	if s := h.settled(id); s.At != protocol.FormatTime(tk.AdmittedAt) || s.Charged != 1_000_000 || s.Agreement != key {
		t.Fatalf("settlement %+v (ticket at %s)", s, tk.AdmittedAt)
	}
}

// Review 3: one request id answered by two sellers is two sales, each
// seller's owner paid.
func TestReusedIDTwoSellersBothPaid(t *testing.T) {
	h := start(t, 1, 10, flatSKU)
	h.agree(flatSKU)
	h.fund(h.buyerOwn.Public(), 5_000_000)
	id, d, hdr := h.answer("answer")
	h.copyOut(d, hdr)
	h.settled(id)
	s2, s2own := newKey(t), newKey(t)
	v, _ := protocol.ParseJSON([]byte(flatSKU))
	h.put(h.reg, s2.Public(), map[string]any{"id": s2.Public(), "owner": s2own.Public(), "skus": []any{v}, "node": map[string]any{"id": newKey(t).Public()}})
	k := sku(t, flatSKU)
	a := commerce.Agreement{SellerAgent: s2.Public(), SKU: k.ID, SKUDigest: k.Digest(), AgreedAt: protocol.FormatTime(time.Now().Add(-time.Hour))}
	_ = commerce.Sign(&a, h.buyerOwn)
	ab, _ := json.Marshal(a)
	h.put(h.kv, commerce.AgreementKey(s2.Public(), h.buyerOwn.Public(), k.ID), commerce.AgreementRecord{Agreement: ab, FiledAt: time.Now()})
	if !h.admitFor(s2.Public(), s2own.Public(), h.buyer.Public(), h.buyerOwn.Public(), []string{flatSKU}, id, "answer", nil) {
		t.Fatal("not admitted at seller 2")
	}
	rep, _ := protocol.New(protocol.TypeRespond, s2.Public(), map[string]any{"status": "completed"})
	rep.InReplyTo, rep.To = id, h.buyer.Public()
	_ = rep.Sign(s2)
	data, _ := rep.Marshal()
	if err := h.nc.PublishMsg(&nats.Msg{Subject: protocol.OutboxSubject(s2.Public()), Data: data, Header: hdr}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "seller 2's sale", func() bool {
		s, found, _ := bus.GetJSON[Settlement](t.Context(), h.kv, SettlementKey(s2.Public(), id))
		return found && s.State == StateSettled
	})
	if c := h.credits(s2own.Public()); c != 1_000_000 {
		t.Fatalf("seller 2's owner has %d", c)
	}
	h.checkBalances(3_000_000, 1_000_000, 0)
}

// Review 4: a snapshot listed before the settlement finished and its
// markers were cleared is never run: each step re-reads the record.
func TestStaleSnapshotNotRunAgain(t *testing.T) {
	h := start(t, 0, 10, flatSKU)
	h.fund(h.buyerOwn.Public(), 5_000_000)
	rec := h.newSale(true)
	e := &engine{kv: h.kv, nc: h.nc, now: time.Now}
	rated, _, err := e.rate(t.Context(), rec)
	if err != nil {
		t.Fatal(err)
	}
	snapshot := *rated
	if _, _, err := e.run(t.Context(), rated); err != nil {
		t.Fatal(err)
	}
	s, _, _ := bus.GetJSON[Settlement](t.Context(), h.kv, commerce.SettlementPrefix+rec.Key)
	if err := e.clearMarkers(t.Context(), &s); err != nil {
		t.Fatal(err)
	}
	for _, stale := range []Settlement{snapshot, *rec} {
		if _, _, err := e.run(t.Context(), &stale); err != nil {
			t.Fatal(err)
		}
	}
	h.checkSale(rec.Key)
}

// Review 5: the owner recorded at admission pays, whatever the requester's
// registration says by the time it is answered.
func TestTicketOwnerPays(t *testing.T) {
	h := start(t, 1, 10, flatSKU)
	h.agree(flatSKU)
	h.fund(h.buyerOwn.Public(), 5_000_000)
	id, d, hdr := h.answer("answer")
	other := newKey(t)
	h.put(h.reg, h.buyer.Public(), map[string]any{"id": h.buyer.Public(), "owner": other.Public(), "node": map[string]any{"id": h.buyerOwn.Public()}})
	h.copyOut(d, hdr)
	if s := h.settled(id); s.ConsumerOwner != h.buyerOwn.Public() || s.Charged != 1_000_000 {
		t.Fatalf("settlement %+v", s)
	}
	h.checkBalances(4_000_000, 1_000_000, 0)
}

// Review 9: a sale that cannot be rated fails, final: nothing moves, it is
// not retried, and the sweep forgets it after Keep.
func TestUnratableFails(t *testing.T) {
	var mu sync.Mutex
	clock := time.Now()
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }
	h := startWith(t, 1, Config{MarkupPct: 10, SweepEvery: 100 * time.Millisecond, Grace: time.Millisecond, Keep: MinKeep}, now, tokensSKU)
	h.agree(tokensSKU)
	h.fund(h.buyerOwn.Public(), 5_000_000)
	id := protocol.NewID()
	h.admit(id, "write", nil)
	d, hdr := h.fabricate(id, "write", tokens(9_000_000_000_000_000))
	h.copyOut(d, hdr)
	var s Settlement
	waitFor(t, "the sale failed", func() bool {
		s, _, _ = bus.GetJSON[Settlement](t.Context(), h.kv, SettlementKey(h.seller.Public(), id))
		return s.State == StateFailed
	})
	if s.Reason == "" || s.Charged != 0 {
		t.Fatalf("settlement %+v", s)
	}
	h.checkBalances(5_000_000, 0, 0)
	advance(MarkerKeep + MinKeep)
	waitFor(t, "the failed sale forgotten", func() bool { return !h.found(h.seller.Public(), id) })
}

// Review 12: a sale admitted before the seller re-priced is rated on the
// terms (digest and price) it was admitted under.
func TestRepricedInFlightRatedOnTicket(t *testing.T) {
	h := start(t, 1, 10, flatSKU)
	h.agree(flatSKU)
	h.fund(h.buyerOwn.Public(), 5_000_000)
	id, d, hdr := h.answer("answer")
	old := sku(t, flatSKU)
	dearer := `{"sku":"answers","covers":{"offerings":["answer"]},"price":{"model":"flat","currency":"XCR","amount_micro":3000000},"provider":{"id":"internal"}}`
	v, _ := protocol.ParseJSON([]byte(dearer))
	h.put(h.reg, h.seller.Public(), map[string]any{"id": h.seller.Public(), "owner": h.sellerOwner.Public(), "skus": []any{v},
		"node": map[string]any{"id": newKey(t).Public()}})
	h.copyOut(d, hdr)
	if s := h.settled(id); s.SKUDigest != old.Digest() || s.Charged != 1_000_000 {
		t.Fatalf("settlement %+v", s)
	}
}

// Review 7: what a buyer could not pay is carried on its balance, and the
// next credits paid in (a grant) pay it off first.
func TestUnpaidCarriedAndPaidByGrant(t *testing.T) {
	h := start(t, 1, 10, flatSKU)
	h.agree(flatSKU)
	h.fund(h.buyerOwn.Public(), 300_000)
	id, d, hdr := h.answer("answer")
	h.copyOut(d, hdr)
	if s := h.settled(id); s.Unpaid != 700_000 {
		t.Fatalf("settlement %+v", s)
	}
	b, _, _ := bus.GetJSON[balance](t.Context(), h.kv, balanceKey(h.buyerOwn.Public()))
	if b.Credits != 0 || b.Unpaid != 700_000 {
		t.Fatalf("balance %+v", b)
	}
	out, err := h.call(h.m.ServicesKey(), protocol.SubjCreditsGrant, map[string]any{"owner": h.buyerOwn.Public(), "credits": 1_000_000})
	if err != nil || out["credits"] != 300_000.0 {
		t.Fatalf("grant: %v %v", out, err)
	}
	b, _, _ = bus.GetJSON[balance](t.Context(), h.kv, balanceKey(h.buyerOwn.Public()))
	if b.Credits != 300_000 || b.Unpaid != 0 {
		t.Fatalf("balance after the grant %+v", b)
	}
}

// Review 10: the sweep drops ledger rows past LedgerKeep, aggregates
// whose period ended TicketKeep ago, and tickets never answered.
func TestRetentionSweep(t *testing.T) {
	var mu sync.Mutex
	clock := time.Now()
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }
	h := startWith(t, 1, Config{MarkupPct: 10, SweepEvery: 100 * time.Millisecond, RetentionEvery: time.Millisecond,
		TicketKeep: time.Hour, LedgerKeep: 2 * time.Hour}, now, flatSKU)
	h.agree(flatSKU)
	h.fund(h.buyerOwn.Public(), 5_000_000)
	id, d, hdr := h.answer("answer")
	h.copyOut(d, hdr)
	h.settled(id)
	unanswered := protocol.NewID()
	h.admit(unanswered, "answer", nil)
	count := func(filter string) int {
		l, err := h.kv.ListKeysFiltered(t.Context(), filter)
		if err != nil {
			return 0
		}
		n := 0
		for range l.Keys() {
			n++
		}
		return n
	}
	if count(LedgerPrefix+">") == 0 || count(AggregatePrefix+">") == 0 {
		t.Fatal("nothing to sweep")
	}
	advance(72 * time.Hour) // past a day's period + TicketKeep, and LedgerKeep
	waitFor(t, "retention", func() bool {
		return count(LedgerPrefix+">") == 0 && count(AggregatePrefix+">") == 0 && count(commerce.TicketPrefix+">") == 0
	})
	h.checkBalances(4_000_000, 1_000_000, 0)
}

// Review 13: the markup is bounded at startup.
func TestStartRefusesMarkupOutOfRange(t *testing.T) {
	m := startWith(t, 0, Config{}, nil).m
	for _, pct := range []int{-1, 101, 1500} {
		if w, err := Start(t.Context(), bustest.Env(t, m, "clearing-x", nil), Config{MarkupPct: pct}); err == nil {
			_ = w.Stop()
			t.Fatalf("markup %d accepted", pct)
		}
	}
}
