package agreements_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/agreements"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/metering"
	"agentmesh.dev/mesh/shared/protocol"
)

const console = "https://console.example.com/console/"

// stand is a bus with copies of the agreements worker, the registry's and
// the commerce bucket, a seller whose manifest publishes SKUs, and a
// requester registered on a node (its owner, by default).
type stand struct {
	t         *testing.T
	b         *bustest.Bus
	nc        *nats.Conn
	reg, comm jetstream.KeyValue
	seller    *keys.Agent
	requester *keys.Agent
	owner     *keys.Agent // the requester's node key: its default owner
}

func newStand(t *testing.T, copies int) *stand {
	t.Helper()
	b := bustest.Start(t)
	for i := range copies {
		w, err := agreements.Start(t.Context(), bustest.Env(t, b, fmt.Sprintf("agreements-%d", i), nil), agreements.Config{ConsoleURL: console})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Stop() })
	}
	return standOn(t, b)
}

// standOn is the stand on b, where the workers already run.
func standOn(t *testing.T, b *bustest.Bus) *stand {
	t.Helper()
	s := &stand{t: t, b: b, nc: bustest.Client(t, b), seller: bustest.Agent(t), requester: bustest.Agent(t), owner: bustest.Agent(t)}
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
	s.register(s.seller.Public(), bustest.Agent(t).Public(), "", flatSKU(250000))
	s.register(s.requester.Public(), s.owner.Public(), "")
	return s
}

// SKU values as a manifest publishes them.
func flatSKU(amount int64) map[string]any {
	return map[string]any{"sku": "paid-flat", "covers": map[string]any{"offerings": []any{"paid"}},
		"price":    map[string]any{"model": "flat", "currency": "XCR", "amount_micro": amount},
		"provider": map[string]any{"id": "internal"}}
}

func freeSKU() map[string]any {
	return map[string]any{"sku": "free-tier", "covers": map[string]any{"offerings": []any{"free"}},
		"price": map[string]any{"model": "free"}, "provider": map[string]any{"id": "internal"}}
}

// register writes agent's registry record: on node, with owner when set,
// publishing skus.
func (s *stand) register(agent, node, owner string, skus ...map[string]any) {
	s.t.Helper()
	rec := map[string]any{"id": agent, "name": "a", "node": map[string]any{"id": node}}
	if owner != "" {
		rec["owner"], rec["owner_expires_at"] = owner, protocol.FormatTime(time.Now().Add(time.Hour))
	}
	if len(skus) > 0 {
		list := make([]any, len(skus))
		for i, v := range skus {
			list[i] = v
		}
		rec["skus"] = list
	}
	b, _ := json.Marshal(rec)
	if _, err := s.reg.Put(s.t.Context(), agent, b); err != nil {
		s.t.Fatal(err)
	}
}

// sku is the seller's SKU as the service reads it.
func sku(t *testing.T, v map[string]any) commerce.SKU {
	t.Helper()
	b, _ := json.Marshal(v)
	out, err := commerce.ParseSKU(b)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func (s *stand) call(from keys.Signer, subject string, payload any) (map[string]any, *errs.Error) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(s.t.Context(), 10*time.Second)
	defer cancel()
	rep, err := bus.Call(ctx, s.nc, from, subject, protocol.TypeRequest, "", payload)
	if err != nil {
		e := errs.As(err)
		if e.Code == errs.TransportTimeout || e.Code == errs.TransportNoResponders || e.Code == errs.InternalError {
			s.t.Fatalf("%s: %v", subject, err)
		}
		return nil, e
	}
	if rep.From != s.b.ServicesKey().Public() {
		s.t.Fatalf("answer signed by %s", rep.From)
	}
	var out map[string]any
	if err := rep.DecodePayload(&out); err != nil {
		s.t.Fatal(err)
	}
	return out, nil
}

func (s *stand) admit(offering string, budget *protocol.Budget) (map[string]any, *errs.Error) {
	q := map[string]any{"requester": s.requester.Public(), "offering": offering, "request_id": protocol.NewID()}
	if budget != nil {
		q["budget"] = budget
	}
	return s.call(s.seller, protocol.SubjCommerceAdmit, q)
}

// agreement signs owner's agreement to the seller's SKU at digest.
func agreement(t *testing.T, owner keys.Signer, seller, skuID, digest string, agreedAt time.Time, expires string) commerce.Agreement {
	t.Helper()
	a := commerce.Agreement{SellerAgent: seller, SKU: skuID, SKUDigest: digest, AgreedAt: protocol.FormatTime(agreedAt), ExpiresAt: expires}
	if err := commerce.Sign(&a, owner); err != nil {
		t.Fatal(err)
	}
	return a
}

func (s *stand) file(a commerce.Agreement) *errs.Error {
	_, e := s.call(s.requester, protocol.AgreementVerbSubject("file"), a)
	return e
}

func (s *stand) balance(owner string, credits int64) {
	s.t.Helper()
	b, _ := json.Marshal(commerce.Balance{Credits: credits, UpdatedAt: time.Now()})
	if _, err := s.comm.Put(s.t.Context(), commerce.BalancePrefix+owner, b); err != nil {
		s.t.Fatal(err)
	}
}

func (s *stand) engagement(t commerce.EngagementTerms, offering string) {
	s.t.Helper()
	b, _ := json.Marshal(t)
	if _, err := s.comm.Put(s.t.Context(), commerce.EngagementKey(t.Seller, t.Client, offering), b); err != nil {
		s.t.Fatal(err)
	}
}

func keysOf(m map[string]any) []string { return slices.Sorted(maps.Keys(m)) }

// The admission decision, case by case, each from live state: the
// refusal's code, and for AGREEMENT_REQUIRED exactly the four members the
// specification names.
func TestAdmit(t *testing.T) {
	s := newStand(t, 1)
	seller := s.seller.Public()
	node := bustest.Agent(t).Public()
	s.register(seller, node, "", flatSKU(250000), freeSKU())
	paid := sku(t, flatSKU(250000))
	now := time.Now()
	s.balance(s.owner.Public(), 1_000_000)

	refused := metering.Requests
	events := make(chan *nats.Msg, 16)
	sub, err := s.nc.ChanSubscribe(agreements.SubjRefused, events)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	// Free: an offering no SKU covers, and one a free SKU covers.
	for _, o := range []string{"uncovered", "free"} {
		out, e := s.admit(o, nil)
		if e != nil || out["admitted"] != true {
			t.Fatalf("%s: %v %v", o, out, e)
		}
	}

	// Paid, without an agreement.
	_, e := s.admit("paid", nil)
	if e == nil || e.Code != errs.AgreementRequired || e.Retryable {
		t.Fatalf("no agreement: %v", e)
	}
	if got := keysOf(e.Details); !slices.Equal(got, []string{"approval_url", "price_credits", "sku", "sku_digest"}) {
		t.Fatalf("details members %v", got)
	}
	if e.Details["sku"] != "paid-flat" || e.Details["sku_digest"] != paid.Digest() ||
		e.Details["approval_url"] != "https://console.example.com/console/agreements/approve?sku=paid-flat" || e.Details["price_credits"] != float64(250000) {
		t.Fatalf("details %v", e.Details)
	}
	select {
	case m := <-events:
		var env struct {
			Payload struct {
				Data metering.Event `json:"data"`
			} `json:"payload"`
		}
		if err := json.Unmarshal(m.Data, &env); err != nil || env.Payload.Data.RefusalCode != string(errs.AgreementRequired) ||
			env.Payload.Data.Meter != refused || env.Payload.Data.Quantity != 0 || env.Payload.Data.Provider != seller {
			t.Fatalf("refusal event %s %v", m.Data, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no refusal meter event")
	}

	// Another seller's agreement does not cover this one.
	other := bustest.Agent(t).Public()
	s.register(other, node, "", flatSKU(250000))
	if e := s.file(agreement(t, s.owner, other, "paid-flat", paid.Digest(), now, "")); e != nil {
		t.Fatal(e)
	}
	if _, e := s.admit("paid", nil); e == nil || e.Code != errs.AgreementRequired {
		t.Fatalf("another seller's agreement: %v", e)
	}

	// An expired agreement on file (filing refuses one already expired,
	// so it is written as the service would have kept it).
	exp := agreement(t, s.owner, seller, "paid-flat", paid.Digest(), now.Add(-2*time.Hour), protocol.FormatTime(now.Add(-time.Hour)))
	raw, _ := json.Marshal(exp)
	rec, _ := json.Marshal(commerce.AgreementRecord{Agreement: raw, FiledAt: now.Add(-2 * time.Hour)})
	if _, err := s.comm.Put(t.Context(), commerce.AgreementKey(seller, s.owner.Public(), "paid-flat"), rec); err != nil {
		t.Fatal(err)
	}
	if _, e := s.admit("paid", nil); e == nil || e.Code != errs.AgreementRequired {
		t.Fatalf("expired: %v", e)
	}

	// A covering agreement admits.
	if e := s.file(agreement(t, s.owner, seller, "paid-flat", paid.Digest(), now, protocol.FormatTime(now.Add(time.Hour)))); e != nil {
		t.Fatal(e)
	}
	out, e := s.admit("paid", nil)
	if e != nil || out["admitted"] != true || out["sku"] != "paid-flat" || out["sku_digest"] != paid.Digest() {
		t.Fatalf("covered: %v %v", out, e)
	}

	// A cost ceiling below the flat price.
	low := &protocol.Budget{CostCeiling: &protocol.Money{AmountMicro: 100000, Currency: "XCR"}}
	if _, e := s.admit("paid", low); e == nil || e.Code != errs.BudgetInsufficient {
		t.Fatalf("price cap: %v", e)
	} else if est, _ := e.Details["estimate"].(map[string]any); est["amount_micro"] != float64(250000) || est["currency"] != "XCR" {
		t.Fatalf("estimate %v", e.Details)
	}
	enough := &protocol.Budget{CostCeiling: &protocol.Money{AmountMicro: 250000, Currency: "XCR"}}
	if _, e := s.admit("paid", enough); e != nil {
		t.Fatalf("a ceiling at the price: %v", e)
	}

	// Credits below the price.
	s.balance(s.owner.Public(), 200000)
	if _, e := s.admit("paid", nil); e == nil || e.Code != errs.InsufficientFunds ||
		e.Details["shortfall_micro"] != float64(50000) || e.Details["currency"] != "XCR" || e.Details["amount_micro"] != float64(250000) {
		t.Fatalf("funds: %v", e)
	}
	s.balance(s.owner.Public(), 1_000_000)

	// Re-pricing makes the agreement stale at once: the refusal names the
	// new digest.
	s.register(seller, node, "", flatSKU(300000), freeSKU())
	repriced := sku(t, flatSKU(300000))
	if _, e := s.admit("paid", nil); e == nil || e.Code != errs.AgreementRequired || e.Details["sku_digest"] != repriced.Digest() ||
		e.Details["price_credits"] != float64(300000) {
		t.Fatalf("stale: %v", e)
	}
	if e := s.file(agreement(t, s.owner, seller, "paid-flat", paid.Digest(), now, "")); e == nil || e.Code != errs.Conflict ||
		e.Details["sku_digest"] != repriced.Digest() {
		t.Fatalf("filing to a stale digest: %v", e)
	}
	fresh := agreement(t, s.owner, seller, "paid-flat", repriced.Digest(), now.Add(time.Second), "")
	if e := s.file(fresh); e != nil {
		t.Fatal(e)
	}
	if _, e := s.admit("paid", nil); e != nil {
		t.Fatalf("re-agreed: %v", e)
	}

	// Revoked: prospective, and a copy of the revoked agreement filed again
	// does not restore it.
	rv := agreements.Revocation{SellerAgent: seller, SKU: "paid-flat", AgreedAt: fresh.AgreedAt, RevokedAt: protocol.FormatTime(now.Add(2 * time.Second))}
	if err := agreements.SignRevocation(&rv, s.owner); err != nil {
		t.Fatal(err)
	}
	out, e = s.call(s.requester, protocol.AgreementVerbSubject("revoke"), rv)
	if e != nil || out["status"] != "revoked" {
		t.Fatalf("revoke: %v %v", out, e)
	}
	if _, e := s.admit("paid", nil); e == nil || e.Code != errs.AgreementRequired {
		t.Fatalf("revoked: %v", e)
	}
	if e := s.file(fresh); e == nil || e.Code != errs.Conflict {
		t.Fatalf("re-filing a revoked agreement: %v", e)
	}
	if _, e := s.admit("paid", nil); e == nil || e.Code != errs.AgreementRequired {
		t.Fatalf("revoked, after the replay: %v", e)
	}
	// A later agreement restores it; the old revocation replayed does not
	// touch it.
	if e := s.file(agreement(t, s.owner, seller, "paid-flat", repriced.Digest(), now.Add(3*time.Second), "")); e != nil {
		t.Fatal(e)
	}
	if _, e := s.call(s.requester, protocol.AgreementVerbSubject("revoke"), rv); e == nil || e.Code != errs.Conflict {
		t.Fatalf("an old revocation replayed: %v", e)
	}
	if _, e := s.admit("paid", nil); e != nil {
		t.Fatalf("re-agreed after revoking: %v", e)
	}
}

// The requester's owner is the registry record's owner when it has one,
// else its node: an agreement signed by the node key no longer covers
// once the agent registers with an attested owner.
func TestAdmitOwnerFromRecord(t *testing.T) {
	s := newStand(t, 1)
	paid := sku(t, flatSKU(250000))
	now := time.Now()
	s.balance(s.owner.Public(), 1_000_000)
	if e := s.file(agreement(t, s.owner, s.seller.Public(), "paid-flat", paid.Digest(), now, "")); e != nil {
		t.Fatal(e)
	}
	if _, e := s.admit("paid", nil); e != nil {
		t.Fatalf("node as owner: %v", e)
	}
	attested := bustest.Agent(t)
	s.register(s.requester.Public(), s.owner.Public(), attested.Public())
	if _, e := s.admit("paid", nil); e == nil || e.Code != errs.AgreementRequired {
		t.Fatalf("attested owner without an agreement: %v", e)
	}
}

// Engagement volume across three copies: of many concurrent requests
// exactly the limit is admitted, the rest refused RATE_LIMITED with the
// time to the window's end.
func TestVolumeConcurrentCopies(t *testing.T) {
	s := newStand(t, 3)
	const limit, requests = 4, 24
	s.engagement(commerce.EngagementTerms{SowID: "sow-1", Version: 1, Seller: s.seller.Public(), Client: s.requester.Public(),
		Offerings: []string{"free"}, StartsAt: time.Now().Add(-time.Hour), Volume: &commerce.Volume{PerHour: limit}}, "free")
	var mu sync.Mutex
	admitted, limited := 0, 0
	var wg sync.WaitGroup
	for range requests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			_, err := bus.Call(ctx, s.nc, s.seller, protocol.SubjCommerceAdmit, protocol.TypeRequest, "",
				map[string]any{"requester": s.requester.Public(), "offering": "free", "request_id": protocol.NewID()})
			mu.Lock()
			defer mu.Unlock()
			switch e := errs.As(err); {
			case err == nil:
				admitted++
			case e.Code == errs.RateLimited && e.RetryAfterMS > 0 && e.RetryAfterMS <= time.Hour.Milliseconds() &&
				e.Details["sow_id"] == "sow-1" && e.Details["window"] == "hour" && e.Details["limit"] == float64(limit):
				limited++
			default:
				t.Errorf("unexpected answer: %v", err)
			}
		}()
	}
	wg.Wait()
	if admitted != limit || limited != requests-limit {
		t.Fatalf("admitted %d, rate limited %d; want %d and %d", admitted, limited, limit, requests-limit)
	}
}

// A day window full gives back the hour's unit it took.
func TestVolumeDayGivesBackHour(t *testing.T) {
	s := newStand(t, 1)
	s.engagement(commerce.EngagementTerms{SowID: "sow-2", Seller: s.seller.Public(), Client: s.requester.Public(),
		StartsAt: time.Now().Add(-time.Hour), Volume: &commerce.Volume{PerHour: 5, PerDay: 1}}, "free")
	if _, e := s.admit("free", nil); e != nil {
		t.Fatal(e)
	}
	if _, e := s.admit("free", nil); e == nil || e.Code != errs.RateLimited || e.Details["window"] != "day" {
		t.Fatalf("day: %v", e)
	}
	now := time.Now().UTC()
	entry, err := s.comm.Get(t.Context(), agreements.VolumeKey(s.seller.Public(), s.requester.Public(), "sow-2", 0, agreements.WindowHour, now.Truncate(time.Hour)))
	if err != nil {
		t.Fatal(err)
	}
	var c struct{ Count int64 }
	if err := json.Unmarshal(entry.Value(), &c); err != nil || c.Count != 1 {
		t.Fatalf("hour counter %s", entry.Value())
	}
	// An engagement no longer in force limits nothing.
	ended := time.Now().Add(-time.Minute)
	s.engagement(commerce.EngagementTerms{SowID: "sow-2", Seller: s.seller.Public(), Client: s.requester.Public(),
		StartsAt: time.Now().Add(-time.Hour), EffectiveUntil: &ended, Volume: &commerce.Volume{PerDay: 1}}, "free")
	if _, e := s.admit("free", nil); e != nil {
		t.Fatalf("terminated engagement: %v", e)
	}
}

// Filing refuses what is no agreement to the seller's current terms.
func TestFileRefusals(t *testing.T) {
	s := newStand(t, 1)
	paid := sku(t, flatSKU(250000))
	now := time.Now()
	good := agreement(t, s.owner, s.seller.Public(), "paid-flat", paid.Digest(), now, "")
	forged := good
	forged.SKU = "other"
	unknownSeller := agreement(t, s.owner, bustest.Agent(t).Public(), "paid-flat", paid.Digest(), now, "")
	noSKU := agreement(t, s.owner, s.seller.Public(), "nope", paid.Digest(), now, "")
	future := agreement(t, s.owner, s.seller.Public(), "paid-flat", paid.Digest(), now.Add(time.Hour), "")
	for _, c := range []struct {
		name    string
		payload any
		code    errs.Code
	}{
		{"bad signature", forged, errs.IdentityMismatch},
		{"unregistered seller", unknownSeller, errs.NotFound},
		{"no such SKU", noSKU, errs.NotFound},
		{"agreed in the future", future, errs.InvalidRequest},
		{"not an agreement", map[string]any{"v": 1}, errs.InvalidEnvelope},
	} {
		if _, e := s.call(s.requester, protocol.AgreementVerbSubject("file"), c.payload); e == nil || e.Code != c.code {
			t.Errorf("%s: %v, want %s", c.name, e, c.code)
		}
	}
	if e := s.file(good); e != nil {
		t.Fatal(e)
	}
	if e := s.file(good); e != nil {
		t.Fatalf("the same agreement filed twice: %v", e)
	}
	earlier := agreement(t, s.owner, s.seller.Public(), "paid-flat", paid.Digest(), now.Add(-time.Minute), "")
	if e := s.file(earlier); e == nil || e.Code != errs.Conflict {
		t.Fatalf("an earlier agreement over a later one: %v", e)
	}
	rv := agreements.Revocation{SellerAgent: s.seller.Public(), SKU: "paid-flat", AgreedAt: good.AgreedAt, RevokedAt: protocol.FormatTime(now.Add(time.Second))}
	if err := agreements.SignRevocation(&rv, bustest.Agent(t)); err != nil {
		t.Fatal(err)
	}
	if _, e := s.call(s.requester, protocol.AgreementVerbSubject("revoke"), rv); e == nil || e.Code != errs.NotFound {
		t.Fatalf("a stranger's revocation names no agreement of its own: %v", e)
	}
	rv.ConsumerOwner = s.owner.Public() // claims the owner, signed by another
	if _, e := s.call(s.requester, protocol.AgreementVerbSubject("revoke"), rv); e == nil || e.Code != errs.IdentityMismatch {
		t.Fatalf("a forged revocation: %v", e)
	}
}

// Who may list what, and the state each listed agreement is in.
func TestList(t *testing.T) {
	s := newStand(t, 1)
	paid := sku(t, flatSKU(250000))
	now := time.Now()
	if e := s.file(agreement(t, s.owner, s.seller.Public(), "paid-flat", paid.Digest(), now, "")); e != nil {
		t.Fatal(e)
	}
	list := func(from keys.Signer, q map[string]any) ([]agreements.Entry, *errs.Error) {
		out, e := s.call(from, protocol.AgreementVerbSubject("list"), q)
		if e != nil {
			return nil, e
		}
		b, _ := json.Marshal(out["agreements"])
		var entries []agreements.Entry
		if err := json.Unmarshal(b, &entries); err != nil {
			t.Fatal(err)
		}
		return entries, nil
	}
	// The seller lists the agreements made to itself.
	got, e := list(s.seller, map[string]any{})
	if e != nil || len(got) != 1 || got[0].State != agreements.StateActive || got[0].ConsumerOwner != s.owner.Public() {
		t.Fatalf("seller: %+v %v", got, e)
	}
	// The requester lists its owner's.
	got, e = list(s.requester, map[string]any{"consumer_owner": s.owner.Public()})
	if e != nil || len(got) != 1 || got[0].SellerAgent != s.seller.Public() {
		t.Fatalf("owner: %+v %v", got, e)
	}
	// A stranger lists neither.
	stranger := bustest.Agent(t)
	if _, e := list(stranger, map[string]any{"consumer_owner": s.owner.Public()}); e == nil || e.Code != errs.Forbidden {
		t.Fatalf("stranger by owner: %v", e)
	}
	if _, e := list(stranger, map[string]any{"seller_agent": s.seller.Public()}); e == nil || e.Code != errs.Forbidden {
		t.Fatalf("stranger by seller: %v", e)
	}
	// Re-priced: stale, naming the current digest.
	s.register(s.seller.Public(), bustest.Agent(t).Public(), "", flatSKU(300000))
	got, _ = list(s.seller, nil)
	if len(got) != 1 || got[0].State != agreements.StateStale || got[0].CurrentDigest != sku(t, flatSKU(300000)).Digest() {
		t.Fatalf("stale: %+v", got)
	}
	// The services key lists everything.
	if got, e := list(s.b.ServicesKey(), map[string]any{}); e != nil || len(got) != 1 {
		t.Fatalf("services: %+v %v", got, e)
	}
}

// A question that is not well formed is refused before anything is read.
func TestAdmitRefusesMalformed(t *testing.T) {
	s := newStand(t, 1)
	for _, q := range []map[string]any{
		{"requester": "nobody", "offering": "paid", "request_id": "r"},
		{"requester": s.requester.Public(), "offering": "", "request_id": "r"},
		{"requester": s.requester.Public(), "offering": "paid"},
		{"requester": s.requester.Public(), "offering": "paid", "request_id": "r", "seller": s.seller.Public()},
	} {
		if _, e := s.call(s.seller, protocol.SubjCommerceAdmit, q); e == nil || e.Code != errs.InvalidRequest {
			t.Errorf("%v: %v", q, e)
		}
	}
	// An unregistered seller sells nothing: NOT_FOUND, which its node
	// sends on (it only asks when its manifest carries SKUs).
	if _, e := s.call(bustest.Agent(t), protocol.SubjCommerceAdmit, map[string]any{"requester": s.requester.Public(), "offering": "paid", "request_id": "r"}); e == nil || e.Code != errs.NotFound {
		t.Fatalf("unregistered seller: %v", e)
	}
}
