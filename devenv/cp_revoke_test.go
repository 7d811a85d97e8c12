package devenv_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/devenv"
	"agentmesh.dev/mesh/shared/credential"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/store"
)

// A node connected with a valid credential loses access within 5 seconds
// of its agent being retired, and its renewal is refused with 403 and the
// recorded reason.
func TestRetiringAnAgentCutsItsNodeOff(t *testing.T) {
	c := startCP(t)
	acct, _ := c.signIn("ana@example.org")
	agent, node := newAgent(t), newNode(t)
	if st, out := c.post("/v1/bootstrap", map[string]any{"token": c.agentKey(acct, "coder"), "agent_id": agent.Public()}, ""); st != 200 {
		t.Fatalf("bootstrap: %d %v", st, out)
	}
	st, out := c.post("/v1/node-credential", nodeRequest(node, []*keys.Agent{agent}, time.Now().Unix()), "")
	if st != 200 {
		t.Fatalf("node credential: %d %v", st, out)
	}
	errCh := make(chan error, 16)
	nc, err := c.connectJWT(out["jwt"].(string), node, errCh)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sub, err := nc.SubscribeSync(protocol.InboxSubject(agent.Public()))
	if err != nil || nc.Flush() != nil {
		t.Fatalf("subscribe: %v", err)
	}
	_ = sub

	start := time.Now()
	if err := c.m.Control().Credentials.RetireAgent(context.Background(), agent.Public(), "owner reported the laptop stolen"); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(5 * time.Second)
	for nc.Status() != nats.CLOSED {
		select {
		case <-deadline:
			t.Fatalf("still connected 5 s after retirement (status %v)", nc.Status())
		case <-time.After(10 * time.Millisecond):
		}
	}
	t.Logf("connection closed %v after retirement", time.Since(start).Round(time.Millisecond))

	st, out = c.post("/v1/node-credential", nodeRequest(node, []*keys.Agent{agent}, time.Now().Unix()), "")
	if st != http.StatusForbidden || !strings.Contains(out["error"].(string), "owner reported the laptop stolen") {
		t.Errorf("renewal after retirement: %d %v", st, out)
	}
	// The node may renew without the retired agent; the new credential is
	// issued after the revocation and connects.
	other := newAgent(t)
	st, out = c.post("/v1/node-credential", nodeRequest(node, []*keys.Agent{other}, time.Now().Unix()), "")
	if st != 200 {
		t.Fatalf("renewal without the retired agent: %d %v", st, out)
	}
	nc2, err := c.connectJWT(out["jwt"].(string), node, nil)
	if err != nil {
		t.Fatalf("a credential minted after the revocation must connect: %v", err)
	}
	nc2.Close()
	// Without proof of the agent key, nobody lifts the tombstone with an
	// am_ key (issue 10 item 4); with it, re-linking the key under a live
	// account does.
	if st, out := c.post("/v1/bootstrap", map[string]any{"token": c.agentKey(acct, "coder2"), "agent_id": agent.Public()}, ""); st != 401 {
		t.Fatalf("re-link without proof: %d %v", st, out)
	}
	if st, out := c.post("/v1/bootstrap", bootstrapBody(c.agentKey(acct, "coder2"), agent), ""); st != 200 {
		t.Fatalf("re-link: %d %v", st, out)
	}
	if st, out := c.post("/v1/node-credential", nodeRequest(node, []*keys.Agent{agent}, time.Now().Unix()), ""); st != 200 {
		t.Errorf("after re-link: %d %v", st, out)
	}
}

func TestDisablingAnAccountRevokesItsCredentials(t *testing.T) {
	c := startCP(t)
	acct, tok := c.signIn("ana@example.org")
	agent := newAgent(t)
	st, out := c.post("/v1/bootstrap", map[string]any{"token": c.agentKey(acct, "coder"), "agent_id": agent.Public()}, "")
	if st != 200 {
		t.Fatalf("%d %v", st, out)
	}
	nc, err := nats.Connect(c.m.URLs().MeshTCP, nats.UserCredentialBytes([]byte(out["creds"].(string))), nats.MaxReconnects(0))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := c.m.Control().Credentials.DisableAccount(context.Background(), acct, "terms"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for nc.Status() != nats.CLOSED && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if nc.Status() != nats.CLOSED {
		t.Error("the bootstrap credential still connected after the account was disabled")
	}
	if st, _ := c.do(http.MethodGet, "/v1/session", nil, tok); st != 401 {
		t.Error("a disabled account's session still works")
	}
}

// brokerRevoked reads whether the broker's mesh account JWT revokes key.
func brokerRevoked(t *testing.T, c *cp, key string) bool {
	t.Helper()
	sys, err := c.m.ConnectSystem("test-sys")
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Close()
	msg, err := sys.Request(creds.AccountLookupSubject(c.m.Trust().PublicKeys().MeshAccount), nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ac, err := jwt.DecodeAccountClaims(string(msg.Data))
	if err != nil {
		t.Fatal(err)
	}
	_, ok := ac.Revocations[key]
	return ok
}

func storedRevocations(t *testing.T, c *cp) int {
	t.Helper()
	var docs []map[string]any
	if err := store.List(t.Context(), c.m.Control().Store, credential.CollRevocations, store.Query{}, &docs); err != nil {
		t.Fatal(err)
	}
	return len(docs)
}

// The revocation list only grows as credentials are revoked; the
// credential sweep (a scheduled row) keeps the broker's list in line with
// the store's records: it forgets a revocation once every credential it
// covers has expired, pushes again one the broker lost, and never forgets
// one the store does not know (made by hand).
func TestSweepKeepsRevocationsInLineWithTheStore(t *testing.T) {
	c := startCP(t)
	acct, _ := c.signIn("ana@example.org")
	agent := newAgent(t)
	st, out := c.post("/v1/bootstrap", map[string]any{"token": c.agentKey(acct, "coder"), "agent_id": agent.Public()}, "")
	if st != 200 {
		t.Fatalf("%d %v", st, out)
	}
	uc, err := jwt.DecodeUserClaims(out["jwt"].(string))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.m.Control().Credentials.DisableAccount(t.Context(), acct, "terms"); err != nil {
		t.Fatal(err)
	}
	byHand := newNode(t).Public()
	if err := c.m.Revoke(t.Context(), []string{byHand}, time.Now().Add(-400*24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if !brokerRevoked(t, c, uc.Subject) || storedRevocations(t, c) != 1 {
		t.Fatalf("after disabling: revoked at the broker %v, %d stored", brokerRevoked(t, c, uc.Subject), storedRevocations(t, c))
	}
	sweep := func() int {
		t.Helper()
		n, err := c.m.Control().Credentials.Sweep(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// A revocation the broker lost (two instances updating the account
	// JWT at once) comes back with the next sweep.
	if err := c.m.UpdateMeshAccount(t.Context(), func(ac *jwt.AccountClaims) error {
		delete(ac.Revocations, uc.Subject)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n := sweep(); n != 1 || !brokerRevoked(t, c, uc.Subject) {
		t.Fatalf("sweep after the broker lost the revocation: %d, revoked %v", n, brokerRevoked(t, c, uc.Subject))
	}
	// While the credential (30 days) could still be valid, it stays.
	c.clock.Advance(30 * 24 * time.Hour)
	if sweep(); !brokerRevoked(t, c, uc.Subject) || storedRevocations(t, c) != 1 {
		t.Fatalf("sweep inside the lifetime: revoked %v, %d stored", brokerRevoked(t, c, uc.Subject), storedRevocations(t, c))
	}
	c.clock.Advance(2 * time.Hour)
	if n := sweep(); n < 1 || brokerRevoked(t, c, uc.Subject) || storedRevocations(t, c) != 0 {
		t.Errorf("sweep after the lifetime: %d; still revoked at the broker %v, %d stored", n, brokerRevoked(t, c, uc.Subject), storedRevocations(t, c))
	}
	if !brokerRevoked(t, c, byHand) {
		t.Error("a revocation the store does not know (made by hand) was forgotten")
	}
}

// A revocation covering a credential without expiry is never forgotten,
// even after the mesh stops minting such credentials.
func TestSweepKeepsRevocationsOfCredentialsWithoutExpiry(t *testing.T) {
	c := startCP(t, func(cfg *devenv.Config) { cfg.NoExpiry = true })
	acct, _ := c.signIn("ana@example.org")
	agent, node := newAgent(t), newNode(t)
	if st, out := c.post("/v1/bootstrap", bootstrapBody(c.agentKey(acct, "coder"), agent), ""); st != 200 {
		t.Fatalf("bootstrap: %d %v", st, out)
	}
	st, out := c.post("/v1/node-credential", nodeRequest(node, []*keys.Agent{agent}, time.Now().Unix()), "")
	if st != 200 || out["expires_at"] != nil {
		t.Fatalf("node credential without expiry: %d %v", st, out)
	}
	if err := c.m.Control().Credentials.RetireAgent(t.Context(), agent.Public(), "gone"); err != nil {
		t.Fatal(err)
	}
	c.clock.Advance(400 * 24 * time.Hour)
	if _, err := c.m.Control().Credentials.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !brokerRevoked(t, c, node.Public()) {
		t.Error("the revocation of a credential that never expires was forgotten")
	}
}
