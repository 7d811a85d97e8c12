package sow

import (
	"crypto/sha256"
	"fmt"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/jsonv"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// Tag is the domain tag of an engagement document's signatures (§6): each
// signature covers "agent-sow-v1\n" and the canonical JSON of the document
// without its signatures member (id included).
const Tag = "agent-sow-v1"

// Signature roles: owners sign, agents work.
const (
	RoleProvider = "provider"
	RoleClient   = "client"
)

// Signature is one owner's signature over the document.
type Signature struct {
	Role     string `json:"role"`
	Key      string `json:"key"`
	SignedAt string `json:"signed_at"`
	Sig      string `json:"sig"`
}

// withoutMember returns the object form of doc with member removed (doc
// itself is not modified).
func withoutMember(doc any, member string) (map[string]any, error) {
	m, ok := jsonv.Object(doc)
	if !ok {
		return nil, fmt.Errorf("a document must be a JSON object")
	}
	out := make(map[string]any, len(m))
	for k, v := range m {
		if k != member {
			out[k] = v
		}
	}
	return out, nil
}

// taggedBytes is tag + LF + the canonical JSON of doc without member.
func taggedBytes(tag string, doc any, member string) ([]byte, error) {
	m, err := withoutMember(doc, member)
	if err != nil {
		return nil, err
	}
	c, err := protocol.Canonical(m)
	if err != nil {
		return nil, err
	}
	return append(append([]byte(tag), '\n'), c...), nil
}

// SignedBytes are the bytes an owner signs: Tag, LF, then the canonical JSON
// of doc (a decoded document) without signatures.
func SignedBytes(doc any) ([]byte, error) { return taggedBytes(Tag, doc, "signatures") }

// Sign signs doc as role with the owner key k at signedAt, returning the
// signature record to append to the document's signatures. It signs the
// document as it stands: a standing proposal's signature covers the
// template bytes, so formation always ends with a fresh provider signature
// over the completed instance.
func Sign(doc any, k keys.Signer, role string, signedAt time.Time) (Signature, error) {
	if role != RoleProvider && role != RoleClient {
		return Signature{}, fmt.Errorf("sign engagement: role %q is not provider or client", role)
	}
	msg, err := SignedBytes(doc)
	if err != nil {
		return Signature{}, fmt.Errorf("sign engagement: %w", err)
	}
	return Signature{Role: role, Key: k.Public(), SignedAt: signedAt.UTC().Format(time.RFC3339),
		Sig: protocol.Base64URL.Encode(k.Sign(msg))}, nil
}

// VerifySignature checks one signature record against doc's signed bytes:
// IDENTITY_MISMATCH when it does not verify.
func VerifySignature(doc any, s Signature) error {
	msg, err := SignedBytes(doc)
	if err != nil {
		return errs.Wrap(errs.IdentityMismatch, "engagement document cannot be canonicalised for verification", err)
	}
	if err := protocol.VerifyString(s.Key, msg, s.Sig, protocol.Base64URL); err != nil {
		return errs.Wrap(errs.IdentityMismatch, "the "+s.Role+" signature on the engagement document does not verify", err)
	}
	return nil
}

// signatureFromValue shape-checks one signature record.
func signatureFromValue(v any) (Signature, error) {
	m, err := object(v, "each signature is an object {role, key, signed_at, sig} (§6)")
	if err != nil {
		return Signature{}, err
	}
	if err := unknown(m, "a signature", "role", "key", "signed_at", "sig"); err != nil {
		return Signature{}, err
	}
	var s Signature
	if s.Role, _ = m["role"].(string); s.Role != RoleProvider && s.Role != RoleClient {
		return Signature{}, invalid("a signature's role is provider or client (§6)")
	}
	if s.Key, _ = m["key"].(string); !keys.IsUserPublicKey(s.Key) {
		return Signature{}, invalid("a signature's key is the signing owner's public key (§6)")
	}
	s.SignedAt, _ = m["signed_at"].(string)
	if _, err := protocol.ParseTime(s.SignedAt); err != nil {
		return Signature{}, invalid("signed_at must be an RFC 3339 instant")
	}
	if s.Sig, _ = m["sig"].(string); s.Sig == "" {
		return Signature{}, invalid("a signature record carries its sig")
	}
	return s, nil
}

// crockford is lowercase Crockford base32: no i, l, o or u.
const crockford = "0123456789abcdefghjkmnpqrstvwxyz"

// MintID derives a v1 document's id (§4.1): "sow_" and the first 16
// lowercase Crockford base32 characters (the first 80 bits) of SHA-256 over
// the canonical JSON of the document without id and signatures. An id is
// minted once, when the v1 document is created; a verifier never rejects a
// document because its id does not re-derive (§4.1.1): the signature, which
// covers the id, is the content commitment.
func MintID(doc any) (string, error) {
	m, err := withoutMember(doc, "signatures")
	if err != nil {
		return "", err
	}
	delete(m, "id")
	c, err := protocol.Canonical(m)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(c)
	out := make([]byte, 0, 20)
	out = append(out, "sow_"...)
	var acc uint64
	bits := 0
	for _, b := range sum[:10] {
		acc = acc<<8 | uint64(b)
		bits += 8
		for bits >= 5 {
			bits -= 5
			out = append(out, crockford[(acc>>bits)&31])
		}
	}
	return string(out), nil
}
