package registrar_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/registrar"
	"agentmesh.dev/mesh/shared/store"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// The handle states and transitions of spec §3.1, row by row.
func TestHandleStates(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t)
	ana := e.session("ana@example.org")
	agent := newAgent(t)

	// (none) — claim, name free, session valid → reserved: resolve shows
	// reserved:true and no endpoints.
	_, err := e.svc.Resolve(ctx, "helper.ana@example.org", "")
	wantErr(t, "before the claim", err, errs.NotFound, 404, "no agent by that name")
	h := e.claim(ana, "helper", "Ana")
	r, err := e.svc.Resolve(ctx, h, "")
	if err != nil || !r.Card.Reserved || len(r.Card.Endpoints) != 0 || r.Card.Binding != nil {
		t.Fatalf("reserved: %+v %v", r.Card, err)
	}
	if !bytes.Contains(r.CardJSON, []byte(`"endpoints":[]`)) || !bytes.Contains(r.CardJSON, []byte(`"binding":null`)) ||
		!bytes.Contains(r.CardJSON, []byte(`"reserved":true`)) {
		t.Fatalf("reserved card on the wire: %s", r.CardJSON)
	}
	// A reserved handle has no agent to resolve in reverse.
	_, err = e.svc.Resolve(ctx, "", agent.Public())
	wantErr(t, "reverse before pairing", err, errs.NotFound, 404, "no agent by that name")

	// reserved — pair with a valid unexpired unused code signed by the
	// agent key → bound: endpoints hold {protocol: mesh, agent_id}.
	p, err := e.svc.StartPairing(ctx, ana, h)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := e.svc.CompletePairing(ctx, p.Code, agent.Public(), protocol.SignPair(agent, p.Code), "192.0.2.1"); err != nil || got != h {
		t.Fatalf("pair: %q %v", got, err)
	}
	r, err = e.svc.Resolve(ctx, h, "")
	if err != nil || r.Card.Reserved || len(r.Card.Endpoints) != 1 || r.Card.Endpoints[0] != (registrar.Endpoint{Protocol: "mesh", AgentID: agent.Public()}) ||
		r.Card.Binding == nil || *r.Card.Binding != "agent-key" {
		t.Fatalf("bound: %+v %v", r.Card, err)
	}

	// (none) — claim, name taken → (none): the claim is rejected.
	collide := e.session("ops@example.org")
	e.claim(collide, "a.b", "Ops") // a.b.ops@example.org
	rival := e.session("b.ops@example.org")
	_, err = e.svc.Claim(ctx, rival, "A", "Rival") // A.b.ops@example.org folds onto it
	wantErr(t, "taken", err, errs.Conflict, 409, "taken")
	if r, _ := e.svc.Resolve(ctx, "a.b.ops@example.org", ""); r.Card.Handle != "a.b.ops@example.org" || r.Card.Operator.Name != "Ops" {
		t.Fatalf("the first claim stands: %+v", r.Card)
	}

	// A pairing code is single use: after use it is unknown, used or
	// expired.
	_, err = e.svc.CompletePairing(ctx, p.Code, agent.Public(), protocol.SignPair(agent, p.Code), "192.0.2.1")
	wantErr(t, "used code", err, errs.NotFound, 404, "pairing code unknown, used or expired: request a new one")
}

func TestPairing(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t)
	ana := e.session("ana@example.org")
	h := e.claim(ana, "helper", "Ana")
	agent, impostor := newAgent(t), newAgent(t)
	pair := func(code string, a *keys.Agent) (string, error) {
		return e.svc.CompletePairing(ctx, code, a.Public(), protocol.SignPair(a, code), "192.0.2.1")
	}

	p, err := e.svc.StartPairing(ctx, ana, "HELPER.ana@example.org")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^[ABCDEFGHJKLMNPQRSTUVWXYZ23456789]{3}-[ABCDEFGHJKLMNPQRSTUVWXYZ23456789]{3}$`).MatchString(p.Code) ||
		p.Handle != h || !p.ExpiresAt.Equal(e.clock.Now().Add(10*time.Minute)) {
		t.Fatalf("pairing code %+v", p)
	}

	// Refusals that leave the code unspent.
	for _, tc := range []struct {
		name             string
		code, agent, sig string
		want             errs.Code
		status           int
		fragment         string
	}{
		{"bad signature", p.Code, agent.Public(), protocol.SignPair(impostor, p.Code), errs.IdentityMismatch, 401, "does not verify"},
		{"signature of another code", p.Code, agent.Public(), protocol.SignPair(agent, "ZZZ-ZZZ"), errs.IdentityMismatch, 401, "the code was not used"},
		{"not base64", p.Code, agent.Public(), "!!!", errs.InvalidRequest, 400, "standard base64 Ed25519 signature (64 bytes)"},
		{"not 64 bytes", p.Code, agent.Public(), "AAAA", errs.InvalidRequest, 400, "signature is 3 bytes, want 64"},
		{"no signature", p.Code, agent.Public(), "", errs.InvalidRequest, 400, "signature is required"},
		{"agent id is not a key", p.Code, "agent-7", protocol.SignPair(agent, p.Code), errs.InvalidRequest, 400, "agent_id"},
		{"malformed code", "AB-CD", agent.Public(), protocol.SignPair(agent, "AB-CD"), errs.InvalidRequest, 400, "looks like ABC-234"},
		{"unknown code", "ZZZ-ZZZ", agent.Public(), protocol.SignPair(agent, "ZZZ-ZZZ"), errs.NotFound, 404, "unknown, used or expired"},
	} {
		_, err := e.svc.CompletePairing(ctx, tc.code, tc.agent, tc.sig, "192.0.2.1")
		wantErr(t, tc.name, err, tc.want, tc.status, tc.fragment)
	}
	// The code, typed in lower case without its dash, still works: no
	// refusal above spent it.
	typed := strings.ToLower(strings.ReplaceAll(p.Code, "-", ""))
	if got, err := pair(typed, agent); err != nil || got != h {
		t.Fatalf("pair with the typed code: %q %v", got, err)
	}
	_, err = pair(p.Code, agent)
	wantErr(t, "used code", err, errs.NotFound, 404, "unknown, used or expired")

	// Expiry: ten minutes.
	p2, err := e.svc.StartPairing(ctx, ana, h)
	if err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(10 * time.Minute)
	_, err = pair(p2.Code, impostor)
	wantErr(t, "expired code", err, errs.NotFound, 404, "unknown, used or expired")

	// Only the holder of the handle's address pairs it.
	bo := e.session("bo@example.org")
	_, err = e.svc.StartPairing(ctx, bo, h)
	wantErr(t, "another's handle", err, errs.Forbidden, 403, "belongs to another address")
	_, err = e.svc.StartPairing(ctx, bo, "nothing.bo@example.org")
	wantErr(t, "unclaimed handle", err, errs.NotFound, 404, "claim it first")
	_, err = e.svc.StartPairing(ctx, bo, " ")
	wantErr(t, "no handle", err, errs.InvalidRequest, 400, "handle is required")

	// Pairing again moves the handle to the new agent (what a resolver's
	// pin warns about).
	p3, err := e.svc.StartPairing(ctx, ana, h)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pair(p3.Code, impostor); err != nil {
		t.Fatal(err)
	}
	r, err := e.svc.Resolve(ctx, h, "")
	if err != nil || r.Card.Endpoints[0].AgentID != impostor.Public() {
		t.Fatalf("rebound: %+v %v", r.Card, err)
	}
	// The secrets are stored only as hashes.
	assertNoSecret(t, e, p.Code, p2.Code, p3.Code)
}

// assertNoSecret reads every registrar collection and fails when any
// secret appears in it.
func assertNoSecret(t *testing.T, e *env, secrets ...string) {
	t.Helper()
	for _, coll := range []string{registrar.CollCodes, registrar.CollSessions, registrar.CollPairing, registrar.CollOperators, registrar.CollRateLimits, account.CollHandles} {
		var docs []map[string]any
		if err := store.List(t.Context(), e.st, coll, store.Query{}, &docs); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(docs)
		for _, s := range secrets {
			if bytes.Contains(b, []byte(s)) {
				t.Errorf("collection %s holds a secret in the clear", coll)
			}
		}
	}
}

func TestSecretsStoredHashed(t *testing.T) {
	e := newEnv(t)
	if _, err := e.svc.StartEmail(t.Context(), "ana@example.org", "192.0.2.1"); err != nil {
		t.Fatal(err)
	}
	code := e.mail.lastCode(t, "ana@example.org")
	assertNoSecret(t, e, code, "ana@example.org\",\"ip", "192.0.2.1")
	v, err := e.svc.Verify(t.Context(), "ana@example.org", code, "192.0.2.1")
	if err != nil {
		t.Fatal(err)
	}
	assertNoSecret(t, e, code, v.Token, strings.TrimPrefix(v.Token, registrar.SessionPrefix))
}

func TestResolve(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t)
	ana := e.session("ana@example.org")
	h := e.claim(ana, "Helper", "Ana <script>")
	agent := newAgent(t)
	p, _ := e.svc.StartPairing(ctx, ana, h)
	if _, err := e.svc.CompletePairing(ctx, p.Code, agent.Public(), protocol.SignPair(agent, p.Code), "192.0.2.1"); err != nil {
		t.Fatal(err)
	}

	// By handle (any case) and in reverse by agent id.
	for _, q := range [][2]string{{"helper.ANA@example.org", ""}, {"  Helper.ana@example.org ", ""}, {"", agent.Public()}} {
		r, err := e.svc.Resolve(ctx, q[0], q[1])
		if err != nil || r.Card.Handle != "Helper.ana@example.org" {
			t.Fatalf("resolve %v: %+v %v", q, r.Card, err)
		}
	}
	r, err := e.svc.Resolve(ctx, h, "")
	if err != nil {
		t.Fatal(err)
	}
	c := r.Card
	now := e.clock.Now()
	if c.Registrar != regURL || c.IssuedAt != protocol.FormatTime(now) || c.ExpiresAt != protocol.FormatTime(now.Add(time.Hour)) ||
		c.ClaimedVia != "email" || c.ClaimedAt != protocol.FormatTime(now) || c.Operator.Name != "Ana <script>" {
		t.Fatalf("card %+v", c)
	}

	// The signature verifies with the published key set, over the card
	// exactly as it travels.
	ks, err := e.svc.Keys()
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(e.key.Public()))
	if ks.Registrar != regURL || len(ks.Keys) != 1 || ks.Keys[0] != e.key.Public() || len(ks.KeySet) != 1 ||
		ks.KeySet[0] != (registrar.KeyEntry{Kid: strings.ToLower(bytesHex(sum[:6])), Key: e.key.Public(), Status: "current", Use: "pan-card-signing"}) {
		t.Fatalf("key set %+v", ks)
	}
	if r.Key != ks.Keys[0] || r.Kid != ks.KeySet[0].Kid {
		t.Fatalf("resolution names key %s kid %s", r.Key, r.Kid)
	}
	var wire any
	if err := json.Unmarshal(r.CardJSON, &wire); err != nil {
		t.Fatal(err)
	}
	if err := protocol.VerifyCard(ks.Keys[0], wire, r.Sig); err != nil {
		t.Fatalf("card signature: %v", err)
	}
	wire.(map[string]any)["handle"] = "evil.ana@example.org"
	if err := protocol.VerifyCard(ks.Keys[0], wire, r.Sig); err == nil {
		t.Fatal("a changed card verified")
	}

	// Refusals.
	for _, tc := range []struct {
		handle, agent string
		code          errs.Code
		status        int
		fragment      string
	}{
		{"nobody.ana@example.org", "", errs.NotFound, 404, "no agent by that name"},
		{"", newAgent(t).Public(), errs.NotFound, 404, "no agent by that name"},
		{"", "", errs.InvalidRequest, 400, "give ?handle="},
		{h, agent.Public(), errs.InvalidRequest, 400, "not both"},
		{"", "Unot-a-key", errs.InvalidRequest, 400, "agent_id must be"},
		{strings.Repeat("h", registrar.MaxHandle+1), "", errs.InvalidRequest, 400, "longer than"},
	} {
		_, err := e.svc.Resolve(ctx, tc.handle, tc.agent)
		wantErr(t, "resolve "+tc.handle+tc.agent, err, tc.code, tc.status, tc.fragment)
	}

	// A registrar that cannot sign answers 503, never an unsigned card.
	unsigned := registrar.New(registrar.Config{Store: e.st, Mail: e.mail, URL: regURL, Now: e.clock.Now})
	_, err = unsigned.Resolve(ctx, h, "")
	wantErr(t, "no signing key", err, errs.Unavailable, 503, "never serves an unsigned")
	_, err = unsigned.Keys()
	wantErr(t, "no key set", err, errs.Unavailable, 503, "cannot sign")
}

func bytesHex(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}

func TestWebFinger(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t)
	ana := e.session("ana@example.org")
	h := e.claim(ana, "helper", "Ana")
	jrd, err := e.svc.WebFinger(ctx, "acct:HELPER.ana@example.org")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(jrd)
	want := `{"subject":"acct:helper.ana@example.org","properties":{"urn:pan:binding":null},"links":[{"rel":"urn:pan:card","type":"application/json","href":"https://names.example.org/api/resolve?handle=helper.ana%40example.org"}]}`
	if string(b) != want {
		t.Fatalf("jrd\n got %s\nwant %s", b, want)
	}
	agent := newAgent(t)
	p, _ := e.svc.StartPairing(ctx, ana, h)
	if _, err := e.svc.CompletePairing(ctx, p.Code, agent.Public(), protocol.SignPair(agent, p.Code), "192.0.2.1"); err != nil {
		t.Fatal(err)
	}
	if jrd, _ := e.svc.WebFinger(ctx, "acct:"+h); jrd.Properties["urn:pan:binding"] != "agent-key" {
		t.Fatalf("bound jrd %+v", jrd)
	}
	for _, res := range []string{"", "acct:", "mailto:helper.ana@example.org", "helper.ana@example.org"} {
		_, err := e.svc.WebFinger(ctx, res)
		wantErr(t, "resource "+res, err, errs.InvalidRequest, 400, "acct:<handle>")
	}
	_, err = e.svc.WebFinger(ctx, "acct:nobody.ana@example.org")
	wantErr(t, "unknown", err, errs.NotFound, 404, "no agent by that name")
}

// fixedKey is a key made from a fixed seed, for golden files.
func fixedKey[R keys.Role](t *testing.T, label string) *keys.Key[R] {
	t.Helper()
	raw := sha256.Sum256([]byte(label))
	seed, err := nkeys.EncodeSeed(nkeys.PrefixByteUser, raw[:])
	if err != nil {
		t.Fatal(err)
	}
	k, err := keys.FromSeed[R](seed)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// The card of a bound handle, with a fixed registrar key and clock, is
// byte for byte the golden file: the canonical card, the key, its kid and
// the signature (Ed25519 signatures are deterministic).
func TestCardGolden(t *testing.T) {
	key := fixedKey[keys.RegistrarRole](t, "registrar golden key")
	agent := fixedKey[keys.AgentRole](t, "agent golden key")
	e := newEnv(t, func(c *registrar.Config) { c.Signer = key })
	claimed := time.Date(2026, 7, 30, 9, 15, 0, 0, time.UTC)
	for _, h := range []account.Handle{
		{Handle: "Helper.ana@example.org", Email: "ana@example.org", OperatorName: "Ana López", ClaimedAt: claimed.UnixMilli(),
			ClaimedVia: "email", AgentID: agent.Public(), BoundAt: claimed.Add(time.Minute).UnixMilli(), Binding: "agent-key"},
		{Handle: "Reserved.ana@example.org", Email: "ana@example.org", OperatorName: "Ana López", ClaimedAt: claimed.UnixMilli(), ClaimedVia: "email"},
	} {
		if err := e.st.RunTx(t.Context(), func(tx store.Tx) error { return tx.Set(account.CollHandles, registrar.HandleID(h.Handle), h) }); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	for _, h := range []string{"helper.ana@example.org", "reserved.ana@example.org"} {
		r, err := e.svc.Resolve(t.Context(), h, "")
		if err != nil {
			t.Fatal(err)
		}
		line, _ := json.Marshal(map[string]any{"card": json.RawMessage(r.CardJSON), "registrar_key": r.Key, "registrar_kid": r.Kid, "registrar_sig": r.Sig})
		out.Write(line)
		out.WriteByte('\n')
	}
	path := filepath.Join("testdata", "card.golden.jsonl")
	if *update {
		if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run TestCardGolden -update to write it)", err)
	}
	if !bytes.Equal(out.Bytes(), want) {
		t.Fatalf("cards differ from %s\n got %s\nwant %s", path, out.Bytes(), want)
	}
}
