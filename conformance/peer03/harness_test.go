package peer03_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/adapter/daemon"
	"agentmesh.dev/mesh/adapter/node"
	"agentmesh.dev/mesh/devenv"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/protocol"
)

// The suite runs a real mesh in process (devenv: broker, JetStream, control
// plane, two copies of every bus worker), the sdk (a 0.3 client written from
// the wire up), this project's runtime (adapter/node) and the built
// mesh-adapter binary.

var adapterBinary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "peer03-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	adapterBinary = filepath.Join(dir, "mesh-adapter")
	out, err := exec.Command("go", "build", "-o", adapterBinary, "agentmesh.dev/mesh/adapter/cmd/mesh-adapter").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build mesh-adapter: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// wait bounds every wait for something asynchronous.
const wait = 10 * time.Second

type world struct {
	t    *testing.T
	m    *devenv.Mesh
	acct string
	base string // short: unix socket paths of the adapters live under it
}

func newWorld(t *testing.T) *world {
	t.Helper()
	ob, err := mail.NewOutbox(t.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	m, err := devenv.Start(context.Background(), devenv.Config{DataDir: t.TempDir(), Mail: ob, Workers: devenv.WorkerConfig{Copies: 2}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	a, _, err := m.Control().Accounts.CreateAccount(t.Context(), "peer03@example.org")
	if err != nil {
		t.Fatal(err)
	}
	base, err := os.MkdirTemp("", "p3")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	return &world{t: t, m: m, acct: a.ID, base: base}
}

// agentKey mints a single-use am_ key on the account.
func (w *world) agentKey(name string) string {
	w.t.Helper()
	g, err := w.m.Control().Accounts.AdminMintAgentKey(w.t.Context(), w.acct, name)
	if err != nil {
		w.t.Fatal(err)
	}
	return g.Token
}

func (w *world) post(path string, body any) map[string]any {
	w.t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(w.m.URLs().Control+path, "application/json", bytes.NewReader(b))
	if err != nil {
		w.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
		w.t.Fatalf("POST %s: %d %v %v", path, resp.StatusCode, out, err)
	}
	return out
}

// connectWS connects over the mesh's WebSocket, as the SDK does.
func (w *world) connectWS(jwt string, key keys.Signer, opts ...nats.Option) *nats.Conn {
	w.t.Helper()
	opts = append([]nats.Option{nats.UserJWT(func() (string, error) { return jwt, nil },
		func(n []byte) ([]byte, error) { return key.Sign(n), nil }), nats.Timeout(5 * time.Second)}, opts...)
	nc, err := nats.Connect(w.m.URLs().MeshWS, opts...)
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(nc.Close)
	return nc
}

// sdkAgent is an sdk agent as the SDK's quick start makes it: an am_ key
// exchanged with exactly {token, agent_id} (no proof, no private inbox),
// connected over WebSocket with the bootstrap credential and the default
// _INBOX reply prefix, registered as its own node on the plain subject.
func (w *world) sdkAgent(name string, tags ...string) *sdk {
	w.t.Helper()
	k, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		w.t.Fatal(err)
	}
	boot := w.post("/v1/bootstrap", map[string]any{"token": w.agentKey(name), "agent_id": k.Public()})
	ck, err := keys.FromSeed[keys.CredentialRole]([]byte(boot["seed"].(string)))
	if err != nil {
		w.t.Fatal(err)
	}
	s := newSDK(w.t, k, w.connectWS(boot["jwt"].(string), ck))
	if reg := s.registerStandalone(name, tags); reg["sandbox"] == true {
		w.t.Fatalf("a standalone sdk agent on an am_ credential was filed sandbox: %v", reg)
	}
	return s
}

// sdkGuest is an sdk agent on a guest lease, registered on the plain
// subject (the SDK has no guest door since 0.51).
func (w *world) sdkGuest(name string) (*sdk, map[string]any) {
	w.t.Helper()
	g := w.post("/v1/guest", map[string]any{})
	k, err := keys.FromSeed[keys.AgentRole]([]byte(g["seed"].(string)))
	if err != nil {
		w.t.Fatal(err)
	}
	s := newSDK(w.t, k, w.connectWS(g["jwt"].(string), k, nats.CustomInboxPrefix(g["inbox_prefix"].(string))))
	return s, s.registerStandalone(name, nil)
}

// runtime is an agent of this project's runtime on its own node, with the
// credential an adapter gets for an am_ key.
type runtime struct {
	*node.Agent
	key       *keys.Agent
	jwt, seed string // the credential, for a restart
	node      *node.Node
	replies   chan *node.Result // OnReply
}

func (w *world) runtime(name string, handler node.Handler) *runtime {
	w.t.Helper()
	k, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		w.t.Fatal(err)
	}
	red, err := daemon.Bootstrap(w.t.Context(), w.m.URLs().Control, w.agentKey(name), k, nil)
	if err != nil {
		w.t.Fatal(err)
	}
	return w.startRuntime(name, k, red.Credential.JWT, red.Credential.Seed, handler)
}

func (w *world) startRuntime(name string, k *keys.Agent, jwt, seed string, handler node.Handler) *runtime {
	w.t.Helper()
	nk, err := keys.FromSeed[keys.NodeRole]([]byte(seed))
	if err != nil {
		w.t.Fatal(err)
	}
	n, err := node.Start(w.t.Context(), node.Config{NATSURL: w.m.URLs().MeshTCP, NodeKey: nk,
		Credential: node.Credential{JWT: jwt, Sign: nk.SignNonce}, HeartbeatEvery: time.Second, DrainEvery: time.Second})
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { _ = n.Close() })
	if handler == nil {
		handler = func(ctx context.Context, c *node.Call) error { return c.Reply("unused") }
	}
	r := &runtime{key: k, jwt: jwt, seed: seed, node: n, replies: make(chan *node.Result, 16)}
	r.Agent, err = n.Host(w.t.Context(), node.AgentConfig{Key: k, Name: name, Handler: handler,
		Offerings: []node.Offering{{ID: "chat"}, {ID: "work"}}, AvailabilityClass: "always_on",
		OnReply: func(res *node.Result) { r.replies <- res }})
	if err != nil {
		w.t.Fatal(err)
	}
	return r
}

func (r *runtime) nextReply(t *testing.T) *node.Result {
	t.Helper()
	select {
	case res := <-r.replies:
		return res
	case <-time.After(wait):
		t.Fatal("no answer reached OnReply")
		return nil
	}
}

// adapter is a running mesh-adapter.
type adapter struct {
	w     *world
	state string
	id    string
	cmd   *exec.Cmd
	mu    sync.Mutex
	out   []string
	done  chan struct{}
}

// startAdapter runs `mesh-adapter <args>` (up or start) in its own state
// directory until the test ends, and waits for its agent id.
func (w *world) startAdapter(state string, args ...string) *adapter {
	w.t.Helper()
	a := &adapter{w: w, state: filepath.Join(w.base, state), done: make(chan struct{})}
	a.cmd = a.command(context.Background(), args...)
	stdout, err := a.cmd.StdoutPipe()
	if err != nil {
		w.t.Fatal(err)
	}
	a.cmd.Stderr = a.cmd.Stdout
	if err := a.cmd.Start(); err != nil {
		w.t.Fatal(err)
	}
	ids := make(chan string, 1)
	go func() {
		defer close(a.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			a.mu.Lock()
			a.out = append(a.out, sc.Text())
			a.mu.Unlock()
			if id, ok := strings.CutPrefix(sc.Text(), "agent id: "); ok {
				select {
				case ids <- strings.TrimSpace(id):
				default:
				}
			}
		}
		_ = a.cmd.Wait()
	}()
	w.t.Cleanup(a.stop)
	select {
	case a.id = <-ids:
		return a
	case <-a.done:
	case <-time.After(30 * time.Second):
	}
	w.t.Fatalf("mesh-adapter %v printed no agent id:\n%s", args, a.output())
	return nil
}

func (a *adapter) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, adapterBinary, append([]string{"--state-dir", a.state, "--control-url", a.w.m.URLs().Control}, args...)...)
	cmd.Env = append(os.Environ(), "MESH_ADAPTER_HOME=", "MESH_CONTROL_URL=", "MESH_REGISTRAR_URL=")
	return cmd
}

func (a *adapter) output() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return strings.Join(a.out, "\n")
}

func (a *adapter) stop() {
	if a.cmd.Process == nil {
		return
	}
	_ = a.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-a.done:
	case <-time.After(15 * time.Second):
		_ = a.cmd.Process.Kill()
		<-a.done
	}
}

// run runs a short command against the adapter's state directory.
func (a *adapter) run(args ...string) (stdout, stderr string, code int) {
	a.w.t.Helper()
	// Killed after a minute, so that a regression fails instead of hanging.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := a.command(ctx, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		a.w.t.Fatalf("mesh-adapter %v: %v", args, err)
	}
	return o.String(), e.String(), code
}

// inbox is `inbox --json`.
func (a *adapter) inbox() []map[string]any {
	a.w.t.Helper()
	out, errOut, code := a.run("inbox", "--json")
	if code != 0 {
		a.w.t.Fatalf("inbox: %d %s", code, errOut)
	}
	var msgs []map[string]any
	if err := json.Unmarshal([]byte(out), &msgs); err != nil {
		a.w.t.Fatal(err)
	}
	return msgs
}

// waitInbox waits for an inbox message whose text is text.
func (a *adapter) waitInbox(text string) map[string]any {
	a.w.t.Helper()
	for deadline := time.Now().Add(wait); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		for _, m := range a.inbox() {
			if m["text"] == text {
				return m
			}
		}
	}
	a.w.t.Fatalf("%q never reached the inbox of %s", text, a.id)
	return nil
}

// taskRecord reads mesh.task.get.<id> as signer (a party to the task).
func (w *world) taskRecord(s *sdk, taskID string) map[string]any {
	w.t.Helper()
	return s.busCall(protocol.TaskGetSubject(taskID), protocol.TypeRequest, map[string]any{})
}

// eventually polls cond until it holds or wait passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(wait); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}
