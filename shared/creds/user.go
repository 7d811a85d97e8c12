package creds

import (
	"bytes"
	"crypto/sha512"
	"encoding/base32"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
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
	Name string
	// Kind is what the credential is for. Guarded kinds (node, bootstrap,
	// app, guest, job) pass Guard before signing; see KindUnset for the
	// zero value.
	Kind Kind
	// Hosted are the agents the credential serves, as Guard reads them for
	// Kind: the node's roster, the bootstrap agent, the app key, the guest
	// key, the job's performing agent. Empty for service and room
	// credentials.
	Hosted      []string
	Permissions Permissions
	// Expires is when the broker stops accepting the JWT and disconnects its
	// connections. Zero means no expiry, which is only right for credentials
	// that never leave the process (internal worker connections) and for
	// node credentials on an instance minting without expiry. Guest, job
	// and room credentials must expire; a job credential within
	// MaxJobLifetime, a room credential within MaxRoomLifetime.
	Expires time.Time
	// Class is the broker fence's class of the credential ("" for none): the
	// fence (package fence) limits connections per key and message and byte
	// rates per connection for it, which a JWT cannot express. It travels
	// as the JWT tag ClassTag(Class).
	Class string
	// Limits are what the broker itself enforces per connection from the
	// JWT; zero members mean no limit beyond the account's.
	Limits ConnLimits
	// RevokedAt is the latest revocation in the mesh account covering
	// PublicKey (RevokedAt(claims, key)), zero if none. Revocation is by key
	// and whole second, so the JWT is issued at least one second after it:
	// its iat is max(now, RevokedAt+1s), or the broker would refuse it.
	RevokedAt time.Time
}

// ConnLimits are the per-connection limits a user JWT carries and the
// broker enforces: the largest payload of one published message (a larger
// one closes the connection) and the number of subscriptions (one more is
// refused).
type ConnLimits struct {
	Payload int64
	Subs    int64
}

// ClassTag is the JWT tag naming a fence class. The broker reports a
// connection's tags in its connect events and connection listings, which
// is how the fence tells limited connections apart.
func ClassTag(class string) string { return "mesh-class:" + class }

// ClassOfTags returns the fence class named by tags, or "".
func ClassOfTags(tags []string) string {
	for _, t := range tags {
		if c, ok := strings.CutPrefix(t, "mesh-class:"); ok {
			return c
		}
	}
	return ""
}

// MaxJobLifetime bounds a job credential: it serves one job, minutes long.
const MaxJobLifetime = time.Hour

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
// mistakes surface here rather than as a failed connection. Guarded kinds
// pass Guard first, so no credential that leaves the process is signed with
// a set that breaks spec §4.6 rule 4, and their key bindings are checked:
// a guest or app credential is issued to the hosted key itself, a bootstrap
// credential never to the agent key (spec §2.3).
//
// The JWT's issue time is the current second, or the second after
// spec.RevokedAt if that is later: revocation in NATS is by key and whole
// second, so a credential minted for a key in the second it was revoked would
// be revoked too.
func (t *Trust) MintUser(spec UserSpec) (string, error) {
	if !keys.IsUserPublicKey(spec.PublicKey) {
		return "", fmt.Errorf("mint user: %q is not a user public key", spec.PublicKey)
	}
	p := spec.Permissions
	if len(p.PubAllow) == 0 && len(p.SubAllow) == 0 {
		return "", errors.New("mint user: empty permission set (it would inherit the account's defaults)")
	}
	if err := checkKind(spec); err != nil {
		return "", fmt.Errorf("mint user: %w", err)
	}
	uc := jwt.NewUserClaims(spec.PublicKey)
	uc.Name = spec.Name
	uc.IssuerAccount = t.mesh.Public()
	// The claims share the caller's lists: encoding only reads them, and
	// the claims do not outlive this call.
	uc.Pub.Allow = jwt.StringList(p.PubAllow)
	uc.Pub.Deny = jwt.StringList(p.PubDeny)
	uc.Sub.Allow = jwt.StringList(p.SubAllow)
	uc.Sub.Deny = jwt.StringList(p.SubDeny)
	if !spec.Expires.IsZero() {
		uc.Expires = spec.Expires.Unix()
	}
	if spec.Limits.Payload > 0 {
		uc.Limits.Payload = spec.Limits.Payload
	}
	if spec.Limits.Subs > 0 {
		uc.Limits.Subs = spec.Limits.Subs
	}
	if spec.Class != "" {
		uc.Tags.Add(ClassTag(spec.Class))
	}
	if spec.Kind == KindOperator {
		uc.Tags.Add(OperatorTag)
	}
	token, err := encodeUserAt(uc, t.meshSigning, issueAfter(time.Now(), spec.RevokedAt))
	if err != nil {
		return "", err
	}
	// The JWT rides in the client's CONNECT line; leave room for the rest
	// of that line (signature, name, options).
	if len(token) > MaxControlLine-connectLineOverhead {
		return "", fmt.Errorf("mint user: the jwt is %d bytes, more than a broker with max_control_line %d accepts",
			len(token), MaxControlLine)
	}
	return token, nil
}

// connectLineOverhead bounds what a client's CONNECT line holds besides the
// JWT: the nonce signature, client name, version and options.
const connectLineOverhead = 1024

// MintServiceUser makes a fresh key and a mesh-account user JWT with
// ServicePermissions for it: the identity of an internal worker. The JWT does
// not expire and is never guarded, so it must never leave the process.
func (t *Trust) MintServiceUser(name string) (UserCreds, error) {
	key, err := keys.Generate[keys.CredentialRole]()
	if err != nil {
		return UserCreds{}, fmt.Errorf("mint service user: %w", err)
	}
	s, err := t.MintUser(UserSpec{
		PublicKey:   key.Public(),
		Name:        name,
		Kind:        KindService,
		Permissions: ServicePermissions(),
	})
	if err != nil {
		return UserCreds{}, fmt.Errorf("mint service user: %w", err)
	}
	return UserCreds{JWT: s, Key: key}, nil
}

// MintRoomUser makes a fresh key and a room credential for acl room roomID
// (RoomPermissions), expiring after ttl: at most MaxRoomLifetime, and a
// longer ttl is refused rather than shortened, so a caller's mistaken
// configuration shows. The key is new for every credential, so revoking
// it (expel, leave) touches no other credential, and a fresh one minted
// after a revocation is never caught by it. name is informational (the
// member it was minted for, in server logs).
func (t *Trust) MintRoomUser(roomID, name string, ttl time.Duration) (UserCreds, error) {
	switch {
	case ttl <= 0:
		return UserCreds{}, errors.New("mint room user: the credential must expire: give a positive ttl")
	case ttl > MaxRoomLifetime:
		return UserCreds{}, fmt.Errorf("mint room user: ttl %s is longer than a room credential lives (%s)", ttl, MaxRoomLifetime)
	case !protocol.ValidToken(roomID):
		return UserCreds{}, fmt.Errorf("mint room user: room id %q is not one subject token: [A-Za-z0-9_-]{1,128}", roomID)
	}
	key, err := keys.Generate[keys.CredentialRole]()
	if err != nil {
		return UserCreds{}, fmt.Errorf("mint room user: %w", err)
	}
	s, err := t.MintUser(UserSpec{
		PublicKey:   key.Public(),
		Name:        name,
		Kind:        KindRoom,
		Permissions: RoomPermissions(roomID),
		Expires:     time.Now().Add(ttl),
	})
	if err != nil {
		return UserCreds{}, fmt.Errorf("mint room user: %w", err)
	}
	return UserCreds{JWT: s, Key: key}, nil
}

// checkKind runs the guard and the per-kind binding rules of spec.
func checkKind(spec UserSpec) error {
	switch {
	case spec.Kind == KindUnset:
		return errors.New("credential kind not set; every credential names what it is for")
	case spec.Kind == KindOperator:
		return checkOperator(spec)
	case spec.Kind == KindService:
		if len(spec.Hosted) > 0 {
			return fmt.Errorf("%s credential names hosted agents; set the kind that serves them", spec.Kind)
		}
		return nil
	case !spec.Kind.Guarded():
		return fmt.Errorf("unknown credential kind %s", spec.Kind)
	}
	// The key binding first: the guard checks the reply prefix against the
	// key, so a credential issued to the wrong key would otherwise be
	// refused for its prefix rather than for what is wrong.
	switch spec.Kind {
	case KindGuest, KindApp:
		if len(spec.Hosted) > 0 && spec.Hosted[0] != spec.PublicKey {
			return fmt.Errorf("a %s credential is issued to the key it hosts, not %s", spec.Kind, spec.PublicKey)
		}
	case KindBootstrap:
		if len(spec.Hosted) > 0 && spec.Hosted[0] == spec.PublicKey {
			return errors.New("a bootstrap credential is bound to its own credential key, never to the agent key")
		}
	}
	if err := Guard(spec.Kind, spec.PublicKey, spec.Hosted, spec.Permissions); err != nil {
		return err
	}
	switch spec.Kind {
	case KindGuest, KindJob, KindRoom:
		if spec.Expires.IsZero() {
			return fmt.Errorf("a %s credential must expire", spec.Kind)
		}
	}
	if spec.Kind == KindJob && time.Until(spec.Expires) > MaxJobLifetime {
		return fmt.Errorf("a job credential lives at most %s", MaxJobLifetime)
	}
	if spec.Kind == KindRoom && time.Until(spec.Expires) > MaxRoomLifetime {
		return fmt.Errorf("a room credential lives at most %s", MaxRoomLifetime)
	}
	return nil
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

// issueAfter is the issue time of a credential minted at now for a key last
// revoked at revokedAt: now, or the second after the revocation if that is
// later (the broker revokes every JWT of the key with iat <= revokedAt).
func issueAfter(now, revokedAt time.Time) int64 {
	iat := now.Unix()
	if !revokedAt.IsZero() && revokedAt.Unix() >= iat {
		iat = revokedAt.Unix() + 1
	}
	return iat
}

// encodeUserAt signs uc as a user JWT issued at iat (issueAfter): the
// bytes the jwt library's Encode makes, had its clock read iat.
//
// It is the library's encoder (ClaimsData.doEncode) written out, for two
// reasons. The library always stamps its own clock's second as iat, with
// no way to choose a later one, which a credential minted in the second of
// a revocation of its key needs. And it copies the whole token five times
// on the way (the payload's JSON, its base64, then fmt.Sprintf twice), and
// asks the key for its public half, where a node credential's token is
// about 9 KB. Here the token is built in one buffer and signed in place.
// TestEncodeUserAtIsTheLibrarysEncode proves the bytes equal the
// library's for the same claims and second, including the claim id (the
// SHA-512/256 of the standard claims) and the signature.
func encodeUserAt(uc *jwt.UserClaims, signer *keys.Account, iat int64) (string, error) {
	vr := jwt.CreateValidationResults()
	uc.Validate(vr)
	if vr.IsBlocking(true) {
		return "", fmt.Errorf("mint user: invalid claims: %v", vr.Errors())
	}
	if !keys.IsUserPublicKey(uc.Subject) {
		return "", errors.New("mint user: expected subject to be user public key")
	}
	// As the library does, in its order: type, issuer, iat, claim id over
	// the standard claims with an empty id, then the version.
	uc.Type = jwt.UserClaim
	uc.Issuer = signer.Public()
	uc.IssuedAt = iat
	uc.ID = ""
	id, err := claimsID(&uc.ClaimsData)
	if err != nil {
		return "", fmt.Errorf("mint user: %w", err)
	}
	uc.ID = id
	uc.Version = jwtLibVersion
	// The payload's JSON and the token are built in pooled buffers: only
	// the token's string is new memory (a node credential's is 9 KB).
	bufs := tokenBufs.Get().(*tokenBuf)
	defer tokenBufs.Put(bufs)
	bufs.json.Reset()
	je := json.NewEncoder(&bufs.json) // json.Marshal's bytes, and a newline
	if err := je.Encode(uc); err != nil {
		return "", fmt.Errorf("mint user: %w", err)
	}
	payload := bytes.TrimSuffix(bufs.json.Bytes(), []byte("\n"))
	enc := base64.RawURLEncoding
	tok := append(bufs.tok[:0], jwtHeader...)
	tok = append(tok, '.')
	tok = enc.AppendEncode(tok, payload)
	sig := signer.Sign(tok)
	tok = append(tok, '.')
	tok = enc.AppendEncode(tok, sig)
	bufs.tok = tok
	return string(tok), nil
}

// tokenBuf is encodeUserAt's scratch space.
type tokenBuf struct {
	json bytes.Buffer
	tok  []byte
}

var tokenBufs = sync.Pool{New: func() any { return new(tokenBuf) }}

// jwtLibVersion is the claims version the jwt library writes (its
// libVersion), and jwtHeader the header it writes for nkey-signed JWTs,
// encoded; TestEncodeUserAtIsTheLibrarysEncode holds both to the library.
const jwtLibVersion = 2

var jwtHeader = func() string {
	h, err := json.Marshal(&jwt.Header{Type: jwt.TokenTypeJwt, Algorithm: jwt.AlgorithmNkey})
	if err != nil {
		panic(err)
	}
	return base64.RawURLEncoding.EncodeToString(h)
}()

// claimsID is the jwt library's claim id: the SHA-512/256 of the JSON of the
// standard claims with an empty id, in unpadded base32.
func claimsID(c *jwt.ClaimsData) (string, error) {
	j, err := json.Marshal(c)
	if err != nil {
		return "", err
	}
	h := sha512.Sum512_256(j)
	return base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(h[:]), nil
}

// ServiceInbox is the connection option every service connection (workers,
// the control plane's bus connection, tools) sets: replies arrive under
// protocol.ServiceInboxPrefix, which no client credential may subscribe.
func ServiceInbox() nats.Option { return nats.CustomInboxPrefix(protocol.ServiceInboxPrefix) }

// PrivateInbox is the connection option of a client holding a credential
// issued to key: replies arrive under protocol.PrivateInboxPrefix(key), the
// one reply prefix its credential may subscribe.
func PrivateInbox(key string) nats.Option {
	return nats.CustomInboxPrefix(protocol.PrivateInboxPrefix(key))
}
