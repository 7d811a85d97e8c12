package devenv_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/devenv"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/mail/mailtest"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/testclock"
)

// clock is the control plane's clock in tests: real time plus an offset
// the test can move forward (the broker keeps real time).
type clock = testclock.Clock

// cp is a running mesh with a real SMTP server receiving its mail.
type cp struct {
	t     *testing.T
	m     *devenv.Mesh
	smtp  *mailtest.Server
	clock *clock
	base  string
	dir   string
}

func startCP(t *testing.T, mut ...func(*devenv.Config)) *cp {
	t.Helper()
	srv := mailtest.Start(t)
	sender, err := mail.NewSMTP(mail.SMTPConfig{Addr: srv.Addr(), From: "mesh@mesh.test", TLS: mail.StartTLSNone})
	if err != nil {
		t.Fatal(err)
	}
	c := &cp{t: t, smtp: srv, clock: &clock{}, dir: t.TempDir()}
	cfg := devenv.Config{DataDir: c.dir, Mail: sender, Now: c.clock.Now, MeshName: "test-mesh", MarkupPct: 10}
	if cpStore != nil {
		cfg.Store = cpStore(t)
	}
	for _, f := range mut {
		f(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c.m, err = devenv.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.m.Close() })
	c.base = c.m.URLs().Control
	return c
}

// do sends a JSON request and decodes the JSON answer.
func (c *cp) do(method, path string, body any, bearer string) (int, map[string]any) {
	c.t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			c.t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	raw, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(raw, &out); err != nil {
		c.t.Fatalf("%s %s: %d, not JSON: %s", method, path, resp.StatusCode, raw)
	}
	return resp.StatusCode, out
}

func (c *cp) post(path string, body any, bearer string) (int, map[string]any) {
	return c.do(http.MethodPost, path, body, bearer)
}

var codeRE = regexp.MustCompile(`\b(\d{6})\b`)

// mailedCode waits for the next mail to addr and returns the code in it.
func (c *cp) mailedCode(addr string) string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	msg, err := c.smtp.Wait(ctx, addr)
	if err != nil {
		c.t.Fatalf("no mail to %s: %v", addr, err)
	}
	m := codeRE.FindStringSubmatch(msg.Message.Text)
	if m == nil {
		c.t.Fatalf("no code in mail: %q", msg.Message.Text)
	}
	return m[1]
}

// signIn creates (or signs in to) the account of email through the HTTP
// routes and returns its id and a session token.
func (c *cp) signIn(email string) (accountID, token string) {
	c.t.Helper()
	if st, out := c.post("/v1/accounts", map[string]any{"email": email}, ""); st != http.StatusAccepted {
		c.t.Fatalf("sign-up: %d %v", st, out)
	}
	code := c.mailedCode(email)
	st, out := c.post("/v1/login/verify", map[string]any{"email": email, "code": code}, "")
	if st != 200 {
		c.t.Fatalf("verify: %d %v", st, out)
	}
	return out["account_id"].(string), out["token"].(string)
}

// agentKey mints an am_ key as the operator would.
func (c *cp) agentKey(accountID, name string) string {
	c.t.Helper()
	g, err := c.m.Control().Accounts.AdminMintAgentKey(context.Background(), accountID, name)
	if err != nil {
		c.t.Fatal(err)
	}
	return g.Token
}

func newAgent(t *testing.T) *keys.Agent {
	t.Helper()
	k, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func newNode(t *testing.T) *keys.Node {
	t.Helper()
	k, err := keys.Generate[keys.NodeRole]()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// nodeRequest signs a node-credential request for node and agents at ts.
func nodeRequest(node *keys.Node, agents []*keys.Agent, ts int64) map[string]any {
	ids := make([]string, len(agents))
	entries := make([]any, len(agents))
	for i, a := range agents {
		ids[i] = a.Public()
		entries[i] = map[string]any{"id": a.Public(), "sig": protocol.SignNodeAgent(a, ts, node.Public())}
	}
	sig, err := protocol.SignNodeCred(node, ts, ids)
	if err != nil {
		panic(err)
	}
	return map[string]any{"node_id": node.Public(), "agents": entries, "ts": ts, "node_sig": sig}
}

// bootstrapBody is an am_ key exchange for agent with its proof of
// possession, as mesh-adapter sends it.
func bootstrapBody(token string, agent *keys.Agent) map[string]any {
	return map[string]any{"token": token, "agent_id": agent.Public(), "proof": protocol.SignBootstrap(agent, token), "private_inbox": true}
}

// connectJWT connects to the mesh with a user JWT whose nonce is signed by
// signer, collecting asynchronous errors.
func (c *cp) connectJWT(jwtStr string, signer interface{ Sign([]byte) []byte }, errCh chan error, extra ...nats.Option) (*nats.Conn, error) {
	opts := append([]nats.Option{
		nats.UserJWT(func() (string, error) { return jwtStr, nil }, func(n []byte) ([]byte, error) { return signer.Sign(n), nil }),
		nats.MaxReconnects(0), nats.Timeout(5 * time.Second),
	}, extra...)
	if errCh != nil {
		opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case errCh <- err:
			default:
			}
		}), nats.ClosedHandler(func(*nats.Conn) {
			select {
			case errCh <- nats.ErrConnectionClosed:
			default:
			}
		}))
	}
	return nats.Connect(c.m.URLs().MeshTCP, opts...)
}

// expectViolation waits for the broker's permissions violation naming
// subject. Silence is a failure: the broker reports refusals asynchronously.
func expectViolation(t *testing.T, errCh chan error, subject string) {
	t.Helper()
	deadline := time.After(3 * time.Second)
	for {
		select {
		case err := <-errCh:
			if strings.Contains(err.Error(), "Permissions Violation") && strings.Contains(err.Error(), subject) {
				return
			}
		case <-deadline:
			t.Errorf("the broker did not refuse %s", subject)
			return
		}
	}
}
