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
