package creds

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/keys"
)

// Permissions is the explicit subject permission set carried by a user JWT.
// At least one allow list must be non-empty: a JWT without permissions
// inherits the account defaults, which in this mesh means "everything".
type Permissions struct {
	PubAllow []string
	PubDeny  []string
	SubAllow []string
	SubDeny  []string
}

// UserSpec describes one mesh-account user credential.
type UserSpec struct {
	// PublicKey is the credential key's public half ("U..."); its seed signs
	// the broker's nonce at connect time and stays with the holder.
	PublicKey string
	// Name is informational (server logs, connection listings).
	Name        string
	Permissions Permissions
	// Expires is when the broker stops accepting the JWT and disconnects its
	// connections. Zero means no expiry, which is only right for credentials
	// that never leave the process (internal worker connections).
	Expires time.Time
}

// UserCreds is a user JWT with the key it was issued to.
type UserCreds struct {
	JWT string
	Key *keys.Credential
}

// NATSOption authenticates a nats.go connection with these credentials,
// signing the nonce in-process so the seed never passes through a string.
func (c UserCreds) NATSOption() nats.Option {
	userJWT, key := c.JWT, c.Key
	return nats.UserJWT(
		func() (string, error) { return userJWT, nil },
		key.SignNonce,
	)
}

// MintUser signs a user JWT for the mesh account with the account signing key.
// It refuses an empty permission set and claims the broker would reject, so
// mistakes surface here rather than as a failed connection.
//
// The JWT's issue time is the current second. Revocation in NATS is by key and
// whole second, so a credential minted for a key in the same second that key
// was revoked is revoked too.
func (t *Trust) MintUser(spec UserSpec) (string, error) {
	if !keys.IsUserPublicKey(spec.PublicKey) {
		return "", fmt.Errorf("mint user: %q is not a user public key", spec.PublicKey)
	}
	p := spec.Permissions
	if len(p.PubAllow) == 0 && len(p.SubAllow) == 0 {
		return "", errors.New("mint user: empty permission set (it would inherit the account's defaults)")
	}
	uc := jwt.NewUserClaims(spec.PublicKey)
	uc.Name = spec.Name
	uc.IssuerAccount = t.mesh.Public()
	uc.Pub.Allow = append(jwt.StringList(nil), p.PubAllow...)
	uc.Pub.Deny = append(jwt.StringList(nil), p.PubDeny...)
	uc.Sub.Allow = append(jwt.StringList(nil), p.SubAllow...)
	uc.Sub.Deny = append(jwt.StringList(nil), p.SubDeny...)
	if !spec.Expires.IsZero() {
		uc.Expires = spec.Expires.Unix()
	}
	return encodeUser(uc, t.meshSigning)
}

// MintSystemUser makes a fresh key and a system-account user JWT for it, for
// in-process use only: pushing account updates and reading server events. The
// JWT does not expire, so it must never leave the process.
func (t *Trust) MintSystemUser(name string) (UserCreds, error) {
	key, err := keys.Generate[keys.CredentialRole]()
	if err != nil {
		return UserCreds{}, fmt.Errorf("mint system user: %w", err)
	}
	uc := jwt.NewUserClaims(key.Public())
	uc.Name = name
	uc.Pub.Allow.Add(">")
	uc.Sub.Allow.Add(">")
	// The system account has no signing key; its identity key signs directly.
	s, err := encodeUser(uc, t.system)
	if err != nil {
		return UserCreds{}, fmt.Errorf("mint system user: %w", err)
	}
	return UserCreds{JWT: s, Key: key}, nil
}

func encodeUser(uc *jwt.UserClaims, signer *keys.Account) (string, error) {
	vr := jwt.CreateValidationResults()
	uc.Validate(vr)
	if vr.IsBlocking(true) {
		return "", fmt.Errorf("mint user: invalid claims: %v", vr.Errors())
	}
	s, err := uc.Encode(signer.NKey())
	if err != nil {
		return "", fmt.Errorf("mint user: %w", err)
	}
	return s, nil
}
