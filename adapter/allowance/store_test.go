package allowance

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

func TestOpenRefusesBadParties(t *testing.T) {
	owner := fixtureOwner(t)
	if _, err := Open(t.TempDir(), "not-a-key", owner); err == nil {
		t.Error("Open accepted an agent that is not a public key")
	}
	if _, err := Open(t.TempDir(), fixtureAgent(t), nil); err == nil {
		t.Error("Open accepted a nil owner")
	}
}

// setStep is one `allowance set` in a scenario; err, when set, is a
// substring the error must contain (or an errors.Is target via errIs).
type setStep struct {
	req   SetRequest
	err   string
	errIs error
}

func TestSetRules(t *testing.T) {
	now := at("2026-07-28T15:00:00.123456Z")
	per1k := usdp(1500)
	day := func(m int64) protocol.Ceiling { return protocol.Ceiling{Scope: protocol.ScopeDay, AmountMicro: m} }
	ctx := func(id string, m int64) protocol.Ceiling {
		return protocol.Ceiling{Scope: protocol.ScopeContext, ContextID: id, AmountMicro: m}
	}
	task := func(m int64) protocol.Ceiling { return protocol.Ceiling{Scope: protocol.ScopeTask, AmountMicro: m} }
	eur := func(m int64) protocol.Money { return protocol.Money{AmountMicro: m, Currency: "EUR"} }
	eurp := func(m int64) *protocol.Money { e := eur(m); return &e }

	for _, c := range []struct {
		name        string
		steps       []setStep
		ceilings    []protocol.Ceiling // nil: no document may exist
		per1k       int64
		onExhausted string
	}{
		{name: "first set without per-1k is refused and writes nothing",
			steps: []setStep{{req: SetRequest{Amount: usd(10_000_000)}, errIs: ErrPer1kRequired, err: "first set"}}},
		{name: "first set defaults to one UTC day ceiling and refuse",
			steps:    []setStep{{req: SetRequest{Amount: usd(10_000_000), Per1k: per1k}}},
			ceilings: []protocol.Ceiling{day(10_000_000)}, per1k: 1500, onExhausted: "refuse"},
		{name: "per-1k is kept when a later set omits it",
			steps: []setStep{
				{req: SetRequest{Amount: usd(10_000_000), Per1k: per1k}},
				{req: SetRequest{Amount: usd(20_000_000)}}},
			ceilings: []protocol.Ceiling{day(20_000_000)}, per1k: 1500, onExhausted: "refuse"},
		{name: "per-1k is replaced when a later set gives it",
			steps: []setStep{
				{req: SetRequest{Amount: usd(10_000_000), Per1k: per1k}},
				{req: SetRequest{Amount: usd(10_000_000), Per1k: usdp(2000)}}},
			ceilings: []protocol.Ceiling{day(10_000_000)}, per1k: 2000, onExhausted: "refuse"},
		{name: "context sets a context ceiling narrowed to that context",
			steps: []setStep{
				{req: SetRequest{Amount: usd(10_000_000), Per1k: per1k}},
				{req: SetRequest{Amount: usd(3_000_000), Context: "meetup-s1-e4"}}},
			ceilings: []protocol.Ceiling{day(10_000_000), ctx("meetup-s1-e4", 3_000_000)}, per1k: 1500, onExhausted: "refuse"},
		{name: "scope task sets an unnarrowed per-task ceiling",
			steps: []setStep{
				{req: SetRequest{Amount: usd(10_000_000), Per1k: per1k}},
				{req: SetRequest{Amount: usd(500_000), ScopeTask: true}}},
			ceilings: []protocol.Ceiling{day(10_000_000), task(500_000)}, per1k: 1500, onExhausted: "refuse"},
		{name: "scope task with context is a per-task ceiling inside that context",
			steps: []setStep{
				{req: SetRequest{Amount: usd(500_000), Per1k: per1k, ScopeTask: true, Context: "meetup"}}},
			ceilings:    []protocol.Ceiling{{Scope: protocol.ScopeTask, ContextID: "meetup", AmountMicro: 500_000}},
			per1k:       1500,
			onExhausted: "refuse"},
		{name: "a set replaces the ceiling with the same scope and context in place and keeps the others",
			steps: []setStep{
				{req: SetRequest{Amount: usd(10_000_000), Per1k: per1k}},
				{req: SetRequest{Amount: usd(3_000_000), Context: "a"}},
				{req: SetRequest{Amount: usd(500_000), ScopeTask: true}},
				{req: SetRequest{Amount: usd(4_000_000), Context: "a"}},
				{req: SetRequest{Amount: usd(9_000_000)}}},
			ceilings: []protocol.Ceiling{day(9_000_000), ctx("a", 4_000_000), task(500_000)}, per1k: 1500, onExhausted: "refuse"},
		{name: "different contexts are different ceilings",
			steps: []setStep{
				{req: SetRequest{Amount: usd(1_000_000), Per1k: per1k, Context: "a"}},
				{req: SetRequest{Amount: usd(2_000_000), Context: "b"}}},
			ceilings: []protocol.Ceiling{ctx("a", 1_000_000), ctx("b", 2_000_000)}, per1k: 1500, onExhausted: "refuse"},
		{name: "zero pins a ceiling shut",
			steps:    []setStep{{req: SetRequest{Amount: usd(0), Per1k: usdp(0)}}},
			ceilings: []protocol.Ceiling{day(0)}, per1k: 0, onExhausted: "refuse"},
		{name: "on-exhausted ask-owner is kept when a later set omits it",
			steps: []setStep{
				{req: SetRequest{Amount: usd(10_000_000), Per1k: per1k, OnExhausted: "ask-owner"}},
				{req: SetRequest{Amount: usd(5_000_000)}}},
			ceilings: []protocol.Ceiling{day(5_000_000)}, per1k: 1500, onExhausted: "ask_owner"},
		{name: "on-exhausted is changed back when given",
			steps: []setStep{
				{req: SetRequest{Amount: usd(10_000_000), Per1k: per1k, OnExhausted: "ask_owner"}},
				{req: SetRequest{Amount: usd(5_000_000), OnExhausted: "refuse"}}},
			ceilings: []protocol.Ceiling{day(5_000_000)}, per1k: 1500, onExhausted: "refuse"},
		{name: "an unknown on-exhausted is refused",
			steps: []setStep{{req: SetRequest{Amount: usd(1), Per1k: per1k, OnExhausted: "maybe"}, err: "use refuse or ask-owner"}}},
		{name: "amount and per-1k must share a currency",
			steps: []setStep{{req: SetRequest{Amount: eur(1_000_000), Per1k: per1k}, errIs: ErrCurrency}}},
		{name: "a stored document keeps its currency",
			steps: []setStep{
				{req: SetRequest{Amount: usd(10_000_000), Per1k: per1k}},
				{req: SetRequest{Amount: eur(5_000_000)}, errIs: ErrCurrency, err: "allowance clear"},
				{req: SetRequest{Amount: eur(5_000_000), Per1k: eurp(900)}, errIs: ErrCurrency}},
			ceilings: []protocol.Ceiling{day(10_000_000)}, per1k: 1500, onExhausted: "refuse"},
		{name: "a failed set leaves the stored document as it was",
			steps: []setStep{
				{req: SetRequest{Amount: usd(10_000_000), Per1k: per1k, OnExhausted: "ask-owner"}},
				{req: SetRequest{Amount: usd(1), OnExhausted: "sometimes"}, err: "on-exhausted"}},
			ceilings: []protocol.Ceiling{day(10_000_000)}, per1k: 1500, onExhausted: "ask_owner"},
		{name: "negative amounts built in Go are refused",
			steps: []setStep{{req: SetRequest{Amount: usd(-1), Per1k: per1k}, err: "outside 0.."}}},
		{name: "amounts beyond 2^53-1 are refused",
			steps: []setStep{{req: SetRequest{Amount: usd(protocol.MaxSafeInteger + 1), Per1k: per1k}, err: "outside 0.."}}},
		{name: "a currency that is not ISO 4217 shaped is refused",
			steps: []setStep{{req: SetRequest{Amount: protocol.Money{AmountMicro: 1, Currency: "usd"}, Per1k: per1k}, err: "ISO 4217"}}},
		{name: "a context id with surrounding spaces is refused",
			steps: []setStep{{req: SetRequest{Amount: usd(1), Per1k: per1k, Context: " a"}, err: "context id"}}},
		{name: "a context id that is not UTF-8 is refused",
			steps: []setStep{{req: SetRequest{Amount: usd(1), Per1k: per1k, Context: "a\xff"}, err: "context id"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newStore(t)
			for i, st := range c.steps {
				before, _ := os.ReadFile(s.policyPath())
				_, err := s.Set(st.req, now)
				if st.err == "" && st.errIs == nil {
					if err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					continue
				}
				if err == nil {
					t.Fatalf("step %d accepted; want an error", i)
				}
				if st.errIs != nil && !errors.Is(err, st.errIs) {
					t.Fatalf("step %d: error %v is not %v", i, err, st.errIs)
				}
				if !strings.Contains(err.Error(), st.err) {
					t.Fatalf("step %d: error %q does not contain %q", i, err, st.err)
				}
				if after, _ := os.ReadFile(s.policyPath()); !bytes.Equal(before, after) {
					t.Fatalf("step %d failed but changed %s", i, PolicyFile)
				}
			}
			p, present := s.Policy()
			if c.ceilings == nil {
				if present {
					t.Fatal("a document was written")
				}
				return
			}
			doc := requireEnforced(t, s, p, present)
			if canon(t, doc.Ceilings) != canon(t, c.ceilings) {
				t.Errorf("ceilings %s, want %s", canon(t, doc.Ceilings), canon(t, c.ceilings))
			}
			if doc.CostModel.Per1kTokensMicro != c.per1k || doc.OnExhausted != c.onExhausted {
				t.Errorf("cost model %+v on_exhausted %s, want per-1k %d and %s", doc.CostModel, doc.OnExhausted, c.per1k, c.onExhausted)
			}
			if doc.UpdatedAt != "2026-07-28T15:00:00.123Z" {
				t.Errorf("updated_at %s: want now in UTC with milliseconds", doc.UpdatedAt)
			}
		})
	}
}

// requireEnforced checks that the stored file is a document the owner
// signed for this agent, verified by protocol.LoadPolicy alone, and
// returns it.
func requireEnforced(t *testing.T, s *Store, p *protocol.Policy, present bool) protocol.Allowance {
	t.Helper()
	if !present || p.Err() != nil {
		t.Fatalf("stored allowance is not enforced: present=%v err=%v", present, p.Err())
	}
	raw, err := os.ReadFile(s.policyPath())
	if err != nil {
		t.Fatal(err)
	}
	fresh := protocol.LoadPolicy(raw).For(fixtureAgent(t), fixtureOwner(t).Public())
	if fresh.Err() != nil {
		t.Fatalf("LoadPolicy refuses the stored file: %v", fresh.Err())
	}
	doc, _ := fresh.Document()
	return doc
}

// setsFor turns a fixture document into the `allowance set` commands that
// build it, one per ceiling in document order, or false when the document
// has a ceiling the command line cannot express (a task_id narrowing).
func setsFor(t *testing.T, signed map[string]any) ([]SetRequest, bool) {
	cm := obj(signed["cost_model"])
	cur := str(cm["currency"])
	per1k := protocol.Money{AmountMicro: num(cm["per_1k_tokens_micro"]), Currency: cur}
	var reqs []SetRequest
	for _, cv := range arr(signed["ceilings"]) {
		c := obj(cv)
		if str(c["task_id"]) != "" {
			return nil, false
		}
		req := SetRequest{
			Amount:    protocol.Money{AmountMicro: num(c["amount_micro"]), Currency: cur},
			Context:   str(c["context_id"]),
			ScopeTask: str(c["scope"]) == protocol.ScopeTask,
		}
		if str(c["scope"]) == protocol.ScopeContext && req.Context == "" {
			return nil, false
		}
		if len(reqs) == 0 {
			req.Per1k, req.OnExhausted = &per1k, str(signed["on_exhausted"])
		}
		reqs = append(reqs, req)
	}
	return reqs, true
}

// The command line, driven through Set with the fixture's owner seed and
// clock, reproduces the fixture's signed documents byte for byte: same
// canonical bytes, same signature as the TypeScript SDK's.
func TestSetReproducesFixtureDocuments(t *testing.T) {
	for _, v := range arr(path(fixture(t, "allowance.json"), "document", "valid")) {
		m := obj(v)
		t.Run(str(m["case"]), func(t *testing.T) {
			signed := obj(m["signed"])
			reqs, ok := setsFor(t, signed)
			if !ok {
				t.Skip("a task_id narrowing is not expressible with `allowance set`")
			}
			s := newStore(t)
			now := at(str(signed["updated_at"]))
			for _, r := range reqs {
				mustSet(t, s, r, now)
			}
			raw, err := os.ReadFile(s.policyPath())
			if err != nil {
				t.Fatal(err)
			}
			a, err := protocol.ParseAllowance(raw)
			if err != nil {
				t.Fatal(err)
			}
			unsigned, _ := a.CanonicalUnsigned()
			if string(unsigned) != str(m["canonical"]) {
				t.Fatalf("canonical\n got  %s\n want %s", unsigned, m["canonical"])
			}
			if a.Sig != str(signed["sig"]) {
				t.Fatalf("sig %s, want the fixture's %s", a.Sig, signed["sig"])
			}
		})
	}
}

// The stored file is the canonical signed document plus a newline:
// byte-stable (the same sets at the same instant write the same bytes) and
// pinned by a golden file.
func TestAllowanceFileGolden(t *testing.T) {
	signed := obj(obj(arr(path(fixture(t, "allowance.json"), "document", "valid"))[0])["signed"])
	reqs, _ := setsFor(t, signed)
	now := at(str(signed["updated_at"]))
	var files [][]byte
	for range 2 {
		s := newStore(t)
		for _, r := range reqs {
			mustSet(t, s, r, now)
		}
		b, err := os.ReadFile(s.policyPath())
		if err != nil {
			t.Fatal(err)
		}
		if p := protocol.LoadPolicy(b); p.Err() != nil {
			t.Fatalf("LoadPolicy: %v", p.Err())
		}
		files = append(files, b)
	}
	if !bytes.Equal(files[0], files[1]) {
		t.Fatalf("two identical runs wrote different bytes:\n%s\n%s", files[0], files[1])
	}
	golden(t, "allowance.golden.json", files[0])
}

func TestNoAllowanceAdmitsEverything(t *testing.T) {
	s := newStore(t)
	now := at("2026-07-28T15:00:00Z")
	if p, present := s.Policy(); present || p != nil {
		t.Fatalf("Policy() = %v, %v; want nil, false with no file", p, present)
	}
	d := s.Admit("task-1", "ctx", math.MaxInt32, now)
	if !d.Admit || d.Refusal != nil || d.Hold || d.Remaining != math.MaxInt64 {
		t.Fatalf("no allowance decided %+v; want admit", d)
	}
	cost, err := s.Meter("task-1", "ctx", 4000, 4000, now)
	if err != nil || cost != (protocol.Money{}) {
		t.Fatalf("Meter with no allowance = %v, %v; want nothing metered", cost, err)
	}
	if _, err := os.Stat(s.ledgerPath()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a ledger was written with no allowance to meter against: %v", err)
	}
	r := s.Show(now)
	if r.Present {
		t.Fatalf("Show reports a document: %+v", r)
	}
	golden(t, "receipt-none.golden.txt", []byte(r.Text()))
}

// tamperings each break a stored document in one way.
var tamperings = []struct {
	name   string
	mutate func([]byte) []byte
	reason string // substring of the fail-closed reason
}{
	{"raised day ceiling", func(b []byte) []byte {
		return bytes.Replace(b, []byte(`"amount_micro":2000000`), []byte(`"amount_micro":9000000`), 1)
	}, "signature does not verify"},
	{"cheaper rate", func(b []byte) []byte {
		return bytes.Replace(b, []byte(`"per_1k_tokens_micro":900`), []byte(`"per_1k_tokens_micro":1`), 1)
	}, "signature does not verify"},
	{"sig flipped", func(b []byte) []byte {
		i := bytes.Index(b, []byte(`"sig":"`)) + len(`"sig":"`)
		b = bytes.Clone(b)
		b[i] ^= 'A' ^ 'B'
		if b[i] == '"' {
			b[i] = 'C'
		}
		return b
	}, "signature does not verify"},
	{"sig removed", func(b []byte) []byte {
		a, _ := protocol.ParseAllowance(b)
		a.Sig = ""
		out, _ := a.MarshalJSON()
		return out
	}, "not signed"},
	{"truncated", func(b []byte) []byte { return b[:len(b)/2] }, "not valid JSON"},
	{"emptied", func([]byte) []byte { return nil }, "not valid JSON"},
	{"unknown member", func(b []byte) []byte {
		return bytes.Replace(b, []byte(`{"agent"`), []byte(`{"allow_all":true,"agent"`), 1)
	}, "unknown member"},
}

// A stored document that fails verification fails closed: every admission
// is refused (never held, even when the document says ask_owner), nothing
// is metered against its untrusted rate, and Show says why.
func TestTamperedAllowanceFailsClosed(t *testing.T) {
	now := at("2026-07-28T15:00:00Z")
	for _, tc := range tamperings {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			mustSet(t, s, SetRequest{Amount: protocol.Money{AmountMicro: 2_000_000, Currency: "EUR"},
				Per1k: &protocol.Money{AmountMicro: 900, Currency: "EUR"}, OnExhausted: "ask-owner"}, now)
			mustMeter(t, s, "task-0", "ctx", 4000, 0, now)
			ledgerBefore, _ := os.ReadFile(s.ledgerPath())
			raw, _ := os.ReadFile(s.policyPath())
			if err := os.WriteFile(s.policyPath(), tc.mutate(raw), 0o600); err != nil {
				t.Fatal(err)
			}
			requireFailsClosed(t, s, now, tc.reason)
			if _, err := s.Meter("task-1", "ctx", 4000, 4000, now); !errors.Is(err, ErrFailsClosed) {
				t.Fatalf("Meter under a failed policy: %v, want ErrFailsClosed", err)
			}
			if after, _ := os.ReadFile(s.ledgerPath()); !bytes.Equal(ledgerBefore, after) {
				t.Fatal("Meter under a failed policy changed the ledger")
			}
		})
	}
}

// requireFailsClosed checks the three views of a failed policy: Policy,
// Admit (even of zero-cost work) and Show.
func requireFailsClosed(t *testing.T, s *Store, when time.Time, reason string) {
	t.Helper()
	p, present := s.Policy()
	if !present || p.Err() == nil {
		t.Fatalf("Policy() present=%v err=%v; want a present policy that fails closed", present, p.Err())
	}
	if !strings.Contains(p.Err().Error(), reason) {
		t.Fatalf("fail-closed reason %q does not contain %q", p.Err(), reason)
	}
	for _, chars := range []int{0, 4000} {
		d := s.Admit("task-1", "ctx", chars, when)
		if d.Admit || d.Hold || d.Refusal == nil || d.Refusal.Code != errs.BudgetInsufficient {
			t.Fatalf("Admit(%d chars) under a failed policy decided %+v; want a refusal, not a hold", chars, d)
		}
	}
	r := s.Show(when)
	if !r.Present || r.Verified || !strings.Contains(r.Reason, reason) {
		t.Fatalf("Show: present=%v verified=%v reason=%q; want failing closed because %q", r.Present, r.Verified, r.Reason, reason)
	}
	for _, c := range r.Ceilings {
		if c.RemainingMicro != 0 {
			t.Fatalf("Show reports %d remaining on %+v under a failed policy", c.RemainingMicro, c.Ceiling)
		}
	}
	if !strings.Contains(r.Text(), "FAILS CLOSED") {
		t.Fatalf("receipt text does not say it fails closed:\n%s", r.Text())
	}
}

// A document that verifies, but was signed by someone other than the
// agent's owner or governs another agent, is no more enforceable than a
// tampered one.
func TestForeignAllowanceFailsClosed(t *testing.T) {
	now := at("2026-07-28T15:00:00Z")
	stranger := freshKey(t)
	for _, c := range []struct {
		name   string
		agent  string
		key    keys.Signer
		reason string
	}{
		{name: "signed by a stranger", agent: fixtureAgent(t), key: stranger, reason: "not by the agent's owner"},
		{name: "governs another agent", agent: freshKey(t).Public(), key: fixtureOwner(t), reason: "governs agent"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newStore(t)
			a := protocol.Allowance{
				V: 1, Agent: c.agent,
				CostModel:   protocol.CostModel{Per1kTokensMicro: 1, Currency: "USD"},
				Ceilings:    []protocol.Ceiling{{Scope: protocol.ScopeDay, AmountMicro: protocol.MaxSafeInteger}},
				OnExhausted: protocol.OnExhaustedRefuse, UpdatedAt: protocol.FormatTime(now),
			}
			if err := protocol.SignAllowance(&a, c.key); err != nil {
				t.Fatal(err)
			}
			raw, _ := a.MarshalJSON()
			if p := protocol.LoadPolicy(raw); p.Err() != nil {
				t.Fatalf("the foreign document should verify on its own: %v", p.Err())
			}
			if err := os.WriteFile(s.policyPath(), raw, 0o600); err != nil {
				t.Fatal(err)
			}
			requireFailsClosed(t, s, now, c.reason)
		})
	}
}

// The owner's store, opened by someone holding another key, sees the
// owner's document as foreign.
func TestStoreOfAnotherOwnerFailsClosed(t *testing.T) {
	now := at("2026-07-28T15:00:00Z")
	s := newStore(t)
	mustSet(t, s, SetRequest{Amount: usd(1_000_000), Per1k: usdp(1500)}, now)
	other, err := Open(s.dir, fixtureAgent(t), freshKey(t))
	if err != nil {
		t.Fatal(err)
	}
	requireFailsClosed(t, other, now, "not by the agent's owner")
}

// A Set after tampering starts a new document: the tampered ceilings are
// not re-signed, so the first such set needs --per-1k-tokens again.
func TestSetAfterTamperingStartsOver(t *testing.T) {
	now := at("2026-07-28T15:00:00Z")
	s := newStore(t)
	mustSet(t, s, SetRequest{Amount: usd(10_000_000), Per1k: usdp(1500)}, now)
	mustSet(t, s, SetRequest{Amount: usd(3_000_000), Context: "a"}, now)
	raw, _ := os.ReadFile(s.policyPath())
	tampered := bytes.Replace(raw, []byte(`"amount_micro":10000000`), []byte(`"amount_micro":99000000`), 1)
	if err := os.WriteFile(s.policyPath(), tampered, 0o600); err != nil {
		t.Fatal(err)
	}

	_, err := s.Set(SetRequest{Amount: usd(500_000), ScopeTask: true}, now)
	if !errors.Is(err, ErrPer1kRequired) || !strings.Contains(err.Error(), "fails verification") {
		t.Fatalf("Set over a tampered file without per-1k: %v; want ErrPer1kRequired explaining why", err)
	}
	doc := mustSet(t, s, SetRequest{Amount: usd(500_000), Per1k: usdp(2000), ScopeTask: true}, now)
	want := []protocol.Ceiling{{Scope: protocol.ScopeTask, AmountMicro: 500_000}}
	if canon(t, doc.Ceilings) != canon(t, want) {
		t.Fatalf("ceilings %s carried over from the tampered file; want only %s", canon(t, doc.Ceilings), canon(t, want))
	}
	p, present := s.Policy()
	requireEnforced(t, s, p, present)
	if d := s.Admit("task-1", "", 4000, now); !d.Admit {
		t.Fatalf("after re-signing, Admit decided %+v", d)
	}
}

func TestClearRemovesPolicyKeepsLedger(t *testing.T) {
	now := at("2026-07-28T15:00:00Z")
	s := newStore(t)
	if err := s.Clear(); err != nil {
		t.Fatalf("Clear with nothing stored: %v", err)
	}
	mustSet(t, s, SetRequest{Amount: usd(1_000_000), Per1k: usdp(1_000)}, now)
	mustMeter(t, s, "task-1", "", 4*600_000, 0, now) // 600000 micro
	if err := s.Clear(); err != nil {
		t.Fatal(err)
	}
	if _, present := s.Policy(); present {
		t.Fatal("policy still present after Clear")
	}
	if d := s.Admit("task-2", "", 4*900_000, now); !d.Admit {
		t.Fatalf("no allowance, yet Admit decided %+v", d)
	}
	if _, err := os.Stat(s.ledgerPath()); err != nil {
		t.Fatalf("Clear removed the ledger: %v", err)
	}
	// Set again the same day: the spend before the clear still counts.
	mustSet(t, s, SetRequest{Amount: usd(1_000_000), Per1k: usdp(1_000)}, now)
	d := s.Admit("task-2", "", 4*500_000, now)
	if d.Admit || d.Remaining != 400_000 {
		t.Fatalf("after re-set, decided %+v; want refusal with 400000 remaining", d)
	}
}

func TestFileModes(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("no POSIX modes")
	}
	now := at("2026-07-28T15:00:00Z")
	dir := filepath.Join(t.TempDir(), "state")
	s, err := Open(dir, fixtureAgent(t), fixtureOwner(t))
	if err != nil {
		t.Fatal(err)
	}
	mustSet(t, s, SetRequest{Amount: usd(1_000_000), Per1k: usdp(1_000)}, now)
	mustMeter(t, s, "task-1", "ctx", 4000, 0, now)
	mustSet(t, s, SetRequest{Amount: usd(2_000_000)}, now) // a rewrite keeps the mode
	for name, want := range map[string]os.FileMode{"": 0o700, PolicyFile: 0o600, LedgerFile: 0o600} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != want {
			t.Errorf("%s has mode %04o, want %04o", filepath.Join(dir, name), got, want)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("state dir holds %d entries, want the two files (no temporary leftovers): %v", len(entries), entries)
	}
}

func TestReceiptGolden(t *testing.T) {
	now := at("2026-07-28T15:00:00Z")
	signed := obj(obj(arr(path(fixture(t, "allowance.json"), "document", "valid"))[0])["signed"])
	reqs, _ := setsFor(t, signed)
	s := newStore(t)
	for _, r := range reqs {
		mustSet(t, s, r, now)
	}
	mustMeter(t, s, "task-1", "meetup-s1-e4", 40_000, 20_000, now) // 15000 tokens: 22500 micro
	mustMeter(t, s, "task-2", "", 4_000, 0, now)                   // 1000 tokens: 1500 micro
	r := s.Show(now)
	if !r.Verified || r.Reason != "" {
		t.Fatalf("receipt %+v; want verified", r)
	}
	want := []struct {
		key              string
		spent, remaining int64
	}{
		{"", 0, 500_000},
		{"meetup-s1-e4", 22_500, 2_977_500},
		{"2026-07-28", 24_000, 9_976_000},
	}
	for i, w := range want {
		c := r.Ceilings[i]
		if c.Key != w.key || c.SpentMicro != w.spent || c.RemainingMicro != w.remaining {
			t.Errorf("ceiling %d: key %q spent %d remaining %d; want %+v", i, c.Key, c.SpentMicro, c.RemainingMicro, w)
		}
	}
	golden(t, "receipt-verified.golden.txt", []byte(r.Text()))

	raw, _ := os.ReadFile(s.policyPath())
	if err := os.WriteFile(s.policyPath(), bytes.Replace(raw, []byte("500000"), []byte("900000"), 1), 0o600); err != nil {
		t.Fatal(err)
	}
	golden(t, "receipt-failed.golden.txt", []byte(s.Show(now).Text()))
}
