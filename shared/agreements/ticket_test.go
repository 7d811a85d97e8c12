package agreements_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/activity"
	"agentmesh.dev/mesh/shared/agreements"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// pricedStand is a stand whose worker knows the resale markup (pct) and
// whose seller is an official catalog agent when official.
func pricedStand(t *testing.T, pct int, official bool) *stand {
	t.Helper()
	b := bustest.Start(t)
	cfg := agreements.Config{ConsoleURL: console, MarkupPct: pct}
	s := &stand{t: t, b: b, nc: bustest.Client(t, b), seller: bustest.Agent(t), requester: bustest.Agent(t), owner: bustest.Agent(t)}
	if official {
		cfg.Official = []string{s.seller.Public()}
	}
	w, err := agreements.Start(t.Context(), bustest.Env(t, b, "agreements-0", nil), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop() })
	js, err := jetstream.New(s.nc)
	if err != nil {
		t.Fatal(err)
	}
	if s.reg, err = js.CreateOrUpdateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: agreements.RegistryBucket}); err != nil {
		t.Fatal(err)
	}
	if s.comm, err = js.KeyValue(t.Context(), commerce.Bucket); err != nil {
		t.Fatal(err)
	}
	usage, err := js.CreateOrUpdateKeyValue(t.Context(), activity.UsageBucketConfig(1))
	if err != nil {
		t.Fatal(err)
	}
	cat, _ := json.Marshal(map[string]any{"agent_id": s.seller.Public()})
	if _, err := usage.Put(t.Context(), activity.CatalogPrefix+s.seller.Public(), cat); err != nil {
		t.Fatal(err)
	}
	s.register(s.seller.Public(), bustest.Agent(t).Public(), bustest.Agent(t).Public(), flatSKU(1_000_000))
	s.register(s.requester.Public(), s.owner.Public(), "")
	return s
}

func (s *stand) admitID(id, offering string, budget *protocol.Budget, from string) (map[string]any, *errs.Error) {
	q := map[string]any{"requester": from, "offering": offering, "request_id": id}
	if budget != nil {
		q["budget"] = budget
	}
	return s.call(s.seller, protocol.SubjCommerceAdmit, q)
}

func (s *stand) ticket(id string) (commerce.Ticket, bool) {
	s.t.Helper()
	e, err := s.comm.Get(s.t.Context(), commerce.TicketKey(s.seller.Public(), id))
	if err != nil {
		return commerce.Ticket{}, false
	}
	var t commerce.Ticket
	if err := json.Unmarshal(e.Value(), &t); err != nil {
		s.t.Fatal(err)
	}
	return t, true
}

// An admitted paid request leaves one ticket holding what the clearing
// settles on; asking again for the same request is the same ticket and
// admitted; another requester under the same id at the same seller is
// refused; a free offering leaves none.
func TestAdmitWritesTicket(t *testing.T) {
	s := pricedStand(t, 10, false)
	paid := sku(t, flatSKU(1_000_000))
	if e := s.file(agreement(t, s.owner, s.seller.Public(), paid.ID, paid.Digest(), time.Now().Add(-time.Minute), "")); e != nil {
		t.Fatal(e)
	}
	s.balance(s.owner.Public(), 5_000_000)
	id := protocol.NewID()
	ceiling := protocol.Money{AmountMicro: 3_000_000, Currency: commerce.Credits}
	before := time.Now().Add(-time.Second)
	if out, e := s.admitID(id, "paid", &protocol.Budget{CostCeiling: &ceiling}, s.requester.Public()); e != nil || out["admitted"] != true {
		t.Fatalf("admit: %v %v", out, e)
	}
	tk, ok := s.ticket(id)
	if !ok {
		t.Fatal("no ticket")
	}
	if tk.Seller != s.seller.Public() || tk.Requester != s.requester.Public() || tk.ConsumerOwner != s.owner.Public() ||
		tk.Offering != "paid" || tk.SKU != paid.ID || tk.SKUDigest != paid.Digest() || tk.RequestID != id ||
		tk.Agreement != commerce.AgreementKey(s.seller.Public(), s.owner.Public(), paid.ID) || tk.SellerOwner == "" ||
		tk.RetailMicro != 1_000_000 || tk.Resale || tk.MarkupPct != 0 || tk.CeilingMicro == nil || *tk.CeilingMicro != 3_000_000 ||
		tk.AdmittedAt.Before(before) || len(tk.Price) == 0 {
		t.Fatalf("ticket %+v", tk)
	}
	// The same request asked again (a retry): admitted, the same ticket.
	if out, e := s.admitID(id, "paid", nil, s.requester.Public()); e != nil || out["admitted"] != true {
		t.Fatalf("retry: %v %v", out, e)
	}
	if again, _ := s.ticket(id); !again.AdmittedAt.Equal(tk.AdmittedAt) {
		t.Fatalf("retry rewrote the ticket: %v then %v", tk.AdmittedAt, again.AdmittedAt)
	}
	// Another requester of the same owner reusing the id at this seller.
	other := bustest.Agent(t)
	s.register(other.Public(), s.owner.Public(), "")
	if _, e := s.admitID(id, "paid", nil, other.Public()); e == nil || e.Code != errs.Conflict {
		t.Fatalf("reused id: %v", e)
	}
	// A free offering: admitted, no ticket.
	free := protocol.NewID()
	if out, e := s.admitID(free, "uncovered", nil, s.requester.Public()); e != nil || out["admitted"] != true {
		t.Fatalf("free: %v %v", out, e)
	}
	if _, ok := s.ticket(free); ok {
		t.Fatal("a ticket for a free offering")
	}
}

// On the resale path price_credits and the funds check are the retail
// price: the rate plus the markup.
func TestAdmitQuotesRetailOnResale(t *testing.T) {
	s := pricedStand(t, 10, true)
	paid := sku(t, flatSKU(1_000_000))
	_, e := s.admitID(protocol.NewID(), "paid", nil, s.requester.Public())
	if e == nil || e.Code != errs.AgreementRequired || e.Details["price_credits"] != float64(1_100_000) {
		t.Fatalf("no agreement: %v %v", e, e.Details)
	}
	if e := s.file(agreement(t, s.owner, s.seller.Public(), paid.ID, paid.Digest(), time.Now().Add(-time.Minute), "")); e != nil {
		t.Fatal(e)
	}
	s.balance(s.owner.Public(), 1_050_000) // the rate, not the retail price
	if _, e := s.admitID(protocol.NewID(), "paid", nil, s.requester.Public()); e == nil || e.Code != errs.InsufficientFunds ||
		e.Details["amount_micro"] != float64(1_100_000) || e.Details["shortfall_micro"] != float64(50_000) {
		t.Fatalf("short of retail: %v", e)
	}
	s.balance(s.owner.Public(), 1_100_000)
	id := protocol.NewID()
	if _, e := s.admitID(id, "paid", nil, s.requester.Public()); e != nil {
		t.Fatalf("retail covered: %v", e)
	}
	if tk, _ := s.ticket(id); !tk.Resale || tk.MarkupPct != 10 || tk.RetailMicro != 1_100_000 {
		t.Fatalf("ticket %+v", tk)
	}
}

// An owner who still owes part of an earlier sale is refused, whatever
// its credits.
func TestAdmitRefusesWhileUnpaid(t *testing.T) {
	s := pricedStand(t, 0, false)
	paid := sku(t, flatSKU(1_000_000))
	if e := s.file(agreement(t, s.owner, s.seller.Public(), paid.ID, paid.Digest(), time.Now().Add(-time.Minute), "")); e != nil {
		t.Fatal(e)
	}
	b, _ := json.Marshal(commerce.Balance{Credits: 50_000_000, Unpaid: 1, UpdatedAt: time.Now()})
	if _, err := s.comm.Put(t.Context(), commerce.BalancePrefix+s.owner.Public(), b); err != nil {
		t.Fatal(err)
	}
	if _, e := s.admitID(protocol.NewID(), "paid", nil, s.requester.Public()); e == nil || e.Code != errs.InsufficientFunds {
		t.Fatalf("unpaid: %v", e)
	}
}

// The markup is bounded at startup.
func TestStartRefusesMarkupOutOfRange(t *testing.T) {
	b := bustest.Start(t)
	for _, pct := range []int{-1, 101, 1500} {
		if w, err := agreements.Start(t.Context(), bustest.Env(t, b, "agreements-x", nil), agreements.Config{MarkupPct: pct}); err == nil {
			_ = w.Stop()
			t.Fatalf("markup %d accepted", pct)
		}
	}
}

// A request id whose sale was settled (its ticket consumed) is spent: a
// second requester sending it again gets no ticket, since the clearing
// would take the answer for a duplicate and charge nothing (final review
// 18 #1).
func TestSettledIDIsSpent(t *testing.T) {
	s := pricedStand(t, 10, false)
	paid := sku(t, flatSKU(1_000_000))
	if e := s.file(agreement(t, s.owner, s.seller.Public(), paid.ID, paid.Digest(), time.Now().Add(-time.Minute), "")); e != nil {
		t.Fatal(e)
	}
	s.balance(s.owner.Public(), 5_000_000)
	id := protocol.NewID()
	if _, e := s.admitID(id, "paid", nil, s.requester.Public()); e != nil {
		t.Fatalf("admit: %v", e)
	}
	// The clearing settled it: the settlement record stands, the ticket
	// is consumed.
	if _, err := s.comm.Put(t.Context(), commerce.SettlementKey(s.seller.Public(), id), []byte(`{"state":"settled"}`)); err != nil {
		t.Fatal(err)
	}
	if err := s.comm.Delete(t.Context(), commerce.TicketKey(s.seller.Public(), id)); err != nil {
		t.Fatal(err)
	}
	other := bustest.Agent(t)
	s.register(other.Public(), s.owner.Public(), "")
	for _, who := range []string{other.Public(), s.requester.Public()} {
		if _, e := s.admitID(id, "paid", nil, who); e == nil || e.Code != errs.Conflict || e.Details["request_id"] != id {
			t.Fatalf("a settled id sent again by %s…: %v", who[:8], e)
		}
		if _, ok := s.ticket(id); ok {
			t.Fatal("a new ticket for a settled id")
		}
	}
}
