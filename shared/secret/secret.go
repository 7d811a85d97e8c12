// Package secret makes and compares the bearer secrets of the control plane
// (session tokens, API tokens, agent keys, one-time codes). A secret is
// shown to its owner once; the store keeps only its SHA-256, so a leaked
// database does not leak usable tokens. A short code (a million or a
// billion values) is a different matter: anyone holding the database can
// hash every possible code. Where the service has a secret of its own, it
// keys the hash (CodeHasher, HMAC-SHA256), so the stored value is useless
// without that secret too.
package secret

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"math/big"
	"strings"
	"time"
)

// Token returns prefix + 32 random bytes in base64url (43 characters).
func Token(prefix string) string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("secret: crypto/rand failed: %v", err))
	}
	return prefix + base64.RawURLEncoding.EncodeToString(b[:])
}

// Digits returns n random decimal digits (a one-time code).
func Digits(n int) string {
	var sb strings.Builder
	for range n {
		d, err := rand.Int(rand.Reader, big.NewInt(10))
		if err != nil {
			panic(fmt.Sprintf("secret: crypto/rand failed: %v", err))
		}
		sb.WriteByte(byte('0' + d.Int64()))
	}
	return sb.String()
}

// Alphabet picks n characters from alphabet (for codes people type).
func Alphabet(alphabet string, n int) string {
	var sb strings.Builder
	for range n {
		i, err := rand.Int(rand.Reader, big.NewInt(int64(len(alphabet))))
		if err != nil {
			panic(fmt.Sprintf("secret: crypto/rand failed: %v", err))
		}
		sb.WriteByte(alphabet[i.Int64()])
	}
	return sb.String()
}

// Hash is the storage key of a secret: hex SHA-256. Tokens carry 256 bits
// of entropy, so an unsalted hash is enough to make the stored value
// useless; short codes are hashed with their context (see HashCode).
func Hash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// HashCode hashes a short code together with what it was issued for, so one
// code's hash says nothing about another's. It is unkeyed: whoever reads
// the store can try every code (see CodeHasher).
func HashCode(context, code string) string { return Hash(context + "\x00" + code) }

// CodeHasher hashes short codes with a server secret: hex
// HMAC-SHA256(key, context NUL code), so someone who reads the store but
// not the key cannot recover a live code by trying them all. The zero
// CodeHasher (no key) is HashCode.
type CodeHasher struct{ key []byte }

// NewCodeHasher keys code hashes with key (at least 32 secret bytes); an
// empty key gives the unkeyed HashCode.
func NewCodeHasher(key []byte) CodeHasher { return CodeHasher{key: bytes.Clone(key)} }

// Keyed reports whether h has a key.
func (h CodeHasher) Keyed() bool { return len(h.key) > 0 }

// Hash is the storage form of code issued for context.
func (h CodeHasher) Hash(context, code string) string {
	if len(h.key) == 0 {
		return HashCode(context, code)
	}
	m := hmac.New(sha256.New, h.key)
	m.Write([]byte(context + "\x00" + code))
	return hex.EncodeToString(m.Sum(nil))
}

// NewCode records code (issued for context) hashed by h.
func (h CodeHasher) NewCode(context, code string, expires time.Time, attempts int) Code {
	return Code{CodeHash: h.Hash(context, code), ExpiresAt: expires.UnixMilli(), AttemptsLeft: attempts}
}

// Check is Code.Check for a code recorded by h.
func (h CodeHasher) Check(c *Code, context, presented string, now time.Time) CodeVerdict {
	return c.check(h.Hash(context, presented), now)
}

// Equal compares two secrets (or hashes) in constant time.
func Equal(a, b string) bool { return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1 }

// Code is a mailed one-time code as a store keeps it: the hash of the code
// with its context (HashCode), its deadline, and the wrong tries it still
// allows. The account service's sign-in codes and the registrar's email
// codes are both this.
type Code struct {
	CodeHash     string `json:"code_hash"`
	ExpiresAt    int64  `json:"expires_at"` // Unix ms
	AttemptsLeft int    `json:"attempts_left"`
}

// NewCode records code (issued for context) until expires, allowing
// attempts wrong tries.
func NewCode(context, code string, expires time.Time, attempts int) Code {
	return CodeHasher{}.NewCode(context, code, expires, attempts)
}

// CodeVerdict is what checking a presented code found.
type CodeVerdict int

const (
	// CodeMatch: the code is right and still valid.
	CodeMatch CodeVerdict = iota
	// CodeExpired: the deadline passed (the code is not compared).
	CodeExpired
	// CodeWrong: a wrong code; AttemptsLeft was decremented and is above 0.
	CodeWrong
	// CodeBurned: a wrong code, and that was the last try.
	CodeBurned
)

// Check compares presented (issued for context) with c in constant time at
// now. A wrong code costs one try (c is updated); the caller writes c back,
// or deletes it when the verdict is CodeBurned, CodeExpired or CodeMatch
// (a code works once).
func (c *Code) Check(context, presented string, now time.Time) CodeVerdict {
	return CodeHasher{}.Check(c, context, presented, now)
}

func (c *Code) check(presentedHash string, now time.Time) CodeVerdict {
	if now.UnixMilli() >= c.ExpiresAt {
		return CodeExpired
	}
	if Equal(c.CodeHash, presentedHash) {
		return CodeMatch
	}
	c.AttemptsLeft--
	if c.AttemptsLeft <= 0 {
		return CodeBurned
	}
	return CodeWrong
}
