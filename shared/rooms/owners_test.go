package rooms_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/pancard"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/rooms"
)

// registrarDouble answers /api/registrar-key and /api/resolve?agent_id=
// as the registrar does, with cards the test decides.
type registrarDouble struct {
	srv      *httptest.Server
	key      *keys.Registrar
	cards    map[string]map[string]any // agent → card
	signWith map[string]keys.Signer    // agent → another signer
	status   atomic.Int32              // non-zero: answer every resolve with it
	resolves atomic.Int32
}

func newRegistrarDouble(t *testing.T) *registrarDouble {
	k, err := keys.Generate[keys.RegistrarRole]()
	if err != nil {
		t.Fatal(err)
	}
	r := &registrarDouble{key: k, cards: map[string]map[string]any{}, signWith: map[string]keys.Signer{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/registrar-key", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, 200, map[string]any{"registrar": r.srv.URL, "keys": []string{k.Public()},
			"key_set": []any{map[string]any{"kid": pancard.Kid(k.Public()), "key": k.Public(), "status": "current", "use": pancard.KeyUse}}})
	})
	mux.HandleFunc("GET /api/resolve", func(w http.ResponseWriter, req *http.Request) {
		r.resolves.Add(1)
		if s := r.status.Load(); s != 0 {
			writeJSON(w, int(s), map[string]any{"ok": false, "error": "down"})
			return
		}
		agent := req.URL.Query().Get("agent_id")
		card, ok := r.cards[agent]
		if !ok {
			writeJSON(w, 404, map[string]any{"ok": false, "error": "no agent by that name"})
			return
		}
		var signer keys.Signer = r.key
		if s, ok := r.signWith[agent]; ok {
			signer = s
		}
		sig, err := protocol.SignCard(signer, card)
		if err != nil {
			t.Error(err)
		}
		writeJSON(w, 200, map[string]any{"ok": true, "card": card, "registrar_key": signer.Public(),
			"registrar_kid": pancard.Kid(signer.Public()), "registrar_sig": sig})
	})
	r.srv = httptest.NewServer(mux)
	t.Cleanup(r.srv.Close)
	return r
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// card is a bound card of handle for agent; edit changes it.
func (r *registrarDouble) card(agent, handle string, edit func(map[string]any)) {
	now := time.Now()
	c := map[string]any{"handle": handle, "operator": map[string]any{"name": "Ana", "id": account.OperatorID("ana@example.org")}, "reserved": false,
		"endpoints": []any{map[string]any{"protocol": "mesh", "agent_id": agent}}, "binding": "agent-key",
		"claimed_via": "email", "claimed_at": protocol.FormatTime(now.Add(-time.Hour)), "registrar": r.srv.URL,
		"issued_at": protocol.FormatTime(now), "expires_at": protocol.FormatTime(now.Add(time.Hour))}
	if edit != nil {
		edit(c)
	}
	r.cards[agent] = c
}

// The cloud worker's Owners: a reverse resolve whose card verifies with
// the registrar's key set, or a refusal with the code that says why.
func TestRegistrarOwners(t *testing.T) {
	reg := newRegistrarDouble(t)
	agent := func() string { return bustest.Agent(t).Public() }
	bound, dotted, reserved, other, forged, expired, elsewhere, noID := agent(), agent(), agent(), agent(), agent(), agent(), agent(), agent()
	reg.card(bound, "Helper.ana@example.org", nil)
	reg.card(dotted, "my.bot.ana@example.org", nil)
	reg.card(reserved, "idle.ana@example.org", func(c map[string]any) { c["reserved"], c["endpoints"], c["binding"] = true, []any{}, nil })
	reg.card(other, "other.ana@example.org", func(c map[string]any) {
		c["endpoints"] = []any{map[string]any{"protocol": "mesh", "agent_id": bound}}
	})
	reg.card(forged, "forged.ana@example.org", nil)
	reg.signWith[forged] = bustest.Agent(t)
	reg.card(expired, "old.ana@example.org", func(c map[string]any) { c["expires_at"] = protocol.FormatTime(time.Now().Add(-time.Hour)) })
	reg.card(elsewhere, "far.ana@example.org", func(c map[string]any) { c["registrar"] = "https://registrar.example.org" })
	reg.card(noID, "plain.ana@example.org", func(c map[string]any) { c["operator"] = map[string]any{"name": "Ana"} })

	o, err := rooms.NewRegistrarOwners(reg.srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	got, err := o.Owner(t.Context(), bound)
	ana := account.OperatorID("ana@example.org")
	if err != nil || got.Handle != "Helper.ana@example.org" || got.Operator != ana {
		t.Fatalf("bound: %+v %v", got, err)
	}
	// A dotted name: the operator is the card's operator.id; the handle is
	// never parsed (my.bot.ana@example.org is not bot.ana@example.org's).
	if got, err := o.Owner(t.Context(), dotted); err != nil || got.Operator != ana {
		t.Fatalf("dotted: %+v %v", got, err)
	}
	before := reg.resolves.Load()
	if _, err := o.Owner(t.Context(), bound); err != nil || reg.resolves.Load() != before {
		t.Fatalf("a second ask within minutes resolves again: %v", err)
	}
	for name, tc := range map[string]struct {
		agent string
		code  errs.Code
	}{
		"unknown":           {agent(), errs.NotNamed},
		"reserved":          {reserved, errs.NotNamed},
		"another's card":    {other, errs.NotNamed},
		"forged":            {forged, errs.Unavailable},
		"expired":           {expired, errs.Unavailable},
		"another registrar": {elsewhere, errs.Unavailable},
		"no operator id":    {noID, errs.Unavailable},
	} {
		if _, err := o.Owner(t.Context(), tc.agent); errs.CodeOf(err) != tc.code {
			t.Errorf("%s: %v, want %s", name, err, tc.code)
		}
	}
	fresh, _ := rooms.NewRegistrarOwners(reg.srv.URL)
	reg.status.Store(http.StatusServiceUnavailable)
	if _, err := fresh.Owner(t.Context(), bound); errs.CodeOf(err) != errs.Unavailable {
		t.Errorf("registrar down: %v", err)
	}
	reg.srv.Close()
	if _, err := fresh.Owner(t.Context(), dotted); errs.CodeOf(err) != errs.Unavailable {
		t.Errorf("registrar gone: %v", err)
	}
	for _, bad := range []string{"", "ftp://x", "registrar.example.org"} {
		if _, err := rooms.NewRegistrarOwners(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
