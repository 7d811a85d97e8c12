package vectors

import (
	"fmt"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

func checkAllowance(t *T, doc map[string]any) {
	k, err := senderKey(doc)
	if err != nil {
		t.Run("identities", func() error { return err })
	}
	if d, ok := doc["document"].(map[string]any); ok {
		for i, c := range asArray(d["valid"]) {
			m := obj(c)
			t.Run("document/valid/"+caseName(m, fmt.Sprint(i)), func() error {
				raw := []byte(canon(m["signed"]))
				a, err := protocol.ParseAllowance(raw)
				if err != nil {
					return fmt.Errorf("valid document refused: %v", err)
				}
				// Our typed document reproduces the signed bytes exactly.
				msg, err := protocol.SignedBytes(protocol.TagAllowance, a)
				if err != nil {
					return err
				}
				if want := optStr(m, "canonical"); want != "" {
					if err := quoteDiff(string(msg[len(protocol.TagAllowance)+1:]), want); err != nil {
						return err
					}
				}
				if err := a.Verify(); err != nil {
					return err
				}
				if k != nil && k.Public() == a.OwnerKey {
					b := a
					b.Sig = ""
					if err := protocol.SignAllowance(&b, k); err != nil {
						return err
					}
					if b.Sig != a.Sig {
						return fmt.Errorf("re-signing gives %s, fixture has %s", b.Sig, a.Sig)
					}
				}
				if p := protocol.LoadPolicy(raw); p.Err() != nil {
					return fmt.Errorf("a valid document loads as a failed policy: %v", p.Err())
				}
				return nil
			})
		}
		for i, c := range asArray(d["invalid"]) {
			m := obj(c)
			t.Run("document/invalid/"+caseName(m, fmt.Sprint(i)), func() error {
				raw := []byte(canon(m["document"]))
				a, err := protocol.ParseAllowance(raw)
				if err == nil {
					err = a.Verify()
				}
				if err == nil {
					return fmt.Errorf("an invalid document was accepted (%s)", optStr(m, "why"))
				}
				// And it fails closed: nothing is admitted under it.
				p := protocol.LoadPolicy(raw)
				if p.Err() == nil {
					return fmt.Errorf("LoadPolicy accepted it")
				}
				if dec := p.Admit("task-1", "", time.Now(), 0, protocol.NewLedger()); dec.Admit {
					return fmt.Errorf("a failed policy admitted work")
				}
				return nil
			})
		}
	}
	if me, ok := doc["metering"].(map[string]any); ok {
		for i, c := range asArray(me["cases"]) {
			m := obj(c)
			t.Run(fmt.Sprintf("metering/%d_%v_tokens_at_%v", i, m["tokens"], m["per_1k_tokens_micro"]), func() error {
				got := protocol.MeterCost(num(m["tokens"]), num(m["per_1k_tokens_micro"]))
				if got != num(m["cost_micro"]) {
					return fmt.Errorf("cost %d, want %v", got, m["cost_micro"])
				}
				return nil
			})
		}
	}
	if pr, ok := doc["precedence"].(map[string]any); ok {
		for i, c := range asArray(pr["cases"]) {
			m := obj(c)
			t.Run("precedence/"+caseName(m, fmt.Sprint(i)), func() error {
				ctxID := optStr(m, "request_context_id")
				var app []protocol.CeilingSpend
				for _, a := range asArray(m["applicable"]) {
					am := obj(a)
					cs := protocol.CeilingSpend{
						Ceiling:    protocol.Ceiling{Scope: str(am["scope"]), AmountMicro: num(am["amount_micro"]), TaskID: optStr(am, "task_id"), ContextID: optStr(am, "context_id")},
						SpentMicro: num(am["spent_micro"]),
					}
					if cs.AppliesTo("", ctxID) {
						app = append(app, cs)
					}
				}
				b, rem, admit := protocol.BindingCeiling(app, num(m["estimate_micro"]))
				if want := optStr(m, "binding_scope"); want != "" && b.Scope != want {
					return fmt.Errorf("binding scope %s, want %s", b.Scope, want)
				}
				if want, ok := m["remaining_micro"].(float64); ok && rem != int64(want) {
					return fmt.Errorf("remaining %d, want %v", rem, want)
				}
				if want := str(m["expect"]); (want == "accept") != admit {
					return fmt.Errorf("admit=%v, want %s", admit, want)
				}
				return nil
			})
		}
	}
	if rf, ok := doc["refusal"].(map[string]any); ok {
		for _, name := range members(rf) {
			r, ok := rf[name].(map[string]any)
			if !ok || r["error_code"] == nil {
				continue
			}
			t.Run("refusal/"+name, func() error { return checkRefusalShape(r) })
		}
	}
	if ex, ok := doc["exhaustion"].(map[string]any); ok {
		for _, name := range members(ex) {
			m, ok := ex[name].(map[string]any)
			if !ok || m["on_exhausted"] == nil {
				continue
			}
			t.Run("exhaustion/"+name, func() error { return checkExhaustion(str(m["on_exhausted"]), k) })
		}
	}
}

// checkExhaustion signs a policy whose day ceiling is spent and asks it to
// admit one more micro-unit of work: refuse must refuse with the budget
// refusal shape; ask_owner must hold, not refuse.
func checkExhaustion(mode string, k *keys.Agent) error {
	if k == nil {
		return fmt.Errorf("fixture has no seed to sign a policy with")
	}
	agent, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		return err
	}
	a := protocol.Allowance{
		V: 1, Agent: agent.Public(),
		CostModel:   protocol.CostModel{Per1kTokensMicro: 1500, Currency: "USD"},
		Ceilings:    []protocol.Ceiling{{Scope: protocol.ScopeDay, AmountMicro: 1000}},
		OnExhausted: mode, UpdatedAt: protocol.FormatTime(time.Now()),
	}
	if err := protocol.SignAllowance(&a, k); err != nil {
		return err
	}
	raw, err := protocol.Canonical(a)
	if err != nil {
		return err
	}
	p := protocol.LoadPolicy(raw)
	if p.Err() != nil {
		return p.Err()
	}
	now := time.Now()
	led := protocol.NewLedger()
	led.Record("task-0", "", now, 1000)
	dec := p.Admit("task-1", "", now, 1, led)
	switch mode {
	case protocol.OnExhaustedRefuse:
		if dec.Admit || dec.Hold || dec.Refusal == nil || dec.Refusal.Code != errs.BudgetInsufficient || dec.Refusal.Details["estimate"] == nil {
			return fmt.Errorf("refuse mode decided %+v", dec)
		}
	case protocol.OnExhaustedAskOwner:
		if dec.Admit || !dec.Hold || dec.Refusal != nil {
			return fmt.Errorf("ask_owner mode decided %+v", dec)
		}
	default:
		return fmt.Errorf("on_exhausted %q is not one we know", mode)
	}
	return nil
}
