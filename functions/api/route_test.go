package api

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/httpx"
)

func okHandler(*Deps) httpx.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		httpx.WriteJSON(w, http.StatusOK, map[string]any{"ok": true})
		return nil
	}
}

func TestCheckRefusesMalformedTables(t *testing.T) {
	job := JobRoute("Sweep", "/jobs/sweep", time.Minute, func(*Deps) Job { return nil })
	good := Route{EntryPoint: "A", Method: "GET", Path: "/a", Auth: Public, Handler: okHandler}
	for _, c := range []struct {
		name  string
		table []Route
		want  string // "" = accepted
	}{
		{"good", []Route{good, job}, ""},
		{"no handler", []Route{{EntryPoint: "A", Method: "GET", Path: "/a"}}, "required"},
		{"no entry point", []Route{{Method: "GET", Path: "/a", Handler: okHandler}}, "required"},
		{"relative path", []Route{{EntryPoint: "A", Path: "a", Handler: okHandler}}, "required"},
		{"twice", []Route{good, good}, "twice"},
		{"same pattern", []Route{good, {EntryPoint: "B", Method: "GET", Path: "/a", Handler: okHandler}}, "twice"},
		{"scheduled GET", []Route{{EntryPoint: "J", Method: "GET", Path: "/j", Auth: Scheduled(time.Minute), Handler: okHandler}}, "scheduled"},
		{"scheduled without interval", []Route{{EntryPoint: "J", Method: "POST", Path: "/j", Auth: Auth{Kind: AuthScheduled}, Handler: okHandler}}, "scheduled"},
		{"token without scope", []Route{{EntryPoint: "T", Method: "GET", Path: "/v1/accounts/{id}/x", Auth: Auth{Kind: AuthToken}, Handler: okHandler}}, "scope"},
		{"token without account", []Route{{EntryPoint: "T", Method: "GET", Path: "/v1/x", Auth: SessionOrToken("read"), Handler: okHandler}}, "{id}"},
	} {
		err := Check(c.table)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: refused: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
}

// Mount serves the public rows and never a job; a session row without an
// account service answers 501 before its handler runs.
func TestMountServesRowsButNotJobs(t *testing.T) {
	var ran atomic.Int32
	table := []Route{
		{EntryPoint: "A", Method: "GET", Path: "/a", Auth: Public, Handler: okHandler},
		{EntryPoint: "S", Method: "GET", Path: "/v1/accounts/{id}/s", Auth: Session, Handler: func(*Deps) httpx.HandlerFunc {
			return func(http.ResponseWriter, *http.Request) error { ran.Add(1); return nil }
		}},
		JobRoute("Sweep", "/jobs/sweep", time.Minute, func(*Deps) Job {
			return func(context.Context) (int, error) { ran.Add(1); return 1, nil }
		}),
	}
	d := &Deps{Log: slog.New(slog.DiscardHandler)}
	mux := http.NewServeMux()
	d.Mount(mux, table)
	for _, c := range []struct {
		method, path string
		status       int
	}{
		{"GET", "/a", 200},
		{"GET", "/v1/accounts/acct_1/s", 501},
		{"POST", "/jobs/sweep", 404},
	} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(c.method, c.path, nil))
		if rec.Code != c.status {
			t.Errorf("%s %s: %d %s, want %d", c.method, c.path, rec.Code, rec.Body, c.status)
		}
	}
	if ran.Load() != 0 {
		t.Errorf("a guarded handler or a job ran %d times", ran.Load())
	}

	// The job's own function (the cloud's) runs it and reports the count.
	rec := httptest.NewRecorder()
	d.Function(table[2]).ServeHTTP(rec, httptest.NewRequest("POST", "/jobs/sweep", nil))
	var out struct {
		OK    bool   `json:"ok"`
		Job   string `json:"job"`
		Count int    `json:"count"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || rec.Code != 200 || !out.OK || out.Job != "Sweep" || out.Count != 1 || ran.Load() != 1 {
		t.Errorf("job function: %d %s (%v), ran %d", rec.Code, rec.Body, err, ran.Load())
	}
}

// meshd's ticker runs the same job as the cloud's function.
func TestRunJobsCallsTheJob(t *testing.T) {
	calls := make(chan struct{}, 10)
	table := []Route{JobRoute("Sweep", "/jobs/sweep", time.Hour, func(*Deps) Job {
		return func(context.Context) (int, error) { calls <- struct{}{}; return 0, nil }
	})}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	(&Deps{Log: slog.New(slog.DiscardHandler)}).RunJobs(ctx, table, 5*time.Millisecond)
	for range 2 {
		select {
		case <-calls:
		case <-time.After(10 * time.Second):
			t.Fatal("the job never ran")
		}
	}
}

// A job whose service this instance lacks answers 501 in the cloud and is
// not ticked in meshd.
func TestJobWithoutItsService(t *testing.T) {
	rt := JobRoute("Sweep", "/jobs/sweep", time.Minute, func(*Deps) Job { return nil })
	rec := httptest.NewRecorder()
	(&Deps{}).Function(rt).ServeHTTP(rec, httptest.NewRequest("POST", "/jobs/sweep", nil))
	if rec.Code != http.StatusNotImplemented {
		t.Errorf("%d %s", rec.Code, rec.Body)
	}
}

// A failed build is answered from memory for RetryAfter, then tried again;
// a successful one is kept.
func TestLazyRetriesAFailedBuildLater(t *testing.T) {
	now := time.Unix(1000, 0)
	builds := 0
	fail := true
	l := NewLazy(func() (*Deps, error) {
		builds++
		if fail {
			return nil, context.DeadlineExceeded
		}
		return &Deps{Log: slog.New(slog.DiscardHandler)}, nil
	})
	l.now = func() time.Time { return now }
	rt := Route{EntryPoint: "A", Method: "GET", Path: "/a", Handler: okHandler}
	get := func() int {
		rec := httptest.NewRecorder()
		l.Handler(rt).ServeHTTP(rec, httptest.NewRequest("GET", "/a", nil))
		return rec.Code
	}
	if get() != 503 || get() != 503 || builds != 1 {
		t.Fatalf("two requests after a failure built %d times, want 1", builds)
	}
	now = now.Add(RetryAfter)
	fail = false
	if get() != 200 || get() != 200 || builds != 2 {
		t.Fatalf("after RetryAfter: built %d times, want 2", builds)
	}
}
