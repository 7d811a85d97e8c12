package devenv_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

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

// The revocation list only grows as credentials are revoked; the
// credential sweep (a scheduled row) forgets the entries whose
// credentials have all expired, at the broker and in the store, and keeps
// the ones that still protect something.
func TestSweepForgetsRevocationsThatProtectNothing(t *testing.T) {
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
	sys, err := c.m.ConnectSystem("test-sys")
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Close()
	revoked := func() bool {
		msg, err := sys.Request(creds.AccountLookupSubject(c.m.Trust().PublicKeys().MeshAccount), nil, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		ac, err := jwt.DecodeAccountClaims(string(msg.Data))
		if err != nil {
			t.Fatal(err)
		}
		_, ok := ac.Revocations[uc.Subject]
		return ok
	}
	stored := func() int {
		var docs []map[string]any
		if err := store.List(t.Context(), c.m.Control().Store, credential.CollRevocations, store.Query{}, &docs); err != nil {
			t.Fatal(err)
		}
		return len(docs)
	}
	if !revoked() || stored() != 1 {
		t.Fatalf("after disabling: revoked at the broker %v, %d stored", revoked(), stored())
	}
	// Within a credential lifetime (30 days) plus the margin, it stays.
	c.clock.Advance(30 * 24 * time.Hour)
	if n, err := c.m.Control().Credentials.Sweep(t.Context()); err != nil || !revoked() || stored() != 1 {
		t.Fatalf("sweep inside the lifetime: %d, %v; revoked %v, %d stored", n, err, revoked(), stored())
	}
	c.clock.Advance(2 * 24 * time.Hour)
	if n, err := c.m.Control().Credentials.Sweep(t.Context()); err != nil || n < 1 {
		t.Fatalf("sweep after the lifetime: %d, %v", n, err)
	}
	if revoked() || stored() != 0 {
		t.Errorf("after the sweep: still revoked at the broker %v, %d stored", revoked(), stored())
	}
}
