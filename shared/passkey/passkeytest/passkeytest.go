// Package passkeytest is a software WebAuthn authenticator for tests, on
// github.com/descope/virtualwebauthn: it answers a relying party's
// registration and assertion options the way a browser with a security key
// would.
package passkeytest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"testing"

	"github.com/descope/virtualwebauthn"
)

// RelyingParty names the site the authenticator believes it talks to; its
// Origin is what the browser would put in the client data.
type RelyingParty = virtualwebauthn.RelyingParty

// Device is an authenticator holding one credential for one user.
type Device struct {
	Auth virtualwebauthn.Authenticator
	Cred virtualwebauthn.Credential
}

// NewDevice makes an EC2 (P-256) authenticator for the user handle id.
func NewDevice(id []byte) *Device {
	return NewDeviceWith(id, virtualwebauthn.KeyTypeEC2, virtualwebauthn.AuthenticatorOptions{})
}

// NewDeviceWith makes an authenticator with a key type and options.
func NewDeviceWith(id []byte, keyType virtualwebauthn.KeyType, opts virtualwebauthn.AuthenticatorOptions) *Device {
	opts.UserHandle = id
	d := &Device{Auth: virtualwebauthn.NewAuthenticatorWithOptions(opts), Cred: NewCredential(keyType)}
	d.Auth.AddCredential(d.Cred)
	return d
}

// NewCredential works around virtualwebauthn v1.0.3 writing EC2
// coordinates without their leading zero bytes (big.Int.Bytes), which a
// correct relying party refuses about once in 128 keys: it only uses P-256
// keys whose X and Y both start with a non-zero byte.
func NewCredential(keyType virtualwebauthn.KeyType) virtualwebauthn.Credential {
	if keyType != virtualwebauthn.KeyTypeEC2 {
		return virtualwebauthn.NewCredential(keyType)
	}
	for {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			panic(err)
		}
		pub, err := key.PublicKey.ECDH()
		if err != nil {
			panic(err)
		}
		if b := pub.Bytes(); b[1] == 0 || b[33] == 0 { // 0x04 || X || Y
			continue
		}
		der, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			panic(err)
		}
		return virtualwebauthn.NewCredentialWithImportedKey(keyType, der)
	}
}

// Attest answers registration options as a browser at rp would.
func (d *Device) Attest(t testing.TB, rp RelyingParty, options []byte) []byte {
	t.Helper()
	o, err := virtualwebauthn.ParseAttestationOptions(string(options))
	if err != nil {
		t.Fatalf("attestation options: %v\n%s", err, options)
	}
	return []byte(virtualwebauthn.CreateAttestationResponse(rp, d.Auth, d.Cred, *o))
}

// Assert answers assertion options as a browser at rp would.
func (d *Device) Assert(t testing.TB, rp RelyingParty, options []byte) []byte {
	t.Helper()
	o, err := virtualwebauthn.ParseAssertionOptions(string(options))
	if err != nil {
		t.Fatalf("assertion options: %v\n%s", err, options)
	}
	return []byte(virtualwebauthn.CreateAssertionResponse(rp, d.Auth, d.Cred, *o))
}
