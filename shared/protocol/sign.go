package protocol

import (
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"sync"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
)

// Domain tags: each kind of signed JSON object is signed over its tag, a
// line feed, then the canonical JSON of the object without sig, so a
// signature made for one kind can never be replayed as another
// (upstream-notes §1.2, §1.4).
const (
	TagEnvelope        = "agentmesh-envelope-v1"
	TagVouch           = "agentmesh-vouch-v1"
	TagOwner           = "agentmesh-owner-v1"
	TagRoomDescriptor  = "agentmesh-room-descriptor-v1"
	TagAdmissionRoster = "agentmesh-admission-roster-v1"
	TagAllowance       = "agentmesh-allowance-v1"
	TagAgreement       = "agentmesh-agreement-v1"
	TagSKU             = "agentmesh-sku-v1"
	TagManifestKey     = "agentmesh-manifest-key-v1"
)

// SigEncoding is how a signature is written as text. Most objects use
// base64url without padding; the admission roster and the plain signed
// strings (pairing, node credential, guest release, cards) use standard
// base64 with padding.
type SigEncoding int

const (
	Base64URL SigEncoding = iota // RFC 4648 §5, no padding (86 characters)
	Base64Std                    // RFC 4648 §4, padded (88 characters)
)

// Encode renders a raw signature.
func (enc SigEncoding) Encode(sig []byte) string {
	if enc == Base64Std {
		return base64.StdEncoding.EncodeToString(sig)
	}
	return base64.RawURLEncoding.EncodeToString(sig)
}

// Decode reads a signature. Standard base64 is also read without its
// padding; base64url is read strictly.
func (enc SigEncoding) Decode(s string) ([]byte, error) {
	var b []byte
	var err error
	if enc == Base64Std {
		b, err = base64.StdEncoding.Strict().DecodeString(s)
		if err != nil {
			b, err = base64.RawStdEncoding.Strict().DecodeString(s)
		}
	} else {
		b, err = base64.RawURLEncoding.Strict().DecodeString(s)
	}
	if err != nil {
		return nil, fmt.Errorf("signature is not valid base64: %w", err)
	}
	if len(b) != ed25519.SignatureSize {
		return nil, fmt.Errorf("signature is %d bytes, want %d", len(b), ed25519.SignatureSize)
	}
	return b, nil
}

// ErrBadSignature is wrapped by every signature failure.
var ErrBadSignature = errors.New("signature does not verify")

// KeyCache decodes user public keys once and keeps each ready to verify
// (its expanded form), bounded; see keys.KeyCache. Envelopes from the same
// few senders arrive constantly.
type KeyCache = keys.KeyCache

// NewKeyCache returns a cache of at most 2×size keys (keys.NewKeyCache).
func NewKeyCache(size int) *KeyCache { return keys.NewKeyCache(size) }

// defaultKeys serves the package-level helpers and the decoders without a
// cache of their own: the process's shared cache, a bound, not
// configuration.
var defaultKeys = keys.UserKeys()

// VerifyBytes checks sig (raw bytes) over msg against a user public key,
// through the verification seam (keys.Verify's rules).
func VerifyBytes(pub string, msg, sig []byte) error {
	k, err := defaultKeys.Get(pub)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBadSignature, err)
	}
	if !k.Verify(msg, sig) {
		return ErrBadSignature
	}
	return nil
}

// VerifyString checks an encoded signature over msg.
func VerifyString(pub string, msg []byte, sig string, enc SigEncoding) error {
	raw, err := enc.Decode(sig)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBadSignature, err)
	}
	return VerifyBytes(pub, msg, raw)
}

// bufPool recycles the scratch buffers that hold tag + canonical bytes
// while signing and verifying, which keeps the hot path to a few allocations.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

func getBuf() *[]byte { return bufPool.Get().(*[]byte) }

func putBuf(b *[]byte) {
	if cap(*b) <= 64<<10 { // do not pin huge buffers
		*b = (*b)[:0]
		bufPool.Put(b)
	}
}

// Sign signs the envelope with k in the tagged form. From is set to k's
// public key when empty; a different From is refused, since the signature
// would be mis-attributed.
func (e *Envelope) Sign(k keys.Signer) error {
	if e.From == "" {
		e.From = k.Public()
	}
	if e.From != k.Public() {
		return errs.Newf(errs.IdentityMismatch, "envelope from %s cannot be signed by %s", e.From, k.Public())
	}
	bp := getBuf()
	defer putBuf(bp)
	msg := append((*bp)[:0], TagEnvelope...)
	msg = append(msg, '\n')
	msg, err := e.appendCanonical(msg, false)
	*bp = msg
	if err != nil {
		return fmt.Errorf("sign envelope: %w", err)
	}
	var sig [86]byte // base64.RawURLEncoding.EncodedLen(ed25519.SignatureSize)
	raw := k.Sign(msg)
	if len(raw) != ed25519.SignatureSize {
		return fmt.Errorf("sign envelope: signature is %d bytes, want %d", len(raw), ed25519.SignatureSize)
	}
	base64.RawURLEncoding.Encode(sig[:], raw)
	e.Sig = string(sig[:])
	return nil
}

// SignedBytes returns tag + "\n" + canonical JSON of obj without its "sig"
// member: the bytes a tagged object's signature covers. obj is a decoded
// object or any Go value that canonicalises to an object.
func SignedBytes(tag string, obj any) ([]byte, error) {
	m, err := objectWithoutSig(obj)
	if err != nil {
		return nil, err
	}
	out := append([]byte(tag), '\n')
	return appendMap(out, m, 0)
}

// objectValue turns obj into its generic object form, sig included.
func objectValue(obj any) (map[string]any, error) {
	if m, ok := obj.(map[string]any); ok {
		return m, nil
	}
	b, err := Canonical(obj)
	if err != nil {
		return nil, err
	}
	v, err := ParseJSON(b)
	if err != nil {
		return nil, err
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%w: a signed object must be a JSON object", ErrNotCanonicalizable)
	}
	return m, nil
}

func objectWithoutSig(obj any) (map[string]any, error) {
	m, err := objectValue(obj)
	if err != nil {
		return nil, err
	}
	if _, has := m["sig"]; has {
		c := make(map[string]any, len(m))
		for k, v := range m {
			if k != "sig" {
				c[k] = v
			}
		}
		m = c
	}
	return m, nil
}

// SignObject signs obj (minus any sig member) under tag and returns the
// encoded signature.
func SignObject(tag string, obj any, k keys.Signer, enc SigEncoding) (string, error) {
	msg, err := SignedBytes(tag, obj)
	if err != nil {
		return "", fmt.Errorf("sign %s: %w", tag, err)
	}
	return enc.Encode(k.Sign(msg)), nil
}

// VerifyObject checks that sig, made by signer, covers obj under tag.
func VerifyObject(tag string, obj any, signer, sig string, enc SigEncoding) error {
	msg, err := SignedBytes(tag, obj)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBadSignature, err)
	}
	return VerifyString(signer, msg, sig, enc)
}
