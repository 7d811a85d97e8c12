package node

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/devenv"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// asyncWait bounds every wait for something asynchronous; silence until
// then is a failure.
const asyncWait = 5 * time.Second

// testMesh is a real mesh (devenv: broker, JetStream, control plane and
// every bus worker: the mailbox worker makes the mailbox stream and reads
// it for the nodes, the tasks worker keeps task records, presence reads heartbeats).
type testMesh struct {
	m   *devenv.Mesh
	svc *nats.Conn // a service connection, for the test's own traffic
	js  jetstream.JetStream
}

func newMesh(t *testing.T) *testMesh {
	t.Helper()
	// Three copies of every worker, as the issue requires of these tests:
	// one registration per agent, one reply per request, no duplicated events.
	m, err := devenv.Start(t.Context(), devenv.Config{DataDir: t.TempDir(), Workers: devenv.WorkerConfig{Copies: 3}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	svc, err := m.ConnectService("test-client")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	js, err := jetstream.New(svc)
	if err != nil {
		t.Fatal(err)
	}
	tm := &testMesh{m: m, svc: svc, js: js}
	// The workers subscribe on their own connections: wait until the
	// broker routes registrations to them.
	eventually(t, "the registry worker", func() bool {
		_, err := svc.Request(protocol.SubjRegister, []byte("{}"), time.Second)
		return !errors.Is(err, nats.ErrNoResponders)
	})
	return tm
}

// mailboxStored is how many messages the mailbox still holds for agent
// (on its open and guarded inboxes): what no drain has deleted yet.
func (tm *testMesh) mailboxStored(t *testing.T, agent string) uint64 {
	t.Helper()
	st, err := tm.js.Stream(t.Context(), protocol.MailboxStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(t.Context(), jetstream.WithSubjectFilter("mesh.agent."+agent+".>"))
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, c := range info.State.Subjects {
		n += c
	}
	return n
}

// registered reads an agent's registration (mesh.registry.get.<id>),
// asked by signer.
func (tm *testMesh) registered(t *testing.T, signer *keys.Agent, agent string) map[string]any {
	t.Helper()
	rep, err := bus.Call(t.Context(), tm.svc, signer, protocol.RegistryGetSubject(agent), protocol.TypeDiscover, "", map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	var man map[string]any
	if err := rep.DecodePayload(&man); err != nil {
		t.Fatal(err)
	}
	return man
}

func agentKey(t *testing.T) *keys.Agent { return bustest.Agent(t) }
func nodeKey(t *testing.T) *keys.Node   { return bustest.Node(t) }

// nodeCredential mints a node credential for the roster, signed in by the
// node key, as POST /v1/node-credential would.
func (tm *testMesh) nodeCredential(t *testing.T, nk *keys.Node, expires time.Time, agents ...*keys.Agent) Credential {
	t.Helper()
	ids := make([]string, len(agents))
	for i, a := range agents {
		ids[i] = a.Public()
	}
	tok, err := tm.m.Trust().MintUser(creds.UserSpec{
		PublicKey: nk.Public(), Name: "node", Kind: creds.KindNode, Hosted: ids,
		Permissions: creds.NodePermissions(ids, creds.PrivateOnly(nk.Public())), Expires: expires,
	})
	if err != nil {
		t.Fatal(err)
	}
	return Credential{JWT: tok, Sign: nk.SignNonce}
}

// startNode starts a node for the roster with a 1-hour credential.
func (tm *testMesh) startNode(t *testing.T, nk *keys.Node, agents []*keys.Agent, edit func(*Config)) *Node {
	t.Helper()
	cfg := Config{
		NATSURL:    tm.m.URLs().MeshTCP,
		NodeKey:    nk,
		Credential: tm.nodeCredential(t, nk, time.Now().Add(time.Hour), agents...),
	}
	if edit != nil {
		edit(&cfg)
	}
	n, err := Start(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}

// host hosts an agent (the registry gives it its mailbox).
func (tm *testMesh) host(t *testing.T, n *Node, cfg AgentConfig) *Agent {
	t.Helper()
	if cfg.Name == "" {
		cfg.Name = "agent"
	}
	a, err := n.Host(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// pair is the usual setup: agent a on node A asks agent b on node B.
type pair struct {
	tm         *testMesh
	nA, nB     *Node
	a, b       *Agent
	kA, kB     *keys.Agent
	nkA, nkB   *keys.Node
	warnB      *warnings
	repliesToA chan *Result
}

func newPair(t *testing.T, tm *testMesh, b AgentConfig, editB func(*Config)) *pair {
	t.Helper()
	p := &pair{tm: tm, kA: agentKey(t), kB: agentKey(t), nkA: nodeKey(t), nkB: nodeKey(t), warnB: &warnings{}, repliesToA: make(chan *Result, 64)}
	p.nA = tm.startNode(t, p.nkA, []*keys.Agent{p.kA}, nil)
	p.nB = tm.startNode(t, p.nkB, []*keys.Agent{p.kB}, func(c *Config) {
		c.Warn = p.warnB.add
		if editB != nil {
			editB(c)
		}
	})
	p.a = tm.host(t, p.nA, AgentConfig{Key: p.kA, Name: "caller", Handler: refuseAll, OnReply: func(r *Result) { p.repliesToA <- r }})
	b.Key = p.kB
	p.b = tm.host(t, p.nB, b)
	return p
}

func refuseAll(ctx context.Context, c *Call) error {
	return errs.New(errs.OfferingNotFound, "this agent serves nothing")
}

// warnings collects warnings.
type warnings struct {
	mu   sync.Mutex
	list []Warning
}

func (w *warnings) add(x Warning) {
	w.mu.Lock()
	w.list = append(w.list, x)
	w.mu.Unlock()
}

func (w *warnings) codes() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]string, len(w.list))
	for i, x := range w.list {
		out[i] = x.Code
	}
	return out
}

func (w *warnings) has(code string) bool {
	for _, c := range w.codes() {
		if c == code {
			return true
		}
	}
	return false
}

// eventually polls cond until it holds or asyncWait passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(asyncWait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// collector subscribes subject on the service connection and keeps the
// messages.
type collector struct {
	mu   sync.Mutex
	msgs []*nats.Msg
}

func (tm *testMesh) collect(t *testing.T, subject string) *collector {
	t.Helper()
	c := &collector{}
	sub, err := tm.svc.Subscribe(subject, func(m *nats.Msg) {
		c.mu.Lock()
		c.msgs = append(c.msgs, m)
		c.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := tm.svc.Flush(); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *collector) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.msgs)
}

// envelopes decodes (and so verifies) every collected message.
func (c *collector) envelopes(t *testing.T) []*protocol.Envelope {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*protocol.Envelope, 0, len(c.msgs))
	for _, m := range c.msgs {
		e, err := protocol.Decode(m.Data)
		if err != nil {
			t.Fatalf("collected an envelope that does not verify: %v", err)
		}
		out = append(out, e)
	}
	return out
}

func statuses(envs []*protocol.Envelope) []string {
	out := make([]string, len(envs))
	for i, e := range envs {
		out[i] = protocol.ResponseStatus(e)
	}
	return out
}

// rawRequest signs a request from signer (with from possibly forged by
// edit after signing) and publishes it on subject with a fresh reply inbox;
// it returns the collector of that inbox.
func (tm *testMesh) rawRequest(t *testing.T, subject string, env *protocol.Envelope) *collector {
	t.Helper()
	data, err := env.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return tm.rawPublish(t, subject, data)
}

func (tm *testMesh) rawPublish(t *testing.T, subject string, data []byte) *collector {
	t.Helper()
	inbox := nats.NewInbox()
	c := tm.collect(t, inbox)
	if err := tm.svc.PublishRequest(subject, inbox, data); err != nil {
		t.Fatal(err)
	}
	return c
}

// requestEnv is a request from a protocol 0.2-style peer, which reads its
// answers on the reply subject (requestEnv03 is a 0.3 client's).
func requestEnv(t *testing.T, from *keys.Agent, to, offering string, input any) *protocol.Envelope {
	t.Helper()
	return versionedRequest(t, "0.2.0", from, to, offering, input)
}

// requestEnv03 is a request from a protocol 0.3 client, which reads its
// answers at its own inbox (upstream-notes §15).
func requestEnv03(t *testing.T, from *keys.Agent, to, offering string, input any) *protocol.Envelope {
	t.Helper()
	return versionedRequest(t, "0.3.0", from, to, offering, input)
}

func versionedRequest(t *testing.T, v string, from *keys.Agent, to, offering string, input any) *protocol.Envelope {
	t.Helper()
	e, err := protocol.New(protocol.TypeRequest, from.Public(), map[string]any{"offering": offering, "input": input})
	if err != nil {
		t.Fatal(err)
	}
	e.V, e.To = v, to
	if err := e.Sign(from); err != nil {
		t.Fatal(err)
	}
	return e
}

func codeOf(err error) errs.Code { return errs.CodeOf(err) }

func mustCode(t *testing.T, err error, want errs.Code) {
	t.Helper()
	if got := codeOf(err); got != want {
		t.Fatalf("error %v: code %q, want %q", err, got, want)
	}
}
