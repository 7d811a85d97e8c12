// Package vectors runs the upstream protocol's JSON conformance fixtures
// against this project's own code.
//
// Each fixture file has a checker that walks the file's own structure and
// turns every vector or case into a call into the project's own code where
// the runtime uses it (shared/protocol, commerce, metering, feeds, sow),
// comparing what our code produces with what the fixture pins. No
// vector name or count is hard-coded: a directory of newer fixtures with the
// same file names and shapes runs unchanged.
//
// A case that can only be judged against a running mesh is reported as
// deferred, with the end-to-end test that covers it, and is never counted
// as passed.
package vectors

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"

	"agentmesh.dev/mesh/shared/protocol"
)

// Status of one vector.
type Status string

const (
	Pass     Status = "pass"
	Fail     Status = "FAIL"
	Deferred Status = "deferred"
)

// Result is one vector's outcome.
type Result struct {
	File   string
	Name   string
	Status Status
	Detail string
}

// Report is a run over one directory.
type Report struct {
	Dir     string
	Results []Result
	// FileErrors are known files that could not be read or parsed, or whose
	// shape the checker did not recognise at all.
	FileErrors []error
	// Files lists the known files found and run.
	Files []string
}

// Counts returns passed, failed and deferred totals. A file that could not
// be parsed counts as one failure.
func (r *Report) Counts() (passed, failed, deferred int) {
	for _, res := range r.Results {
		switch res.Status {
		case Pass:
			passed++
		case Fail:
			failed++
		case Deferred:
			deferred++
		}
	}
	return passed, failed + len(r.FileErrors), deferred
}

// OK reports a run with no failure.
func (r *Report) OK() bool {
	_, f, _ := r.Counts()
	return f == 0
}

// FileCount is one file's totals.
type FileCount struct {
	File                     string
	Passed, Failed, Deferred int
}

// PerFile returns each run file's totals, in run order; a file that could
// not be read or parsed counts one failure.
func (r *Report) PerFile() []FileCount {
	out := make([]FileCount, 0, len(r.Files))
	at := map[string]int{}
	for _, f := range r.Files {
		at[f] = len(out)
		out = append(out, FileCount{File: f})
	}
	for _, res := range r.Results {
		c := &out[at[res.File]]
		switch res.Status {
		case Pass:
			c.Passed++
		case Fail:
			c.Failed++
		case Deferred:
			c.Deferred++
		}
	}
	for _, err := range r.FileErrors {
		for i := range out {
			if strings.HasPrefix(err.Error(), out[i].File+":") {
				out[i].Failed++
				break
			}
		}
	}
	return out
}

// Write prints one line per vector, one summary line per file ("file: N
// passed, M failed[, D deferred]") and the closing summary line "N passed,
// M failed".
func (r *Report) Write(w io.Writer) {
	for _, res := range r.Results {
		line := fmt.Sprintf("%-8s %s/%s", res.Status, res.File, res.Name)
		if res.Detail != "" {
			line += ": " + res.Detail
		}
		fmt.Fprintln(w, line)
	}
	for _, err := range r.FileErrors {
		fmt.Fprintf(w, "%-8s %v\n", Fail, err)
	}
	for _, c := range r.PerFile() {
		line := fmt.Sprintf("%s: %d passed, %d failed", c.File, c.Passed, c.Failed)
		if c.Deferred > 0 {
			line += fmt.Sprintf(", %d deferred", c.Deferred)
		}
		fmt.Fprintln(w, line)
	}
	p, f, d := r.Counts()
	if d > 0 {
		fmt.Fprintf(w, "%d deferred to end-to-end tests (not counted as passed)\n", d)
	}
	fmt.Fprintf(w, "%d passed, %d failed\n", p, f)
}

// checker runs every vector of one parsed fixture file.
type checker func(t *T, doc map[string]any)

// checkers maps the known fixture file names to their checkers.
var checkers = map[string]checker{
	"canonical-json.json":      checkCanonical,
	"accept-signal.json":       checkAcceptSignal,
	"allowance.json":           checkAllowance,
	"budget.json":              checkBudget,
	"cancel.json":              checkCancel,
	"inbound-protections.json": checkInbound,
	"manifest-signing.json":    checkManifestSigning,
	"naming.json":              checkNaming,
	"sender-preflight.json":    checkPreflight,
	"signature-tags.json":      checkSignatureTags,
	"commerce.json":            checkCommerce,
	"metering.json":            checkMetering,
	"feeds.json":               checkFeeds,
	"sow-terms.json":           checkSowTerms,
	"sow-pricing.json":         checkSowPricing,
	"sow-data-use.json":        checkSowDataUse,
	"sow-reporting.json":       checkSowReporting,
	"sow-subcontracting.json":  checkSowSubcontracting,
	"sow-disputes.json":        checkSowDisputes,
}

// KnownFiles lists the fixture names the runner understands.
func KnownFiles() []string {
	names := make([]string, 0, len(checkers))
	for n := range checkers {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Run reads every known fixture file in dir and runs its vectors. Unknown
// files are ignored; a missing known file is not an error (a directory may
// carry a subset). It returns an error only when dir cannot be read.
func Run(dir string) (*Report, error) {
	if _, err := os.ReadDir(dir); err != nil {
		return nil, fmt.Errorf("read fixtures: %w", err)
	}
	r := &Report{Dir: dir}
	for _, name := range KnownFiles() {
		path := filepath.Join(dir, name)
		data, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		r.Files = append(r.Files, name)
		if err != nil {
			r.FileErrors = append(r.FileErrors, fmt.Errorf("%s: %w", name, err))
			continue
		}
		v, err := protocol.ParseJSON(data)
		if err != nil {
			r.FileErrors = append(r.FileErrors, fmt.Errorf("%s: cannot parse: %w", name, err))
			continue
		}
		doc, ok := v.(map[string]any)
		if !ok {
			r.FileErrors = append(r.FileErrors, fmt.Errorf("%s: top level is not an object", name))
			continue
		}
		t := &T{file: name}
		func() {
			defer func() {
				if p := recover(); p != nil {
					r.FileErrors = append(r.FileErrors, fmt.Errorf("%s: checker crashed: %v\n%s", name, p, debug.Stack()))
				}
			}()
			checkers[name](t, doc)
		}()
		if len(t.results) == 0 {
			r.FileErrors = append(r.FileErrors, fmt.Errorf("%s: no vector recognised in this file's shape", name))
		}
		r.Results = append(r.Results, t.results...)
	}
	return r, nil
}

// T collects the results of one file.
type T struct {
	file    string
	results []Result
}

// Run runs one vector. fn returns nil for a pass; a panic inside it (for
// example a member of the wrong type in a reshaped fixture) is a failure of
// that vector only.
func (t *T) Run(name string, fn func() error) {
	res := Result{File: t.file, Name: name, Status: Pass}
	func() {
		defer func() {
			if p := recover(); p != nil {
				res.Status, res.Detail = Fail, fmt.Sprintf("malformed vector: %v", p)
			}
		}()
		if err := fn(); err != nil {
			res.Status, res.Detail = Fail, err.Error()
		}
	}()
	t.results = append(t.results, res)
}

// Defer records a vector that needs a running mesh, naming what covers it.
func (t *T) Defer(name, coveredBy string) {
	t.results = append(t.results, Result{File: t.file, Name: name, Status: Deferred, Detail: "covered by " + coveredBy})
}

// --- small accessors over the generic value model ---

func obj(v any) map[string]any {
	m, ok := v.(map[string]any)
	if !ok {
		panic(fmt.Sprintf("expected an object, got %T", v))
	}
	return m
}

func arr(v any) []any {
	a, ok := v.([]any)
	if !ok {
		panic(fmt.Sprintf("expected an array, got %T", v))
	}
	return a
}

func str(v any) string {
	s, ok := v.(string)
	if !ok {
		panic(fmt.Sprintf("expected a string, got %T", v))
	}
	return s
}

func num(v any) int64 {
	f, ok := v.(float64)
	if !ok {
		panic(fmt.Sprintf("expected a number, got %T", v))
	}
	return int64(f)
}

// optStr returns a string member or "" when absent or null.
func optStr(m map[string]any, k string) string {
	s, _ := m[k].(string)
	return s
}

// caseName picks a vector's own name from the usual members.
func caseName(m map[string]any, fallback string) string {
	for _, k := range []string{"id", "case", "name"} {
		if s, ok := m[k].(string); ok && s != "" {
			return s
		}
	}
	return fallback
}

// canon renders a value canonically for comparisons.
func canon(v any) string {
	b, err := protocol.Canonical(v)
	if err != nil {
		return "<" + err.Error() + ">"
	}
	return string(b)
}

func sameJSON(got, want any) error {
	g, w := canon(got), canon(want)
	if g != w {
		return fmt.Errorf("got %s, want %s", clip(g), clip(w))
	}
	return nil
}

func clip(s string) string {
	if len(s) > 240 {
		return s[:240] + "…"
	}
	return s
}

// members returns the object members of m in a stable order, for sections
// whose vectors are named members rather than array entries.
func members(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func quoteDiff(got, want string) error {
	if got == want {
		return nil
	}
	return fmt.Errorf("got %q, want %q", clip(got), clip(want))
}
