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
