package presence_test

import (
	"context"
	"encoding/json"
	"slices"
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
	"agentmesh.dev/mesh/shared/presence"
	"agentmesh.dev/mesh/shared/protocol"
)

type harness struct {
	t       *testing.T
	clock   *bustest.Clock
	workers []*presence.Worker
	client  *nats.Conn
	js      jetstream.JetStream
	caller  keys.Signer
	svcKey  string

	mu     sync.Mutex
	events map[string]int      // "<event_type> <node>" → count
	agents map[string][]string // "<event_type> <node>" → agents of the latest
}

// start runs three copies of the worker, each on its own connection, all
// on one test clock, and records every presence event. The registry bucket
// exists from the start, as it does once the registry worker runs.
func start(t *testing.T) *harness {
	return startWith(t, true)
}

func startWith(t *testing.T, registry bool) *harness {
	m := bustest.Start(t)
	h := &harness{t: t, clock: &bustest.Clock{}, client: bustest.Client(t, m), caller: bustest.Agent(t),
		svcKey: m.ServicesKey().Public(), events: map[string]int{}, agents: map[string][]string{}}
	var err error
	if h.js, err = jetstream.New(h.client); err != nil {
		t.Fatal(err)
	}
	if registry {
		h.registryBucket()
	}
	for range 3 {
		env := bustest.Env(t, m, "presence", h.clock.Now)
		// The background sweep stays out of the way: the test sweeps.
		w, err := presence.Start(t.Context(), env, presence.Config{SweepEvery: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Stop() })
		h.workers = append(h.workers, w)
	}
	if _, err := h.client.Subscribe("mesh.event.presence.>", func(msg *nats.Msg) {
		e, err := protocol.Decode(msg.Data)
		if err != nil || e.From != h.svcKey || e.Type != protocol.TypeEmit {
			t.Errorf("event on %s not a services-signed emit: %v", msg.Subject, err)
			return
		}
		var p struct {
			Domain    string `json:"domain"`
			EventType string `json:"event_type"`
			Data      struct {
				Node   string   `json:"node"`
				Agents []string `json:"agents"`
			} `json:"data"`
		}
		if err := e.DecodePayload(&p); err != nil || p.Domain != "presence" || msg.Subject != "mesh.event.presence."+p.EventType {
			t.Errorf("event %s payload %s", msg.Subject, e.Payload)
			return
		}
		h.mu.Lock()
		h.events[p.EventType+" "+p.Data.Node]++
		h.agents[p.EventType+" "+p.Data.Node] = p.Data.Agents
		h.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if err := h.client.Flush(); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *harness) registryBucket() jetstream.KeyValue {
	h.t.Helper()
	kv, err := bus.Bucket(h.t.Context(), h.js, jetstream.KeyValueConfig{Bucket: presence.RegistryBucket})
	if err != nil {
		h.t.Fatal(err)
	}
	return kv
}

// register stores agent's registration on node in mesh_registry, as the
// registry worker would (only node.id matters to presence).
func (h *harness) register(agent, node string) {
	h.t.Helper()
	b, _ := json.Marshal(map[string]any{"id": agent, "name": "a", "node": map[string]any{"id": node}, "sandbox": false})
	if _, err := h.registryBucket().Put(h.t.Context(), agent, b); err != nil {
		h.t.Fatal(err)
	}
}

// eventAgents is the agent list of the latest event of that type for node.
func (h *harness) eventAgents(event, node string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.agents[event+" "+node]
}

func (h *harness) count(event, node string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.events[event+" "+node]
}

// settle waits ~500 ms so any duplicate event would have arrived.
func settle() { time.Sleep(500 * time.Millisecond) }

func (h *harness) stats() presence.Stats {
	var s presence.Stats
	for _, w := range h.workers {
		st := w.Stats()
		s.Accepted += st.Accepted
		s.Dropped += st.Dropped
	}
	return s
}

// waitStats waits until the copies together have accepted and dropped at
// least the given numbers of heartbeats.
func (h *harness) waitStats(accepted, dropped uint64) {
	h.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s := h.stats()
		if s.Accepted >= accepted && s.Dropped >= dropped {
			if s.Accepted != accepted || s.Dropped != dropped {
				h.t.Fatalf("stats %+v, want accepted %d dropped %d", s, accepted, dropped)
			}
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("stats %+v, want accepted %d dropped %d", s, accepted, dropped)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// beat builds a heartbeat signed by signer; edit may change it before
// signing.
func beat(t *testing.T, signer keys.Signer, payload any, edit func(*protocol.Envelope)) []byte {
	t.Helper()
	e, err := protocol.New(protocol.TypeEmit, signer.Public(), payload)
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(e)
	}
	if err := e.Sign(signer); err != nil {
		t.Fatal(err)
	}
	b, err := e.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (h *harness) publish(node string, data []byte) {
	h.t.Helper()
	if err := h.client.Publish(protocol.HeartbeatSubject(node), data); err != nil {
		h.t.Fatal(err)
	}
	if err := h.client.Flush(); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) get(q map[string]any) ([]presence.Node, error) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(h.t.Context(), 5*time.Second)
	defer cancel()
	rep, err := bus.Call(ctx, h.client, h.caller, protocol.SubjPresenceGet, protocol.TypeDiscover, "", q)
	if err != nil {
		return nil, err
	}
	if rep.From != h.svcKey {
		h.t.Fatalf("answer signed by %s", rep.From)
	}
	var out struct {
		Nodes []presence.Node `json:"nodes"`
	}
	if err := json.Unmarshal(rep.Payload, &out); err != nil || out.Nodes == nil {
		h.t.Fatalf("answer %s: %v", rep.Payload, err)
	}
	return out.Nodes, nil
}

func (h *harness) mustGet(q map[string]any) []presence.Node {
	h.t.Helper()
	n, err := h.get(q)
	if err != nil {
		h.t.Fatal(err)
	}
	return n
}

func TestHeartbeatsAndSweep(t *testing.T) {
	h := start(t)
	node, node2 := bustest.Node(t), bustest.Node(t)
	agentA, agentB, stranger := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)
	good := map[string]any{"availability": "busy", "agents": []any{agentA.Public(), agentB.Public()}, "active_tasks": 2}
	h.register(agentA.Public(), node.Public())
	h.register(agentB.Public(), node.Public())

	// Refused heartbeats: none reaches the bucket.
	unsigned := func() []byte {
		e, _ := protocol.New(protocol.TypeEmit, node.Public(), good)
		b, err := e.CanonicalUnsigned()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}()
	forged := beat(t, stranger, good, nil)
	forged = []byte(strings.Replace(string(forged), stranger.Public(), node.Public(), 1))
	bad := [][]byte{
		beat(t, agentA, good, nil), // from ≠ subject token (an agent on its node's subject)
		unsigned,
		forged, // claims the node, signed by another key
		beat(t, node, good, func(e *protocol.Envelope) { e.TS = protocol.FormatTime(time.Now().Add(-11 * time.Minute)) }), // stale
		beat(t, node, good, func(e *protocol.Envelope) { e.Type = protocol.TypeRequest }),                                 // not an emit
		beat(t, node, "not an object", nil),
		beat(t, node, map[string]any{"agents": "not a list"}, nil),
	}
	for _, b := range bad {
		h.publish(node.Public(), b)
	}
	h.publish("not-a-key", beat(t, node, good, nil)) // subject token is not a key
	h.waitStats(0, uint64(len(bad))+1)
	if n := h.mustGet(map[string]any{"node": node.Public()}); len(n) != 0 {
		t.Fatalf("refused heartbeats recorded: %+v", n)
	}

	// Five beats from the node race across the copies: one node_online.
	for range 5 {
		h.publish(node.Public(), beat(t, node, good, nil))
	}
	// A bad availability reads as online; no agents is an empty list.
	h.publish(node2.Public(), beat(t, node2, map[string]any{"availability": "sleeping"}, nil))
	h.waitStats(5+1, uint64(len(bad))+1)

	n := h.mustGet(map[string]any{"node": node.Public()})
	if len(n) != 1 || !n[0].Online || n[0].Node != node.Public() || n[0].Availability != "busy" ||
		!slices.Equal(n[0].Agents, []string{agentA.Public(), agentB.Public()}) {
		t.Fatalf("presence of node: %+v", n)
	}
	if _, err := protocol.ParseTime(n[0].LastSeen); err != nil || len(n[0].LastSeen) != len("2006-01-02T15:04:05.000Z") {
		t.Errorf("last_seen %q", n[0].LastSeen)
	}
	n = h.mustGet(map[string]any{"agent": agentB.Public()})
	if len(n) != 1 || n[0].Node != node.Public() {
		t.Errorf("nodes hosting agent B: %+v", n)
	}
	if n = h.mustGet(map[string]any{"agent": stranger.Public()}); len(n) != 0 {
		t.Errorf("nodes hosting a stranger: %+v", n)
	}
	if n = h.mustGet(map[string]any{"node": node.Public(), "agent": agentA.Public()}); len(n) != 1 {
		t.Errorf("node and agent filter: %+v", n)
	}
	all := h.mustGet(map[string]any{})
	if len(all) != 2 {
		t.Fatalf("all nodes: %+v", all)
	}
	for _, x := range all {
		if x.Node == node2.Public() && (x.Availability != "online" || x.Agents == nil || len(x.Agents) != 0 || !x.Online) {
			t.Errorf("node2: %+v", x)
		}
	}
	if _, err := h.get(map[string]any{"node": "nope"}); errs.CodeOf(err) != errs.InvalidQuery {
		t.Errorf("bad node filter: %v", err)
	}
	if _, err := h.get(map[string]any{"agent": 7}); errs.CodeOf(err) != errs.InvalidQuery {
		t.Errorf("bad agent filter: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, err := bus.Call(ctx, h.client, h.caller, protocol.SubjPresenceGet, protocol.TypeRequest, "", map[string]any{}); err != nil {
		t.Errorf("request type refused: %v", err)
	}
	if _, err := bus.Call(ctx, h.client, h.caller, protocol.SubjPresenceGet, protocol.TypeEmit, "", map[string]any{}); errs.CodeOf(err) != errs.InvalidEnvelope {
		t.Errorf("emit type: %v", err)
	}

	settle()
	if c := h.count(presence.EventNodeOnline, node.Public()); c != 1 {
		t.Errorf("node_online emitted %d times for five racing beats", c)
	}
	if c := h.count(presence.EventNodeOnline, node2.Public()); c != 1 {
		t.Errorf("node_online emitted %d times for node2", c)
	}

	// Not yet silent long enough: nothing flips.
	h.clock.Advance(30 * time.Second)
	if f, err := h.workers[0].Sweep(ctx); err != nil || f != 0 {
		t.Fatalf("early sweep flipped %d (%v)", f, err)
	}
	// Past 60 s: three copies sweep at once, each node flips once.
	h.clock.Advance(31 * time.Second)
	var wg sync.WaitGroup
	flipped := make([]int, len(h.workers))
	for i, w := range h.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := w.Sweep(ctx)
			if err != nil {
				t.Error(err)
			}
			flipped[i] = f
		}()
	}
	wg.Wait()
	if total := flipped[0] + flipped[1] + flipped[2]; total != 2 {
		t.Errorf("concurrent sweeps flipped %v, want 2 in all", flipped)
	}
	settle()
	for _, k := range []keys.Signer{node, node2} {
		if c := h.count(presence.EventNodeOffline, k.Public()); c != 1 {
			t.Errorf("node_offline emitted %d times", c)
		}
	}
	n = h.mustGet(map[string]any{"node": node.Public()})
	if len(n) != 1 || n[0].Online || len(n[0].Agents) != 2 {
		t.Fatalf("after sweep: %+v (manifest-side agents kept, offline)", n)
	}
	if f, _ := h.workers[1].Sweep(ctx); f != 0 {
		t.Errorf("second sweep flipped %d", f)
	}

	// A new beat brings the node back, announced once.
	for range 3 {
		h.publish(node.Public(), beat(t, node, map[string]any{"availability": "degraded", "agents": []any{agentA.Public()}}, nil))
	}
	h.waitStats(5+1+3, uint64(len(bad))+1)
	n = h.mustGet(map[string]any{"node": node.Public()})
	if len(n) != 1 || !n[0].Online || n[0].Availability != "degraded" || !slices.Equal(n[0].Agents, []string{agentA.Public()}) {
		t.Fatalf("back online: %+v", n)
	}
	if n = h.mustGet(map[string]any{"agent": agentB.Public()}); len(n) != 0 {
		t.Errorf("agent B no longer hosted: %+v", n)
	}
	settle()
	if c := h.count(presence.EventNodeOnline, node.Public()); c != 2 {
		t.Errorf("node_online emitted %d times in all, want 2", c)
	}
	if c := h.count(presence.EventNodeOnline, node2.Public()); c != 1 {
		t.Errorf("node2 came back without a beat")
	}
}

// agentsOf is the agent list of node in a mesh.presence.get answer (nil
// when the node is not in it).
func agentsOf(nodes []presence.Node, node string) []string {
	for _, n := range nodes {
		if n.Node == node {
			return n.Agents
		}
	}
	return nil
}

// Any node may list any agent in its beat. An agent is live on a node only
// while its registration names that node: node 1 claiming agent A, which is
// registered on node 2, does not make A live on node 1 (in answers, under
// every filter, and in node_online), and A shows on node 2 once node 2
// beats. When A registers on node 1 instead, node 1's claim checks out and
// node 2 no longer hosts it, with no beat in between.
func TestAgentsOnlyOnTheirRegisteredNode(t *testing.T) {
	h := start(t)
	n1, n2 := bustest.Node(t), bustest.Node(t)
	a, b, unregistered := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)
	h.register(a.Public(), n2.Public())
	h.register(b.Public(), n1.Public())

	h.publish(n1.Public(), beat(t, n1, map[string]any{"agents": []any{a.Public(), b.Public(), unregistered.Public()}}, nil))
	h.waitStats(1, 0)
	n := h.mustGet(map[string]any{"node": n1.Public()})
	if len(n) != 1 || !n[0].Online || !slices.Equal(n[0].Agents, []string{b.Public()}) {
		t.Fatalf("node 1 claiming A (registered on node 2) and an unregistered agent: %+v", n)
	}
	if n = h.mustGet(map[string]any{"agent": a.Public()}); len(n) != 0 {
		t.Fatalf("A is live on %+v before its node beat", n)
	}
	if n = h.mustGet(map[string]any{"agent": a.Public(), "node": n1.Public()}); len(n) != 0 {
		t.Fatalf("A on node 1 with both filters: %+v", n)
	}
	if n = h.mustGet(map[string]any{"agent": unregistered.Public()}); len(n) != 0 {
		t.Fatalf("an unregistered agent is live on %+v", n)
	}
	if got := agentsOf(h.mustGet(map[string]any{}), n1.Public()); !slices.Equal(got, []string{b.Public()}) {
		t.Fatalf("node 1 in the full listing hosts %v", got)
	}
	settle()
	if got := h.eventAgents(presence.EventNodeOnline, n1.Public()); !slices.Equal(got, []string{b.Public()}) {
		t.Errorf("node_online of node 1 carries %v", got)
	}

	// A's real node beats: A is live there, and only there.
	h.publish(n2.Public(), beat(t, n2, map[string]any{"agents": []any{a.Public()}}, nil))
	h.waitStats(2, 0)
	n = h.mustGet(map[string]any{"agent": a.Public()})
	if len(n) != 1 || n[0].Node != n2.Public() || !n[0].Online || !slices.Equal(n[0].Agents, []string{a.Public()}) {
		t.Fatalf("A on its own node: %+v", n)
	}
	all := h.mustGet(map[string]any{})
	if got := agentsOf(all, n1.Public()); !slices.Equal(got, []string{b.Public()}) {
		t.Errorf("node 1 hosts %v", got)
	}
	if got := agentsOf(all, n2.Public()); !slices.Equal(got, []string{a.Public()}) {
		t.Errorf("node 2 hosts %v", got)
	}

	// A moves to node 1 (whose last beat listed it): read at answer time.
	h.register(a.Public(), n1.Public())
	n = h.mustGet(map[string]any{"agent": a.Public()})
	if len(n) != 1 || n[0].Node != n1.Public() || !slices.Equal(n[0].Agents, []string{a.Public(), b.Public()}) {
		t.Fatalf("after A moved to node 1: %+v", n)
	}
	if got := agentsOf(h.mustGet(map[string]any{}), n2.Public()); len(got) != 0 {
		t.Errorf("node 2 still hosts %v after A moved away", got)
	}
}

// A beat listing many agents is checked in one pass over the registry
// rather than key by key; the outcome is the same.
func TestManyClaimedAgentsChecked(t *testing.T) {
	h := start(t)
	n1, n2 := bustest.Node(t), bustest.Node(t)
	var claimed []any
	var mine []string
	for i := range 100 {
		a := bustest.Agent(t).Public()
		claimed = append(claimed, a)
		switch i % 3 {
		case 0:
			h.register(a, n1.Public())
			mine = append(mine, a)
		case 1:
			h.register(a, n2.Public()) // someone else's agent
		}
	}
	h.publish(n1.Public(), beat(t, n1, map[string]any{"agents": claimed}, nil))
	h.waitStats(1, 0)
	n := h.mustGet(map[string]any{"node": n1.Public()})
	if len(n) != 1 {
		t.Fatalf("node 1: %+v", n)
	}
	got := slices.Clone(n[0].Agents)
	slices.Sort(got)
	slices.Sort(mine)
	if !slices.Equal(got, mine) {
		t.Fatalf("node 1 hosts %d agents, want its %d registered ones", len(got), len(mine))
	}
}

// Before the registry bucket exists, presence still records and answers
// beats; nobody is registered yet, so no agent is live. Once the bucket
// appears (bound lazily, looked up at most every 2 s) registrations count.
func TestPresenceWithoutRegistry(t *testing.T) {
	h := startWith(t, false)
	node, a := bustest.Node(t), bustest.Agent(t)
	h.publish(node.Public(), beat(t, node, map[string]any{"availability": "busy", "agents": []any{a.Public()}}, nil))
	h.waitStats(1, 0)
	n := h.mustGet(map[string]any{"node": node.Public()})
	if len(n) != 1 || !n[0].Online || n[0].Availability != "busy" || n[0].Agents == nil || len(n[0].Agents) != 0 {
		t.Fatalf("without a registry: %+v", n)
	}
	if n = h.mustGet(map[string]any{"agent": a.Public()}); len(n) != 0 {
		t.Fatalf("without a registry, agent filter: %+v", n)
	}
	h.register(a.Public(), node.Public())
	deadline := time.Now().Add(5 * time.Second)
	for {
		n = h.mustGet(map[string]any{"agent": a.Public()})
		if len(n) == 1 && n[0].Node == node.Public() && slices.Equal(n[0].Agents, []string{a.Public()}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("registration not seen once the registry exists: %+v", n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestHeartbeatReport: what a beat reports of its node (active_tasks,
// capacity, uptime_seconds, load) is recorded and answered; a member of
// the wrong shape is left out and the beat still counts.
func TestHeartbeatReport(t *testing.T) {
	h := start(t)
	node, other := bustest.Node(t), bustest.Node(t)
	h.publish(node.Public(), beat(t, node, map[string]any{"availability": "online", "agents": []any{},
		"active_tasks": 3, "capacity": 8, "uptime_seconds": 86400, "load": 0.25}, nil))
	h.publish(other.Public(), beat(t, other, map[string]any{"availability": "online",
		"active_tasks": -1, "capacity": 1.5, "uptime_seconds": "a day", "load": -0.5}, nil))
	h.waitStats(2, 0)

	n := h.mustGet(map[string]any{"node": node.Public()})
	r := n[0].Report
	if r.ActiveTasks == nil || *r.ActiveTasks != 3 || r.Capacity == nil || *r.Capacity != 8 ||
		r.UptimeSeconds == nil || *r.UptimeSeconds != 86400 || r.Load == nil || *r.Load != 0.25 {
		t.Fatalf("report of node: %+v", n[0])
	}
	if n := h.mustGet(map[string]any{"node": other.Public()}); n[0].Report != (presence.Report{}) || !n[0].Online {
		t.Fatalf("report of a node that sent bad members: %+v", n[0])
	}
}
