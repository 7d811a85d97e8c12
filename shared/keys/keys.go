// Package keys holds the typed Ed25519 keys of the mesh over NATS nkeys.
//
// Agent, node and credential keys are all nkeys "user" keys (public form
// `U` + 55 base32 characters), yet they are different things: an agent key
// signs envelopes, a node key proves a host, a credential key answers the
// broker's nonce. Giving each its own Go type makes passing one where another
// is wanted a compile error. Operator and account keys complete the NATS
// trust chain.
//
// A seed never prints: String, Format, GoString, MarshalJSON, MarshalText
// and LogValue all render the public key, and the key material sits behind a
// pointer so even a dereferenced Key prints no secret. The seed is reachable
// only through the explicitly named Seed method, which returns a copy.
//
// Seed files are written with mode 0600 (directory 0700), and a seed file
// that group or others can read is refused, as ssh does.
package keys

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"github.com/nats-io/nkeys"
)

// Role fixes which nkeys prefix a key type carries and what it is called in
// messages. The roles are the type parameters of Key.
type Role interface {
	prefix() nkeys.PrefixByte
	name() string
}

// The roles. Use them as type arguments: keys.Generate[keys.AgentRole]().
type (
	AgentRole      struct{}
	NodeRole       struct{}
	CredentialRole struct{}
	OperatorRole   struct{}
	AccountRole    struct{}
	// RegistrarRole signs the registrar's cards (upstream-notes §12.4).
	RegistrarRole struct{}
)

func (AgentRole) prefix() nkeys.PrefixByte      { return nkeys.PrefixByteUser }
func (AgentRole) name() string                  { return "agent" }
func (NodeRole) prefix() nkeys.PrefixByte       { return nkeys.PrefixByteUser }
func (NodeRole) name() string                   { return "node" }
func (CredentialRole) prefix() nkeys.PrefixByte { return nkeys.PrefixByteUser }
func (CredentialRole) name() string             { return "credential" }
func (OperatorRole) prefix() nkeys.PrefixByte   { return nkeys.PrefixByteOperator }
func (OperatorRole) name() string               { return "operator" }
func (AccountRole) prefix() nkeys.PrefixByte    { return nkeys.PrefixByteAccount }
func (AccountRole) name() string                { return "account" }
func (RegistrarRole) prefix() nkeys.PrefixByte  { return nkeys.PrefixByteUser }
func (RegistrarRole) name() string              { return "registrar" }

// The key types of the mesh.
type (
	Agent      = Key[AgentRole]
	Node       = Key[NodeRole]
	Credential = Key[CredentialRole]
	Operator   = Key[OperatorRole]
	Account    = Key[AccountRole]
	Registrar  = Key[RegistrarRole]
)

// Key is an Ed25519 keypair of one role. The decoded ed25519 private key is
// kept beside the nkeys pair because nkeys re-derives the key on every Sign
// (44 µs against 24 µs measured, DESIGN §10): envelopes are signed with the
// decoded key.
type Key[R Role] struct {
	pub string
	// sec is a pointer so that fmt, printing a dereferenced Key field by
	// field, shows an address rather than the private key bytes.
	sec *secret
}

// secret is the private half of a Key.
type secret struct {
	kp   nkeys.KeyPair
	priv ed25519.PrivateKey
}

// Generate makes a fresh random key.
func Generate[R Role]() (*Key[R], error) {
	var r R
	kp, err := nkeys.CreatePair(r.prefix())
	if err != nil {
		return nil, fmt.Errorf("generate %s key: %w", r.name(), err)
	}
	seed, err := kp.Seed()
	if err != nil {
		return nil, fmt.Errorf("generate %s key: %w", r.name(), err)
	}
	return FromSeed[R](seed)
}

// FromSeed loads a key from its nkeys seed (e.g. "SU..."), ignoring
// surrounding white space. The seed's prefix must match the role: an operator
// seed is not an agent key, so a misplaced file is refused instead of silently
// standing in for another key. seed is not retained; the caller may clear it.
// Errors never echo the seed.
func FromSeed[R Role](seed []byte) (*Key[R], error) {
	var r R
	seed = bytes.TrimSpace(seed)
	prefix, raw, err := nkeys.DecodeSeed(seed)
	if err != nil {
		return nil, fmt.Errorf("decode %s seed: %w", r.name(), err)
	}
	defer clear(raw)
	if prefix != r.prefix() {
		return nil, fmt.Errorf("%s seed: wrong kind of key (prefix %s, want %s)", r.name(), prefix, r.prefix())
	}
	kp, err := nkeys.FromSeed(seed) // keeps its own copy of seed
	if err != nil {
		return nil, fmt.Errorf("decode %s seed: %w", r.name(), err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("decode %s seed: %w", r.name(), err)
	}
	return &Key[R]{pub: pub, sec: &secret{kp: kp, priv: ed25519.NewKeyFromSeed(raw)}}, nil
}

// Public is the public key string (`U...`, `O...`, `A...`).
func (k *Key[R]) Public() string { return k.pub }

// PublicKey is the decoded Ed25519 public key.
func (k *Key[R]) PublicKey() ed25519.PublicKey { return k.sec.priv.Public().(ed25519.PublicKey) }

// Sign signs message with the decoded Ed25519 key.
func (k *Key[R]) Sign(message []byte) []byte { return sign(k.sec.priv, message) }

// SignNonce signs a broker nonce. It has the shape of the nonce-signing
// callback of a NATS connection (nats.UserJWT), and unlike Sign it reports a
// missing key as an error rather than panicking inside the client.
func (k *Key[R]) SignNonce(nonce []byte) ([]byte, error) {
	if k == nil || k.sec == nil {
		return nil, errors.New("sign nonce: no key")
	}
	return k.Sign(nonce), nil
}

// Seed reveals a copy of the nkeys seed. Callers write it to a 0600 file or
// hand it to the one party entitled to it, and nowhere else; they should
// clear it when done, which leaves the key intact.
func (k *Key[R]) Seed() []byte {
	s, err := k.sec.kp.Seed()
	if err != nil {
		// A pair built by FromSeed always has its seed.
		panic(fmt.Sprintf("keys: seed of a full keypair: %v", err))
	}
	// nkeys returns its internal buffer: a caller clearing or appending to it
	// would corrupt the key.
	return bytes.Clone(s)
}

// NKey is the underlying nkeys pair, for the NATS JWT library.
func (k *Key[R]) NKey() nkeys.KeyPair {
	return signingPair{KeyPair: k.sec.kp, priv: k.sec.priv, pub: k.pub}
}

// signingPair is the key's nkeys.KeyPair with signing through sign: the
// JWT library signs every credential through KeyPair.Sign, and nkeys's
// re-derives the private key from the seed on each call (44 µs against
// 9 µs, DESIGN.md §10). The signature bytes are the same. PublicKey, which
// the library asks for on every encode, is the key's own public string:
// nkeys's would derive the whole key from the seed again (about 30 µs) to
// compute the same string.
type signingPair struct {
	nkeys.KeyPair
	priv ed25519.PrivateKey
	pub  string
}

func (p signingPair) Sign(input []byte) ([]byte, error) { return sign(p.priv, input), nil }

func (p signingPair) PublicKey() (string, error) { return p.pub, nil }

// Role names the kind of key ("agent", "node", ...).
func (k *Key[R]) Role() string {
	var r R
	return r.name()
}

// String renders the public key only.
func (k *Key[R]) String() string { return k.pub }

// GoString keeps %#v from dumping the private key.
func (k *Key[R]) GoString() string { return fmt.Sprintf("keys.%s(%s)", k.Role(), k.pub) }

// Format makes every fmt verb print the public key.
func (k *Key[R]) Format(f fmt.State, verb rune) {
	if verb == 'v' && f.Flag('#') {
		_, _ = f.Write([]byte(k.GoString()))
		return
	}
	_, _ = f.Write([]byte(k.pub))
}

// LogValue makes slog print the public key.
func (k *Key[R]) LogValue() slog.Value { return slog.StringValue(k.pub) }

// MarshalText renders the public key; a key never serialises its seed.
func (k *Key[R]) MarshalText() ([]byte, error) { return []byte(k.pub), nil }

// MarshalJSON renders the public key as a JSON string.
func (k *Key[R]) MarshalJSON() ([]byte, error) { return []byte(`"` + k.pub + `"`), nil }

// WriteSeedFile writes the seed to path with mode 0600, creating the parent
// directory with 0700. The write goes to a temporary file first so a crash
// never leaves half a seed.
func (k *Key[R]) WriteSeedFile(path string) error {
	seed := k.Seed()
	defer clear(seed)
	line := make([]byte, len(seed)+1)
	defer clear(line)
	copy(line, seed)
	line[len(seed)] = '\n'
	return WriteSecretFile(path, line)
}

// ReadSeedFile loads a key of role R from a seed file. It refuses a file that
// group or others may read (except on Windows, which has no such mode bits),
// since a leaked seed is a stolen identity. A missing file yields an error
// matching os.ErrNotExist. Every error names path.
func ReadSeedFile[R Role](path string) (*Key[R], error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if perm := fi.Mode().Perm(); runtime.GOOS != "windows" && perm&0o077 != 0 {
		return nil, fmt.Errorf("%s has mode %04o; it must be readable by its owner only (chmod 600 %s)", path, perm, path)
	}
	b, err := io.ReadAll(f)
	defer clear(b)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	k, err := FromSeed[R](b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return k, nil
}

// LoadOrGenerate reads the key at path, or generates one and writes it there
// when the file does not exist yet.
func LoadOrGenerate[R Role](path string) (*Key[R], error) {
	k, err := ReadSeedFile[R](path)
	if err == nil {
		return k, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, err // ReadSeedFile names path
	}
	k, err = Generate[R]()
	if err != nil {
		return nil, err
	}
	if err := k.WriteSeedFile(path); err != nil {
		return nil, err
	}
	return k, nil
}

// WriteSecretFile writes data to path atomically with mode 0600 and its
// directory with 0700, durably: the temporary file is fsynced before the
// rename and the directory after it, so once this returns the new content
// survives a power cut (without the directory's fsync the rename itself
// could be lost, and a caller that saved something "before" spending a
// single-use key would find the old file, or none).
func WriteSecretFile(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, ".tmp-"+filepath.Base(path)+"-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after a successful rename
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := syncDirHook(dir); err != nil {
		return fmt.Errorf("write %s: the directory could not be synced: %w", path, err)
	}
	return nil
}

// syncDirHook is syncDir; tests replace it to see it called.
var syncDirHook = syncDir

// syncDir fsyncs a directory so that a rename in it is durable. Windows
// cannot open a directory for syncing (and its renames are journaled by
// NTFS), and some filesystems answer EINVAL or "not supported": those are
// not errors, since nothing more can be done there.
func syncDir(dir string) error {
	if runtime.GOOS == "windows" {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, errors.ErrUnsupported) {
		return err
	}
	return nil
}

// Signer is what signs protocol objects: an agent key, a node key, an owner
// key. Only the public half and Sign are needed.
type Signer interface {
	Public() string
	Sign(message []byte) []byte
}

// IsUserPublicKey reports whether s is a well-formed user public key: `U`
// plus 55 base32 characters with a valid checksum. A seed ("SU...") is not.
//
// It allocates nothing (the nkeys check it matches allocates the decoded
// key): services call it on every subject token and envelope member they
// read. The base32 is decoded into a stack array and the CRC-16/XMODEM
// checked there. The standard base32 decoder skips line breaks, with which
// a 56-character string can hold a shorter key; such a string goes to nkeys
// itself, so the answer is nkeys's on every input.
func IsUserPublicKey(s string) bool {
	if len(s) != 56 || s[0] != 'U' {
		return false
	}
	var raw [35]byte // prefix byte, 32-byte key, checksum
	for g := range 7 {
		var v uint64
		for _, c := range []byte(s[g*8 : g*8+8]) {
			d := base32Value[c]
			if d == 0xFF {
				if strings.ContainsAny(s, "\r\n") {
					return nkeys.IsValidPublicUserKey(s)
				}
				return false
			}
			v = v<<5 | uint64(d)
		}
		for i := range 5 {
			raw[g*5+i] = byte(v >> (32 - 8*i))
		}
	}
	if nkeys.PrefixByte(raw[0]&0xF8) != nkeys.PrefixByteUser {
		return false
	}
	return crc16(raw[:33]) == uint16(raw[33])|uint16(raw[34])<<8
}

// base32Value maps RFC 4648 base32 characters to their values, and every
// other byte to 0xFF.
var base32Value = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xFF
	}
	for i, c := range "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567" {
		t[c] = byte(i)
	}
	return t
}()

// crc16Table drives crc16, the CRC-16/XMODEM of nkeys (polynomial 0x1021).
var crc16Table = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()

func crc16(data []byte) uint16 {
	var crc uint16
	for _, b := range data {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^b]
	}
	return crc
}

// DecodeUserPublicKey returns the raw Ed25519 key behind a user public key.
func DecodeUserPublicKey(s string) (ed25519.PublicKey, error) {
	if len(s) != 56 || s[0] != 'U' {
		return nil, fmt.Errorf("not a user public key: must be U followed by 55 base32 characters")
	}
	raw, err := nkeys.Decode(nkeys.PrefixByteUser, []byte(s))
	if err != nil {
		return nil, fmt.Errorf("not a user public key: %w", err)
	}
	return ed25519.PublicKey(raw), nil
}
