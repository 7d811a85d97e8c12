package reliability

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/activity"
	"agentmesh.dev/mesh/shared/broker"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/mailbox"
	"agentmesh.dev/mesh/shared/protocol"
)

// burstBrokerEnv names the data directory of the broker process
// TestBurstBrokerProcess runs for TestMailboxAndActivityUnderABurst.
const burstBrokerEnv = "MESH_BURST_BROKER_DIR"

// TestBurstBrokerProcess is not a test: it is the broker of the burst test,
// run in a process of its own (this test binary, started again) so that
// the heap the burst test measures is the workers', not the broker's, as
// in the cloud where the workers reach the NATS cluster over TCP. It
// prints its own live heap and goroutines every 250 ms, for the report,
// and serves until its standard input closes.
func TestBurstBrokerProcess(t *testing.T) {
	dir := os.Getenv(burstBrokerEnv)
	if dir == "" {
		t.Skip("the broker process of TestMailboxAndActivityUnderABurst")
	}
	trust, err := creds.Load(filepath.Join(dir, "keys"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := broker.Start(context.Background(), broker.Config{DataDir: dir, Trust: trust, Name: "burst"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown()
	fmt.Printf("broker-url %s\n", b.ClientURL())
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(done)
	}()
	for {
		select {
		case <-done:
			return
		case <-time.After(250 * time.Millisecond):
			s := burstMeasure()
			fmt.Printf("broker-heap %d %d\n", s.heap, s.goroutines)
		}
	}
}

// burstBrokerProc is the broker process as the test sees it.
type burstBrokerProc struct {
	url   string
	trust *creds.Trust
	mu    sync.Mutex
	peak  burstSample
}

func (b *burstBrokerProc) peakHeap() burstSample {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.peak
}

// burstBroker starts the broker process; it is stopped at cleanup.
func burstBroker(t *testing.T) *burstBrokerProc {
	t.Helper()
	dir := t.TempDir()
	trust, err := creds.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if err := trust.Save(filepath.Join(dir, "keys")); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestBurstBrokerProcess$")
	cmd.Env = append(os.Environ(), burstBrokerEnv+"="+dir)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close() // the broker stops when its input ends
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	b := &burstBrokerProc{trust: trust}
	urlc := make(chan string, 1)
	go func() {
		defer close(urlc)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			if u, ok := strings.CutPrefix(line, "broker-url "); ok {
				urlc <- u
			}
			var s burstSample
			if _, err := fmt.Sscanf(line, "broker-heap %d %d", &s.heap, &s.goroutines); err == nil {
				b.mu.Lock()
				b.peak.heap, b.peak.goroutines = max(b.peak.heap, s.heap), max(b.peak.goroutines, s.goroutines)
				b.mu.Unlock()
			}
		}
	}()
	select {
	case u, ok := <-urlc:
		if !ok {
			t.Fatal("the broker process ended before it was ready")
		}
		b.url = u
		return b
	case <-time.After(60 * time.Second):
		t.Fatal("the broker process was not ready after 60 s")
	}
	return nil
}

// connect opens a service connection to the broker process, as a worker
// in the cloud connects to the cluster. inbox is the reply prefix (the
// services' own, or a client's private one for a mailbox fetch).
func (b *burstBrokerProc) connect(t *testing.T, name string, inbox nats.Option) *nats.Conn {
	t.Helper()
	key, err := keys.Generate[keys.CredentialRole]()
	if err != nil {
		t.Fatal(err)
	}
	jwt, err := b.trust.MintUser(creds.UserSpec{PublicKey: key.Public(), Name: name, Kind: creds.KindService,
		Permissions: creds.ServicePermissions()})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(b.url, creds.UserCreds{JWT: jwt, Key: key}.NATSOption(), inbox, nats.Name(name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// burstPlan sizes the burst test. The steady rate, 300 messages a second
// on each path (500 with MESH_SOAK=1), is a few percent of the ~10,000
// mesh calls a second one meshd carries on a 2-core machine
// (docs/performance.md): every call a node answers puts one respond on its
// agent's outbox (the activity tap), and every message to an offline
// agent is one mailbox capture. The burst is ten times that on both paths
// at once, a third to a half of what the machine carries.
type burstPlan struct {
	steady              int // messages per second on each path
	steadyFor, burstFor time.Duration
	mailboxes           int // offline agents whose mail piles up
	performers          int // agents whose outboxes are tapped
	copies              int // of each worker, as in the cloud
}

func burstPlanFor() burstPlan {
	if crashSoak() {
		return burstPlan{steady: 500, steadyFor: 5 * time.Second, burstFor: 10 * time.Second, mailboxes: 400, performers: 200, copies: 2}
	}
	return burstPlan{steady: 300, steadyFor: time.Second, burstFor: 2 * time.Second, mailboxes: 60, performers: 50, copies: 2}
}

// The taps' limits in this test: smaller than the production defaults
// (activity.DefaultTapPending*), so that the bound below is tight, and
// still large enough that a tenfold burst fits without overflow.
const (
	burstTapMsgs  = 8192
	burstTapBytes = 8 << 20
)

// Generous sizes of what the buffers hold, for the bound: a message
// buffered by nats.go costs its payload plus the nats.Msg and its subject
// (~300 B); a timeline record awaiting its ack (its JSON body, the
// published message with its Nats-Msg-Id header, the ack future, the
// pending item and the answer it carries) at most 2 KiB; an envelope of
// this test at most 1 KiB.
const (
	burstMsgOverhead = 320
	burstRecordCost  = 2 << 10
	burstEnvelope    = 1 << 10
	// burstAckQueue is activity's ackQueue: records awaiting their ack,
	// one queue for records and one for answers recorded on their own.
	burstAckQueue = 4096
	// burstFetchBytes is what one mailbox fetch may send (maxFetchBytes);
	// a copy serves one fetch at a time and holds one message of it.
	burstFetchBytes = 4 << 20
	// burstRuntime covers the runtime's own growth (GC metadata, stacks).
	burstRuntime = 8 << 20
)

// burstBound is the most the test process's live heap may grow over its
// baseline, from the configured limits: per activity copy, two taps at
// their pending limits and two ack queues full; per mailbox copy, one
// fetch; per draining agent, one fetch's channel full.
func burstBound(plan burstPlan) uint64 {
	tap := uint64(burstTapBytes + burstTapMsgs*burstMsgOverhead)
	acks := uint64(2*burstAckQueue+4) * burstRecordCost
	activityCopy := 2*tap + acks
	mailboxCopy := uint64(burstFetchBytes)
	drainer := uint64(mailbox.MaxFetch+2) * (burstEnvelope + burstMsgOverhead)
	return uint64(plan.copies)*(activityCopy+mailboxCopy) + uint64(plan.mailboxes)*drainer + burstRuntime
}

// burstSample is one measurement of a process.
type burstSample struct {
	heap       uint64 // live heap after a GC
	goroutines int
}

func burstMeasure() burstSample {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return burstSample{heap: ms.HeapAlloc, goroutines: runtime.NumGoroutine()}
}

// burstGoroutineSlack is how many more goroutines than at the baseline the
// process may run once the backlog has drained: timers and connection
// housekeeping come and go, a goroutine per message or per agent does not.
const burstGoroutineSlack = 8

// TestMailboxAndActivityUnderABurst runs copies of the mailbox and activity
// workers against a broker in another process, sends a steady rate of
// mail to offline agents and of answers on agent outboxes, then ten times
// that rate, while agents drain their mailboxes as nodes do. It measures
// the process's live heap and goroutines during and after, and checks that
// the heap stays under the bound the workers' configured limits set, that
// the goroutines come back to where they were, and that the backlog
// drains: every captured message fetched once and deleted, every tapped
// answer recorded and counted, none dropped.
func TestMailboxAndActivityUnderABurst(t *testing.T) {
	plan := burstPlanFor()
	b := burstBroker(t)
	servicesKey, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	var taps []*activity.Worker
	for i := range plan.copies {
		env := func(name string) bus.Env {
			return bus.Env{NC: b.connect(t, fmt.Sprintf("%s-%d", name, i), creds.ServiceInbox()), Key: servicesKey,
				Log: slog.New(slog.DiscardHandler), Now: time.Now}
		}
		mw, err := mailbox.Start(ctx, env("mailbox"), mailbox.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = mw.Stop() })
		aw, err := activity.Start(ctx, env("activity"), activity.Config{TapPendingMsgs: burstTapMsgs, TapPendingBytes: burstTapBytes})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = aw.Stop() })
		taps = append(taps, aw)
	}
	js, err := jetstream.New(b.connect(t, "test-admin", creds.ServiceInbox()))
	if err != nil {
		t.Fatal(err)
	}

	// Everything the senders will send, signed before anything is measured:
	// a warm-up of one message per agent, then the steady rate, then the
	// burst.
	warm := max(plan.mailboxes, plan.performers)
	total := warm + plan.steady*int(plan.steadyFor/time.Second) + 10*plan.steady*int(plan.burstFor/time.Second)
	mail, mailTo := burstMail(t, plan, total)
	answers, performers := burstAnswers(t, plan, total)

	// Agents drain their mailboxes as nodes do: fetch, handle, ack.
	drained := newBurstDrain()
	dctx, stopDrain := context.WithCancel(ctx)
	var dwg sync.WaitGroup
	client := b.connect(t, "drainer", creds.PrivateInbox("Uburst"))
	for _, a := range mailTo {
		dwg.Add(1)
		go func() {
			defer dwg.Done()
			drained.drain(dctx, client, a)
		}()
	}
	defer func() { stopDrain(); dwg.Wait() }()

	pub := b.connect(t, "senders", creds.ServiceInbox())
	sent := 0
	send := func(n int) {
		for end := sent + n; sent < end; sent++ {
			if err := pub.Publish(mail[sent].subject, mail[sent].data); err != nil {
				t.Fatal(err)
			}
			if err := pub.Publish(answers[sent].subject, answers[sent].data); err != nil {
				t.Fatal(err)
			}
		}
	}
	// sendAt sends at rate for d, catching up every 5 ms.
	sendAt := func(rate int, d time.Duration) {
		phase, n0 := time.Now(), sent
		for {
			el := min(time.Since(phase), d)
			send(n0 + int(float64(rate)*el.Seconds()) - sent)
			if el == d {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// waitDrained waits until the first n messages of each path are
	// through: fetched, and recorded (two items an answer: the request and
	// the answer it carries) or counted as lost.
	waitDrained := func(n int) {
		deadline := time.Now().Add(3 * time.Minute) // a hang guard, not a timing
		for {
			s := burstTapStats(taps)
			got := drained.count()
			if got >= n && s.Recorded+s.Duplicates+s.Dropped+2*s.Overflow >= 2*uint64(n) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("no drain: %d of %d mails fetched; taps %+v for %d answers", got, n, s, n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	// The warm-up makes every connection's lazily made subscriptions (reply
	// muxes, the timeline's ack subscription) before the baseline.
	send(warm)
	waitDrained(warm)
	base := burstMeasure()
	bound := burstBound(plan)
	t.Logf("baseline: heap %.1f MiB, %d goroutines; bound on growth from the configured limits %.1f MiB", burstMiB(base.heap), base.goroutines, burstMiB(bound))

	var peak burstSample
	var peakMu sync.Mutex
	sctx, stopSampling := context.WithCancel(ctx)
	var swg sync.WaitGroup
	swg.Add(1)
	go func() {
		defer swg.Done()
		for {
			s := burstMeasure()
			peakMu.Lock()
			peak.heap, peak.goroutines = max(peak.heap, s.heap), max(peak.goroutines, s.goroutines)
			peakMu.Unlock()
			select {
			case <-sctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()

	start := time.Now()
	sendAt(plan.steady, plan.steadyFor)
	steadyAt := time.Now()
	sendAt(10*plan.steady, plan.burstFor)
	if err := pub.Flush(); err != nil {
		t.Fatal(err)
	}
	sentAt := time.Now()
	waitDrained(total)
	drainedAt := time.Now()
	stopSampling()
	swg.Wait()
	after := burstMeasure()
	bp := b.peakHeap()
	t.Logf("sent %d mails and %d answers after the warm-up: %d/s for %s, then %d/s for %s (sent by %s); backlog drained %s after the last send",
		total-warm, total-warm, plan.steady, steadyAt.Sub(start).Round(time.Millisecond), 10*plan.steady, plan.burstFor,
		sentAt.Sub(start).Round(time.Millisecond), drainedAt.Sub(sentAt).Round(time.Millisecond))
	t.Logf("test process: peak heap %.1f MiB (+%.1f MiB over the baseline, bound %.1f MiB), peak %d goroutines (+%d); after the drain %.1f MiB, %d goroutines (%+d)",
		burstMiB(peak.heap), burstMiB(peak.heap)-burstMiB(base.heap), burstMiB(bound), peak.goroutines, peak.goroutines-base.goroutines,
		burstMiB(after.heap), after.goroutines, after.goroutines-base.goroutines)
	t.Logf("broker process (not bounded here: the mail waits on its disk): peak heap %.1f MiB, %d goroutines", burstMiB(bp.heap), bp.goroutines)

	if len(drained.errs) > 0 {
		t.Logf("fetches and acks that failed and were tried again: %v", drained.errs)
	}
	if peak.heap > base.heap+bound {
		t.Errorf("the live heap grew %.1f MiB over its baseline during the burst, more than the %.1f MiB the configured limits allow",
			burstMiB(peak.heap-base.heap), burstMiB(bound))
	}
	if after.goroutines > base.goroutines+burstGoroutineSlack {
		t.Errorf("%d goroutines after the drain, %d before the burst: more than %d left over", after.goroutines, base.goroutines, burstGoroutineSlack)
	}
	s := burstTapStats(taps)
	if s.Recorded != 2*uint64(total) || s.Duplicates != 0 || s.Dropped != 0 || s.Overflow != 0 {
		t.Errorf("taps %+v; want %d items recorded and nothing duplicated, dropped or overflowed", s, 2*total)
	}
	if err := drained.check(mail); err != nil {
		t.Error(err)
	}
	st, err := js.Stream(ctx, protocol.MailboxStream)
	if err != nil {
		t.Fatal(err)
	}
	// The last acks may still be on their way when the last fetch is in.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("the mailbox stream still holds %d messages after the drain; drain errors %v", info.State.Msgs, drained.errs)
			break
		}
	}
	tl, err := js.Stream(ctx, activity.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := tl.Info(ctx); err != nil || info.State.Msgs != uint64(total) {
		t.Errorf("the timeline holds %d records, want %d (%v)", info.State.Msgs, total, err)
	}
	burstCheckUsage(t, js, performers, total)
}

func burstMiB(b uint64) float64 { return float64(b) / (1 << 20) }

// burstMsg is one prepared publish.
type burstMsg struct {
	subject string
	data    []byte
	id      string
}

// burstMail prepares n signed requests to plan.mailboxes offline agents.
func burstMail(t *testing.T, plan burstPlan, n int) ([]burstMsg, []*keys.Agent) {
	t.Helper()
	sender := burstAgent(t)
	to := make([]*keys.Agent, plan.mailboxes)
	for i := range to {
		to[i] = burstAgent(t)
	}
	out := make([]burstMsg, n)
	for i := range out {
		a := to[i%len(to)]
		e, err := protocol.New(protocol.TypeRequest, sender.Public(), map[string]any{"offering": "chat",
			"input": map[string]any{"text": fmt.Sprintf("burst %d", i)}})
		if err != nil {
			t.Fatal(err)
		}
		e.To = a.Public()
		out[i] = burstMsg{subject: protocol.InboxSubject(a.Public()), data: burstSign(t, e, sender), id: e.ID}
	}
	return out, to
}

// burstAnswers prepares n signed answers of plan.performers agents on
// their outboxes, each to a request of its own.
func burstAnswers(t *testing.T, plan burstPlan, n int) ([]burstMsg, []*keys.Agent) {
	t.Helper()
	requester := burstAgent(t)
	perf := make([]*keys.Agent, plan.performers)
	for i := range perf {
		perf[i] = burstAgent(t)
	}
	out := make([]burstMsg, n)
	for i := range out {
		p := perf[i%len(perf)]
		e, err := protocol.New(protocol.TypeRespond, p.Public(), map[string]any{"status": "completed",
			"output": map[string]any{"text": "done"}})
		if err != nil {
			t.Fatal(err)
		}
		e.To, e.InReplyTo = requester.Public(), protocol.NewID()
		out[i] = burstMsg{subject: protocol.OutboxSubject(p.Public()), data: burstSign(t, e, p), id: e.ID}
	}
	return out, perf
}

func burstAgent(t *testing.T) *keys.Agent {
	t.Helper()
	k, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func burstSign(t *testing.T, e *protocol.Envelope, k *keys.Agent) []byte {
	t.Helper()
	if err := e.Sign(k); err != nil {
		t.Fatal(err)
	}
	data, err := e.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// burstTapStats sums the taps' counters over the copies.
func burstTapStats(ws []*activity.Worker) activity.Stats {
	var s activity.Stats
	for _, w := range ws {
		x := w.Stats()
		s.Recorded += x.Recorded
		s.Duplicates += x.Duplicates
		s.Dropped += x.Dropped
		s.Accepts += x.Accepts
		s.Overflow += x.Overflow
	}
	return s
}

// burstCheckUsage waits for the counters (written every 250 ms) to add up
// to one message in and one out per answer.
func burstCheckUsage(t *testing.T, js jetstream.JetStream, performers []*keys.Agent, total int) {
	t.Helper()
	kv, err := js.KeyValue(t.Context(), activity.UsageBucket)
	if err != nil {
		t.Fatal(err)
	}
	var in, out int64
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		in, out = 0, 0
		for _, p := range performers {
			u, found, err := bus.GetJSON[activity.Usage](t.Context(), kv, p.Public())
			if err != nil {
				t.Fatal(err)
			}
			if found {
				in, out = in+u.MessagesIn, out+u.MessagesOut
			}
		}
		if in == int64(total) && out == int64(total) {
			return
		}
	}
	t.Errorf("usage counters: %d in, %d out; want %d each", in, out, total)
}

// burstDrain is what the agents fetched.
type burstDrain struct {
	mu   sync.Mutex
	ids  map[string]int // envelope id → times fetched
	errs map[string]int // failed fetches and acks, by error
	// unacked are ids whose ack failed: a later fetch may read them again.
	unacked map[string]bool
	// timeout bounds each fetch and each ack (15 s, as adapter/node).
	timeout time.Duration
}

func newBurstDrain() *burstDrain {
	return &burstDrain{ids: map[string]int{}, errs: map[string]int{}, unacked: map[string]bool{}, timeout: 15 * time.Second}
}

func (d *burstDrain) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.ids)
}

// drain is one agent's node, as adapter/node drains: fetch, handle, ack
// (each within d.timeout); a failed ack leaves the mail for the next fetch, which then
// reads it again. When the box is empty it waits a little (a node drains
// on a timer and at reconnect), within the mailbox's 60 fetches per agent
// in 10 s.
func (d *burstDrain) drain(ctx context.Context, nc *nats.Conn, a *keys.Agent) {
	var after uint64
	for ctx.Err() == nil {
		fctx, cancel := context.WithTimeout(ctx, d.timeout)
		msgs, res, err := mailbox.Fetch(fctx, nc, a, after, mailbox.MaxFetch)
		cancel()
		if err == nil && len(msgs) > 0 {
			ids := make([]string, 0, len(msgs))
			for _, m := range msgs {
				if e, derr := protocol.Decode(m.Data); derr == nil {
					ids = append(ids, e.ID)
				}
			}
			actx, cancel := context.WithTimeout(ctx, d.timeout)
			err = mailbox.Ack(actx, nc, a, res.Box, res.Last+1, nil)
			cancel()
			d.mu.Lock()
			for _, id := range ids {
				d.ids[id]++
				if err != nil {
					d.unacked[id] = true // read again by the next fetch
				}
			}
			d.mu.Unlock()
			if err == nil {
				after = res.Last
			}
		}
		if err != nil && ctx.Err() == nil {
			d.mu.Lock()
			d.errs[err.Error()]++
			d.mu.Unlock()
		}
		var wait time.Duration
		switch e := (*errs.Error)(nil); {
		case err != nil && errors.As(err, &e) && e.RetryAfterMS > 0:
			wait = time.Duration(e.RetryAfterMS) * time.Millisecond
		case err != nil, len(msgs) == 0:
			wait = 300 * time.Millisecond
		case !res.More:
			wait = 50 * time.Millisecond
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}

// failures counts the fetches and acks that failed.
func (d *burstDrain) failures() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, c := range d.errs {
		n += c
	}
	return n
}

// check reports mail never fetched, or fetched again though its first
// fetch was acknowledged.
func (d *burstDrain) check(sent []burstMsg) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var missing, twice int
	for _, m := range sent {
		switch n := d.ids[m.id]; {
		case n == 0:
			missing++
		case n > 1 && !d.unacked[m.id]:
			twice++
		}
	}
	if missing > 0 || twice > 0 || len(d.ids) != len(sent) {
		return fmt.Errorf("mailboxes: %d of %d mails never fetched, %d fetched again after an acknowledged ack, %d distinct fetched", missing, len(sent), twice, len(d.ids))
	}
	return nil
}
