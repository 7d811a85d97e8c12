package protocol_test

import (
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

func TestParseBudget(t *testing.T) {
	for _, c := range []struct {
		in string
		ok bool
	}{
		{`{"revision":0,"deadline":"2026-07-27T16:00:00Z"}`, true},
		{`{"revision":2,"cost_ceiling":{"amount_micro":0,"currency":"XCR"},"future":1}`, true},
		{`{"revision":0}`, false},
		{`{"deadline":"2026-07-27T16:00:00Z"}`, false},
		{`{"revision":0,"deadline":null}`, false},
		{`{"revision":0,"deadline":"2026-07-27"}`, false},
		{`{"revision":0,"cost_ceiling":null}`, false},
		{`{"revision":0,"cost_ceiling":{"amount_micro":1.5,"currency":"USD"}}`, false},
		{`{"revision":0,"cost_ceiling":{"amount_micro":1,"currency":"usd"}}`, false},
		{`{"revision":-1,"deadline":"2026-07-27T16:00:00Z"}`, false},
		{`{"revision":1e300,"deadline":"2026-07-27T16:00:00Z"}`, false},
		{`[]`, false},
	} {
		_, err := protocol.ParseBudget([]byte(c.in))
		if (err == nil) != c.ok {
			t.Errorf("%s: err %v, want ok=%v", c.in, err, c.ok)
		}
		if err != nil && errs.CodeOf(err) != errs.InvalidEnvelope {
			t.Errorf("%s: code %s", c.in, errs.CodeOf(err))
		}
	}
}

func TestBudgetLine(t *testing.T) {
	now := at("2026-07-27T14:30:00Z")
	for _, c := range []struct {
		b    protocol.Budget
		want string
	}{
		{protocol.Budget{Deadline: "2026-07-27T11:00:00-05:00", Revision: 2, CostCeiling: &protocol.Money{AmountMicro: 2_500_000, Currency: "USD"}},
			"budget: ceiling 2.50 USD . due 2026-07-27 16:00:00 UTC (1h30m0s from now) . revision 2"},
		{protocol.Budget{CostCeiling: &protocol.Money{AmountMicro: 1500, Currency: "EUR"}},
			"budget: ceiling 0.0015 EUR . revision 0"},
		{protocol.Budget{Deadline: "2026-07-27T14:00:00Z", Revision: 1},
			"budget: due 2026-07-27 14:00:00 UTC (30m0s ago) . revision 1"},
	} {
		if got := c.b.Line(now); got != c.want {
			t.Errorf("got  %q\nwant %q", got, c.want)
		}
	}
}

func TestDeadlineAndRevisions(t *testing.T) {
	d := at("2026-07-27T16:00:00Z")
	for off, past := range map[time.Duration]bool{0: false, 300 * time.Second: false, 300*time.Second + 999*time.Millisecond: false, 301 * time.Second: true} {
		if got := protocol.DeadlinePast(d, d.Add(off)); got != past {
			t.Errorf("now = deadline+%v: past=%v", off, got)
		}
	}
	r0 := protocol.Budget{Revision: 0, Deadline: "2026-07-27T16:00:00Z"}
	r1 := protocol.Budget{Revision: 1, CostCeiling: &protocol.Money{AmountMicro: 5, Currency: "USD"}}
	cur, changed := protocol.ApplyRevision(&r0, r1)
	if !changed || cur.Deadline != "" || cur.Revision != 1 {
		t.Errorf("revision is absolute: %+v", cur)
	}
	if _, changed := protocol.ApplyRevision(&cur, r1); changed {
		t.Error("an equal revision must be ignored")
	}
	now := at("2026-07-27T15:00:00Z")
	for name, c := range map[string]struct {
		next  protocol.Budget
		spent *protocol.Money
	}{
		"not newer":      {r0, nil},
		"deadline past":  {protocol.Budget{Revision: 2, Deadline: "2026-07-27T14:00:00Z"}, nil},
		"below spending": {protocol.Budget{Revision: 2, CostCeiling: &protocol.Money{AmountMicro: 4, Currency: "USD"}}, &protocol.Money{AmountMicro: 5, Currency: "USD"}},
	} {
		if err := protocol.CheckRevision(&r0, c.next, now, c.spent); errs.CodeOf(err) != errs.TaskInvalidTransition {
			t.Errorf("%s: %v", name, err)
		}
	}
	if err := protocol.CheckRevision(&r0, r1, now, nil); err != nil {
		t.Errorf("a valid revision: %v", err)
	}
}

func TestRefusalConstructors(t *testing.T) {
	e := protocol.BudgetInsufficient(protocol.Money{AmountMicro: 5_000_000, Currency: "USD"}, "")
	b, _ := protocol.Canonical(e.Wire())
	if string(b) != `{"code":"BUDGET_INSUFFICIENT","details":{"estimate":{"amount_micro":5000000,"currency":"USD"}},"message":"the budget does not cover this work; the estimate is the price","retryable":false}` {
		t.Errorf("wire: %s", b)
	}
	p := protocol.BudgetExhaustedPause(protocol.Money{AmountMicro: 1, Currency: "USD"}, protocol.Money{AmountMicro: 2, Currency: "USD"}).BusPayload()
	if p["status"] != "input_required" {
		t.Errorf("pause status %v", p["status"])
	}
	if protocol.FormatMicro(-1_234_567) != "-1.234567" || protocol.FormatMicro(10_000_000) != "10.00" {
		t.Error("FormatMicro")
	}
}
