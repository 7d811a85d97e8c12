package metering_test

import (
	"strings"
	"testing"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/metering"
	"agentmesh.dev/mesh/shared/protocol"
)

const (
	provider = "UAKQRYZBYFOC65OQZVJ3QPCIERDTRNNZPMOJUYXC3DGPRCDWSKD4HV5A"
	consumer = "UBMBH4BK6EIHQFVMHLSABFSQXB3JXUFZOXVZQTIERO33AD4HHAI3D7QP"
)

func event(extra string) string {
	return `{"provider":"` + provider + `","consumer":"` + consumer + `","envelope_id":"e1","ts":"2026-08-02T15:04:10Z"` + extra + `}`
}

func TestParseEvent(t *testing.T) {
	for _, c := range []struct {
		name, json string
		ok         bool
	}{
		{"declared", event(`,"meter":"tokens_out","class":"declared","quantity":4210`), true},
		{"observed", event(`,"meter":"requests","class":"observed","quantity":1,"offering":"x"`), true},
		{"refusal", event(`,"meter":"requests","class":"observed","quantity":0,"refused":true,"refusal_code":"AGREEMENT_REQUIRED"`), true},
		{"observed class on a declared name", event(`,"meter":"tokens_out","class":"observed","quantity":1`), false},
		{"declared class on an observed name", event(`,"meter":"task_ms","class":"declared","quantity":1`), false},
		{"refusal without its code", event(`,"meter":"requests","class":"observed","quantity":0,"refused":true`), false},
		{"refusal code without a refusal", event(`,"meter":"requests","class":"observed","quantity":0,"refusal_code":"X"`), false},
		{"refused false", event(`,"meter":"requests","class":"observed","quantity":0,"refused":false`), false},
		{"bad meter name", event(`,"meter":"Tokens","class":"declared","quantity":1`), false},
		{"unknown member", event(`,"meter":"tokens_out","class":"declared","quantity":1,"note":"x"`), false},
		{"empty offering", event(`,"meter":"tokens_out","class":"declared","quantity":1,"offering":""`), false},
		{"provider not a key", strings.Replace(event(`,"meter":"tokens_out","class":"declared","quantity":1`), provider, "UNOTAKEY", 1), false},
		{"bad ts", strings.Replace(event(`,"meter":"tokens_out","class":"declared","quantity":1`), "2026-08-02T15:04:10Z", "yesterday", 1), false},
		{"quantity beyond 2^53", event(`,"meter":"tokens_out","class":"declared","quantity":9007199254740993`), false},
		{"not an object", `[1]`, false},
		{"not JSON", `{`, false},
	} {
		_, err := metering.ParseEvent([]byte(c.json))
		if (err == nil) != c.ok {
			t.Errorf("%s: err %v, want ok=%v", c.name, err, c.ok)
		}
		if err != nil && errs.CodeOf(err) != errs.InvalidEnvelope {
			t.Errorf("%s: refused with %s, want INVALID_ENVELOPE", c.name, errs.CodeOf(err))
		}
	}
}

func TestRefusalEventIsValid(t *testing.T) {
	e := metering.RefusalEvent(provider, consumer, "caselaw-summary", "env-1", "2026-08-02T15:10:00Z", "AGREEMENT_REQUIRED")
	b, err := protocol.Canonical(e)
	if err != nil {
		t.Fatal(err)
	}
	got, err := metering.ParseEvent(b)
	if err != nil {
		t.Fatalf("the refusal event is refused: %v", err)
	}
	if got.Quantity != 0 || !got.Refused || got.Meter != metering.Requests || got.Class != metering.Observed {
		t.Fatalf("refusal event %+v", got)
	}
}

func TestLedgerFoldsOnTheKey(t *testing.T) {
	l := metering.NewLedger()
	add := func(meter, env string, q int64, want bool) {
		t.Helper()
		if got := l.Add(metering.Event{Meter: meter, EnvelopeID: env, Quantity: q}); got != want {
			t.Fatalf("Add(%s, %s, %d) = %v, want %v", meter, env, q, got, want)
		}
	}
	add("tokens_out", "E1", 10, true)
	add("tokens_out", "E1", 10, false) // redelivery
	add("tool_calls", "E1", 2, true)   // another meter, another fact
	add("tokens_out", "E2", 5, true)
	add("tokens_out", "E2", 99, false) // first writer wins
	if got := l.Totals(); got["tokens_out"] != 15 || got["tool_calls"] != 2 || len(got) != 2 {
		t.Fatalf("totals %v", got)
	}
}

func TestCurrentSupersedes(t *testing.T) {
	got := metering.Current([]metering.Report{
		{Usage: []metering.Usage{{Meter: "tokens_out", Quantity: 2000}, {Meter: "model_ms", Quantity: 10}}},
		{Terminal: true, Usage: []metering.Usage{{Meter: "tokens_out", Quantity: 4210}}},
		{Usage: []metering.Usage{{Meter: "tokens_out", Quantity: 1}}}, // after the end: ignored
	})
	if len(got) != 1 || got["tokens_out"] != 4210 {
		t.Fatalf("current %v, want only tokens_out=4210", got)
	}
}

func TestUsageFromValue(t *testing.T) {
	parse := func(s string) error {
		v, err := protocol.ParseJSON([]byte(s))
		if err != nil {
			t.Fatal(err)
		}
		_, err = metering.UsageFromValue(v)
		return err
	}
	if err := parse(`[{"meter":"tokens_out","quantity":4210},{"meter":"tool_calls","quantity":0}]`); err != nil {
		t.Fatal(err)
	}
	many := make([]string, metering.MaxReceiptEntries+1)
	for i := range many {
		many[i] = `{"meter":"m` + strings.Repeat("x", i%60) + string(rune('a'+i%26)) + `","quantity":1}`
	}
	for _, bad := range []string{
		`{"meter":"tokens_out","quantity":1}`,
		`[{"meter":"requests","quantity":1}]`,
		`[{"meter":"tokens_out","quantity":1},{"meter":"tokens_out","quantity":2}]`,
		`[{"meter":"tokens_out","quantity":-1}]`,
		`[{"meter":"tokens_out","quantity":1.5}]`,
		`[{"meter":"tokens_out","quantity":1,"unit":"x"}]`,
		`[` + strings.Join(many, ",") + `]`,
	} {
		if err := parse(bad); errs.CodeOf(err) != errs.InvalidEnvelope {
			t.Errorf("%.60s: %v, want INVALID_ENVELOPE", bad, err)
		}
	}
}

func TestReceiptFromSignedRespond(t *testing.T) {
	k, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		t.Fatal(err)
	}
	e, err := protocol.New(protocol.TypeRespond, k.Public(), map[string]any{"status": "completed",
		"usage": []any{map[string]any{"meter": "tokens_out", "quantity": 4210}}})
	if err != nil {
		t.Fatal(err)
	}
	e.To, e.InReplyTo = consumer, "req-1"
	if err := e.Sign(k); err != nil {
		t.Fatal(err)
	}
	wire, _ := e.Marshal()
	env, err := protocol.Decode(wire)
	if err != nil {
		t.Fatal(err)
	}
	r, err := metering.ReceiptFrom(env)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Terminal || len(r.Usage) != 1 || r.Usage[0].Quantity != 4210 || r.Responder != k.Public() {
		t.Fatalf("receipt %+v", r)
	}
	for _, ev := range r.Events("caselaw-summary") {
		b, _ := protocol.Canonical(ev)
		if _, err := metering.ParseEvent(b); err != nil {
			t.Fatalf("lifted event %s refused: %v", b, err)
		}
		if ev.EnvelopeID != env.ID || ev.Consumer != consumer {
			t.Fatalf("event %+v", ev)
		}
	}
	// A respond that declares nothing has an empty receipt; one that is not
	// a respond has none.
	plain, _ := protocol.New(protocol.TypeRespond, k.Public(), map[string]any{"status": "working"})
	if r, err := metering.ReceiptFrom(plain); err != nil || r.Terminal || r.Usage != nil {
		t.Fatalf("plain respond: %+v %v", r, err)
	}
	req, _ := protocol.New(protocol.TypeRequest, k.Public(), map[string]any{})
	if _, err := metering.ReceiptFrom(req); err == nil {
		t.Fatal("a request carries no receipt")
	}
}
