package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/cmd/meshbench/internal/load"
	"agentmesh.dev/mesh/cmd/meshbench/internal/report"
	"agentmesh.dev/mesh/shared/broker"
)

const (
	phaseBefore = iota // all servers up
	phaseDuring        // one server killed, until it is back
	phaseAfter         // the server restarted
)

// Phases of a failover run, by the time a request was sent.

var phaseNames = []string{"before", "during", "after"}

// failover kills one server of the target's cluster during a row's
// measured run and starts it again: it counts what finished in each
// phase, and runs beside the load a writer of acknowledged JetStream
// publishes on an R3 stream, each read back once the cluster is whole, so
// a lost acknowledged message shows.
type failover struct {
	t                  *target
	killAfter, downFor time.Duration
	classify           func(error) load.Failure
	progress           io.Writer

	phase atomic.Int32
	mu    sync.Mutex
	ok    [3]int
	fails [3]map[load.Failure]int
	first map[load.Failure]string
	at    [4]time.Time // start, kill, back, end
}

func newFailover(t *target, o options, progress io.Writer) *failover {
	return &failover{t: t, killAfter: o.killAfter, downFor: o.downFor, classify: classify, progress: progress}
}

// wrap counts each request in the phase it was sent in: one that fails
// does so at its timeout, often a phase later than what made it fail.
func (f *failover) wrap(call load.Call) load.Call {
	return func(ctx context.Context, g, seq int) error {
		ph := f.phase.Load()
		err := call(ctx, g, seq)
		f.mu.Lock()
		defer f.mu.Unlock()
		if err == nil {
			f.ok[ph]++
			return nil
		}
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			return err
		}
		fl := f.classify(err)
		if f.fails[ph] == nil {
			f.fails[ph] = map[load.Failure]int{}
		}
		if f.fails[ph][fl]++; f.first == nil {
			f.first = map[load.Failure]string{}
		}
		if _, ok := f.first[fl]; !ok {
			f.first[fl] = err.Error()
		}
		return err
	}
}

// run measures one row: the load (cfg, without warm-up) with the kill and
// the restart beside it, then the writes read back. It returns the load's
// result and the row's failover section.
func (f *failover) run(ctx context.Context, name string, cfg load.Config, call load.Call) (*load.Result, *report.Failover, error) {
	c := f.t.cluster
	nc, err := f.t.connectService("meshbench-writes")
	if err != nil {
		return nil, nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, nil, err
	}
	// Whole before the row starts: the previous row's restart may still be
	// catching up.
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	_, err = broker.WaitReplicated(wctx, js)
	cancel()
	if err != nil {
		return nil, nil, fmt.Errorf("the cluster is not fully replicated before the %s row: %w", name, err)
	}
	w, err := newWriter(ctx, js)
	if err != nil {
		return nil, nil, err
	}
	defer w.remove()

	victim, err := broker.MostLeading(ctx, js, c)
	if err != nil {
		return nil, nil, err
	}
	fo := &report.Failover{Server: c.ServerName(victim), KillAfter: report.Duration(f.killAfter), DownFor: report.Duration(f.downFor)}

	stopWrites := make(chan struct{})
	wroteDone := make(chan struct{})
	go func() { defer close(wroteDone); w.run(stopWrites, &f.phase) }()

	killed := make(chan error, 1)
	// Once the server is back, how long until every stream has its three
	// replicas current again: watched while the load goes on.
	replicated := make(chan time.Time, 1)
	f.at[0] = time.Now()
	go func() {
		err := f.killAndRestart(ctx, victim)
		killed <- err
		if err != nil {
			return
		}
		wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		if _, err := broker.WaitReplicated(wctx, js); err == nil {
			replicated <- time.Now()
		}
		close(replicated)
	}()
	res, runErr := load.Run(ctx, cfg, f.wrap(call))
	f.at[3] = time.Now()
	if err := <-killed; err != nil {
		close(stopWrites)
		<-wroteDone
		return res, nil, err
	}
	close(stopWrites)
	<-wroteDone

	fmt.Fprintf(f.progress, "%s: waiting for every stream to have its three replicas current again\n", name)
	at, ok := <-replicated
	if !ok {
		return res, nil, errors.New("the cluster did not return to full replication within 2 minutes of the restart")
	}
	fo.ReplicatedAfter = report.Seconds(at.Sub(f.at[2]))
	acked, lost, err := w.verify(ctx)
	if err != nil {
		return res, nil, err
	}
	fo.Writes = report.Writes{Stream: w.stream, Acked: acked, Lost: lost, Failed: w.failed}
	for ph := range phaseNames {
		end := f.at[ph+1]
		if end.IsZero() || end.Before(f.at[ph]) {
			end = f.at[3]
		}
		elapsed := end.Sub(f.at[ph])
		p := report.Phase{Name: phaseNames[ph], Elapsed: report.Seconds(elapsed), OK: f.ok[ph], WritesAcked: w.ackedIn[ph]}
		for fl, n := range f.fails[ph] {
			p.Errors += n
			key, m := fl.Kind, &p.ErrorsByKind
			if fl.Code != "" {
				key, m = fl.Code, &p.ErrorsByCode
			}
			if *m == nil {
				*m = map[string]int{}
			}
			(*m)[key] += n
		}
		if elapsed > 0 {
			p.ReqPerSec = float64(int(float64(p.OK)/elapsed.Seconds()*10)) / 10
		}
		fo.Phases = append(fo.Phases, p)
	}
	return res, fo, runErr
}

// killAndRestart kills the member after killAfter, starts it again downFor
// later, and marks the phases.
func (f *failover) killAndRestart(ctx context.Context, victim int) error {
	c := f.t.cluster
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(f.killAfter):
	}
	if err := c.Kill(victim); err != nil {
		return err
	}
	f.at[1] = time.Now()
	f.phase.Store(phaseDuring)
	fmt.Fprintf(f.progress, "killed %s\n", c.ServerName(victim))
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(f.downFor):
	}
	if err := c.Restart(ctx, victim); err != nil {
		return fmt.Errorf("restart %s: %w", c.ServerName(victim), err)
	}
	f.at[2] = time.Now()
	f.phase.Store(phaseAfter)
	fmt.Fprintf(f.progress, "restarted %s\n", c.ServerName(victim))
	return nil
}

// writer publishes numbered messages to an R3 stream of its own, one at a
// time, and keeps every one the stream acknowledged.
type writer struct {
	js      jetstream.JetStream
	stream  string
	subject string
	mu      sync.Mutex
	acked   map[uint64]string // sequence → body
	ackedIn [3]int
	failed  int
}

func newWriter(ctx context.Context, js jetstream.JetStream) (*writer, error) {
	run := rand.Text()[:8]
	w := &writer{js: js, stream: "MESHBENCH_" + run, subject: "meshbench.writes." + run, acked: map[uint64]string{}}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(cctx, jetstream.StreamConfig{Name: w.stream, Subjects: []string{w.subject},
		Replicas: 3, Storage: jetstream.FileStorage}); err != nil {
		return nil, fmt.Errorf("create the writes stream: %w", err)
	}
	return w, nil
}

// run publishes until stop, each publish waiting for its acknowledgement
// (at most 2 s, then it counts as failed and the next one goes).
func (w *writer) run(stop <-chan struct{}, phase *atomic.Int32) {
	for n := 0; ; n++ {
		select {
		case <-stop:
			return
		default:
		}
		body := fmt.Sprintf("write %d", n)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		ack, err := w.js.Publish(ctx, w.subject, []byte(body), jetstream.WithMsgID(body))
		cancel()
		w.mu.Lock()
		if err != nil {
			w.failed++
		} else if !ack.Duplicate {
			w.acked[ack.Sequence] = body
			w.ackedIn[phase.Load()]++
		}
		w.mu.Unlock()
		if err != nil {
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// verify reads every acknowledged message back from the stream's leader.
func (w *writer) verify(ctx context.Context) (acked, lost int, err error) {
	st, err := w.js.Stream(ctx, w.stream)
	if err != nil {
		return 0, 0, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for seq, body := range w.acked {
		gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		m, err := st.GetMsg(gctx, seq)
		cancel()
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			lost++
		case err != nil:
			return 0, 0, fmt.Errorf("read back write %d: %w", seq, err)
		case string(m.Data) != body:
			lost++
		}
	}
	return len(w.acked), lost, nil
}

// remove deletes the stream.
func (w *writer) remove() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = w.js.DeleteStream(ctx, w.stream)
}

// reconnecting are the options of meshbench's own connections to a
// cluster: they move to another member when theirs goes.
func reconnecting() []nats.Option {
	return []nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(broker.ReconnectWait),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})}
}

// measure runs one row's warm-up, then its measured run with a server's
// loss and return (run); on the mesh row it also counts requests handled
// twice.
func (f *failover) measure(ctx context.Context, name string, cfg load.Config, b row) (*load.Result, *report.Failover, error) {
	if cfg.Warmup > 0 {
		if _, err := load.Run(ctx, load.Config{Callers: cfg.Callers, Duration: cfg.Warmup, Timeout: cfg.Timeout, Classify: cfg.Classify}, b.call); err != nil {
			return nil, nil, err
		}
	}
	cfg.Warmup = 0
	mr, _ := b.(*meshRow)
	if mr != nil {
		mr.track = &requestTrack{}
	}
	r := &failover{t: f.t, killAfter: f.killAfter, downFor: f.downFor, classify: f.classify, progress: f.progress}
	res, fo, err := r.run(ctx, name, cfg, b.call)
	if fo != nil && mr != nil {
		// Answers of requests the drain handled late are on their way; the
		// mesh row's nodes drain their mailboxes on reconnect and every
		// minute, and the counts below are of what arrived by now.
		fo.HandledTwice, fo.AnsweredUnhandled = mr.track.check()
	}
	return res, fo, err
}

// requestTrack counts, by request id, how often a responder handled a
// request and whether its caller got the answer.
type requestTrack struct {
	mu       sync.Mutex
	handled  map[string]int
	answered map[string]bool
}

func (r *requestTrack) handle(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.handled == nil {
		r.handled = map[string]int{}
	}
	r.handled[id]++
}

func (r *requestTrack) answer(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.answered == nil {
		r.answered = map[string]bool{}
	}
	r.answered[id] = true
}

// check counts requests handled more than once, and answered ones not
// handled exactly once.
func (r *requestTrack) check() (twice, unhandled int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, n := range r.handled {
		if n > 1 {
			twice++
		}
	}
	for id := range r.answered {
		if r.handled[id] != 1 {
			unhandled++
		}
	}
	return twice, unhandled
}
