package reliability

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/mailbox"
	"agentmesh.dev/mesh/shared/protocol"
)

// This file holds what the SIGKILL test needs to drive a meshd process from
// outside, through its public doors only: the HTTP routes, the operator's
// admin socket, the outbox directory, and the bus with the credentials the
// control plane mints. Names start with crash so that the cluster tests of
// the same package never meet them.

// crashBuildMeshd builds cmd/meshd into dir and returns the binary's path.
func crashBuildMeshd(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "meshd")
	cmd := exec.Command("go", "build", "-o", bin, "agentmesh.dev/mesh/cmd/meshd")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/meshd: %v\n%s", err, out)
	}
	return bin
}

// crashURLs is meshd.json.
type crashURLs struct {
	Control string `json:"control_url"`
	MeshTCP string `json:"mesh_tcp_url"`
	MeshWS  string `json:"mesh_ws_url"`
}

// crashMeshd is one meshd process on a data directory, started again on
// the same directory and ports after each kill.
type crashMeshd struct {
	t       *testing.T
	bin     string
	dir     string
	logPath string
	// addrs are the listen addresses: 127.0.0.1:0 the first time, then the
	// ports that start bound, so clients find the mesh where it was.
	httpAddr, natsAddr, wsAddr string
	extra                      []string

	cmd    *exec.Cmd
	exited chan struct{}
	urls   crashURLs
	starts int
}

func crashNewMeshd(t *testing.T, bin string, extra ...string) *crashMeshd {
	dir := t.TempDir()
	m := &crashMeshd{t: t, bin: bin, dir: filepath.Join(dir, "mesh"), logPath: filepath.Join(dir, "meshd.log"),
		httpAddr: "127.0.0.1:0", natsAddr: "127.0.0.1:0", wsAddr: "127.0.0.1:0", extra: extra}
	t.Cleanup(func() {
		if m.running() {
			// A clean stop at the end, so the data directory's files are
			// closed before the temp dir is removed.
			_ = m.cmd.Process.Signal(os.Interrupt)
			select {
			case <-m.exited:
			case <-time.After(10 * time.Second):
				_ = m.cmd.Process.Kill()
				<-m.exited
			}
		}
		if t.Failed() {
			if log, err := os.ReadFile(m.logPath); err == nil {
				t.Logf("meshd log (last 4 KiB):\n%s", crashTail(log, 4<<10))
			}
		}
	})
	return m
}

func crashTail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

func (m *crashMeshd) running() bool {
	if m.cmd == nil {
		return false
	}
	select {
	case <-m.exited:
		return false
	default:
		return true
	}
}

// start runs meshd and waits until it has written meshd.json (which it does
// once the broker, the workers and the HTTP server are up).
func (m *crashMeshd) start() {
	t := m.t
	t.Helper()
	jsonPath := filepath.Join(m.dir, "meshd.json")
	// meshd.json stays after a kill; a fresh one says this start is ready.
	if err := os.Remove(jsonPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	logf, err := os.OpenFile(m.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(logf, "\n=== start %d\n", m.starts+1)
	args := append([]string{"--data-dir", m.dir, "--http-addr", m.httpAddr, "--nats-addr", m.natsAddr,
		"--ws-addr", m.wsAddr, "--log-level", "warn"}, m.extra...)
	cmd := exec.Command(m.bin, args...)
	// Nothing of the developer's MESHD_* or MESH_* variables.
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "TMPDIR=" + os.TempDir()}
	cmd.Stdout, cmd.Stderr = io.Discard, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatal(err)
	}
	m.cmd, m.exited = cmd, make(chan struct{})
	m.starts++
	go func(exited chan struct{}) {
		_ = cmd.Wait()
		logf.Close()
		close(exited)
	}(m.exited)

	deadline := time.Now().Add(60 * time.Second)
	for {
		if data, err := os.ReadFile(jsonPath); err == nil {
			if err := json.Unmarshal(data, &m.urls); err != nil {
				t.Fatalf("meshd.json: %v\n%s", err, data)
			}
			break
		}
		select {
		case <-m.exited:
			log, _ := os.ReadFile(m.logPath)
			t.Fatalf("meshd exited before it was ready (start %d):\n%s", m.starts, crashTail(log, 4<<10))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("meshd not ready after 60 s (start %d)", m.starts)
		}
	}
	// Later starts reuse the ports this one bound.
	m.httpAddr = crashHostPort(t, m.urls.Control)
	m.natsAddr = crashHostPort(t, m.urls.MeshTCP)
	m.wsAddr = crashHostPort(t, m.urls.MeshWS)
}

func crashHostPort(t *testing.T, raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		t.Fatalf("meshd.json has no address in %q", raw)
	}
	return u.Host
}

// kill ends meshd with SIGKILL, as the kernel's OOM killer or a crash
// would, and waits until it is gone.
func (m *crashMeshd) kill() {
	m.t.Helper()
	if err := m.cmd.Process.Signal(os.Kill); err != nil {
		m.t.Fatalf("SIGKILL: %v", err)
	}
	<-m.exited
}

// ---------------------------------------------------------------------------
// The control plane over HTTP

// crashClient calls the control plane's routes and the admin socket. Its
// errors are returned, not fatal: while meshd is killed under it, a request
// failing is expected.
type crashClient struct {
	base  string
	http  *http.Client
	admin *http.Client
}

func crashNewClient(m *crashMeshd) *crashClient {
	sock := filepath.Join(m.dir, "admin.sock")
	return &crashClient{
		base: m.urls.Control,
		// No keep-alive: a pooled connection to a killed meshd would fail
		// the first request after the restart.
		http: &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
			DialContext: crashDialManyAddrs}},
		admin: &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "unix", sock)
			}}},
	}
}

// crashSource picks the next loopback source address.
var crashSource atomic.Uint32

// crashDialManyAddrs dials from 127.0.0.2–127.0.0.201 in turn: the load
// comes from many client addresses, as real traffic does, so the control
// plane's per-address limit of every route (600 requests a minute) does
// not throttle a load and its checks that all come from one test. Where
// the system does not route all of 127/8 to the loopback (it does on
// Linux), it dials from the default address.
func crashDialManyAddrs(ctx context.Context, network, addr string) (net.Conn, error) {
	src := net.IPv4(127, 0, 0, byte(2+crashSource.Add(1)%200))
	c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: src}}).DialContext(ctx, network, addr)
	if err != nil && errors.Is(err, syscall.EADDRNOTAVAIL) {
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}
	return c, err
}

// crashErrStatus is an answer that is not 2xx.
type crashErrStatus struct {
	Status int
	Body   map[string]any
}

func (e *crashErrStatus) Error() string { return fmt.Sprintf("HTTP %d: %v", e.Status, e.Body) }

// crashStatusOf is the HTTP status of an answered refusal, 0 for a transport
// error.
func crashStatusOf(err error) int {
	var e *crashErrStatus
	if errors.As(err, &e) {
		return e.Status
	}
	return 0
}

func (c *crashClient) do(ctx context.Context, hc *http.Client, method, u string, body any, bearer string) (map[string]any, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("%s %s: %d, not JSON: %.200s", method, u, resp.StatusCode, raw)
	}
	if resp.StatusCode/100 != 2 {
		return out, &crashErrStatus{Status: resp.StatusCode, Body: out}
	}
	return out, nil
}

// call sends one request to a control-plane route. An answer 429 (the
// per-address limit of every route, 600 a minute, which the checks after a
// long soak run can reach) is waited out and sent again.
func (c *crashClient) call(ctx context.Context, method, path string, body any, bearer string) (map[string]any, error) {
	for {
		out, err := c.do(ctx, c.http, method, c.base+path, body, bearer)
		if crashStatusOf(err) != http.StatusTooManyRequests {
			return out, err
		}
		wait := time.Second
		if ms, ok := out["retry_after_ms"].(float64); ok && ms > 0 {
			wait = time.Duration(ms) * time.Millisecond
		}
		select {
		case <-ctx.Done():
			return out, err
		case <-time.After(wait):
		}
	}
}

func (c *crashClient) adminCall(ctx context.Context, path string, body any) (map[string]any, error) {
	return c.do(ctx, c.admin, http.MethodPost, "http://meshd"+path, body, "")
}

var crashCodeRE = regexp.MustCompile(`\b(\d{6})\b`)

// mailedCode waits for the sign-in code mailed to addr in the outbox
// directory (meshd writes mail there on one machine: docs/meshd.md).
func (m *crashMeshd) mailedCode(ctx context.Context, addr string) (string, error) {
	dir := filepath.Join(m.dir, "outbox")
	for {
		msgs, err := mail.ReadOutbox(dir)
		if err != nil {
			return "", err
		}
		for _, msg := range msgs {
			if (msg.To == addr || strings.HasSuffix(msg.To, "<"+addr+">")) && msg.Kind != "agent-key" {
				if c := crashCodeRE.FindStringSubmatch(msg.Text); c != nil {
					return c[1], nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("no code mailed to %s: %w", addr, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// signUp makes an account through POST /v1/accounts and the mailed code.
func (c *crashClient) signUp(ctx context.Context, m *crashMeshd, email string) (id, token string, err error) {
	if _, err := c.call(ctx, http.MethodPost, "/v1/accounts", map[string]any{"email": email}, ""); err != nil {
		return "", "", fmt.Errorf("sign-up: %w", err)
	}
	mctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	code, err := m.mailedCode(mctx, email)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			// meshd answered 202 and mailed nothing.
			err = &crashErrStatus{Status: http.StatusAccepted, Body: map[string]any{"error": err.Error()}}
		}
		return "", "", err
	}
	out, err := c.call(ctx, http.MethodPost, "/v1/login/verify", map[string]any{"email": email, "code": code}, "")
	if err != nil {
		return "", "", fmt.Errorf("verify: %w", err)
	}
	id, _ = out["account_id"].(string)
	token, _ = out["token"].(string)
	if id == "" || token == "" {
		return "", "", fmt.Errorf("verify answered %v", out)
	}
	return id, token, nil
}

// mintKey mints an am_ key for account through the operator's socket
// (the HTTP route wants a fresh passkey assertion, which is a browser's).
func (c *crashClient) mintKey(ctx context.Context, account, name string) (id, token string, err error) {
	out, err := c.adminCall(ctx, "/admin/agent-tokens", map[string]any{"account": account, "name": name})
	if err != nil {
		return "", "", fmt.Errorf("mint: %w", err)
	}
	id, _ = out["id"].(string)
	token, _ = out["token"].(string)
	if id == "" || !strings.HasPrefix(token, "am_") {
		return "", "", fmt.Errorf("mint answered %v", out)
	}
	return id, token, nil
}

// crashCred is a bootstrap credential: what POST /v1/bootstrap answers.
type crashCred struct {
	Creds       string
	InboxPrefix string
	// Node is the credential's key, which mesh-adapter makes its node key:
	// it signs the vouch.
	Node *keys.Node
}

// bootstrap exchanges token for agent's credential, with the agent's proof
// of possession, as mesh-adapter does.
func (c *crashClient) bootstrap(ctx context.Context, token string, agent *keys.Agent) (*crashCred, error) {
	out, err := c.call(ctx, http.MethodPost, "/v1/bootstrap", map[string]any{"token": token, "agent_id": agent.Public(),
		"proof": protocol.SignBootstrap(agent, token), "private_inbox": true}, "")
	if err != nil {
		return nil, err
	}
	seed, _ := out["seed"].(string)
	node, err := keys.FromSeed[keys.NodeRole]([]byte(seed))
	if err != nil {
		return nil, fmt.Errorf("bootstrap answered no usable seed: %w", err)
	}
	cr := &crashCred{Node: node}
	cr.Creds, _ = out["creds"].(string)
	cr.InboxPrefix, _ = out["inbox_prefix"].(string)
	if cr.Creds == "" || cr.InboxPrefix == "" {
		return nil, fmt.Errorf("bootstrap answered %v", out)
	}
	return cr, nil
}

// agentTokens lists an account's agent keys by id: their state and agent.
func (c *crashClient) agentTokens(ctx context.Context, account, session string) (map[string]map[string]any, error) {
	out, err := c.call(ctx, http.MethodGet, "/v1/accounts/"+account+"/agent-tokens", nil, session)
	if err != nil {
		return nil, err
	}
	list, _ := out["agent_tokens"].([]any)
	byID := map[string]map[string]any{}
	for _, it := range list {
		if m, ok := it.(map[string]any); ok {
			id, _ := m["id"].(string)
			byID[id] = m
		}
	}
	return byID, nil
}

// ---------------------------------------------------------------------------
// The bus

// connect opens a connection with a bootstrap credential. It does not
// reconnect: when meshd is killed the connection closes and every call on
// it fails at once.
func (cr *crashCred) connect(natsURL, name string) (*nats.Conn, error) {
	return nats.Connect(natsURL, nats.UserCredentialBytes([]byte(cr.Creds)), nats.CustomInboxPrefix(cr.InboxPrefix),
		nats.NoReconnect(), nats.Name(name), nats.Timeout(5*time.Second))
}

// register registers agent with a vouch of its node (the credential key),
// as adapter/node does (docs/bus.md "Manifest").
func crashRegister(ctx context.Context, nc *nats.Conn, agent *keys.Agent, node *keys.Node) error {
	now := time.Now()
	v, err := protocol.NewVouch(node, agent.Public(), now, now.Add(72*time.Hour))
	if err != nil {
		return err
	}
	manifest := map[string]any{
		"id": agent.Public(), "name": "crash-" + agent.Public()[:8], "protocol_version": protocol.Version,
		"endpoint":     protocol.InboxSubject(agent.Public()),
		"node":         map[string]any{"id": node.Public(), "attestation": v},
		"capabilities": []string{}, "offerings": []any{},
	}
	rep, err := bus.Call(ctx, nc, agent, protocol.SubjRegister, protocol.TypeRegister, "", manifest)
	if err != nil {
		return err
	}
	var out struct {
		Status string `json:"status"`
	}
	if err := rep.DecodePayload(&out); err != nil {
		return err
	}
	if out.Status != "registered" {
		return fmt.Errorf("register answered %q", out.Status)
	}
	return nil
}

// registration reads agent's registration (mesh.registry.get.<agent>):
// the node it names, or "" when there is none.
func crashRegistration(ctx context.Context, nc *nats.Conn, asker *keys.Agent, agent string) (node string, err error) {
	rep, err := bus.Call(ctx, nc, asker, protocol.RegistryGetSubject(agent), protocol.TypeDiscover, "", nil)
	if err != nil {
		return "", err
	}
	var out struct {
		ID   string `json:"id"`
		Node struct {
			ID string `json:"id"`
		} `json:"node"`
	}
	if err := rep.DecodePayload(&out); err != nil {
		return "", err
	}
	if out.ID != agent {
		return "", fmt.Errorf("registry answered %s for %s", out.ID, agent)
	}
	return out.Node.ID, nil
}

// mailTo publishes one signed request from sender to recipient's inbox and
// returns its id. Nobody listens there: the mailbox stream keeps it.
func crashMailTo(nc *nats.Conn, sender *keys.Agent, recipient string, n int) (string, error) {
	e, err := protocol.New(protocol.TypeRequest, sender.Public(), map[string]any{"offering": "chat",
		"input": map[string]any{"text": fmt.Sprintf("mail %d", n)}})
	if err != nil {
		return "", err
	}
	e.To = recipient
	if err := e.Sign(sender); err != nil {
		return "", err
	}
	data, err := e.Marshal()
	if err != nil {
		return "", err
	}
	return e.ID, nc.Publish(protocol.InboxSubject(recipient), data)
}

// crashMailbox reads all of agent's mail (every page) without deleting
// it: the envelope ids by stream sequence, and the box and last sequence
// for an ack.
func crashMailbox(ctx context.Context, nc *nats.Conn, agent *keys.Agent) (ids map[uint64]string, box string, last uint64, err error) {
	ids = map[uint64]string{}
	var after uint64
	for {
		msgs, res, err := mailbox.Fetch(ctx, nc, agent, after, mailbox.MaxFetch)
		if err != nil {
			return nil, "", 0, err
		}
		for _, m := range msgs {
			e, err := protocol.Decode(m.Data)
			if err != nil {
				return nil, "", 0, fmt.Errorf("mail #%d does not decode: %w", m.Seq, err)
			}
			ids[m.Seq] = e.ID
		}
		box, last, after = res.Box, res.Last, res.Last
		if !res.More {
			return ids, box, last, nil
		}
	}
}

// ---------------------------------------------------------------------------
// What the mesh acknowledged

// crashAgent is an agent whose am_ key was exchanged.
type crashAgent struct {
	key  *keys.Agent
	cred *crashCred
}

// crashKey is a minted am_ key and what became of it.
type crashKey struct {
	id, token, account string
	// round is the round that minted it; a spare is left for the next
	// round to exchange, so a key minted before a kill is used after it.
	round int
	spare bool
	// attempted: an exchange was sent; consumed: one was answered 200.
	// An exchange cut off by the kill is attempted and not consumed, and
	// may or may not have been spent.
	attempted bool
	consumed  *crashAgent
}

// crashLedger records every write the mesh acknowledged, which the test
// then expects to find after each restart. It is safe for concurrent use.
type crashLedger struct {
	mu         sync.Mutex
	accounts   map[string]string // account id → session token
	keys       []*crashKey
	registered map[string]string // agent id → the node its registration names
	// sent is every mail published; confirmed the ones a fetch has shown
	// stored (the mailbox stream takes a publish without an ack, so being
	// read back is its acknowledgement); acked the ones deleted by an ack
	// the worker answered.
	sent, confirmed, acked map[string]string // mail id → recipient
}

func newCrashLedger() *crashLedger {
	return &crashLedger{accounts: map[string]string{}, registered: map[string]string{},
		sent: map[string]string{}, confirmed: map[string]string{}, acked: map[string]string{}}
}

// crashCounts are the ledger's sizes, for progress and the report.
type crashCounts struct {
	accounts, keys, consumed, registered int
	// sparesUsed counts spare keys exchanged in a later round than their
	// mint; inFlight exchanges sent and never answered (cut by a kill).
	sparesUsed, inFlight int
	// sent, stored (confirmed and not yet deleted) and deleted mail.
	sent, stored, deleted int
}

func (l *crashLedger) counts() crashCounts {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := crashCounts{accounts: len(l.accounts), keys: len(l.keys), registered: len(l.registered), sent: len(l.sent),
		stored: len(l.confirmed), deleted: len(l.acked)}
	for _, k := range l.keys {
		switch {
		case k.consumed != nil && k.spare:
			c.sparesUsed++
			c.consumed++
		case k.consumed != nil:
			c.consumed++
		case k.attempted:
			c.inFlight++
		}
	}
	return c
}

// takeKey hands out a minted key nobody has tried to exchange yet: first a
// spare of an earlier round, else any key that is not a spare.
func (l *crashLedger) takeKey(round int) *crashKey {
	l.mu.Lock()
	defer l.mu.Unlock()
	var pick *crashKey
	for _, k := range l.keys {
		if k.attempted {
			continue
		}
		if k.spare && k.round < round {
			pick = k
			break
		}
		if !k.spare && pick == nil {
			pick = k
		}
	}
	if pick != nil {
		pick.attempted = true
	}
	return pick
}

// ---------------------------------------------------------------------------
// Worker copies, through the broker's system account

// crashConnz lists the mesh account's connections named with prefix:
// their connection ids by name, and the broker's server id.
func crashConnz(ctx context.Context, sys *nats.Conn, account, prefix string) (server string, cids map[string]uint64, err error) {
	req, _ := json.Marshal(map[string]any{"acc": account, "limit": 10000})
	msg, err := sys.RequestWithContext(ctx, "$SYS.REQ.SERVER.PING.CONNZ", req)
	if err != nil {
		return "", nil, fmt.Errorf("connz: %w", err)
	}
	var out struct {
		Server struct {
			ID string `json:"id"`
		} `json:"server"`
		Data struct {
			Conns []struct {
				Cid  uint64 `json:"cid"`
				Name string `json:"name"`
			} `json:"connections"`
		} `json:"data"`
	}
	if err := json.Unmarshal(msg.Data, &out); err != nil {
		return "", nil, fmt.Errorf("connz: %w", err)
	}
	cids = map[string]uint64{}
	for _, c := range out.Data.Conns {
		if strings.HasPrefix(c.Name, prefix) {
			cids[c.Name] = c.Cid
		}
	}
	return out.Server.ID, cids, nil
}

// crashKick closes connections at the broker (a copy's process dying
// looks the same to everyone else: its connection is gone, and what it
// held unanswered with it).
func crashKick(ctx context.Context, sys *nats.Conn, server string, cids map[string]uint64) error {
	for name, cid := range cids {
		req, _ := json.Marshal(map[string]any{"cid": cid})
		msg, err := sys.RequestWithContext(ctx, "$SYS.REQ.SERVER."+server+".KICK", req)
		if err != nil {
			return fmt.Errorf("kick %s: %w", name, err)
		}
		var out struct {
			Error *struct {
				Description string `json:"description"`
			} `json:"error"`
		}
		if err := json.Unmarshal(msg.Data, &out); err != nil || out.Error != nil {
			return fmt.Errorf("kick %s: %s %v", name, msg.Data, err)
		}
	}
	return nil
}
