package vectors

import (
	"fmt"
	"slices"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

func checkCancel(t *T, doc map[string]any) {
	k, err := senderKey(doc)
	if err != nil {
		t.Run("identities", func() error { return err })
	}
	if rs, ok := doc["reasons"].(map[string]any); ok {
		t.Run("reasons/enum", func() error {
			want := strs(rs["enum"])
			got := slices.Clone(protocol.CancelReasons)
			slices.Sort(want)
			slices.Sort(got)
			if !slices.Equal(got, want) {
				return fmt.Errorf("our reasons %v, fixture %v", got, want)
			}
			for _, r := range want {
				if _, err := protocol.ParseCancelInput(map[string]any{"task_id": "t", "reason": r}); err != nil {
					return fmt.Errorf("reason %s refused: %v", r, err)
				}
			}
			return nil
		})
	}
	if sh, ok := doc["shapes"].(map[string]any); ok {
		for _, name := range members(sh) {
			m, ok := sh[name].(map[string]any)
			if !ok {
				continue
			}
			t.Run("shapes/"+name, func() error {
				if in, ok := m["input"]; ok { // a cancel request payload
					ci, err := protocol.ParseCancelInput(in)
					if err != nil {
						return err
					}
					got := protocol.CancelRequestPayload(ci)
					if _, usesSkill := m["skill"]; usesSkill {
						got = protocol.CancelRequestPayloadSkill(ci)
					}
					if protocol.OfferingOf(m) != "task.cancel" {
						return fmt.Errorf("offering not read as task.cancel")
					}
					return sameJSON(got, m)
				}
				if m["status"] != nil { // a canceled update
					return sameJSON(protocol.CanceledUpdatePayload(str(m["reason"]), optStr(m, "note")), m)
				}
				return fmt.Errorf("shape is neither a request nor an update")
			})
		}
	}
	if pr, ok := doc["propagation"].(map[string]any); ok {
		for i, c := range asArray(pr["cases"]) {
			m := obj(c)
			t.Run("propagation/"+caseName(m, fmt.Sprint(i)), func() error {
				o := obj(m["original"])
				got := protocol.PropagatedCancel(protocol.CancelInput{Reason: str(o["reason"]), Note: optStr(o, "note")})
				return sameJSON(map[string]any{"reason": got.Reason, "note": got.Note}, m["forwarded"])
			})
		}
	}
	if inv, ok := doc["invalid"].(map[string]any); ok {
		for i, c := range asArray(inv["cases"]) {
			m := obj(c)
			t.Run("invalid/"+caseName(m, fmt.Sprint(i)), func() error {
				_, err := protocol.ParseCancelInput(m["input"])
				if errs.CodeOf(err) != errs.InvalidEnvelope {
					return fmt.Errorf("got %v, want INVALID_ENVELOPE", err)
				}
				return nil
			})
		}
	}
	if env, ok := doc["envelope"].(map[string]any); ok {
		t.Run("envelope", func() error {
			e, err := checkSignedEnvelope(env["signed"], optStr(env, "canonical"), k)
			if err != nil {
				return err
			}
			p, err := e.PayloadValue()
			if err != nil {
				return err
			}
			pm := obj(p)
			if in, ok := pm["input"]; ok && protocol.OfferingOf(pm) == "task.cancel" {
				if _, err := protocol.ParseCancelInput(in); err != nil {
					return fmt.Errorf("the signed cancel's input is refused: %v", err)
				}
			}
			return checkTamperBreaks(env["signed"])
		})
	}
	if tr, ok := doc["transitions"].(map[string]any); ok {
		for _, s := range strs(tr["cancelable_from"]) {
			t.Run("transitions/cancelable_from/"+s, func() error {
				if err := protocol.CancelTask(s); err != nil || !protocol.Cancelable(s) {
					return fmt.Errorf("state %s is not cancelable here: %v", s, err)
				}
				return nil
			})
		}
		for _, s := range strs(tr["not_cancelable_from"]) {
			t.Run("transitions/not_cancelable_from/"+s, func() error {
				if errs.CodeOf(protocol.CancelTask(s)) != errs.TaskNotCancelable || protocol.Cancelable(s) {
					return fmt.Errorf("state %s must refuse with TASK_NOT_CANCELABLE", s)
				}
				return nil
			})
		}
	}
}
