package devenv_test

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/adapter/daemon"
	"agentmesh.dev/mesh/adapter/node"
	"agentmesh.dev/mesh/shared/agreements"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// seller is an agent on this project's runtime whose manifest publishes
// skus, with a handler that records every request it runs.
type sellerAgent struct {
	*node.Agent
	mu  sync.Mutex
	ran map[string]bool // request ids the handler ran
}

func (s *sellerAgent) handled(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ran[id]
}

// commerceAgent hosts an agent of acct on a node of its own, with skus;
// it returns the agent, its key and its node's key.
func (c *cp) commerceAgent(acct, name string, skus []commerce.SKU, handler node.Handler) (*node.Agent, *keys.Agent, *keys.Node) {
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
		handler = func(_ context.Context, call *node.Call) error { return call.Reply(map[string]any{"ok": true}) }
	}
	a, err := n.Host(c.t.Context(), node.AgentConfig{Key: k, Name: name, Handler: handler, SKUs: skus,
		Offerings: []node.Offering{{ID: "free"}, {ID: "paid"}, {ID: "metered"}}, AvailabilityClass: "always_on"})
	if err != nil {
		c.t.Fatal(err)
	}
	return a, k, nk
}

func flatXCR(t *testing.T, amount int64) commerce.SKU {
	t.Helper()
	s, err := commerce.ParseSKU([]byte(`{"sku":"paid-flat","covers":{"offerings":["paid"]},"price":{"model":"flat","currency":"XCR","amount_micro":` +
		strings.TrimSpace(jsonNumber(amount)) + `},"provider":{"id":"internal"}}`))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// perUnitXCR prices offering "metered" per 1,000 tokens_out.
func perUnitXCR(t *testing.T) commerce.SKU {
	t.Helper()
	s, err := commerce.ParseSKU([]byte(`{"sku":"metered-tokens","covers":{"offerings":["metered"]},"price":{"model":"per_unit","currency":"XCR","meter":"tokens_out","per":1000,"amount_micro":1500},"provider":{"id":"internal"}}`))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func jsonNumber(n int64) string { b, _ := json.Marshal(n); return string(b) }

// refusalMembers are the members of AGREEMENT_REQUIRED's details:
// commerce.json's enforcement.refusal.details (read from the fixtures
// beside the repository when they are there) and price_credits, which the
// service specification adds (§7.1).
func refusalMembers(t *testing.T) []string {
	t.Helper()
	members := []string{"approval_url", "sku", "sku_digest"}
	if b, err := os.ReadFile("../../shared/conformance/commerce.json"); err == nil {
		var f struct {
			Enforcement struct {
				Refusal struct {
					Details map[string]any `json:"details"`
				} `json:"refusal"`
			} `json:"enforcement"`
		}
		if err := json.Unmarshal(b, &f); err != nil || len(f.Enforcement.Refusal.Details) == 0 {
			t.Fatalf("commerce.json: %v", err)
		}
		members = slices.Sorted(maps.Keys(f.Enforcement.Refusal.Details))
	}
	return slices.Sorted(slices.Values(append(members, "price_credits")))
}

// The admission matrix end to end (issue 18, Must show): a seller on this
// project's runtime publishes a free offering and a paid one under an
// internal flat SKU in credits; each request is sent as a requester's
// signed request on a reply subject the test reads. A refused request is
// answered with the refusal as the first and only message on its reply
// subject (never an accept first) and its handler never runs; an admitted
// one is accepted and answered by the handler.
func TestAdmissionMatrix(t *testing.T) {
	c := startCP(t)
	acct, _ := c.signIn("seller@example.org")
	seller := &sellerAgent{ran: map[string]bool{}}
	handler := func(_ context.Context, call *node.Call) error {
		seller.mu.Lock()
		seller.ran[call.Env.ID] = true
		seller.mu.Unlock()
		return call.Reply(map[string]any{"ok": true})
	}
	price := int64(250000)
	var sellerKey *keys.Agent
	var sellerNode *keys.Node
	seller.Agent, sellerKey, sellerNode = c.commerceAgent(acct, "seller", []commerce.SKU{flatXCR(t, price), perUnitXCR(t)}, handler)
	other, _, _ := c.commerceAgent(acct, "other-seller", []commerce.SKU{flatXCR(t, price)}, nil)
	requester, requesterKey, requesterNode := c.commerceAgent(acct, "requester", nil, nil)

	nc, err := c.m.ConnectService("admission-matrix")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(t.Context(), commerce.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	put := func(key string, v any) {
		t.Helper()
		b, _ := json.Marshal(v)
		if _, err := kv.Put(t.Context(), key, b); err != nil {
			t.Fatal(err)
		}
	}

	// The requester's owner, as the agreements service reads it: the
	// registry record's owner, else its node.
	recBytes, found, err := bus.LeaderGet(t.Context(), nc, agreements.RegistryBucket, requester.ID())
	if err != nil || !found {
		t.Fatalf("the requester's record: %v %v", found, err)
	}
	var rec agreements.Record
	if err := json.Unmarshal(recBytes, &rec); err != nil {
		t.Fatal(err)
	}
	owner := rec.Owner(time.Now())
	if owner != requesterNode.Public() {
		t.Fatalf("the requester registered with owner %s, not its node %s: give commerceAgent that owner and sign the agreements with its key", owner, requesterNode.Public())
	}
	var ownerKey keys.Signer = requesterNode
	put(commerce.BalancePrefix+owner, commerce.Balance{Credits: 10_000_000, UpdatedAt: time.Now()})

	call := func(subject string, payload any) *errs.Error {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
		defer cancel()
		_, err := bus.Call(ctx, nc, requesterKey, subject, protocol.TypeRequest, "", payload)
		if err != nil {
			return errs.As(err)
		}
		return nil
	}
	sign := func(sellerID string, digest string, agreed time.Time, expires string) commerce.Agreement {
		t.Helper()
		a := commerce.Agreement{SellerAgent: sellerID, SKU: "paid-flat", SKUDigest: digest, AgreedAt: protocol.FormatTime(agreed), ExpiresAt: expires}
		if err := commerce.Sign(&a, ownerKey); err != nil {
			t.Fatal(err)
		}
		return a
	}
	file := func(a commerce.Agreement) {
		t.Helper()
		if e := call(protocol.AgreementVerbSubject("file"), a); e != nil {
			t.Fatalf("file: %v", e)
		}
	}

	// Every answer to every request, for the whole test: a protocol 0.3
	// performer answers at the requester's inbox (the accept included,
	// sent because the request names a reply subject), and the reply
	// subject the request names is watched too.
	var amu sync.Mutex
	answers := map[string][]*protocol.Envelope{} // by in_reply_to
	collect := func(m *nats.Msg) {
		e, err := protocol.Decode(m.Data)
		if err != nil || e.Type != protocol.TypeRespond || (e.From != seller.ID() && e.From != requester.ID()) {
			return
		}
		amu.Lock()
		answers[e.InReplyTo] = append(answers[e.InReplyTo], e)
		amu.Unlock()
	}
	for _, subject := range []string{protocol.InboxSubject(requester.ID()), protocol.InboxSubject(seller.ID()), "_INBOX.matrix.>"} {
		sub, err := nc.Subscribe(subject, collect)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = sub.Unsubscribe() }()
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// The seller's questions to the agreements service, by who asks.
	var qmu sync.Mutex
	asked := map[string]int{}
	qsub, err := nc.Subscribe(protocol.SubjCommerceAdmit, func(m *nats.Msg) {
		if e, err := protocol.Decode(m.Data); err == nil {
			qmu.Lock()
			asked[e.From]++
			qmu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = qsub.Unsubscribe() }()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// sendAs sends one signed request of from to to and waits for its
	// terminal answer; it returns the request id and the answers in order.
	sendAs := func(from *keys.Agent, to, name, offering string, budget *protocol.Budget) (string, []*protocol.Envelope) {
		t.Helper()
		env, err := protocol.New(protocol.TypeRequest, from.Public(), map[string]any{"offering": offering, "input": map[string]any{"case": name}})
		if err != nil {
			t.Fatal(err)
		}
		env.To = to
		env.Budget = budget
		if err := env.Sign(from); err != nil {
			t.Fatal(err)
		}
		b, err := env.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.PublishRequest(protocol.InboxSubject(to), "_INBOX.matrix."+env.ID, b); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(20 * time.Second)
		for {
			amu.Lock()
			out := slices.Clone(answers[env.ID])
			amu.Unlock()
			if n := len(out); n > 0 && protocol.ResponseStatus(out[n-1]) != protocol.StatusAccepted {
				return env.ID, out
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no terminal answer (%d answers)", name, len(out))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	send := func(name, offering string, budget *protocol.Budget) (string, []*protocol.Envelope) {
		t.Helper()
		return sendAs(requesterKey, seller.ID(), name, offering, budget)
	}

	// The seller asks once per request; an agent that sells nothing never
	// asks (it is asked here while the service runs).
	askedCheck := func(want int) {
		t.Helper()
		if _, out := sendAs(sellerKey, requester.ID(), "an agent without SKUs", "free", nil); bus.ErrorOf(out[len(out)-1]) != nil {
			t.Errorf("the agent without SKUs: %v", describe(out))
		}
		count := func(k string) int { qmu.Lock(); defer qmu.Unlock(); return asked[k] }
		for deadline := time.Now().Add(10 * time.Second); count(seller.ID()) < want && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond) // each subscription delivers on its own goroutine
		}
		if count(seller.ID()) != want || count(requester.ID()) != 0 {
			t.Errorf("questions: the seller %d for %d requests, the agent without SKUs %d", count(seller.ID()), want, count(requester.ID()))
		}
	}

	digest := flatXCR(t, price).Digest()
	consoleApprove := strings.TrimSuffix(c.m.URLs().Console, "/") + commerce.ApprovalPath + "?sku=paid-flat"
	now := time.Now()
	var refusedIDs []string
	// answeredBefore is how many requests the seller took while the service
	// ran: every case before the last two.
	var answeredBefore int
	// exact is the check of every AGREEMENT_REQUIRED case: exactly the
	// fixture's members plus price_credits, naming the SKU's current terms.
	exact := func(d string, p int64) func(e *errs.Error) {
		return func(e *errs.Error) {
			if got := slices.Sorted(maps.Keys(e.Details)); !slices.Equal(got, refusalMembers(t)) {
				t.Errorf("detail members %v, want %v", got, refusalMembers(t))
			}
			if e.Details["sku"] != "paid-flat" || e.Details["sku_digest"] != d || e.Details["approval_url"] != consoleApprove ||
				e.Details["price_credits"] != float64(p) || e.Retryable {
				t.Errorf("details %v (retryable %v)", e.Details, e.Retryable)
			}
		}
	}
	cases := []struct {
		name     string
		offering string
		budget   *protocol.Budget
		setup    func()
		// code is the refusal ("" answered); check looks at its details.
		code  errs.Code
		check func(e *errs.Error)
	}{
		{name: "free offering", offering: "free"},
		{name: "paid without agreement", offering: "paid", code: errs.AgreementRequired, check: func(e *errs.Error) {
			if got := slices.Sorted(maps.Keys(e.Details)); !slices.Equal(got, refusalMembers(t)) {
				t.Errorf("details members %v, want %v", got, refusalMembers(t))
			}
			if e.Details["sku"] != "paid-flat" || e.Details["sku_digest"] != digest || e.Details["approval_url"] != consoleApprove ||
				e.Details["price_credits"] != float64(price) || e.Retryable {
				t.Errorf("details %v (retryable %v)", e.Details, e.Retryable)
			}
		}},
		{name: "per_unit without agreement", offering: "metered", code: errs.AgreementRequired, check: func(e *errs.Error) {
			if e.Details["sku"] != "metered-tokens" || e.Details["sku_digest"] != perUnitXCR(t).Digest() || e.Details["price_credits"] != float64(1500) ||
				e.Details["approval_url"] != strings.TrimSuffix(c.m.URLs().Console, "/")+commerce.ApprovalPath+"?sku=metered-tokens" {
				t.Errorf("per_unit details %v", e.Details)
			}
		}},
		{name: "per_unit with agreement", offering: "metered", setup: func() {
			a := commerce.Agreement{SellerAgent: seller.ID(), SKU: "metered-tokens", SKUDigest: perUnitXCR(t).Digest(), AgreedAt: protocol.FormatTime(now)}
			if err := commerce.Sign(&a, ownerKey); err != nil {
				t.Fatal(err)
			}
			file(a)
		}},
		{name: "agreement for another seller", offering: "paid", code: errs.AgreementRequired, check: exact(digest, price),
			setup: func() { file(sign(other.ID(), digest, now, "")) }},
		{name: "expired agreement", offering: "paid", code: errs.AgreementRequired, check: exact(digest, price), setup: func() {
			// Filing refuses an agreement already expired: it is kept as
			// the service kept it when it was live.
			a := sign(seller.ID(), digest, now.Add(-2*time.Hour), protocol.FormatTime(now.Add(-time.Hour)))
			raw, _ := json.Marshal(a)
			put(commerce.AgreementKey(seller.ID(), owner, "paid-flat"), commerce.AgreementRecord{Agreement: raw, FiledAt: now.Add(-2 * time.Hour)})
		}},
		{name: "covering agreement", offering: "paid", setup: func() { file(sign(seller.ID(), digest, now, "")) }},
		{name: "cost ceiling below the price", offering: "paid", code: errs.BudgetInsufficient,
			budget: &protocol.Budget{Revision: 1, CostCeiling: &protocol.Money{AmountMicro: price - 1, Currency: "XCR"}}, check: func(e *errs.Error) {
				if est, _ := e.Details["estimate"].(map[string]any); est["amount_micro"] != float64(price) || est["currency"] != "XCR" {
					t.Errorf("estimate %v", e.Details)
				}
			}},
		{name: "credits short", offering: "paid", code: errs.InsufficientFunds,
			setup: func() { put(commerce.BalancePrefix+owner, commerce.Balance{Credits: price - 10}) }, check: func(e *errs.Error) {
				if e.Details["shortfall_micro"] != float64(10) || e.Details["currency"] != "XCR" {
					t.Errorf("details %v", e.Details)
				}
				put(commerce.BalancePrefix+owner, commerce.Balance{Credits: 10_000_000})
			}},
		{name: "agreement revoked", offering: "paid", code: errs.AgreementRequired, check: exact(digest, price), setup: func() {
			rv := agreements.Revocation{SellerAgent: seller.ID(), SKU: "paid-flat", AgreedAt: protocol.FormatTime(now), RevokedAt: protocol.FormatTime(time.Now().Add(time.Second))}
			if err := agreements.SignRevocation(&rv, ownerKey); err != nil {
				t.Fatal(err)
			}
			if e := call(protocol.AgreementVerbSubject("revoke"), rv); e != nil {
				t.Fatalf("revoke: %v", e)
			}
		}},
		{name: "agreed again", offering: "paid", setup: func() { file(sign(seller.ID(), digest, time.Now().Add(2*time.Second), "")) }},
		{name: "stale digest after re-pricing", offering: "paid", code: errs.AgreementRequired, setup: func() {
			// The seller re-prices: it registers again with the new terms.
			if err := seller.Deregister(t.Context()); err != nil {
				t.Fatal(err)
			}
			a, err := seller.Node().Host(t.Context(), node.AgentConfig{Key: sellerKey, Name: "seller", Handler: handler,
				SKUs: []commerce.SKU{flatXCR(t, price*2), perUnitXCR(t)}, Offerings: []node.Offering{{ID: "free"}, {ID: "paid"}, {ID: "metered"}}, AvailabilityClass: "always_on"})
			if err != nil {
				t.Fatal(err)
			}
			seller.Agent = a
		}, check: exact(flatXCR(t, price*2).Digest(), price*2)},
		{name: "agreed to the new terms", offering: "paid", setup: func() {
			file(sign(seller.ID(), flatXCR(t, price*2).Digest(), time.Now().Add(3*time.Second), ""))
			// The engagement service mirrors an engagement with a volume
			// of two requests an hour for this requester.
			if left := time.Until(time.Now().Truncate(time.Hour).Add(time.Hour)); left < 30*time.Second {
				time.Sleep(left + time.Second) // the three requests fall in one clock hour
			}
			put(commerce.EngagementKey(seller.ID(), requester.ID(), "paid"), commerce.EngagementTerms{SowID: "sow-matrix", Version: 1,
				Seller: seller.ID(), Client: requester.ID(), SellerOwner: sellerNode.Public(), ClientOwner: owner, Offerings: []string{"paid"},
				StartsAt: time.Now().Add(-time.Minute), Volume: &commerce.Volume{PerHour: 2}})
		}},
		{name: "second request in the hour", offering: "paid"},
		{name: "volume cap reached", offering: "paid", code: errs.RateLimited, check: func(e *errs.Error) {
			if !e.Retryable || e.RetryAfterMS <= 0 || e.RetryAfterMS > time.Hour.Milliseconds() ||
				e.Details["sow_id"] != "sow-matrix" || e.Details["window"] != "hour" || e.Details["limit"] != float64(2) {
				t.Errorf("rate limited: %+v", e)
			}
		}},
		// A seller that publishes SKUs fails closed when the service
		// cannot decide, free offerings included.
		{name: "service unreachable, free", offering: "free", code: errs.Unavailable, setup: func() {
			askedCheck(answeredBefore)
			// Nothing answers the question from now on (the count's
			// subscription would be a responder that never answers).
			_ = qsub.Unsubscribe()
			for _, w := range c.m.Workers().Agreements {
				_ = w.Stop()
			}
		}, check: func(e *errs.Error) {
			if !e.Retryable || e.RetryAfterMS <= 0 {
				t.Errorf("not retryable: %+v", e)
			}
		}},
		{name: "service unreachable, paid", offering: "paid", code: errs.Unavailable, check: func(e *errs.Error) {
			if !e.Retryable {
				t.Errorf("not retryable: %+v", e)
			}
		}},
	}
	answeredBefore = len(cases) - 2
	for _, tc := range cases {
		if tc.setup != nil {
			tc.setup()
		}
		id, out := send(tc.name, tc.offering, tc.budget)
		if tc.code == "" {
			if len(out) != 2 || protocol.ResponseStatus(out[0]) != protocol.StatusAccepted || bus.ErrorOf(out[1]) != nil || !seller.handled(id) {
				t.Errorf("%s: want an accept and the handler's answer; got %d answers (%v), handler ran %v", tc.name, len(out), describe(out), seller.handled(id))
			}
			continue
		}
		if len(out) != 1 || protocol.ResponseStatus(out[0]) == protocol.StatusAccepted {
			t.Errorf("%s: want the refusal as the first and only answer, got %v", tc.name, describe(out))
			continue
		}
		e := bus.ErrorOf(out[0])
		if e == nil || e.Code != tc.code {
			t.Errorf("%s: answered %v, want %s", tc.name, e, tc.code)
			continue
		}
		if seller.handled(id) {
			t.Errorf("%s: the handler ran for a refused request", tc.name)
		}
		if tc.check != nil {
			tc.check(e)
		}
		refusedIDs = append(refusedIDs, id)
	}
	// Nothing came after any refusal, by the end of the matrix either: no
	// late accept, no answer from a handler.
	amu.Lock()
	defer amu.Unlock()
	for _, id := range refusedIDs {
		if n := len(answers[id]); n != 1 {
			t.Errorf("request %s was refused and has %d answers: %v", id, n, describe(answers[id]))
		}
		if seller.handled(id) {
			t.Errorf("request %s was refused and its handler ran", id)
		}
	}
}

func describe(out []*protocol.Envelope) []string {
	var s []string
	for _, e := range out {
		s = append(s, string(e.Payload))
	}
	return s
}
