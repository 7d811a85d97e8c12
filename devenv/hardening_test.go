package devenv_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/devenv"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/credential"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/mailbox"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/ratelimit"
)

// vouchedManifest is a manifest for agent hosted on node, vouched for a day.
func vouchedManifest(t testing.TB, agent *keys.Agent, node keys.Signer) map[string]any {
	t.Helper()
	now := time.Now()
	v, err := protocol.NewVouch(node, agent.Public(), now, now.Add(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	return map[string]any{"id": agent.Public(), "name": "agent " + agent.Public()[:6], "endpoint": protocol.InboxSubject(agent.Public()),
		"node":      map[string]any{"id": node.Public(), "attestation": v},
		"offerings": []any{map[string]any{"id": "chat", "name": "Chat"}}, "visibility": "unlisted"}
}

// TestMailboxSurvivesHostileRegistrations is issue 10 item 2: 2,048
// throwaway agents on node credentials no account owns (minted through the
// door, with the per-address limits opened wide as for an attacker with
// many addresses) register, and afterwards the account holds no more
// consumers than before and a new agent's offline mail is stored and
// fetched as usual. On the old code every registration made a durable
// consumer, and the 1,000th filled the stream's consumer limit.
func TestMailboxSurvivesHostileRegistrations(t *testing.T) {
	if testing.Short() {
		t.Skip("registers 2,000 agents")
	}
	const agents = 2048 // 8 attackers × 16 nodes × 16 agents
	c := startCP(t, func(cfg *devenv.Config) {
		cfg.Unowned = credential.UnownedLimits{PerAddress: ratelimit.Rate{Max: agents, Window: time.Hour}, PerNetwork: ratelimit.Rate{Max: agents, Window: time.Hour}, PerKey: ratelimit.Rate{Max: 10, Window: time.Hour}}
	})
	svc, err := c.m.ConnectService("test-observer")
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	js, _ := jetstream.New(svc)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	before, err := js.AccountInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	var registered atomic.Int64
	var wg sync.WaitGroup
	for w := range 8 { // eight attackers, 256 agents each, 16 per node
		wg.Go(func() {
			for n := range agents / 8 / 16 {
				node := newNode(t)
				roster := make([]*keys.Agent, 16)
				for i := range roster {
					roster[i] = newAgent(t)
				}
				st, out := c.post("/v1/node-credential", nodeRequest(node, roster, time.Now().Unix()), "")
				if st != 200 {
					t.Errorf("attacker %d node %d: %d %v", w, n, st, out)
					return
				}
				nc, err := c.connectJWT(out["jwt"].(string), node, nil, nats.CustomInboxPrefix(out["inbox_prefix"].(string)))
				if err != nil {
					t.Error(err)
					return
				}
				for _, a := range roster {
					if _, err := bus.Call(ctx, nc, a, protocol.SubjRegister, protocol.TypeRegister, "", vouchedManifest(t, a, node)); err != nil {
						t.Errorf("register: %v", err)
						nc.Close()
						return
					}
					registered.Add(1)
				}
				nc.Close()
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	elapsed := time.Since(start)
	t.Logf("%d registrations of unowned agents in %s (%.0f/s, node credentials minted through HTTP included)",
		registered.Load(), elapsed.Round(time.Millisecond), float64(registered.Load())/elapsed.Seconds())

	after, err := js.AccountInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.Consumers != before.Consumers || after.Streams != before.Streams {
		t.Fatalf("registrations made broker resources: consumers %d → %d, streams %d → %d",
			before.Consumers, after.Consumers, before.Streams, after.Streams)
	}

	// A new agent: its offline mail is stored and fetched.
	node, fresh, sender := newNode(t), newAgent(t), newAgent(t)
	nc := c.nodeConn(t, node, fresh)
	if _, err := bus.Call(ctx, nc, fresh, protocol.SubjRegister, protocol.TypeRegister, "", vouchedManifest(t, fresh, node)); err != nil {
		t.Fatalf("the fresh agent cannot register: %v", err)
	}
	env, err := protocol.New(protocol.TypeRequest, sender.Public(), map[string]any{"offering": "chat", "input": map[string]any{"text": "after the flood"}})
	if err != nil {
		t.Fatal(err)
	}
	_ = env.Sign(sender)
	data, _ := env.Marshal()
	if err := svc.Publish(protocol.InboxSubject(fresh.Public()), data); err != nil {
		t.Fatal(err)
	}
	var mail []mailbox.Mail
	eventually(t, "the fresh agent's mail", func() bool {
		fctx, fcancel := context.WithTimeout(ctx, 2*time.Second)
		defer fcancel()
		mail, _, err = mailbox.Fetch(fctx, nc, fresh, 0, 10)
		return err == nil && len(mail) == 1
	})
	if string(mail[0].Data) != string(data) {
		t.Fatal("the fetched mail is not what was sent")
	}
}

// TestBootstrapNeedsProofForAKeyWithHistory is issue 10 item 4: an am_
// key exchange that names an agent key the mesh already knows — registered
// on a node credential no account owns, or holding mail — is refused
// without the agent's proof (on the old code it was exchanged, and the
// credential read the victim's queued mail), and the am_ key is left
// unspent; with the proof it goes through. A brand-new key, as upstream
// SDKs send it ({token, agent_id} alone), still works.
func TestBootstrapNeedsProofForAKeyWithHistory(t *testing.T) {
	c := startCP(t)
	acct, _ := c.signIn("ana@example.org")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	// A victim registered on an unowned node credential.
	node, victim := newNode(t), newAgent(t)
	nc := c.nodeConn(t, node, victim)
	if _, err := bus.Call(ctx, nc, victim, protocol.SubjRegister, protocol.TypeRegister, "", vouchedManifest(t, victim, node)); err != nil {
		t.Fatal(err)
	}
	// A key nobody registered but someone wrote to.
	mailed := newAgent(t)
	svc, err := c.m.ConnectService("test-sender")
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	if err := svc.Publish(protocol.InboxSubject(mailed.Public()), []byte(`{"queued":"mail"}`)); err != nil {
		t.Fatal(err)
	}
	history := mailbox.History{Bus: &bus.Caller{NC: svc, Key: c.m.ServicesKey()}}
	eventually(t, "the stored mail", func() bool { _, m, err := history.AgentHistory(ctx, mailed.Public()); return err == nil && m })

	for name, a := range map[string]*keys.Agent{"registered": victim, "mailed": mailed} {
		token := c.agentKey(acct, "thief-"+name)
		st, out := c.post("/v1/bootstrap", map[string]any{"token": token, "agent_id": a.Public()}, "")
		if st != 401 || out["details"].(map[string]any)["proof_required"] != true {
			t.Fatalf("%s key without proof: %d %v", name, st, out)
		}
		// A proof by another key does not count.
		forged := map[string]any{"token": token, "agent_id": a.Public(), "proof": protocol.SignBootstrap(newAgent(t), token)}
		if st, out := c.post("/v1/bootstrap", forged, ""); st != 401 || out["code"] != "IDENTITY_MISMATCH" {
			t.Fatalf("%s key with a forged proof: %d %v", name, st, out)
		}
		// The am_ key was not spent: with the real proof it exchanges.
		if st, out := c.post("/v1/bootstrap", bootstrapBody(token, a), ""); st != 200 {
			t.Fatalf("%s key with proof: %d %v", name, st, out)
		}
	}
	// Upstream's form for a brand-new key.
	if st, out := c.post("/v1/bootstrap", map[string]any{"token": c.agentKey(acct, "fresh"), "agent_id": newAgent(t).Public()}, ""); st != 200 {
		t.Fatalf("brand-new key without proof: %d %v", st, out)
	}
}

// TestUnownedMintsAreLimited: node credentials for rosters no account owns
// are counted per address and per key; past the limit the door answers
// 429 with retry_after_ms, and an owned roster is not counted.
func TestUnownedMintsAreLimited(t *testing.T) {
	c := startCP(t, func(cfg *devenv.Config) {
		cfg.Unowned = credential.UnownedLimits{PerAddress: ratelimit.Rate{Max: 6, Window: time.Hour}, PerKey: ratelimit.Rate{Max: 2, Window: time.Hour}}
	})
	// Per key: the same node renews twice, the third is refused.
	node, agent := newNode(t), newAgent(t)
	for i := range 3 {
		st, out := c.post("/v1/node-credential", nodeRequest(node, []*keys.Agent{agent}, time.Now().Unix()), "")
		want := 200
		if i == 2 {
			want = 429
		}
		if st != want {
			t.Fatalf("mint %d for one key: %d %v", i+1, st, out)
		}
		if st == 429 && (out["code"] != "RATE_LIMITED" || out["retry_after_ms"] == nil) {
			t.Fatalf("refusal %v", out)
		}
	}
	// Per address: fresh keys each time, refused after six mints in all.
	got := 2
	for range 10 {
		st, _ := c.post("/v1/node-credential", nodeRequest(newNode(t), []*keys.Agent{newAgent(t)}, time.Now().Unix()), "")
		if st == 429 {
			break
		}
		got++
	}
	if got != 6 {
		t.Fatalf("one address minted %d unowned credentials, want 6", got)
	}
	// An owned roster is not counted.
	acct, _ := c.signIn("ana@example.org")
	owned := newAgent(t)
	if st, out := c.post("/v1/bootstrap", bootstrapBody(c.agentKey(acct, "mine"), owned), ""); st != 200 {
		t.Fatalf("bootstrap: %d %v", st, out)
	}
	for range 3 {
		if st, out := c.post("/v1/node-credential", nodeRequest(newNode(t), []*keys.Agent{owned}, time.Now().Unix()), ""); st != 200 {
			t.Fatalf("owned roster refused: %d %v", st, out)
		}
	}
}

// TestSharedInboxGetsNothingConfidential (issue 10 item 1): a credential
// on the shared _INBOX.> grant (what an upstream SDK holds) may read every
// reply sent under _INBOX., so the workers send nothing confidential
// there: a task record comes without its output, a private manifest is not
// found, and the mailbox refuses to fetch. The same requests on a private
// prefix get everything.
func TestSharedInboxGetsNothingConfidential(t *testing.T) {
	c := startCP(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	node, requester, responder := newNode(t), newAgent(t), newAgent(t)
	// An account owns both (a roster no account owns never gets the shared
	// grant).
	acct, _ := c.signIn("ana@example.org")
	for i, a := range []*keys.Agent{requester, responder} {
		if st, out := c.post("/v1/bootstrap", bootstrapBody(c.agentKey(acct, fmt.Sprintf("agent%d", i)), a), ""); st != 200 {
			t.Fatalf("bootstrap: %d %v", st, out)
		}
	}
	st, out := c.post("/v1/node-credential", nodeRequest(node, []*keys.Agent{requester, responder}, time.Now().Unix()), "")
	if st != 200 {
		t.Fatalf("node: %d %v", st, out)
	}
	shared, err := c.connectJWT(out["jwt"].(string), node, nil) // NATS's default prefix, as upstream
	if err != nil {
		t.Fatal(err)
	}
	defer shared.Close()
	private, err := c.connectJWT(out["jwt"].(string), node, nil, nats.CustomInboxPrefix(out["inbox_prefix"].(string)))
	if err != nil {
		t.Fatal(err)
	}
	defer private.Close()

	// A task whose output is a secret.
	task := protocol.NewID()
	for _, p := range []map[string]any{{"status": "working"}, {"status": "completed", "output": map[string]any{"secret": "42"}}} {
		e, err := protocol.New(protocol.TypeRespond, responder.Public(), p)
		if err != nil {
			t.Fatal(err)
		}
		e.To, e.TaskID = requester.Public(), task
		if err := e.Sign(responder); err != nil {
			t.Fatal(err)
		}
		b, _ := e.Marshal()
		if err := private.Publish(protocol.TaskUpdateSubject(task), b); err != nil {
			t.Fatal(err)
		}
	}
	taskOf := func(nc *nats.Conn) (map[string]any, bool) {
		rep, err := bus.Call(ctx, nc, requester, protocol.TaskGetSubject(task), protocol.TypeRequest, "", map[string]any{})
		if err != nil {
			return nil, false
		}
		var p struct {
			Task     map[string]any `json:"task"`
			Redacted bool           `json:"redacted"`
		}
		_ = rep.DecodePayload(&p)
		return p.Task, p.Redacted
	}
	eventually(t, "the completed task", func() bool { tk, _ := taskOf(private); return tk["state"] == "completed" })
	if tk, redacted := taskOf(private); tk["output"] == nil || redacted {
		t.Fatalf("on the private prefix: %v", tk)
	}
	if tk, redacted := taskOf(shared); tk["state"] != "completed" || tk["output"] != nil || !redacted {
		t.Fatalf("on the shared prefix the task came with %v", tk)
	}

	// A private manifest.
	m := vouchedManifest(t, responder, node)
	m["visibility"] = "private"
	if _, err := bus.Call(ctx, private, responder, protocol.SubjRegister, protocol.TypeRegister, "", m); err != nil {
		t.Fatal(err)
	}
	if _, err := bus.Call(ctx, private, responder, protocol.RegistryGetSubject(responder.Public()), protocol.TypeDiscover, "", map[string]any{}); err != nil {
		t.Fatalf("the agent reading its private manifest: %v", err)
	}
	if _, err := bus.Call(ctx, shared, responder, protocol.RegistryGetSubject(responder.Public()), protocol.TypeDiscover, "", map[string]any{}); errs.CodeOf(err) != errs.NotFound {
		t.Fatalf("a private manifest on the shared prefix: %v", err)
	}

	// The mailbox.
	if _, _, err := mailbox.Fetch(ctx, shared, requester, 0, 10); errs.CodeOf(err) != errs.InvalidRequest {
		t.Fatalf("a mailbox fetch on the shared prefix: %v", err)
	}
	if _, _, err := mailbox.Fetch(ctx, private, requester, 0, 10); err != nil {
		t.Fatalf("a mailbox fetch on the private prefix: %v", err)
	}
}

// TestAdmissionAnswersOnlyClientReplySubjects: the admission service
// answers a request to a guarded agent (the relayed answers, the queued
// ack) on the request's reply subject with the services' rights. A guest
// naming a key-value subject or a JetStream API subject as its reply must
// not make it write there (review finding: a blocked guest wrote a
// services-signed record into mesh_registry, and a purge emptied the
// mailbox stream).
func TestAdmissionAnswersOnlyClientReplySubjects(t *testing.T) {
	c := startCP(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	// A guarded agent on its node.
	node, g := newNode(t), newAgent(t)
	nc := c.nodeConn(t, node, g)
	if _, err := bus.Call(ctx, nc, g, protocol.SubjAdmissionGuard, protocol.TypeRequest, "", map[string]any{}); err != nil {
		t.Fatalf("guard: %v", err)
	}
	// Mail already waiting for someone, and a registry the attacker wants
	// to write into.
	svc, err := c.m.ConnectService("test-observer")
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	js, _ := jetstream.New(svc)
	victim := newAgent(t).Public()
	if err := svc.Publish(protocol.InboxSubject(victim), []byte("waiting mail")); err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, protocol.MailboxStream)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the waiting mail", func() bool {
		_, err := stream.GetLastMsgForSubject(ctx, protocol.InboxSubject(victim))
		return err == nil
	})

	// A guest (anonymous: the admission service blocks it) sends to the
	// guarded agent with replies pointing at the registry and the stream API.
	st, grant := c.post("/v1/guest", nil, "")
	if st != 200 {
		t.Fatalf("guest: %d %v", st, grant)
	}
	gk, _ := keys.FromSeed[keys.AgentRole]([]byte(grant["seed"].(string)))
	gnc, err := c.connectJWT(grant["jwt"].(string), gk, nil, nats.CustomInboxPrefix(grant["inbox_prefix"].(string)))
	if err != nil {
		t.Fatal(err)
	}
	defer gnc.Close()
	for _, reply := range []string{"$KV.mesh_registry." + victim, "$JS.API.STREAM.PURGE." + protocol.MailboxStream} {
		e, _ := protocol.New(protocol.TypeRequest, gk.Public(), map[string]any{"offering": "chat", "input": map[string]any{"text": "hi"}})
		_ = e.Sign(gk)
		data, _ := e.Marshal()
		if err := gnc.PublishRequest(protocol.InboxSubject(g.Public()), reply, data); err != nil {
			t.Fatal(err)
		}
	}
	_ = gnc.Flush()
	time.Sleep(500 * time.Millisecond) // what the admission service would do, it has done
	reg, err := js.KeyValue(ctx, "mesh_registry")
	if err != nil {
		t.Fatal(err)
	}
	if e, err := reg.Get(ctx, victim); err == nil {
		t.Fatalf("the admission service wrote the registry: %s", e.Value())
	}
	if _, err := stream.GetLastMsgForSubject(ctx, protocol.InboxSubject(victim)); err != nil {
		t.Fatalf("the waiting mail is gone: %v", err)
	}
}

// TestMixedRosterIsUnowned (review finding): a roster with one agent an
// account owns and fresh keys is unowned for the limits, the fence class
// and the shared inbox; a roster the account owns whole is not.
func TestMixedRosterIsUnowned(t *testing.T) {
	c := startCP(t, func(cfg *devenv.Config) {
		cfg.Unowned = credential.UnownedLimits{PerAddress: ratelimit.Rate{Max: 100, Window: time.Hour}, PerKey: ratelimit.Rate{Max: 1, Window: time.Hour}}
	})
	acct, _ := c.signIn("ana@example.org")
	owned := newAgent(t)
	if st, out := c.post("/v1/bootstrap", bootstrapBody(c.agentKey(acct, "mine"), owned), ""); st != 200 {
		t.Fatalf("bootstrap: %d %v", st, out)
	}
	classOf := func(out map[string]any) (string, bool) {
		t.Helper()
		uc, err := jwt.DecodeUserClaims(out["jwt"].(string))
		if err != nil {
			t.Fatal(err)
		}
		return creds.ClassOfTags(uc.Tags), slices.Contains(uc.Sub.Allow, protocol.SharedInboxSpace)
	}
	fresh := newAgent(t)
	node := newNode(t)
	st, out := c.post("/v1/node-credential", nodeRequest(node, []*keys.Agent{owned, fresh}, time.Now().Unix()), "")
	if st != 200 {
		t.Fatalf("mixed roster: %d %v", st, out)
	}
	if class, shared := classOf(out); class != creds.ClassUnowned || shared {
		t.Fatalf("mixed roster: class %q, shared inbox %v", class, shared)
	}
	// Counted per key: the fresh key's second mint is refused.
	if st, out := c.post("/v1/node-credential", nodeRequest(newNode(t), []*keys.Agent{owned, fresh}, time.Now().Unix()), ""); st != 429 {
		t.Fatalf("the fresh key minted again: %d %v", st, out)
	}
	// The account's own agent alone: unclassed, and the shared inbox for
	// an upstream SDK.
	st, out = c.post("/v1/node-credential", nodeRequest(newNode(t), []*keys.Agent{owned}, time.Now().Unix()), "")
	if st != 200 {
		t.Fatalf("owned roster: %d %v", st, out)
	}
	if class, shared := classOf(out); class != "" || !shared {
		t.Fatalf("owned roster: class %q, shared inbox %v", class, shared)
	}
	// A roster no account owns never gets the shared inbox.
	st, out = c.post("/v1/node-credential", nodeRequest(newNode(t), []*keys.Agent{newAgent(t)}, time.Now().Unix()), "")
	if st != 200 {
		t.Fatalf("unowned roster: %d %v", st, out)
	}
	if class, shared := classOf(out); class != creds.ClassUnowned || shared {
		t.Fatalf("unowned roster: class %q, shared inbox %v", class, shared)
	}
}

// nodeConn mints a node credential for agents on node through the door and
// connects with it, on the credential's private reply prefix.
func (c *cp) nodeConn(t *testing.T, node *keys.Node, agents ...*keys.Agent) *nats.Conn {
	t.Helper()
	st, out := c.post("/v1/node-credential", nodeRequest(node, agents, time.Now().Unix()), "")
	if st != 200 {
		t.Fatalf("node credential: %d %v", st, out)
	}
	nc, err := c.connectJWT(out["jwt"].(string), node, nil, nats.CustomInboxPrefix(out["inbox_prefix"].(string)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}
