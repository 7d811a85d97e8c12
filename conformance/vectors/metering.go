package vectors

import (
	"fmt"
	"slices"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/metering"
	"agentmesh.dev/mesh/shared/protocol"
)

// checkMetering: the observed meter set and name grammar, event shapes,
// the (meter, envelope_id) fold, superseding receipts, and the signed
// respond whose envelope signature is the receipt's, through
// shared/metering and the envelope decoder.
func checkMetering(t *T, doc map[string]any) {
	k, err := senderKey(doc)
	if err != nil {
		t.Run("identities", func() error { return err })
	}
	if o, ok := doc["observed_meters"].(map[string]any); ok {
		t.Run("observed_meters", func() error {
			want := strs(o["meters"])
			if got := metering.ObservedMeters(); !slices.Equal(got, want) {
				return fmt.Errorf("observed meters %v, want %v", got, want)
			}
			if p := optStr(o, "name_pattern"); p != "" && p != metering.NamePattern {
				return fmt.Errorf("name pattern %s, ours is %s", p, metering.NamePattern)
			}
			return nil
		})
	}
	if e, ok := doc["event"].(map[string]any); ok {
		for i, v := range asArray(e["valid"]) {
			t.Run(fmt.Sprintf("event/valid/%d", i), func() error {
				ev, err := metering.EventFromValue(v)
				if err != nil {
					return fmt.Errorf("a valid event was refused: %v", err)
				}
				return sameJSON(ev, v)
			})
		}
		for i, c := range asArray(e["invalid"]) {
			m := obj(c)
			t.Run("event/invalid/"+caseName(m, fmt.Sprint(i)), func() error {
				_, err := metering.EventFromValue(m["event"])
				return refused(err, errs.InvalidEnvelope, m)
			})
		}
	}
	if id, ok := doc["idempotency"].(map[string]any); ok {
		t.Run("idempotency", func() error {
			var events []metering.Event
			for _, e := range asArray(id["events"]) {
				m := obj(e)
				events = append(events, metering.Event{Meter: str(m["meter"]), EnvelopeID: str(m["envelope_id"]), Quantity: num(m["quantity"])})
			}
			return sameJSON(metering.Fold(events), id["expect_folded"])
		})
	}
	if r, ok := doc["receipt"].(map[string]any); ok {
		if sc, ok := r["supersede_case"].(map[string]any); ok {
			t.Run("receipt/supersede_case", func() error {
				var reports []metering.Report
				for _, x := range asArray(sc["reports_in_order"]) {
					m := obj(x)
					usage, err := metering.UsageFromValue(m["usage"])
					if err != nil {
						return err
					}
					reports = append(reports, metering.Report{Terminal: m["terminal"] == true, Usage: usage})
				}
				return sameJSON(metering.Current(reports), sc["expect_final"])
			})
		}
		if se, ok := r["signed_envelope"].(map[string]any); ok {
			t.Run("receipt/signed_envelope", func() error { return checkSignedReceipt(se, k) })
		}
	}
}

// checkSignedReceipt: the respond verifies through the decoder, its
// receipt reads back exactly the usage it carries, becomes declared meter
// events keyed by the respond's id, and one changed quantity breaks the
// signature.
func checkSignedReceipt(se map[string]any, k *keys.Agent) error {
	if p := optStr(se, "signed_bytes_prefix"); p != "" && p != protocol.TagEnvelope+"\n" {
		return fmt.Errorf("prefix %q, ours is %q", p, protocol.TagEnvelope+"\n")
	}
	signed := obj(se["signed"])
	env, err := checkSignedEnvelope(signed, optStr(se, "canonical"), k)
	if err != nil {
		return err
	}
	r, err := metering.ReceiptFrom(env)
	if err != nil {
		return err
	}
	payload := obj(signed["payload"])
	if err := sameJSON(r.Usage, payload["usage"]); err != nil {
		return fmt.Errorf("receipt usage: %v", err)
	}
	if r.Terminal != protocol.Terminal(optStr(payload, "status")) || r.Responder != env.From {
		return fmt.Errorf("receipt %+v does not reflect the respond", r)
	}
	for _, ev := range r.Events("") {
		if ev.EnvelopeID != env.ID || ev.Class != metering.Declared {
			return fmt.Errorf("event %+v is not a declared event keyed by the respond id", ev)
		}
		if _, err := metering.EventFromValue(mustParse(canon(ev))); err != nil {
			return fmt.Errorf("the receipt's event is refused: %v", err)
		}
	}
	// One changed quantity must fail verification.
	tampered := obj(mustCopy(signed))
	usage := arr(obj(tampered["payload"])["usage"])
	first := obj(usage[0])
	first["quantity"] = float64(num(first["quantity"]) + 1)
	if _, err := protocol.Decode([]byte(canon(tampered))); errs.CodeOf(err) != errs.IdentityMismatch {
		return fmt.Errorf("a receipt with a changed quantity was not refused with IDENTITY_MISMATCH (got %v)", err)
	}
	return nil
}
