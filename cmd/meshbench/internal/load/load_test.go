package load

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

var errBusy = errors.New("busy")

// A counted run sends exactly the requests asked for, spread over the
// callers, and sorts failures by what Classify names them.
func TestRunCounts(t *testing.T) {
	var calls atomic.Int64
	var mu sync.Mutex
	seen := map[int]int{} // caller → highest seq + 1
	res, err := Run(context.Background(), Config{Callers: 4, Requests: 103, Timeout: time.Second,
		Classify: func(err error) Failure {
			if errors.Is(err, errBusy) {
				return Failure{Code: "AGENT_OVERLOADED"}
			}
			return Failure{Kind: "timeout"}
		}},
		func(ctx context.Context, caller, seq int) error {
			n := calls.Add(1)
			mu.Lock()
			if seq+1 > seen[caller] {
				seen[caller] = seq + 1
			}
			mu.Unlock()
			if _, ok := ctx.Deadline(); !ok {
				t.Error("a request without the timeout's deadline")
			}
			switch n % 10 {
			case 0:
				return errBusy
			case 5:
				return context.DeadlineExceeded
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 103 || res.OK()+res.Failed() != 103 {
		t.Fatalf("calls %d, ok %d, failed %d; want 103 in all", calls.Load(), res.OK(), res.Failed())
	}
	if got := res.Errors[Failure{Code: "AGENT_OVERLOADED"}]; got != 10 {
		t.Errorf("AGENT_OVERLOADED %d, want 10", got)
	}
	if got := res.Errors[Failure{Kind: "timeout"}]; got != 10 {
		t.Errorf("timeout %d, want 10", got)
	}
	if res.Examples[Failure{Code: "AGENT_OVERLOADED"}] != "busy" {
		t.Errorf("examples %v", res.Examples)
	}
	total := 0
	for _, n := range seen {
		total += n
	}
	if total != 103 {
		t.Errorf("per-caller sequences add up to %d, want 103: %v", total, seen)
	}
	if res.Elapsed <= 0 || res.Rate() <= 0 {
		t.Errorf("elapsed %v, rate %v", res.Elapsed, res.Rate())
	}
}

// The warm-up runs the same load and is not counted; in a timed run (and
// its warm-up) every caller sends at least one request, however short.
func TestRunWarmupAndDuration(t *testing.T) {
	var calls atomic.Int64
	res, err := Run(context.Background(), Config{Callers: 2, Duration: time.Nanosecond, Warmup: time.Nanosecond},
		func(ctx context.Context, caller, seq int) error {
			calls.Add(1)
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if res.OK() < 2 || calls.Load()-int64(res.OK()) < 2 {
		t.Errorf("measured %d of %d calls; want at least 2 measured and 2 warm-up", res.OK(), calls.Load())
	}
}

// An interrupt stops the run and returns what was measured; requests cut
// short by it are not failures.
func TestRunInterrupted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var n atomic.Int64
	res, err := Run(ctx, Config{Callers: 3, Duration: time.Hour}, func(rctx context.Context, caller, seq int) error {
		if n.Add(1) == 20 {
			cancel()
		}
		if ctx.Err() != nil {
			<-rctx.Done()
			return rctx.Err()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want canceled", err)
	}
	if res.Failed() != 0 || res.OK() == 0 {
		t.Errorf("ok %d, failed %d %v", res.OK(), res.Failed(), res.Errors)
	}
}

// Progress is reported while a run lasts and never after it returns.
func TestRunProgress(t *testing.T) {
	var mu sync.Mutex
	var got []Progress
	done := false
	seen := make(chan struct{})
	var once sync.Once
	_, err := Run(context.Background(), Config{Callers: 1, Requests: 20, ProgressEvery: time.Millisecond,
		Progress: func(p Progress) {
			mu.Lock()
			defer mu.Unlock()
			if done {
				t.Error("progress after the run")
			}
			got = append(got, p)
			if p.Errors > 0 {
				once.Do(func() { close(seen) })
			}
		}},
		func(ctx context.Context, caller, seq int) error {
			if seq == 19 {
				<-seen // the run cannot end before a report counted the failure
			}
			if seq == 1 {
				return errBusy
			}
			return nil
		})
	mu.Lock()
	done = true
	mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	last := got[len(got)-1]
	if last.Done < 2 || last.Errors != 1 || last.Elapsed <= 0 {
		t.Errorf("progress %+v", got)
	}
}

// Percentiles are nearest-rank over the sorted latencies.
func TestPercentile(t *testing.T) {
	r := &Result{}
	for i := 1; i <= 200; i++ {
		r.Latencies = append(r.Latencies, time.Duration(i)*time.Microsecond)
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{50, 100}, {90, 180}, {99, 198}, {99.9, 200}, {100, 200}, {0.1, 1}} {
		if got := r.Percentile(c.p); got != c.want*time.Microsecond {
			t.Errorf("p%v = %v, want %v", c.p, got, c.want*time.Microsecond)
		}
	}
	if (&Result{}).Percentile(50) != 0 {
		t.Error("percentile of nothing")
	}
}
