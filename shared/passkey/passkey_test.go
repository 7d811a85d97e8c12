package passkey_test

import (
	"agentmesh.dev/mesh/shared/passkey/passkeytest"
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/descope/virtualwebauthn"

	"agentmesh.dev/mesh/shared/passkey"
)

var rp = virtualwebauthn.RelyingParty{Name: "Agent Mesh", ID: "mesh.example.com", Origin: "https://mesh.example.com"}

func newService(t *testing.T, timeout time.Duration) *passkey.Service {
	t.Helper()
	svc, err := passkey.New(passkey.Config{RPID: rp.ID, RPDisplayName: rp.Name, RPOrigins: []string{rp.Origin}, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

func newUser(t *testing.T, name string) passkey.User {
	t.Helper()
	id := make([]byte, 32)
	if _, err := rand.Read(id); err != nil {
		t.Fatal(err)
	}
	return passkey.User{ID: id, Name: name + "@example.com", DisplayName: name}
}

// device is the shared software authenticator.
type device = passkeytest.Device

func newDevice(user passkey.User, keyType virtualwebauthn.KeyType, opts virtualwebauthn.AuthenticatorOptions) *device {
	return passkeytest.NewDeviceWith(user.ID, keyType, opts)
}

// register adds d's credential to user through a full ceremony and returns
// the user as the store would hand it back (JSON round trip).
func register(t *testing.T, svc *passkey.Service, user passkey.User, d *device) passkey.User {
	t.Helper()
	options, session, err := svc.BeginRegistration(user)
	if err != nil {
		t.Fatalf("BeginRegistration: %v", err)
	}
	cred, err := svc.FinishRegistration(user, session, d.Attest(t, rp, options))
	if err != nil {
		t.Fatalf("FinishRegistration: %v", err)
	}
	if !bytes.Equal(cred.ID, d.Cred.ID) {
		t.Fatalf("credential id %x, want %x", cred.ID, d.Cred.ID)
	}
	user.Credentials = append(user.Credentials, cred)
	return storeRoundTrip(t, user)
}

func storeRoundTrip(t *testing.T, user passkey.User) passkey.User {
	t.Helper()
	b, err := json.Marshal(user)
	if err != nil {
		t.Fatal(err)
	}
	var out passkey.User
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func login(svc *passkey.Service, t *testing.T, user passkey.User, d *device, from virtualwebauthn.RelyingParty) (passkey.Credential, []byte, []byte, error) {
	t.Helper()
	options, session, err := svc.BeginLogin(user)
	if err != nil {
		t.Fatalf("BeginLogin: %v", err)
	}
	resp := d.Assert(t, from, options)
	cred, err := svc.FinishLogin(user, session, resp)
	return cred, session, resp, err
}

// replace puts an updated credential in place of the stored one.
func replace(user passkey.User, c passkey.Credential) passkey.User {
	creds := append([]passkey.Credential(nil), user.Credentials...)
	for i := range creds {
		if bytes.Equal(creds[i].ID, c.ID) {
			creds[i] = c
		}
	}
	user.Credentials = creds
	return user
}

func wantRejected(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, passkey.ErrRejected) {
		t.Fatalf("err = %v, want ErrRejected", err)
	}
	t.Logf("refused: %v", err)
}

func TestRegisterThenLogin(t *testing.T) {
	for _, kt := range []virtualwebauthn.KeyType{virtualwebauthn.KeyTypeEC2, virtualwebauthn.KeyTypeRSA} {
		t.Run(string(kt), func(t *testing.T) {
			svc := newService(t, 0)
			alice := newUser(t, "alice")
			d := newDevice(alice, kt, virtualwebauthn.AuthenticatorOptions{})
			alice = register(t, svc, alice, d)

			stored := alice.Credentials[0]
			if len(stored.PublicKey) == 0 || !stored.Flags.UserPresent || !stored.Flags.UserVerified {
				t.Errorf("stored credential: %+v", stored)
			}
			if len(stored.Authenticator.AAGUID) != 16 || !bytes.Equal(stored.Authenticator.AAGUID, d.Auth.Aaguid[:]) {
				t.Errorf("AAGUID %x, want %x", stored.Authenticator.AAGUID, d.Auth.Aaguid)
			}
			if stored.IDString() != base64.RawURLEncoding.EncodeToString(d.Cred.ID) {
				t.Errorf("IDString %q", stored.IDString())
			}

			for i := range 3 {
				cred, _, _, err := login(svc, t, alice, d, rp)
				if err != nil {
					t.Fatalf("login %d: %v", i, err)
				}
				if !bytes.Equal(cred.ID, d.Cred.ID) {
					t.Fatalf("login %d: credential %x", i, cred.ID)
				}
				alice = storeRoundTrip(t, replace(alice, cred))
			}
		})
	}
}

func TestOptionsCarryTheDocumentedDefaults(t *testing.T) {
	svc := newService(t, 90*time.Second)
	alice := newUser(t, "alice")
	d := newDevice(alice, virtualwebauthn.KeyTypeEC2, virtualwebauthn.AuthenticatorOptions{})
	alice = register(t, svc, alice, d)

	options, _, err := svc.BeginRegistration(alice)
	if err != nil {
		t.Fatal(err)
	}
	var reg struct {
		PublicKey struct {
			RP   struct{ ID, Name string }
			User struct {
				ID, Name, DisplayName string
			}
			Challenge              string
			Timeout                int
			Attestation            string
			AuthenticatorSelection struct {
				ResidentKey      string
				UserVerification string
			}
			ExcludeCredentials []struct{ ID string }
		}
	}
	if err := json.Unmarshal(options, &reg); err != nil {
		t.Fatal(err)
	}
	pk := reg.PublicKey
	if pk.RP.ID != rp.ID || pk.RP.Name != rp.Name {
		t.Errorf("rp = %+v", pk.RP)
	}
	if pk.User.ID != base64.RawURLEncoding.EncodeToString(alice.ID) || pk.User.Name != "alice@example.com" || pk.User.DisplayName != "alice" {
		t.Errorf("user = %+v", pk.User)
	}
	if pk.Timeout != 90000 || pk.Attestation != "none" {
		t.Errorf("timeout %d, attestation %q", pk.Timeout, pk.Attestation)
	}
	if pk.AuthenticatorSelection.ResidentKey != "preferred" || pk.AuthenticatorSelection.UserVerification != "preferred" {
		t.Errorf("authenticatorSelection = %+v", pk.AuthenticatorSelection)
	}
	if len(pk.ExcludeCredentials) != 1 || pk.ExcludeCredentials[0].ID != alice.Credentials[0].IDString() {
		t.Errorf("excludeCredentials = %+v", pk.ExcludeCredentials)
	}

	options, _, err = svc.BeginLogin(alice)
	if err != nil {
		t.Fatal(err)
	}
	var get struct {
		PublicKey struct {
			RPID             string
			Challenge        string
			UserVerification string
			AllowCredentials []struct{ ID string }
		}
	}
	if err := json.Unmarshal(options, &get); err != nil {
		t.Fatal(err)
	}
	if get.PublicKey.RPID != rp.ID || get.PublicKey.UserVerification != "preferred" || len(get.PublicKey.Challenge) < 22 {
		t.Errorf("request options = %+v", get.PublicKey)
	}
	if len(get.PublicKey.AllowCredentials) != 1 || get.PublicKey.AllowCredentials[0].ID != alice.Credentials[0].IDString() {
		t.Errorf("allowCredentials = %+v", get.PublicKey.AllowCredentials)
	}
}

func TestRegisteringTheSameCredentialTwiceIsRejected(t *testing.T) {
	svc := newService(t, 0)
	alice := newUser(t, "alice")
	d := newDevice(alice, virtualwebauthn.KeyTypeEC2, virtualwebauthn.AuthenticatorOptions{})
	alice = register(t, svc, alice, d)
	options, session, err := svc.BeginRegistration(alice)
	if err != nil {
		t.Fatal(err)
	}
	// A real browser honours excludeCredentials; a hostile client may not.
	_, err = svc.FinishRegistration(alice, session, d.Attest(t, rp, options))
	wantRejected(t, err)
}

func TestLoginWithAnotherUsersCredentialIsRefused(t *testing.T) {
	svc := newService(t, 0)
	alice, bob := newUser(t, "alice"), newUser(t, "bob")
	da := newDevice(alice, virtualwebauthn.KeyTypeEC2, virtualwebauthn.AuthenticatorOptions{})
	db := newDevice(bob, virtualwebauthn.KeyTypeEC2, virtualwebauthn.AuthenticatorOptions{})
	alice = register(t, svc, alice, da)
	bob = register(t, svc, bob, db)

	t.Run("bob's passkey answers alice's challenge", func(t *testing.T) {
		_, _, _, err := login(svc, t, alice, db, rp)
		wantRejected(t, err)
	})
	t.Run("bob's passkey without a user handle", func(t *testing.T) {
		d := &device{Auth: virtualwebauthn.NewAuthenticator(), Cred: db.Cred}
		_, _, _, err := login(svc, t, alice, d, rp)
		wantRejected(t, err)
	})
	t.Run("alice's session finished as bob", func(t *testing.T) {
		options, session, err := svc.BeginLogin(alice)
		if err != nil {
			t.Fatal(err)
		}
		_, err = svc.FinishLogin(bob, session, db.Assert(t, rp, options))
		wantRejected(t, err)
	})
	t.Run("registration session of alice finished for bob", func(t *testing.T) {
		options, session, err := svc.BeginRegistration(alice)
		if err != nil {
			t.Fatal(err)
		}
		other := newDevice(alice, virtualwebauthn.KeyTypeEC2, virtualwebauthn.AuthenticatorOptions{})
		_, err = svc.FinishRegistration(bob, session, other.Attest(t, rp, options))
		wantRejected(t, err)
	})
}

func TestTamperingIsRefused(t *testing.T) {
	svc := newService(t, 0)
	alice := newUser(t, "alice")
	d := newDevice(alice, virtualwebauthn.KeyTypeEC2, virtualwebauthn.AuthenticatorOptions{})

	t.Run("registration signed over another challenge", func(t *testing.T) {
		options, session, err := svc.BeginRegistration(alice)
		if err != nil {
			t.Fatal(err)
		}
		o, err := virtualwebauthn.ParseAttestationOptions(string(options))
		if err != nil {
			t.Fatal(err)
		}
		o.Challenge[0] ^= 1
		resp := virtualwebauthn.CreateAttestationResponse(rp, d.Auth, d.Cred, *o)
		_, err = svc.FinishRegistration(alice, session, []byte(resp))
		wantRejected(t, err)
	})

	alice = register(t, svc, alice, d)

	t.Run("assertion signed over another challenge", func(t *testing.T) {
		options, session, err := svc.BeginLogin(alice)
		if err != nil {
			t.Fatal(err)
		}
		o, err := virtualwebauthn.ParseAssertionOptions(string(options))
		if err != nil {
			t.Fatal(err)
		}
		o.Challenge[len(o.Challenge)-1] ^= 0x80
		resp := virtualwebauthn.CreateAssertionResponse(rp, d.Auth, d.Cred, *o)
		_, err = svc.FinishLogin(alice, session, []byte(resp))
		wantRejected(t, err)
	})
	t.Run("challenge changed in the stored session", func(t *testing.T) {
		options, session, err := svc.BeginLogin(alice)
		if err != nil {
			t.Fatal(err)
		}
		resp := d.Assert(t, rp, options)
		var s map[string]any
		if err := json.Unmarshal(session, &s); err != nil {
			t.Fatal(err)
		}
		other, _, err := svc.BeginLogin(alice)
		if err != nil {
			t.Fatal(err)
		}
		var o struct{ PublicKey struct{ Challenge string } }
		if err := json.Unmarshal(other, &o); err != nil {
			t.Fatal(err)
		}
		s["data"].(map[string]any)["challenge"] = o.PublicKey.Challenge
		tampered, _ := json.Marshal(s)
		_, err = svc.FinishLogin(alice, tampered, resp)
		wantRejected(t, err)
	})
	t.Run("a response for another ceremony's session", func(t *testing.T) {
		options, _, err := svc.BeginLogin(alice)
		if err != nil {
			t.Fatal(err)
		}
		_, session, err := svc.BeginLogin(alice)
		if err != nil {
			t.Fatal(err)
		}
		_, err = svc.FinishLogin(alice, session, d.Assert(t, rp, options))
		wantRejected(t, err)
	})
	t.Run("signature flipped", func(t *testing.T) {
		options, session, err := svc.BeginLogin(alice)
		if err != nil {
			t.Fatal(err)
		}
		var r map[string]any
		if err := json.Unmarshal(d.Assert(t, rp, options), &r); err != nil {
			t.Fatal(err)
		}
		resp := r["response"].(map[string]any)
		sig, _ := base64.RawURLEncoding.DecodeString(resp["signature"].(string))
		sig[len(sig)-1] ^= 1
		resp["signature"] = base64.RawURLEncoding.EncodeToString(sig)
		b, _ := json.Marshal(r)
		_, err = svc.FinishLogin(alice, session, b)
		wantRejected(t, err)
	})
	t.Run("garbage response", func(t *testing.T) {
		_, session, err := svc.BeginLogin(alice)
		if err != nil {
			t.Fatal(err)
		}
		_, err = svc.FinishLogin(alice, session, []byte(`{"id":"x"}`))
		wantRejected(t, err)
	})
}

func TestWrongOriginOrRelyingPartyIsRefused(t *testing.T) {
	svc := newService(t, 0)
	alice := newUser(t, "alice")
	d := newDevice(alice, virtualwebauthn.KeyTypeEC2, virtualwebauthn.AuthenticatorOptions{})
	evilOrigin := virtualwebauthn.RelyingParty{Name: rp.Name, ID: rp.ID, Origin: "https://mesh.example.com.evil.test"}
	evilRPID := virtualwebauthn.RelyingParty{Name: rp.Name, ID: "evil.test", Origin: rp.Origin}

	for name, from := range map[string]virtualwebauthn.RelyingParty{"origin": evilOrigin, "rp id": evilRPID} {
		t.Run("registration from another "+name, func(t *testing.T) {
			options, session, err := svc.BeginRegistration(alice)
			if err != nil {
				t.Fatal(err)
			}
			_, err = svc.FinishRegistration(alice, session, d.Attest(t, from, options))
			wantRejected(t, err)
		})
	}
	alice = register(t, svc, alice, d)
	for name, from := range map[string]virtualwebauthn.RelyingParty{"origin": evilOrigin, "rp id": evilRPID} {
		t.Run("login from another "+name, func(t *testing.T) {
			_, _, _, err := login(svc, t, alice, d, from)
			wantRejected(t, err)
		})
	}
}

func TestSessionsAreTypedAndValidated(t *testing.T) {
	svc := newService(t, 0)
	alice := newUser(t, "alice")
	d := newDevice(alice, virtualwebauthn.KeyTypeEC2, virtualwebauthn.AuthenticatorOptions{})
	_, regSession, err := svc.BeginRegistration(alice)
	if err != nil {
		t.Fatal(err)
	}
	alice = register(t, svc, alice, d)
	options, loginSession, err := svc.BeginLogin(alice)
	if err != nil {
		t.Fatal(err)
	}
	resp := d.Assert(t, rp, options)

	for name, s := range map[string][]byte{
		"registration session": regSession,
		"garbage":              []byte("not json"),
		"empty":                nil,
		"no challenge":         []byte(`{"ceremony":"login","data":{}}`),
	} {
		if _, err := svc.FinishLogin(alice, s, resp); !errors.Is(err, passkey.ErrInvalidSession) {
			t.Errorf("%s: FinishLogin = %v, want ErrInvalidSession", name, err)
		}
	}
	if _, err := svc.FinishRegistration(alice, loginSession, resp); !errors.Is(err, passkey.ErrInvalidSession) {
		t.Errorf("login session for registration: %v, want ErrInvalidSession", err)
	}
}

func TestExpiredSessionIsRefused(t *testing.T) {
	svc := newService(t, time.Millisecond)
	alice := newUser(t, "alice")
	d := newDevice(alice, virtualwebauthn.KeyTypeEC2, virtualwebauthn.AuthenticatorOptions{})
	options, session, err := svc.BeginRegistration(alice)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	_, err = svc.FinishRegistration(alice, session, d.Attest(t, rp, options))
	wantRejected(t, err)
}

// Replaying a (session, response) pair: when the authenticator counts
// signatures, the replay carries a counter that no longer advances and is
// refused. When it does not (counter always 0, like most synced passkeys),
// nothing in the response tells the replay apart, so the caller must make
// the session single use; this test pins that fact.
func TestReplay(t *testing.T) {
	svc := newService(t, 0)

	t.Run("counting authenticator: refused", func(t *testing.T) {
		alice := newUser(t, "alice")
		d := newDevice(alice, virtualwebauthn.KeyTypeEC2, virtualwebauthn.AuthenticatorOptions{})
		alice = register(t, svc, alice, d)
		d.Cred.Counter = 1
		cred, session, resp, err := login(svc, t, alice, d, rp)
		if err != nil {
			t.Fatal(err)
		}
		if cred.Authenticator.SignCount != 1 {
			t.Fatalf("sign count %d, want 1", cred.Authenticator.SignCount)
		}
		alice = storeRoundTrip(t, replace(alice, cred))
		_, err = svc.FinishLogin(alice, session, resp)
		if !errors.Is(err, passkey.ErrCloneSuspected) || !errors.Is(err, passkey.ErrRejected) {
			t.Fatalf("replay: %v, want ErrCloneSuspected and ErrRejected", err)
		}
	})
	t.Run("zero-counter authenticator: only the single-use session stops it", func(t *testing.T) {
		alice := newUser(t, "alice")
		d := newDevice(alice, virtualwebauthn.KeyTypeEC2, virtualwebauthn.AuthenticatorOptions{})
		alice = register(t, svc, alice, d)
		cred, session, resp, err := login(svc, t, alice, d, rp)
		if err != nil {
			t.Fatal(err)
		}
		alice = replace(alice, cred)
		if _, err := svc.FinishLogin(alice, session, resp); err != nil {
			t.Fatalf("replay with a zero counter: %v (if the library now refuses this, update the package doc)", err)
		}
	})
}

func TestSignCountRegressionIsRefused(t *testing.T) {
	svc := newService(t, 0)
	alice := newUser(t, "alice")
	d := newDevice(alice, virtualwebauthn.KeyTypeEC2, virtualwebauthn.AuthenticatorOptions{})
	d.Cred.Counter = 5
	alice = register(t, svc, alice, d)
	if got := alice.Credentials[0].Authenticator.SignCount; got != 5 {
		t.Fatalf("registered sign count %d, want 5", got)
	}
	for _, c := range []uint32{3, 5, 0} {
		d.Cred.Counter = c
		_, _, _, err := login(svc, t, alice, d, rp)
		if !errors.Is(err, passkey.ErrCloneSuspected) {
			t.Errorf("counter %d after 5: %v, want ErrCloneSuspected", c, err)
		}
	}
	d.Cred.Counter = 6
	cred, _, _, err := login(svc, t, alice, d, rp)
	if err != nil {
		t.Fatal(err)
	}
	if cred.Authenticator.SignCount != 6 || cred.Authenticator.CloneWarning {
		t.Errorf("after counter 6: %+v", cred.Authenticator)
	}
}

func TestUserVerificationIsPreferredPresenceIsRequired(t *testing.T) {
	svc := newService(t, 0)
	alice := newUser(t, "alice")
	noUV := newDevice(alice, virtualwebauthn.KeyTypeEC2, virtualwebauthn.AuthenticatorOptions{UserNotVerified: true})
	alice = register(t, svc, alice, noUV)
	if alice.Credentials[0].Flags.UserVerified {
		t.Error("UserVerified set without verification")
	}
	cred, _, _, err := login(svc, t, alice, noUV, rp)
	if err != nil {
		t.Fatalf("login without user verification: %v", err)
	}
	if cred.Flags.UserVerified {
		t.Error("UserVerified set without verification")
	}

	bob := newUser(t, "bob")
	noUP := newDevice(bob, virtualwebauthn.KeyTypeEC2, virtualwebauthn.AuthenticatorOptions{UserNotPresent: true})
	options, session, err := svc.BeginRegistration(bob)
	if err != nil {
		t.Fatal(err)
	}
	_, err = svc.FinishRegistration(bob, session, noUP.Attest(t, rp, options))
	wantRejected(t, err)
}

func TestCredentialJSONRoundTrip(t *testing.T) {
	svc := newService(t, 0)
	alice := newUser(t, "alice")
	d := newDevice(alice, virtualwebauthn.KeyTypeEC2, virtualwebauthn.AuthenticatorOptions{BackupEligible: true, BackupState: true})
	alice = register(t, svc, alice, d)
	c := alice.Credentials[0]
	if !c.Flags.BackupEligible || !c.Flags.BackupState {
		t.Errorf("backup flags lost: %+v", c.Flags)
	}
	b1, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	var back passkey.Credential
	if err := json.Unmarshal(b1, &back); err != nil {
		t.Fatal(err)
	}
	b2, _ := json.Marshal(back)
	if !bytes.Equal(b1, b2) {
		t.Errorf("JSON changed:\n%s\n%s", b1, b2)
	}
	var fields map[string]any
	_ = json.Unmarshal(b1, &fields)
	for _, k := range []string{"id", "publicKey", "flags", "authenticator"} {
		if _, ok := fields[k]; !ok {
			t.Errorf("JSON lacks %q: %s", k, b1)
		}
	}
	// A synced passkey keeps working after the store round trip.
	if _, _, _, err := login(svc, t, alice, d, rp); err != nil {
		t.Fatal(err)
	}
}

func TestLocalhostRelyingParty(t *testing.T) {
	local := virtualwebauthn.RelyingParty{Name: "meshd", ID: "localhost", Origin: "http://localhost:8080"}
	svc, err := passkey.New(passkey.Config{RPID: local.ID, RPDisplayName: local.Name, RPOrigins: []string{local.Origin}})
	if err != nil {
		t.Fatal(err)
	}
	alice := newUser(t, "alice")
	d := newDevice(alice, virtualwebauthn.KeyTypeEC2, virtualwebauthn.AuthenticatorOptions{})
	options, session, err := svc.BeginRegistration(alice)
	if err != nil {
		t.Fatal(err)
	}
	cred, err := svc.FinishRegistration(alice, session, d.Attest(t, local, options))
	if err != nil {
		t.Fatal(err)
	}
	alice.Credentials = []passkey.Credential{cred}
	if _, _, _, err := login(svc, t, alice, d, local); err != nil {
		t.Fatal(err)
	}
}

func TestBadInputs(t *testing.T) {
	for name, cfg := range map[string]passkey.Config{
		"no rp id":         {RPDisplayName: "x", RPOrigins: []string{"https://x.example"}},
		"no display name":  {RPID: "x.example", RPOrigins: []string{"https://x.example"}},
		"no origins":       {RPID: "x.example", RPDisplayName: "x"},
		"bad rp id":        {RPID: "https://x.example/", RPDisplayName: "x", RPOrigins: []string{"https://x.example"}},
		"negative timeout": {RPID: "x.example", RPDisplayName: "x", RPOrigins: []string{"https://x.example"}, Timeout: -1},
	} {
		if _, err := passkey.New(cfg); err == nil {
			t.Errorf("New(%s) accepted", name)
		}
	}
	svc := newService(t, 0)
	if _, _, err := svc.BeginLogin(newUser(t, "nobody")); !errors.Is(err, passkey.ErrNoCredentials) {
		t.Errorf("BeginLogin without credentials: %v", err)
	}
	for _, id := range [][]byte{nil, make([]byte, 65)} {
		u := passkey.User{ID: id, Name: "x", DisplayName: "x"}
		if _, _, err := svc.BeginRegistration(u); !errors.Is(err, passkey.ErrInvalidUser) {
			t.Errorf("BeginRegistration with %d-byte id: %v", len(id), err)
		}
	}
}

func TestIsFresh(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		at   time.Time
		want bool
	}{
		{now, true},
		{now.Add(-passkey.FreshFor), true},
		{now.Add(-passkey.FreshFor - time.Nanosecond), false},
		{now.Add(-time.Hour), false},
		{now.Add(10 * time.Second), true}, // small clock skew between instances
		{now.Add(time.Hour), false},
		{time.Time{}, false},
	} {
		if got := passkey.IsFresh(c.at, now); got != c.want {
			t.Errorf("IsFresh(%v, %v) = %v, want %v", c.at, now, got, c.want)
		}
	}
}

// The browser's JSON is untrusted: whatever it holds, Finish never panics
// and every failure is an ErrRejected.
func FuzzFinish(f *testing.F) {
	svc, err := passkey.New(passkey.Config{RPID: rp.ID, RPDisplayName: rp.Name, RPOrigins: []string{rp.Origin}})
	if err != nil {
		f.Fatal(err)
	}
	user := passkey.User{ID: []byte("fuzz-user-handle"), Name: "fuzz", DisplayName: "fuzz"}
	d := newDevice(user, virtualwebauthn.KeyTypeEC2, virtualwebauthn.AuthenticatorOptions{})
	regOptions, regSession, err := svc.BeginRegistration(user)
	if err != nil {
		f.Fatal(err)
	}
	ao, err := virtualwebauthn.ParseAttestationOptions(string(regOptions))
	if err != nil {
		f.Fatal(err)
	}
	attestation := virtualwebauthn.CreateAttestationResponse(rp, d.Auth, d.Cred, *ao)
	cred, err := svc.FinishRegistration(user, regSession, []byte(attestation))
	if err != nil {
		f.Fatal(err)
	}
	user.Credentials = []passkey.Credential{cred}
	loginOptions, loginSession, err := svc.BeginLogin(user)
	if err != nil {
		f.Fatal(err)
	}
	lo, err := virtualwebauthn.ParseAssertionOptions(string(loginOptions))
	if err != nil {
		f.Fatal(err)
	}
	f.Add([]byte(virtualwebauthn.CreateAssertionResponse(rp, d.Auth, d.Cred, *lo)), false)
	f.Add([]byte(attestation), true)
	f.Add([]byte(`{}`), false)
	f.Fuzz(func(t *testing.T, response []byte, registration bool) {
		var err error
		if registration {
			_, err = svc.FinishRegistration(passkey.User{ID: user.ID, Name: "fuzz"}, regSession, response)
		} else {
			_, err = svc.FinishLogin(user, loginSession, response)
		}
		if err != nil && !errors.Is(err, passkey.ErrRejected) {
			t.Fatalf("error is not ErrRejected: %v", err)
		}
	})
}
