package registry_test

import (
	"encoding/json"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/registry"
)

// skuJSON is a paid SKU covering the offering echo.
const skuJSON = `{"sku":"echo-metered","covers":{"offerings":["echo"]},
 "price":{"model":"per_unit","currency":"XCR","meter":"tokens_out","per":1000,"amount_micro":1500,"included":{"quantity":10000,"period":"day"}},
 "provider":{"id":"internal"}}`

const freeSKUJSON = `{"sku":"echo-free","covers":{"agent":true},"price":{"model":"free"},"provider":{"id":"internal"}}`

func jsonValue(t *testing.T, s string) any {
	t.Helper()
	v, err := protocol.ParseJSON([]byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// ownerAttestation is owner's vouch-shaped statement that it owns agent.
func ownerAttestation(t *testing.T, owner keys.Signer, agent string, issued, expires time.Time) map[string]any {
	t.Helper()
	v, err := protocol.NewOwnerAttestation(owner, agent, issued, expires)
	if err != nil {
		t.Fatal(err)
	}
	return vouchValue(t, protocol.Vouch(v))
}

// TestRegisterOwnerAndSKUs: a registered manifest's record carries the
// attested owner and the SKUs as sent; get answers both, and the digest a
// reader computes from the record is the SKU's own.
func TestRegisterOwnerAndSKUs(t *testing.T) {
	f := setup(t, registry.Config{})
	a, n, owner := bustest.Agent(t), bustest.Node(t), bustest.Agent(t)
	now := time.Now()
	att := ownerAttestation(t, owner, a.Public(), now.Add(-time.Second), now.Add(month))
	f.mustRegister(a, manifest(t, a, n, month, map[string]any{
		"owner":             owner.Public(),
		"owner_attestation": att,
		"skus":              jsonValue(t, "["+skuJSON+"]"),
	}))
	rec, found := f.stored(a.Public())
	if !found {
		t.Fatal("no record")
	}
	if rec["owner"] != owner.Public() || registry.OwnerOf(rec, now) != owner.Public() {
		t.Fatalf("record owner %v, want %s", rec["owner"], owner.Public())
	}
	if rec["owner_expires_at"] != att["expires_at"] {
		t.Fatalf("owner_expires_at %v, want the attestation's %v", rec["owner_expires_at"], att["expires_at"])
	}
	got, err := registry.SKUsOf(rec)
	if err != nil || len(got) != 1 {
		t.Fatalf("record skus %v: %v", rec["skus"], err)
	}
	want, err := commerce.ParseSKU([]byte(skuJSON))
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Digest() != want.Digest() {
		t.Fatalf("stored SKU digest %s, want %s (stored as sent)", got[0].Digest(), want.Digest())
	}

	rep, err := f.call(bustest.Agent(t), protocol.SubjRegistryGetPfx+a.Public(), protocol.TypeDiscover, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep["owner"] != owner.Public() || rep["skus"] == nil {
		t.Fatalf("get answer owner %v skus %v", rep["owner"], rep["skus"])
	}

	// discover filters by owner.
	for q, wantN := range map[string]int{owner.Public(): 1, n.Public(): 0} {
		res, err := f.discover(map[string]any{"owner": q})
		if err != nil {
			t.Fatal(err)
		}
		if agents, _ := res["agents"].([]any); len(agents) != wantN {
			t.Fatalf("discover owner=%s: %d agents, want %d", q[:6], len(agents), wantN)
		}
	}
	_, err = f.discover(map[string]any{"owner": "someone"})
	wantCode(t, err, errs.InvalidQuery, "owner")
}

// TestOwnerDefaultsToTheNode: without an attestation the owner is the
// hosting node, and a claimed owner is rewritten, not believed.
func TestOwnerDefaultsToTheNode(t *testing.T) {
	f := setup(t, registry.Config{})
	for name, extra := range map[string]map[string]any{
		"no owner":         nil,
		"unattested claim": {"owner": bustest.Agent(t).Public()},
		"claim not a key":  {"owner": "me"},
	} {
		a, n := bustest.Agent(t), bustest.Node(t)
		f.mustRegister(a, manifest(t, a, n, month, extra))
		rec, _ := f.stored(a.Public())
		if rec["owner"] != n.Public() || registry.OwnerOf(rec, time.Now()) != n.Public() {
			t.Errorf("%s: owner %v, want the node %s", name, rec["owner"], n.Public())
		}
		// The node's ownership ends with its vouch.
		if rec["owner_expires_at"] != rec["vouch_expires_at"] {
			t.Errorf("%s: owner_expires_at %v, vouch_expires_at %v", name, rec["owner_expires_at"], rec["vouch_expires_at"])
		}
	}
}

// TestOwnerOf is the one reader's rules, on records as stored.
func TestOwnerOf(t *testing.T) {
	agent, node, owner := bustest.Agent(t).Public(), bustest.Node(t).Public(), bustest.Agent(t).Public()
	now := time.Date(2026, 7, 27, 15, 0, 0, 0, time.UTC)
	at := func(d time.Duration) string { return protocol.FormatTime(now.Add(d)) }
	rec := func(kv ...any) map[string]any {
		r := map[string]any{"id": agent, "node": map[string]any{"id": node}}
		for i := 0; i < len(kv); i += 2 {
			r[kv[i].(string)] = kv[i+1]
		}
		return r
	}
	for _, tc := range []struct {
		name string
		rec  map[string]any
		want string
	}{
		{"attested, in force", rec("owner", owner, "owner_expires_at", at(time.Hour)), owner},
		{"attested, at its expiry", rec("owner", owner, "owner_expires_at", at(0)), owner},
		// #1: once the attestation has expired there is no owner; the
		// node is not silently the owner instead.
		{"attested, expired", rec("owner", owner, "owner_expires_at", at(-time.Millisecond)), ""},
		{"expiry unreadable", rec("owner", owner, "owner_expires_at", "soon"), ""},
		{"attested owner with no expiry recorded", rec("owner", owner, "vouch_expires_at", at(time.Hour)), ""},
		{"node owner", rec("owner", node, "owner_expires_at", at(time.Hour)), node},
		{"node owner, vouch expired", rec("owner", node, "owner_expires_at", at(-time.Second)), ""},
		{"no owner", rec("owner", "", "vouch_expires_at", at(time.Hour)), ""},
		{"owner not a key", rec("owner", "me", "owner_expires_at", at(time.Hour)), ""},
		// #2: an agent key is never an owner, and a guest has none.
		{"its own owner", rec("owner", agent, "owner_expires_at", at(time.Hour)), ""},
		{"sandbox", rec("owner", owner, "owner_expires_at", at(time.Hour), "sandbox", true), ""},
		// Records written before the registry recorded owners: the node,
		// while its vouch lasts, unless that is the agent itself.
		{"before owners, node", rec("vouch_expires_at", at(time.Hour)), node},
		{"before owners, vouch expired", rec("vouch_expires_at", at(-time.Second)), ""},
		{"before owners, no vouch stamp", rec(), node},
		{"before owners, self-hosted", map[string]any{"id": agent, "node": map[string]any{"id": agent}}, ""},
		{"before owners, sandbox", rec("sandbox", true), ""},
	} {
		if got := registry.OwnerOf(tc.rec, now); got != tc.want {
			t.Errorf("%s: OwnerOf = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestOwnerEndsWithItsAttestation (review 18 #1): the recorded owner lasts
// as long as the owner's attestation, not as long as the node's vouch: a
// one-hour attestation under a month's vouch stops naming the owner after
// the hour, the node does not become the owner instead, and discover by
// owner stops finding the agent.
func TestOwnerEndsWithItsAttestation(t *testing.T) {
	// The worker's own clock, moved past the attestation below; envelopes
	// are still checked at the bus's time.
	clock := &bustest.Clock{}
	f := setup(t, registry.Config{Now: clock.Now})
	a, n, owner := bustest.Agent(t), bustest.Node(t), bustest.Agent(t)
	now := time.Now()
	att := ownerAttestation(t, owner, a.Public(), now.Add(-time.Second), now.Add(time.Hour))
	f.mustRegister(a, manifest(t, a, n, month, map[string]any{"owner_attestation": att}))
	rec, _ := f.stored(a.Public())
	expires, _ := protocol.ParseTime(att["expires_at"].(string))
	if rec["owner_expires_at"] != att["expires_at"] {
		t.Fatalf("owner_expires_at %v, want the attestation's %v (vouch_expires_at %v)", rec["owner_expires_at"], att["expires_at"], rec["vouch_expires_at"])
	}
	if got := registry.OwnerOf(rec, expires); got != owner.Public() {
		t.Fatalf("owner at the attestation's expiry = %q", got)
	}
	if got := registry.OwnerOf(rec, expires.Add(time.Millisecond)); got != "" {
		t.Fatalf("owner after the attestation expired = %q, want none (the node is %s)", got, n.Public())
	}
	byOwner := func() int {
		res, err := f.discover(map[string]any{"owner": owner.Public()})
		if err != nil {
			t.Fatal(err)
		}
		agents, _ := res["agents"].([]any)
		return len(agents)
	}
	if got := byOwner(); got != 1 {
		t.Fatalf("discover by owner found %d agents before expiry", got)
	}
	clock.Advance(time.Hour + time.Minute)
	if got := byOwner(); got != 0 {
		t.Fatalf("discover by owner found %d agents after the attestation expired", got)
	}

	// An attestation longer than the vouch lasts as long as the vouch.
	b := bustest.Agent(t)
	now = clock.Now()
	f.mustRegister(b, manifest(t, b, n, 3*time.Hour, map[string]any{
		"owner_attestation": ownerAttestation(t, owner, b.Public(), now.Add(-time.Second), now.Add(month)),
	}))
	rec, _ = f.stored(b.Public())
	if rec["owner_expires_at"] != rec["vouch_expires_at"] {
		t.Fatalf("owner_expires_at %v outlives vouch_expires_at %v", rec["owner_expires_at"], rec["vouch_expires_at"])
	}
}

// TestAgentKeyIsNeverOwner (review 18 #2): an agent that would be its own
// owner (self-hosted with no attestation, or attesting itself), and any
// sandbox registration (a guest, a declared sandbox, even with a valid
// attestation by another key), is recorded with no owner.
func TestAgentKeyIsNeverOwner(t *testing.T) {
	f := setup(t, registry.Config{})
	now := time.Now()
	owner := bustest.Agent(t)
	self := bustest.Agent(t)
	selfAttested, n := bustest.Agent(t), bustest.Node(t)
	guest := bustest.Agent(t)
	f.lease(guest)
	declared := bustest.Agent(t)
	for _, tc := range []struct {
		name string
		key  keys.Signer
		m    map[string]any
	}{
		{"self-hosted, no attestation", self, manifest(t, self, self, month, nil)},
		{"attests itself", selfAttested, manifest(t, selfAttested, n, month, map[string]any{
			"owner_attestation": ownerAttestation(t, selfAttested, selfAttested.Public(), now.Add(-time.Second), now.Add(month))})},
		{"guest", guest, manifest(t, guest, guest, time.Hour, nil)},
		{"declared sandbox with an owner's attestation", declared, manifest(t, declared, n, month, map[string]any{
			"trust_tier":        "sandbox",
			"owner_attestation": ownerAttestation(t, owner, declared.Public(), now.Add(-time.Second), now.Add(month))})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.mustRegister(tc.key, tc.m)
			rec, _ := f.stored(tc.key.Public())
			if rec["owner"] != "" || rec["owner_expires_at"] != nil || registry.OwnerOf(rec, now) != "" {
				t.Fatalf("owner %v until %v, want none", rec["owner"], rec["owner_expires_at"])
			}
		})
	}
}

func TestOwnerAndSKURefusals(t *testing.T) {
	f := setup(t, registry.Config{})
	a, n, owner, other := bustest.Agent(t), bustest.Node(t), bustest.Agent(t), bustest.Agent(t)
	now := time.Now()
	att := func(signer keys.Signer, agent string, issued, expires time.Time) map[string]any {
		return ownerAttestation(t, signer, agent, issued, expires)
	}
	good := att(owner, a.Public(), now.Add(-time.Second), now.Add(month))
	forged := att(other, a.Public(), now.Add(-time.Second), now.Add(month))
	forged["node"] = owner.Public()
	withExtra := att(owner, a.Public(), now.Add(-time.Second), now.Add(month))
	withExtra["why"] = "x"
	// A vouch by the would-be owner (the tag of a node's vouch, public in
	// every record it hosts) is not an owner attestation (review 18 #15).
	vouch, err := protocol.NewVouch(owner, a.Public(), now.Add(-time.Second), now.Add(month))
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name  string
		extra map[string]any
		says  string
	}{
		{"expired attestation", map[string]any{"owner_attestation": att(owner, a.Public(), now.Add(-2*time.Hour), now.Add(-time.Hour))}, "expired"},
		{"attestation for another agent", map[string]any{"owner_attestation": att(owner, other.Public(), now, now.Add(month))}, "not for this manifest's id"},
		{"forged signature", map[string]any{"owner_attestation": forged}, "not signed by its owner key"},
		{"a node vouch", map[string]any{"owner_attestation": vouchValue(t, vouch)}, "not signed by its owner key " + owner.Public() + " under agentmesh-owner-v1"},
		{"owner is not the attester", map[string]any{"owner": other.Public(), "owner_attestation": good}, "the key that signed owner_attestation"},
		{"attestation not an object", map[string]any{"owner_attestation": "yes"}, "owner_attestation must be"},
		{"attestation with unknown member", map[string]any{"owner_attestation": withExtra}, "unknown member"},
		{"attestation too long", map[string]any{"owner_attestation": att(owner, a.Public(), now, now.Add(3*month))}, "longer than"},
		{"attestation from the future", map[string]any{"owner_attestation": att(owner, a.Public(), now.Add(time.Hour), now.Add(month))}, "not valid until"},
		{"skus not an array", map[string]any{"skus": map[string]any{}}, "skus must be an array"},
		{"bad sku", map[string]any{"skus": jsonValue(t, `[{"sku":"X","covers":{"agent":true},"price":{"model":"free"},"provider":{"id":"internal"}}]`)}, "SKU: sku must match"},
		{"duplicate sku", map[string]any{"skus": jsonValue(t, "["+skuJSON+","+skuJSON+"]")}, "duplicate sku id"},
		{"sku covers an offering not offered", map[string]any{"skus": jsonValue(t, `[{"sku":"s","covers":{"offerings":["translate"]},"price":{"model":"free"},"provider":{"id":"internal"}}]`)}, `covers offering "translate"`},
		{"sku covers with no offerings at all", map[string]any{"offerings": nil, "skus": jsonValue(t, "["+skuJSON+"]")}, `covers offering "echo"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.register(a, manifest(t, a, n, month, tc.extra))
			wantCode(t, err, errs.InvalidManifest, tc.says)
			if _, found := f.stored(a.Public()); found {
				t.Fatal("a refused registration was stored")
			}
		})
	}
}

// TestSandboxMayNotSell: a guest (sandbox) registration may publish a
// free SKU but not a paid one; the same manifest on an account's node is
// listed.
func TestSandboxMayNotSell(t *testing.T) {
	f := setup(t, registry.Config{})
	paid := map[string]any{"skus": jsonValue(t, "["+skuJSON+"]")}

	g := bustest.Agent(t)
	f.lease(g)
	_, err := f.register(g, manifest(t, g, g, time.Hour, paid))
	wantCode(t, err, errs.InvalidManifest, "sandbox (guest) registration may not sell")
	if _, found := f.stored(g.Public()); found {
		t.Fatal("a guest's paid SKU was stored")
	}
	// Declared sandbox, and a bound subject: the same rule.
	s, n := bustest.Agent(t), bustest.Node(t)
	_, err = f.register(s, manifest(t, s, n, month, map[string]any{"trust_tier": "sandbox", "skus": paid["skus"]}))
	wantCode(t, err, errs.InvalidManifest, "echo-metered is paid")
	_, err = f.call(s, protocol.SubjRegister+"."+n.Public(), protocol.TypeRegister, manifest(t, s, n, month, paid))
	wantCode(t, err, errs.InvalidManifest, "sandbox")

	// Free terms are allowed in the sandbox.
	rep := f.mustRegister(g, manifest(t, g, g, time.Hour, map[string]any{"skus": jsonValue(t, "["+freeSKUJSON+"]")}))
	if rep["sandbox"] != true {
		t.Fatalf("guest answer %v", rep)
	}
	// A full node sells.
	a := bustest.Agent(t)
	if rep := f.mustRegister(a, manifest(t, a, n, month, paid)); rep["sandbox"] != false {
		t.Fatalf("account node answer %v", rep)
	}
	rec, _ := f.stored(a.Public())
	b, _ := json.Marshal(rec["skus"])
	if got, _ := commerce.SKUsFromValue(jsonValue(t, string(b))); len(got) != 1 || !got[0].Price.Paid() {
		t.Fatalf("stored skus %s", b)
	}
}
