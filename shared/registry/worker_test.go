package registry_test

import (
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/registry"
)

const month = 30 * 24 * time.Hour

func TestRegister(t *testing.T) {
	f := setup(t, registry.Config{})
	a, n := bustest.Agent(t), bustest.Node(t)

	rep := f.mustRegister(a, manifest(t, a, n, month, map[string]any{"availability": "online", "sandbox": true}))
	if rep["status"] != "registered" || rep["agent_id"] != a.Public() || rep["visibility"] != "public" || rep["sandbox"] != false || len(rep) != 4 {
		t.Fatalf("answer %v", rep)
	}
	rec, found := f.stored(a.Public())
	if !found {
		t.Fatal("no record in mesh_registry")
	}
	if rec["id"] != a.Public() || rec["sandbox"] != false || rec["visibility"] != "public" ||
		rec["endpoint"] != protocol.InboxSubject(a.Public()) || rec["registered_at"] == nil || rec["vouch_expires_at"] == nil {
		t.Fatalf("record %v", rec)
	}
	if _, ok := rec["availability"]; ok {
		t.Fatal("a live availability stamp was stored")
	}
	if node, _ := rec["node"].(map[string]any); node["id"] != n.Public() || node["attestation"] == nil {
		t.Fatalf("record node %v", rec["node"])
	}
	// A registration makes nothing at the broker: the mailbox is the
	// mailbox worker's, read by subject (issue 10 item 2).
	f.noConsumers()
	ev := f.events.expect(t, registry.EventRegistered, a.Public(), 1)
	if ev[0].Data["node"] != n.Public() || ev[0].Data["sandbox"] != false {
		t.Fatalf("event data %v", ev[0].Data)
	}

	// Renewal on the same node: stored again (registered_at kept), no
	// second event.
	time.Sleep(5 * time.Millisecond)
	f.mustRegister(a, manifest(t, a, n, month-time.Hour, nil))
	rec2, _ := f.stored(a.Public())
	if rec2["registered_at"] != rec["registered_at"] || rec2["vouch_expires_at"] == rec["vouch_expires_at"] {
		t.Fatalf("renewal: registered_at %v→%v, vouch %v→%v", rec["registered_at"], rec2["registered_at"], rec["vouch_expires_at"], rec2["vouch_expires_at"])
	}
	f.events.expect(t, registry.EventRegistered, a.Public(), 1)

	// Migration to another node is a new registration: one more event.
	n2 := bustest.Node(t)
	f.mustRegister(a, manifest(t, a, n2, month, nil))
	ev = f.events.expect(t, registry.EventRegistered, a.Public(), 2)
	if ev[1].Data["node"] != n2.Public() || ev[1].Data["previous_node"] != n.Public() {
		t.Fatalf("migration event %v", ev[1].Data)
	}

	// The node-bound subject: the token must be the attesting node. It is
	// the guests' subject (their only one), so a registration there is
	// sandbox even from a node key (TestSandboxIsDecidedByTheSubject).
	rep, err := f.call(a, protocol.SubjRegister+"."+n2.Public(), protocol.TypeRegister, manifest(t, a, n2, month, nil))
	if err != nil {
		t.Fatalf("bound register: %v", err)
	}
	if rep["sandbox"] != true || rep["visibility"] != "unlisted" {
		t.Fatalf("bound register answer %v", rep)
	}
	_, err = f.call(a, protocol.SubjRegister+"."+n.Public(), protocol.TypeRegister, manifest(t, a, n2, month, nil))
	wantCode(t, err, errs.Unauthorized, "attested by node")
}

func TestRegisterRefusals(t *testing.T) {
	f := setup(t, registry.Config{})
	a, n, other := bustest.Agent(t), bustest.Node(t), bustest.Agent(t)

	// Signed by another key than the manifest's id.
	_, err := f.register(other, manifest(t, a, n, month, nil))
	wantCode(t, err, errs.IdentityMismatch, "")

	// Expired vouch.
	old, err := protocol.NewVouch(n, a.Public(), time.Now().Add(-3*time.Hour), time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.register(a, manifest(t, a, n, month, map[string]any{"node": map[string]any{"id": n.Public(), "attestation": vouchValue(t, old)}}))
	wantCode(t, err, errs.Unauthorized, "expired")

	// A vouch for longer than 30 days: a registration lasts as long as its
	// vouch, and one for a key nobody owns would never be reclaimed.
	_, err = f.register(a, manifest(t, a, n, 100*12*month, nil))
	wantCode(t, err, errs.Unauthorized, "longer than")
	_, err = f.register(a, manifest(t, a, n, month+time.Hour, nil))
	wantCode(t, err, errs.Unauthorized, "longer than")
	if _, found := f.stored(a.Public()); found {
		t.Fatal("a registration with an over-long vouch was stored")
	}

	// A vouch for another agent.
	vo, _ := protocol.NewVouch(n, other.Public(), time.Now(), time.Now().Add(month))
	_, err = f.register(a, manifest(t, a, n, month, map[string]any{"node": map[string]any{"id": n.Public(), "attestation": vouchValue(t, vo)}}))
	wantCode(t, err, errs.InvalidManifest, "vouches for agent")

	// A vouch signed by another node than node.id.
	n2 := bustest.Node(t)
	vn, _ := protocol.NewVouch(n2, a.Public(), time.Now(), time.Now().Add(month))
	_, err = f.register(a, manifest(t, a, n, month, map[string]any{"node": map[string]any{"id": n.Public(), "attestation": vouchValue(t, vn)}}))
	wantCode(t, err, errs.InvalidManifest, "not by node.id")

	// A forged vouch: node.id and vouch.node agree, the signature does not.
	vf := vouchValue(t, vn)
	vf["node"] = n.Public()
	_, err = f.register(a, manifest(t, a, n, month, map[string]any{"node": map[string]any{"id": n.Public(), "attestation": vf}}))
	wantCode(t, err, errs.IdentityMismatch, "signature")

	// Shape.
	for name, extra := range map[string]map[string]any{
		"no name":         {"name": nil},
		"empty name":      {"name": " "},
		"no node":         {"node": nil},
		"bad visibility":  {"visibility": "secret"},
		"bad endpoint":    {"endpoint": "mesh.agent.x.inbox"},
		"bad offerings":   {"offerings": []any{"echo"}},
		"bad tags":        {"tags": "a,b"},
		"bad avail class": {"availability_class": "sometimes"},
		"no attestation":  {"node": map[string]any{"id": n.Public()}},
	} {
		_, err = f.register(a, manifest(t, a, n, month, extra))
		if errs.CodeOf(err) != errs.InvalidManifest {
			t.Errorf("%s: %v, want INVALID_MANIFEST", name, err)
		}
	}
	_, err = f.register(a, map[string]any{"id": "not-a-key", "name": "x"})
	wantCode(t, err, errs.InvalidManifest, "id must be")

	// The wrong envelope type for the subject.
	_, err = f.call(a, protocol.SubjRegister, protocol.TypeRequest, manifest(t, a, n, month, nil))
	wantCode(t, err, errs.InvalidEnvelope, "")

	if _, found := f.stored(a.Public()); found {
		t.Fatal("a refused registration was stored")
	}
	f.events.expect(t, registry.EventRegistered, a.Public(), 0)
}

// An unsigned (or badly signed) request is refused before any handler:
// nothing is stored, nothing emitted.
func TestUnsignedNeverReachesHandler(t *testing.T) {
	f := setup(t, registry.Config{})
	a, n := bustest.Agent(t), bustest.Node(t)
	env, err := protocol.New(protocol.TypeRegister, a.Public(), manifest(t, a, n, month, nil))
	if err != nil {
		t.Fatal(err)
	}
	unsigned, err := env.CanonicalUnsigned()
	if err != nil {
		t.Fatal(err)
	}
	other := bustest.Agent(t)
	env.From = other.Public()
	if err := env.Sign(other); err != nil { // a signature by the wrong key
		t.Fatal(err)
	}
	env.From = a.Public()
	forged, err := env.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	for _, data := range [][]byte{unsigned, forged} {
		msg, err := f.nc.Request(protocol.SubjRegister, data, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := protocol.Decode(msg.Data)
		if err != nil {
			t.Fatal(err)
		}
		v, _ := rep.PayloadValue()
		if p, _ := v.(map[string]any); p["status"] != "failed" {
			t.Fatalf("answer %v", v)
		}
	}
	if _, found := f.stored(a.Public()); found {
		t.Fatal("an unverified registration was stored")
	}
	f.events.expect(t, registry.EventRegistered, a.Public(), 0)
}

// TestSandbox: what makes a registration sandbox on the plain subject is
// the guest roster the control plane writes (a leased guest key as the
// agent or as its vouching node) or a declared trust_tier, decided alike by
// each of the three copies; never the shape node.id == id, which is an
// upstream SDK's standalone agent on an am_ credential, listed like any
// other (spec §5).
func TestSandbox(t *testing.T) {
	f := setup(t, registry.Config{})
	// A leased guest, its own node, asking to be public.
	g := bustest.Agent(t)
	f.lease(g)
	rep := f.mustRegister(g, manifest(t, g, g, 72*time.Hour, map[string]any{"visibility": "public", "trust_tier": "verified"}))
	if rep["sandbox"] != true || rep["visibility"] != "unlisted" {
		t.Fatalf("guest answer %v", rep)
	}
	rec, _ := f.stored(g.Public())
	if rec["sandbox"] != true || rec["trust_tier"] != "sandbox" || rec["visibility"] != "unlisted" {
		t.Fatalf("guest record %v", rec)
	}
	ev := f.events.expect(t, registry.EventRegistered, g.Public(), 1)
	if ev[0].Data["sandbox"] != true {
		t.Fatalf("event %v", ev[0].Data)
	}

	// Another key the guest holds, vouched for by the guest key: sandbox.
	x := bustest.Agent(t)
	if rep := f.mustRegister(x, manifest(t, x, g, time.Hour, map[string]any{"visibility": "public"})); rep["sandbox"] != true || rep["visibility"] != "unlisted" {
		t.Fatalf("agent vouched for by a guest: %v", rep)
	}
	// The guest key as the agent, vouched for by a node key it made up:
	// sandbox, the agent is a guest.
	made := bustest.Node(t)
	if rep := f.mustRegister(g, manifest(t, g, made, time.Hour, map[string]any{"visibility": "public"})); rep["sandbox"] != true || rep["visibility"] != "unlisted" {
		t.Fatalf("guest under a made-up node: %v", rep)
	}

	// trust_tier sandbox declared, public asked: clamped to unlisted.
	s, n := bustest.Agent(t), bustest.Node(t)
	rep = f.mustRegister(s, manifest(t, s, n, month, map[string]any{"trust_tier": "sandbox", "visibility": "public"}))
	if rep["sandbox"] != true || rep["visibility"] != "unlisted" {
		t.Fatalf("sandbox-tier answer %v", rep)
	}
	// Private stays private.
	p := bustest.Agent(t)
	f.lease(p)
	rep = f.mustRegister(p, manifest(t, p, p, month, map[string]any{"visibility": "private"}))
	if rep["visibility"] != "private" || rep["sandbox"] != true {
		t.Fatalf("private sandbox answer %v", rep)
	}

	// Standalone agents, each its own node and recorded nowhere, through
	// whichever copy takes them: listed, not sandbox.
	var standalone []string
	for range 6 {
		a := bustest.Agent(t)
		rep := f.mustRegister(a, manifest(t, a, a, month, map[string]any{"name": "standalone"}))
		if rep["sandbox"] != false || rep["visibility"] != "public" {
			t.Fatalf("standalone agent answer %v", rep)
		}
		standalone = append(standalone, a.Public())
	}
	slices.Sort(standalone)

	// Only the standalone agents are listed; the sandbox ones are
	// reachable by id.
	res, err := f.discover(nil)
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, a := range res["agents"].([]any) {
		listed = append(listed, a.(map[string]any)["id"].(string))
	}
	if !slices.Equal(listed, standalone) {
		t.Fatalf("discover lists %v, want the standalone agents %v", listed, standalone)
	}
	got, err := f.call(bustest.Agent(t), protocol.RegistryGetSubject(s.Public()), protocol.TypeDiscover, nil)
	if err != nil || got["id"] != s.Public() || got["sandbox"] != true {
		t.Fatalf("get sandbox: %v %v", got, err)
	}
}

// TestGuestRosterIsReadEveryTime: no copy remembers what the roster said.
// A key judged not a guest is a guest as soon as the control plane records
// it, and is no longer one once it is forgotten (its lease over, its
// credential revoked). A record lives as long as the credential it was
// written for, plus GuestRecordSlack.
func TestGuestRosterIsReadEveryTime(t *testing.T) {
	f := setup(t, registry.Config{})
	k := bustest.Agent(t)
	register := func() map[string]any {
		t.Helper()
		return f.mustRegister(k, manifest(t, k, k, time.Hour, nil))
	}
	// Every copy judges the key once before it is recorded (a copy that
	// cached the answer would keep listing it).
	for range 6 {
		if rep := register(); rep["sandbox"] != false {
			t.Fatalf("before the lease: %v", rep)
		}
	}
	expires := time.Now().Add(24 * time.Hour)
	if err := f.guests.Record(f.ctx(), k.Public(), expires); err != nil {
		t.Fatal(err)
	}
	// Recording again (a retried lease) is not an error.
	if err := f.guests.Record(f.ctx(), k.Public(), expires); err != nil {
		t.Fatalf("record again: %v", err)
	}
	for range 6 {
		if rep := register(); rep["sandbox"] != true || rep["visibility"] != "unlisted" {
			t.Fatalf("once recorded: %v", rep)
		}
	}
	// The record expires with the credential: its TTL is the credential's
	// remaining life plus the slack.
	st, err := f.js.Stream(f.ctx(), "KV_"+registry.GuestsBucket)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := st.GetLastMsgForSubject(f.ctx(), "$KV."+registry.GuestsBucket+"."+k.Public())
	if err != nil {
		t.Fatal(err)
	}
	ttl, err := time.ParseDuration(msg.Header.Get("Nats-TTL"))
	if err != nil {
		t.Fatalf("record TTL %q: %v", msg.Header.Get("Nats-TTL"), err)
	}
	if want := 24*time.Hour + registry.GuestRecordSlack; ttl > want || ttl < want-time.Minute {
		t.Fatalf("record TTL %s, want about %s", ttl, want)
	}

	if err := f.guests.Forget(f.ctx(), []string{k.Public(), bustest.Agent(t).Public()}); err != nil {
		t.Fatal(err)
	}
	if rep := register(); rep["sandbox"] != false {
		t.Fatalf("after the lease: %v", rep)
	}
}

// TestUnreadableRosterRefuses: a copy that cannot read the guest roster
// refuses the registration (UNAVAILABLE) and stores nothing, rather than
// list what may be a guest.
func TestUnreadableRosterRefuses(t *testing.T) {
	f := setup(t, registry.Config{})
	if err := f.js.DeleteKeyValue(f.ctx(), registry.GuestsBucket); err != nil {
		t.Fatal(err)
	}
	a := bustest.Agent(t)
	_, err := f.register(a, manifest(t, a, a, time.Hour, nil))
	wantCode(t, err, errs.Unavailable, "guest")
	if _, found := f.stored(a.Public()); found {
		t.Fatal("a registration judged without the roster was stored")
	}
}

// TestSandboxIsDecidedByTheSubject: a guest credential from a control plane
// that cannot record it reaches only its own bound subject
// mesh.registry.register.<guest key> (creds.PinnedGuestPermissions), so
// everything arriving on a bound subject is sandbox, whatever the manifest
// says and whether or not the roster knows the key.
func TestSandboxIsDecidedByTheSubject(t *testing.T) {
	f := setup(t, registry.Config{})
	bound := func(node interface{ Public() string }) string { return protocol.SubjRegister + "." + node.Public() }

	// A guest, self-attested on its bound subject, asking to be public.
	g := bustest.Agent(t)
	rep, err := f.call(g, bound(g), protocol.TypeRegister, manifest(t, g, g, time.Hour, map[string]any{"visibility": "public"}))
	if err != nil || rep["sandbox"] != true || rep["visibility"] != "unlisted" {
		t.Fatalf("guest on its bound subject: %v %v", rep, err)
	}

	// The guest attests another key it holds, as the node of that agent: on
	// its bound subject the token must be the attesting node, so that node
	// is the guest's agent-role key. Sandbox, whatever it declares.
	x := bustest.Agent(t)
	rep, err = f.call(x, bound(g), protocol.TypeRegister, manifest(t, x, g, time.Hour,
		map[string]any{"visibility": "public", "trust_tier": "verified", "availability_class": "always_on"}))
	if err != nil || rep["sandbox"] != true || rep["visibility"] != "unlisted" {
		t.Fatalf("agent attested by a guest key: %v %v", rep, err)
	}
	rec, _ := f.stored(x.Public())
	if rec["sandbox"] != true || rec["trust_tier"] != "sandbox" || rec["visibility"] != "unlisted" {
		t.Fatalf("record %v", rec)
	}
	ev := f.events.expect(t, registry.EventRegistered, x.Public(), 1)
	if ev[0].Data["sandbox"] != true || ev[0].Data["node"] != g.Public() {
		t.Fatalf("event %v", ev[0].Data)
	}

	// The report's attack, a made-up node key vouching for the guest, sent
	// on the guest's bound subject: refused, the token is not that node.
	made := bustest.Node(t)
	_, err = f.call(g, bound(g), protocol.TypeRegister, manifest(t, g, made, time.Hour, map[string]any{"visibility": "public"}))
	wantCode(t, err, errs.Unauthorized, "attested by node")
	if rec, _ := f.stored(g.Public()); rec["sandbox"] != true || rec["node"].(map[string]any)["id"] != g.Public() {
		t.Fatalf("the refused registration changed the record: %v", rec)
	}

	// A node's agent, public on the untokenized subject, is sandbox once
	// registered on a bound subject.
	a, n := bustest.Agent(t), bustest.Node(t)
	if rep := f.mustRegister(a, manifest(t, a, n, month, nil)); rep["sandbox"] != false || rep["visibility"] != "public" {
		t.Fatalf("node agent %v", rep)
	}
	rep, err = f.call(a, bound(n), protocol.TypeRegister, manifest(t, a, n, month, nil))
	if err != nil || rep["sandbox"] != true || rep["visibility"] != "unlisted" {
		t.Fatalf("node agent on the bound subject: %v %v", rep, err)
	}

	// None of them is listed.
	res, err := f.discover(nil)
	if err != nil || res["total"] != 0.0 {
		t.Fatalf("discover: %v %v", res, err)
	}
}

// TestGuestEvict: evicting a guest key removes the guest's own sandbox
// registration and every sandbox registration it attested as node, and
// nothing else: not a non-sandbox registration named by mistake, not one
// attested by another node.
func TestGuestEvict(t *testing.T) {
	f := setup(t, registry.Config{})
	bound := func(node interface{ Public() string }) string { return protocol.SubjRegister + "." + node.Public() }
	g, x, other := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)
	for _, c := range []struct {
		agent, node *keys.Agent
	}{{g, g}, {x, g}, {other, other}} {
		if _, err := f.call(c.agent, bound(c.node), protocol.TypeRegister, manifest(t, c.agent, c.node, time.Hour, nil)); err != nil {
			t.Fatal(err)
		}
	}
	a, n := bustest.Agent(t), bustest.Node(t)
	f.mustRegister(a, manifest(t, a, n, month, nil))

	out, err := f.call(f.m.ServicesKey(), protocol.SubjGuestEvict, protocol.TypeRequest, map[string]any{"keys": []string{g.Public(), a.Public()}})
	if err != nil {
		t.Fatal(err)
	}
	got := []string{}
	for _, v := range out["evicted"].([]any) {
		got = append(got, v.(string))
	}
	slices.Sort(got)
	want := []string{g.Public(), x.Public()}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("evicted %v, want %v", got, want)
	}
	for agent, kept := range map[string]bool{g.Public(): false, x.Public(): false, other.Public(): true, a.Public(): true} {
		if _, found := f.stored(agent); found != kept {
			t.Errorf("%s stored %v, want %v", agent, found, kept)
		}
	}
	for _, agent := range want {
		if ev := f.events.expect(t, registry.EventReaped, agent, 1); ev[0].Data["reason"] != registry.ReasonLeaseEnded {
			t.Errorf("reaped event %v", ev[0].Data)
		}
	}
	// Again: nothing left to remove.
	out, err = f.call(f.m.ServicesKey(), protocol.SubjGuestEvict, protocol.TypeRequest, map[string]any{"keys": []string{g.Public()}})
	if err != nil || len(out["evicted"].([]any)) != 0 {
		t.Fatalf("second evict: %v %v", out, err)
	}
}

func TestDeregister(t *testing.T) {
	f := setup(t, registry.Config{})
	a, n, other := bustest.Agent(t), bustest.Node(t), bustest.Agent(t)
	f.mustRegister(a, manifest(t, a, n, month, nil))

	_, err := f.call(other, protocol.SubjDeregister, protocol.TypeRegister, map[string]any{"agent_id": a.Public()})
	wantCode(t, err, errs.IdentityMismatch, "")
	_, err = f.call(n, protocol.SubjDeregister, protocol.TypeRegister, map[string]any{"agent_id": a.Public()})
	wantCode(t, err, errs.IdentityMismatch, "")
	_, err = f.call(a, protocol.SubjDeregister, protocol.TypeDiscover, map[string]any{"agent_id": a.Public()})
	wantCode(t, err, errs.InvalidEnvelope, "")
	if _, found := f.stored(a.Public()); !found {
		t.Fatal("a refused deregistration removed the record")
	}

	rep, err := f.call(a, protocol.SubjDeregister, protocol.TypeRegister, map[string]any{"agent_id": a.Public()})
	if err != nil || rep["status"] != "deregistered" || rep["agent_id"] != a.Public() {
		t.Fatalf("deregister: %v %v", rep, err)
	}
	if _, found := f.stored(a.Public()); found {
		t.Fatal("record kept")
	}
	f.events.expect(t, registry.EventDeregistered, a.Public(), 1)

	_, err = f.call(a, protocol.SubjDeregister, protocol.TypeRegister, map[string]any{"agent_id": a.Public()})
	wantCode(t, err, errs.NotFound, "")
	_, err = f.call(a, protocol.RegistryGetSubject(a.Public()), protocol.TypeDiscover, nil)
	wantCode(t, err, errs.NotFound, "")
}

func TestDiscoverGetNodes(t *testing.T) {
	f := setup(t, registry.Config{})
	n1, n2, n3 := bustest.Node(t), bustest.Node(t), bustest.Node(t)
	a, b, c, u, p := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)
	f.mustRegister(a, manifest(t, a, n1, month, map[string]any{
		"name": "alpha", "capabilities": []any{"chat", "search"}, "tags": []any{"news", "en"},
		"offerings":  []any{map[string]any{"id": "summarize", "name": "Summarize", "tags": []any{"text"}}},
		"trust_tier": "verified", "availability_class": "always_on", "reachability": "direct",
	}))
	// b's registration must be the newer one (updated_at has millisecond
	// precision, and a tie falls to the agent ids, which are random).
	time.Sleep(2 * time.Millisecond)
	f.mustRegister(b, manifest(t, b, n1, month, map[string]any{
		"name": "beta", "capabilities": []any{"chat"}, "tags": []any{"en"},
		"skills": []any{map[string]any{"id": "translate", "name": "Translate"}}, "offerings": nil,
		"availability_class": "intermittent",
	}))
	f.mustRegister(c, manifest(t, c, n2, month, map[string]any{"name": "gamma", "capabilities": []any{"search"}, "reachability": "relay"}))
	f.mustRegister(u, manifest(t, u, n3, month, map[string]any{"name": "unlisted", "visibility": "unlisted"}))
	f.mustRegister(p, manifest(t, p, n3, month, map[string]any{"name": "private", "visibility": "private"}))

	// Presence: n1 busy, n2 silent for long (offline), n3 never seen.
	now := protocol.FormatTime(time.Now())
	f.putJSON(registry.PresenceBucket, n1.Public(), map[string]any{"node": n1.Public(), "agents": []any{}, "availability": "busy", "last_seen": now, "online": true})
	f.putJSON(registry.PresenceBucket, n2.Public(), map[string]any{"node": n2.Public(), "availability": "online", "last_seen": protocol.FormatTime(time.Now().Add(-time.Hour)), "online": false})

	names := func(q map[string]any) []string {
		t.Helper()
		res, err := f.discover(q)
		if err != nil {
			t.Fatalf("discover %v: %v", q, err)
		}
		agents, _ := res["agents"].([]any)
		var out []string
		for _, x := range agents {
			out = append(out, x.(map[string]any)["name"].(string))
		}
		if q["limit"] == nil && res["total"] != float64(len(out)) {
			t.Fatalf("total %v for %d agents", res["total"], len(out))
		}
		return out
	}
	for _, tc := range []struct {
		q    map[string]any
		want []string
	}{
		{nil, []string{"alpha", "beta", "gamma"}},
		{map[string]any{}, []string{"alpha", "beta", "gamma"}},
		{map[string]any{"capabilities": []any{"chat"}}, []string{"alpha", "beta"}},
		{map[string]any{"capabilities": []any{"chat", "search"}}, []string{"alpha"}},
		{map[string]any{"offering_id": "summarize"}, []string{"alpha"}},
		{map[string]any{"skill_id": "translate"}, []string{"beta"}},
		{map[string]any{"offering_id": "nothing"}, nil},
		{map[string]any{"tags": []any{"en"}}, []string{"alpha", "beta"}},
		{map[string]any{"tags": []any{"en", "news"}}, []string{"alpha"}},
		{map[string]any{"tags": []any{"text"}}, []string{"alpha"}},
		{map[string]any{"node": n1.Public()}, []string{"alpha", "beta"}},
		{map[string]any{"node": n3.Public()}, nil},
		{map[string]any{"availability": "online"}, []string{"alpha", "beta"}},
		{map[string]any{"availability": "busy"}, []string{"alpha", "beta"}},
		{map[string]any{"availability": "offline"}, []string{"gamma"}},
		{map[string]any{"trust_tier": "verified"}, []string{"alpha"}},
		{map[string]any{"availability_class": "intermittent"}, []string{"beta"}},
		{map[string]any{"reachability": "relay"}, []string{"gamma"}},
		{map[string]any{"capabilities": []any{"search"}, "availability": "online"}, []string{"alpha"}},
	} {
		if got := names(tc.q); !slices.Equal(got, tc.want) {
			t.Errorf("discover %v: %v, want %v", tc.q, got, tc.want)
		}
	}
	res, err := f.discover(map[string]any{"limit": 2})
	if err != nil {
		t.Fatal(err)
	}
	agents := res["agents"].([]any)
	if len(agents) != 2 || res["total"] != 3.0 {
		t.Fatalf("limit 2: %d agents, total %v", len(agents), res["total"])
	}
	stamps := map[string]any{}
	for _, x := range names2(t, f) {
		stamps[x["name"].(string)] = x["availability"]
	}
	if stamps["alpha"] != "busy" || stamps["gamma"] != "offline" {
		t.Fatalf("availability stamps %v", stamps)
	}
	for _, q := range []map[string]any{
		{"capabilities": "chat"}, {"tags": []any{1}}, {"limit": "ten"}, {"limit": 0}, {"limit": 1.5},
		{"availability": "maybe"}, {"node": "n1"}, {"offering_id": 7},
	} {
		_, err := f.discover(q)
		if errs.CodeOf(err) != errs.InvalidQuery {
			t.Errorf("discover %v: %v, want INVALID_QUERY", q, err)
		}
	}
	_, err = f.call(a, protocol.SubjDiscover, protocol.TypeDiscover, []any{"x"})
	wantCode(t, err, errs.InvalidQuery, "")
	_, err = f.call(a, protocol.SubjDiscover, protocol.TypeRequest, nil)
	wantCode(t, err, errs.InvalidEnvelope, "")

	// Get: unlisted by id, stamped; private only to itself or its node;
	// unknown NOT_FOUND.
	stranger := bustest.Agent(t)
	got, err := f.call(stranger, protocol.RegistryGetSubject(u.Public()), protocol.TypeDiscover, nil)
	if err != nil || got["id"] != u.Public() || got["visibility"] != "unlisted" || got["availability"] != "offline" {
		t.Fatalf("get unlisted: %v %v", got, err)
	}
	got, err = f.call(stranger, protocol.RegistryGetSubject(a.Public()), protocol.TypeDiscover, nil)
	if err != nil || got["availability"] != "busy" || got["name"] != "alpha" {
		t.Fatalf("get alpha: %v %v", got, err)
	}
	_, err = f.call(stranger, protocol.RegistryGetSubject(p.Public()), protocol.TypeDiscover, nil)
	wantCode(t, err, errs.NotFound, "")
	if got, err = f.call(p, protocol.RegistryGetSubject(p.Public()), protocol.TypeDiscover, nil); err != nil || got["id"] != p.Public() {
		t.Fatalf("private get by itself: %v %v", got, err)
	}
	_, err = f.call(stranger, protocol.RegistryGetSubject(bustest.Agent(t).Public()), protocol.TypeDiscover, nil)
	wantCode(t, err, errs.NotFound, "")
	_, err = f.call(stranger, protocol.RegistryGetSubject("nobody"), protocol.TypeDiscover, nil)
	wantCode(t, err, errs.NotFound, "")

	// Nodes.
	nl, err := f.call(stranger, protocol.SubjNodesList, protocol.TypeDiscover, nil)
	if err != nil {
		t.Fatal(err)
	}
	if nl["total"] != 3.0 {
		t.Fatalf("nodes.list total %v", nl["total"])
	}
	byNode := map[string]map[string]any{}
	for _, x := range nl["nodes"].([]any) {
		e := x.(map[string]any)
		byNode[e["node"].(string)] = e
	}
	e1 := byNode[n1.Public()]
	if e1["hosted_agents"] != 2.0 || len(e1["agents"].([]any)) != 2 || e1["live"] != true || e1["availability"] != "busy" ||
		e1["last_seen"] != now || e1["trust_tier"] != "verified" || e1["availability_class"] != "intermittent" || e1["reachability"] != "direct" {
		t.Fatalf("node 1 %v", e1)
	}
	if e2 := byNode[n2.Public()]; e2["live"] != false || e2["availability"] != "offline" || e2["hosted_agents"] != 1.0 {
		t.Fatalf("node 2 %v", e2)
	}
	if e3 := byNode[n3.Public()]; e3["hosted_agents"] != 2.0 || len(e3["agents"].([]any)) != 0 || e3["live"] != false || e3["last_seen"] != nil {
		t.Fatalf("node 3 %v", e3)
	}
}

// TestNodesListDeviceFields: what a node declares in its registrations
// (trust tier, role, uptime class, reachability, capacity, device fields)
// and what its last heartbeat reported come back in mesh.registry.nodes.list,
// with its live status and hosted-agent count.
func TestNodesListDeviceFields(t *testing.T) {
	f := setup(t, registry.Config{})
	n, quiet := bustest.Node(t), bustest.Node(t)
	older, newer, hidden, other := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)
	device := map[string]any{"kind": "laptop", "host": "ada-mbp", "platform": "darwin/arm64", "serial": "not listed"}
	// The older registration declares an earlier profile; the newest
	// declaration of each member wins, and members only the older one
	// declares are kept.
	f.mustRegister(older, manifest(t, older, n, month, map[string]any{"name": "older",
		"availability_class": "on_demand", "reachability": "relay", "role": "edge"}))
	f.clock.Advance(time.Second)
	man := manifest(t, newer, n, month, map[string]any{"name": "newer", "availability_class": "always_on", "trust_tier": "verified", "capacity": 8})
	node := man["node"].(map[string]any)
	node["role"], node["reachability"], node["device"] = "worker", "direct", device
	f.mustRegister(newer, man)
	f.mustRegister(hidden, manifest(t, hidden, n, month, map[string]any{"name": "hidden", "visibility": "unlisted"}))
	f.mustRegister(other, manifest(t, other, quiet, month, map[string]any{"name": "other"}))

	// The stored manifest keeps the device as sent.
	if rec, _ := f.stored(newer.Public()); rec["node"].(map[string]any)["device"].(map[string]any)["serial"] != "not listed" {
		t.Fatalf("stored node %v", rec["node"])
	}

	// The node's last beat, as the presence worker records it.
	now := protocol.FormatTime(time.Now())
	f.putJSON(registry.PresenceBucket, n.Public(), map[string]any{"node": n.Public(), "agents": []any{}, "availability": "degraded",
		"last_seen": now, "online": true, "active_tasks": 3, "capacity": 8, "uptime_seconds": 86400, "load": 0.5})

	nl, err := f.call(bustest.Agent(t), protocol.SubjNodesList, protocol.TypeDiscover, nil)
	if err != nil {
		t.Fatal(err)
	}
	nodes := nl["nodes"].([]any)
	var got, quietGot map[string]any
	for _, x := range nodes {
		switch e := x.(map[string]any); e["node"] {
		case n.Public():
			got = e
		case quiet.Public():
			quietGot = e
		}
	}
	want := map[string]any{
		"node":               n.Public(),
		"hosted_agents":      3.0,
		"agents":             []any{min(older.Public(), newer.Public()), max(older.Public(), newer.Public())},
		"trust_tier":         "verified",
		"role":               "worker",
		"availability_class": "always_on",
		"reachability":       "direct",
		"capacity":           8.0,
		"device":             map[string]any{"kind": "laptop", "host": "ada-mbp", "platform": "darwin/arm64"},
		"live":               true,
		"availability":       "degraded",
		"last_seen":          now,
		"heartbeat":          map[string]any{"active_tasks": 3.0, "capacity": 8.0, "uptime_seconds": 86400.0, "load": 0.5},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("node entry\n%v\nwant\n%v", got, want)
	}
	// A node that declares nothing and never beat: only what is known.
	wantQuiet := map[string]any{"node": quiet.Public(), "hosted_agents": 1.0, "agents": []any{other.Public()}, "live": false, "availability": "offline"}
	if !reflect.DeepEqual(quietGot, wantQuiet) {
		t.Fatalf("quiet node entry %v, want %v", quietGot, wantQuiet)
	}

	// A device of the wrong shape is refused at registration.
	for _, bad := range []any{"laptop", map[string]any{"kind": 7}, map[string]any{"host": strings.Repeat("h", 81)}} {
		k := bustest.Agent(t)
		man := manifest(t, k, n, month, map[string]any{"name": "bad"})
		man["node"].(map[string]any)["device"] = bad
		_, err := f.register(k, man)
		wantCode(t, err, errs.InvalidManifest, "node.device")
	}
}

func names2(t *testing.T, f *fixture) []map[string]any {
	t.Helper()
	res, err := f.discover(nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	for _, x := range res["agents"].([]any) {
		out = append(out, x.(map[string]any))
	}
	return out
}

// Reaping with three copies at once: a short vouch past its expiry and a
// quiet sandbox past SandboxTTL are reclaimed once each; a non-sandbox
// agent whose node never heartbeats, and a sandbox whose node does, stay.
func TestReap(t *testing.T) {
	f := setup(t, registry.Config{})
	// The presence worker creates its bucket at start. The registry binds
	// it lazily and, while it is missing, asks again at most every 2 s, so
	// one created halfway through would not be seen in time.
	f.kv(registry.PresenceBucket)
	short, long, n := bustest.Agent(t), bustest.Agent(t), bustest.Node(t)
	quiet, chatty := bustest.Agent(t), bustest.Agent(t)
	f.mustRegister(short, manifest(t, short, n, 2*time.Minute, nil))
	f.mustRegister(long, manifest(t, long, n, month, nil))
	f.lease(quiet, chatty)
	f.mustRegister(quiet, manifest(t, quiet, quiet, 72*time.Hour, nil))
	f.mustRegister(chatty, manifest(t, chatty, chatty, 72*time.Hour, nil))

	reapAll := func() int {
		t.Helper()
		var wg sync.WaitGroup
		counts := make([]int, len(f.workers))
		for i, w := range f.workers {
			wg.Go(func() {
				n, err := w.Reap(f.ctx())
				if err != nil {
					t.Errorf("reap: %v", err)
				}
				counts[i] = n
			})
		}
		wg.Wait()
		total := 0
		for _, c := range counts {
			total += c
		}
		return total
	}

	if got := reapAll(); got != 0 {
		t.Fatalf("reaped %d fresh registrations", got)
	}
	f.clock.Advance(3 * time.Minute)
	if got := reapAll(); got != 1 {
		t.Fatalf("reaped %d after the short vouch expired, want 1", got)
	}
	ev := f.events.expect(t, registry.EventReaped, short.Public(), 1)
	if ev[0].Data["reason"] != registry.ReasonVouchExpired {
		t.Fatalf("reap event %v", ev[0].Data)
	}
	if _, found := f.stored(short.Public()); found {
		t.Fatal("expired registration kept")
	}

	// An hour on: the chatty guest heartbeated ten minutes ago, the quiet
	// one never did.
	f.clock.Advance(time.Hour)
	f.putJSON(registry.PresenceBucket, chatty.Public(), map[string]any{"node": chatty.Public(), "availability": "online",
		"last_seen": protocol.FormatTime(f.clock.Now().Add(-10 * time.Minute)), "online": false})
	if got := reapAll(); got != 1 {
		t.Fatalf("reaped %d after SandboxTTL, want 1", got)
	}
	ev = f.events.expect(t, registry.EventReaped, quiet.Public(), 1)
	if ev[0].Data["reason"] != registry.ReasonSandboxIdle {
		t.Fatalf("reap event %v", ev[0].Data)
	}
	for _, a := range []string{long.Public(), chatty.Public()} {
		if _, found := f.stored(a); !found {
			t.Fatalf("%s reaped", a)
		}
		f.events.expect(t, registry.EventReaped, a, 0)
	}
	if got := reapAll(); got != 0 {
		t.Fatalf("second pass reaped %d", got)
	}
}
