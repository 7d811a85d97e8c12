package allowance

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// update rewrites golden files: go test ./adapter/allowance -run Golden -update
var update = flag.Bool("update", false, "rewrite golden files in testdata/")

// fixtureDir is where the conformance fixtures are read from:
// MESH_CONFORMANCE_DIR when set (a newer fixture set runs unchanged), else
// the copies in testdata/conformance, which keep these tests standalone.
// TestFixtureCopiesAreCurrent notices when the copies fall behind.
func fixtureDir() string {
	if d := os.Getenv("MESH_CONFORMANCE_DIR"); d != "" {
		return d
	}
	return filepath.Join("testdata", "conformance")
}

// handbookDir is the project's shared conformance folder, beside the
// repository (as conformance/vectors finds it).
func handbookDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "shared", "conformance")
}

func fixture(t testing.TB, name string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(fixtureDir(), name))
	if err != nil {
		t.Fatalf("read fixture: %v", err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("parse fixture %s: %v", name, err)
	}
	return m
}

// obj, arr, str and num walk a decoded fixture; a missing or mistyped
// member is the zero value, which the assertions then catch.
func obj(v any) map[string]any { m, _ := v.(map[string]any); return m }
func arr(v any) []any          { a, _ := v.([]any); return a }
func str(v any) string         { s, _ := v.(string); return s }
func num(v any) int64          { f, _ := v.(float64); return int64(f) }

func path(m map[string]any, keys ...string) any {
	var v any = m
	for _, k := range keys {
		v = obj(v)[k]
	}
	return v
}

// The allowance fixture's identities: the published seed plays the owner,
// the seedless recipient key the governed agent.
func fixtureOwner(t testing.TB) *keys.Agent {
	t.Helper()
	k, err := keys.FromSeed[keys.AgentRole]([]byte(str(path(fixture(t, "allowance.json"), "identities", "sender_seed"))))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func fixtureAgent(t testing.TB) string {
	return str(path(fixture(t, "allowance.json"), "identities", "recipient"))
}

func freshKey(t testing.TB) *keys.Agent {
	t.Helper()
	k, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// newStore opens a Store in a fresh directory for the fixture's agent and
// owner.
func newStore(t testing.TB) *Store {
	t.Helper()
	s, err := Open(t.TempDir(), fixtureAgent(t), fixtureOwner(t))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func at(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t
}

func usd(micro int64) protocol.Money   { return protocol.Money{AmountMicro: micro, Currency: "USD"} }
func usdp(micro int64) *protocol.Money { m := usd(micro); return &m }

// mustSet applies a Set that the test expects to succeed.
func mustSet(t *testing.T, s *Store, req SetRequest, now time.Time) protocol.Allowance {
	t.Helper()
	a, err := s.Set(req, now)
	if err != nil {
		t.Fatalf("Set(%+v): %v", req, err)
	}
	return a
}

func mustMeter(t *testing.T, s *Store, task, ctx string, prompt, output int, when time.Time) protocol.Money {
	t.Helper()
	m, err := s.Meter(task, ctx, prompt, output, when)
	if err != nil {
		t.Fatalf("Meter: %v", err)
	}
	return m
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	p := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(p, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("read golden %s (run with -update to create): %v", p, err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from golden:\n got:\n%s\n want:\n%s", name, got, want)
	}
}

// canon is the canonical JSON of a value, for comparing shapes that were
// built in Go with shapes decoded from a fixture.
func canon(t testing.TB, v any) string {
	t.Helper()
	b, err := protocol.Canonical(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// requireRefusal checks e against a fixture refusal
// {error_code, details}: same code, canonically equal details.
func requireRefusal(t *testing.T, e *errs.Error, want map[string]any) {
	t.Helper()
	if e == nil {
		t.Fatalf("no refusal, want %s", str(want["error_code"]))
	}
	if string(e.Code) != str(want["error_code"]) {
		t.Fatalf("refusal code %s, want %s", e.Code, want["error_code"])
	}
	if got, w := canon(t, e.Details), canon(t, want["details"]); got != w {
		t.Fatalf("refusal details %s, want %s", got, w)
	}
}

func TestFixtureCopiesAreCurrent(t *testing.T) {
	for _, name := range []string{"allowance.json", "budget.json"} {
		upstream, err := os.ReadFile(filepath.Join(handbookDir(), name))
		if err != nil {
			t.Skipf("handbook fixtures not found at %s; testing against the copies", handbookDir())
		}
		copyBytes, err := os.ReadFile(filepath.Join("testdata", "conformance", name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(upstream, copyBytes) {
			t.Errorf("testdata/conformance/%s differs from %s: copy the new fixture in (the fixture is the authority)", name, handbookDir())
		}
	}
}
