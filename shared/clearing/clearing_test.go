package clearing

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/activity"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

const (
	flatSKU = `{"sku":"answers","covers":{"offerings":["answer"]},"price":{"model":"flat","currency":"XCR","amount_micro":1000000},"provider":{"id":"internal"}}`
	// 1 credit per 1,000 tokens, the first 1,000 tokens of each UTC day
	// included.
	tokensSKU = `{"sku":"tokens","covers":{"offerings":["write"]},"price":{"model":"per_unit","currency":"XCR","meter":"tokens_out","per":1000,"amount_micro":1000000,"included":{"quantity":1000,"period":"day"}},"provider":{"id":"internal"}}`
	usdSKU    = `{"sku":"usd","covers":{"offerings":["usd"]},"price":{"model":"flat","currency":"USD","amount_micro":1000000},"provider":{"id":"internal"}}`
)

type harness struct {
	t       *testing.T
	m       *bustest.Bus
	nc      *nats.Conn
	kv      jetstream.KeyValue
	reg     jetstream.KeyValue
	usage   jetstream.KeyValue
	workers []*Worker
	pct     int
	skus    []string

	seller, buyer         *keys.Agent
	sellerOwner, buyerOwn *keys.Agent
}

func newKey(t *testing.T) *keys.Agent {
	t.Helper()
	k, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// start runs copies of the worker at markup pct on a fresh bus, with a
// seller (its owner attested in its record) selling the SKUs, and a buyer.
func start(t *testing.T, copies, pct int, skus ...string) *harness {
	return startWith(t, copies, Config{MarkupPct: pct, SweepEvery: time.Hour}, nil, skus...)
}

func startWith(t *testing.T, copies int, cfg Config, now func() time.Time, skus ...string) *harness {
	t.Helper()
	m := bustest.Start(t)
	h := &harness{t: t, m: m, nc: bustest.Client(t, m), seller: newKey(t), buyer: newKey(t), sellerOwner: newKey(t), buyerOwn: newKey(t),
		pct: cfg.MarkupPct, skus: skus}
	js, _ := jetstream.New(h.nc)
	var err error
	ctx := t.Context()
	if h.kv, err = bus.Bucket(ctx, js, commerce.BucketConfig(1)); err != nil {
		t.Fatal(err)
	}
	if h.reg, err = bus.Bucket(ctx, js, jetstream.KeyValueConfig{Bucket: RegistryBucket}); err != nil {
		t.Fatal(err)
	}
	if h.usage, err = bus.Bucket(ctx, js, activity.UsageBucketConfig(1)); err != nil {
		t.Fatal(err)
	}
	var list []any
	for _, s := range skus {
		v, err := protocol.ParseJSON([]byte(s))
		if err != nil {
			t.Fatal(err)
		}
		list = append(list, v)
	}
	h.put(h.reg, h.seller.Public(), map[string]any{"id": h.seller.Public(), "owner": h.sellerOwner.Public(), "skus": list,
		"owner_expires_at": protocol.FormatTime(time.Now().AddDate(1, 0, 0)), "node": map[string]any{"id": newKey(t).Public()}})
	// The buyer's record predates owners: its node's key is its owner.
	h.put(h.reg, h.buyer.Public(), map[string]any{"id": h.buyer.Public(), "node": map[string]any{"id": h.buyerOwn.Public()}})
	for i := range copies {
		w, err := Start(ctx, bustest.Env(t, m, fmt.Sprintf("clearing-%d", i), now), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Stop() })
		h.workers = append(h.workers, w)
	}
	return h
}

func (h *harness) put(kv jetstream.KeyValue, key string, v any) {
	h.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		h.t.Fatal(err)
	}
	if _, err := kv.Put(h.t.Context(), key, b); err != nil {
		h.t.Fatal(err)
	}
}

func sku(t *testing.T, s string) commerce.SKU {
	t.Helper()
	k, err := commerce.ParseSKU([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// agree files the buyer's owner's agreement to s, really signed.
func (h *harness) agree(s string) {
	h.t.Helper()
	k := sku(h.t, s)
	a := commerce.Agreement{SellerAgent: h.seller.Public(), SKU: k.ID, SKUDigest: k.Digest(), AgreedAt: protocol.FormatTime(time.Now().Add(-time.Hour))}
	if err := commerce.Sign(&a, h.buyerOwn); err != nil {
		h.t.Fatal(err)
	}
	b, _ := json.Marshal(a)
	h.put(h.kv, commerce.AgreementKey(h.seller.Public(), h.buyerOwn.Public(), k.ID), commerce.AgreementRecord{Agreement: b, FiledAt: time.Now()})
}

func (h *harness) fund(owner string, credits int64) {
	h.t.Helper()
	h.put(h.kv, balanceKey(owner), commerce.Balance{Credits: credits, UpdatedAt: time.Now()})
}

func (h *harness) credits(owner string) int64 {
	h.t.Helper()
	b, _, err := bus.GetJSON[balance](h.t.Context(), h.kv, balanceKey(owner))
	if err != nil {
		h.t.Fatal(err)
	}
	return b.Credits
}

// answer is the seller's terminal answer to a fresh request of the buyer
// for offering, and its outbox copy's headers.
func (h *harness) answer(offering string, usage ...map[string]any) (requestID string, data []byte, hdr nats.Header) {
	h.t.Helper()
	req, err := protocol.New(protocol.TypeRequest, h.buyer.Public(), map[string]any{"offering": offering, "input": "hi"})
	if err != nil {
		h.t.Fatal(err)
	}
	req.To = h.seller.Public()
	payload := map[string]any{"status": "completed", "output": "ok"}
	if len(usage) > 0 {
		var list []any
		for _, u := range usage {
			list = append(list, u)
		}
		payload["usage"] = list
	}
	rep, err := protocol.NewReply(req, h.seller.Public(), payload)
	if err != nil {
		h.t.Fatal(err)
	}
	rep.To = h.buyer.Public()
	if err := rep.Sign(h.seller); err != nil {
		h.t.Fatal(err)
	}
	if data, err = rep.Marshal(); err != nil {
		h.t.Fatal(err)
	}
	hdr = nats.Header{}
	hdr.Set(protocol.HdrAuditInput, protocol.InputSHA256(req))
	hdr.Set(protocol.HdrAuditOffering, offering)
	hdr.Set(protocol.HdrAuditDuration, "3")
	h.admit(req.ID, offering, nil)
	return req.ID, data, hdr
}

// admit does what admission does for the buyer's request id to offering
// at the seller: when a SKU sold in credits covers it and the buyer's
// owner agreed to it, it writes the ticket (with the budget ceiling, when
// given). It reports whether it did.
func (h *harness) admit(id, offering string, ceiling *int64) bool {
	h.t.Helper()
	return h.admitFor(h.seller.Public(), h.sellerOwner.Public(), h.buyer.Public(), h.buyerOwn.Public(), h.skus, id, offering, ceiling)
}

func (h *harness) admitFor(seller, sellerOwner, requester, owner string, skus []string, id, offering string, ceiling *int64) bool {
	h.t.Helper()
	var list []commerce.SKU
	for _, raw := range skus {
		list = append(list, sku(h.t, raw))
	}
	if k, ok := commerce.For(list, offering); ok && k.Price.Paid() && k.Provider.ID == commerce.ProviderInternal && k.Price.Currency == commerce.Credits {
		akey := commerce.AgreementKey(seller, owner, k.ID)
		if _, err := h.kv.Get(h.t.Context(), akey); err != nil {
			return false
		}
		resale := false
		if e, err := h.usage.Get(h.t.Context(), activity.CatalogPrefix+seller); err == nil {
			resale, _ = activity.CatalogOfficial(e.Value(), false)
		}
		price, _ := json.Marshal(k.Value()["price"])
		t := commerce.Ticket{Seller: seller, SellerOwner: sellerOwner, Requester: requester, ConsumerOwner: owner, Offering: offering,
			RequestID: id, SKU: k.ID, SKUDigest: k.Digest(), Price: price, Agreement: akey, AdmittedAt: time.Now().UTC().Truncate(time.Millisecond),
			RetailMicro: k.Price.AmountMicro, Resale: resale, CeilingMicro: ceiling}
		if resale {
			t.MarkupPct = h.pct
		}
		b, _ := json.Marshal(t)
		if _, err := h.kv.Create(h.t.Context(), commerce.TicketKey(seller, id), b); err != nil {
			h.t.Fatal(err)
		}
		return true
	}
	return false
}

func (h *harness) copyOut(data []byte, hdr nats.Header) {
	h.t.Helper()
	if err := h.nc.PublishMsg(&nats.Msg{Subject: protocol.OutboxSubject(h.seller.Public()), Data: data, Header: hdr}); err != nil {
		h.t.Fatal(err)
	}
	if err := h.nc.Flush(); err != nil {
		h.t.Fatal(err)
	}
}

// settled waits for the settlement of request id to be settled.
func (h *harness) settled(id string) Settlement {
	h.t.Helper()
	var s Settlement
	waitFor(h.t, "settlement "+id, func() bool {
		var found bool
		s, found, _ = bus.GetJSON[Settlement](h.t.Context(), h.kv, SettlementKey(h.seller.Public(), id))
		return found && s.State == StateSettled
	})
	return s
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (h *harness) call(from keys.Signer, subject string, payload any) (map[string]any, error) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(h.t.Context(), 5*time.Second)
	defer cancel()
	rep, err := bus.Call(ctx, h.nc, from, subject, protocol.TypeRequest, "", payload)
	if err != nil {
		return nil, err
	}
	var out map[string]any
	return out, rep.DecodePayload(&out)
}

func TestOwnSKUSettles(t *testing.T) {
	h := start(t, 1, 10, flatSKU)
	h.agree(flatSKU)
	h.fund(h.buyerOwn.Public(), 5_000_000)
	id, data, hdr := h.answer("answer")
	h.copyOut(data, hdr)
	s := h.settled(id)
	// Own SKU: the buyer pays 1,000,000, the seller's owner receives all
	// of it, the platform nothing, markup or not.
	if s.Resale || s.Retail != 1_000_000 || s.Charged != 1_000_000 || s.ToSeller != 1_000_000 || s.ToPlatform != 0 || s.Unpaid != 0 {
		t.Fatalf("settlement: %+v", s)
	}
	if b, sb, p := h.credits(h.buyerOwn.Public()), h.credits(h.sellerOwner.Public()), h.credits(PlatformOwner); b != 4_000_000 || sb != 1_000_000 || p != 0 {
		t.Fatalf("balances: buyer %d seller owner %d platform %d", b, sb, p)
	}
	if s.ConsumerOwner != h.buyerOwn.Public() || s.SellerOwner != h.sellerOwner.Public() || s.Usage["requests"] != 1 {
		t.Fatalf("owners or usage: %+v", s)
	}
}

func TestResaleSettlesWithMarkup(t *testing.T) {
	h := start(t, 1, 10, flatSKU)
	h.agree(flatSKU)
	h.fund(h.buyerOwn.Public(), 5_000_000)
	// The operator marked the seller official in the catalog.
	on := true
	h.put(h.usage, activity.CatalogPrefix+h.seller.Public(), map[string]any{"agent_id": h.seller.Public(), "official_set": on})
	id, data, hdr := h.answer("answer")
	h.copyOut(data, hdr)
	s := h.settled(id)
	if !s.Resale || s.Rate != 1_000_000 || s.Retail != 1_100_000 || s.Markup != 100_000 {
		t.Fatalf("settlement: %+v", s)
	}
	if b, sb, p := h.credits(h.buyerOwn.Public()), h.credits(h.sellerOwner.Public()), h.credits(PlatformOwner); b != 3_900_000 || sb != 1_000_000 || p != 100_000 {
		t.Fatalf("balances: buyer %d seller owner %d platform %d", b, sb, p)
	}
}

func TestBalanceClampsAtZero(t *testing.T) {
	h := start(t, 1, 10, flatSKU)
	h.agree(flatSKU)
	h.fund(h.buyerOwn.Public(), 300_000)
	h.put(h.usage, activity.CatalogPrefix+h.seller.Public(), map[string]any{"agent_id": h.seller.Public(), "official_set": true})
	id, data, hdr := h.answer("answer")
	h.copyOut(data, hdr)
	s := h.settled(id)
	if s.Retail != 1_100_000 || s.Charged != 300_000 || s.Unpaid != 800_000 || s.ToSeller != 300_000 || s.ToPlatform != 0 {
		t.Fatalf("settlement: %+v", s)
	}
	if b, sb, p := h.credits(h.buyerOwn.Public()), h.credits(h.sellerOwner.Public()), h.credits(PlatformOwner); b != 0 || sb != 300_000 || p != 0 {
		t.Fatalf("balances: buyer %d seller owner %d platform %d", b, sb, p)
	}
	// An owner with no balance at all pays nothing and goes to zero, not
	// below.
	id2, data, hdr := h.answer("answer")
	h.copyOut(data, hdr)
	if s := h.settled(id2); s.Charged != 0 || s.Unpaid != 1_100_000 {
		t.Fatalf("second settlement: %+v", s)
	}
	if b := h.credits(h.buyerOwn.Public()); b != 0 {
		t.Fatalf("buyer balance %d", b)
	}
}

func TestPeriodAggregateIncludedAllowance(t *testing.T) {
	h := start(t, 1, 10, tokensSKU)
	h.agree(tokensSKU)
	h.fund(h.buyerOwn.Public(), 5_000_000)
	// 600 tokens: inside the 1,000 included; nothing to pay.
	id1, data, hdr := h.answer("write", map[string]any{"meter": "tokens_out", "quantity": 600})
	h.copyOut(data, hdr)
	if s := h.settled(id1); s.Rate != 0 || s.Charged != 0 || s.Usage["tokens_out"] != 600 {
		t.Fatalf("first: %+v", s)
	}
	// 600 more: the period is at 1,200, 200 past the allowance:
	// floor(200 × 1,000,000 / 1,000) = 200,000 for this request.
	id2, data, hdr := h.answer("write", map[string]any{"meter": "tokens_out", "quantity": 600})
	h.copyOut(data, hdr)
	if s := h.settled(id2); s.Rate != 200_000 || s.Charged != 200_000 {
		t.Fatalf("second: %+v", s)
	}
	// 1,500 more: 2,700 in all, rated 1,700,000; 1,500,000 is this one's.
	id3, data, hdr := h.answer("write", map[string]any{"meter": "tokens_out", "quantity": 1500})
	h.copyOut(data, hdr)
	if s := h.settled(id3); s.Rate != 1_500_000 {
		t.Fatalf("third: %+v", s)
	}
	if b, sb := h.credits(h.buyerOwn.Public()), h.credits(h.sellerOwner.Public()); b != 3_300_000 || sb != 1_700_000 {
		t.Fatalf("balances: buyer %d seller owner %d", b, sb)
	}
	agg, _, err := bus.GetJSON[aggregate](t.Context(), h.kv, aggregateKey(&Settlement{ConsumerOwner: h.buyerOwn.Public(),
		Seller: h.seller.Public(), SKUDigest: sku(t, tokensSKU).Digest(), Period: commerce.PeriodKey(commerce.PeriodDay, time.Now())}))
	if err != nil || agg.Quantity != 2700 || agg.Rated != 1_700_000 {
		t.Fatalf("aggregate %+v %v", agg, err)
	}
}

// Three copies of the worker, each answer's copy published three times:
// every answer settles once.
func TestOnceUnderCopiesAndDuplicates(t *testing.T) {
	h := start(t, 3, 10, flatSKU)
	h.agree(flatSKU)
	h.fund(h.buyerOwn.Public(), 100_000_000)
	var ids []string
	for range 5 {
		id, data, hdr := h.answer("answer")
		ids = append(ids, id)
		for range 3 {
			h.copyOut(data, hdr)
		}
	}
	for _, id := range ids {
		h.settled(id)
	}
	// Every copy has taken its share of the duplicates before the
	// balances are read.
	waitFor(t, "every copy handled", func() bool {
		var n uint64
		for _, w := range h.workers {
			s := w.Stats()
			n += s.Settled + s.Duplicates
		}
		return n >= 15
	})
	if b, sb := h.credits(h.buyerOwn.Public()), h.credits(h.sellerOwner.Public()); b != 95_000_000 || sb != 5_000_000 {
		t.Fatalf("balances: buyer %d seller owner %d", b, sb)
	}
	var settled uint64
	for _, w := range h.workers {
		settled += w.Stats().Settled
	}
	if settled != 5 {
		t.Fatalf("%d settlements run to the end, want 5", settled)
	}
}

func TestNotChargedWithoutAgreementOrForFreeOrForeign(t *testing.T) {
	h := start(t, 1, 10, flatSKU, usdSKU)
	h.fund(h.buyerOwn.Public(), 5_000_000)
	id, data, hdr := h.answer("answer") // no agreement
	h.copyOut(data, hdr)
	id2, data2, hdr2 := h.answer("usd") // priced in dollars: not the mesh's to clear
	h.copyOut(data2, hdr2)
	id3, data3, hdr3 := h.answer("free") // no SKU covers it
	h.copyOut(data3, hdr3)
	waitFor(t, "the unagreed answer seen", func() bool { return h.workers[0].Stats().NotCharged >= 1 })
	// The tap takes copies in order: once a later one is settled, the
	// three above were handled.
	h.agree(flatSKU)
	id4, data4, hdr4 := h.answer("answer")
	h.copyOut(data4, hdr4)
	h.settled(id4)
	for _, x := range []string{id, id2, id3} {
		if _, found, _ := bus.GetJSON[Settlement](t.Context(), h.kv, SettlementKey(h.seller.Public(), x)); found {
			t.Errorf("request %s was settled", x)
		}
	}
	if b := h.credits(h.buyerOwn.Public()); b != 4_000_000 {
		t.Fatalf("buyer %d", b)
	}
}

// A copy that dies after any step leaves the settlement for another to
// finish; a step run twice (died after the balance, before the record)
// applies once.
func TestResumeAfterCrashAtEveryStep(t *testing.T) {
	for _, stop := range []string{StateRated, StateCharged, StateCredited} {
		t.Run(stop, func(t *testing.T) {
			h := start(t, 0, 10, flatSKU)
			h.fund(h.buyerOwn.Public(), 5_000_000)
			rec := h.newSale(true)
			dying := &engine{kv: h.kv, now: time.Now, crash: func(s *Settlement) bool { return s.State == stop }}
			if _, _, err := dying.run(t.Context(), rec); err != errCrash {
				t.Fatalf("run: %v", err)
			}
			// The record as the dead copy left it; a stale copy of it
			// (read before the last step) is what a racing copy holds.
			stored, _, _ := bus.GetJSON[Settlement](t.Context(), h.kv, commerce.SettlementPrefix+rec.Key)
			if stored.State != stop {
				t.Fatalf("state %s", stored.State)
			}
			e := &engine{kv: h.kv, now: time.Now}
			var wg sync.WaitGroup
			for _, s := range []Settlement{*rec, stored, stored} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if _, _, err := e.run(t.Context(), &s); err != nil {
						t.Error(err)
					}
				}()
			}
			wg.Wait()
			h.checkSale(rec.Key)
		})
	}
}

// A copy that died between a balance's compare-and-set and the record's
// (the worst place): the step run again reads its marker.
func TestStepRepeatedAfterBalanceWrite(t *testing.T) {
	h := start(t, 0, 10, flatSKU)
	h.fund(h.buyerOwn.Public(), 5_000_000)
	rec := h.newSale(true)
	e := &engine{kv: h.kv, now: time.Now}
	rated, _, err := e.rate(t.Context(), rec)
	if err != nil {
		t.Fatal(err)
	}
	// Charge twice and credit twice from the same stale record, as two
	// copies that each died before advancing it would.
	if _, _, err := e.charge(t.Context(), rated); err != nil {
		t.Fatal(err)
	}
	charged, _, err := e.charge(t.Context(), rated)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.add(t.Context(), h.sellerOwner.Public(), marker(charged, roleCredit), charged.ToSeller); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.run(t.Context(), charged); err != nil {
		t.Fatal(err)
	}
	h.checkSale(rec.Key)
	// The sweep clears the markers once they are old enough.
	s, _, _ := bus.GetJSON[Settlement](t.Context(), h.kv, commerce.SettlementPrefix+rec.Key)
	if err := e.clearMarkers(t.Context(), &s); err != nil {
		t.Fatal(err)
	}
	b, _, _ := bus.GetJSON[balance](t.Context(), h.kv, balanceKey(h.buyerOwn.Public()))
	if len(b.Pending) != 0 || b.Credits != 3_900_000 {
		t.Fatalf("buyer balance after clearing %+v", b)
	}
}

// newSale records a resale of flatSKU to the buyer (state new).
func (h *harness) newSale(resale bool) *Settlement {
	h.t.Helper()
	k := sku(h.t, flatSKU)
	price, _ := json.Marshal(k.Value()["price"])
	now := time.Now()
	s := &Settlement{Key: saleKey(h.seller.Public(), protocol.NewID()), Kind: KindSale, State: StateNew, Seller: h.seller.Public(), Requester: h.buyer.Public(),
		ConsumerOwner: h.buyerOwn.Public(), SellerOwner: h.sellerOwner.Public(), SKU: k.ID, SKUDigest: k.Digest(), Price: price,
		Period: commerce.PeriodKey(commerce.PeriodDay, now), Usage: map[string]int64{"requests": 1}, Resale: resale, MarkupPct: 10,
		At: protocol.FormatTime(now), CreatedAt: protocol.FormatTime(now), UpdatedAt: protocol.FormatTime(now)}
	b, _ := json.Marshal(s)
	if _, err := h.kv.Create(h.t.Context(), commerce.SettlementPrefix+s.Key, b); err != nil {
		h.t.Fatal(err)
	}
	return s
}

// checkSale asserts one resale of 1,000,000 at 10 % moved exactly once.
func (h *harness) checkSale(key string) {
	h.t.Helper()
	s, _, _ := bus.GetJSON[Settlement](h.t.Context(), h.kv, commerce.SettlementPrefix+key)
	if s.State != StateSettled || s.Charged != 1_100_000 || s.ToSeller != 1_000_000 || s.ToPlatform != 100_000 {
		h.t.Fatalf("settlement %+v", s)
	}
	if b, sb, p := h.credits(h.buyerOwn.Public()), h.credits(h.sellerOwner.Public()), h.credits(PlatformOwner); b != 3_900_000 || sb != 1_000_000 || p != 100_000 {
		h.t.Fatalf("balances: buyer %d seller owner %d platform %d", b, sb, p)
	}
}

func TestGrantBalanceHistory(t *testing.T) {
	h := start(t, 2, 10, flatSKU)
	services := h.m.ServicesKey()
	owner := h.buyerOwn.Public()
	out, err := h.call(services, protocol.SubjCreditsGrant, map[string]any{"owner": owner, "credits": 2_500_000, "reason": "welcome"})
	if err != nil || out["credits"] != 2_500_000.0 || out["currency"] != "XCR" {
		t.Fatalf("grant: %v %v", out, err)
	}
	// Only the services key grants.
	if _, err := h.call(h.buyer, protocol.SubjCreditsGrant, map[string]any{"owner": owner, "credits": 1}); errs.As(err).Code != errs.Forbidden {
		t.Fatalf("an agent granted: %v", err)
	}
	for _, bad := range []map[string]any{{"owner": owner, "credits": 0}, {"owner": owner, "credits": 1.5}, {"owner": "x", "credits": 1},
		{"owner": owner, "credits": 1, "extra": 1}} {
		if _, err := h.call(services, protocol.SubjCreditsGrant, bad); errs.As(err).Code != errs.InvalidRequest {
			t.Errorf("grant %v: %v", bad, err)
		}
	}
	// A sale, then the buyer's agent reads its owner's balance and history.
	h.agree(flatSKU)
	id, data, hdr := h.answer("answer")
	h.copyOut(data, hdr)
	h.settled(id)
	bal, err := h.call(h.buyer, protocol.CreditVerbSubject("balance"), map[string]any{})
	if err != nil || bal["owner"] != owner || bal["credits"] != 1_500_000.0 {
		t.Fatalf("balance: %v %v", bal, err)
	}
	if _, err := h.call(h.buyer, protocol.CreditVerbSubject("balance"), map[string]any{"owner": h.sellerOwner.Public()}); errs.As(err).Code != errs.Forbidden {
		t.Fatalf("an agent read another owner's balance: %v", err)
	}
	// The owner key reads its own; the services key any.
	if b, err := h.call(h.sellerOwner, protocol.CreditVerbSubject("balance"), map[string]any{}); err != nil || b["credits"] != 1_000_000.0 {
		t.Fatalf("owner's own balance: %v %v", b, err)
	}
	if b, err := h.call(services, protocol.CreditVerbSubject("balance"), map[string]any{"owner": owner}); err != nil || b["credits"] != 1_500_000.0 {
		t.Fatalf("services: %v %v", b, err)
	}
	if b, err := h.call(services, protocol.CreditVerbSubject("balance"), map[string]any{"owner": PlatformOwner}); err != nil || b["credits"] != 0.0 {
		t.Fatalf("the platform's balance: %v %v", b, err)
	}
	if _, err := h.call(h.buyer, protocol.CreditVerbSubject("balance"), map[string]any{"owner": PlatformOwner}); errs.As(err).Code != errs.InvalidRequest {
		t.Fatalf("an agent asked for the platform's balance: %v", err)
	}
	page, err := h.call(h.buyer, protocol.CreditVerbSubject("history"), map[string]any{"limit": 1})
	if err != nil {
		t.Fatal(err)
	}
	entries, _ := page["entries"].([]any)
	first, _ := entries[0].(map[string]any)
	if len(entries) != 1 || first["kind"] != EntryPurchase || first["amount_micro"] != -1_000_000.0 || first["request_id"] != id || page["next"] == nil {
		t.Fatalf("history page 1: %v", page)
	}
	page, err = h.call(h.buyer, protocol.CreditVerbSubject("history"), map[string]any{"limit": 1, "before": page["next"]})
	entries, _ = page["entries"].([]any)
	if err != nil || len(entries) != 1 || entries[0].(map[string]any)["kind"] != EntryGrant || entries[0].(map[string]any)["reason"] != "welcome" || page["next"] != nil {
		t.Fatalf("history page 2: %v %v", page, err)
	}
	sales, err := h.call(services, protocol.CreditVerbSubject("history"), map[string]any{"owner": h.sellerOwner.Public()})
	if e, _ := sales["entries"].([]any); err != nil || len(e) != 1 || e[0].(map[string]any)["kind"] != EntrySale {
		t.Fatalf("seller's owner's history: %v %v", sales, err)
	}
}

// The sweep finishes a settlement a dead copy left (here: recorded, not a
// step taken), clears its markers once they are MarkerKeep old, and
// deletes the record after Keep, by the worker's clock.
func TestSweepFinishesClearsAndForgets(t *testing.T) {
	var mu sync.Mutex
	clock := time.Now()
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }
	h := startWith(t, 2, Config{MarkupPct: 10, SweepEvery: 100 * time.Millisecond, Grace: time.Second, Keep: MinKeep}, now, flatSKU)
	h.fund(h.buyerOwn.Public(), 5_000_000)
	rec := h.newSale(true)
	advance(2 * time.Second) // past the grace
	key := commerce.SettlementPrefix + rec.Key
	waitFor(t, "the sweep settling it", func() bool {
		s, _, _ := bus.GetJSON[Settlement](t.Context(), h.kv, key)
		return s.State == StateSettled
	})
	h.checkSale(rec.Key)
	b, _, _ := bus.GetJSON[balance](t.Context(), h.kv, balanceKey(h.buyerOwn.Public()))
	if len(b.Pending) != 1 {
		t.Fatalf("the buyer's marker is gone before its time: %+v", b)
	}
	advance(MarkerKeep)
	waitFor(t, "the markers cleared", func() bool {
		s, _, _ := bus.GetJSON[Settlement](t.Context(), h.kv, key)
		return s.MarkersCleared
	})
	for _, owner := range []string{h.buyerOwn.Public(), h.sellerOwner.Public(), PlatformOwner} {
		if b, _, _ := bus.GetJSON[balance](t.Context(), h.kv, balanceKey(owner)); len(b.Pending) != 0 {
			t.Fatalf("%s keeps markers: %+v", owner, b)
		}
	}
	advance(MinKeep)
	waitFor(t, "the record forgotten", func() bool {
		_, found, _ := bus.GetJSON[Settlement](t.Context(), h.kv, key)
		return !found
	})
	// What it moved stays moved, and its history stays.
	h.checkBalances(3_900_000, 1_000_000, 100_000)
	var resumed uint64
	for _, w := range h.workers {
		resumed += w.Stats().Resumed
	}
	if resumed != 1 {
		t.Fatalf("resumed %d times", resumed)
	}
}

func (h *harness) checkBalances(buyer, seller, platform int64) {
	h.t.Helper()
	if b, sb, p := h.credits(h.buyerOwn.Public()), h.credits(h.sellerOwner.Public()), h.credits(PlatformOwner); b != buyer || sb != seller || p != platform {
		h.t.Fatalf("balances: buyer %d seller owner %d platform %d, want %d %d %d", b, sb, p, buyer, seller, platform)
	}
}

// A protocol 0.3 requester answered late (a held request answered from
// the inbox) gets the answer as a request naming the original: it is the
// answer that ends the request, and it settles like a respond.
func TestLateAnswerAsRequestSettles(t *testing.T) {
	h := start(t, 1, 10, flatSKU)
	h.agree(flatSKU)
	h.fund(h.buyerOwn.Public(), 5_000_000)
	req, err := protocol.New(protocol.TypeRequest, h.buyer.Public(), map[string]any{"offering": "answer", "input": "hi"})
	if err != nil {
		t.Fatal(err)
	}
	late, err := protocol.New(protocol.TypeRequest, h.seller.Public(), map[string]any{"offering": "answer", "input": "ok", "status": "completed"})
	if err != nil {
		t.Fatal(err)
	}
	late.InReplyTo, late.To = req.ID, h.buyer.Public()
	if err := late.Sign(h.seller); err != nil {
		t.Fatal(err)
	}
	data, _ := late.Marshal()
	hdr := nats.Header{}
	hdr.Set(protocol.HdrAuditInput, protocol.InputSHA256(req))
	hdr.Set(protocol.HdrAuditOffering, "answer")
	h.admit(req.ID, "answer", nil)
	h.copyOut(data, hdr)
	if s := h.settled(req.ID); s.Charged != 1_000_000 || s.RespondID != late.ID {
		t.Fatalf("settlement %+v", s)
	}
	h.checkBalances(4_000_000, 1_000_000, 0)
	// Without the headers (not the answer that ends a request), or failed,
	// nothing is settled: the next one's settlement shows they were passed.
	failed, _ := protocol.New(protocol.TypeRequest, h.seller.Public(), map[string]any{"offering": "answer", "status": "failed"})
	failed.InReplyTo, failed.To = protocol.NewID(), h.buyer.Public()
	_ = failed.Sign(h.seller)
	fb, _ := failed.Marshal()
	h.copyOut(fb, hdr)
	h.copyOut(data, nil)
	id, d2, h2 := h.answer("answer")
	h.copyOut(d2, h2)
	h.settled(id)
	h.checkBalances(3_000_000, 2_000_000, 0)
	if _, found, _ := bus.GetJSON[Settlement](t.Context(), h.kv, SettlementKey(h.seller.Public(), failed.InReplyTo)); found {
		t.Fatal("a failed answer was settled")
	}
}
