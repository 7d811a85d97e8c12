// Package presence tracks node liveness from heartbeats (spec §3.3, §4.3,
// upstream-notes §6.3): every node publishes a signed emit on
// mesh.heartbeat.<node> every 30 s; the worker keeps one record per node in
// KV mesh_presence, flips a node offline after OfflineAfter of silence, and
// emits presence.node_online / presence.node_offline exactly once per
// transition however many copies run. Manifests are never touched.
//
// A beat's agent list is the node's claim, and any node may claim any
// agent. An agent counts as hosted by a node only while its registration in
// mesh_registry names that node, so answers and events carry only agents
// that check out.
package presence

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// Name is the worker's name: its micro service is mesh-presence and its
// copies share the queue group bus.QueueGroup(Name).
const Name = "presence"

// Bucket is the KV bucket of presence records, keyed by node id.
const Bucket = "mesh_presence"

// RegistryBucket is the registry's bucket (agent id → manifest with
// node.id); an agent a beat lists counts only if its record there names the
// beating node. Bound when it exists: the registry worker creates it.
const RegistryBucket = "mesh_registry"

// Event types, emitted on mesh.event.presence.<type>.
const (
	EventNodeOnline  = "node_online"
	EventNodeOffline = "node_offline"
)

// Availability values a heartbeat may declare; anything else reads as
// AvailOnline.
const (
	AvailOnline   = "online"
	AvailBusy     = "busy"
	AvailDegraded = "degraded"
	AvailOffline  = "offline"
)

// maxAgents bounds the agent list one heartbeat may record.
const maxAgents = 1024

// maxLookups is how many agents are checked against the registry one key at
// a time; past it, one pass over the whole registry is cheaper.
const maxLookups = 64

// Config tunes the worker; zero values take the defaults.
type Config struct {
	// OfflineAfter is the silence after which a node is offline (60 s:
	// twice the heartbeat interval).
	OfflineAfter time.Duration
	// SweepEvery is how often each copy sweeps for silent nodes (10 s).
	SweepEvery time.Duration
	// Replicas of the worker's bucket (bus.Replicas: 0 is 1, one
	// server; the cloud's cluster runs 3, set by the workers table).
	Replicas int
}

// Defaults.
const (
	DefaultOfflineAfter = 60 * time.Second
	DefaultSweepEvery   = 10 * time.Second
)

// Node is a presence record: the value stored under the node id in
// mesh_presence and one entry of a mesh.presence.get answer.
type Node struct {
	Node string `json:"node"`
	// Agents is what the node's last beat listed. Stored as claimed (a
	// registration may follow the beat); answers and events keep only the
	// agents whose registration names this node.
	Agents       []string `json:"agents"`
	Availability string   `json:"availability"`
	// LastSeen is when a copy last accepted a heartbeat from the node, by
	// the worker's clock (RFC 3339, UTC, milliseconds).
	LastSeen string `json:"last_seen"`
	Online   bool   `json:"online"`
	Report
}

// Report is what a node's last heartbeat said of itself besides its
// availability (upstream-notes §6.3: active_tasks, capacity,
// uptime_seconds, load). A member the beat left out, or sent in another
// shape than a non-negative number (an integer for the counts), is absent:
// the beat is still recorded.
type Report struct {
	ActiveTasks   *int64   `json:"active_tasks,omitempty"`
	Capacity      *int64   `json:"capacity,omitempty"`
	UptimeSeconds *int64   `json:"uptime_seconds,omitempty"`
	Load          *float64 `json:"load,omitempty"`
}

// Stats counts what one copy did with the heartbeats it received.
type Stats struct {
	Accepted uint64 // recorded
	Dropped  uint64 // refused: bad subject, envelope, sender, freshness or payload
}

// Worker is one running copy of the presence worker.
type Worker struct {
	svc      *bus.Service
	kv       jetstream.KeyValue
	registry bus.LazyBucket
	cfg      Config
	now      func() time.Time
	sub      *nats.Subscription
	dedup    *protocol.DedupMemory

	accepted, dropped atomic.Uint64

	stop     chan struct{}
	done     sync.WaitGroup
	stopErr  error
	stopOnce sync.Once
}

// Start runs one copy of the worker in env: binds the bucket, serves
// mesh.presence.get, subscribes mesh.heartbeat.* in the worker's queue
// group and sweeps every cfg.SweepEvery.
func Start(ctx context.Context, env bus.Env, cfg Config) (*Worker, error) {
	if cfg.OfflineAfter <= 0 {
		cfg.OfflineAfter = DefaultOfflineAfter
	}
	if cfg.SweepEvery <= 0 {
		cfg.SweepEvery = DefaultSweepEvery
	}
	svc, err := bus.NewServiceIn(env, Name, "node presence from heartbeats")
	if err != nil {
		return nil, err
	}
	kv, err := bus.Bucket(ctx, svc.JS, jetstream.KeyValueConfig{Bucket: Bucket, Description: "node presence, keyed by node id",
		Replicas: bus.Replicas(cfg.Replicas)})
	if err != nil {
		_ = svc.Stop()
		return nil, err
	}
	w := &Worker{svc: svc, kv: kv, registry: bus.LazyBucket{JS: svc.JS, Bucket: RegistryBucket}, cfg: cfg, now: svc.Now,
		dedup: protocol.NewDedupMemory(0), stop: make(chan struct{})}
	if err := svc.Endpoint("get", protocol.SubjPresenceGet, w.get); err != nil {
		_ = svc.Stop()
		return nil, fmt.Errorf("%s: endpoint: %w", Name, err)
	}
	// Heartbeats are publishes, not requests: a plain queue subscription,
	// so each beat is handled by exactly one copy.
	w.sub, err = env.NC.QueueSubscribe(protocol.HeartbeatSubject("*"), bus.QueueGroup(Name), w.onHeartbeat)
	if err != nil {
		_ = svc.Stop()
		return nil, fmt.Errorf("%s: subscribe heartbeats: %w", Name, err)
	}
	if err := env.NC.Flush(); err != nil {
		w.Stop()
		return nil, fmt.Errorf("%s: flush: %w", Name, err)
	}
	w.done.Add(1)
	go w.sweepLoop()
	return w, nil
}

// Stop ends the copy: no more heartbeats, sweeps or answers. It is safe to
// call more than once; the first call's error is returned every time.
func (w *Worker) Stop() error {
	w.stopOnce.Do(func() {
		close(w.stop)
		var errs []error
		if w.sub != nil {
			errs = append(errs, w.sub.Unsubscribe())
		}
		errs = append(errs, w.svc.Stop())
		w.done.Wait()
		w.stopErr = errors.Join(errs...)
	})
	return w.stopErr
}

// Stats reports this copy's counters.
func (w *Worker) Stats() Stats {
	return Stats{Accepted: w.accepted.Load(), Dropped: w.dropped.Load()}
}

func (w *Worker) sweepLoop() {
	defer w.done.Done()
	t := time.NewTicker(w.cfg.SweepEvery)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), w.cfg.SweepEvery)
			if _, err := w.Sweep(ctx); err != nil {
				w.svc.Log.Warn("presence sweep", "err", err)
			}
			cancel()
		}
	}
}

// onHeartbeat records one heartbeat. Anything that does not pass is dropped
// silently (counted): a heartbeat has no reply.
func (w *Worker) onHeartbeat(msg *nats.Msg) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.heartbeat(ctx, msg.Subject, msg.Data); err != nil {
		w.dropped.Add(1)
		if !errors.Is(err, errDrop) {
			w.svc.Log.Warn("heartbeat", "subject", msg.Subject, "err", err)
		}
		return
	}
	w.accepted.Add(1)
}

var errDrop = errors.New("heartbeat dropped")

func (w *Worker) heartbeat(ctx context.Context, subject string, data []byte) error {
	// Node identity comes from the subject token only.
	node, ok := strings.CutPrefix(subject, protocol.HeartbeatSubject(""))
	if !ok || !keys.IsUserPublicKey(node) {
		return errDrop
	}
	env, err := protocol.Decode(data)
	if err != nil {
		return errDrop
	}
	if env.Type != protocol.TypeEmit || env.From != node {
		return errDrop
	}
	now := w.now()
	if protocol.CheckFreshness(env.TS, now, protocol.SourceLive) != nil {
		return errDrop
	}
	agents, avail, report, ok := parseBeat(env)
	if !ok {
		return errDrop
	}
	if w.dedup.Seen(env.From, env.ID) {
		return errDrop // a replay this copy has already counted
	}
	var flipped bool
	rec, _, err := bus.CAS(ctx, w.kv, node, func(cur *Node, exists bool) (*Node, error) {
		seen := now
		if exists {
			// Never move last_seen backwards when copies race.
			if t, err := protocol.ParseTime(cur.LastSeen); err == nil && t.After(seen) {
				seen = t
			}
		}
		flipped = !exists || !cur.Online
		return &Node{Node: node, Agents: agents, Availability: avail, LastSeen: protocol.FormatTime(seen), Online: true, Report: report}, nil
	})
	if err != nil {
		return err
	}
	// Only the copy whose write flipped the record announces it.
	if flipped {
		if err := w.svc.Emit(Name, EventNodeOnline, map[string]any{"node": node, "agents": w.hostedOrNone(ctx, *rec)}); err != nil {
			w.svc.Log.Error("emit node_online", "node", node, "err", err)
		}
	}
	return nil
}

// parseBeat reads a heartbeat payload {availability, agents, active_tasks?,
// capacity?, uptime_seconds?, load?}. An unknown or missing availability
// reads as online; a payload that is not an object, or agents that are not
// a list of strings, is undecodable. Agent entries that are not agent keys
// are left out, as are report members of the wrong shape (Report).
func parseBeat(env *protocol.Envelope) (agents []string, avail string, report Report, ok bool) {
	v, err := env.PayloadValue()
	if err != nil {
		return nil, "", report, false
	}
	m, isObj := v.(map[string]any)
	if !isObj {
		return nil, "", report, false
	}
	report = Report{ActiveTasks: count(m["active_tasks"]), Capacity: count(m["capacity"]),
		UptimeSeconds: count(m["uptime_seconds"]), Load: measure(m["load"])}
	avail = AvailOnline
	if s, _ := m["availability"].(string); validAvailability(s) {
		avail = s
	}
	agents = []string{}
	switch list := m["agents"].(type) {
	case nil:
	case []any:
		for _, a := range list {
			s, isStr := a.(string)
			if !isStr {
				return nil, "", report, false
			}
			if keys.IsUserPublicKey(s) && !slices.Contains(agents, s) && len(agents) < maxAgents {
				agents = append(agents, s)
			}
		}
	default:
		return nil, "", report, false
	}
	return agents, avail, report, true
}

// maxReported bounds a reported number: JSON integers beyond 2^53 are not
// exact.
const maxReported = 1 << 53

// count reads a non-negative integer of a beat, nil for anything else.
func count(v any) *int64 {
	n, ok := v.(float64)
	if !ok || n < 0 || n > maxReported || n != math.Trunc(n) {
		return nil
	}
	i := int64(n)
	return &i
}

// measure reads a non-negative number of a beat, nil for anything else.
func measure(v any) *float64 {
	n, ok := v.(float64)
	if !ok || n < 0 || n > maxReported || math.IsNaN(n) {
		return nil
	}
	return &n
}

func validAvailability(s string) bool {
	switch s {
	case AvailOnline, AvailBusy, AvailDegraded, AvailOffline:
		return true
	}
	return false
}

// Sweep flips every online node silent for longer than OfflineAfter to
// offline and emits presence.node_offline for each node this call flipped.
// Copies may sweep concurrently: each flip happens, and is announced, once.
func (w *Worker) Sweep(ctx context.Context) (flipped int, err error) {
	nodes, err := w.all(ctx)
	if err != nil {
		return 0, err
	}
	now := w.now()
	var firstErr error
	for _, n := range nodes {
		if !n.Online || !w.silent(n, now) {
			continue
		}
		rec, changed, err := bus.CAS(ctx, w.kv, n.Node, func(cur *Node, exists bool) (*Node, error) {
			if !exists || !cur.Online || !w.silent(*cur, now) {
				return nil, bus.ErrNoChange // a heartbeat or another copy got there first
			}
			next := *cur
			next.Online = false
			return &next, nil
		})
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		if !changed {
			continue
		}
		flipped++
		if err := w.svc.Emit(Name, EventNodeOffline, map[string]any{"node": rec.Node, "agents": w.hostedOrNone(ctx, *rec), "last_seen": rec.LastSeen}); err != nil {
			w.svc.Log.Error("emit node_offline", "node", rec.Node, "err", err)
		}
	}
	return flipped, firstErr
}

// silent reports whether n has not been heard from for OfflineAfter. A
// record whose last_seen does not parse is silent.
func (w *Worker) silent(n Node, now time.Time) bool {
	t, err := protocol.ParseTime(n.LastSeen)
	return err != nil || now.Sub(t) > w.cfg.OfflineAfter
}

// all reads every presence record, sorted by node.
func (w *Worker) all(ctx context.Context) ([]Node, error) {
	var out []Node
	err := bus.EachValue(ctx, w.kv, func(key string, v []byte) {
		var n Node
		if err := json.Unmarshal(v, &n); err != nil {
			w.svc.Log.Warn("presence record", "key", key, "err", err)
			return
		}
		out = append(out, n)
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b Node) int { return strings.Compare(a.Node, b.Node) })
	return out, nil
}

// get answers mesh.presence.get {node?, agent?} with {nodes:[…]}: every
// known node, or the one named, or the one hosting the agent named. Each
// node lists only the agents whose registration names it.
func (w *Worker) get(ctx context.Context, r *bus.Request) (any, error) {
	if r.Env.Type != protocol.TypeDiscover && r.Env.Type != protocol.TypeRequest {
		return nil, errs.New(errs.InvalidEnvelope, "mesh.presence.get takes a discover or request envelope")
	}
	q := r.Object()
	node, err := keyFilter(q, "node")
	if err != nil {
		return nil, err
	}
	agent, err := keyFilter(q, "agent")
	if err != nil {
		return nil, err
	}
	if agent != "" {
		// Only the node the agent is registered on can be hosting it.
		homes, err := w.homes(ctx, []string{agent})
		if err != nil {
			return nil, err
		}
		home := homes[agent]
		if home == "" || (node != "" && node != home) {
			return map[string]any{"nodes": []Node{}}, nil
		}
		node = home
	}
	var nodes []Node
	if node != "" {
		n, found, err := bus.GetJSON[Node](ctx, w.kv, node)
		if err != nil {
			return nil, err
		}
		if found {
			nodes = []Node{n}
		}
	} else if nodes, err = w.all(ctx); err != nil {
		return nil, err
	}
	if err := w.confirm(ctx, nodes); err != nil {
		return nil, err
	}
	out := make([]Node, 0, len(nodes))
	for _, n := range nodes {
		if agent != "" && !slices.Contains(n.Agents, agent) {
			continue
		}
		out = append(out, n)
	}
	return map[string]any{"nodes": out}, nil
}

// confirm narrows each node's agent list, in place, to the agents whose
// registration names that node: a beat may list any key, and an agent that
// moved to another node is no longer hosted here.
func (w *Worker) confirm(ctx context.Context, nodes []Node) error {
	var claimed []string
	for _, n := range nodes {
		claimed = append(claimed, n.Agents...)
	}
	homes, err := w.homes(ctx, claimed)
	if err != nil {
		return err
	}
	for i, n := range nodes {
		kept := []string{}
		for _, a := range n.Agents {
			if homes[a] == n.Node {
				kept = append(kept, a)
			}
		}
		nodes[i].Agents = kept
	}
	return nil
}

// hostedOrNone is n's confirmed agent list for an event; when the registry
// cannot be read, the event goes out with no agents rather than with a
// claim nobody checked.
func (w *Worker) hostedOrNone(ctx context.Context, n Node) []string {
	nodes := []Node{n}
	if err := w.confirm(ctx, nodes); err != nil {
		w.svc.Log.Warn("presence event: registry", "node", n.Node, "err", err)
		return []string{}
	}
	return nodes[0].Agents
}

// registration is the part of a registry record presence reads.
type registration struct {
	Node struct {
		ID string `json:"id"`
	} `json:"node"`
}

// homes maps each of agents that has a registration to the node it names.
// While the registry bucket does not exist nobody is registered: the map is
// empty. A record that does not decode names no node.
func (w *Worker) homes(ctx context.Context, agents []string) (map[string]string, error) {
	out := map[string]string{}
	agents = slices.Compact(slices.Sorted(slices.Values(agents))) // several nodes may claim one agent
	if len(agents) == 0 {
		return out, nil
	}
	kv, err := w.registry.Get(ctx)
	if err != nil {
		return nil, fmt.Errorf("kv bucket %s: %w", RegistryBucket, err)
	}
	if kv == nil {
		return out, nil
	}
	if len(agents) > maxLookups {
		return w.scanHomes(ctx, kv, agents)
	}
	for _, a := range agents {
		reg, found, err := bus.GetJSON[registration](ctx, kv, a)
		switch {
		case err != nil && found:
			w.svc.Log.Warn("undecodable registry record", "agent", a, "err", err)
		case err != nil:
			return nil, fmt.Errorf("kv %s: get %s: %w", RegistryBucket, a, err)
		case found:
			out[a] = reg.Node.ID
		}
	}
	return out, nil
}

// scanHomes is homes in one pass over the whole registry.
func (w *Worker) scanHomes(ctx context.Context, kv jetstream.KeyValue, agents []string) (map[string]string, error) {
	want := make(map[string]bool, len(agents))
	for _, a := range agents {
		want[a] = true
	}
	out := map[string]string{}
	err := bus.EachValue(ctx, kv, func(key string, v []byte) {
		if !want[key] {
			return
		}
		var reg registration
		if err := json.Unmarshal(v, &reg); err != nil {
			w.svc.Log.Warn("undecodable registry record", "agent", key, "err", err)
			return
		}
		out[key] = reg.Node.ID
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// keyFilter reads an optional key filter: absent, null or "" is no filter;
// anything else must be a user public key.
func keyFilter(q map[string]any, name string) (string, error) {
	switch v := q[name].(type) {
	case nil:
		return "", nil
	case string:
		if v == "" || keys.IsUserPublicKey(v) {
			return v, nil
		}
	}
	return "", errs.Newf(errs.InvalidQuery, "%s must be a public key", name)
}
