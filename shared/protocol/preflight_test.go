package protocol_test

import (
	"strings"
	"testing"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

func TestWireSizeIsExact(t *testing.T) {
	k := freshKey(t)
	for _, text := range []string{"", "x", strings.Repeat("é😀", 100)} {
		e, _ := protocol.New(protocol.TypeRequest, k.Public(), map[string]any{"offering": "chat", "input": text})
		predicted, err := e.WireSize()
		if err != nil {
			t.Fatal(err)
		}
		_ = e.Sign(k)
		wire, _ := e.Marshal()
		if predicted != len(wire) {
			t.Errorf("predicted %d bytes, signed envelope is %d", predicted, len(wire))
		}
		if n, _ := e.WireSize(); n != len(wire) {
			t.Errorf("signed WireSize %d != %d", n, len(wire))
		}
	}
}

func TestPreflightRefusesLocally(t *testing.T) {
	k := freshKey(t)
	cap5 := 5
	zero := 0
	for _, c := range []struct {
		name  string
		input any
		cfg   map[string]any
		lim   protocol.RecipientLimits
		max   int
		code  errs.Code
	}{
		{"declared cap", "123456", nil, protocol.RecipientLimits{MaxInboundChars: &cap5}, 0, errs.ContextTooLarge},
		{"at declared cap", "12345", nil, protocol.RecipientLimits{MaxInboundChars: &cap5}, 0, ""},
		{"default cap", strings.Repeat("x", protocol.DefaultMaxInbound+1), nil, protocol.RecipientLimits{}, 0, errs.ContextTooLarge},
		{"cap off", strings.Repeat("x", protocol.DefaultMaxInbound+1), nil, protocol.RecipientLimits{MaxInboundChars: &zero}, 0, ""},
		{"transport", strings.Repeat("x", 2000), nil, protocol.RecipientLimits{}, 1000, errs.ContextTooLarge},
		{"accepted output", "hi", map[string]any{"accepted_output": []any{"image/png"}}, protocol.RecipientLimits{OutputModes: []string{"text/plain"}}, 0, errs.ContentTypeNotSupported},
		{"input type", "hi", map[string]any{"content_type": "audio/wav"}, protocol.RecipientLimits{InputModes: []string{"text/plain"}}, 0, errs.ContentTypeNotSupported},
		{"satisfiable", "hi", map[string]any{"accepted_output": []any{"image/png", "text/plain"}}, protocol.RecipientLimits{OutputModes: []string{"text/plain"}}, 0, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := map[string]any{"offering": "chat", "input": c.input}
			if c.cfg != nil {
				p["config"] = c.cfg
			}
			e, _ := protocol.New(protocol.TypeRequest, k.Public(), p)
			err := protocol.Preflight(e, c.lim, c.max)
			if errs.CodeOf(err) != c.code {
				t.Fatalf("got %v, want %q", err, c.code)
			}
			if err != nil && (errs.As(err).Retryable || e.Sig != "") {
				t.Error("a pre-flight refusal is not retryable and signs nothing")
			}
		})
	}
}
