package allowance

import (
	"fmt"
	"math"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// microRate makes one token cost one micro-unit (per-1k = 1000 micro), so
// a fixture's micro-unit amounts translate directly into characters:
// 4 characters per token.
var microRate = usdp(1_000)

func charsFor(micro int64) int { return int(4 * micro) }

// spentOn reads the durable ledger directly.
func spentOn(t *testing.T, s *Store, scope, key, currency string) int64 {
	t.Helper()
	l, err := readLedger(s.ledgerPath())
	if err != nil {
		t.Fatal(err)
	}
	return l.lookup(currency).SpentMicro(scope, key)
}

// The fixture's metering vectors, charged through Store.Meter: the cost
// is floor(tokens × rate / 1000) and lands on the task, its context and
// the UTC day of the metering instant.
func TestMeteringVectors(t *testing.T) {
	when := at("2026-07-28T23:59:59.999Z")
	for i, cv := range arr(path(fixture(t, "allowance.json"), "metering", "cases")) {
		c := obj(cv)
		tokens, rate, want := num(c["tokens"]), num(c["per_1k_tokens_micro"]), num(c["cost_micro"])
		t.Run(fmt.Sprintf("%d_%d_tokens_at_%d", i, tokens, rate), func(t *testing.T) {
			s := newStore(t)
			mustSet(t, s, SetRequest{Amount: usd(protocol.MaxSafeInteger), Per1k: usdp(rate)}, when)
			// Split the characters between prompt and output: the sum is
			// what is estimated.
			cost := mustMeter(t, s, "task-1", "ctx-1", int(4*tokens)-3, 3, when)
			if cost != usd(want) {
				t.Fatalf("cost %v, want %d USD micro (%s)", cost, want, c["why"])
			}
			for _, k := range [][2]string{{protocol.ScopeTask, "task-1"}, {protocol.ScopeContext, "ctx-1"}, {protocol.ScopeDay, "2026-07-28"}} {
				if got := spentOn(t, s, k[0], k[1], "USD"); got != want {
					t.Errorf("%s %s has %d spent, want %d", k[0], k[1], got, want)
				}
			}
		})
	}
}

// Tokens are ceil((prompt + output) / 4): one rounding over the sum, as
// the spec words it ("ceil(chars/4) of prompt plus output"), not one per
// part. The fixture's metering section starts from tokens and does not
// pin this; the spec does.
func TestMeterTokensOverPromptPlusOutput(t *testing.T) {
	when := at("2026-07-28T12:00:00Z")
	for _, c := range []struct {
		prompt, output int
		tokens         int64
	}{
		{0, 0, 0},
		{1, 0, 1},
		{1, 1, 1}, // per part would be 2
		{3, 2, 2}, // per part would be 2 as well
		{2, 3, 2},
		{5, 5, 3}, // per part would be 4
		{4, 4, 2},
		{-10, 8, 2}, // a negative count is zero, never a discount
	} {
		t.Run(fmt.Sprintf("%d+%d", c.prompt, c.output), func(t *testing.T) {
			s := newStore(t)
			// 1,000,000 micro per 1k tokens: 1000 micro per token.
			mustSet(t, s, SetRequest{Amount: usd(1), Per1k: usdp(1_000_000)}, when)
			cost := mustMeter(t, s, "t", "", c.prompt, c.output, when)
			if cost.AmountMicro != c.tokens*1000 {
				t.Fatalf("cost %d micro = %d tokens, want %d tokens", cost.AmountMicro, cost.AmountMicro/1000, c.tokens)
			}
		})
	}
	t.Run("huge counts saturate", func(t *testing.T) {
		s := newStore(t)
		mustSet(t, s, SetRequest{Amount: usd(1), Per1k: usdp(1_000_000)}, when)
		cost := mustMeter(t, s, "t", "", math.MaxInt, math.MaxInt, when)
		if cost.AmountMicro != math.MaxInt64 {
			t.Fatalf("cost %d; want saturation at MaxInt64, which exceeds every ceiling", cost.AmountMicro)
		}
		if d := s.Admit("t", "", 4, when); d.Admit {
			t.Fatalf("after a saturated charge, Admit decided %+v", d)
		}
	})
}

// The admission estimate is the prompt's tokens at the allowance's rate;
// it is what a refusal quotes.
func TestAdmitEstimatesThePrompt(t *testing.T) {
	when := at("2026-07-28T12:00:00Z")
	s := newStore(t)
	mustSet(t, s, SetRequest{Amount: usd(10), Per1k: usdp(1_500)}, when)
	d := s.Admit("t", "", 4*1000+1, when) // 1001 tokens: floor(1501.5) = 1501 micro
	if d.Admit || d.Estimate != usd(1501) {
		t.Fatalf("decided %+v; want refusal quoting 1501 USD micro", d)
	}
}

// The fixture's precedence cases, driven through the Store: the ceilings
// are made with Set, the spend already accounted is charged with Meter on
// other tasks, contexts or days so that only the intended scope carries
// it, and the decision comes from Store.Admit.
func TestPrecedenceThroughStore(t *testing.T) {
	now := at("2026-07-28T15:00:00Z")
	for _, cv := range arr(path(fixture(t, "allowance.json"), "precedence", "cases")) {
		c := obj(cv)
		t.Run(str(c["case"]), func(t *testing.T) {
			s := newStore(t)
			const taskID = "task-under-test"
			ctxID := str(c["request_context_id"])
			for i, av := range arr(c["applicable"]) {
				a := obj(av)
				req := SetRequest{
					Amount:    usd(num(a["amount_micro"])),
					Context:   str(a["context_id"]),
					ScopeTask: str(a["scope"]) == protocol.ScopeTask,
				}
				if i == 0 {
					req.Per1k = microRate
				}
				mustSet(t, s, req, now)
				chargeOnly(t, s, str(a["scope"]), taskID, str(a["context_id"]), num(a["spent_micro"]), now, i)
			}
			d := s.Admit(taskID, ctxID, charsFor(num(c["estimate_micro"])), now)
			if d.Binding.Scope != str(c["binding_scope"]) || d.Remaining != num(c["remaining_micro"]) {
				t.Errorf("binding %s with %d remaining, want %s with %v (%s)", d.Binding.Scope, d.Remaining, c["binding_scope"], c["remaining_micro"], c["why"])
			}
			wantAdmit := str(c["expect"]) == "accept"
			if d.Admit != wantAdmit {
				t.Fatalf("admit=%v, want %s (%s)", d.Admit, c["expect"], c["why"])
			}
			if !wantAdmit {
				requireRefusal(t, d.Refusal, map[string]any{"error_code": "BUDGET_INSUFFICIENT",
					"details": map[string]any{"estimate": map[string]any{"amount_micro": float64(num(c["estimate_micro"])), "currency": "USD"}}})
			}
		})
	}
}

// chargeOnly meters micro so that it is accounted to one scope of the work
// under test and to nothing else that work is charged against: a task
// charge goes on a past day with no context, a context charge on a past
// day with no task, a day charge on another task with no context.
func chargeOnly(t *testing.T, s *Store, scope, taskID, contextID string, micro int64, now time.Time, n int) {
	t.Helper()
	if micro == 0 {
		return
	}
	past := now.AddDate(0, 0, -1-n)
	switch scope {
	case protocol.ScopeTask:
		mustMeter(t, s, taskID, "", charsFor(micro), 0, past)
	case protocol.ScopeContext:
		if contextID == "" {
			t.Fatal("an unnarrowed context ceiling with spend is not expressible here")
		}
		mustMeter(t, s, "", contextID, charsFor(micro), 0, past)
	case protocol.ScopeDay:
		mustMeter(t, s, fmt.Sprintf("earlier-task-%d", n), "", charsFor(micro), 0, now)
	}
}

// The fixture's exhaustion behaviours through the Store: refuse answers
// with the fixture's refusal shape at once; ask_owner holds the work
// (no refusal to send) and declines with the same shape.
func TestExhaustionThroughStore(t *testing.T) {
	doc := fixture(t, "allowance.json")
	refusal := obj(path(doc, "refusal", "budget_insufficient"))
	estimate := num(path(refusal, "details", "estimate", "amount_micro"))
	now := at("2026-07-28T15:00:00Z")
	for name, ev := range obj(doc["exhaustion"]) {
		mode := str(obj(ev)["on_exhausted"])
		if mode == "" {
			continue
		}
		t.Run(name, func(t *testing.T) {
			s := newStore(t)
			mustSet(t, s, SetRequest{Amount: usd(1_000_000), Per1k: microRate, OnExhausted: mode}, now)
			mustMeter(t, s, "earlier", "", charsFor(1_000_000-estimate), 0, now)

			// Exactly the remainder fits: equal is admitted.
			if d := s.Admit("task-1", "", charsFor(estimate), now); !d.Admit {
				t.Fatalf("estimate equal to the remainder decided %+v; want admit", d)
			}
			mustMeter(t, s, "earlier", "", 4, 0, now) // one micro-unit over
			d := s.Admit("task-1", "", charsFor(estimate), now)
			if d.Admit {
				t.Fatalf("exhausted ceiling admitted %+v", d)
			}
			switch mode {
			case protocol.OnExhaustedRefuse:
				if d.Hold {
					t.Fatal("refuse mode held the work")
				}
				requireRefusal(t, d.Refusal, refusal)
			case protocol.OnExhaustedAskOwner:
				if !d.Hold || d.Refusal != nil {
					t.Fatalf("ask_owner decided hold=%v refusal=%v; want held with nothing sent", d.Hold, d.Refusal)
				}
				requireRefusal(t, d.Decline(), refusal) // the owner declined
			default:
				t.Fatalf("unknown on_exhausted %q in the fixture", mode)
			}
			if d.Refusal != nil && d.Refusal.Code != errs.BudgetInsufficient {
				t.Fatalf("refusal code %s", d.Refusal.Code)
			}
		})
	}
}

// A narrowed context ceiling covers only its own context: the same spend
// elsewhere does not bind.
func TestContextCeilingCoversOnlyItsContext(t *testing.T) {
	now := at("2026-07-28T15:00:00Z")
	s := newStore(t)
	mustSet(t, s, SetRequest{Amount: usd(100), Per1k: microRate, Context: "a"}, now)
	mustMeter(t, s, "t1", "a", charsFor(100), 0, now)
	if d := s.Admit("t2", "a", charsFor(1), now); d.Admit {
		t.Fatalf("context a is spent, yet admitted %+v", d)
	}
	if d := s.Admit("t2", "b", charsFor(1_000), now); !d.Admit {
		t.Fatalf("context b has no ceiling, yet decided %+v", d)
	}
}

// A day ceiling resets at 00:00 UTC, whatever the local zone of the clock.
func TestDayCeilingIsPerUTCDay(t *testing.T) {
	s := newStore(t)
	late := at("2026-07-28T23:59:59Z")
	mustSet(t, s, SetRequest{Amount: usd(100), Per1k: microRate}, late)
	mustMeter(t, s, "t", "", charsFor(100), 0, late.In(time.FixedZone("UTC+10", 10*3600)))
	if d := s.Admit("t2", "", charsFor(1), late); d.Admit {
		t.Fatalf("same UTC day, yet admitted %+v", d)
	}
	if d := s.Admit("t2", "", charsFor(100), late.Add(time.Second)); !d.Admit {
		t.Fatalf("next UTC day, yet decided %+v", d)
	}
}
