package creds

import (
	"crypto/ed25519"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
)

func TestMintUser(t *testing.T) {
	tr := mustTrust(t)
	key := mustUserKey(t)
	pk := tr.PublicKeys()
	perms := Permissions{
		PubAllow: []string{"mesh.registry.>", "_INBOX.>"},
		PubDeny:  []string{"mesh.registry.admin"},
		SubAllow: []string{"_INBOX.>"},
		SubDeny:  []string{"mesh.agent.*.inbox.guarded"},
	}
	expires := time.Now().Add(30 * 24 * time.Hour).Truncate(time.Second)

	tests := []struct {
		name    string
		spec    UserSpec
		wantErr string
	}{
		{"valid", UserSpec{Kind: KindService, PublicKey: key.Public(), Name: "node", Permissions: perms, Expires: expires}, ""},
		{"no expiry", UserSpec{Kind: KindService, PublicKey: key.Public(), Permissions: perms}, ""},
		{"account key as subject", UserSpec{Kind: KindService, PublicKey: pk.MeshAccount, Permissions: perms}, "not a user public key"},
		{"empty key", UserSpec{Kind: KindService, Permissions: perms}, "not a user public key"},
		{"no kind", UserSpec{PublicKey: key.Public(), Permissions: perms}, "kind not set"},
		{"empty permissions", UserSpec{Kind: KindService, PublicKey: key.Public()}, "empty permission set"},
		{"deny lists only", UserSpec{Kind: KindService, PublicKey: key.Public(), Permissions: Permissions{PubDeny: []string{">"}}}, "empty permission set"},
		{"bad subject", UserSpec{Kind: KindService, PublicKey: key.Public(), Permissions: Permissions{PubAllow: []string{"a b"}}}, "invalid claims"},
		{"already expired", UserSpec{Kind: KindService, PublicKey: key.Public(), Permissions: perms, Expires: time.Now().Add(-time.Minute)}, "invalid claims"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			token, err := tr.MintUser(tc.spec)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("MintUser: %v", err)
			}
			uc, err := jwt.DecodeUserClaims(token)
			if err != nil {
				t.Fatal(err)
			}
			if uc.Subject != tc.spec.PublicKey {
				t.Errorf("subject = %s", uc.Subject)
			}
			if uc.Issuer != pk.MeshSigningKey || uc.IssuerAccount != pk.MeshAccount {
				t.Errorf("issuer %s / account %s, want signing key %s of %s",
					uc.Issuer, uc.IssuerAccount, pk.MeshSigningKey, pk.MeshAccount)
			}
			account, err := jwt.DecodeAccountClaims(mustString(t, tr.MeshAccountJWT))
			if err != nil {
				t.Fatal(err)
			}
			if !account.DidSign(uc) {
				t.Error("mesh account does not vouch for the user JWT")
			}
			for _, c := range []struct {
				name      string
				got, want []string
			}{
				{"pub allow", uc.Pub.Allow, perms.PubAllow},
				{"pub deny", uc.Pub.Deny, perms.PubDeny},
				{"sub allow", uc.Sub.Allow, perms.SubAllow},
				{"sub deny", uc.Sub.Deny, perms.SubDeny},
			} {
				if !slices.Equal(c.got, c.want) {
					t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
				}
			}
			wantExp := int64(0)
			if !tc.spec.Expires.IsZero() {
				wantExp = tc.spec.Expires.Unix()
			}
			if uc.Expires != wantExp {
				t.Errorf("expires = %d, want %d", uc.Expires, wantExp)
			}
		})
	}
}

func TestMintSystemUser(t *testing.T) {
	tr, err := Generate()
	if err != nil {
		t.Fatal(err)
	}
	c, err := tr.MintSystemUser("admin")
	if err != nil {
		t.Fatal(err)
	}
	uc, err := jwt.DecodeUserClaims(c.JWT)
	if err != nil {
		t.Fatal(err)
	}
	if uc.Subject != c.Key.Public() {
		t.Errorf("subject %s, want the returned key %s", uc.Subject, c.Key.Public())
	}
	if uc.Issuer != tr.PublicKeys().SystemAccount {
		t.Errorf("issuer %s, want system account", uc.Issuer)
	}
	if uc.HasEmptyPermissions() {
		t.Error("system user has an empty permission set")
	}
}

func mustString(t *testing.T, f func() (string, error)) string {
	t.Helper()
	s, err := f()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestNATSOptionSignsTheNonce(t *testing.T) {
	key := mustUserKey(t)
	var o nats.Options
	if err := (UserCreds{JWT: "j", Key: key}).NATSOption()(&o); err != nil {
		t.Fatal(err)
	}
	if got, err := o.UserJWT(); err != nil || got != "j" {
		t.Fatalf("UserJWT() = %q, %v; want the credentials' JWT", got, err)
	}
	nonce := []byte("nonce")
	if sig, err := o.SignatureCB(nonce); err != nil || !ed25519.Verify(key.PublicKey(), nonce, sig) {
		t.Fatalf("nonce signature does not verify (err %v)", err)
	}

	// Credentials without a key fail the handshake instead of panicking in
	// the client.
	var empty nats.Options
	if err := (UserCreds{JWT: "j"}).NATSOption()(&empty); err != nil {
		t.Fatal(err)
	}
	if _, err := empty.SignatureCB(nonce); err == nil {
		t.Fatal("signed a nonce without a key")
	}
}
