package vectors

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// fixtureDir is MESH_CONFORMANCE_DIR, else the handbook's conformance folder
// beside the repository.
func fixtureDir(t *testing.T) string {
	if d := os.Getenv("MESH_CONFORMANCE_DIR"); d != "" {
		return d
	}
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "shared", "conformance")
}

// TestUpstreamVectors runs every upstream fixture. Zero failures is the bar.
func TestUpstreamVectors(t *testing.T) {
	dir := fixtureDir(t)
	if _, err := os.Stat(dir); os.IsNotExist(err) {
		t.Skipf("conformance fixtures not found at %s (set MESH_CONFORMANCE_DIR); skipping", dir)
	}
	r, err := Run(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	r.Write(&out)
	p, f, d := r.Counts()
	t.Logf("%s: %d files, %d passed, %d failed, %d deferred", dir, len(r.Files), p, f, d)
	if len(r.Files) != len(KnownFiles()) {
		t.Errorf("found %d of the %d known fixture files: %v", len(r.Files), len(KnownFiles()), r.Files)
	}
	if !r.OK() || p == 0 {
		t.Errorf("conformance run failed:\n%s", out.String())
	}
	for _, res := range r.Results {
		if res.Status == Deferred && !strings.Contains(res.Detail, "covered by") {
			t.Errorf("deferred vector %s names no covering test", res.Name)
		}
	}
}

// The runner must judge other vectors with the same shapes, not replay
// answers it knows: a directory with a new correct vector, a wrong one and an
// unparseable file gives exactly those verdicts.
func TestRunnerJudgesOtherVectors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("canonical-json.json", `{"vectors":[
		{"name":"fresh_good","input_json":"{\"z\":[1e-7,{\"b\":true,\"a\":null}],\"é\":\"\\u2028\"}","canonical":"{\"z\":[1e-7,{\"a\":null,\"b\":true}],\"é\":\"\u2028\"}"},
		{"name":"fresh_wrong","input_json":"{\"b\":1,\"a\":2}","canonical":"{\"b\":1,\"a\":2}"}],
	 "number_bits":[{"ieee754_hex":"3ff8000000000000","canonical":"1.5"}]}`)
	write("naming.json", `{"pair":{"code":"ab2-xyz","agent_id":"UX","canonical":"pan-pair-v1:AB2-XYZ:UX"}}`)
	write("budget.json", `{not json`)
	write("unrelated.json", `{"ignored":true}`)
	r, err := Run(dir)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Status{}
	for _, res := range r.Results {
		got[res.File+"/"+res.Name] = res.Status
	}
	want := map[string]Status{
		"canonical-json.json/vectors/fresh_good":           Pass,
		"canonical-json.json/vectors/fresh_wrong":          Fail,
		"canonical-json.json/number_bits/3ff8000000000000": Pass,
		"naming.json/pair":                                 Pass,
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: %q, want %q", k, got[k], w)
		}
	}
	if len(r.FileErrors) != 1 || !strings.Contains(r.FileErrors[0].Error(), "budget.json") {
		t.Errorf("file errors %v, want one for budget.json", r.FileErrors)
	}
	p, f, _ := r.Counts()
	if p != 3 || f != 2 || r.OK() {
		t.Errorf("counts %d passed %d failed ok=%v; want 3, 2, false", p, f, r.OK())
	}
	var out bytes.Buffer
	r.Write(&out)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if last := lines[len(lines)-1]; last != "3 passed, 2 failed" {
		t.Errorf("closing line %q", last)
	}
}

func TestRunMissingDir(t *testing.T) {
	if _, err := Run(filepath.Join(t.TempDir(), "absent")); err == nil {
		t.Fatal("a missing directory must be an error")
	}
}

// The new fixture families are judged the same way: in a directory of
// other vectors with the same shapes, correct ones pass and wrong ones
// fail, and the summary counts each file.
func TestRunnerJudgesCommerceAndEngagementVectors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	perUnit := `{"model":"per_unit","currency":"USD","meter":"tokens_out","per":1000,"amount_micro":1500}`
	write("commerce.json", `{"rating":{"cases":[
		{"case":"right","price":`+perUnit+`,"events":[{"meter":"tokens_out","quantity":2000}],"expect_charge_micro":3000},
		{"case":"wrong","price":`+perUnit+`,"events":[{"meter":"tokens_out","quantity":2000}],"expect_charge_micro":3001}]},
	 "price":{"invalid":[{"case":"actually_valid","price":{"model":"free"},"why":"it is not"}]}}`)
	write("metering.json", `{"idempotency":{"events":[{"meter":"m","envelope_id":"E","quantity":2},{"meter":"m","envelope_id":"E","quantity":2}],"expect_folded":{"m":4}}}`)
	write("feeds.json", `{"subjects":{"build_cases":[{"id":"dots","agent":"UD3IZ2TLL7SK4WO7QRHMZS3IEUBPSN5XDCQOFB2XR2HG2PCMQBW2PDVF","topic":"a.b","verdict":"accept","subject":"x"}]}}`)
	write("sow-reporting.json", `{"every":{"valid":[{"value":"P2D","ms":172800000},{"value":"P1D","ms":1}],"invalid":[{"value":"PT5M"}]}}`)
	write("sow-pricing.json", `{"operator_fee":{"cap":{"cases":[
		{"case":"maximal","cap_remaining":100,"basis":{"kind":"percent","percent":10},"max_rated_total":91,"fee":9,"client_total":100},
		{"case":"closed_form","cap_remaining":100,"basis":{"kind":"percent","percent":10},"max_rated_total":90,"fee":9,"client_total":99}]}}}`)
	write("sow-subcontracting.json", `{"conformance":{"cases":[{"name":"silent_missing","prime":{"reporting":{"level":"check_ins","every":"P1W","grade":"evidence"}},"sub":{},"violations":[]}]}}`)
	write("sow-disputes.json", `{"verdict":{"valid":[{"name":"bad_split","verdict":{"verdict":"v1","role":"arbiter","engagement":"e","dispute":"d",
		"disputed":{"currency":"XCR","amount":10},"split":{"provider":5,"client":6},"attribution":"a","basis":{"count":0,"ids_sha256":"`+strings.Repeat("a", 64)+`"},
		"heard":{"provider":true,"client":true},"reasons":"r","produced_at":"2026-08-09T16:40:00Z","by":"UBMBH4BK6EIHQFVMHLSABFSQXB3JXUFZOXVZQTIERO33AD4HHAI3D7QP"}}]}}`)
	r, err := Run(dir)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Status{}
	for _, res := range r.Results {
		got[res.File+"/"+res.Name] = res.Status
	}
	want := map[string]Status{
		"commerce.json/rating/right":                         Pass,
		"commerce.json/rating/wrong":                         Fail,
		"commerce.json/price/invalid/actually_valid":         Fail,
		"metering.json/idempotency":                          Fail,
		"feeds.json/subjects/build/dots":                     Fail,
		"sow-reporting.json/every/valid/P2D":                 Pass,
		"sow-reporting.json/every/valid/P1D":                 Fail,
		"sow-reporting.json/every/invalid/0_\"PT5M\"":        Fail,
		"sow-pricing.json/operator_fee/cap/maximal":          Pass,
		"sow-pricing.json/operator_fee/cap/closed_form":      Fail,
		"sow-subcontracting.json/conformance/silent_missing": Fail,
		"sow-disputes.json/verdict/valid/bad_split":          Fail,
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s: %q, want %q", k, got[k], w)
		}
	}
	if len(r.Results) != len(want) {
		t.Errorf("%d results, want %d: %v", len(r.Results), len(want), got)
	}
	counts := map[string]FileCount{}
	for _, c := range r.PerFile() {
		counts[c.File] = c
	}
	if c := counts["commerce.json"]; c.Passed != 1 || c.Failed != 2 {
		t.Errorf("commerce.json counts %+v", c)
	}
	var out bytes.Buffer
	r.Write(&out)
	if !strings.Contains(out.String(), "\nsow-reporting.json: 1 passed, 2 failed\n") {
		t.Errorf("no per-file line for sow-reporting.json in:\n%s", out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if last := lines[len(lines)-1]; last != "3 passed, 9 failed" {
		t.Errorf("closing line %q", last)
	}
}
