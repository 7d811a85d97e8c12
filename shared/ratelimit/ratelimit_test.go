package ratelimit_test

import (
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/ratelimit"
	"agentmesh.dev/mesh/shared/store"
	"agentmesh.dev/mesh/shared/store/boltstore"
)

func TestSlidingWindow(t *testing.T) {
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	lim := ratelimit.Limit{Name: "test", Key: "192.0.2.1", Max: 3, Window: time.Hour}
	other := ratelimit.Limit{Name: "test", Key: "192.0.2.2", Max: 3, Window: time.Hour}
	take := func(at time.Time, ls ...ratelimit.Limit) error {
		return st.RunTx(t.Context(), func(tx store.Tx) error { return ratelimit.Take(tx, "limits", at, ls...) })
	}
	start := time.Date(2026, 8, 1, 12, 0, 0, 0, time.UTC)
	for i := range 3 {
		if err := take(start.Add(time.Duration(i)*time.Minute), lim); err != nil {
			t.Fatalf("event %d: %v", i+1, err)
		}
	}
	var ex *ratelimit.Exceeded
	if err := take(start.Add(10*time.Minute), lim); !errors.As(err, &ex) || ex.RetryAfter != 50*time.Minute || ex.Limit.Name != "test" {
		t.Fatalf("fourth: %v", err)
	}
	// Another key, and a refusal by one limit writes nothing for the others.
	if err := take(start.Add(10*time.Minute), other, lim); !errors.As(err, &ex) || ex.Limit.Key != "192.0.2.1" {
		t.Fatalf("two limits: %v", err)
	}
	for i := range 3 {
		if err := take(start.Add(11*time.Minute), other); err != nil {
			t.Fatalf("other key, event %d: %v", i+1, err)
		}
	}
	// At the start of the next window the last one still weighs fully;
	// half way through it weighs half (1.5 of 3), so two more fit.
	if err := take(start.Add(time.Hour), lim); err == nil {
		t.Fatal("the previous window was forgotten at once")
	}
	for i := range 2 {
		if err := take(start.Add(90*time.Minute), lim); err != nil {
			t.Fatalf("half way, event %d: %v", i+1, err)
		}
	}
	if err := take(start.Add(90*time.Minute), lim); err == nil {
		t.Fatal("a third event half way through fit")
	}
	// Two windows later, nothing is remembered.
	for i := range 3 {
		if err := take(start.Add(3*time.Hour), lim); err != nil {
			t.Fatalf("later, event %d: %v", i+1, err)
		}
	}
	// The store holds no key in the clear.
	var docs []map[string]any
	if err := store.List(t.Context(), st, "limits", store.Query{}, &docs); err != nil || len(docs) != 2 {
		t.Fatalf("%d counters, %v", len(docs), err)
	}
	if ratelimit.ID("test", "192.0.2.1") == "192.0.2.1" {
		t.Fatal("ids must be hashes")
	}
}

// Check answers like Take but counts nothing.
func TestCheckCountsNothing(t *testing.T) {
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	lim := ratelimit.Limit{Name: "test", Key: "192.0.2.1", Max: 2, Window: time.Hour}
	now := time.Date(2026, 8, 1, 12, 0, 0, 0, time.UTC)
	run := func(f func(store.Tx, string, time.Time, ...ratelimit.Limit) error) error {
		return st.RunTx(t.Context(), func(tx store.Tx) error { return f(tx, "limits", now, lim) })
	}
	for range 5 {
		if err := run(ratelimit.Check); err != nil {
			t.Fatalf("check on an empty counter: %v", err)
		}
	}
	var docs []map[string]any
	if err := store.List(t.Context(), st, "limits", store.Query{}, &docs); err != nil || len(docs) != 0 {
		t.Fatalf("Check wrote %d counters, %v", len(docs), err)
	}
	for range 2 {
		if err := run(ratelimit.Take); err != nil {
			t.Fatal(err)
		}
	}
	var ex *ratelimit.Exceeded
	if err := run(ratelimit.Check); !errors.As(err, &ex) || ex.Limit.Name != "test" {
		t.Fatalf("check on a full counter: %v", err)
	}
}

func TestParseRate(t *testing.T) {
	for in, want := range map[string]ratelimit.Rate{
		"20/1h":       {Max: 20, Window: time.Hour},
		" 5 / 15m ":   {Max: 5, Window: 15 * time.Minute},
		"1/1s":        {Max: 1, Window: time.Second},
		"600/1h30m":   {Max: 600, Window: 90 * time.Minute},
		"3/744h":      {Max: 3, Window: 744 * time.Hour},
		"20":          {},
		"20/":         {},
		"/1h":         {},
		"0/1h":        {},
		"-1/1h":       {},
		"2/0s":        {},
		"2/500ms":     {},
		"2/745h":      {},
		"2/hour":      {},
		"1.5/1h":      {},
		"20/1h/2":     {},
		"":            {},
		"twenty/1h":   {},
		"20/1h extra": {},
	} {
		got, err := ratelimit.ParseRate(in)
		if want == (ratelimit.Rate{}) {
			if err == nil {
				t.Errorf("ParseRate(%q) = %v, want an error", in, got)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("ParseRate(%q) = %v, %v; want %v", in, got, err, want)
		}
		if back, err := ratelimit.ParseRate(got.String()); err != nil || back != got {
			t.Errorf("%v does not round-trip through %q: %v %v", got, got.String(), back, err)
		}
	}
	for r, want := range map[ratelimit.Rate]string{
		{Max: 20, Window: time.Hour}: "20/1h", {Max: 5, Window: 15 * time.Minute}: "5/15m",
		{Max: 1, Window: 90 * time.Minute}: "1/1h30m", {Max: 2, Window: 90 * time.Second}: "2/1m30s", {Max: 3, Window: 24 * time.Hour}: "3/24h",
	} {
		if r.String() != want {
			t.Errorf("%#v.String() = %q, want %q", r, r.String(), want)
		}
	}
}

// A knob sets its field from its variable (MESH_ and the flag in
// capitals), keeps the default when the variable is unset, and names the
// variable when its value is wrong.
func TestKnobs(t *testing.T) {
	r := ratelimit.Rate{Max: 20, Window: time.Hour}
	n := 3
	d := 24 * time.Hour
	knobs := []ratelimit.Knob{
		ratelimit.RateKnob("limit-test-rate", "a rate", &r),
		ratelimit.CountKnob("limit-test-count", "a count", 1, &n),
		ratelimit.DurationKnob("limit-test-age", "an age", time.Minute, &d),
	}
	if knobs[0].Env != "MESH_LIMIT_TEST_RATE" || knobs[0].Default != "20/1h" || knobs[1].Env != "MESH_LIMIT_TEST_COUNT" || knobs[1].Default != "3" ||
		knobs[2].Env != "MESH_LIMIT_TEST_AGE" || knobs[2].Default != "24h0m0s" {
		t.Fatalf("knobs: %+v", knobs)
	}
	env := map[string]string{"MESH_LIMIT_TEST_RATE": "7/10m", "MESH_LIMIT_TEST_AGE": "90m"}
	if err := ratelimit.FromEnv(func(k string) string { return env[k] }, knobs...); err != nil {
		t.Fatal(err)
	}
	if r != (ratelimit.Rate{Max: 7, Window: 10 * time.Minute}) || n != 3 || d != 90*time.Minute {
		t.Fatalf("after FromEnv: %v %d %v", r, n, d)
	}
	for k, v := range map[string]string{"MESH_LIMIT_TEST_RATE": "7", "MESH_LIMIT_TEST_COUNT": "0", "MESH_LIMIT_TEST_AGE": "30s"} {
		err := ratelimit.FromEnv(func(name string) string {
			if name == k {
				return v
			}
			return ""
		}, knobs...)
		if err == nil || !strings.Contains(err.Error(), k) {
			t.Errorf("%s=%s: %v", k, v, err)
		}
	}
}

// The refusal is a 429 in the project's error shape, with when to retry
// and which limit.
func TestRefusal(t *testing.T) {
	e := ratelimit.Refusal(&ratelimit.Exceeded{Limit: ratelimit.Limit{Name: "x-per-address", Max: 5, Window: time.Hour}, RetryAfter: 90 * time.Second},
		"things from your address")
	if e.HTTPStatus() != http.StatusTooManyRequests || e.Code != errs.RateLimited || e.RetryAfterMS != 90_000 || !e.Retryable ||
		e.Details["limit"] != "x-per-address" || e.Message != "too many things from your address (at most 5 per 1h); retry in 90 s" {
		t.Fatalf("%+v", e)
	}
	if e := ratelimit.Refusal(&ratelimit.Exceeded{Limit: ratelimit.Limit{Max: 1, Window: time.Second}}, "x"); e.RetryAfterMS != 1 {
		t.Errorf("a zero wait must still say when: %d", e.RetryAfterMS)
	}
}

// Sweep deletes counters two windows after their last count, and only those.
func TestSweep(t *testing.T) {
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	start := time.Date(2026, 8, 1, 12, 0, 0, 0, time.UTC)
	take := func(at time.Time, key string) {
		t.Helper()
		if err := st.RunTx(t.Context(), func(tx store.Tx) error {
			return ratelimit.Take(tx, "limits", at, ratelimit.Limit{Name: "test", Key: key, Max: 100, Window: time.Hour})
		}); err != nil {
			t.Fatal(err)
		}
	}
	take(start, "old")
	take(start.Add(90*time.Minute), "new")
	sweep := func(at time.Time, want int) {
		t.Helper()
		if n, err := ratelimit.Sweep(t.Context(), st, "limits", at); err != nil || n != want {
			t.Fatalf("sweep at %s: %d %v, want %d", at.Sub(start), n, err, want)
		}
	}
	sweep(start.Add(119*time.Minute), 0) // the old counter still weighs in the window after its own
	sweep(start.Add(2*time.Hour), 1)
	sweep(start.Add(2*time.Hour), 0)
	sweep(start.Add(3*time.Hour), 1)
	var docs []map[string]any
	if err := store.List(t.Context(), st, "limits", store.Query{}, &docs); err != nil || len(docs) != 0 {
		t.Fatalf("%d counters left, %v", len(docs), err)
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"65536": 65536, "64KiB": 64 << 10, " 1MiB ": 1 << 20, "1GiB": 1 << 30, "0": 0, "3 KiB": 3 << 10} {
		if got, err := ratelimit.ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "KiB", "1.5MiB", "-1", "1kb", "9223372036854775807GiB"} {
		if _, err := ratelimit.ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q) accepted", bad)
		}
	}
	for n, want := range map[int64]string{64 << 10: "64KiB", 1 << 30: "1GiB", 1000: "1000", 3 << 20: "3MiB", 1536: "1536"} {
		if got := ratelimit.FormatSize(n); got != want {
			t.Errorf("FormatSize(%d) = %q, want %q", n, got, want)
		}
	}
}
