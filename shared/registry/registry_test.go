package registry_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/registry"
)

// fixture is a mesh with three copies of the registry, each on its own
// connection, a client connection and a log of registry events.
type fixture struct {
	t       *testing.T
	m       *bustest.Bus
	nc      *nats.Conn
	js      jetstream.JetStream
	clock   *bustest.Clock
	workers []*registry.Worker
	events  *eventLog
	// guests is the control plane's side of the guest roster, on the
	// test's own connection.
	guests *registry.GuestRoster
}

func setup(t *testing.T, cfg registry.Config) *fixture {
	t.Helper()
	m := bustest.Start(t)
	f := &fixture{t: t, m: m, nc: bustest.Client(t, m), clock: &bustest.Clock{}}
	js, err := jetstream.New(f.nc)
	if err != nil {
		t.Fatal(err)
	}
	f.js = js
	f.guests = &registry.GuestRoster{JS: js}
	// Subscribe before any worker can emit.
	f.events = newEventLog(t, f.nc)
	for i := range 3 {
		env := bustest.Env(t, m, fmt.Sprintf("registry-%d", i), f.clock.Now)
		w, err := registry.Start(t.Context(), env, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Stop() })
		f.workers = append(f.workers, w)
	}
	return f
}

// lease records keys as live guests, as the guest service does before it
// hands a guest credential out.
func (f *fixture) lease(keys ...keys.Signer) {
	f.t.Helper()
	for _, k := range keys {
		if err := f.guests.Record(f.ctx(), k.Public(), time.Now().Add(24*time.Hour)); err != nil {
			f.t.Fatalf("record guest %s: %v", k.Public(), err)
		}
	}
}

func (f *fixture) ctx() context.Context {
	ctx, cancel := context.WithTimeout(f.t.Context(), 5*time.Second)
	f.t.Cleanup(cancel)
	return ctx
}

// call sends a signed envelope of type typ from signer and returns the
// answer's payload; an error answer comes back as *errs.Error.
func (f *fixture) call(signer keys.Signer, subject string, typ protocol.Type, payload any) (map[string]any, error) {
	f.t.Helper()
	rep, err := bus.Call(f.ctx(), f.nc, signer, subject, typ, "", payload)
	if rep != nil && rep.From != f.m.ServicesKey().Public() {
		f.t.Fatalf("answer on %s signed by %s, not the services key", subject, rep.From)
	}
	if err != nil {
		return nil, err
	}
	v, err := rep.PayloadValue()
	if err != nil {
		f.t.Fatal(err)
	}
	out, _ := v.(map[string]any)
	return out, nil
}

func (f *fixture) register(agent keys.Signer, man map[string]any) (map[string]any, error) {
	f.t.Helper()
	return f.call(agent, protocol.SubjRegister, protocol.TypeRegister, man)
}

func (f *fixture) mustRegister(agent keys.Signer, man map[string]any) map[string]any {
	f.t.Helper()
	rep, err := f.register(agent, man)
	if err != nil {
		f.t.Fatalf("register %s: %v", agent.Public(), err)
	}
	return rep
}

func (f *fixture) discover(q map[string]any) (map[string]any, error) {
	f.t.Helper()
	return f.call(bustest.Agent(f.t), protocol.SubjDiscover, protocol.TypeDiscover, q)
}

func (f *fixture) kv(bucket string) jetstream.KeyValue {
	f.t.Helper()
	kv, err := f.js.CreateOrUpdateKeyValue(f.ctx(), jetstream.KeyValueConfig{Bucket: bucket})
	if err != nil {
		f.t.Fatal(err)
	}
	return kv
}

func (f *fixture) putJSON(bucket, key string, v any) {
	f.t.Helper()
	b, _ := json.Marshal(v)
	if _, err := f.kv(bucket).Put(f.ctx(), key, b); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) stored(agent string) (map[string]any, bool) {
	f.t.Helper()
	kv, err := f.js.KeyValue(f.ctx(), registry.Bucket)
	if err != nil {
		f.t.Fatal(err)
	}
	v, found, err := bus.GetJSON[map[string]any](f.ctx(), kv, agent)
	if err != nil {
		f.t.Fatal(err)
	}
	return v, found
}

// noConsumers asserts the account holds no JetStream consumer: the
// registry makes no per-agent resource at the broker.
func (f *fixture) noConsumers() {
	f.t.Helper()
	info, err := f.js.AccountInfo(f.ctx())
	if err != nil {
		f.t.Fatal(err)
	}
	if info.Consumers != 0 {
		f.t.Fatalf("the account holds %d consumers after registrations", info.Consumers)
	}
}

// manifest builds a manifest for agent hosted on node with a vouch valid
// from now for life; extra members are merged in (nil deletes).
func manifest(t *testing.T, agent keys.Signer, node keys.Signer, life time.Duration, extra map[string]any) map[string]any {
	t.Helper()
	now := time.Now()
	v, err := protocol.NewVouch(node, agent.Public(), now.Add(-time.Second), now.Add(life))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]any{
		"id": agent.Public(), "name": "agent " + agent.Public()[:6], "description": "a test agent",
		"version": "1.0.0", "protocol_version": protocol.Version,
		"endpoint":     protocol.InboxSubject(agent.Public()),
		"node":         map[string]any{"id": node.Public(), "attestation": vouchValue(t, v)},
		"capabilities": []any{"chat"},
		"offerings":    []any{map[string]any{"id": "echo", "name": "Echo"}},
	}
	for k, x := range extra {
		if x == nil {
			delete(m, k)
		} else {
			m[k] = x
		}
	}
	return m
}

func vouchValue(t *testing.T, v protocol.Vouch) map[string]any {
	t.Helper()
	b, _ := json.Marshal(v)
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func wantCode(t *testing.T, err error, code errs.Code, contains string) {
	t.Helper()
	if errs.CodeOf(err) != code {
		t.Fatalf("got %v, want %s", err, code)
	}
	if contains != "" && !strings.Contains(errs.As(err).Message, contains) {
		t.Fatalf("message %q does not say %q", errs.As(err).Message, contains)
	}
}

// eventLog records every platform event of the registry.
type eventLog struct {
	mu     sync.Mutex
	events []event
}

type event struct {
	Type string
	Data map[string]any
}

func newEventLog(t *testing.T, nc *nats.Conn) *eventLog {
	l := &eventLog{}
	sub, err := nc.Subscribe(protocol.EventSubject("registry.>"), func(msg *nats.Msg) {
		e, err := protocol.Decode(msg.Data)
		if err != nil {
			t.Errorf("undecodable event on %s: %v", msg.Subject, err)
			return
		}
		var p struct {
			Domain    string         `json:"domain"`
			EventType string         `json:"event_type"`
			Data      map[string]any `json:"data"`
		}
		if err := e.DecodePayload(&p); err != nil || p.Domain != "registry" || msg.Subject != protocol.EventSubject("registry."+p.EventType) {
			t.Errorf("event %s: %s (%v)", msg.Subject, e.Payload, err)
			return
		}
		l.mu.Lock()
		l.events = append(l.events, event{p.EventType, p.Data})
		l.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return l
}

func (l *eventLog) matching(typ, agent string) []event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []event
	for _, e := range l.events {
		if e.Type == typ && e.Data["agent_id"] == agent {
			out = append(out, e)
		}
	}
	return out
}

// expect waits for n events of typ about agent, then a little longer so a
// duplicate would show, and fails unless exactly n arrived.
func (l *eventLog) expect(t *testing.T, typ, agent string, n int) []event {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for len(l.matching(typ, agent)) < n && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	got := l.matching(typ, agent)
	if len(got) != n {
		t.Fatalf("%d %s events for %s, want %d: %v", len(got), typ, agent, n, got)
	}
	return got
}
