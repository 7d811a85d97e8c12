package registrar_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"agentmesh.dev/mesh/functions/api"
	registrarfn "agentmesh.dev/mesh/functions/registrar"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/registrar"
	"agentmesh.dev/mesh/shared/store"
	"agentmesh.dev/mesh/shared/store/boltstore"
	"agentmesh.dev/mesh/shared/store/firestorestore"
)

type noMail struct{}

func (noMail) Send(context.Context, mail.Message) error { return nil }

// The card on the wire is exactly the bytes the registrar signed, even
// when it holds characters a JSON encoder escapes for HTML (& < >), so a
// verifier that checks the raw bytes succeeds.
func TestResolveSendsTheSignedBytes(t *testing.T) {
	ctx := t.Context()
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "control.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	key, err := keys.Generate[keys.RegistrarRole]()
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	// A fixed clock, so that the card resolved over HTTP and the one
	// resolved directly below are the same card.
	now := time.Date(2026, 8, 1, 12, 0, 0, 0, time.UTC)
	svc := registrar.New(registrar.Config{Store: st, Mail: noMail{}, Signer: key, URL: srv.URL, Now: func() time.Time { return now }})
	(&api.Deps{Log: slog.New(slog.DiscardHandler), Registrar: svc}).Mount(mux, registrarfn.Routes)

	v, err := svc.SessionFor(ctx, "ana@example.org", "console")
	if err != nil {
		t.Fatal(err)
	}
	c, err := svc.Claim(ctx, v.Token, "r&d<x>", "Smith & Sons <Ltd>")
	if err != nil {
		t.Fatal(err)
	}
	agent, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		t.Fatal(err)
	}
	p, err := svc.StartPairing(ctx, v.Token, c.Handle)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.CompletePairing(ctx, p.Code, agent.Public(), protocol.SignPair(agent, p.Code), "192.0.2.1"); err != nil {
		t.Fatal(err)
	}

	resp, err := http.Get(srv.URL + "/api/resolve?handle=" + url.QueryEscape(c.Handle))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
		t.Fatalf("resolve: %d %v\n%s", resp.StatusCode, resp.Header, body)
	}
	var wire struct {
		OK   bool            `json:"ok"`
		Card json.RawMessage `json:"card"`
		Key  string          `json:"registrar_key"`
		Sig  string          `json:"registrar_sig"`
	}
	if err := json.Unmarshal(body, &wire); err != nil || !wire.OK {
		t.Fatalf("answer: %v\n%s", err, body)
	}
	res, err := svc.Resolve(ctx, c.Handle, "")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(wire.Card, res.CardJSON) {
		t.Fatalf("the card on the wire is not the signed bytes:\nwire:   %s\nsigned: %s", wire.Card, res.CardJSON)
	}
	if !bytes.Contains(body, []byte(`"name":"Smith & Sons <Ltd>"`)) || !bytes.Contains(body, []byte(`"handle":"r&d<x>.ana@example.org"`)) {
		t.Fatalf("the raw body escapes the card:\n%s", body)
	}
	if err := protocol.VerifyString(key.Public(), wire.Card, wire.Sig, protocol.Base64Std); err != nil || wire.Key != key.Public() {
		t.Fatalf("the signature over the raw wire bytes: %v", err)
	}
}

// A handle whose store id no document can have ("." and "..": a query
// parameter is not cleaned like a path) is the caller's bad input, 400
// INVALID_REQUEST, on either store backend: the embedded one always, and
// Firestore when FIRESTORE_EMULATOR_HOST names an emulator. Both refuse
// the same ids (store.CheckID, held by the store contract suite).
func TestBadIDsAreBadInput(t *testing.T) {
	backends := map[string]func(t *testing.T) store.Store{
		"bolt": func(t *testing.T) store.Store {
			st, err := boltstore.Open(filepath.Join(t.TempDir(), "control.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			return st
		},
		"firestore": func(t *testing.T) store.Store {
			if os.Getenv("FIRESTORE_EMULATOR_HOST") == "" {
				t.Skip("FIRESTORE_EMULATOR_HOST not set")
			}
			project := os.Getenv("FIRESTORE_PROJECT_ID")
			if project == "" {
				project = "mesh-test"
			}
			st, err := firestorestore.New(t.Context(), project)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			return st.WithPrefix(fmt.Sprintf("badid%d_", time.Now().UnixNano()))
		},
	}
	for name, open := range backends {
		t.Run(name, func(t *testing.T) {
			st := open(t)
			key, err := keys.Generate[keys.RegistrarRole]()
			if err != nil {
				t.Fatal(err)
			}
			mux := http.NewServeMux()
			srv := httptest.NewServer(mux)
			t.Cleanup(srv.Close)
			svc := registrar.New(registrar.Config{Store: st, Mail: noMail{}, Signer: key, URL: srv.URL})
			(&api.Deps{Log: slog.New(slog.DiscardHandler), Registrar: svc}).Mount(mux, registrarfn.Routes)
			for _, h := range []string{".", ".."} {
				resp, err := http.Get(srv.URL + "/api/resolve?handle=" + url.QueryEscape(h))
				if err != nil {
					t.Fatal(err)
				}
				var body errs.HTTPBody
				err = json.NewDecoder(resp.Body).Decode(&body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusBadRequest || body.Code != errs.InvalidRequest || body.Retryable {
					t.Errorf("resolve %q: %d %+v (%v)", h, resp.StatusCode, body, err)
				}
			}
		})
	}
}
