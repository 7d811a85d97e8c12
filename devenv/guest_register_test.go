package devenv_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/registry"
)

// TestGuestRegistrationStaysInTheSandbox (review finding H1): a real guest
// credential from POST /v1/guest cannot register outside the sandbox on its
// own bound subject. The broker refuses another key's bound subject with a
// permissions violation (the plain subject is TestGuestOnThePlainSubject's).
// On its own subject the report's attack (a made-up node key vouching for
// the guest) is refused, and what the registry accepts there (the guest
// attesting itself, or another key it holds) is stored sandbox and unlisted
// whatever the manifest asks, gets no mailbox, is in neither discover nor
// the catalog, and goes when the lease ends. A node's agent on the
// untokenized subject is still public.
func TestGuestRegistrationStaysInTheSandbox(t *testing.T) {
	c := startCP(t)
	obs, err := c.m.ConnectService("test-observer")
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close()
	svc := &bus.Caller{NC: obs, Key: newAgent(t)}
	reaped, err := obs.SubscribeSync(protocol.EventSubject("registry." + registry.EventReaped))
	if err != nil {
		t.Fatal(err)
	}
	_ = obs.Flush()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()

	st, grant := c.post("/v1/guest", nil, "")
	if st != 200 {
		t.Fatalf("guest lease: %d %v", st, grant)
	}
	g, err := keys.FromSeed[keys.AgentRole]([]byte(grant["seed"].(string)))
	if err != nil {
		t.Fatal(err)
	}
	errCh := make(chan error, 32)
	nc, err := c.connectJWT(grant["jwt"].(string), g, errCh, nats.CustomInboxPrefix(grant["inbox_prefix"].(string)))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	now := c.clock.Now()
	manifest := func(agent *keys.Agent, node keys.Signer, extra map[string]any) map[string]any {
		t.Helper()
		v, err := protocol.NewVouch(node, agent.Public(), now, now.Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]any{"id": agent.Public(), "name": "agent " + agent.Public()[:6], "endpoint": protocol.InboxSubject(agent.Public()),
			"node":      map[string]any{"id": node.Public(), "attestation": v},
			"offerings": []any{map[string]any{"id": "chat", "name": "Chat"}}, "tags": []any{"h1"},
			"visibility": "public", "availability_class": "always_on"}
		for k, x := range extra {
			m[k] = x
		}
		return m
	}
	bound := func(key string) string { return protocol.SubjRegister + "." + key }
	payload := func(v any) map[string]any {
		t.Helper()
		out, _ := v.(map[string]any)
		return out
	}
	answer := func(rep *protocol.Envelope) map[string]any {
		t.Helper()
		v, err := rep.PayloadValue()
		if err != nil {
			t.Fatal(err)
		}
		return payload(v)
	}
	getRec := func(agent string) (map[string]any, error) {
		t.Helper()
		return svc.Call(ctx, protocol.RegistryGetSubject(agent), protocol.TypeDiscover, nil)
	}

	// The report's attack: a node key the guest made up vouches for the
	// guest, asking for a public, verified listing.
	made := newNode(t)
	attack := manifest(g, made, map[string]any{"trust_tier": "verified"})
	signed := func(signer *keys.Agent, m map[string]any) []byte {
		t.Helper()
		env, err := protocol.New(protocol.TypeRegister, signer.Public(), m)
		if err != nil {
			t.Fatal(err)
		}
		if err := env.Sign(signer); err != nil {
			t.Fatal(err)
		}
		b, err := env.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}

	// 1. The broker refuses every other key's bound subject.
	for _, subject := range []string{bound(made.Public()), bound(newAgent(t).Public())} {
		_ = nc.Publish(subject, signed(g, attack))
		expectViolation(t, errCh, subject)
	}
	if _, err := getRec(g.Public()); errs.CodeOf(err) != errs.NotFound {
		t.Fatalf("a refused registration was stored: %v", err)
	}

	// 2. On its own bound subject the attack is refused by the registry:
	// the token (the guest) is not the attesting node.
	_, err = bus.Call(ctx, nc, g, bound(g.Public()), protocol.TypeRegister, "", attack)
	if errs.CodeOf(err) != errs.Unauthorized {
		t.Fatalf("made-up node on the guest's subject: %v, want UNAUTHORIZED", err)
	}
	if _, err := getRec(g.Public()); errs.CodeOf(err) != errs.NotFound {
		t.Fatalf("the refused attack was stored: %v", err)
	}

	// 3. What its subject accepts is sandbox, whatever the manifest asks:
	// the guest attesting itself, and another key it holds attested by the
	// guest key (the only node its subject lets it name).
	other := newAgent(t)
	regs := []struct {
		signer *keys.Agent
		m      map[string]any
	}{
		{g, manifest(g, g, map[string]any{"trust_tier": "verified"})},
		{other, manifest(other, g, map[string]any{"trust_tier": "verified"})},
	}
	js, err := jetstream.New(obs)
	if err != nil {
		t.Fatal(err)
	}
	before, err := js.AccountInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range regs {
		rep, err := bus.Call(ctx, nc, r.signer, bound(g.Public()), protocol.TypeRegister, "", r.m)
		if err != nil {
			t.Fatalf("register %s on the guest's subject: %v", r.signer.Public(), err)
		}
		if a := answer(rep); a["sandbox"] != true || a["visibility"] != registry.VisibilityUnlisted {
			t.Fatalf("register answer %v", a)
		}
		rec, err := getRec(r.signer.Public())
		if err != nil {
			t.Fatal(err)
		}
		if rec["sandbox"] != true || rec["visibility"] != registry.VisibilityUnlisted || rec["trust_tier"] != registry.TierSandbox ||
			payload(rec["node"])["id"] != g.Public() {
			t.Fatalf("stored %v", rec)
		}
		if info, err := js.AccountInfo(ctx); err != nil || info.Consumers != before.Consumers {
			t.Fatalf("a registration made a consumer: %d before, now %v %v", before.Consumers, info, err)
		}
	}

	// A node's agent, registered with a node credential on the untokenized
	// subject, is public: discover works, and lists it alone.
	node, agent := newNode(t), newAgent(t)
	st, out := c.post("/v1/node-credential", nodeRequest(node, []*keys.Agent{agent}, c.clock.Now().Unix()), "")
	if st != 200 {
		t.Fatalf("node credential: %d %v", st, out)
	}
	nnc, err := c.connectJWT(out["jwt"].(string), node, nil, nats.CustomInboxPrefix(out["inbox_prefix"].(string)))
	if err != nil {
		t.Fatal(err)
	}
	defer nnc.Close()
	rep, err := bus.Call(ctx, nnc, agent, protocol.SubjRegister, protocol.TypeRegister, "", manifest(agent, node, nil))
	if err != nil {
		t.Fatal(err)
	}
	if a := answer(rep); a["sandbox"] != false || a["visibility"] != registry.VisibilityPublic {
		t.Fatalf("node agent answer %v", a)
	}
	listed := func(nc *bus.Caller) []string {
		t.Helper()
		res, err := nc.Call(ctx, protocol.SubjDiscover, protocol.TypeDiscover, map[string]any{"tags": []any{"h1"}})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, a := range res["agents"].([]any) {
			ids = append(ids, payload(a)["id"].(string))
		}
		return ids
	}
	for who, caller := range map[string]*bus.Caller{"the guest": {NC: nc, Key: g}, "a service": svc} {
		if ids := listed(caller); !slices.Equal(ids, []string{agent.Public()}) {
			t.Errorf("discover by %s lists %v, want only the node's agent %s", who, ids, agent.Public())
		}
	}
	cat, err := svc.Call(ctx, protocol.SubjCatalogList, protocol.TypeRequest, map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range cat["entries"].([]any) {
		if id := payload(e)["agent_id"]; id == g.Public() || id == other.Public() {
			t.Errorf("guest registration %s in the catalog", id)
		}
	}

	// 4. The lease ends: both guest registrations go, the node's agent stays.
	ts := c.clock.Now().Unix()
	if st, out := c.post("/v1/guest/release", map[string]any{"publicKey": g.Public(), "ts": ts, "sig": protocol.SignGuestRelease(g, ts)}, ""); st != 200 {
		t.Fatalf("release: %d %v", st, out)
	}
	var gone []string
	for range 2 {
		m, err := reaped.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("agent_reaped: %v (got %v)", err, gone)
		}
		env, err := protocol.Decode(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		var ev struct {
			Data map[string]any `json:"data"`
		}
		_ = json.Unmarshal(env.Payload, &ev)
		if ev.Data["reason"] != registry.ReasonLeaseEnded {
			t.Fatalf("reaped event %s", env.Payload)
		}
		gone = append(gone, ev.Data["agent_id"].(string))
	}
	want := []string{g.Public(), other.Public()}
	slices.Sort(gone)
	slices.Sort(want)
	if !slices.Equal(gone, want) {
		t.Fatalf("evicted %v, want %v", gone, want)
	}
	for _, a := range want {
		if _, err := getRec(a); errs.CodeOf(err) != errs.NotFound {
			t.Errorf("%s still registered after the lease ended: %v", a, err)
		}
	}
	if _, err := getRec(agent.Public()); err != nil {
		t.Errorf("the node's agent: %v", err)
	}
}
