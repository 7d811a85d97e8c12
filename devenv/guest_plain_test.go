package devenv_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/devenv"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/registry"
)

// TestGuestOnThePlainSubject (issue 11 items 5, 6 and 8), end to end with
// three copies of every worker, as an upstream 0.3 SDK does it:
//
//   - a real guest from POST /v1/guest registers on the plain
//     mesh.registry.register (the SDK has no guest door) as its own node:
//     its key was on the guest roster before the lease was answered, so
//     every registry copy files it sandbox and unlisted, whatever it asks,
//     and so is another key it vouches for and the guest under a node key
//     it made up; none of them is in discover; when the lease ends they go
//     and the key leaves the roster;
//   - a standalone agent on a bootstrap (am_) credential, its own node
//     (node.id == id), the SDK's quick start, is public and listed;
//   - both follow each other's heartbeats on mesh.heartbeat.*.
func TestGuestOnThePlainSubject(t *testing.T) {
	c := startCP(t, func(cfg *devenv.Config) { cfg.Workers.Copies = 3 })
	obs, err := c.m.ConnectService("test-observer")
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close()
	svc := &bus.Caller{NC: obs, Key: newAgent(t)}
	js, err := jetstream.New(obs)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	onRoster := func(key string) bool {
		t.Helper()
		kv, err := js.KeyValue(ctx, registry.GuestsBucket)
		if err != nil {
			t.Fatal(err)
		}
		_, err = kv.Get(ctx, key)
		if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}

	// The guest: on the roster as soon as the lease is answered.
	st, grant := c.post("/v1/guest", nil, "")
	if st != 200 {
		t.Fatalf("guest lease: %d %v", st, grant)
	}
	g, err := keys.FromSeed[keys.AgentRole]([]byte(grant["seed"].(string)))
	if err != nil {
		t.Fatal(err)
	}
	if !onRoster(g.Public()) {
		t.Fatal("the guest lease was answered before its key was on the roster")
	}
	gErrs := make(chan error, 32)
	gnc, err := c.connectJWT(grant["jwt"].(string), g, gErrs, nats.CustomInboxPrefix(grant["inbox_prefix"].(string)))
	if err != nil {
		t.Fatal(err)
	}
	defer gnc.Close()

	// The standalone agent: an am_ key exchanged as the SDK does it
	// ({token, agent_id}, nothing else), the agent its own node.
	acct, _ := c.signIn("solo@example.org")
	solo := newAgent(t)
	st, boot := c.post("/v1/bootstrap", map[string]any{"token": c.agentKey(acct, "solo"), "agent_id": solo.Public()}, "")
	if st != 200 {
		t.Fatalf("bootstrap: %d %v", st, boot)
	}
	sErrs := make(chan error, 32)
	credKey, err := keys.FromSeed[keys.CredentialRole]([]byte(boot["seed"].(string)))
	if err != nil {
		t.Fatal(err)
	}
	snc, err := c.connectJWT(boot["jwt"].(string), credKey, sErrs)
	if err != nil {
		t.Fatal(err)
	}
	defer snc.Close()

	now := c.clock.Now()
	manifest := func(agent, node keys.Signer, name string) map[string]any {
		t.Helper()
		v, err := protocol.NewVouch(node, agent.Public(), now, now.Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		return map[string]any{"id": agent.Public(), "name": name, "endpoint": protocol.InboxSubject(agent.Public()),
			"node": map[string]any{"id": node.Public(), "attestation": v}, "tags": []any{"plain"},
			"visibility": "public", "trust_tier": "verified"}
	}
	register := func(nc *nats.Conn, signer keys.Signer, m map[string]any) map[string]any {
		t.Helper()
		rep, err := bus.Call(ctx, nc, signer, protocol.SubjRegister, protocol.TypeRegister, "", m)
		if err != nil {
			t.Fatalf("register %s on the plain subject: %v", signer.Public(), err)
		}
		v, err := rep.PayloadValue()
		if err != nil {
			t.Fatal(err)
		}
		out, _ := v.(map[string]any)
		return out
	}

	// The guest as its own node, another key it vouches for, and the guest
	// under a node key it made up: sandbox and unlisted every time, through
	// whichever registry copy takes it.
	x, made := newAgent(t), newNode(t)
	for i, r := range []struct {
		signer *keys.Agent
		m      map[string]any
	}{
		{g, manifest(g, g, "guest")},
		{x, manifest(x, g, "vouched by a guest")},
		{g, manifest(g, made, "guest under a made-up node")},
		{g, manifest(g, g, "guest")},
		{x, manifest(x, g, "vouched by a guest")},
		{g, manifest(g, g, "guest")},
	} {
		if a := register(gnc, r.signer, r.m); a["sandbox"] != true || a["visibility"] != registry.VisibilityUnlisted {
			t.Fatalf("registration %d (%s) on the plain subject: %v", i, r.m["name"], a)
		}
	}
	for _, k := range []string{g.Public(), x.Public()} {
		rec, err := svc.Call(ctx, protocol.RegistryGetSubject(k), protocol.TypeDiscover, nil)
		if err != nil || rec["sandbox"] != true || rec["trust_tier"] != registry.TierSandbox || rec["visibility"] != registry.VisibilityUnlisted {
			t.Fatalf("stored %s: %v %v", k, rec, err)
		}
	}
	// Still no other key's bound subject.
	other := protocol.SubjRegister + "." + made.Public()
	_ = gnc.Publish(other, []byte("{}"))
	expectViolation(t, gErrs, other)

	// The standalone agent: public and listed.
	if a := register(snc, solo, manifest(solo, solo, "standalone")); a["sandbox"] != false || a["visibility"] != registry.VisibilityPublic {
		t.Fatalf("standalone agent on a bootstrap credential: %v", a)
	}
	for who, caller := range map[string]*bus.Caller{"the guest": {NC: gnc, Key: g}, "the standalone agent": {NC: snc, Key: solo}, "a service": svc} {
		res, err := caller.Call(ctx, protocol.SubjDiscover, protocol.TypeDiscover, map[string]any{"tags": []any{"plain"}})
		if err != nil {
			t.Fatalf("discover by %s: %v", who, err)
		}
		var ids []string
		for _, a := range res["agents"].([]any) {
			ids = append(ids, a.(map[string]any)["id"].(string))
		}
		if !slices.Equal(ids, []string{solo.Public()}) {
			t.Errorf("discover by %s lists %v, want only the standalone agent %s", who, ids, solo.Public())
		}
	}

	// Heartbeats: each follows the other's, as trackPresence does.
	beat := func(nc *nats.Conn, node keys.Signer) {
		t.Helper()
		env, err := protocol.New(protocol.TypeEmit, node.Public(), map[string]any{"node": node.Public(), "availability": "online"})
		if err != nil {
			t.Fatal(err)
		}
		if err := env.Sign(node); err != nil {
			t.Fatal(err)
		}
		b, err := env.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.Publish(protocol.HeartbeatSubject(node.Public()), b); err != nil {
			t.Fatal(err)
		}
	}
	follow := func(nc *nats.Conn) *nats.Subscription {
		t.Helper()
		sub, err := nc.SubscribeSync(protocol.HeartbeatSubject("*"))
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		return sub
	}
	seen := func(sub *nats.Subscription, node string) {
		t.Helper()
		for {
			m, err := sub.NextMsg(3 * time.Second)
			if err != nil {
				t.Fatalf("no heartbeat of %s: %v", node, err)
			}
			if m.Subject == protocol.HeartbeatSubject(node) {
				return
			}
		}
	}
	gBeats, sBeats := follow(gnc), follow(snc)
	beat(snc, solo)
	beat(gnc, g)
	seen(gBeats, solo.Public())
	seen(sBeats, g.Public())
	for _, ch := range []chan error{gErrs, sErrs} {
		select {
		case err := <-ch:
			t.Fatalf("the broker refused allowed traffic: %v", err)
		default:
		}
	}

	// The lease ends: both guest registrations go, the key leaves the
	// roster, the standalone agent stays.
	ts := c.clock.Now().Unix()
	if st, out := c.post("/v1/guest/release", map[string]any{"publicKey": g.Public(), "ts": ts, "sig": protocol.SignGuestRelease(g, ts)}, ""); st != 200 {
		t.Fatalf("release: %d %v", st, out)
	}
	for _, k := range []string{g.Public(), x.Public()} {
		if _, err := svc.Call(ctx, protocol.RegistryGetSubject(k), protocol.TypeDiscover, nil); errs.CodeOf(err) != errs.NotFound {
			t.Errorf("%s still registered after the lease ended: %v", k, err)
		}
	}
	if onRoster(g.Public()) {
		t.Error("the ended guest is still on the roster")
	}
	if _, err := svc.Call(ctx, protocol.RegistryGetSubject(solo.Public()), protocol.TypeDiscover, nil); err != nil {
		t.Errorf("the standalone agent: %v", err)
	}
}
