package reliability_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/adapter/node"
	"agentmesh.dev/mesh/devenv"
	"agentmesh.dev/mesh/shared/broker"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/mailbox"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/registry"
)

// clusterMesh is a whole mesh (devenv) on a three-server cluster with
// three copies of every worker, and the test's own service connection.
type clusterMesh struct {
	t   *testing.T
	dir string
	m   *devenv.Mesh
	c   *broker.Cluster
	svc *nats.Conn
	js  jetstream.JetStream
}

// clusterLogger is the mesh's logger: MESH_RELIABILITY_LOG=debug (or info,
// warn) writes the mesh's logs to stderr, for reading a failure.
func clusterLogger() *slog.Logger {
	var level slog.Level
	if err := level.UnmarshalText([]byte(os.Getenv("MESH_RELIABILITY_LOG"))); err != nil || os.Getenv("MESH_RELIABILITY_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

func startClusterMesh(t *testing.T) *clusterMesh {
	t.Helper()
	dir := t.TempDir()
	m, err := devenv.Start(t.Context(), devenv.Config{DataDir: dir, Cluster: 3, Logger: clusterLogger(),
		ClusterResolverSync: 500 * time.Millisecond, Workers: devenv.WorkerConfig{Copies: 3}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	svc, err := m.ConnectService("reliability-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	js, err := jetstream.New(svc)
	if err != nil {
		t.Fatal(err)
	}
	return &clusterMesh{t: t, dir: dir, m: m, c: m.Cluster(), svc: svc, js: js}
}

// newAgentKeys makes n fresh agent keys.
func newAgentKeys(t *testing.T, n int) []*keys.Agent {
	t.Helper()
	out := make([]*keys.Agent, n)
	for i := range out {
		k, err := keys.Generate[keys.AgentRole]()
		if err != nil {
			t.Fatal(err)
		}
		out[i] = k
	}
	return out
}

// startNode connects a node for the agents in roster, over every member's
// address, with a credential minted from the mesh's trust chain (as POST
// /v1/node-credential would), pinning the services key.
func (cm *clusterMesh) startNode(ctx context.Context, name string, roster []*keys.Agent) (*node.Node, error) {
	nk, err := keys.Generate[keys.NodeRole]()
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(roster))
	for i, k := range roster {
		ids[i] = k.Public()
	}
	userJWT, err := cm.m.Trust().MintUser(creds.UserSpec{PublicKey: nk.Public(), Name: name, Kind: creds.KindNode, Hosted: ids,
		Permissions: creds.NodePermissions(ids, creds.PrivateOnly(nk.Public())), Expires: time.Now().Add(24 * time.Hour)})
	if err != nil {
		return nil, err
	}
	return node.Start(ctx, node.Config{NATSURL: cm.m.URLs().MeshTCP, NodeKey: nk, Name: name,
		Credential: node.Credential{JWT: userJWT, Sign: nk.SignNonce}, ServicesKey: cm.m.ServicesKey().Public(),
		RequestTimeout: 5 * time.Second})
}

// mostLeader is the member leading the most streams (the one whose loss
// moves the most).
func (cm *clusterMesh) mostLeader(ctx context.Context) int {
	cm.t.Helper()
	rs, err := broker.Replication(ctx, cm.js)
	if err != nil {
		cm.t.Fatal(err)
	}
	count := map[string]int{}
	for _, r := range rs {
		count[r.Leader]++
	}
	best, bestN := 0, -1
	for i := range cm.c.Size() {
		if n := count[cm.c.ServerName(i)]; n > bestN {
			best, bestN = i, n
		}
	}
	return best
}

// failures counts the load's failed operations by operation and code.
type failures struct {
	mu sync.Mutex
	by map[string]int
}

func (f *failures) add(op string, err error) {
	code := string(errs.CodeOf(err))
	if code == "" {
		code = "other"
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.by == nil {
		f.by = map[string]int{}
	}
	f.by[op+" "+code]++
}

func (f *failures) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var parts []string
	for k, n := range f.by {
		parts = append(parts, fmt.Sprintf("%s: %d", k, n))
	}
	sort.Strings(parts)
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// idCounts counts events by id.
type idCounts struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *idCounts) add(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[id]++
}

func (c *idCounts) get(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[id]
}

// over lists the ids counted more than max times.
func (c *idCounts) over(max int) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for id, n := range c.n {
		if n > max {
			out = append(out, fmt.Sprintf("%s×%d", id, n))
		}
	}
	return out
}

func (c *idCounts) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.n)
}

// idSet is a set of ids with a value each.
type idSet[V any] struct {
	mu sync.Mutex
	m  map[string]V
}

func (s *idSet[V]) put(id string, v V) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]V{}
	}
	s.m[id] = v
}

func (s *idSet[V]) has(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.m[id]
	return ok
}

func (s *idSet[V]) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

func (s *idSet[V]) snapshot() map[string]V {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]V, len(s.m))
	for k, v := range s.m {
		out[k] = v
	}
	return out
}

// registrations registers fresh agents one after another, a node for every
// eight: an acknowledged registration is one whose register call was
// answered "registered".
type registrations struct {
	cm    *clusterMesh
	fail  *failures
	acked idSet[string] // agent id → node id
	nodes []*node.Node
}

func (r *registrations) run(ctx context.Context, stop <-chan struct{}) {
	for batch := 0; ; batch++ {
		roster := newAgentKeys(r.cm.t, 8)
		n, err := r.cm.startNode(ctx, fmt.Sprintf("reliability-reg-%d", batch), roster)
		if err != nil {
			r.fail.add("node", err)
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			continue
		}
		r.nodes = append(r.nodes, n)
		for _, k := range roster {
			select {
			case <-stop:
				return
			case <-time.After(registerPause):
			}
			hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := n.Host(hctx, node.AgentConfig{Key: k, Name: "reliability registrant", AvailabilityClass: "always_on",
				Handler: func(ctx context.Context, c *node.Call) error { return c.Reply(map[string]any{"ok": true}) }})
			cancel()
			if err != nil {
				r.fail.add("register", err)
				continue
			}
			r.acked.put(k.Public(), n.ID())
		}
		// Its agents stay registered (Close does not deregister); closing
		// the node keeps the connections of a long run bounded.
		_ = n.Close()
		r.nodes = r.nodes[:len(r.nodes)-1]
	}
}

// registerPause paces the registrations: about twenty a second.
const registerPause = 50 * time.Millisecond

func (r *registrations) close() {
	for _, n := range r.nodes {
		_ = n.Close()
	}
}

// registeredEvents counts agent_registered events of new registrations (a
// move to another node, which names previous_node, is not one) by agent.
func (cm *clusterMesh) registeredEvents() (*idCounts, func()) {
	cm.t.Helper()
	counts := &idCounts{}
	sub, err := cm.svc.Subscribe(protocol.EventSubject(registry.Name+"."+registry.EventRegistered), func(m *nats.Msg) {
		env, err := protocol.Decode(m.Data)
		if err != nil {
			return
		}
		var p struct {
			Data struct {
				AgentID      string `json:"agent_id"`
				PreviousNode string `json:"previous_node"`
			} `json:"data"`
		}
		if env.DecodePayload(&p) == nil && p.Data.AgentID != "" && p.Data.PreviousNode == "" {
			counts.add(p.Data.AgentID)
		}
	})
	if err != nil {
		cm.t.Fatal(err)
	}
	if err := cm.svc.Flush(); err != nil {
		cm.t.Fatal(err)
	}
	return counts, func() { _ = sub.Unsubscribe() }
}

// refuse is the handler of agents nobody should call.
func refuse(ctx context.Context, c *node.Call) error {
	return c.Fail(errs.New(errs.InvalidRequest, "this agent takes no requests"))
}

// requests is agent-to-agent request-reply between two nodes: callers on
// one, responders on the other. handled counts how often a responder's
// handler ran for each request id, answered how many answers each caller
// received for it (in time, or late through OnReply).
type requests struct {
	cm                   *clusterMesh
	fail                 *failures
	callerNode, respNode *node.Node
	callers, responders  []*node.Agent
	sent                 idSet[struct{}]
	handled, answered    idCounts
	inTime               atomic.Int64
	tasksAcked           idSet[float64] // task id → output n, read back completed from the task record
	tasksUnacked         atomic.Int64
	taskSeq              atomic.Int64
}

func (r *requests) open(ctx context.Context, callers, responders int) error {
	ck, rk := newAgentKeys(r.cm.t, callers), newAgentKeys(r.cm.t, responders)
	var err error
	if r.callerNode, err = r.cm.startNode(ctx, "reliability-callers", ck); err != nil {
		return err
	}
	if r.respNode, err = r.cm.startNode(ctx, "reliability-responders", rk); err != nil {
		return err
	}
	onReply := func(res *node.Result) { r.answered.add(res.RequestID) }
	for _, k := range ck {
		a, err := r.callerNode.Host(ctx, node.AgentConfig{Key: k, Name: "reliability caller", AvailabilityClass: "always_on",
			OnReply: onReply, Handler: refuse})
		if err != nil {
			return err
		}
		r.callers = append(r.callers, a)
	}
	handler := func(ctx context.Context, c *node.Call) error {
		r.handled.add(c.Env.ID)
		var in struct {
			N float64 `json:"n"`
		}
		_ = c.DecodeInput(&in)
		if c.Offering == "task" {
			t, err := c.StartTask()
			if err != nil {
				return err
			}
			return t.Complete(map[string]any{"n": in.N})
		}
		return c.Reply(map[string]any{"n": in.N})
	}
	for _, k := range rk {
		a, err := r.respNode.Host(ctx, node.AgentConfig{Key: k, Name: "reliability responder", AvailabilityClass: "always_on",
			Offerings: []node.Offering{{ID: "echo", Name: "Echo"}, {ID: "task", Name: "Task"}}, Handler: handler})
		if err != nil {
			return err
		}
		r.responders = append(r.responders, a)
	}
	return nil
}

// callLoop is caller g's load: echo requests, one after another.
func (r *requests) callLoop(ctx context.Context, stop <-chan struct{}, g int) {
	for seq := 0; ; seq++ {
		select {
		case <-stop:
			return
		case <-time.After(callPause):
		}
		from, to := r.callers[g%len(r.callers)], r.responders[(g+seq)%len(r.responders)]
		id := protocol.NewID()
		r.sent.put(id, struct{}{})
		res, err := from.Request(ctx, to.ID(), "echo", map[string]any{"n": seq}, node.RequestOptions{ID: id})
		if err != nil {
			r.fail.add("request", err)
			continue
		}
		r.answered.add(res.RequestID)
		r.inTime.Add(1)
	}
}

// callPause paces each caller: the machine these tests run on has two
// cores, shared by three servers, three copies of seven workers and the
// test.
const callPause = 5 * time.Millisecond

// taskLoop asks for tasks and reads each back from the tasks worker: a
// task is acknowledged once its record says completed.
func (r *requests) taskLoop(ctx context.Context, stop <-chan struct{}) {
	from, to := r.callers[0], r.responders[0]
	for {
		select {
		case <-stop:
			return
		default:
		}
		n := float64(r.taskSeq.Add(1))
		id := protocol.NewID()
		r.sent.put(id, struct{}{})
		res, err := from.Request(ctx, to.ID(), "task", map[string]any{"n": n}, node.RequestOptions{ID: id})
		if err != nil {
			r.fail.add("task", err)
			continue
		}
		r.answered.add(res.RequestID)
		r.inTime.Add(1)
		if res.Task == nil {
			r.fail.add("task", fmt.Errorf("answered %q without a task", res.Status))
			continue
		}
		if r.readCompleted(ctx, res.Task) {
			r.tasksAcked.put(res.Task.ID, n)
		} else {
			r.tasksUnacked.Add(1)
		}
		res.Task.Close()
	}
}

// readCompleted reads a task's record until it says completed, for at
// most ten seconds: the updates are publishes the tasks worker may miss
// while a server is lost (a task left "working" is counted, not failed).
func (r *requests) readCompleted(ctx context.Context, h *node.TaskHandle) bool {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		gctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		rec, err := h.Get(gctx)
		cancel()
		if err == nil && rec["state"] == protocol.StateCompleted {
			return true
		}
		if err != nil && errs.CodeOf(err) != errs.TaskNotFound { // not recorded yet: read again
			r.fail.add("task-get", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

func (r *requests) close() {
	if r.callerNode != nil {
		_ = r.callerNode.Close()
	}
	if r.respNode != nil {
		_ = r.respNode.Close()
	}
}

// feed is one agent publishing the sequence 1, 2, 3 … on one state feed;
// every few publishes it reads the feed back through the feeds worker, and
// the highest sequence read is acknowledged.
type feed struct {
	cm    *clusterMesh
	fail  *failures
	node  *node.Node
	agent *node.Agent
	key   *keys.Agent
	sent  atomic.Int64
	acked atomic.Int64
}

const feedTopic = "reliability"

func (f *feed) open(ctx context.Context) error {
	f.key = newAgentKeys(f.cm.t, 1)[0]
	var err error
	if f.node, err = f.cm.startNode(ctx, "reliability-feed", []*keys.Agent{f.key}); err != nil {
		return err
	}
	f.agent, err = f.node.Host(ctx, node.AgentConfig{Key: f.key, Name: "reliability feed", AvailabilityClass: "always_on", Handler: refuse})
	return err
}

func (f *feed) run(ctx context.Context, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-time.After(5 * time.Millisecond):
		}
		n := f.sent.Add(1)
		if err := f.agent.PublishFeed(feedTopic, node.FeedState, map[string]any{"seq": n}); err != nil {
			f.fail.add("feed", err)
		}
		if n%5 != 0 {
			continue
		}
		gctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		seq, err := f.read(gctx)
		cancel()
		if err != nil {
			f.fail.add("feed-get", err)
			continue
		}
		if seq > f.acked.Load() {
			f.acked.Store(seq)
		}
	}
}

// read asks the feeds worker for the feed's latest envelope and returns
// its sequence (0 when none is stored).
func (f *feed) read(ctx context.Context) (int64, error) {
	rep, err := bus.Call(ctx, f.cm.svc, f.key, protocol.SubjFeedGet, protocol.TypeRequest, "",
		map[string]any{"agent": f.key.Public(), "topic": feedTopic})
	if err != nil {
		return 0, err
	}
	var out struct {
		Found    bool            `json:"found"`
		Envelope json.RawMessage `json:"envelope"`
	}
	if err := rep.DecodePayload(&out); err != nil || !out.Found {
		return 0, err
	}
	stored, err := protocol.Decode(out.Envelope)
	if err != nil {
		return 0, err
	}
	var p struct {
		Data struct {
			Seq int64 `json:"seq"`
		} `json:"data"`
	}
	if err := stored.DecodePayload(&p); err != nil {
		return 0, err
	}
	return p.Data.Seq, nil
}

// mail sends requests to agents whose node is not running, so they wait
// in the mailbox stream; it reads each box back through the mailbox worker
// (a fetch signed by the recipient, nothing acknowledged), and a message
// the worker returned is acknowledged mail. At the end the recipients come
// online and drain their boxes.
type mail struct {
	cm   *clusterMesh
	fail *failures
	// nc reads the boxes: a service connection whose replies arrive under
	// a private prefix (_MESH_INBOX.), the only kind the mailbox answers.
	nc     *nats.Conn
	sender *keys.Agent
	// boxes are the offline recipients, each taking perBox messages.
	boxes   []*keys.Agent
	perBox  int
	sent    idSet[string] // envelope id → recipient
	acked   idSet[string]
	handled idCounts
}

func (ml *mail) open(ctx context.Context, boxes, perBox int) error {
	ml.sender = newAgentKeys(ml.cm.t, 1)[0]
	ml.boxes = newAgentKeys(ml.cm.t, boxes)
	ml.perBox = perBox
	nc, err := ml.cm.m.ConnectService("reliability-mail", nats.CustomInboxPrefix(protocol.PrivateInboxPrefix(ml.sender.Public())))
	if err != nil {
		return err
	}
	ml.cm.t.Cleanup(nc.Close)
	ml.nc = nc
	// Registered, then gone: their nodes are closed and nothing listens.
	for _, group := range rosters(ml.boxes) {
		n, err := ml.cm.startNode(ctx, "reliability-mail-first", group)
		if err != nil {
			return err
		}
		for _, k := range group {
			if _, err := n.Host(ctx, node.AgentConfig{Key: k, Name: "reliability mailbox", AvailabilityClass: "intermittent",
				Handler: func(ctx context.Context, c *node.Call) error { return c.Reply(nil) }}); err != nil {
				_ = n.Close()
				return err
			}
		}
		_ = n.Close()
	}
	return nil
}

// rosters splits agents into node rosters of at most 16 (a node
// credential's limit).
func rosters(agents []*keys.Agent) [][]*keys.Agent {
	var out [][]*keys.Agent
	for len(agents) > 16 {
		out = append(out, agents[:16])
		agents = agents[16:]
	}
	return append(out, agents)
}

// send publishes one signed request to box, as a node's Request does
// (Nats-Msg-Id for the stream's dedupe), without waiting for an answer.
func (ml *mail) send(box *keys.Agent, n int) error {
	env, err := protocol.New(protocol.TypeRequest, ml.sender.Public(), map[string]any{"offering": "echo", "input": map[string]any{"n": n}})
	if err != nil {
		return err
	}
	env.To = box.Public()
	if err := env.Sign(ml.sender); err != nil {
		return err
	}
	data, err := env.Marshal()
	if err != nil {
		return err
	}
	ml.sent.put(env.ID, box.Public())
	return ml.cm.svc.PublishMsg(&nats.Msg{Subject: protocol.InboxSubject(box.Public()), Data: data,
		Header: nats.Header{nats.MsgIdHdr: []string{env.ID}}})
}

func (ml *mail) run(ctx context.Context, stop <-chan struct{}) {
	n := 0
	for {
		for _, box := range ml.boxes {
			// A box is read back after every ten messages sent to it: the
			// worker allows an agent 60 fetches in 10 s per copy.
			for range 10 {
				select {
				case <-stop:
					return
				case <-time.After(mailPause):
				}
				if n/len(ml.boxes) >= ml.perBox {
					continue
				}
				n++
				if err := ml.send(box, n); err != nil {
					ml.fail.add("mail", err)
				}
			}
			ml.readBack(ctx, box)
		}
	}
}

// mailPause paces the mail: ten messages a second.
const mailPause = 100 * time.Millisecond

// mailBoxes is how many offline recipients a run of d needs, at most 200
// messages each (a box holds 256) at ten a second.
func mailBoxes(d time.Duration) int { return max(4, int(d.Seconds())*10/200+2) }

// readBack fetches box without acknowledging anything and marks what it
// holds acknowledged.
func (ml *mail) readBack(ctx context.Context, box *keys.Agent) {
	after := uint64(0)
	for {
		fctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		got, res, err := mailbox.Fetch(fctx, ml.nc, box, after, mailbox.MaxFetch)
		cancel()
		if err != nil {
			ml.fail.add("mail-fetch", err)
			return
		}
		for _, m := range got {
			var e struct {
				ID string `json:"id"`
			}
			if json.Unmarshal(m.Data, &e) == nil && e.ID != "" {
				ml.acked.put(e.ID, box.Public())
			}
		}
		if !res.More || res.Last == after {
			return
		}
		after = res.Last
	}
}

// deliver brings every recipient online on new nodes, with a handler
// counting what it is given, and drains each box until a drain finds
// nothing.
func (ml *mail) deliver(ctx context.Context) ([]*node.Node, error) {
	var nodes []*node.Node
	fail := func(err error) ([]*node.Node, error) {
		for _, n := range nodes {
			_ = n.Close()
		}
		return nil, err
	}
	for _, group := range rosters(ml.boxes) {
		n, err := ml.cm.startNode(ctx, "reliability-mail-back", group)
		if err != nil {
			return fail(err)
		}
		nodes = append(nodes, n)
		for _, k := range group {
			a, err := n.Host(ctx, node.AgentConfig{Key: k, Name: "reliability mailbox", AvailabilityClass: "intermittent",
				Offerings: []node.Offering{{ID: "echo", Name: "Echo"}},
				Handler: func(ctx context.Context, c *node.Call) error {
					ml.handled.add(c.Env.ID)
					return c.Reply(map[string]any{"ok": true})
				}})
			if err != nil {
				return fail(err)
			}
			for a.DrainNow() > 0 {
			}
		}
	}
	return nodes, nil
}

// soakDuration is MESH_SOAK_DURATION (10m by default) when MESH_SOAK is
// set, else 0: the short run.
func soakDuration(t *testing.T) time.Duration {
	if os.Getenv("MESH_SOAK") == "" {
		return 0
	}
	d := 10 * time.Minute
	if v := os.Getenv("MESH_SOAK_DURATION"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			t.Fatalf("MESH_SOAK_DURATION=%q: %v", v, err)
		}
	}
	return d
}

// waitFor polls cond every 50 ms until it holds, failing the test with
// what when ctx ends first. It bounds a wait; it asserts no duration.
func waitFor(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("%s: gave up waiting (%v)", what, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}
