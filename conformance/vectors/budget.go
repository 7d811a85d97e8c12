package vectors

import (
	"fmt"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

func checkBudget(t *T, doc map[string]any) {
	k, err := senderKey(doc)
	if err != nil {
		t.Run("identities", func() error { return err })
	}
	if blk, ok := doc["block"].(map[string]any); ok {
		for i, v := range asArray(blk["valid"]) {
			t.Run(fmt.Sprintf("block/valid/%d", i), func() error {
				b, err := protocol.BudgetFromValue(v)
				if err != nil {
					return fmt.Errorf("a valid block was refused: %v", err)
				}
				// Round trip: our typed block canonicalises to the same bytes.
				return sameJSON(b, v)
			})
		}
		for i, v := range asArray(blk["invalid"]) {
			m := obj(v)
			t.Run("block/invalid/"+caseName(m, fmt.Sprint(i)), func() error {
				if _, err := protocol.BudgetFromValue(m["block"]); err == nil {
					return fmt.Errorf("an invalid block was accepted (%s)", optStr(m, "why"))
				}
				return nil
			})
		}
	}
	if env, ok := doc["envelope"].(map[string]any); ok {
		t.Run("envelope/signature", func() error {
			e, err := checkSignedEnvelope(env["signed"], optStr(env, "canonical"), k)
			if err != nil {
				return err
			}
			if e.Budget == nil {
				return fmt.Errorf("decoded envelope lost its budget")
			}
			return nil
		})
		t.Run("envelope/one_micro_unit_breaks_it", func() error {
			signed := obj(env["signed"])
			c := make(map[string]any, len(signed))
			for k, v := range signed {
				c[k] = v
			}
			b := obj(c["budget"])
			nb := make(map[string]any, len(b))
			for k, v := range b {
				nb[k] = v
			}
			if cc, ok := b["cost_ceiling"].(map[string]any); ok {
				ncc := map[string]any{"currency": cc["currency"], "amount_micro": cc["amount_micro"].(float64) + 1}
				nb["cost_ceiling"] = ncc
			} else {
				nb["revision"] = b["revision"].(float64) + 1
			}
			c["budget"] = nb
			wire, _ := protocol.Canonical(c)
			_, err := protocol.Decode(wire)
			if errs.CodeOf(err) != errs.IdentityMismatch {
				return fmt.Errorf("changing the budget did not break the signature (got %v)", err)
			}
			return nil
		})
	}
	if rev, ok := doc["revisions"].(map[string]any); ok {
		for _, name := range members(rev) {
			c, ok := rev[name].(map[string]any)
			if !ok || c["applied_in_order"] == nil {
				continue
			}
			t.Run("revisions/"+name, func() error {
				var cur *protocol.Budget
				for _, step := range arr(c["applied_in_order"]) {
					b, err := protocol.BudgetFromValue(step)
					if err != nil {
						return err
					}
					next, _ := protocol.ApplyRevision(cur, b)
					cur = &next
				}
				return sameJSON(cur, c["expect_current"])
			})
		}
	}
	if ref, ok := doc["refusals"].(map[string]any); ok {
		for _, name := range members(ref) {
			r, ok := ref[name].(map[string]any)
			if !ok || r["error_code"] == nil {
				continue
			}
			t.Run("refusals/"+name, func() error { return checkRefusalShape(r) })
		}
	}
	if dl, ok := doc["deadline"].(map[string]any); ok {
		if skew, ok := dl["skew_tolerance_ms"].(float64); ok {
			t.Run("deadline/skew_tolerance", func() error {
				if time.Duration(skew)*time.Millisecond != protocol.DeadlineSkew {
					return fmt.Errorf("our tolerance is %v, fixture pins %vms", protocol.DeadlineSkew, skew)
				}
				return nil
			})
		}
		for i, v := range asArray(dl["cases"]) {
			m := obj(v)
			t.Run(fmt.Sprintf("deadline/%d_%s_at_%s", i, str(m["deadline"]), str(m["now"])), func() error {
				d, err := protocol.ParseTime(str(m["deadline"]))
				if err != nil {
					return err
				}
				now, err := protocol.ParseTime(str(m["now"]))
				if err != nil {
					return err
				}
				want := m["past"].(bool)
				if got := protocol.DeadlinePast(d, now); got != want {
					return fmt.Errorf("past=%v, want %v (%s)", got, want, optStr(m, "why"))
				}
				return nil
			})
		}
	}
}

// checkRefusalShape builds the refusal through our constructors from the
// fixture's details and compares code, status and details.
func checkRefusalShape(r map[string]any) error {
	code := errs.Code(str(r["error_code"]))
	if _, known := errs.Lookup(code); !known {
		return fmt.Errorf("error code %s is not in our table", code)
	}
	d, _ := r["details"].(map[string]any)
	var e *errs.Error
	switch code {
	case errs.BudgetInsufficient:
		m, err := protocol.MoneyFromValue(d["estimate"])
		if err != nil {
			return err
		}
		e = protocol.BudgetInsufficient(m, "")
	case errs.DeadlineUnmeetable:
		at, err := protocol.ParseTime(str(d["earliest_completion"]))
		if err != nil {
			return err
		}
		e = protocol.DeadlineUnmeetable(at, "")
		got, err := protocol.ParseTime(e.Details["earliest_completion"].(string))
		if err != nil || !got.Equal(at) {
			return fmt.Errorf("earliest_completion %v does not name the instant %v", e.Details["earliest_completion"], at)
		}
		if len(e.Details) != len(d) {
			return fmt.Errorf("details members %v, want %v", e.Details, d)
		}
		return nil
	case errs.BudgetExhausted:
		spent, err := protocol.MoneyFromValue(d["spent"])
		if err != nil {
			return err
		}
		fin, err := protocol.MoneyFromValue(d["estimate_to_finish"])
		if err != nil {
			return err
		}
		e = protocol.BudgetExhaustedPause(spent, fin)
		if st, ok := r["status"].(string); ok {
			if got := e.BusPayload()["status"]; got != st {
				return fmt.Errorf("status %v, want %s", got, st)
			}
		}
	default:
		// A marker code (e.g. DEADLINE_EXCEEDED) has no refusal shape to
		// build; it is enough that the code is ours and never retryable.
		if code.Retryable() {
			return fmt.Errorf("%s must not be retryable", code)
		}
		return nil
	}
	if e.Code != code {
		return fmt.Errorf("code %s, want %s", e.Code, code)
	}
	if d != nil {
		return sameJSON(e.Details, d)
	}
	return nil
}

func asArray(v any) []any {
	a, _ := v.([]any)
	return a
}
