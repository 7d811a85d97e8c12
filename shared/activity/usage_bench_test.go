package activity_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/activity"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/bus/bustest"
)

// BenchmarkUsageFlush compares the two ways of writing usage counters
// (DESIGN §5: "usage may use orbit.go counters if a benchmark shows it
// beats the compare-and-set flush"). One operation is one flush round: 3
// copies each write their deltas for the same 100 agents at once, as the
// activity worker's copies do every 250 ms.
//
//   - cas: today's flush, one bus.CAS per agent of the JSON value (read,
//     then write at the revision; a copy that lost re-reads).
//   - counters-sync: a server-side counter stream (AllowMsgCounter), one
//     acknowledged publish with a Nats-Incr header per counter (in, out,
//     errors: three per agent), which is what orbit.go counters' AddInt does.
//   - counters-async: the same publishes pipelined, then every ack awaited.
//
// Counters hold integers only: first_seen and last_active would still need
// a key-value write, which the counters variants leave out (so they are
// flattered here).
func BenchmarkUsageFlush(b *testing.B) {
	const agents, copies = 100, 3
	m := bustest.Start(b)
	nc := bustest.Client(b, m)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	ids := make([]string, agents)
	for i := range ids {
		ids[i] = bustest.Agent(b).Public()
	}
	conns := make([]jetstream.JetStream, copies)
	for i := range conns {
		c, err := m.ConnectService(fmt.Sprintf("copy-%d", i))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(c.Close)
		if conns[i], err = jetstream.New(c); err != nil {
			b.Fatal(err)
		}
	}
	round := func(b *testing.B, flush func(ctx context.Context, js jetstream.JetStream) error) {
		for b.Loop() {
			var wg sync.WaitGroup
			errs := make(chan error, copies)
			for _, c := range conns {
				wg.Go(func() { errs <- flush(ctx, c) })
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/float64(agents*copies), "µs/agent-flush")
	}

	b.Run("cas", func(b *testing.B) {
		if _, err := bus.Bucket(ctx, js, jetstream.KeyValueConfig{Bucket: "bench_usage"}); err != nil {
			b.Fatal(err)
		}
		kvs := make([]jetstream.KeyValue, copies)
		for i, c := range conns {
			if kvs[i], err = c.KeyValue(ctx, "bench_usage"); err != nil {
				b.Fatal(err)
			}
		}
		now := time.Now().UTC().Format(time.RFC3339)
		idx := map[jetstream.JetStream]int{}
		for i, c := range conns {
			idx[c] = i
		}
		round(b, func(ctx context.Context, c jetstream.JetStream) error {
			kv := kvs[idx[c]]
			for _, a := range ids {
				_, _, err := bus.CAS(ctx, kv, a, func(cur *activity.Usage, exists bool) (*activity.Usage, error) {
					u := activity.Usage{Agent: a, FirstSeen: now, LastActive: now}
					if exists {
						u = *cur
					}
					u.MessagesIn++
					u.MessagesOut++
					u.LastActive = now
					return &u, nil
				})
				if err != nil {
					return err
				}
			}
			return nil
		})
	})

	counterStream := func(b *testing.B, name string) {
		if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"},
			AllowMsgCounter: true, AllowDirect: true, Storage: jetstream.FileStorage}); err != nil {
			b.Skipf("SKIPPED, NOT MEASURED: the broker refuses a counter stream: %v", err)
		}
	}
	incr := func(subject string) *nats.Msg {
		msg := nats.NewMsg(subject)
		msg.Header.Set("Nats-Incr", strconv.Itoa(1))
		return msg
	}
	b.Run("counters-sync", func(b *testing.B) {
		counterStream(b, "BENCH_COUNTERS_SYNC")
		round(b, func(ctx context.Context, c jetstream.JetStream) error {
			for _, a := range ids {
				for _, k := range []string{"in", "out", "errors"} {
					if _, err := c.PublishMsg(ctx, incr("BENCH_COUNTERS_SYNC."+a+"."+k)); err != nil {
						return err
					}
				}
			}
			return nil
		})
	})
	b.Run("counters-async", func(b *testing.B) {
		counterStream(b, "BENCH_COUNTERS_ASYNC")
		round(b, func(ctx context.Context, c jetstream.JetStream) error {
			futs := make([]jetstream.PubAckFuture, 0, 3*agents)
			for _, a := range ids {
				for _, k := range []string{"in", "out", "errors"} {
					f, err := c.PublishMsgAsync(incr("BENCH_COUNTERS_ASYNC." + a + "." + k))
					if err != nil {
						return err
					}
					futs = append(futs, f)
				}
			}
			for _, f := range futs {
				select {
				case <-f.Ok():
				case err := <-f.Err():
					return err
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		})
	})
}
