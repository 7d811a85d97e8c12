package registrar_test

import (
	"errors"
	"testing"

	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/registrar"
	"agentmesh.dev/mesh/shared/secret"
	"agentmesh.dev/mesh/shared/store"
)

// storedCodeHash is the hash the store keeps of addr's only pending code.
func (e *env) storedCodeHash(addr string) string {
	e.t.Helper()
	var docs []struct {
		Email string        `json:"email"`
		Codes []secret.Code `json:"codes"`
	}
	if err := store.List(e.t.Context(), e.st, registrar.CollCodes, store.Where("email", addr), &docs); err != nil || len(docs) != 1 || len(docs[0].Codes) != 1 {
		e.t.Fatalf("codes of %s: %+v %v", addr, docs, err)
	}
	return docs[0].Codes[0].CodeHash
}

// With a signing key, email and pairing codes are stored under a hash
// keyed with a secret derived from it: someone holding a copy of the store
// cannot find a live code by hashing all of them. A registrar built again
// with the same key (a restart, another replica) still recognises them.
func TestCodesStoredUnderAKeyedHash(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t)
	if _, err := e.svc.StartEmail(ctx, "ana@example.org", "192.0.2.1"); err != nil {
		t.Fatal(err)
	}
	code := e.mail.lastCode(t, "ana@example.org")
	if got := e.storedCodeHash("ana@example.org"); got == secret.HashCode("registrar\x00ana@example.org", code) {
		t.Fatal("the email code is stored as a plain SHA-256 of the code")
	}
	tok := e.session("bo@example.org")
	h := e.claim(tok, "coder", "Bo")
	p, err := e.svc.StartPairing(ctx, tok, h)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := store.Get(ctx, e.st, registrar.CollPairing, secret.HashCode("pan-pair", p.Code), &doc); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the pairing code is stored under its plain SHA-256: %v", err)
	}
	if e.count(registrar.CollPairing) != 1 {
		t.Fatal("no pairing code stored")
	}

	// The same key, loaded again from its seed, derives the same secret.
	again, err := keys.FromSeed[keys.RegistrarRole](e.key.Seed())
	if err != nil {
		t.Fatal(err)
	}
	restarted := registrar.New(registrar.Config{Store: e.st, Mail: e.mail, Signer: again, URL: regURL, Now: e.clock.Now})
	if _, err := restarted.Verify(ctx, "ana@example.org", code, "192.0.2.1"); err != nil {
		t.Fatalf("the email code after a restart: %v", err)
	}
	agent := newAgent(t)
	if got, err := restarted.CompletePairing(ctx, p.Code, agent.Public(), protocol.SignPair(agent, p.Code), "192.0.2.1"); err != nil || got != h {
		t.Fatalf("the pairing code after a restart: %q %v", got, err)
	}

	// Another key does not recognise them.
	other, err := keys.Generate[keys.RegistrarRole]()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.StartEmail(ctx, "cy@example.org", "192.0.2.1"); err != nil {
		t.Fatal(err)
	}
	rekeyed := registrar.New(registrar.Config{Store: e.st, Mail: e.mail, Signer: other, URL: regURL, Now: e.clock.Now})
	if _, err := rekeyed.Verify(ctx, "cy@example.org", e.mail.lastCode(t, "cy@example.org"), "192.0.2.1"); err == nil {
		t.Fatal("a registrar with another key accepted the code")
	}
}

// Without a signing key the codes fall back to SHA-256 and still work.
func TestCodesWithoutAKey(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t, func(c *registrar.Config) { c.Signer = nil })
	if _, err := e.svc.StartEmail(ctx, "ana@example.org", "192.0.2.1"); err != nil {
		t.Fatal(err)
	}
	code := e.mail.lastCode(t, "ana@example.org")
	if got := e.storedCodeHash("ana@example.org"); got != secret.HashCode("registrar\x00ana@example.org", code) {
		t.Fatal("without a key the code is hashed with plain SHA-256")
	}
	tok := e.session("bo@example.org")
	h := e.claim(tok, "coder", "Bo")
	p, err := e.svc.StartPairing(ctx, tok, h)
	if err != nil {
		t.Fatal(err)
	}
	agent := newAgent(t)
	if got, err := e.svc.CompletePairing(ctx, p.Code, agent.Public(), protocol.SignPair(agent, p.Code), "192.0.2.1"); err != nil || got != h {
		t.Fatalf("pairing without a key: %q %v", got, err)
	}
}
