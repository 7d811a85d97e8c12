// Package load drives one request function from many callers at once and
// measures what came back: the latency of every answered request and the
// failures by cause. It knows nothing of what a request is; meshbench gives
// it one function per row (the mesh, raw NATS, signed NATS, HTTP).
package load

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Call sends one request and waits for its answer. caller is the calling
// goroutine (0 to Callers-1) and seq counts that caller's requests from 0,
// so a row can spread its callers over nodes and rotate each caller over
// the responders without sharing state.
type Call func(ctx context.Context, caller, seq int) error

// Failure names why a request failed: the protocol error code it ended with
// (Code), or, when it has none, what kind of failure it was (Kind: a
// transport or client-side failure such as "timeout" or "http_503").
type Failure struct {
	Code string
	Kind string
}

// Config shapes one run.
type Config struct {
	// Callers is how many requests are in flight at once, each from its own
	// goroutine that sends the next request when the last is answered.
	Callers int
	// Requests, when positive, is how many measured requests to send in
	// all; otherwise the run lasts Duration, and every caller sends at
	// least one request.
	Requests int
	Duration time.Duration
	// Warmup is a run of the same load before the measured one, whose
	// results are dropped.
	Warmup time.Duration
	// Timeout bounds each request (the context given to Call).
	Timeout time.Duration
	// Classify names a failure; nil counts every failure as Kind "error".
	Classify func(error) Failure
	// Progress, when set, is called every ProgressEvery (a second when 0)
	// during the measured run, from its own goroutine.
	Progress      func(Progress)
	ProgressEvery time.Duration
}

// Progress is the state of a measured run so far.
type Progress struct {
	Elapsed time.Duration
	// Done counts finished requests, answered or failed; Errors the failed.
	Done, Errors int64
	// Rate is the requests finished per second since the last report.
	Rate float64
}

// Result is what a measured run saw.
type Result struct {
	// Elapsed is from the first request sent to the last one finished.
	Elapsed time.Duration
	// Latencies are those of the answered requests, sorted.
	Latencies []time.Duration
	// Errors counts the failed requests by cause; Examples holds the first
	// error message seen for each cause.
	Errors   map[Failure]int
	Examples map[Failure]string
}

// OK is the number of answered requests.
func (r *Result) OK() int { return len(r.Latencies) }

// Failed is the number of failed requests.
func (r *Result) Failed() int {
	n := 0
	for _, c := range r.Errors {
		n += c
	}
	return n
}

// Rate is answered requests per second.
func (r *Result) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.OK()) / r.Elapsed.Seconds()
}

// Percentile is the nearest-rank percentile p (0 < p ≤ 100) of the
// answered requests' latencies, 0 when none was answered.
func (r *Result) Percentile(p float64) time.Duration {
	n := len(r.Latencies)
	if n == 0 {
		return 0
	}
	rank := int(math.Ceil(float64(n)*p/100)) - 1
	return r.Latencies[min(max(rank, 0), n-1)]
}

// Run runs the warm-up and then the measured load. When ctx ends (an
// interrupt) it stops sending, returns what was measured so far and ctx's
// error; requests cut short by that are not counted.
func Run(ctx context.Context, cfg Config, call Call) (*Result, error) {
	if cfg.Callers <= 0 {
		return nil, errors.New("load: Callers must be positive")
	}
	if cfg.Warmup > 0 {
		run(ctx, Config{Callers: cfg.Callers, Duration: cfg.Warmup, Timeout: cfg.Timeout, Classify: cfg.Classify}, call)
		if err := ctx.Err(); err != nil {
			return &Result{Errors: map[Failure]int{}, Examples: map[Failure]string{}}, err
		}
	}
	res := run(ctx, cfg, call)
	return res, ctx.Err()
}

// caller is one goroutine's share of a run, merged at the end.
type caller struct {
	lat      []time.Duration
	errors   map[Failure]int
	examples map[Failure]string
}

func run(ctx context.Context, cfg Config, call Call) *Result {
	classify := cfg.Classify
	if classify == nil {
		classify = func(error) Failure { return Failure{Kind: "error"} }
	}
	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = time.Minute
	}
	var (
		next, done, failed atomic.Int64
		wg                 sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(cfg.Duration)
	more := func(seq int) bool {
		if ctx.Err() != nil {
			return false
		}
		if cfg.Requests > 0 {
			return next.Add(1) <= int64(cfg.Requests)
		}
		return seq == 0 || time.Now().Before(deadline)
	}
	callers := make([]caller, cfg.Callers)
	for g := range callers {
		c := &callers[g]
		c.errors, c.examples = map[Failure]int{}, map[Failure]string{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := 0; more(seq); seq++ {
				rctx, cancel := context.WithTimeout(ctx, timeout)
				t0 := time.Now()
				err := call(rctx, g, seq)
				d := time.Since(t0)
				cancel()
				if err != nil {
					if ctx.Err() != nil {
						return // interrupted, not failed
					}
					f := classify(err)
					if c.errors[f]++; c.errors[f] == 1 {
						c.examples[f] = err.Error()
					}
					failed.Add(1)
				} else {
					c.lat = append(c.lat, d)
				}
				done.Add(1)
			}
		}()
	}
	finished, reported := make(chan struct{}), make(chan struct{})
	if cfg.Progress == nil {
		close(reported)
	} else {
		go func() {
			defer close(reported)
			every := cfg.ProgressEvery
			if every <= 0 {
				every = time.Second
			}
			tick := time.NewTicker(every)
			defer tick.Stop()
			last, lastAt := int64(0), start
			for {
				select {
				case <-finished:
					return
				case now := <-tick.C:
					d := done.Load()
					cfg.Progress(Progress{Elapsed: now.Sub(start), Done: d, Errors: failed.Load(),
						Rate: float64(d-last) / now.Sub(lastAt).Seconds()})
					last, lastAt = d, now
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(finished)
	<-reported // no progress line after the run

	res := &Result{Elapsed: elapsed, Errors: map[Failure]int{}, Examples: map[Failure]string{}}
	for _, c := range callers {
		res.Latencies = append(res.Latencies, c.lat...)
		for f, n := range c.errors {
			res.Errors[f] += n
			if _, ok := res.Examples[f]; !ok {
				res.Examples[f] = c.examples[f]
			}
		}
	}
	slices.Sort(res.Latencies)
	return res
}
