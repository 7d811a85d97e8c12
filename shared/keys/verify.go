package keys

// The one place where the mesh checks an Ed25519 signature (DESIGN §10).
//
// crypto/ed25519 is the reference: a signature is good exactly when
// ed25519.Verify says so. The default implementation behind the seam is
// curve25519-voi with its VerifyOptionsStdLib preset (cofactorless equation,
// small-order and non-canonical A accepted, non-canonical R and S refused, as
// the standard library does) and a precomputed ("expanded") form of each
// public key, which together verify about 1.6x faster (21 µs against 34 µs
// for a 600-byte message on our 2-core machine, BenchmarkVerify).
// verify_test.go proves the two accept the same signatures on the
// speccheck, ZIP-215, Wycheproof, ed25519vectors and sign.input cases, on
// every signature the project's conformance fixtures make it check, and on
// random, small-order and corrupted signatures; FuzzVerify keeps checking
// it. Batch verification is never used: voi's batch equation is cofactored
// and accepts a different set of signatures.

import (
	"bytes"
	"crypto/ed25519"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	voied "github.com/oasisprotocol/curve25519-voi/primitives/ed25519"
)

// Verifier names the implementation behind Verify.
type Verifier int32

const (
	// Voi is curve25519-voi with the standard library's acceptance rules and
	// expanded keys. It is the default.
	Voi Verifier = iota
	// StdLib is crypto/ed25519 itself, the reference.
	StdLib
	// Compare runs both on every signature, answers what the standard
	// library answers, and counts (and logs) any disagreement; for tests
	// and for trying the fast verifier on real traffic.
	Compare
)

// VerifierEnv names the environment variable read once at start-up to pick
// the verifier: "voi" (the default), "stdlib" or "compare". It lets a whole
// process (meshd, a benchmark) run on the reference verifier for comparison.
const VerifierEnv = "MESH_ED25519_VERIFIER"

func (v Verifier) String() string {
	switch v {
	case Voi:
		return "voi"
	case StdLib:
		return "stdlib"
	case Compare:
		return "compare"
	}
	return fmt.Sprintf("Verifier(%d)", int32(v))
}

// ParseVerifier reads a verifier name as String writes it. For any other
// name it returns an error and StdLib, the choice that is never wrong.
func ParseVerifier(s string) (Verifier, error) {
	for _, v := range []Verifier{Voi, StdLib, Compare} {
		if s == v.String() {
			return v, nil
		}
	}
	return StdLib, fmt.Errorf("unknown Ed25519 verifier %q: want voi, stdlib or compare", s)
}

var verifier atomic.Int32

func init() {
	if s, set := os.LookupEnv(VerifierEnv); set && s != "" {
		v, err := ParseVerifier(s)
		if err != nil {
			// The reference is never wrong, only slower: a typo costs speed,
			// not safety.
			slog.Warn("using the standard library's Ed25519 verifier", "env", VerifierEnv, "err", err)
		}
		verifier.Store(int32(v))
	}
}

// SetVerifier selects the implementation for every later verification in
// the process and returns the previous one. It is safe to call at any time;
// benchmarks switch it to measure both in one run.
func SetVerifier(v Verifier) (previous Verifier) {
	if v != Voi && v != StdLib && v != Compare {
		panic(fmt.Sprintf("keys: SetVerifier(%d): no such verifier", int32(v)))
	}
	return Verifier(verifier.Swap(int32(v)))
}

// CurrentVerifier is the implementation in use.
func CurrentVerifier() Verifier { return Verifier(verifier.Load()) }

// The Compare tallies.
var compared, mismatched atomic.Uint64

// CompareCounts returns how many signatures Compare has checked with both
// implementations, and on how many they disagreed, since the process began.
func CompareCounts() (checked, disagreed uint64) { return compared.Load(), mismatched.Load() }

// voiOptions is crypto/ed25519's acceptance rules in voi's terms. It is
// read-only: voi never writes to it.
var voiOptions = &voied.Options{Verify: voied.VerifyOptionsStdLib}

// Verify reports whether sig is a valid signature of msg by pub, by the
// rules of crypto/ed25519.Verify. A pub that is not 32 bytes verifies
// nothing (crypto/ed25519 would panic). It does not keep the key; code that
// checks many signatures by one key holds a VerifyingKey, or uses
// a KeyCache.
func Verify(pub ed25519.PublicKey, msg, sig []byte) bool {
	if len(pub) != ed25519.PublicKeySize {
		return false
	}
	switch CurrentVerifier() {
	case StdLib:
		return ed25519.Verify(pub, msg, sig)
	case Compare:
		want := ed25519.Verify(pub, msg, sig)
		tally(pub, msg, sig, want, verifyVoi(pub, msg, sig))
		return want
	}
	return verifyVoi(pub, msg, sig)
}

// verifyVoi is voi without a kept expansion; pub is 32 bytes.
func verifyVoi(pub ed25519.PublicKey, msg, sig []byte) bool {
	return voied.VerifyWithOptions(voied.PublicKey(pub), msg, sig, voiOptions)
}

// compareHook, when set (by tests), sees every signature Compare checks.
var compareHook atomic.Pointer[func(pub, msg, sig []byte)]

func tally(pub, msg, sig []byte, want, got bool) {
	if h := compareHook.Load(); h != nil {
		(*h)(pub, msg, sig)
	}
	compared.Add(1)
	if want != got {
		mismatched.Add(1)
		// Public material only: the key, the signature and the message's size.
		slog.Error("Ed25519 verifiers disagree; the standard library's answer is used",
			"public_key", hex.EncodeToString(pub), "sig", hex.EncodeToString(sig), "msg_bytes", len(msg),
			"stdlib", want, "voi", got)
	}
}

// VerifyingKey is an Ed25519 public key ready to check many signatures: the
// first voi verification expands it (about 1.5 KiB, a few µs) and keeps the
// expansion. Safe for concurrent use.
type VerifyingKey struct {
	raw ed25519.PublicKey
	exp atomic.Pointer[expandedKey]
}

// expandedKey is the outcome of expanding a key once; k is nil when the
// bytes are not a curve point, which no signature verifies against (nor
// does the standard library's).
type expandedKey struct{ k *voied.ExpandedPublicKey }

// NewVerifyingKey wraps a raw 32-byte Ed25519 public key. pub is copied.
func NewVerifyingKey(pub ed25519.PublicKey) (*VerifyingKey, error) {
	if len(pub) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("an Ed25519 public key is %d bytes, not %d", ed25519.PublicKeySize, len(pub))
	}
	return &VerifyingKey{raw: append(ed25519.PublicKey(nil), pub...)}, nil
}

// PublicKey is the raw key. Callers must not modify it.
func (k *VerifyingKey) PublicKey() ed25519.PublicKey { return k.raw }

// Verify reports whether sig is a valid signature of msg by k, by the rules
// of crypto/ed25519.Verify.
func (k *VerifyingKey) Verify(msg, sig []byte) bool {
	switch CurrentVerifier() {
	case StdLib:
		return ed25519.Verify(k.raw, msg, sig)
	case Compare:
		want := ed25519.Verify(k.raw, msg, sig)
		// The copies keep the caller's buffers from escaping through the
		// hook and the log: every envelope's signature and message are on
		// the caller's stack or in a pooled buffer.
		tally(k.raw, bytes.Clone(msg), bytes.Clone(sig), want, k.verifyExpanded(msg, sig))
		return want
	}
	return k.verifyExpanded(msg, sig)
}

func (k *VerifyingKey) verifyExpanded(msg, sig []byte) bool {
	e := k.exp.Load()
	if e == nil {
		// Racing first uses expand twice and keep one; both are equal.
		x, err := voied.NewExpandedPublicKey(voied.PublicKey(k.raw))
		if err != nil {
			x = nil
		}
		e = &expandedKey{k: x}
		k.exp.Store(e)
	}
	if e.k == nil {
		return false
	}
	return voied.VerifyExpandedWithOptions(e.k, msg, sig, voiOptions)
}

// KeyCache maps user public keys (`U` + 55 base32 characters) to their
// VerifyingKey, so that a sender's key is decoded and expanded once instead
// of on every envelope. It holds two generations of at most size entries
// each: when the current one fills it becomes the old one and the older is
// dropped, so keys chosen by whoever writes to the wire can cost at most
// 2×size entries (about 1.5 KiB each), and the keys in steady use stay.
// Safe for concurrent use.
type KeyCache struct {
	mu       sync.RWMutex
	size     int
	cur, old map[string]*VerifyingKey
}

// DefaultKeyCacheSize is the generation size of NewKeyCache(0) and of the
// shared cache behind UserKeys: at most 4096 keys, about 6 MiB.
const DefaultKeyCacheSize = 2048

// NewKeyCache returns a cache of at most 2×size keys (size <= 0 means
// DefaultKeyCacheSize).
func NewKeyCache(size int) *KeyCache {
	if size <= 0 {
		size = DefaultKeyCacheSize
	}
	return &KeyCache{size: size, cur: make(map[string]*VerifyingKey)}
}

// Get returns the key behind a user public key string. The error is
// DecodeUserPublicKey's, for a string that is not a user public key; such
// strings are not cached.
func (c *KeyCache) Get(pub string) (*VerifyingKey, error) {
	c.mu.RLock()
	k, ok := c.cur[pub]
	c.mu.RUnlock()
	if ok {
		return k, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if k, ok := c.cur[pub]; ok { // another caller added it meanwhile
		return k, nil
	}
	if k, ok := c.old[pub]; ok {
		// Still in use: carry it (and its expansion) into the current
		// generation, so a key in steady use is never dropped.
		delete(c.old, pub)
		c.put(pub, k)
		return k, nil
	}
	raw, err := DecodeUserPublicKey(pub)
	if err != nil {
		return nil, err
	}
	k = &VerifyingKey{raw: raw}
	// The string may be a slice of a larger buffer the caller reuses or
	// would otherwise free; the cache keeps its own 56 bytes.
	c.put(strings.Clone(pub), k)
	return k, nil
}

// put adds a key to the current generation, retiring it first when full.
// c.mu is held.
func (c *KeyCache) put(pub string, k *VerifyingKey) {
	if len(c.cur) >= c.size {
		c.old, c.cur = c.cur, make(map[string]*VerifyingKey, c.size)
	}
	c.cur[pub] = k
}

// Len is the number of keys held, for tests and metrics.
func (c *KeyCache) Len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.cur) + len(c.old)
}

// userKeys is the process's shared cache; see UserKeys.
var userKeys = NewKeyCache(0)

// UserKeys is the process's shared, bounded cache of sender keys, used by
// every decoder that is not given its own.
func UserKeys() *KeyCache { return userKeys }
