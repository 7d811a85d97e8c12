package pancard

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

const base = "https://reg.example.org"

func registrarKey(t testing.TB) *keys.Registrar {
	k, err := keys.Generate[keys.RegistrarRole]()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// resolution signs card with k as the registrar answers it.
func resolution(t testing.TB, k keys.Signer, card map[string]any) []byte {
	sig, err := protocol.SignCard(k, card)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(map[string]any{"ok": true, "card": card, "registrar_key": k.Public(), "registrar_kid": Kid(k.Public()), "registrar_sig": sig})
	return b
}

func boundCard(agent string, expires time.Time) map[string]any {
	return map[string]any{"handle": "Coder.ana@example.org", "operator": map[string]any{"name": "Ana"}, "reserved": false,
		"endpoints": []any{map[string]any{"protocol": "mesh", "agent_id": agent}}, "binding": "agent-key", "claimed_via": "email",
		"claimed_at": "2026-07-27T15:00:00.000Z", "registrar": base + "/", "issued_at": protocol.FormatTime(expires.Add(-time.Hour)),
		"expires_at": protocol.FormatTime(expires)}
}

func TestCurrentKeys(t *testing.T) {
	k, old := registrarKey(t).Public(), registrarKey(t).Public()
	set := func(registrar string, entries ...map[string]any) []byte {
		b, _ := json.Marshal(map[string]any{"registrar": registrar, "keys": []string{k}, "key_set": entries})
		return b
	}
	entry := func(key, kid, status string) map[string]any {
		return map[string]any{"kid": kid, "key": key, "status": status, "use": KeyUse}
	}
	got, err := CurrentKeys(set(base, entry(k, Kid(k), "current"), entry(old, Kid(old), "retired")), "HTTPS://REG.example.org/")
	if err != nil || len(got) != 1 || got[0] != k {
		t.Fatalf("current keys %v %v", got, err)
	}
	for name, body := range map[string][]byte{
		"kid of another key":  set(base, entry(k, Kid(old), "current")),
		"only retired":        set(base, entry(old, Kid(old), "retired")),
		"another registrar":   set("https://evil.example.org", entry(k, Kid(k), "current")),
		"not json":            []byte("<html>"),
		"not a key":           set(base, entry("UNOTAKEY", Kid("UNOTAKEY"), "current")),
		"no key set entries":  set(base),
		"registrar not a URL": set("reg", entry(k, Kid(k), "current")),
	} {
		if _, err := CurrentKeys(body, base); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestVerify(t *testing.T) {
	k := registrarKey(t)
	agent, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	res, err := ParseResolution(resolution(t, k, boundCard(agent.Public(), now.Add(time.Hour))))
	if err != nil {
		t.Fatal(err)
	}
	card, err := res.Verify(k.Public(), base, now)
	if err != nil {
		t.Fatal(err)
	}
	if a, err := AgentOf(card); err != nil || a != agent.Public() {
		t.Fatalf("agent %q %v", a, err)
	}
	if _, err := res.Verify(registrarKey(t).Public(), base, now); !errors.Is(err, ErrKeyChanged) {
		t.Fatalf("another trusted key: %v", err)
	}
	if _, err := res.Verify(k.Public(), "https://other.example.org", now); err == nil {
		t.Fatal("a card of another registrar verifies")
	}
	if _, err := res.Verify(k.Public(), base, now.Add(time.Hour+ExpiryGrace-time.Second)); err != nil {
		t.Fatalf("within the grace: %v", err)
	}
	if _, err := res.Verify(k.Public(), base, now.Add(time.Hour+ExpiryGrace+time.Second)); err == nil || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("expired: %v", err)
	}
	tampered := *res
	tampered.Card = json.RawMessage(strings.Replace(string(res.Card), "Coder", "Coper", 1))
	if _, err := tampered.Verify(k.Public(), base, now); err == nil {
		t.Fatal("a changed card verifies")
	}
	badKid := *res
	badKid.RegistrarKid = "000000000000"
	if _, err := badKid.Verify(k.Public(), base, now); err == nil {
		t.Fatal("a wrong kid verifies")
	}
	for _, body := range []string{`{}`, `{"card":null}`, `nope`} {
		if _, err := ParseResolution([]byte(body)); err == nil {
			t.Errorf("%s parsed", body)
		}
	}
	reserved := &Card{Handle: "x.a@b.c", Reserved: true}
	if _, err := AgentOf(reserved); err == nil {
		t.Fatal("a reserved card names an agent")
	}
	up := &Card{Handle: "x.a@b.c"}
	up.Endpoints = append(up.Endpoints, struct {
		Protocol string `json:"protocol"`
		AgentID  string `json:"agent_id"`
	}{"agentmesh", agent.Public()})
	if a, err := AgentOf(up); err != nil || a != agent.Public() {
		t.Fatalf("upstream protocol name: %q %v", a, err)
	}
}

// A resolve answer is untrusted input: reading and verifying it never
// panics, and what verifies is signed by the trusted key.
func FuzzResolution(f *testing.F) {
	k := registrarKey(f)
	f.Add(resolution(f, k, boundCard("UAKQRYZBYFOC65OQZVJ3QPCIERDTRNNZPMOJUYXC3DGPRCDWSKD4HV5A", time.Now().Add(time.Hour))))
	f.Add([]byte(`{"card":{"handle":1},"registrar_key":"x"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		res, err := ParseResolution(b)
		if err != nil {
			return
		}
		card, err := res.Verify(k.Public(), base, time.Now())
		if err != nil {
			return
		}
		if protocol.VerifyCard(k.Public(), res.Card, res.RegistrarSig) != nil {
			t.Fatalf("verified without the trusted signature: %s", b)
		}
		_, _ = AgentOf(card)
	})
}
