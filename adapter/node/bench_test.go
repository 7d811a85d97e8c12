package node_test

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/adapter/node"
	"agentmesh.dev/mesh/devenv"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/mailbox"
	"agentmesh.dev/mesh/shared/protocol"
)

// benchMesh is a real mesh with every worker, and two nodes: A calls, B
// answers "echo".
type benchMesh struct {
	m      *devenv.Mesh
	a, b   *node.Agent
	ka, kb *keys.Agent
}

func startBenchMesh(b *testing.B, edit ...func(*devenv.Config)) *benchMesh {
	b.Helper()
	ob, _ := mail.NewOutbox(b.TempDir(), slog.New(slog.DiscardHandler))
	cfg := devenv.Config{DataDir: b.TempDir(), Mail: ob}
	for _, f := range edit {
		f(&cfg)
	}
	m, err := devenv.Start(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = m.Close() })
	bm := &benchMesh{m: m}
	host := func(handler node.Handler) (*node.Agent, *keys.Agent) {
		nk, _ := keys.Generate[keys.NodeRole]()
		ak, _ := keys.Generate[keys.AgentRole]()
		ids := []string{ak.Public()}
		jwtStr, err := m.Trust().MintUser(creds.UserSpec{PublicKey: nk.Public(), Kind: creds.KindNode, Hosted: ids,
			Permissions: creds.NodePermissions(ids, creds.PrivateOnly(nk.Public())), Expires: time.Now().Add(time.Hour)})
		if err != nil {
			b.Fatal(err)
		}
		n, err := node.Start(context.Background(), node.Config{NATSURL: m.URLs().MeshTCP, NodeKey: nk,
			Credential: node.Credential{JWT: jwtStr, Sign: nk.SignNonce}})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { n.Close() })
		ag, err := n.Host(context.Background(), node.AgentConfig{Key: ak, Name: "bench", AvailabilityClass: "always_on",
			Offerings: []node.Offering{{ID: "echo", Name: "Echo"}}, Handler: handler})
		if err != nil {
			b.Fatal(err)
		}
		return ag, ak
	}
	bm.b, bm.kb = host(func(ctx context.Context, c *node.Call) error {
		return c.Reply(map[string]any{"text": "ok"})
	})
	bm.a, bm.ka = host(func(ctx context.Context, c *node.Call) error { return c.Reply(nil) })
	return bm
}

// latencies runs fn sequentially and reports p50/p99 in µs.
func latencies(b *testing.B, fn func() error) {
	var ds []time.Duration
	for b.Loop() {
		t0 := time.Now()
		if err := fn(); err != nil {
			b.Fatal(err)
		}
		ds = append(ds, time.Since(t0))
	}
	slices.Sort(ds)
	b.ReportMetric(float64(ds[len(ds)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(ds[len(ds)*99/100].Microseconds()), "p99-µs")
}

// throughput runs fn from 64 goroutines and reports requests per second.
func throughput(b *testing.B, fn func() error) {
	const callers = 64
	n := b.N
	var wg sync.WaitGroup
	work := make(chan struct{}, n)
	for range n {
		work <- struct{}{}
	}
	close(work)
	b.ResetTimer()
	t0, cpu0 := time.Now(), cpuTime()
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range work {
				if err := fn(); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(n)/time.Since(t0).Seconds(), "req/s")
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(n), "cpu-µs/req")
}

// cpuTime is the CPU time this process has used (user and system): per
// request, it is what a call costs whatever else the machine is doing.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkRequest compares, in one run: raw NATS request-reply; the same
// with a signed envelope each way (sign, verify, sign, verify); and the
// full mesh request (pre-flight, sign, the receiver's whole decode order,
// the accept, the handler, the signed respond, the outbox copy, the caller
// correlating both).
func BenchmarkRequest(b *testing.B) {
	bm := startBenchMesh(b)
	svc, err := bm.m.ConnectService("bench-raw")
	if err != nil {
		b.Fatal(err)
	}
	defer svc.Close()
	rawSrv, err := bm.m.ConnectService("bench-raw-server")
	if err != nil {
		b.Fatal(err)
	}
	defer rawSrv.Close()
	if _, err := rawSrv.Subscribe("bench.raw", func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
		b.Fatal(err)
	}
	if _, err := rawSrv.Subscribe("bench.signed", func(m *nats.Msg) {
		req, err := protocol.Decode(m.Data)
		if err != nil {
			return
		}
		rep, _ := protocol.NewReply(req, bm.kb.Public(), map[string]any{"status": "completed", "output": map[string]any{"text": "ok"}})
		_ = rep.Sign(bm.kb)
		out, _ := rep.Marshal()
		_ = m.Respond(out)
	}); err != nil {
		b.Fatal(err)
	}
	_ = rawSrv.Flush()
	payload := map[string]any{"offering": "echo", "input": map[string]any{"text": "hello mesh"}}
	raw := func() error {
		_, err := svc.Request("bench.raw", []byte(`{"offering":"echo","input":{"text":"hello mesh"}}`), 5*time.Second)
		return err
	}
	signed := func() error {
		req, err := protocol.New(protocol.TypeRequest, bm.ka.Public(), payload)
		if err != nil {
			return err
		}
		_ = req.Sign(bm.ka)
		data, _ := req.Marshal()
		msg, err := svc.Request("bench.signed", data, 5*time.Second)
		if err != nil {
			return err
		}
		_, err = protocol.Decode(msg.Data)
		return err
	}
	mesh := func() error {
		res, err := bm.a.Request(context.Background(), bm.b.ID(), "echo", map[string]any{"text": "hello mesh"}, node.RequestOptions{Timeout: 10 * time.Second})
		if err != nil {
			return err
		}
		if res.Status != "completed" {
			b.Fatalf("status %q", res.Status)
		}
		return nil
	}
	// The table once per Ed25519 implementation (keys.SetVerifier: voi,
	// the default, and the standard library, which signs too), so the gain
	// of each change shows against the same baselines in one run.
	for _, v := range []keys.Verifier{keys.Voi, keys.StdLib} {
		b.Run(v.String(), func(b *testing.B) {
			defer keys.SetVerifier(keys.SetVerifier(v))
			b.Run("raw_nats/sequential", func(b *testing.B) { latencies(b, raw) })
			b.Run("signed_raw/sequential", func(b *testing.B) { latencies(b, signed) })
			b.Run("mesh/sequential", func(b *testing.B) { latencies(b, mesh) })
			b.Run("raw_nats/64_callers", func(b *testing.B) { throughput(b, raw) })
			b.Run("signed_raw/64_callers", func(b *testing.B) { throughput(b, signed) })
			b.Run("mesh/64_callers", func(b *testing.B) { throughput(b, mesh) })
		})
	}
}

// BenchmarkRequestStored is the mesh request with every inbox message kept
// by the mailbox stream: no per-agent cap, and no drain during the run. With
// the default cap (256 messages an agent) a busy agent's box fills within a
// second and the stream refuses the rest cheaply, so BenchmarkRequest
// measures the steady state of a busy mesh; this one measures the stream
// writes themselves — the request in the performer's box and, for protocol
// 0.3 (answers at the requester's inbox), the accept and the answer in the
// requester's (docs/protocol.md "0.2 and 0.3 peers").
func BenchmarkRequestStored(b *testing.B) {
	bm := startBenchMesh(b, func(c *devenv.Config) {
		c.Workers.Mailbox.Limits = mailbox.DefaultLimits
		c.Workers.Mailbox.Limits.MaxMsgsPerAgent = 1 << 30
	})
	svc, err := bm.m.ConnectService("bench-stream")
	if err != nil {
		b.Fatal(err)
	}
	defer svc.Close()
	js, err := jetstream.New(svc)
	if err != nil {
		b.Fatal(err)
	}
	stored := func() uint64 {
		st, err := js.Stream(context.Background(), protocol.MailboxStream)
		if err != nil {
			b.Fatal(err)
		}
		info, err := st.Info(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		return info.State.Msgs
	}
	var calls atomic.Int64
	mesh := func() error {
		calls.Add(1)
		_, err := bm.a.Request(context.Background(), bm.b.ID(), "echo", map[string]any{"text": "hello mesh"}, node.RequestOptions{Timeout: 10 * time.Second})
		return err
	}
	run := func(b *testing.B, f func(*testing.B, func() error)) {
		before, n := stored(), calls.Load()
		f(b, mesh)
		b.ReportMetric(float64(stored()-before)/float64(calls.Load()-n), "stored/req")
	}
	b.Run("sequential", func(b *testing.B) { run(b, latencies) })
	b.Run("64_callers", func(b *testing.B) { run(b, throughput) })
}
