package devenv_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/devenv"
	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/credential"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/store"
)

func TestBootstrapExchange(t *testing.T) {
	c := startCP(t)
	acct, _ := c.signIn("ana@example.org")
	if err := c.m.Control().Store.RunTx(context.Background(), func(tx store.Tx) error {
		return tx.Update(account.CollAccounts, acct, map[string]any{"operator_name": "Ana Example"})
	}); err != nil {
		t.Fatal(err)
	}
	key := c.agentKey(acct, "coder")
	agent := newAgent(t)

	// Shape checks come first and do not spend the key.
	for _, tc := range []struct {
		body map[string]any
		st   int
		msg  string
	}{
		{map[string]any{"token": key, "agent_id": string(agent.Seed())}, 400, "seed"},
		{map[string]any{"token": key, "agent_id": "Unope"}, 400, "public key"},
		{map[string]any{"token": "am_wrong", "agent_id": agent.Public()}, 401, "unknown, used or expired"},
		{map[string]any{"token": key, "agent_id": agent.Public(), "label": "x"}, 400, "unknown member"},
	} {
		st, out := c.post("/v1/bootstrap", tc.body, "")
		if st != tc.st || !strings.Contains(out["error"].(string), tc.msg) {
			t.Errorf("%v: %d %v", tc.body["agent_id"], st, out)
		}
		if strings.Contains(fmt.Sprint(out), string(agent.Seed())) {
			t.Error("the answer echoed the seed")
		}
	}

	st, out := c.post("/v1/bootstrap", map[string]any{"token": key, "agent_id": agent.Public()}, "")
	if st != 200 {
		t.Fatalf("exchange: %d %v", st, out)
	}
	for _, k := range []string{"jwt", "seed", "creds", "label", "account_email", "expires_at", "renew_url", "mesh"} {
		if out[k] == nil || out[k] == "" {
			t.Errorf("answer lacks %s: %v", k, out)
		}
	}
	if out["handle"] != "coder.ana@example.org" || out["label"] != "coder" || out["account_email"] != "ana@example.org" {
		t.Errorf("handle/label/email: %v", out)
	}
	if !strings.HasSuffix(out["renew_url"].(string), "/v1/node-credential") || !strings.HasPrefix(out["seed"].(string), "SU") ||
		out["seed"] == string(agent.Seed()) {
		t.Errorf("renew_url/seed: %v", out)
	}
	exp, _ := time.Parse(time.RFC3339, out["expires_at"].(string))
	if d := time.Until(exp); d < 29*24*time.Hour || d > 31*24*time.Hour {
		t.Errorf("expires_at %v is not 30 days out", exp)
	}
	uc, err := jwt.DecodeUserClaims(out["jwt"].(string))
	if err != nil || uc.Subject == agent.Public() {
		t.Fatalf("jwt: %v (subject must be the credential key, never the agent key)", err)
	}
	// The creds file connects; the seed it holds is the credential key's.
	nc, err := nats.Connect(c.m.URLs().MeshTCP, nats.UserCredentialBytes([]byte(out["creds"].(string))))
	if err != nil {
		t.Fatalf("connect with creds: %v", err)
	}
	defer nc.Close()

	// The key is spent.
	st, out = c.post("/v1/bootstrap", map[string]any{"token": key, "agent_id": newAgent(t).Public()}, "")
	if st != 401 {
		t.Errorf("second exchange: %d %v", st, out)
	}
	// It expires after 7 days when unused.
	key2 := c.agentKey(acct, "later")
	c.clock.Advance(7*24*time.Hour + time.Second)
	if st, _ := c.post("/v1/bootstrap", map[string]any{"token": key2, "agent_id": newAgent(t).Public()}, ""); st != 401 {
		t.Error("an expired key was exchanged")
	}
}

// Exactly one of 50 concurrent exchanges of one key wins, and nothing is
// half-written: one agent, one mint, the key claimed by the winner.
func TestBootstrapSingleUseUnderConcurrency(t *testing.T) {
	c := startCP(t)
	acct, _ := c.signIn("ana@example.org")
	key := c.agentKey(acct, "racer")
	var wg sync.WaitGroup
	results := make([]int, 50)
	agents := make([]string, 50)
	for i := range 50 {
		agents[i] = newAgent(t).Public()
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], _ = c.post("/v1/bootstrap", map[string]any{"token": key, "agent_id": agents[i]}, "")
		}()
	}
	wg.Wait()
	won := -1
	for i, st := range results {
		switch st {
		case 200:
			if won >= 0 {
				t.Fatalf("two exchanges won: %d and %d", won, i)
			}
			won = i
		case 401:
		default:
			t.Errorf("exchange %d: status %d", i, st)
		}
	}
	if won < 0 {
		t.Fatal("no exchange won")
	}
	ctx := context.Background()
	var ags []credential.Agent
	var mints []credential.Mint
	st := c.m.Control().Store
	if err := store.List(ctx, st, credential.CollAgents, store.Query{}, &ags); err != nil {
		t.Fatal(err)
	}
	if err := store.List(ctx, st, credential.CollMints, store.Query{}, &mints); err != nil {
		t.Fatal(err)
	}
	if len(ags) != 1 || ags[0].ID != agents[won] || len(mints) != 1 {
		t.Errorf("after the race: %d agents, %d mints", len(ags), len(mints))
	}
}

// Refusals for the agent ceiling or another account's agent put the key
// back: nothing is consumed, and the same key works once the cause is gone.
func TestBootstrapPutsKeyBack(t *testing.T) {
	c := startCP(t)
	ctx := context.Background()
	a, _ := c.signIn("a@example.org")
	b, _ := c.signIn("b@example.org")
	if err := c.m.Control().Store.RunTx(ctx, func(tx store.Tx) error {
		return tx.Update(account.CollAccounts, a, map[string]any{"agent_ceiling": 1})
	}); err != nil {
		t.Fatal(err)
	}
	first := newAgent(t)
	if st, out := c.post("/v1/bootstrap", map[string]any{"token": c.agentKey(a, "one"), "agent_id": first.Public()}, ""); st != 200 {
		t.Fatalf("first: %d %v", st, out)
	}
	// At the ceiling: refused, key intact.
	key := c.agentKey(a, "two")
	second := newAgent(t)
	st, out := c.post("/v1/bootstrap", map[string]any{"token": key, "agent_id": second.Public()}, "")
	if st != 409 || !strings.Contains(out["error"].(string), "ceiling") {
		t.Fatalf("ceiling: %d %v", st, out)
	}
	if err := c.m.Control().Credentials.RetireAgent(ctx, first.Public(), "replaced"); err != nil {
		t.Fatal(err)
	}
	if st, out := c.post("/v1/bootstrap", map[string]any{"token": key, "agent_id": second.Public()}, ""); st != 200 {
		t.Fatalf("same key after freeing a slot: %d %v", st, out)
	}
	// An agent owned by another account, without proof of its key:
	// refused before anything else, key intact (issue 10 item 4).
	keyB := c.agentKey(b, "thief")
	st, out = c.post("/v1/bootstrap", map[string]any{"token": keyB, "agent_id": second.Public()}, "")
	if st != 401 || out["details"].(map[string]any)["proof_required"] != true {
		t.Fatalf("owned elsewhere, no proof: %d %v", st, out)
	}
	// With proof that it holds the key: still another account's, refused,
	// key intact.
	st, out = c.post("/v1/bootstrap", bootstrapBody(keyB, second), "")
	if st != 409 || !strings.Contains(out["error"].(string), "another account") {
		t.Fatalf("owned elsewhere: %d %v", st, out)
	}
	if st, out := c.post("/v1/bootstrap", map[string]any{"token": keyB, "agent_id": newAgent(t).Public()}, ""); st != 200 {
		t.Fatalf("same key with its own agent: %d %v", st, out)
	}
}

// Every row of spec §7.3.
func TestNodeCredentialRefusals(t *testing.T) {
	c := startCP(t)
	ctx := context.Background()
	node := newNode(t)
	a1, a2 := newAgent(t), newAgent(t)
	now := time.Now().Unix()
	valid := func() map[string]any { return nodeRequest(node, []*keys.Agent{a1, a2}, now) }
	with := func(f func(m map[string]any)) map[string]any { m := valid(); f(m); return m }
	many := make([]*keys.Agent, 17)
	for i := range many {
		many[i] = newAgent(t)
	}

	// Accounts for the standing rows.
	acctA, _ := c.signIn("a@example.org")
	acctB, _ := c.signIn("b@example.org")
	ownedA, ownedB, retired, disabledAgent := newAgent(t), newAgent(t), newAgent(t), newAgent(t)
	acctD, _ := c.signIn("d@example.org")
	for _, x := range []struct {
		acct string
		a    *keys.Agent
	}{{acctA, ownedA}, {acctB, ownedB}, {acctA, retired}, {acctD, disabledAgent}} {
		if st, out := c.post("/v1/bootstrap", map[string]any{"token": c.agentKey(x.acct, "n"), "agent_id": x.a.Public()}, ""); st != 200 {
			t.Fatalf("setup: %d %v", st, out)
		}
	}
	if err := c.m.Control().Credentials.RetireAgent(ctx, retired.Public(), "key leaked on a pastebin"); err != nil {
		t.Fatal(err)
	}
	if err := c.m.Control().Credentials.DisableAccount(ctx, acctD, "unpaid"); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		body map[string]any
		st   int
		msg  string
	}{
		{"missing node_id", with(func(m map[string]any) { delete(m, "node_id") }), 400, "node_id, ts, node_sig, agents[] required"},
		{"missing ts", with(func(m map[string]any) { delete(m, "ts") }), 400, "node_id, ts, node_sig, agents[] required"},
		{"empty agents", with(func(m map[string]any) { m["agents"] = []any{} }), 400, "node_id, ts, node_sig, agents[] required"},
		{"node_id a seed", with(func(m map[string]any) { m["node_id"] = string(node.Seed()) }), 400, "node_id must be a user public key"},
		{"17 agents", nodeRequest(node, many, now), 400, "at most 16 agents"},
		{"entry without sig", with(func(m map[string]any) { m["agents"].([]any)[0].(map[string]any)["sig"] = "" }), 400, "every agents[] entry needs id and sig"},
		{"agent id not a key", with(func(m map[string]any) { m["agents"].([]any)[0].(map[string]any)["id"] = "Uxyz" }), 400, "agent id is not a user public key"},
		{"duplicate", nodeRequest(node, []*keys.Agent{a1, a1}, now), 400, "duplicate agent id"},
		// ±600 s is the window; a margin keeps a slow test second from
		// moving a case across the bound.
		{"stale", nodeRequest(node, []*keys.Agent{a1}, now-620), 401, "stale timestamp; re-sign with current time"},
		{"future", nodeRequest(node, []*keys.Agent{a1}, now+620), 401, "stale timestamp"},
		{"old but inside the window", nodeRequest(node, []*keys.Agent{a1}, now-580), 200, ""},
		{"ahead but inside the window", nodeRequest(node, []*keys.Agent{a1}, now+580), 200, ""},
		{"node_sig wrong", with(func(m map[string]any) {
			m["node_sig"] = nodeRequest(newNode(t), []*keys.Agent{a1, a2}, now)["node_sig"]
		}), 401, "node_sig does not verify against node_id"},
		{"agent sig wrong", with(func(m map[string]any) {
			m["agents"].([]any)[1].(map[string]any)["sig"] = protocol.SignNodeAgent(a1, now, node.Public())
		}), 401, "agent signature does not verify for " + a2.Public()[:12]},
		{"unknown member", with(func(m map[string]any) { m["expires"] = "never" }), 400, "unknown member"},
		{"disabled account", nodeRequest(node, []*keys.Agent{disabledAgent}, now), 403, "owning account disabled"},
		{"retired agent", nodeRequest(node, []*keys.Agent{a1, retired}, now), 403, "retired or revoked: key leaked on a pastebin; re-link to an account to restore"},
		{"two accounts", nodeRequest(node, []*keys.Agent{ownedA, ownedB}, now), 409, "roster spans two accounts; mint one credential per account"},
		{"unowned roster", valid(), 200, ""},
		{"owned roster", nodeRequest(node, []*keys.Agent{ownedA, a1}, now), 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, out := c.post("/v1/node-credential", tc.body, "")
			if st != tc.st {
				t.Fatalf("status %d, want %d: %v", st, tc.st, out)
			}
			if tc.msg != "" && !strings.Contains(out["error"].(string), tc.msg) {
				t.Errorf("message %q does not say %q", out["error"], tc.msg)
			}
		})
	}
}

func TestNodeCredentialNotConfiguredAndUnavailable(t *testing.T) {
	// 501: an instance with no minting key. 503: a store that cannot answer.
	cs := credential.New(credential.Config{Store: brokenStore{}})
	node := newNode(t)
	a := newAgent(t)
	now := time.Now().Unix()
	req := credential.NodeRequest{NodeID: node.Public(), TS: &now,
		Agents: []credential.AgentSig{{ID: a.Public(), Sig: protocol.SignNodeAgent(a, now, node.Public())}}}
	req.NodeSig, _ = protocol.SignNodeCred(node, now, []string{a.Public()})
	if _, err := cs.NodeCredential(context.Background(), req); err == nil || !strings.Contains(err.Error(), "not configured") {
		t.Errorf("no trust: %v", err)
	}
	c := startCP(t)
	cs = credential.New(credential.Config{Store: brokenStore{}, Trust: c.m.Trust()})
	_, err := cs.NodeCredential(context.Background(), req)
	if err == nil || !strings.Contains(err.Error(), "cannot check the node's standing now; retry; the current credential is unaffected") {
		t.Errorf("broken store: %v", err)
	}
}

// brokenStore fails every transaction, like a store that is down.
type brokenStore struct{}

func (brokenStore) RunTx(context.Context, func(store.Tx) error) error {
	return fmt.Errorf("dial firestore: connection refused")
}
func (brokenStore) Close() error { return nil }

func TestNodeCredentialMintRenewAndNoExpiry(t *testing.T) {
	for _, noExpiry := range []bool{false, true} {
		t.Run(fmt.Sprint("no_expiry=", noExpiry), func(t *testing.T) {
			c := startCP(t, func(cfg *devenv.Config) { cfg.NoExpiry = noExpiry })
			node, a := newNode(t), newAgent(t)
			st, out := c.post("/v1/node-credential", nodeRequest(node, []*keys.Agent{a}, time.Now().Unix()), "")
			if st != 200 || out["ok"] != true || out["node_id"] != node.Public() {
				t.Fatalf("%d %v", st, out)
			}
			if _, has := out["seed"]; has {
				t.Error("a node credential answer must carry no seed")
			}
			mesh := out["mesh"].(map[string]any)
			if mesh["protocol"] != "0.3" || len(mesh["nats_endpoints"].([]any)) != 2 {
				t.Errorf("mesh block %v", mesh)
			}
			if noExpiry != (out["expires_at"] == nil) {
				t.Errorf("expires_at %v with no_expiry=%v", out["expires_at"], noExpiry)
			}
			uc, _ := jwt.DecodeUserClaims(out["jwt"].(string))
			if uc.Subject != node.Public() {
				t.Errorf("subject %s, want the node key", uc.Subject)
			}
			nc, err := c.connectJWT(out["jwt"].(string), node, nil)
			if err != nil {
				t.Fatalf("connect: %v", err)
			}
			nc.Close()
			// Renewal is the same door; every mint is recorded.
			if st, _ := c.post("/v1/node-credential", nodeRequest(node, []*keys.Agent{a}, time.Now().Unix()), ""); st != 200 {
				t.Fatal("renewal")
			}
			var mints []credential.Mint
			_ = store.List(context.Background(), c.m.Control().Store, credential.CollMints, store.Where("key", node.Public()), &mints)
			if len(mints) != 2 {
				t.Errorf("%d mints recorded, want 2", len(mints))
			}
		})
	}
}
