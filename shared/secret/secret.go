// Package secret makes and compares the bearer secrets of the control plane
// (session tokens, API tokens, agent keys, one-time codes). A secret is
// shown to its owner once; the store keeps only its SHA-256, so a leaked
// database does not leak usable tokens.
package secret

import (
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
// code's hash says nothing about another's.
func HashCode(context, code string) string { return Hash(context + "\x00" + code) }

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
	return Code{CodeHash: HashCode(context, code), ExpiresAt: expires.UnixMilli(), AttemptsLeft: attempts}
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
	if now.UnixMilli() >= c.ExpiresAt {
		return CodeExpired
	}
	if Equal(c.CodeHash, HashCode(context, presented)) {
		return CodeMatch
	}
	c.AttemptsLeft--
	if c.AttemptsLeft <= 0 {
		return CodeBurned
	}
	return CodeWrong
}
