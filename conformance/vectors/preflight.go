package vectors

import (
	"fmt"
	"strings"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// checkPreflight builds a real request envelope for every case and asks the
// sender pre-flight whether it may be published.
func checkPreflight(t *T, doc map[string]any) {
	ids, _ := doc["identities"].(map[string]any)
	from, to := optStr(ids, "sender"), optStr(ids, "recipient")
	request := func(input map[string]any, config map[string]any) (*protocol.Envelope, error) {
		p := map[string]any{"offering": "chat", "input": input}
		if config != nil {
			p["config"] = config
		}
		e, err := protocol.New(protocol.TypeRequest, from, p)
		if err != nil {
			return nil, err
		}
		e.To = to
		return e, nil
	}
	judge := func(m map[string]any, err error) error {
		want := str(m["verdict"])
		got := "publish"
		if err != nil {
			got = "refuse_local"
		}
		if got != want {
			return fmt.Errorf("%s (%v), want %s", got, err, want)
		}
		if err == nil {
			return nil
		}
		e := errs.As(err)
		if c := optStr(m, "error_code"); c != "" && string(e.Code) != c {
			return fmt.Errorf("code %s, want %s", e.Code, c)
		}
		if rt, ok := m["retryable"].(bool); ok && e.Retryable != rt {
			return fmt.Errorf("retryable %v, want %v", e.Retryable, rt)
		}
		if l := optStr(m, "details_limit"); l != "" && e.Details["limit"] != l {
			return fmt.Errorf("details.limit %v, want %s", e.Details["limit"], l)
		}
		return nil
	}

	if st, ok := doc["sender_text"].(map[string]any); ok {
		for i, c := range asArray(st["cases"]) {
			m := obj(c)
			t.Run("sender_text/"+caseName(m, fmt.Sprint(i)), func() error {
				text, ok := m["text"].(string)
				if !ok {
					text = strings.Repeat("x", int(num(m["text_utf16_len"])))
				}
				if n := protocol.UTF16Len(text); n != int(num(m["text_utf16_len"])) {
					return fmt.Errorf("text measures %d UTF-16 units, fixture says %v", n, m["text_utf16_len"])
				}
				var lim protocol.RecipientLimits
				if c, ok := m["declared_cap"].(float64); ok {
					n := int(c)
					lim.MaxInboundChars = &n
				}
				e, err := request(map[string]any{"text": text}, nil)
				if err != nil {
					return err
				}
				return judge(m, protocol.Preflight(e, lim, 0))
			})
		}
	}
	if es, ok := doc["envelope_size"].(map[string]any); ok {
		for i, c := range asArray(es["cases"]) {
			m := obj(c)
			t.Run("envelope_size/"+caseName(m, fmt.Sprint(i)), func() error {
				want := int(num(m["envelope_bytes"]))
				// Pad the text until the signed envelope is exactly the size
				// the case names; the text cap is off so only the transport
				// bound can fire.
				e, err := request(map[string]any{"text": ""}, nil)
				if err != nil {
					return err
				}
				base, err := e.WireSize()
				if err != nil {
					return err
				}
				if want < base {
					return fmt.Errorf("case size %d is below an empty request (%d)", want, base)
				}
				if err := e.SetPayload(map[string]any{"offering": "chat", "input": map[string]any{"text": strings.Repeat("x", want-base)}}); err != nil {
					return err
				}
				if n, _ := e.WireSize(); n != want {
					return fmt.Errorf("built an envelope of %d bytes, want %d", n, want)
				}
				noCap := 0
				return judge(m, protocol.Preflight(e, protocol.RecipientLimits{MaxInboundChars: &noCap}, int(num(m["max_payload_bytes"]))))
			})
		}
	}
	if ct, ok := doc["content_type"].(map[string]any); ok {
		for i, c := range asArray(ct["cases"]) {
			m := obj(c)
			t.Run("content_type/"+caseName(m, fmt.Sprint(i)), func() error {
				e, err := request(map[string]any{"text": "hello"}, map[string]any{"accepted_output": m["accepted_output"]})
				if err != nil {
					return err
				}
				lim := protocol.RecipientLimits{OutputModes: strs(m["skill_output_modes"])}
				return judge(m, protocol.Preflight(e, lim, 0))
			})
		}
	}
}

func strs(v any) []string {
	var out []string
	for _, x := range asArray(v) {
		out = append(out, str(x))
	}
	return out
}
