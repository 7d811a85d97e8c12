package registrar

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// fakeRegistrar serves /api/resolve and /api/registrar-key with cards it
// builds and signs itself, so each test can bend one thing.
type fakeRegistrar struct {
	t   *testing.T
	srv *httptest.Server

	mu        sync.Mutex
	key       *keys.Registrar // signs the cards
	published *keys.Registrar // listed in the key set
	agent     string
	reserved  bool
	now       time.Time
	mutate    func(card map[string]any)
	status    int
	tamper    bool
}

func newFake(t *testing.T) *fakeRegistrar {
	t.Helper()
	k := genKey[keys.RegistrarRole](t)
	f := &fakeRegistrar{t: t, key: k, published: k, agent: genKey[keys.AgentRole](t).Public(), now: time.Now()}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func genKey[R keys.Role](t *testing.T) *keys.Key[R] {
	t.Helper()
	k, err := keys.Generate[R]()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func (f *fakeRegistrar) set(fn func(f *fakeRegistrar)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func (f *fakeRegistrar) card(handle string) map[string]any {
	eps := []any{}
	var binding any
	if !f.reserved {
		eps = []any{map[string]any{"protocol": "mesh", "agent_id": f.agent}}
		binding = "agent-key"
	}
	c := map[string]any{"handle": handle, "operator": map[string]any{"name": "Ana"}, "reserved": f.reserved, "endpoints": eps,
		"binding": binding, "claimed_via": "email", "claimed_at": protocol.FormatTime(f.now.Add(-time.Hour)),
		"registrar": f.srv.URL, "issued_at": protocol.FormatTime(f.now), "expires_at": protocol.FormatTime(f.now.Add(time.Hour))}
	if f.mutate != nil {
		f.mutate(c)
	}
	return c
}

func (f *fakeRegistrar) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if f.status != 0 {
		w.WriteHeader(f.status)
		_ = json.NewEncoder(w).Encode(map[string]any{"ok": false, "error": "refused by the fake"})
		return
	}
	switch r.URL.Path {
	case "/api/registrar-key":
		k := f.published.Public()
		_ = json.NewEncoder(w).Encode(map[string]any{"ok": true, "registrar": f.srv.URL, "keys": []string{k},
			"key_set": []any{map[string]any{"kid": Kid(k), "key": k, "status": "current", "use": "pan-card-signing"}}})
	case "/api/resolve":
		card := f.card(r.URL.Query().Get("handle"))
		sig, err := protocol.SignCard(f.key, card)
		if err != nil {
			f.t.Error(err)
		}
		if f.tamper {
			card["operator"] = map[string]any{"name": "Mallory"}
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"ok": true, "card": card, "registrar_key": f.key.Public(),
			"registrar_kid": Kid(f.key.Public()), "registrar_sig": sig})
	default:
		http.NotFound(w, r)
	}
}

func (f *fakeRegistrar) client(t *testing.T) *Client {
	c := New(f.srv.URL + "/")
	c.Pins = OpenPins(filepath.Join(t.TempDir(), PinsFile))
	return c
}

const handle = "Helper.ana@example.org"

func TestResolvePinsAndWarns(t *testing.T) {
	f := newFake(t)
	c := f.client(t)
	ctx := t.Context()
	first := f.agent

	r, err := c.Resolve(ctx, "helper.ANA@example.org", ResolveOptions{})
	if err != nil || r.AgentID != first || r.RegistrarKey != f.key.Public() || r.Previous != "" {
		t.Fatalf("first resolve: %+v %v", r, err)
	}
	fi, err := os.Stat(c.Pins.Path())
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("pins file: %v %v", fi, err)
	}
	if got, err := c.ResolveAgent(ctx, handle); err != nil || got != first {
		t.Fatalf("again: %s %v", got, err)
	}

	// The handle moves to another agent: refused, loudly, until accepted.
	second := genKey[keys.AgentRole](t).Public()
	f.set(func(f *fakeRegistrar) { f.agent = second })
	_, err = c.Resolve(ctx, handle, ResolveOptions{})
	var changed *BindingChangedError
	if !errors.As(err, &changed) || changed.Pinned != first || changed.Now != second ||
		!strings.Contains(err.Error(), "--accept-new-binding") || !strings.Contains(changed.Warning(), "THE AGENT BEHIND A HANDLE HAS CHANGED") {
		t.Fatalf("changed binding: %v", err)
	}
	// A fresh client on the same pins file refuses too: the pin is on disk.
	c2 := New(f.srv.URL)
	c2.Pins = OpenPins(c.Pins.Path())
	if _, err := c2.ResolveAgent(ctx, handle); !errors.As(err, &changed) {
		t.Fatalf("second client: %v", err)
	}
	r, err = c.Resolve(ctx, handle, ResolveOptions{AcceptNewBinding: true})
	if err != nil || r.AgentID != second || r.Previous != first {
		t.Fatalf("accepted: %+v %v", r, err)
	}
	if got, err := c.ResolveAgent(ctx, handle); err != nil || got != second {
		t.Fatalf("after accepting: %s %v", got, err)
	}

	// The registrar's key changes: refused, even when accepting bindings.
	f.set(func(f *fakeRegistrar) { k := genKey[keys.RegistrarRole](t); f.key, f.published = k, k })
	if _, err := c.Resolve(ctx, handle, ResolveOptions{AcceptNewBinding: true}); !errors.Is(err, ErrRegistrarKeyChanged) || !strings.Contains(err.Error(), PinsFile) {
		t.Fatalf("changed registrar key: %v", err)
	}
	// Without pins, the new key is checked against the key set and used.
	plain := New(f.srv.URL)
	if got, err := plain.ResolveAgent(ctx, handle); err != nil || got != second {
		t.Fatalf("no pins: %s %v", got, err)
	}
}

func TestResolveRefusals(t *testing.T) {
	ctx := t.Context()
	for _, tc := range []struct {
		name string
		bend func(f *fakeRegistrar)
		want string
	}{
		{"tampered card", func(f *fakeRegistrar) { f.tamper = true }, "valid registrar signature"},
		{"signed by a key the key set does not list", func(f *fakeRegistrar) { f.key = genKey[keys.RegistrarRole](f.t) }, "does not list as current"},
		{"expired", func(f *fakeRegistrar) { f.now = time.Now().Add(-time.Hour - 2*time.Minute) }, "expired at"},
		{"another handle's card", func(f *fakeRegistrar) { f.mutate = func(c map[string]any) { c["handle"] = "evil.ana@example.org" } }, "with the card of"},
		{"another registrar", func(f *fakeRegistrar) {
			f.mutate = func(c map[string]any) { c["registrar"] = "https://elsewhere.example.org" }
		}, "names the registrar"},
		{"reserved", func(f *fakeRegistrar) { f.reserved = true }, "reserved"},
		{"not a mesh endpoint", func(f *fakeRegistrar) {
			f.mutate = func(c map[string]any) { c["endpoints"] = []any{map[string]any{"protocol": "a2a", "url": "https://x"}} }
		}, "no mesh endpoint"},
		{"unknown", func(f *fakeRegistrar) { f.status = 404 }, "no agent is bound"},
		{"cannot sign", func(f *fakeRegistrar) { f.status = 503 }, "cannot sign cards"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t)
			f.set(tc.bend)
			c := f.client(t)
			_, err := c.ResolveAgent(ctx, handle)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error saying %q", err, tc.want)
			}
			if _, serr := os.Stat(c.Pins.Path()); serr == nil {
				t.Fatal("a refused card was pinned")
			}
		})
	}
	t.Run("within the expiry grace", func(t *testing.T) {
		f := newFake(t)
		f.set(func(f *fakeRegistrar) { f.now = time.Now().Add(-time.Hour - 30*time.Second) })
		if _, err := f.client(t).ResolveAgent(ctx, handle); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("upstream's protocol name", func(t *testing.T) {
		f := newFake(t)
		f.set(func(f *fakeRegistrar) {
			a := f.agent
			f.mutate = func(c map[string]any) { c["endpoints"] = []any{map[string]any{"protocol": "agentmesh", "agent_id": a}} }
		})
		if got, err := f.client(t).ResolveAgent(ctx, handle); err != nil || got != f.agent {
			t.Fatalf("%s %v", got, err)
		}
	})
}

func TestPinsFileDamaged(t *testing.T) {
	f := newFake(t)
	c := f.client(t)
	if err := os.WriteFile(c.Pins.Path(), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ResolveAgent(t.Context(), handle); err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Fatalf("damaged pins: %v", err)
	}
}

// The card verification is a decoder of untrusted input: whatever the
// bytes, it must not panic, and it must accept only a card that the key
// signed, for the handle asked, from the registrar asked.
func FuzzVerifyCard(f *testing.F) {
	key, err := keys.Generate[keys.RegistrarRole]()
	if err != nil {
		f.Fatal(err)
	}
	agent, _ := keys.Generate[keys.AgentRole]()
	now := time.Date(2026, 8, 1, 12, 0, 0, 0, time.UTC)
	const base = "https://names.example.org"
	card := map[string]any{"handle": handle, "operator": map[string]any{"name": "Ana"}, "reserved": false,
		"endpoints": []any{map[string]any{"protocol": "mesh", "agent_id": agent.Public()}}, "binding": "agent-key",
		"claimed_via": "email", "claimed_at": protocol.FormatTime(now), "registrar": base,
		"issued_at": protocol.FormatTime(now), "expires_at": protocol.FormatTime(now.Add(time.Hour))}
	sig, _ := protocol.SignCard(key, card)
	good, _ := json.Marshal(map[string]any{"card": card, "registrar_key": key.Public(), "registrar_kid": Kid(key.Public()), "registrar_sig": sig})
	f.Add(good)
	f.Add([]byte(`{"card":null}`))
	f.Add([]byte(`{"card":{"handle":"x"},"registrar_key":"` + key.Public() + `","registrar_sig":"AAAA"}`))
	f.Add([]byte(`[1,2,3]`))
	f.Add([]byte(strings.Replace(string(good), `"Ana"`, `"Ana\u0000"`, 1)))
	f.Fuzz(func(t *testing.T, body []byte) {
		c, err := VerifyCard(body, key.Public(), base, handle, now)
		if err != nil {
			return
		}
		var res resolution
		if json.Unmarshal(body, &res) != nil || protocol.VerifyCard(key.Public(), res.Card, res.RegistrarSig) != nil {
			t.Fatalf("accepted a card the key did not sign: %s", body)
		}
		if !strings.EqualFold(c.Handle, handle) || !SameRegistrar(c.Registrar, base) {
			t.Fatalf("accepted a card for %q from %q", c.Handle, c.Registrar)
		}
		if a, err := AgentOf(c); err == nil && !keys.IsUserPublicKey(a) {
			t.Fatalf("agent %q from an accepted card", a)
		}
	})
}
