package protocol

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
)

// requireBadSig fails unless err is IDENTITY_MISMATCH wrapping
// ErrBadSignature (a signature was checked and failed).
func requireBadSig(t *testing.T, err error) {
	t.Helper()
	requireCode(t, err, errs.IdentityMismatch, "")
	if !errors.Is(err, ErrBadSignature) {
		t.Fatalf("%v does not wrap ErrBadSignature", err)
	}
}

func nodeKey(t *testing.T) *keys.Node {
	t.Helper()
	k, err := keys.Generate[keys.NodeRole]()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// The signature-tags fixture's vouch: the published key vouches for the
// seedless agent for one day.
const (
	vouchVector = `{"node":"UBMBH4BK6EIHQFVMHLSABFSQXB3JXUFZOXVZQTIERO33AD4HHAI3D7QP","agent":"UAKQRYZBYFOC65OQZVJ3QPCIERDTRNNZPMOJUYXC3DGPRCDWSKD4HV5A",
	 "issued_at":"2026-07-27T15:00:00.000Z","expires_at":"2026-07-28T15:00:00.000Z",
	 "sig":"_CMcGqKU9D08MSiAzxdzi974iTgv8ViCoMclFByk8gMXwhllmRBNhaPSGKUm6ZSOA014be2ES8jiGGUMUBhZAg"}`
	vouchCanonical = `{"agent":"UAKQRYZBYFOC65OQZVJ3QPCIERDTRNNZPMOJUYXC3DGPRCDWSKD4HV5A","expires_at":"2026-07-28T15:00:00.000Z","issued_at":"2026-07-27T15:00:00.000Z","node":"UBMBH4BK6EIHQFVMHLSABFSQXB3JXUFZOXVZQTIERO33AD4HHAI3D7QP"}`
)

func TestVouchVector(t *testing.T) {
	raw, err := ParseJSON([]byte(vouchVector))
	if err != nil {
		t.Fatal(err)
	}
	v, err := VouchFromValue(raw)
	if err != nil {
		t.Fatal(err)
	}
	sb, _ := v.SignedBytes()
	if string(sb) != "agentmesh-vouch-v1\n"+vouchCanonical {
		t.Fatalf("signed bytes %q", sb)
	}
	if err := v.Verify(at3339("2026-07-27T16:00:00Z")); err != nil {
		t.Fatal(err)
	}
	// Deterministic: the published seed reproduces the upstream signature.
	re, err := NewVouch(vectorKey(t), v.Agent, at3339(v.IssuedAt), at3339(v.ExpiresAt))
	if err != nil {
		t.Fatal(err)
	}
	if re != v {
		t.Fatalf("re-made vouch %+v", re)
	}
}

func at3339(s string) time.Time {
	t, err := ParseTime(s)
	if err != nil {
		panic(err)
	}
	return t
}

func TestVouchVerify(t *testing.T) {
	node := nodeKey(t)
	agent := newTestKey(t)
	issued := at3339("2026-07-27T15:00:00Z")
	v, err := NewVouch(node, agent.Public(), issued, issued.Add(72*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if v.Node != node.Public() || v.IssuedAt != "2026-07-27T15:00:00.000Z" || len(v.Sig) != 86 {
		t.Fatalf("%+v", v)
	}
	other := nodeKey(t)
	for _, tc := range []struct {
		name   string
		mutate func(*Vouch)
		now    time.Time
		code   errs.Code // "" = valid
		msg    string
	}{
		{"valid", nil, issued.Add(time.Hour), "", ""},
		{"at issue", nil, issued, "", ""},
		{"issued slightly ahead of our clock", nil, issued.Add(-MaxFutureSkew), "", ""},
		{"not yet valid", nil, issued.Add(-MaxFutureSkew - time.Second), errs.Unauthorized, "not valid until"},
		{"at expiry", nil, issued.Add(72 * time.Hour), "", ""},
		{"expired", nil, issued.Add(72*time.Hour + time.Millisecond), errs.Unauthorized, "expired"},
		{"unsigned", func(v *Vouch) { v.Sig = "" }, issued, errs.IdentityMismatch, "not signed"},
		{"other node", func(v *Vouch) { v.Node = other.Public() }, issued, errs.IdentityMismatch, "does not verify"},
		{"other agent", func(v *Vouch) { v.Agent = other.Public() }, issued, errs.IdentityMismatch, "does not verify"},
		{"extended", func(v *Vouch) { v.ExpiresAt = "2027-01-01T00:00:00.000Z" }, issued, errs.IdentityMismatch, "does not verify"},
		{"std encoding", func(v *Vouch) {
			raw, _ := Base64URL.Decode(v.Sig)
			v.Sig = Base64Std.Encode(raw)
		}, issued, errs.IdentityMismatch, "does not verify"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := v
			if tc.mutate != nil {
				tc.mutate(&w)
			}
			err := w.Verify(tc.now)
			if tc.code == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			requireCode(t, err, tc.code, tc.msg)
		})
	}

	// A node that signs a window that ends before it begins is refused even
	// though the signature is genuine.
	backwards := Vouch{Node: node.Public(), Agent: agent.Public(), IssuedAt: "2026-07-28T00:00:00Z", ExpiresAt: "2026-07-27T00:00:00Z"}
	backwards.Sig, _ = SignObject(TagVouch, backwards, node, Base64URL)
	requireCode(t, backwards.Verify(issued), errs.Unauthorized, "expires before it is issued")

	if _, err := NewVouch(node, "not-a-key", issued, issued.Add(time.Hour)); err == nil {
		t.Fatal("NewVouch accepted a bad agent key")
	}
	if _, err := NewVouch(node, agent.Public(), issued, issued); err == nil {
		t.Fatal("NewVouch accepted an empty window")
	}
}

// TestOwnerAttestationIsNotAVouch: an owner attestation is signed under
// its own tag, so a node's vouch (public in its agent's record) never
// verifies as an owner attestation naming that node, and an owner's
// attestation never verifies as a vouch by the owner (review 18 #15).
func TestOwnerAttestationIsNotAVouch(t *testing.T) {
	signer := nodeKey(t)
	agent := newTestKey(t)
	issued := at3339("2026-07-27T15:00:00Z")
	now := issued.Add(time.Hour)
	att, err := NewOwnerAttestation(signer, agent.Public(), issued, issued.Add(72*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if att.Owner() != signer.Public() || att.Agent != agent.Public() || len(att.Sig) != 86 {
		t.Fatalf("%+v", att)
	}
	if err := att.Verify(now); err != nil {
		t.Fatal(err)
	}
	msg, _ := att.SignedBytes()
	if !strings.HasPrefix(string(msg), TagOwner+"\n{") || TagOwner != "agentmesh-owner-v1" {
		t.Fatalf("owner attestation signed bytes %q", msg)
	}
	requireCode(t, Vouch(att).Verify(now), errs.IdentityMismatch, "vouch signature does not verify")

	vouch, err := NewVouch(signer, agent.Public(), issued, issued.Add(72*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if err := vouch.Verify(now); err != nil {
		t.Fatal(err)
	}
	requireCode(t, OwnerAttestation(vouch).Verify(now), errs.IdentityMismatch, "owner attestation signature does not verify")

	// The same window rules as a vouch, with the owner's words.
	requireCode(t, att.Verify(issued.Add(73*time.Hour)), errs.Unauthorized, "owner attestation expired at 2026-07-30T15:00:00.000Z; the owner must sign a new one")
	long, _ := NewOwnerAttestation(signer, agent.Public(), issued, issued.Add(31*24*time.Hour))
	requireCode(t, long.Verify(now), errs.Unauthorized, "longer than")

	// Its decoder is the vouch's, with its own name in the refusals.
	v, err := OwnerAttestationFromValue(map[string]any{"node": att.Node, "agent": att.Agent, "issued_at": att.IssuedAt, "expires_at": att.ExpiresAt, "sig": att.Sig})
	if err != nil || v != att {
		t.Fatalf("OwnerAttestationFromValue = %+v, %v", v, err)
	}
	_, err = OwnerAttestationFromValue("x")
	requireCode(t, err, errs.InvalidManifest, "owner attestation: must be an object")
}

func TestVouchFromValue(t *testing.T) {
	base := func() map[string]any {
		return map[string]any{"node": vectorOwner, "agent": vectorAgent, "issued_at": "2026-07-27T15:00:00Z",
			"expires_at": "2026-07-28T15:00:00+01:00", "sig": "x"}
	}
	for _, tc := range []struct {
		name   string
		mutate func(map[string]any)
		msg    string // "" = valid
	}{
		{"valid", func(map[string]any) {}, ""},
		{"no sig", func(m map[string]any) { delete(m, "sig") }, ""},
		{"node not a key", func(m map[string]any) { m["node"] = "node-1" }, "node must be a user public key"},
		{"agent missing", func(m map[string]any) { delete(m, "agent") }, "agent must be a user public key"},
		{"issued_at date only", func(m map[string]any) { m["issued_at"] = "2026-07-27" }, "issued_at \"2026-07-27\" is not an RFC 3339 instant"},
		{"expires_at number", func(m map[string]any) { m["expires_at"] = 1.0 }, "expires_at must be an RFC 3339 instant string"},
		{"sig null", func(m map[string]any) { m["sig"] = nil }, "sig must be a string"},
		{"unknown member", func(m map[string]any) { m["scope"] = "all" }, `unknown member "scope"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := base()
			tc.mutate(m)
			v, err := VouchFromValue(m)
			if tc.msg == "" {
				if err != nil || v.ExpiresAt != "2026-07-28T15:00:00+01:00" {
					t.Fatalf("%+v %v", v, err)
				}
				return
			}
			requireCode(t, err, errs.InvalidManifest, tc.msg)
		})
	}
	_, err := VouchFromValue("vouch")
	requireCode(t, err, errs.InvalidManifest, "must be an object")
}

func TestManifestKeyClaim(t *testing.T) {
	const (
		issued = "2026-07-25T00:00:00.000Z"
		encKey = "B6N8vBQgk8i3VdwbEOhstCY3StFqqFPtC9_AsrhtHHw"
	)
	k := vectorKey(t)
	for _, tc := range []struct {
		name, encKey, canonical, sig string
	}{
		{"with key", encKey,
			"agentmesh-manifest-key-v1\n" + issued + "\n" + vectorOwner + "\n" + encKey,
			"20WLBlT31230Mk1QVNC1SxmZD21YWZdLTWmCb_wE9u9hukX5jSUAgpiQfBinam7J4S92Ih98FjKGoCN7BAtAAw"},
		{"no key keeps the trailing separator", "",
			"agentmesh-manifest-key-v1\n" + issued + "\n" + vectorOwner + "\n",
			"EZw0M49Ofd97KwivwWszqztqr70lVaTisvLtVbY8sER_6Yt5OwWo3BHpC1Ddz_fOZ-CWSQ6KAzZguzs786v6Cg"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := ManifestKeyClaim(issued, vectorOwner, tc.encKey)
			if err != nil || string(b) != tc.canonical {
				t.Fatalf("%q %v", b, err)
			}
			sig, err := SignManifestKeyClaim(k, issued, tc.encKey)
			if err != nil || sig != tc.sig {
				t.Fatalf("sig %s %v", sig, err)
			}
			if err := VerifyManifestKeyClaim(issued, vectorOwner, tc.encKey, sig); err != nil {
				t.Fatal(err)
			}
			// A key added to, or swapped in, a manifest breaks the claim.
			requireBadSig(t, VerifyManifestKeyClaim(issued, vectorOwner, tc.encKey+"A", sig))
			requireBadSig(t, VerifyManifestKeyClaim(issued, vectorAgent, tc.encKey, sig))
			requireBadSig(t, VerifyManifestKeyClaim("2026-07-25T00:00:00Z", vectorOwner, tc.encKey, sig))
		})
	}
	for _, tc := range []struct{ name, issued, id, key, msg string }{
		{"LF in key", issued, vectorOwner, "a\nb", "encryption_key contains a line feed"},
		{"LF in id", issued, vectorOwner + "\n", "", "id contains a line feed"},
		{"LF in issued_at", issued + "\n", vectorOwner, "", "issued_at contains a line feed"},
		{"empty issued_at", "", vectorOwner, "k", "required"},
		{"empty id", issued, "", "k", "required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := ManifestKeyClaim(tc.issued, tc.id, tc.key); err == nil || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("err %v, want %q", err, tc.msg)
			}
			requireCode(t, VerifyManifestKeyClaim(tc.issued, tc.id, tc.key, "sig"), errs.IdentityMismatch, "malformed")
		})
	}
	// Moving the LF between components cannot forge a claim: the bytes
	// "…\nid\nk" signed for key "k" are refused when re-split.
	if _, err := SignManifestKeyClaim(k, issued, "x\ny"); err == nil {
		t.Fatal("signed a claim with a line feed")
	}
}

func TestPlainSignedStrings(t *testing.T) {
	// Pinned bytes (naming.json, SDK:credential, F:c08).
	for _, tc := range []struct{ name, got, want string }{
		{"pair", PairString("KX4-92F", "UAGENTKEYEXAMPLE234567"), "pan-pair-v1:KX4-92F:UAGENTKEYEXAMPLE234567"},
		{"pair uppercases", PairString("kx4-92f", "UAGENTKEYEXAMPLE234567"), "pan-pair-v1:KX4-92F:UAGENTKEYEXAMPLE234567"},
		{"checkin v3", CheckinV3String(1753200000, "UAGENTKEYEXAMPLE234567", "claude-code", "devbox", "win32", "XDH25519EXAMPLEKEY"),
			"pan-checkin-v3\n1753200000\nUAGENTKEYEXAMPLE234567\nclaude-code\ndevbox\nwin32\nXDH25519EXAMPLEKEY"},
		{"checkin v3 empty profile", CheckinV3String(5, "UA", "", "", "", ""), "pan-checkin-v3\n5\nUA\n\n\n\n"},
		{"node cred sorts", NodeCredString(1753200000, "UNODE", []string{"UC", "UA", "UB"}), "mesh-node-cred-v1:1753200000:UNODE:UA,UB,UC"},
		{"node cred none", NodeCredString(7, "UNODE", nil), "mesh-node-cred-v1:7:UNODE:"},
		{"node agent", NodeAgentString(7, "UNODE", "UA"), "mesh-node-agent-v1:7:UNODE:UA"},
		{"guest release", GuestReleaseString("UGUEST", 1753200000), "guest-release-v1:UGUEST:1753200000"},
		{"negative ts", GuestReleaseString("UGUEST", -1), "guest-release-v1:UGUEST:-1"},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: got %q, want %q", tc.name, tc.got, tc.want)
		}
	}
	ids := []string{"UC", "UA"}
	_ = NodeCredString(1, "N", ids)
	if !slices.Equal(ids, []string{"UC", "UA"}) {
		t.Fatal("NodeCredString reordered the caller's slice")
	}
}

func TestPlainSignatures(t *testing.T) {
	agent := newTestKey(t)
	node := nodeKey(t)
	other := newTestKey(t)
	a2 := newTestKey(t)
	const ts = 1753200000

	nodeSig, err := SignNodeCred(node, ts, []string{a2.Public(), agent.Public()})
	if err != nil {
		t.Fatal(err)
	}
	checkinSig, err := SignCheckinV3(agent, ts, "claude-code", "devbox", "linux", "XDH")
	if err != nil {
		t.Fatal(err)
	}
	pairSig := SignPair(agent, "kx4-92f")
	guestSig := SignGuestRelease(agent, ts)
	agentSig := SignNodeAgent(agent, ts, node.Public())

	for _, sig := range []string{nodeSig, checkinSig, pairSig, guestSig, agentSig} {
		if len(sig) != 88 || !strings.HasSuffix(sig, "==") {
			t.Fatalf("%q is not padded standard base64", sig)
		}
	}
	for _, tc := range []struct {
		name   string
		verify func() error
		ok     bool
	}{
		{"pair", func() error { return VerifyPair("KX4-92F", agent.Public(), pairSig) }, true},
		{"pair lower-case code", func() error { return VerifyPair("kx4-92f", agent.Public(), pairSig) }, true},
		{"pair other code", func() error { return VerifyPair("KX4-92G", agent.Public(), pairSig) }, false},
		{"pair other agent", func() error { return VerifyPair("KX4-92F", other.Public(), pairSig) }, false},
		{"pair unpadded still reads", func() error { return VerifyPair("KX4-92F", agent.Public(), strings.TrimRight(pairSig, "=")) }, true},
		{"pair garbage sig", func() error { return VerifyPair("KX4-92F", agent.Public(), pairSig[:80]) }, false},
		{"node cred any order", func() error { return VerifyNodeCred(ts, node.Public(), []string{agent.Public(), a2.Public()}, nodeSig) }, true},
		{"node cred extra agent", func() error {
			return VerifyNodeCred(ts, node.Public(), []string{agent.Public(), a2.Public(), other.Public()}, nodeSig)
		}, false},
		{"node cred other ts", func() error {
			return VerifyNodeCred(ts+1, node.Public(), []string{agent.Public(), a2.Public()}, nodeSig)
		}, false},
		{"node agent", func() error { return VerifyNodeAgent(ts, node.Public(), agent.Public(), agentSig) }, true},
		{"node agent other node", func() error { return VerifyNodeAgent(ts, other.Public(), agent.Public(), agentSig) }, false},
		{"guest", func() error { return VerifyGuestRelease(agent.Public(), ts, guestSig) }, true},
		{"guest replayed later", func() error { return VerifyGuestRelease(agent.Public(), ts+60, guestSig) }, false},
		{"checkin", func() error {
			return VerifyCheckinV3(ts, agent.Public(), "claude-code", "devbox", "linux", "XDH", checkinSig)
		}, true},
		{"checkin other platform", func() error {
			return VerifyCheckinV3(ts, agent.Public(), "claude-code", "devbox", "win32", "XDH", checkinSig)
		}, false},
		{"checkin key dropped", func() error {
			return VerifyCheckinV3(ts, agent.Public(), "claude-code", "devbox", "linux", "", checkinSig)
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.verify()
			if tc.ok {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			requireBadSig(t, err)
		})
	}

	// Ambiguity guards.
	if _, err := SignNodeCred(node, ts, []string{agent.Public() + "," + a2.Public()}); err == nil {
		t.Fatal("signed a credential request with a comma inside an id")
	}
	requireCode(t, VerifyNodeCred(ts, node.Public(), []string{"UA,UB"}, nodeSig), errs.IdentityMismatch, "invalid agent id")
	if _, err := SignCheckinV3(agent, ts, "a\nb", "", "", ""); err == nil {
		t.Fatal("signed a check-in with a line feed in a field")
	}
	requireCode(t, VerifyCheckinV3(ts, agent.Public(), "a", "b\nc", "", "", checkinSig), errs.IdentityMismatch, "malformed")
}

func TestCard(t *testing.T) {
	// naming.json's card: non-ASCII stays raw UTF-8 and keys sort
	// recursively.
	card := map[string]any{
		"handle":         "Coder.ana@example.org",
		"operator":       map[string]any{"name": "Chlo\u00eb Varga \u2713"},
		"claimed_via":    "delegated:agentmesh.ai",
		"binding":        "agent-key",
		"claimed_at":     "2026-07-18T09:00:00Z",
		"encryption_key": "XDH25519EXAMPLEKEY",
		"endpoints": []any{
			map[string]any{"protocol": "agentmesh", "agent_id": "UAGENTKEYEXAMPLE234567", "node": "UNODEKEYEXAMPLE234567"},
			map[string]any{"protocol": "a2a", "url": "https://example.com/.well-known/agent-card.json"},
		},
		"presence": map[string]any{"state": "online", "last_seen_at": "2026-07-22T12:00:00Z", "seq": 42.0},
	}
	const want = `{"binding":"agent-key","claimed_at":"2026-07-18T09:00:00Z","claimed_via":"delegated:agentmesh.ai","encryption_key":"XDH25519EXAMPLEKEY","endpoints":[{"agent_id":"UAGENTKEYEXAMPLE234567","node":"UNODEKEYEXAMPLE234567","protocol":"agentmesh"},{"protocol":"a2a","url":"https://example.com/.well-known/agent-card.json"}],"handle":"Coder.ana@example.org","operator":{"name":"Chlo` + "\u00eb Varga \u2713" + `"},"presence":{"last_seen_at":"2026-07-22T12:00:00Z","seq":42,"state":"online"}}`
	b, err := CardBytes(card)
	if err != nil || string(b) != want {
		t.Fatalf("got  %s\nwant %s (%v)", b, want, err)
	}

	registrar := newTestKey(t)
	sig, err := SignCard(registrar, card)
	if err != nil {
		t.Fatal(err)
	}
	if len(sig) != 88 {
		t.Fatalf("card sig %q is not standard base64", sig)
	}
	if err := VerifyCard(registrar.Public(), card, sig); err != nil {
		t.Fatal(err)
	}
	// No tag: the signature is over the bare canonical bytes.
	if err := VerifyString(registrar.Public(), []byte(want), sig, Base64Std); err != nil {
		t.Fatalf("card signature is not over the bare canonical JSON: %v", err)
	}
	card["binding"] = nil
	requireBadSig(t, VerifyCard(registrar.Public(), card, sig))
	if _, err := CardBytes([]any{"x"}); err == nil {
		t.Fatal("a non-object card was accepted")
	}
	requireCode(t, VerifyCard(registrar.Public(), "card", sig), errs.IdentityMismatch, "")
}

func TestSKUDigest(t *testing.T) {
	type price struct {
		Model       string `json:"model"`
		Currency    string `json:"currency"`
		AmountMicro int64  `json:"amount_micro"`
	}
	type sku struct {
		SKU    string         `json:"sku"`
		Covers map[string]any `json:"covers"`
		Price  price          `json:"price"`
	}
	s := sku{SKU: "basic", Covers: map[string]any{"agent": true}, Price: price{"flat", "USD", 250000}}
	canonical := `{"covers":{"agent":true},"price":{"amount_micro":250000,"currency":"USD","model":"flat"},"sku":"basic"}`
	sum := sha256.Sum256([]byte("agentmesh-sku-v1\n" + canonical))
	want := base64.RawURLEncoding.EncodeToString(sum[:])

	d1, err := SKUDigest(s)
	if err != nil || d1 != want || len(d1) != 43 {
		t.Fatalf("struct digest %s %v, want %s", d1, err, want)
	}
	v, _ := ParseJSON([]byte(`{"sku":"basic","price":{"model":"flat","amount_micro":250000,"currency":"USD"},"covers":{"agent":true}}`))
	if d2, _ := SKUDigest(v); d2 != want {
		t.Fatalf("decoded digest %s differs from the struct's", d2)
	}
	s.Price.AmountMicro++
	if d3, _ := SKUDigest(s); d3 == want {
		t.Fatal("a price change did not move the digest")
	}
	if _, err := SKUDigest("basic"); err == nil {
		t.Fatal("a non-object SKU was digested")
	}
}

// signature-tags.json's roster and descriptor, signed by the published key.
const (
	rosterVector = `{"admission":"v1","owner_key":"UBMBH4BK6EIHQFVMHLSABFSQXB3JXUFZOXVZQTIERO33AD4HHAI3D7QP",
	 "defaults":{"contact":"allow","registered":"hold","anonymous":"block"},
	 "limits":{"per_sender_per_hour":12,"inbound_model_budget_per_day":500000},
	 "entries":[{"subject":"UAKQRYZBYFOC65OQZVJ3QPCIERDTRNNZPMOJUYXC3DGPRCDWSKD4HV5A","stance":"allow","note":"conformance vector","updated_at":"2026-07-27T15:00:00.000Z"}],
	 "updated_at":"2026-07-27T15:00:00.000Z",
	 "sig":"kWdzzQ1lm6Zy1seMst6BwDoxx7L6SBEIcjkZdPimOPUQgjSLnZiKSAuAHZrJCsg8KTGlbpFl1E4sBp4bBsc8DQ=="}`
	descriptorVector = `{"rooms":"v1","room_id":"conformance-room-b7d9","name":"signature-tags vector","channels":["main"],
	 "record":"ephemeral","policy":{},"privacy":"capability","creator":"UBMBH4BK6EIHQFVMHLSABFSQXB3JXUFZOXVZQTIERO33AD4HHAI3D7QP",
	 "created_at":"2026-07-27T15:00:00.000Z",
	 "sig":"8AnpOP4l9rq_m2OfQJRjKolPDhlsvm5gwzltvrYd4YyRC9TRKK9JUPL05Ac7ix7olhgtOzXtGOUrv1uzpymGBg"}`
)

func TestSelfSignedVectors(t *testing.T) {
	k := vectorKey(t)
	for _, tc := range []struct {
		name   string
		doc    string
		verify func(any) error
		sign   func(any, keys.Signer) (string, error)
	}{
		{"roster", rosterVector, VerifyRoster, SignRoster},
		{"descriptor", descriptorVector, VerifyRoomDescriptor, SignRoomDescriptor},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := ParseJSON([]byte(tc.doc))
			if err != nil {
				t.Fatal(err)
			}
			m := v.(map[string]any)
			if err := tc.verify(m); err != nil {
				t.Fatal(err)
			}
			sig, err := tc.sign(m, k)
			if err != nil || sig != m["sig"] {
				t.Fatalf("re-signed %s %v, want %s", sig, err, m["sig"])
			}
		})
	}
}

type testRoster struct {
	Admission string            `json:"admission"`
	OwnerKey  string            `json:"owner_key"`
	Defaults  map[string]string `json:"defaults"`
	UpdatedAt string            `json:"updated_at"`
	Sig       string            `json:"sig,omitempty"`
}

type testAgreement struct {
	V             int    `json:"v"`
	ConsumerOwner string `json:"consumer_owner"`
	SellerAgent   string `json:"seller_agent"`
	SKU           string `json:"sku"`
	SKUDigest     string `json:"sku_digest"`
	AgreedAt      string `json:"agreed_at"`
	ExpiresAt     string `json:"expires_at,omitempty"`
	Sig           string `json:"sig,omitempty"`
}

func TestSelfSignedObjects(t *testing.T) {
	owner := newTestKey(t)
	other := newTestKey(t)

	roster := testRoster{Admission: "v1", OwnerKey: owner.Public(),
		Defaults: map[string]string{"contact": "allow", "registered": "hold", "anonymous": "block"}, UpdatedAt: "2026-07-27T15:00:00Z"}
	agreement := testAgreement{V: 1, ConsumerOwner: owner.Public(), SellerAgent: other.Public(), SKU: "basic",
		SKUDigest: "abc", AgreedAt: "2026-07-27T15:00:00Z"}
	descriptor := map[string]any{"rooms": "v1", "room_id": "r1", "channels": []any{"main"}, "record": "ephemeral",
		"policy": map[string]any{}, "privacy": "capability", "creator": owner.Public(), "created_at": "2026-07-27T15:00:00Z"}

	var err error
	if roster.Sig, err = SignRoster(roster, owner); err != nil {
		t.Fatal(err)
	}
	if agreement.Sig, err = SignAgreement(agreement, owner); err != nil {
		t.Fatal(err)
	}
	descSig, err := SignRoomDescriptor(descriptor, owner)
	if err != nil {
		t.Fatal(err)
	}
	descriptor["sig"] = descSig

	if !strings.HasSuffix(roster.Sig, "=") || len(roster.Sig) != 88 {
		t.Fatalf("roster sig %q is not padded standard base64", roster.Sig)
	}
	if len(agreement.Sig) != 86 || len(descSig) != 86 {
		t.Fatal("agreement/descriptor sigs are not base64url")
	}
	// The domain tags separate the kinds: the same signer's roster signature
	// does not verify as anything else over the same bytes.
	if msg, _ := SignedBytes(TagAdmissionRoster, roster); !strings.HasPrefix(string(msg), "agentmesh-admission-roster-v1\n{") {
		t.Fatalf("roster bytes %q", msg)
	}

	for _, tc := range []struct {
		name string
		err  error
		ok   bool
	}{
		{"roster", VerifyRoster(roster), true},
		{"roster as a pointer", VerifyRoster(&roster), true},
		{"agreement", VerifyAgreement(agreement), true},
		{"descriptor", VerifyRoomDescriptor(descriptor), true},
		{"roster tampered", VerifyRoster(func() testRoster { r := roster; r.Defaults = map[string]string{"anonymous": "allow"}; return r }()), false},
		{"agreement extended", VerifyAgreement(func() testAgreement { a := agreement; a.ExpiresAt = "2099-01-01T00:00:00Z"; return a }()), false},
		{"agreement resold", VerifyAgreement(func() testAgreement { a := agreement; a.ConsumerOwner = other.Public(); return a }()), false},
		{"descriptor renamed", VerifyRoomDescriptor(with(descriptor, "name", "x")), false},
		{"descriptor sig as std base64", VerifyRoomDescriptor(with(descriptor, "sig", stdOf(descSig))), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.ok {
				if tc.err != nil {
					t.Fatal(tc.err)
				}
				return
			}
			requireBadSig(t, tc.err)
		})
	}

	for _, tc := range []struct {
		name string
		err  error
		msg  string
	}{
		{"unsigned roster", VerifyRoster(testRoster{Admission: "v1", OwnerKey: owner.Public()}), "not signed"},
		{"descriptor without creator", VerifyRoomDescriptor(with(descriptor, "creator", nil)), "no creator"},
		{"agreement with empty sig", VerifyAgreement(func() testAgreement { a := agreement; a.Sig = ""; return a }()), "not signed"},
		{"not an object", VerifyRoster([]any{}), "cannot be canonicalised"},
	} {
		t.Run(tc.name, func(t *testing.T) { requireCode(t, tc.err, errs.IdentityMismatch, tc.msg) })
	}

	// Signing is refused when the object names someone else (or nobody).
	if _, err := SignRoster(roster, other); errs.CodeOf(err) != errs.IdentityMismatch {
		t.Fatalf("roster signed by a non-owner: %v", err)
	}
	if _, err := SignAgreement(testAgreement{V: 1}, owner); errs.CodeOf(err) != errs.IdentityMismatch {
		t.Fatalf("agreement without consumer_owner signed: %v", err)
	}
	if _, err := SignRoomDescriptor(with(descriptor, "creator", other.Public()), owner); errs.CodeOf(err) != errs.IdentityMismatch {
		t.Fatalf("descriptor signed by a non-creator: %v", err)
	}
	// A stale sig member is ignored when signing again.
	again, err := SignRoster(roster, owner)
	if err != nil || again != roster.Sig {
		t.Fatalf("re-sign %s %v", again, err)
	}
}

// with returns a copy of m with k set to v (nil deletes it).
func with(m map[string]any, k string, v any) map[string]any {
	c := make(map[string]any, len(m))
	for kk, vv := range m {
		c[kk] = vv
	}
	if v == nil {
		delete(c, k)
	} else {
		c[k] = v
	}
	return c
}

func stdOf(urlSig string) string {
	raw, _ := Base64URL.Decode(urlSig)
	return Base64Std.Encode(raw)
}
