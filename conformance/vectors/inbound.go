package vectors

import (
	"fmt"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

func checkInbound(t *T, doc map[string]any) {
	k, err := senderKey(doc)
	if err != nil {
		t.Run("identities", func() error { return err })
	}
	ids, _ := doc["identities"].(map[string]any)

	// Signed envelopes: decode, canonical, reproduce.
	envs, _ := doc["envelopes"].(map[string]any)
	for _, name := range members(envs) {
		m, ok := envs[name].(map[string]any)
		if !ok || m["envelope"] == nil {
			continue
		}
		t.Run("envelopes/"+name, func() error {
			_, err := checkSignedEnvelope(m["envelope"], optStr(m, "canonical"), k)
			return err
		})
	}

	if dup, ok := doc["duplicate_rejection"].(map[string]any); ok {
		size := protocol.DefaultDedupEntries
		if n, ok := dup["min_entries"].(float64); ok {
			size = int(n)
		}
		for i, c := range asArray(dup["cases"]) {
			m := obj(c)
			t.Run("duplicate_rejection/"+caseName(m, fmt.Sprint(i)), func() error {
				return runDeliveries(m, size)
			})
		}
	}

	if fr, ok := doc["freshness"].(map[string]any); ok {
		t.Run("freshness/windows", func() error {
			for name, want := range map[string]time.Duration{
				"max_clock_skew_ahead_ms":  protocol.MaxFutureSkew,
				"max_clock_skew_behind_ms": protocol.MaxLiveAge,
				"max_mailbox_age_ms":       protocol.MaxMailboxAge,
			} {
				if ms, ok := fr[name].(float64); ok && time.Duration(ms)*time.Millisecond != want {
					return fmt.Errorf("%s: fixture %vms, ours %v", name, ms, want)
				}
			}
			return nil
		})
		for i, c := range asArray(fr["cases"]) {
			m := obj(c)
			t.Run("freshness/"+caseName(m, fmt.Sprint(i)), func() error {
				now, err := protocol.ParseTime(str(m["now"]))
				if err != nil {
					return err
				}
				err = protocol.CheckFreshness(optStr(m, "ts"), now, source(m))
				return verdict(err == nil, str(m["verdict"]), err)
			})
		}
	}

	if ad, ok := doc["addressing"].(map[string]any); ok {
		self := str(ad["self"])
		for i, c := range asArray(ad["cases"]) {
			m := obj(c)
			t.Run("addressing/"+caseName(m, fmt.Sprint(i)), func() error {
				ref := obj(envs[str(m["envelope"])])
				wire, err := protocol.Canonical(ref["envelope"])
				if err != nil {
					return err
				}
				e, err := protocol.Decode(wire)
				if err != nil {
					return err
				}
				err = protocol.CheckAddress(e, self)
				return verdict(err == nil, str(m["verdict"]), err)
			})
		}
	}

	if sc, ok := doc["size_cap"].(map[string]any); ok {
		if def, ok := sc["default_max_inbound_chars"].(float64); ok {
			t.Run("size_cap/default", func() error {
				if int(def) != protocol.DefaultMaxInbound {
					return fmt.Errorf("fixture default %v, ours %d", def, protocol.DefaultMaxInbound)
				}
				return nil
			})
		}
		for i, c := range asArray(sc["cases"]) {
			m := obj(c)
			t.Run("size_cap/"+caseName(m, fmt.Sprint(i)), func() error {
				_, _, n := protocol.SenderText(m["input"])
				if want, ok := m["measured_chars"].(float64); ok && n != int(want) {
					return fmt.Errorf("measured %d, want %v", n, want)
				}
				err := protocol.CheckSize(m["input"], int(num(m["max_inbound_chars"])))
				if err != nil && errs.CodeOf(err) != errs.ContextTooLarge {
					return fmt.Errorf("refused with %v, want CONTEXT_TOO_LARGE", err)
				}
				return verdict(err == nil, str(m["verdict"]), err)
			})
		}
	}

	if fe, ok := doc["fencing"].(map[string]any); ok {
		checkFencing(t, fe, ids)
	}

	if rf, ok := doc["refusals"].(map[string]any); ok {
		checkRefusalChannels(t, rf, ids, k)
	}
}

func source(m map[string]any) protocol.Source {
	if optStr(m, "source") == "mailbox" {
		return protocol.SourceMailbox
	}
	return protocol.SourceLive
}

func verdict(accepted bool, want string, err error) error {
	got := "refuse"
	if accepted {
		got = "accept"
	}
	if got != want {
		if err != nil {
			return fmt.Errorf("%s (%v), want %s", got, err, want)
		}
		return fmt.Errorf("%s, want %s", got, want)
	}
	return nil
}

// runDeliveries replays a dedup case through the same two steps a receiver
// runs in order: the (from, id) memory, then the freshness window.
// `deliveries` and `generated_deliveries` happen in sequence; each `then`
// entry is an alternative continuation from the state they leave (after
// eviction a fresh replay is accepted, and a stale one is refused by the
// window), so each is judged on its own copy of that state.
func runDeliveries(c map[string]any, size int) error {
	setup := func() (*protocol.DedupMemory, error) {
		mem := protocol.NewDedupMemory(size)
		for i, d := range asArray(c["deliveries"]) {
			m := obj(d)
			if err := deliver(mem, i, m, str(m["verdict"])); err != nil {
				return nil, err
			}
		}
		if g, ok := c["generated_deliveries"].(map[string]any); ok {
			tmpl := str(g["id_template"])
			for i := num(g["i_from"]); i <= num(g["i_to"]); i++ {
				d := map[string]any{"from": g["from"], "id": strings.ReplaceAll(tmpl, "{i}", fmt.Sprint(i))}
				if err := deliver(mem, int(i), d, str(g["each_verdict"])); err != nil {
					return nil, err
				}
			}
		}
		return mem, nil
	}
	if _, err := setup(); err != nil {
		return err
	}
	for i, d := range asArray(c["then"]) {
		mem, _ := setup()
		m := obj(d)
		if err := deliver(mem, i, m, str(m["verdict"])); err != nil {
			return fmt.Errorf("then: %w", err)
		}
	}
	return nil
}

// deliver runs one delivery and compares the verdict (and, when the case
// names it, the step that refused).
func deliver(mem *protocol.DedupMemory, i int, d map[string]any, want string) error {
	got, by := "accept", ""
	if mem.Seen(str(d["from"]), str(d["id"])) {
		got, by = "refuse", "duplicate"
	} else if ts := optStr(d, "ts"); ts != "" {
		now, err := protocol.ParseTime(str(d["now"]))
		if err != nil {
			return err
		}
		if protocol.CheckFreshness(ts, now, source(d)) != nil {
			got, by = "refuse", "freshness"
		}
	}
	if got != want {
		return fmt.Errorf("delivery %d: %s (by %s), want %s", i, got, by, want)
	}
	if wantBy := optStr(d, "refused_by"); wantBy != "" && wantBy != by {
		return fmt.Errorf("delivery %d: refused by %s, want %s", i, by, wantBy)
	}
	return nil
}

func provenance(p map[string]any) (protocol.Provenance, error) {
	at, err := protocol.ParseTime(str(p["received_at"]))
	if err != nil {
		return protocol.Provenance{}, err
	}
	pv := protocol.Provenance{From: str(p["from"]), ReceivedAt: at, Handle: optStr(p, "handle"), Operator: optStr(p, "operator")}
	if tr, ok := p["trace"].(map[string]any); ok {
		pv.TraceID = optStr(tr, "trace_id")
	}
	return pv, nil
}

func checkFencing(t *T, fe map[string]any, ids map[string]any) {
	for i, c := range asArray(fe["sender_text_cases"]) {
		m := obj(c)
		t.Run("fencing/sender_text/"+caseName(m, fmt.Sprint(i)), func() error {
			return quoteDiff(protocol.Fence(str(m["input"])), str(m["expected"]))
		})
	}
	var plain *protocol.Provenance
	for i, c := range asArray(fe["frame_cases"]) {
		m := obj(c)
		pm := obj(m["provenance"])
		if plain == nil && pm["trace"] == nil && pm["handle"] == nil {
			if p, err := provenance(pm); err == nil {
				plain = &p
			}
		}
		t.Run("fencing/frame/"+caseName(m, fmt.Sprint(i)), func() error {
			p, err := provenance(pm)
			if err != nil {
				return err
			}
			return quoteDiff(protocol.FrameText(str(m["text"]), p), str(m["expected"]))
		})
	}
	// The payload-shape cases carry no provenance of their own; their
	// expected frames use the plain unresolved form, so the sender identity
	// and the plain frame case's receipt time stand in.
	for i, c := range asArray(fe["payload_shape_cases"]) {
		m := obj(c)
		t.Run("fencing/payload_shape/"+caseName(m, fmt.Sprint(i)), func() error {
			if plain == nil {
				return fmt.Errorf("no plain frame case to take the provenance from")
			}
			p := *plain
			if s := optStr(ids, "sender"); s != "" {
				p.From = s
			}
			text, field, n := protocol.SenderText(m["input"])
			if want, ok := m["sender_text"].(string); ok && n != protocol.UTF16Len(want) {
				return fmt.Errorf("measured %d units, the fixture's sender_text has %d", n, protocol.UTF16Len(want))
			}
			wantField, _ := m["sender_text_field"].(string)
			if field != wantField {
				return fmt.Errorf("sender text field %q, want %q", field, wantField)
			}
			if wantField != "" && text != m["sender_text"] {
				return fmt.Errorf("sender text %q, want %q", text, m["sender_text"])
			}
			got, framed := protocol.FrameInput(m["input"], p)
			if want, ok := m["framed"].(bool); ok && framed != want {
				return fmt.Errorf("framed=%v, want %v", framed, want)
			}
			if canon(m["input"]) != canon(mustCopy(m["input"])) {
				return fmt.Errorf("input was mutated")
			}
			return sameJSON(got, m["expected"])
		})
	}
}

func mustCopy(v any) any {
	b, _ := protocol.Canonical(v)
	c, _ := protocol.ParseJSON(b)
	return c
}

// checkRefusalChannels drives each refusal category through a real Inbox
// with envelopes signed by the fixture's sender seed, and checks the channel
// the fixture pins: a reply (with its code) or silence, and the local
// warning.
func checkRefusalChannels(t *T, rf map[string]any, ids map[string]any, k *keys.Agent) {
	recipient := optStr(ids, "recipient")
	if k == nil || recipient == "" {
		t.Run("refusals", func() error { return fmt.Errorf("fixture has no sender seed and recipient to build refusals with") })
		return
	}
	now := time.Date(2026, 7, 26, 12, 0, 0, 0, time.UTC)
	build := func(mut func(e *protocol.Envelope)) []byte {
		e, err := protocol.New(protocol.TypeRequest, k.Public(), map[string]any{"offering": "chat", "input": map[string]any{"text": "hello"}})
		if err != nil {
			panic(err)
		}
		e.TS = protocol.FormatTime(now)
		e.To = recipient
		if mut != nil {
			mut(e)
		}
		if err := e.Sign(k); err != nil {
			panic(err)
		}
		b, err := e.Marshal()
		if err != nil {
			panic(err)
		}
		return b
	}
	categories := map[string]func() (first, second []byte){
		"size_cap": func() ([]byte, []byte) {
			return build(func(e *protocol.Envelope) {
				_ = e.SetPayload(map[string]any{"offering": "chat", "input": map[string]any{"text": strings.Repeat("x", protocol.DefaultMaxInbound+1)}})
			}), nil
		},
		"duplicate": func() ([]byte, []byte) { b := build(nil); return b, b },
		"stale": func() ([]byte, []byte) {
			return build(func(e *protocol.Envelope) { e.TS = protocol.FormatTime(now.Add(-2 * time.Hour)) }), nil
		},
		"misaddressed": func() ([]byte, []byte) {
			return build(func(e *protocol.Envelope) { e.To = k.Public() }), nil
		},
		"hops_exceeded": func() ([]byte, []byte) {
			return build(func(e *protocol.Envelope) { e.Meta = []byte(fmt.Sprintf(`{"hops":%d}`, protocol.MaxRelayHops+1)) }), nil
		},
	}
	for _, name := range members(rf) {
		spec, ok := rf[name].(map[string]any)
		if !ok {
			continue
		}
		mk, known := categories[name]
		if !known {
			t.Run("refusals/"+name, func() error {
				return fmt.Errorf("refusal category %q is not one this runner knows how to provoke", name)
			})
			continue
		}
		t.Run("refusals/"+name, func() error {
			var warnings []string
			handled := 0
			in := &protocol.Inbox{Self: recipient, Dedup: protocol.NewDedupMemory(0), Now: func() time.Time { return now },
				Warn: func(code string, _ *protocol.Refusal) { warnings = append(warnings, code) }}
			first, second := mk()
			var err error
			if second != nil { // the first copy must be delivered
				if _, err = in.Receive(first, protocol.SourceLive); err != nil {
					return fmt.Errorf("first copy refused: %v", err)
				}
				handled++
				first = second
			}
			_, err = in.Receive(first, protocol.SourceLive)
			r, ok := err.(*protocol.Refusal)
			if !ok {
				return fmt.Errorf("not refused (err %v)", err)
			}
			ts := spec["to_sender"]
			if ts == nil {
				if !r.Silent {
					return fmt.Errorf("refusal answers the sender; the fixture pins silence")
				}
			} else {
				want := obj(ts)
				if r.Silent {
					return fmt.Errorf("refusal is silent; the fixture pins a reply")
				}
				if c := optStr(want, "error_code"); c != "" && string(r.Err.Code) != c {
					return fmt.Errorf("reply code %s, want %s", r.Err.Code, c)
				}
				if rt, ok := want["retryable"].(bool); ok && r.Err.Retryable != rt {
					return fmt.Errorf("retryable %v, want %v", r.Err.Retryable, rt)
				}
				// The reply goes in_reply_to the request, to its sender.
				reply, err := protocol.NewReply(r.Env, recipient, r.Err.BusPayload())
				if err != nil {
					return err
				}
				if reply.InReplyTo != r.Env.ID || reply.To != r.Env.From {
					return fmt.Errorf("reply is not bound to the request and its sender")
				}
			}
			if tr, ok := spec["to_recipient"].(map[string]any); ok {
				if w := optStr(tr, "local_warning"); w != "" && !contains(warnings, w) {
					return fmt.Errorf("local warning %q not raised (got %v)", w, warnings)
				}
			}
			if hi, ok := spec["handler_invoked"].(bool); ok && !hi && handled > 0 {
				return fmt.Errorf("handler invoked")
			}
			return nil
		})
	}
}

func contains(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}
