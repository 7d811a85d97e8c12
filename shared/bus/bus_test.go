package bus_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/broker"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

func mesh(t *testing.T) *bustest.Bus {
	t.Helper()
	return bustest.Start(t)
}

func agent(t *testing.T) *keys.Agent {
	k, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// Three copies of a worker share one queue group: each request is answered
// exactly once, by a signed envelope in reply to it; an unsigned request
// never reaches a handler.
func TestEndpointCopiesAnswerOnce(t *testing.T) {
	m := mesh(t)
	svcKey := agent(t)
	var calls atomic.Int64
	for i := range 3 {
		nc, err := m.ConnectService("copy")
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		s, err := bus.NewService(bus.Config{Name: "echo", NC: nc, Key: svcKey})
		if err != nil {
			t.Fatal(err)
		}
		_ = i
		if err := s.Endpoint("echo", "mesh.test.echo", func(_ context.Context, r *bus.Request) (any, error) {
			calls.Add(1)
			if r.Object()["fail"] == true {
				return nil, errs.New(errs.NotFound, "nothing here")
			}
			return map[string]any{"status": "ok", "from": r.Env.From}, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	client, err := m.ConnectService("client")
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	caller := agent(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	for range 30 {
		rep, err := bus.Call(ctx, client, caller, "mesh.test.echo", protocol.TypeRequest, "", map[string]any{})
		if err != nil {
			t.Fatal(err)
		}
		if rep.From != svcKey.Public() {
			t.Fatalf("answer signed by %s", rep.From)
		}
	}
	if n := calls.Load(); n != 30 {
		t.Errorf("30 requests reached handlers %d times", n)
	}
	if _, err := bus.Call(ctx, client, caller, "mesh.test.echo", protocol.TypeRequest, "", map[string]any{"fail": true}); errs.CodeOf(err) != errs.NotFound {
		t.Errorf("handler error: %v", err)
	}
	// Unsigned: refused at decode, with the code, and no handler runs.
	before := calls.Load()
	msg, err := client.RequestWithContext(ctx, "mesh.test.echo", []byte(`{"v":"0.3.0","id":"x","type":"request","ts":"2026-01-01T00:00:00Z","from":"`+caller.Public()+`","trace":{"trace_id":"a","span_id":"b"},"payload":{}}`))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := protocol.Decode(msg.Data)
	if err != nil || bus.ErrorOf(rep) == nil || bus.ErrorOf(rep).Code != errs.IdentityMismatch {
		t.Errorf("unsigned request answered %v (%v)", rep, err)
	}
	if calls.Load() != before {
		t.Error("an unsigned request reached a handler")
	}
}

// Fifty copies racing to claim one key: exactly one changes it.
func TestCASOneWinner(t *testing.T) {
	m := mesh(t)
	nc, err := m.ConnectService("cas")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	kv, err := bus.Bucket(t.Context(), js, jetstream.KeyValueConfig{Bucket: "test_cas"})
	if err != nil {
		t.Fatal(err)
	}
	casRace(t, kv)
}

// The same races on an R3 bucket of a three-server cluster, where a lost
// compare-and-set is reported with another error code (10164) and a read
// may come from a follower a little behind.
func TestCASOneWinnerOnACluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-server cluster")
	}
	trust, err := creds.Generate()
	if err != nil {
		t.Fatal(err)
	}
	c, err := broker.StartCluster(t.Context(), broker.ClusterConfig{DataDir: t.TempDir(), Trust: trust, Name: "cas"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Shutdown()
	nc, err := c.ConnectService("cas")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	kv, err := bus.Bucket(t.Context(), js, jetstream.KeyValueConfig{Bucket: "test_cas", Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	// What the two codes look like, as the broker sends them.
	if _, err := kv.Create(t.Context(), "k", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(t.Context(), "k", []byte("2")); !bus.IsConflict(err) {
		t.Fatalf("a second create on R3: %v, not a conflict", err)
	}
	if _, err := kv.Update(t.Context(), "k", []byte("2"), 999); !bus.IsConflict(err) {
		t.Fatalf("an update at a stale revision on R3: %v, not a conflict", err)
	}
	casRace(t, kv)

	// The server leading the bucket goes away: compare-and-sets made
	// meanwhile wait for the new leader (their reads and writes nobody
	// answers are made again) instead of failing, and none is lost.
	info, err := js.Stream(t.Context(), "KV_test_cas")
	if err != nil {
		t.Fatal(err)
	}
	leader := info.CachedInfo().Cluster.Leader
	for i := range c.Size() {
		if c.ServerName(i) == leader {
			if err := c.Kill(i); err != nil {
				t.Fatal(err)
			}
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	type counter struct{ N int }
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, _, err := bus.CAS(ctx, kv, "n", func(cur *counter, _ bool) (*counter, error) {
				c := counter{}
				if cur != nil {
					c = *cur
				}
				c.N++
				return &c, nil
			}); err != nil {
				t.Errorf("an increment while the leader was away: %v", err)
			}
		}()
	}
	wg.Wait()
	if v, _, err := bus.GetJSON[counter](ctx, kv, "n"); err != nil || v.N != 30 {
		t.Errorf("counter %d after the leader went away, want 30 (%v)", v.N, err)
	}
}

// casRace: fifty copies racing to claim one key, exactly one wins; twenty
// read-modify-write increments end at twenty.
func casRace(t *testing.T, kv jetstream.KeyValue) {
	t.Helper()
	type claim struct{ By int }
	var wg sync.WaitGroup
	var winners atomic.Int64
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, changed, err := bus.CAS(context.Background(), kv, "item", func(cur *claim, exists bool) (*claim, error) {
				if exists {
					return nil, bus.ErrNoChange
				}
				return &claim{By: i}, nil
			})
			if err != nil {
				t.Error(err)
			}
			if changed {
				winners.Add(1)
			}
		}()
	}
	wg.Wait()
	if winners.Load() != 1 {
		t.Errorf("%d winners", winners.Load())
	}
	// Twenty increments through read-modify-write end at twenty.
	type counter struct{ N int }
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, _, err := bus.CAS(context.Background(), kv, "n", func(cur *counter, _ bool) (*counter, error) {
				c := counter{}
				if cur != nil {
					c = *cur
				}
				c.N++
				return &c, nil
			}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if v, _, _ := bus.GetJSON[counter](t.Context(), kv, "n"); v.N != 20 {
		t.Errorf("counter %d", v.N)
	}
}

// EachValue delivers every live key once (not deleted ones, not old
// revisions) and returns, also on an empty bucket.
func TestEachValue(t *testing.T) {
	m := mesh(t)
	nc, err := m.ConnectService("each")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	kv, err := bus.Bucket(t.Context(), js, jetstream.KeyValueConfig{Bucket: "test_each", History: 4})
	if err != nil {
		t.Fatal(err)
	}
	collect := func() map[string]string {
		got := map[string]string{}
		if err := bus.EachValue(t.Context(), kv, func(k string, v []byte) { got[k] = string(v) }); err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := collect(); len(got) != 0 {
		t.Fatalf("empty bucket gave %v", got)
	}
	for k, v := range map[string]string{"a": "1", "b": "2", "c": "3"} {
		if _, err := kv.PutString(t.Context(), k, v); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := kv.PutString(t.Context(), "a", "1b"); err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(t.Context(), "c"); err != nil {
		t.Fatal(err)
	}
	got := collect()
	if len(got) != 2 || got["a"] != "1b" || got["b"] != "2" {
		t.Errorf("got %v, want a=1b b=2", got)
	}
}

// CASBytes keeps a value byte for byte (what CAS's JSON round trip would
// not: spacing, key order, HTML characters); ErrNoChange hands back the
// stored bytes; a nil value deletes. GetJSONRev reports the revision that
// a later write moves on, and CAS still answers what it wrote or kept.
func TestCASBytesAndRevisions(t *testing.T) {
	m := mesh(t)
	nc, err := m.ConnectService("casbytes")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	kv, err := bus.Bucket(t.Context(), js, jetstream.KeyValueConfig{Bucket: "test_casbytes"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	wire := []byte(`{"z": 1,  "a":"<&>"}`)
	next, changed, err := bus.CASBytes(ctx, kv, "k", func(cur []byte, exists bool) ([]byte, error) {
		if exists || cur != nil {
			t.Errorf("fresh key: exists %v cur %q", exists, cur)
		}
		return wire, nil
	})
	if err != nil || !changed || string(next) != string(wire) {
		t.Fatalf("create: %q %v %v", next, changed, err)
	}
	if e, err := kv.Get(ctx, "k"); err != nil || string(e.Value()) != string(wire) {
		t.Fatalf("stored %q (%v), want the exact bytes", e.Value(), err)
	}
	next, changed, err = bus.CASBytes(ctx, kv, "k", func(cur []byte, exists bool) ([]byte, error) {
		return nil, bus.ErrNoChange
	})
	if err != nil || changed || string(next) != string(wire) {
		t.Fatalf("no change: %q %v %v", next, changed, err)
	}
	if _, changed, err = bus.CASBytes(ctx, kv, "k", func([]byte, bool) ([]byte, error) { return nil, nil }); err != nil || !changed {
		t.Fatalf("delete: %v %v", changed, err)
	}
	if _, changed, err = bus.CASBytes(ctx, kv, "k", func([]byte, bool) ([]byte, error) { return nil, nil }); err != nil || changed {
		t.Fatalf("delete of a missing key: %v %v", changed, err)
	}

	type rec struct{ N int }
	if _, rev, found, err := bus.GetJSONRev[rec](ctx, kv, "r"); err != nil || found || rev != 0 {
		t.Fatalf("missing key: rev %d found %v err %v", rev, found, err)
	}
	wrote, changed, err := bus.CAS(ctx, kv, "r", func(*rec, bool) (*rec, error) { return &rec{N: 1}, nil })
	if err != nil || !changed || wrote == nil || wrote.N != 1 {
		t.Fatalf("CAS write: %+v %v %v", wrote, changed, err)
	}
	v, rev1, found, err := bus.GetJSONRev[rec](ctx, kv, "r")
	if err != nil || !found || v.N != 1 || rev1 == 0 {
		t.Fatalf("read: %+v rev %d found %v err %v", v, rev1, found, err)
	}
	kept, changed, err := bus.CAS(ctx, kv, "r", func(cur *rec, _ bool) (*rec, error) { return nil, bus.ErrNoChange })
	if err != nil || changed || kept == nil || kept.N != 1 {
		t.Fatalf("CAS no change: %+v %v %v", kept, changed, err)
	}
	if _, _, err := bus.CAS(ctx, kv, "r", func(cur *rec, _ bool) (*rec, error) { return &rec{N: cur.N + 1}, nil }); err != nil {
		t.Fatal(err)
	}
	if v, rev2, _, _ := bus.GetJSONRev[rec](ctx, kv, "r"); v.N != 2 || rev2 <= rev1 {
		t.Errorf("after a write: %+v rev %d (was %d)", v, rev2, rev1)
	}
	if _, err := kv.PutString(ctx, "bad", "not json"); err != nil {
		t.Fatal(err)
	}
	if _, _, found, err := bus.GetJSONRev[rec](ctx, kv, "bad"); !found || err == nil {
		t.Errorf("undecodable value: found %v err %v", found, err)
	}
	if _, _, err := bus.CAS(ctx, kv, "bad", func(*rec, bool) (*rec, error) { return &rec{}, nil }); err == nil {
		t.Error("CAS over an undecodable value wrote")
	}
}

// LeaderGet reads what KeyValue.Get reads, through the stream leader: a
// live value, and not found for a key never written, deleted, purged or
// expired.
func TestLeaderGet(t *testing.T) {
	m := mesh(t)
	nc := bustest.Client(t, m)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	kv, err := bus.Bucket(ctx, js, jetstream.KeyValueConfig{Bucket: "leader_get", LimitMarkerTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"live", "other", "deleted", "purged"} {
		if _, err := kv.Put(ctx, k, []byte("v-"+k)); err != nil {
			t.Fatal(err)
		}
	}
	if err := kv.Delete(ctx, "deleted"); err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(ctx, "purged"); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctx, "expired", []byte("v"), jetstream.KeyTTL(time.Second)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		key   string
		found bool
	}{{"live", true}, {"other", true}, {"never", false}, {"deleted", false}, {"purged", false}} {
		v, found, err := bus.LeaderGet(ctx, nc, "leader_get", tc.key)
		if err != nil || found != tc.found || (found && string(v) != "v-"+tc.key) {
			t.Errorf("%s: %q %t %v, want found %t", tc.key, v, found, err, tc.found)
		}
	}
	// The expired key: KeyValue.Get and LeaderGet agree once it has gone.
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := kv.Get(ctx, "expired")
		if err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a key with a one-second TTL never expired")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, found, err := bus.LeaderGet(ctx, nc, "leader_get", "expired"); err != nil || found {
		t.Fatalf("expired key: found %t, %v", found, err)
	}
	if _, _, err := bus.LeaderGet(ctx, nc, "no_such_bucket", "k"); err == nil {
		t.Fatal("a missing bucket read as a missing key")
	}
}

// A handler failing because the bus did not answer is UNAVAILABLE (worth a
// retry), not INTERNAL_ERROR.
func TestTransient(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("kv get: %w", context.DeadlineExceeded), true},
		{fmt.Errorf("kv get: %w", nats.ErrTimeout), true},
		{nats.ErrNoResponders, true},
		{fmt.Errorf("x: %w", jetstream.ErrNoStreamResponse), true},
		{&jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}, true},
		{&jetstream.APIError{Code: 404, ErrorCode: jetstream.JSErrCodeStreamNotFound}, false},
		{errors.New("decode: bad json"), false},
		{jetstream.ErrKeyNotFound, false},
	} {
		if got := bus.Transient(tc.err); got != tc.want {
			t.Errorf("Transient(%v) = %t, want %t", tc.err, got, tc.want)
		}
	}
}

// An asynchronous publish whose acknowledgement never comes fails after
// the service's PublishAsyncTimeout rather than never.
func TestPublishAsyncTimesOut(t *testing.T) {
	m := mesh(t)
	nc := bustest.Client(t, m)
	// Something takes the publish, nothing acknowledges it: what a server
	// that dies after taking it looks like to the publisher.
	if _, err := nc.Subscribe("silent.>", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	svc, err := bus.NewService(bus.Config{Name: "silent", NC: nc, Key: agent(t), PublishAsyncTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Stop()
	fut, err := svc.JS.PublishAsync("silent.x", []byte("x"))
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-fut.Ok():
		t.Fatal("acknowledged by nobody")
	case err := <-fut.Err():
		if !errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
			t.Fatalf("err = %v, want the async publish timeout", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the future never resolved")
	}
}

// One copy serves a request while another of its handlers waits (as one
// waiting on a JetStream request lost in a failover does), and Stop waits
// for the handler still running.
func TestEndpointServesWhileAHandlerWaits(t *testing.T) {
	m := mesh(t)
	nc := bustest.Client(t, m)
	s, err := bus.NewService(bus.Config{Name: "waits", NC: nc, Key: agent(t)})
	if err != nil {
		t.Fatal(err)
	}
	release, entered := make(chan struct{}), make(chan struct{})
	var finished atomic.Bool
	if err := s.Endpoint("waits", "mesh.test.waits", func(_ context.Context, r *bus.Request) (any, error) {
		if r.Object()["wait"] == true {
			close(entered)
			<-release
			finished.Store(true)
		}
		return map[string]any{"status": "ok"}, nil
	}); err != nil {
		t.Fatal(err)
	}
	client := bustest.Client(t, m)
	caller := agent(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	waited := make(chan error, 1)
	go func() {
		_, err := bus.Call(ctx, client, caller, "mesh.test.waits", protocol.TypeRequest, "", map[string]any{"wait": true})
		waited <- err
	}()
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatal("the waiting handler never ran")
	}
	if _, err := bus.Call(ctx, client, caller, "mesh.test.waits", protocol.TypeRequest, "", map[string]any{}); err != nil {
		t.Fatalf("a request behind a waiting handler: %v", err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- s.Stop() }()
	close(release)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if !finished.Load() {
		t.Fatal("Stop returned before the handler finished")
	}
	if err := <-waited; err != nil {
		t.Fatalf("the waiting request: %v", err)
	}
}
