package protocol

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
)

// The upstream fixtures' published test identities (not real keys): the
// seed signs, the seedless key plays the governed agent.
const (
	vectorSeed  = "SUAEGDPNTWXACIF45CA23BUY36RIMWZXW5LEHSEOK2ONS5JWJ7PBC2EWBA"
	vectorOwner = "UBMBH4BK6EIHQFVMHLSABFSQXB3JXUFZOXVZQTIERO33AD4HHAI3D7QP"
	vectorAgent = "UAKQRYZBYFOC65OQZVJ3QPCIERDTRNNZPMOJUYXC3DGPRCDWSKD4HV5A"
)

func vectorKey(t testing.TB) *keys.Agent {
	t.Helper()
	k, err := keys.FromSeed[keys.AgentRole]([]byte(vectorSeed))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func newTestKey(t testing.TB) *keys.Agent {
	t.Helper()
	k, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// requireCode fails unless err is a *errs.Error with code (and, when
// contains is non-empty, a message containing it).
func requireCode(t *testing.T, err error, code errs.Code, contains string) {
	t.Helper()
	var e *errs.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not a *errs.Error", err, err)
	}
	if e.Code != code {
		t.Fatalf("code %s, want %s (%v)", e.Code, code, err)
	}
	if contains != "" && !strings.Contains(e.Message, contains) {
		t.Fatalf("message %q does not contain %q", e.Message, contains)
	}
}

// The allowance fixture's reference document (case three_scopes), copied
// here so this test stands alone: its canonical bytes and signature are
// the upstream TypeScript SDK's.
const (
	threeScopesSigned = `{
	  "v": 1,
	  "agent": "UAKQRYZBYFOC65OQZVJ3QPCIERDTRNNZPMOJUYXC3DGPRCDWSKD4HV5A",
	  "owner_key": "UBMBH4BK6EIHQFVMHLSABFSQXB3JXUFZOXVZQTIERO33AD4HHAI3D7QP",
	  "cost_model": {"per_1k_tokens_micro": 1500, "currency": "USD"},
	  "ceilings": [
	    {"scope": "task", "amount_micro": 500000},
	    {"scope": "context", "context_id": "meetup-s1-e4", "amount_micro": 3000000},
	    {"scope": "day", "amount_micro": 10000000}
	  ],
	  "on_exhausted": "refuse",
	  "updated_at": "2026-07-28T15:00:00.000Z",
	  "sig": "0p8glje-SWVqM-Xh_xnltJukVBcsP1rM_awIKN2KgaL2k1-XafggdWobrmqTswVMddhpoCmQm_4RnDOFHLCLBw"
	}`
	threeScopesCanonical = `{"agent":"UAKQRYZBYFOC65OQZVJ3QPCIERDTRNNZPMOJUYXC3DGPRCDWSKD4HV5A","ceilings":[{"amount_micro":500000,"scope":"task"},{"amount_micro":3000000,"context_id":"meetup-s1-e4","scope":"context"},{"amount_micro":10000000,"scope":"day"}],"cost_model":{"currency":"USD","per_1k_tokens_micro":1500},"on_exhausted":"refuse","owner_key":"UBMBH4BK6EIHQFVMHLSABFSQXB3JXUFZOXVZQTIERO33AD4HHAI3D7QP","updated_at":"2026-07-28T15:00:00.000Z","v":1}`
)

func TestAllowanceReferenceVector(t *testing.T) {
	a, err := ParseAllowance([]byte(threeScopesSigned))
	if err != nil {
		t.Fatal(err)
	}
	c, err := a.CanonicalUnsigned()
	if err != nil {
		t.Fatal(err)
	}
	if string(c) != threeScopesCanonical {
		t.Fatalf("canonical differs:\n got  %s\n want %s", c, threeScopesCanonical)
	}
	sb, _ := a.SignedBytes()
	if want := "agentmesh-allowance-v1\n" + threeScopesCanonical; string(sb) != want {
		t.Fatalf("signed bytes differ: %q", sb)
	}
	if err := a.Verify(); err != nil {
		t.Fatalf("reference signature: %v", err)
	}
	// Ed25519 is deterministic: re-signing with the published seed must
	// reproduce the upstream signature byte for byte.
	re := a
	re.Sig = ""
	if err := SignAllowance(&re, vectorKey(t)); err != nil {
		t.Fatal(err)
	}
	if re.Sig != a.Sig {
		t.Fatalf("re-signed %s, want %s", re.Sig, a.Sig)
	}
	// One micro-unit changes the bytes and breaks the signature.
	a.Ceilings[0].AmountMicro++
	requireCode(t, a.Verify(), errs.IdentityMismatch, "does not verify")
}

// baseAllowance is a valid document in the generic value model, for
// mutation in the refusal table.
func baseAllowance() map[string]any {
	return map[string]any{
		"v":          1.0,
		"agent":      vectorAgent,
		"owner_key":  vectorOwner,
		"cost_model": map[string]any{"per_1k_tokens_micro": 1500.0, "currency": "USD"},
		"ceilings": []any{
			map[string]any{"scope": "task", "amount_micro": 500000.0, "task_id": "t-1"},
			map[string]any{"scope": "day", "amount_micro": 0.0},
		},
		"on_exhausted": "ask_owner",
		"updated_at":   "2026-07-28T15:00:00+02:00",
		"sig":          "c2ln",
	}
}

func TestParseAllowanceShape(t *testing.T) {
	ceiling := func(m map[string]any) map[string]any { return m["ceilings"].([]any)[0].(map[string]any) }
	cases := []struct {
		name   string
		mutate func(m map[string]any)
		want   string // "" = valid
	}{
		{"valid", func(map[string]any) {}, ""},
		{"v as 1.0 is the integer 1", func(m map[string]any) { m["v"] = 1.0 }, ""},
		{"no sig parses (Verify refuses it)", func(m map[string]any) { delete(m, "sig") }, ""},
		{"empty ceilings", func(m map[string]any) { m["ceilings"] = []any{} }, ""},
		{"zero rate", func(m map[string]any) { m["cost_model"].(map[string]any)["per_1k_tokens_micro"] = 0.0 }, ""},
		{"private-use currency", func(m map[string]any) { m["cost_model"].(map[string]any)["currency"] = "XCR" }, ""},
		{"max safe amount", func(m map[string]any) { ceiling(m)["amount_micro"] = float64(MaxSafeInteger) }, ""},

		{"float money", func(m map[string]any) { ceiling(m)["amount_micro"] = 2000000.5 }, "amount_micro must be a non-negative integer"},
		{"negative amount", func(m map[string]any) { ceiling(m)["amount_micro"] = -1.0 }, "amount_micro must be a non-negative integer"},
		{"amount beyond 2^53", func(m map[string]any) { ceiling(m)["amount_micro"] = 1e16 }, "amount_micro must be a non-negative integer"},
		{"amount as string", func(m map[string]any) { ceiling(m)["amount_micro"] = "5" }, "amount_micro must be a non-negative integer"},
		{"missing amount", func(m map[string]any) { delete(ceiling(m), "amount_micro") }, "amount_micro is required"},
		{"unknown scope", func(m map[string]any) { ceiling(m)["scope"] = "week" }, `scope must be one of task, context, day (got "week")`},
		{"wrong-case scope", func(m map[string]any) { ceiling(m)["scope"] = "Task" }, "scope must be one of"},
		{"missing scope", func(m map[string]any) { delete(ceiling(m), "scope") }, "scope must be one of"},
		{"null task_id", func(m map[string]any) { ceiling(m)["task_id"] = nil }, "task_id must be a non-empty string"},
		{"empty task_id", func(m map[string]any) { ceiling(m)["task_id"] = "" }, "task_id must be a non-empty string"},
		{"numeric context_id", func(m map[string]any) { ceiling(m)["context_id"] = 7.0 }, "context_id must be a non-empty string"},
		{"unknown ceiling member", func(m map[string]any) { ceiling(m)["agent_id"] = "x" }, `ceilings[0]: unknown member "agent_id"`},
		{"ceiling not an object", func(m map[string]any) { m["ceilings"] = []any{"task"} }, "ceilings[0]: must be an object"},
		{"missing ceilings", func(m map[string]any) { delete(m, "ceilings") }, "ceilings is required"},
		{"ceilings not an array", func(m map[string]any) { m["ceilings"] = map[string]any{} }, "ceilings must be an array"},
		{"missing cost_model", func(m map[string]any) { delete(m, "cost_model") }, "cost_model is required"},
		{"null cost_model", func(m map[string]any) { m["cost_model"] = nil }, "cost_model must be an object"},
		{"float rate", func(m map[string]any) { m["cost_model"].(map[string]any)["per_1k_tokens_micro"] = 1.5 }, "per_1k_tokens_micro must be a non-negative integer"},
		{"missing currency", func(m map[string]any) { delete(m["cost_model"].(map[string]any), "currency") }, "currency must be an ISO 4217 code"},
		{"lowercase currency", func(m map[string]any) { m["cost_model"].(map[string]any)["currency"] = "usd" }, "currency must be an ISO 4217 code"},
		{"unknown cost_model member", func(m map[string]any) { m["cost_model"].(map[string]any)["per_token"] = 1.0 }, `cost_model has unknown member "per_token"`},
		{"v 2", func(m map[string]any) { m["v"] = 2.0 }, "v must be the integer 1"},
		{"v as string", func(m map[string]any) { m["v"] = "1" }, "v must be the integer 1"},
		{"missing v", func(m map[string]any) { delete(m, "v") }, "v is required"},
		{"agent not a key", func(m map[string]any) { m["agent"] = "agent-7" }, "agent must be a user public key"},
		{"owner_key is a seed", func(m map[string]any) { m["owner_key"] = vectorSeed }, "owner_key must be a user public key"},
		{"on_exhausted unknown", func(m map[string]any) { m["on_exhausted"] = "warn" }, "on_exhausted must be"},
		{"on_exhausted missing", func(m map[string]any) { delete(m, "on_exhausted") }, "on_exhausted must be"},
		{"updated_at date only", func(m map[string]any) { m["updated_at"] = "2026-07-28" }, "updated_at \"2026-07-28\" is not an RFC 3339 instant"},
		{"updated_at missing", func(m map[string]any) { delete(m, "updated_at") }, "updated_at must be an RFC 3339 instant string"},
		{"sig not a string", func(m map[string]any) { m["sig"] = 1.0 }, "sig must be a non-empty string"},
		{"sig empty", func(m map[string]any) { m["sig"] = "" }, "sig must be a non-empty string"},
		{"unknown member", func(m map[string]any) { m["note"] = "hi" }, `unknown member "note"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := baseAllowance()
			tc.mutate(m)
			data, err := Canonical(m)
			if err != nil {
				t.Fatal(err)
			}
			a, err := ParseAllowance(data)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if a.Ceilings == nil {
					t.Fatal("ceilings decoded as nil")
				}
				return
			}
			requireCode(t, err, errs.InvalidEnvelope, tc.want)
		})
	}
	for _, raw := range []string{`[]`, `"x"`, `{`, `{"v":1,"v":1}`, ``} {
		_, err := ParseAllowance([]byte(raw))
		requireCode(t, err, errs.InvalidEnvelope, "")
	}
}

func testAllowance(owner keys.Signer, onExhausted string, ceilings ...Ceiling) Allowance {
	return Allowance{
		V: AllowanceVersion, Agent: vectorAgent, OwnerKey: owner.Public(),
		CostModel:   CostModel{Per1kTokensMicro: 1500, Currency: "USD"},
		Ceilings:    ceilings,
		OnExhausted: onExhausted,
		UpdatedAt:   "2026-07-28T15:00:00.000Z",
	}
}

func TestSignAllowance(t *testing.T) {
	owner := newTestKey(t)
	other := newTestKey(t)

	t.Run("sets owner and verifies", func(t *testing.T) {
		a := testAllowance(owner, OnExhaustedRefuse, Ceiling{Scope: ScopeDay, AmountMicro: 1})
		a.OwnerKey = ""
		if err := SignAllowance(&a, owner); err != nil {
			t.Fatal(err)
		}
		if a.OwnerKey != owner.Public() || len(a.Sig) != 86 {
			t.Fatalf("owner %s sig %q", a.OwnerKey, a.Sig)
		}
		if err := a.Verify(); err != nil {
			t.Fatal(err)
		}
		// The wire form parses back to the same document and still verifies.
		wire, err := Canonical(a)
		if err != nil {
			t.Fatal(err)
		}
		back, err := ParseAllowance(wire)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(back, a) {
			t.Fatalf("round trip:\n%+v\n%+v", back, a)
		}
		if err := back.Verify(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("nil ceilings are written as []", func(t *testing.T) {
		a := testAllowance(owner, OnExhaustedRefuse)
		if err := SignAllowance(&a, owner); err != nil {
			t.Fatal(err)
		}
		c, _ := a.CanonicalUnsigned()
		if !strings.Contains(string(c), `"ceilings":[]`) {
			t.Fatalf("canonical %s", c)
		}
		back, err := ParseAllowance(mustCanonical(a))
		if err != nil {
			t.Fatal(err)
		}
		if err := back.Verify(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("refuses a mismatched owner", func(t *testing.T) {
		a := testAllowance(owner, OnExhaustedRefuse)
		requireCode(t, SignAllowance(&a, other), errs.IdentityMismatch, "cannot be signed by")
		if a.Sig != "" {
			t.Fatal("signed anyway")
		}
	})
	t.Run("refuses an invalid document", func(t *testing.T) {
		a := testAllowance(owner, "sometimes")
		requireCode(t, SignAllowance(&a, owner), errs.InvalidEnvelope, "on_exhausted")
	})
	t.Run("verify refusals", func(t *testing.T) {
		a := testAllowance(owner, OnExhaustedRefuse, Ceiling{Scope: ScopeTask, AmountMicro: 5})
		requireCode(t, a.Verify(), errs.IdentityMismatch, "not signed")
		if err := SignAllowance(&a, owner); err != nil {
			t.Fatal(err)
		}
		for name, mutate := range map[string]func(*Allowance){
			"other owner":     func(a *Allowance) { a.OwnerKey = other.Public() },
			"changed ceiling": func(a *Allowance) { a.Ceilings[0].Scope = ScopeDay },
			"narrowed":        func(a *Allowance) { a.Ceilings[0].TaskID = "t" },
			"garbage sig":     func(a *Allowance) { a.Sig = "!!" },
			"std encoding":    func(a *Allowance) { a.Sig = Base64Std.Encode(make([]byte, 64)) },
		} {
			b := a
			b.Ceilings = append([]Ceiling(nil), a.Ceilings...)
			mutate(&b)
			err := b.Verify()
			requireCode(t, err, errs.IdentityMismatch, "")
			if !errors.Is(err, ErrBadSignature) {
				t.Errorf("%s: %v does not wrap ErrBadSignature", name, err)
			}
		}
	})
}

func TestAllowanceJSONMethods(t *testing.T) {
	var a Allowance
	if err := a.UnmarshalJSON([]byte(threeScopesSigned)); err != nil {
		t.Fatal(err)
	}
	if err := a.Verify(); err != nil {
		t.Fatal(err)
	}
	requireCode(t, a.UnmarshalJSON([]byte(`{"v":2}`)), errs.InvalidEnvelope, "v must be")
	if err := a.UnmarshalJSON([]byte(`null`)); err != nil || a.Sig == "" {
		t.Fatalf("null must leave the value alone: %v", err)
	}
	b, err := Allowance{V: 1}.MarshalJSON()
	if err != nil || !strings.Contains(string(b), `"ceilings":[]`) || strings.Contains(string(b), `"sig"`) {
		t.Fatalf("%s %v", b, err)
	}
}

func TestMeterCostAndEstimate(t *testing.T) {
	for _, tc := range []struct{ tokens, rate, want int64 }{
		{1000, 1500, 1500},
		{333, 100, 33},
		{1, 999, 0},
		{123457, 1500, 185185},
		{2048, 1500, 3072},
		{0, 1500, 0},
		{1000, 0, 0},
		{-5, 1500, 0},
		{5, -1500, 0},
		{math.MaxInt64, 1000, math.MaxInt64}, // exact, no overflow in the product
		{math.MaxInt64, 1, math.MaxInt64 / 1000},
		{math.MaxInt64, math.MaxInt64, math.MaxInt64}, // saturates
		{1 << 40, 1 << 30, 1180591620717411303},       // 2^70 needs 128 bits; the quotient fits
	} {
		if got := MeterCost(tc.tokens, tc.rate); got != tc.want {
			t.Errorf("MeterCost(%d, %d) = %d, want %d", tc.tokens, tc.rate, got, tc.want)
		}
	}
	for _, tc := range []struct {
		chars int
		want  int64
	}{{0, 0}, {-3, 0}, {1, 1}, {3, 1}, {4, 1}, {5, 2}, {8, 2}, {65536, 16384}, {math.MaxInt, math.MaxInt/4 + 1}} {
		if got := EstimateTokens(tc.chars); got != tc.want {
			t.Errorf("EstimateTokens(%d) = %d, want %d", tc.chars, got, tc.want)
		}
	}
}

func TestCeilingAppliesTo(t *testing.T) {
	for _, tc := range []struct {
		c         Ceiling
		task, ctx string
		want      bool
	}{
		{Ceiling{Scope: ScopeTask}, "t1", "c1", true},
		{Ceiling{Scope: ScopeTask}, "", "", true},
		{Ceiling{Scope: ScopeTask, TaskID: "t1"}, "t1", "c9", true},
		{Ceiling{Scope: ScopeTask, TaskID: "t1"}, "t2", "c1", false},
		{Ceiling{Scope: ScopeTask, TaskID: "t1"}, "", "", false},
		{Ceiling{Scope: ScopeContext}, "t1", "c1", true},
		{Ceiling{Scope: ScopeContext, ContextID: "meetup-s1-e4"}, "t1", "meetup-s1-e4", true},
		{Ceiling{Scope: ScopeContext, ContextID: "meetup-s1-e4"}, "t1", "other", false},
		{Ceiling{Scope: ScopeContext, ContextID: "meetup-s1-e4"}, "t1", "", false},
		{Ceiling{Scope: ScopeDay}, "", "", true},
		{Ceiling{Scope: ScopeDay, ContextID: "c1"}, "t", "c2", false},
	} {
		if got := tc.c.AppliesTo(tc.task, tc.ctx); got != tc.want {
			t.Errorf("%+v.AppliesTo(%q, %q) = %v", tc.c, tc.task, tc.ctx, got)
		}
	}
}

func TestBindingCeiling(t *testing.T) {
	cs := func(scope string, amount, spent int64) CeilingSpend {
		return CeilingSpend{Ceiling: Ceiling{Scope: scope, AmountMicro: amount}, SpentMicro: spent}
	}
	for _, tc := range []struct {
		name       string
		applicable []CeilingSpend
		estimate   int64
		scope      string
		remaining  int64
		admit      bool
	}{
		{"smaller remainder binds over specificity", []CeilingSpend{cs(ScopeTask, 500000, 0), cs(ScopeDay, 10000000, 9900000)}, 200000, ScopeDay, 100000, false},
		{"task binds", []CeilingSpend{cs(ScopeTask, 500000, 0), cs(ScopeDay, 10000000, 1000000)}, 600000, ScopeTask, 500000, false},
		{"fits within all", []CeilingSpend{cs(ScopeTask, 500000, 0), cs(ScopeDay, 10000000, 5000000)}, 400000, ScopeTask, 500000, true},
		{"equal is admitted", []CeilingSpend{cs(ScopeContext, 3000000, 2950000)}, 50000, ScopeContext, 50000, true},
		{"one over is refused", []CeilingSpend{cs(ScopeContext, 3000000, 2950000)}, 50001, ScopeContext, 50000, false},
		{"overspent floors at zero", []CeilingSpend{cs(ScopeDay, 100, 250), cs(ScopeTask, 10, 0)}, 0, ScopeDay, 0, true},
		{"pinned shut", []CeilingSpend{cs(ScopeTask, 0, 0)}, 1, ScopeTask, 0, false},
		{"negative spend adds nothing", []CeilingSpend{cs(ScopeDay, 100, -1000)}, 101, ScopeDay, 100, false},
		{"tie goes to the first listed", []CeilingSpend{cs(ScopeContext, 50, 0), cs(ScopeDay, 70, 20)}, 10, ScopeContext, 50, true},
		{"no ceilings", nil, math.MaxInt64, "", math.MaxInt64, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, rem, ok := BindingCeiling(tc.applicable, tc.estimate)
			if b.Scope != tc.scope || rem != tc.remaining || ok != tc.admit {
				t.Fatalf("got (%s, %d, %v), want (%s, %d, %v)", b.Scope, rem, ok, tc.scope, tc.remaining, tc.admit)
			}
		})
	}
}

func TestPolicyAdmit(t *testing.T) {
	owner := newTestKey(t)
	signed := func(onExhausted string, ceilings ...Ceiling) []byte {
		a := testAllowance(owner, onExhausted, ceilings...)
		if err := SignAllowance(&a, owner); err != nil {
			t.Fatal(err)
		}
		return mustCanonical(a)
	}
	three := signed(OnExhaustedRefuse,
		Ceiling{Scope: ScopeTask, AmountMicro: 500000},
		Ceiling{Scope: ScopeContext, ContextID: "meetup-s1-e4", AmountMicro: 3000000},
		Ceiling{Scope: ScopeDay, AmountMicro: 10000000},
	)
	day := time.Date(2026, 7, 28, 23, 30, 0, 0, time.UTC)
	spend := func(m map[string]int64) SpendLookup {
		return SpendFunc(func(scope, key string) int64 { return m[scope+"/"+key] })
	}
	for _, tc := range []struct {
		name      string
		doc       []byte
		task, ctx string
		estimate  int64
		spent     SpendLookup
		admit     bool
		hold      bool
		scope     string
		remaining int64
	}{
		{"fits", three, "t1", "c1", 400000, spend(map[string]int64{"day/2026-07-28": 5000000}), true, false, ScopeTask, 500000},
		{"day binds", three, "t1", "c1", 200000, spend(map[string]int64{"day/2026-07-28": 9900000}), false, false, ScopeDay, 100000},
		{"narrowed context binds inside it", three, "t1", "meetup-s1-e4", 500000, spend(map[string]int64{"context/meetup-s1-e4": 2950000}), false, false, ScopeContext, 50000},
		{"narrowed context ignored outside it", three, "t1", "elsewhere", 500000, spend(map[string]int64{"context/meetup-s1-e4": 2950000}), true, false, ScopeTask, 500000},
		{"task spend counts", three, "t1", "", 100001, spend(map[string]int64{"task/t1": 400000}), false, false, ScopeTask, 100000},
		{"other task's spend does not", three, "t2", "", 100001, spend(map[string]int64{"task/t1": 400000}), true, false, ScopeTask, 500000},
		{"nil lookup is no spend", three, "t1", "", 500000, nil, true, false, ScopeTask, 500000},
		{"ask_owner holds", signed(OnExhaustedAskOwner, Ceiling{Scope: ScopeDay, AmountMicro: 2000000}), "t", "c", 2000001, nil, false, true, ScopeDay, 2000000},
		{"ask_owner admits what fits", signed(OnExhaustedAskOwner, Ceiling{Scope: ScopeDay, AmountMicro: 2000000}), "t", "c", 2000000, nil, true, false, ScopeDay, 2000000},
		{"no ceilings", signed(OnExhaustedRefuse), "t", "c", math.MaxInt64, nil, true, false, "", math.MaxInt64},
		{"pinned shut task", signed(OnExhaustedRefuse, Ceiling{Scope: ScopeTask, TaskID: "t9", AmountMicro: 0}), "t9", "", 1, nil, false, false, ScopeTask, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := LoadPolicy(tc.doc)
			if p.Err() != nil {
				t.Fatal(p.Err())
			}
			d := p.Admit(tc.task, tc.ctx, day, tc.estimate, tc.spent)
			if d.Admit != tc.admit || d.Hold != tc.hold || d.Binding.Scope != tc.scope || d.Remaining != tc.remaining {
				t.Fatalf("decision %+v", d)
			}
			// A refusal to send now exists only for work neither admitted
			// nor held; Decline has one for everything not admitted.
			if (d.Refusal != nil) != (!d.Admit && !d.Hold) || (d.Decline() != nil) != !d.Admit {
				t.Fatalf("admit %v hold %v refusal %v decline %v", d.Admit, d.Hold, d.Refusal, d.Decline())
			}
			if d.Estimate != (Money{AmountMicro: tc.estimate, Currency: "USD"}) {
				t.Fatalf("estimate %v", d.Estimate)
			}
			if r := d.Decline(); r != nil {
				requireCode(t, r, errs.BudgetInsufficient, "")
				got := string(mustCanonical(r.Details))
				want := `{"estimate":{"amount_micro":` + itoa(tc.estimate) + `,"currency":"USD"}}`
				if got != want {
					t.Fatalf("details %s, want %s", got, want)
				}
			}
		})
	}
}

func itoa(n int64) string { return string(mustCanonical(n)) }

func TestPolicyFailsClosed(t *testing.T) {
	owner := newTestKey(t)
	other := newTestKey(t)
	good := testAllowance(owner, OnExhaustedAskOwner, Ceiling{Scope: ScopeDay, AmountMicro: 1 << 40})
	if err := SignAllowance(&good, owner); err != nil {
		t.Fatal(err)
	}
	unsigned := good
	unsigned.Sig = ""
	forged := good
	forged.CostModel.Per1kTokensMicro = 1
	floaty := strings.Replace(string(mustCanonical(good)), `"amount_micro":1099511627776`, `"amount_micro":1.5`, 1)

	for _, tc := range []struct {
		name     string
		p        *Policy
		code     errs.Code
		currency string
	}{
		{"unsigned", LoadPolicy(mustCanonical(unsigned)), errs.IdentityMismatch, "USD"},
		{"forged", LoadPolicy(mustCanonical(forged)), errs.IdentityMismatch, "USD"},
		{"float money", LoadPolicy([]byte(floaty)), errs.InvalidEnvelope, NoCurrency},
		{"not JSON", LoadPolicy([]byte("{")), errs.InvalidEnvelope, NoCurrency},
		{"empty", LoadPolicy(nil), errs.InvalidEnvelope, NoCurrency},
		{"nil policy", nil, errs.IdentityMismatch, NoCurrency},
		{"wrong agent", LoadPolicy(mustCanonical(good)).For(other.Public(), ""), errs.IdentityMismatch, "USD"},
		{"wrong owner", LoadPolicy(mustCanonical(good)).For(vectorAgent, other.Public()), errs.IdentityMismatch, "USD"},
		{"go-built invalid", NewPolicy(Allowance{}), errs.InvalidEnvelope, NoCurrency},
	} {
		t.Run(tc.name, func(t *testing.T) {
			requireCode(t, tc.p.Err(), tc.code, "")
			// Every admission is refused, however small, and never held:
			// the document's ask_owner is not trustworthy either.
			for _, est := range []int64{0, 1, 1 << 20} {
				d := tc.p.Admit("t", "c", time.Now(), est, nil)
				if d.Admit || d.Hold || d.Refusal == nil || d.Remaining != 0 || d.Decline() != d.Refusal {
					t.Fatalf("estimate %d: %+v", est, d)
				}
				requireCode(t, d.Refusal, errs.BudgetInsufficient, "")
				if got := d.Refusal.Details["estimate"].(map[string]any)["currency"]; got != tc.currency {
					t.Fatalf("currency %v, want %s", got, tc.currency)
				}
			}
			if _, ok := tc.p.Document(); ok {
				t.Fatal("document reported enforceable")
			}
			if m := tc.p.Meter(1000); m.AmountMicro != 0 {
				t.Fatalf("meter %v", m)
			}
		})
	}

	p := LoadPolicy(mustCanonical(good)).For(vectorAgent, owner.Public())
	if p.Err() != nil {
		t.Fatal(p.Err())
	}
	if doc, ok := p.Document(); !ok || doc.Sig != good.Sig {
		t.Fatal("valid document not reported")
	}
	if m := p.Meter(123457); m != (Money{AmountMicro: 185185, Currency: "USD"}) {
		t.Fatalf("meter %v", m)
	}
	if LoadPolicy(mustCanonical(good)).For("", "").Err() != nil {
		t.Fatal("empty expectations must not fail")
	}
}

func TestLedger(t *testing.T) {
	var l Ledger // the zero value is ready
	if l.SpentMicro(ScopeDay, "2026-07-28") != 0 {
		t.Fatal("empty ledger reports spend")
	}
	// 01:30 in UTC+02:00 is still the previous UTC day.
	east := time.FixedZone("UTC+2", 2*3600)
	l.Record("t1", "c1", time.Date(2026, 7, 29, 1, 30, 0, 0, east), 100)
	l.Record("t1", "", time.Date(2026, 7, 28, 23, 59, 59, 0, time.UTC), 50)
	l.Record("", "c1", time.Date(2026, 7, 29, 0, 0, 0, 0, time.UTC), 7)
	l.Record("t1", "c1", time.Now(), 0)   // nothing metered
	l.Record("t1", "c1", time.Now(), -40) // never refunds
	for _, tc := range []struct {
		scope, key string
		want       int64
	}{
		{ScopeTask, "t1", 150},
		{ScopeContext, "c1", 107},
		{ScopeDay, "2026-07-28", 150},
		{ScopeDay, "2026-07-29", 7},
		{ScopeTask, "", 0},
		{ScopeContext, "", 0},
		{ScopeDay, "t1", 0},
	} {
		if got := l.SpentMicro(tc.scope, tc.key); got != tc.want {
			t.Errorf("SpentMicro(%s, %q) = %d, want %d", tc.scope, tc.key, got, tc.want)
		}
	}
	l.Forget(ScopeTask, "t1")
	if l.SpentMicro(ScopeTask, "t1") != 0 || l.SpentMicro(ScopeContext, "c1") != 107 {
		t.Fatal("Forget dropped the wrong key")
	}
	l.Record("big", "", time.Now(), math.MaxInt64-1)
	l.Record("big", "", time.Now(), 10)
	if l.SpentMicro(ScopeTask, "big") != math.MaxInt64 {
		t.Fatal("sum wrapped instead of saturating")
	}

	// Concurrent recording is safe and loses nothing.
	var c Ledger
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				c.Record("t", "c", day0, 1)
			}
		})
	}
	wg.Wait()
	if c.SpentMicro(ScopeTask, "t") != 8000 || c.SpentMicro(ScopeDay, DayKey(day0)) != 8000 {
		t.Fatal("lost concurrent records")
	}

	// The ledger is what Policy.Admit reads.
	owner := newTestKey(t)
	a := testAllowance(owner, OnExhaustedRefuse, Ceiling{Scope: ScopeContext, AmountMicro: 10000})
	if err := SignAllowance(&a, owner); err != nil {
		t.Fatal(err)
	}
	p := NewPolicy(a)
	spent := NewLedger()
	spent.Record("t1", "c1", day0, p.Meter(4000).AmountMicro) // 6000
	if d := p.Admit("t2", "c1", day0, 4000, spent); !d.Admit || d.Remaining != 4000 {
		t.Fatalf("%+v", d)
	}
	if d := p.Admit("t2", "c1", day0, 4001, spent); d.Admit || d.Refusal == nil {
		t.Fatalf("%+v", d)
	}
}

var day0 = time.Date(2026, 7, 28, 12, 0, 0, 0, time.UTC)

// FuzzParseAllowance: no input panics; every refusal is INVALID_ENVELOPE;
// an accepted document re-canonicalises and parses back to the same
// struct, and its canonical form is a fixed point.
func FuzzParseAllowance(f *testing.F) {
	f.Add([]byte(threeScopesSigned))
	f.Add([]byte(threeScopesCanonical))
	f.Add(mustCanonical(baseAllowance()))
	f.Add([]byte(`{"v":1,"agent":"` + vectorAgent + `","owner_key":"` + vectorOwner + `","cost_model":{"per_1k_tokens_micro":0,"currency":"EUR"},"ceilings":[],"on_exhausted":"ask_owner","updated_at":"2026-07-28T15:00:00Z"}`))
	f.Add([]byte(`{"v":1,"ceilings":[{"scope":"week","amount_micro":2000000.5}]}`))
	f.Add([]byte(`{"v":1e0,"ceilings":[{"scope":"task","amount_micro":-0}]}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := ParseAllowance(data)
		if err != nil {
			if errs.CodeOf(err) != errs.InvalidEnvelope {
				t.Fatalf("refusal without INVALID_ENVELOPE: %v", err)
			}
			return
		}
		c1, err := Canonical(a)
		if err != nil {
			t.Fatalf("accepted document does not canonicalise: %v", err)
		}
		b, err := ParseAllowance(c1)
		if err != nil {
			t.Fatalf("re-canonicalised document refused: %v\n%s", err, c1)
		}
		if !reflect.DeepEqual(a, b) {
			t.Fatalf("round trip changed the document:\n%+v\n%+v", a, b)
		}
		c2, _ := Canonical(b)
		if string(c1) != string(c2) {
			t.Fatalf("canonical form is not a fixed point:\n%s\n%s", c1, c2)
		}
		if err := a.Validate(); err != nil {
			t.Fatalf("accepted document fails Validate: %v", err)
		}
		// Signature checking must never panic on arbitrary accepted input.
		_ = a.Verify()
		_ = NewPolicy(a).Admit("t", "c", day0, 1, nil)
	})
}
