package keys

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"

	"agentmesh.dev/mesh/shared/keys/keystest"
)

func TestRoundTripPerRole(t *testing.T) {
	tests := []struct {
		role   string
		prefix byte // first character of the public key
		run    func(t *testing.T, role string, prefix byte)
	}{
		{"agent", 'U', roundTrip[AgentRole]},
		{"node", 'U', roundTrip[NodeRole]},
		{"credential", 'U', roundTrip[CredentialRole]},
		{"operator", 'O', roundTrip[OperatorRole]},
		{"account", 'A', roundTrip[AccountRole]},
		{"registrar", 'U', roundTrip[RegistrarRole]},
	}
	for _, tc := range tests {
		t.Run(tc.role, func(t *testing.T) { tc.run(t, tc.role, tc.prefix) })
	}
}

// roundTrip generates a key of role R and loads it back from its seed, from
// a seed file and through LoadOrGenerate.
func roundTrip[R Role](t *testing.T, role string, prefix byte) {
	k := mustGenerate[R](t)
	if k.Role() != role {
		t.Errorf("Role() = %q, want %q", k.Role(), role)
	}
	if len(k.Public()) != 56 || k.Public()[0] != prefix {
		t.Errorf("public key %q: want %c followed by 55 characters", k.Public(), prefix)
	}
	msg := []byte("round trip")

	// The seed, with the white space of a file around it.
	again, err := FromSeed[R](append(append([]byte("  "), k.Seed()...), "\n"...))
	if err != nil {
		t.Fatalf("FromSeed: %v", err)
	}
	if again.Public() != k.Public() {
		t.Fatalf("FromSeed gave %s, want %s", again.Public(), k.Public())
	}
	if !ed25519.Verify(k.PublicKey(), msg, again.Sign(msg)) {
		t.Fatal("reloaded key's signature does not verify under the original public key")
	}

	path := filepath.Join(t.TempDir(), "k.nk")
	if err := k.WriteSeedFile(path); err != nil {
		t.Fatal(err)
	}
	fromFile, err := ReadSeedFile[R](path)
	if err != nil {
		t.Fatalf("ReadSeedFile: %v", err)
	}
	if fromFile.Public() != k.Public() {
		t.Fatalf("ReadSeedFile gave %s, want %s", fromFile.Public(), k.Public())
	}

	// LoadOrGenerate creates the key once, then loads the same key.
	genPath := filepath.Join(t.TempDir(), "sub", "g.nk")
	first, err := LoadOrGenerate[R](genPath)
	if err != nil {
		t.Fatal(err)
	}
	second, err := LoadOrGenerate[R](genPath)
	if err != nil {
		t.Fatal(err)
	}
	if first.Public() != second.Public() {
		t.Fatalf("LoadOrGenerate made a new key over an existing one: %s then %s", first.Public(), second.Public())
	}
}

func TestWrongKindOfSeedIsRefused(t *testing.T) {
	op := mustGenerate[OperatorRole](t)
	acct := mustGenerate[AccountRole](t)
	user := mustGenerate[AgentRole](t)

	tests := []struct {
		name    string
		load    func() error
		seed    []byte
		wantErr string
	}{
		{"operator seed as agent", func() error { _, err := FromSeed[AgentRole](op.Seed()); return err }, op.Seed(), "want user"},
		{"account seed as credential", func() error { _, err := FromSeed[CredentialRole](acct.Seed()); return err }, acct.Seed(), "want user"},
		{"account seed as operator", func() error { _, err := FromSeed[OperatorRole](acct.Seed()); return err }, acct.Seed(), "want operator"},
		{"user seed as account", func() error { _, err := FromSeed[AccountRole](user.Seed()); return err }, user.Seed(), "want account"},
		{"user seed as operator", func() error { _, err := FromSeed[OperatorRole](user.Seed()); return err }, user.Seed(), "want operator"},
		{"public key as seed", func() error { _, err := FromSeed[AgentRole]([]byte(user.Public())); return err }, user.Seed(), "decode agent seed"},
		{"garbage", func() error { _, err := FromSeed[NodeRole]([]byte("not a seed")); return err }, nil, "decode node seed"},
		{"empty", func() error { _, err := FromSeed[NodeRole](nil); return err }, nil, "decode node seed"},
		{"seed file of the wrong kind", func() error {
			path := filepath.Join(t.TempDir(), "op.nk")
			if err := op.WriteSeedFile(path); err != nil {
				return err
			}
			_, err := ReadSeedFile[AccountRole](path)
			return err
		}, op.Seed(), "op.nk: account seed: wrong kind of key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.load()
			if err == nil {
				t.Fatal("loaded a seed of the wrong kind")
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.wantErr)
			}
			if tc.seed != nil && strings.Contains(err.Error(), string(tc.seed)) {
				t.Fatal("error message contains the seed")
			}
		})
	}
}

func TestKeyNeverShowsItsSeed(t *testing.T) {
	key := mustGenerate[CredentialRole](t)
	op := mustGenerate[OperatorRole](t)

	type holder struct {
		Name string
		Key  *Credential
	}
	type valueHolder struct {
		Key Credential
	}
	pub := key.Public()
	secrets := keystest.Secrets(t, key.Seed(), op.Seed())
	tests := []struct {
		name   string
		render func() string
		// want is what the rendering must show ("" for nothing in particular).
		want string
	}{
		{"%v", func() string { return fmt.Sprintf("%v", key) }, pub},
		{"%s", func() string { return fmt.Sprintf("%s", key) }, pub},
		{"%+v", func() string { return fmt.Sprintf("%+v", key) }, pub},
		{"%#v", func() string { return fmt.Sprintf("%#v", key) }, "keys.credential(" + pub + ")"},
		{"%q", func() string { return fmt.Sprintf("%q", key) }, pub},
		{"%x", func() string { return fmt.Sprintf("%x", key) }, pub},
		{"%X", func() string { return fmt.Sprintf("%X", key) }, pub},
		{"%d", func() string { return fmt.Sprintf("%d", key) }, pub},
		{"Print", func() string { return fmt.Sprint(key, op) }, op.Public()},
		{"String", func() string { return key.String() }, pub},
		{"in struct %+v", func() string { return fmt.Sprintf("%+v", holder{"k", key}) }, pub},
		{"in struct %#v", func() string { return fmt.Sprintf("%#v", holder{"k", key}) }, pub},
		{"in slice %v", func() string { return fmt.Sprintf("%v", []*Credential{key}) }, pub},
		{"in map %v", func() string { return fmt.Sprintf("%v", map[string]*Operator{"op": op}) }, op.Public()},
		{"dereferenced %+v", func() string { return fmt.Sprintf("%+v", *key) }, pub},
		{"dereferenced %#v", func() string { return fmt.Sprintf("%#v", *key) }, ""},
		{"dereferenced %x", func() string { return fmt.Sprintf("%x", any(*key)) }, ""},
		{"dereferenced in struct %+v", func() string { return fmt.Sprintf("%+v", valueHolder{*key}) }, ""},
		{"json", func() string { return mustJSON(t, key) }, `"` + pub + `"`},
		{"json in struct", func() string { return mustJSON(t, holder{"k", key}) }, `"Key":"` + pub + `"`},
		{"json map key", func() string { return mustJSON(t, map[*Credential]int{key: 1}) }, `"` + pub + `":1`},
		{"json dereferenced", func() string { return mustJSON(t, valueHolder{*key}) }, ""},
		{"MarshalText", func() string { b, _ := key.MarshalText(); return string(b) }, pub},
		{"slog json", func() string { return keystest.LogJSON("key", key) }, `"key":"` + pub + `"`},
		{"slog json struct", func() string { return keystest.LogJSON("h", holder{"k", key}) }, pub},
		{"slog json dereferenced", func() string { return keystest.LogJSON("k", *key) }, ""},
		{"slog text", func() string { return keystest.LogText("key", key) }, "key=" + pub},
		{"slog text dereferenced", func() string { return keystest.LogText("k", *key) }, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { keystest.NoSecret(t, tc.render(), secrets, tc.want) })
	}
}

func TestSeedReturnsACopy(t *testing.T) {
	key := mustGenerate[CredentialRole](t)
	want := key.Seed()
	msg := []byte("nonce")

	tests := []struct {
		name  string
		spoil func(seed []byte)
	}{
		{"cleared", func(seed []byte) { clear(seed) }},
		{"overwritten", func(seed []byte) { copy(seed, "SAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA") }},
		{"appended to", func(seed []byte) { _ = append(seed[:len(seed)-1], 'X') }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.spoil(key.Seed())
			if got := key.Seed(); !bytes.Equal(got, want) {
				t.Fatal("changing the returned seed changed the key's seed")
			}
			// Both signing paths still work: the decoded key and the nkeys
			// pair the JWT library signs with.
			if !ed25519.Verify(key.PublicKey(), msg, key.Sign(msg)) {
				t.Fatal("Sign broken after spoiling a returned seed")
			}
			sig, err := key.NKey().Sign(msg)
			if err != nil {
				t.Fatalf("NKey().Sign: %v", err)
			}
			if !ed25519.Verify(key.PublicKey(), msg, sig) {
				t.Fatal("NKey().Sign broken after spoiling a returned seed")
			}
		})
	}
}

func TestSignNonce(t *testing.T) {
	key := mustGenerate[CredentialRole](t)
	nonce := []byte("broker nonce")

	tests := []struct {
		name    string
		key     *Credential
		wantErr bool
	}{
		{"key", key, false},
		{"nil key", nil, true},
		{"zero key", &Credential{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sign := tc.key.SignNonce // the shape nats.UserJWT takes
			sig, err := sign(nonce)
			if tc.wantErr {
				if err == nil {
					t.Fatal("signed without a key")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !ed25519.Verify(key.PublicKey(), nonce, sig) {
				t.Fatal("nonce signature does not verify")
			}
			// The NATS server checks the signature with nkeys.
			pub, err := nkeys.FromPublicKey(key.Public())
			if err != nil {
				t.Fatal(err)
			}
			if err := pub.Verify(nonce, sig); err != nil {
				t.Fatalf("nkeys rejects the nonce signature: %v", err)
			}
		})
	}
}

func TestSeedFileModes(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("no Unix file modes")
	}
	key := mustGenerate[NodeRole](t)
	tests := []struct {
		name     string
		write    func(path string) error
		wantFile os.FileMode
	}{
		{"WriteSeedFile", key.WriteSeedFile, 0o600},
		{"WriteSecretFile", func(path string) error { return WriteSecretFile(path, []byte("x")) }, 0o600},
		{"LoadOrGenerate", func(path string) error { _, err := LoadOrGenerate[NodeRole](path); return err }, 0o600},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			dir := filepath.Join(root, "new", "dir")
			path := filepath.Join(dir, "key.nk")
			if err := tc.write(path); err != nil {
				t.Fatal(err)
			}
			for p, want := range map[string]os.FileMode{
				path:                       tc.wantFile,
				dir:                        0o700,
				filepath.Join(root, "new"): 0o700,
			} {
				fi, err := os.Stat(p)
				if err != nil {
					t.Fatal(err)
				}
				if got := fi.Mode().Perm(); got != want {
					t.Errorf("%s mode = %04o, want %04o", p, got, want)
				}
			}
			// Only the file itself: no temporary file left beside it.
			entries, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(entries) != 1 {
				t.Errorf("%s holds %d entries, want 1", dir, len(entries))
			}
		})
	}
}

func TestReadSeedFileRefusesOpenFiles(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("no Unix file modes")
	}
	key := mustGenerate[AgentRole](t)
	tests := []struct {
		name    string
		mode    os.FileMode
		wantErr string // "" means the file loads
	}{
		{"owner only", 0o600, ""},
		{"owner read only", 0o400, ""},
		{"world readable", 0o644, "has mode 0644; it must be readable by its owner only (chmod 600 "},
		{"group readable", 0o640, "has mode 0640"},
		{"others writable", 0o602, "has mode 0602"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "agent.nk")
			if err := key.WriteSeedFile(path); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, tc.mode); err != nil {
				t.Fatal(err)
			}
			got, err := ReadSeedFile[AgentRole](path)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("ReadSeedFile: %v", err)
				}
				if got.Public() != key.Public() {
					t.Fatal("loaded a different key")
				}
				return
			}
			if err == nil {
				t.Fatal("ReadSeedFile accepted an over-permissive seed file")
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.wantErr) || !strings.HasPrefix(msg, path) || !strings.HasSuffix(msg, "chmod 600 "+path+")") {
				t.Fatalf("err = %q, want it to name %s, mention %q and say how to fix it", msg, path, tc.wantErr)
			}
			if strings.Contains(msg, string(key.Seed())) {
				t.Fatal("error message contains the seed")
			}
			// LoadOrGenerate refuses too, instead of replacing the key.
			if _, err := LoadOrGenerate[AgentRole](path); err == nil {
				t.Fatal("LoadOrGenerate accepted an over-permissive seed file")
			}
			if again, err := FromSeed[AgentRole](mustRead(t, path)); err != nil || again.Public() != key.Public() {
				t.Fatal("LoadOrGenerate changed the refused file")
			}
		})
	}
}

func TestReadSeedFileMissing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "absent.nk")
	_, err := ReadSeedFile[AgentRole](path)
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("err = %v, want os.ErrNotExist", err)
	}
	if !strings.Contains(err.Error(), path) {
		t.Fatalf("err = %v, want it to name %s", err, path)
	}
}

func TestIsUserPublicKey(t *testing.T) {
	user := mustGenerate[CredentialRole](t)
	op := mustGenerate[OperatorRole](t)
	acct := mustGenerate[AccountRole](t)

	tests := []struct {
		name string
		s    string
		want bool
	}{
		{"generated user key", user.Public(), true},
		{"agent key", mustGenerate[AgentRole](t).Public(), true},
		{"user seed", string(user.Seed()), false},
		{"operator key", op.Public(), false},
		{"account key", acct.Public(), false},
		{"wrong checksum", spoilLast(user.Public()), false},
		{"truncated", user.Public()[:55], false},
		{"extra character", user.Public() + "A", false},
		{"lower case", strings.ToLower(user.Public()), false},
		{"empty", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := IsUserPublicKey(tc.s); got != tc.want {
				t.Fatalf("IsUserPublicKey(%q) = %v, want %v", tc.s, got, tc.want)
			}
		})
	}
}

// isUserPublicKeyRef is the nkeys check IsUserPublicKey must agree with.
func isUserPublicKeyRef(s string) bool {
	return len(s) == 56 && s[0] == 'U' && nkeys.IsValidPublicUserKey(s)
}

// TestIsUserPublicKeyWithCachedKeys: IsUserPublicKey answers as the
// decoding check does whether or not the key, or a near miss of it, is in
// the shared verification cache.
func TestIsUserPublicKeyWithCachedKeys(t *testing.T) {
	user := mustGenerate[AgentRole](t)
	cands := []string{user.Public(), spoilLast(user.Public()), user.Public()[:55] + "A", strings.ToLower(user.Public()),
		"U" + strings.Repeat("A", 55), mustGenerate[AccountRole](t).Public(), string(user.Seed())}
	for _, cached := range []bool{false, true} {
		if cached {
			for _, c := range cands {
				_, _ = UserKeys().Get(c) // only well-formed keys are held
			}
		}
		for _, c := range cands {
			if got, want := IsUserPublicKey(c), isUserPublicKeyRef(c); got != want {
				t.Fatalf("cached %v: IsUserPublicKey(%q) = %v, want %v", cached, c, got, want)
			}
		}
	}
}

// FuzzIsUserPublicKey: on any string, cached in the verification cache or
// not, IsUserPublicKey agrees with the decoding check.
func FuzzIsUserPublicKey(f *testing.F) {
	k, err := Generate[AgentRole]()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(k.Public(), false)
	f.Add(spoilLast(k.Public()), true)
	f.Add("U"+strings.Repeat("A", 55), true)
	f.Fuzz(func(t *testing.T, s string, cache bool) {
		if cache {
			_, _ = UserKeys().Get(s)
		}
		if got, want := IsUserPublicKey(s), isUserPublicKeyRef(s); got != want {
			t.Fatalf("IsUserPublicKey(%q) = %v, want %v", s, got, want)
		}
	})
}

func TestDecodeUserPublicKey(t *testing.T) {
	user := mustGenerate[AgentRole](t)
	msg := []byte("envelope")

	tests := []struct {
		name    string
		s       string
		wantErr bool
	}{
		{"user key", user.Public(), false},
		{"operator key", mustGenerate[OperatorRole](t).Public(), true},
		{"account key", mustGenerate[AccountRole](t).Public(), true},
		{"user seed", string(user.Seed()), true},
		{"wrong checksum", spoilLast(user.Public()), true},
		{"empty", "", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pub, err := DecodeUserPublicKey(tc.s)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("DecodeUserPublicKey(%q) accepted it", tc.s)
				}
				if strings.Contains(err.Error(), string(user.Seed())) {
					t.Fatal("error message contains the seed")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !pub.Equal(user.PublicKey()) {
				t.Fatal("decoded key differs from the key's PublicKey")
			}
			if !ed25519.Verify(pub, msg, user.Sign(msg)) {
				t.Fatal("signature does not verify under the decoded key")
			}
			if ed25519.Verify(pub, []byte("tampered"), user.Sign(msg)) {
				t.Fatal("signature verifies for another message")
			}
		})
	}
}

func mustGenerate[R Role](t *testing.T) *Key[R] {
	t.Helper()
	k, err := Generate[R]()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// spoilLast changes the last character of an encoded key, breaking its
// checksum while keeping it valid base32.
func spoilLast(s string) string {
	last := s[len(s)-1]
	repl := byte('A')
	if last == 'A' {
		repl = 'B'
	}
	return s[:len(s)-1] + string(repl)
}

// WriteSecretFile syncs the directory after the rename (review M2: without
// it a power cut can undo the rename of a file saved "before" a single-use
// key is spent), and a failure to sync is an error the caller sees.
func TestWriteSecretFileSyncsTheDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	path := filepath.Join(dir, "identity.json")
	var synced []string
	syncDirHook = func(d string) error {
		// By the time the directory is synced, the rename has happened.
		if b, err := os.ReadFile(path); err != nil || string(b) != "new" {
			t.Errorf("directory synced before the rename: %q %v", b, err)
		}
		synced = append(synced, d)
		return syncDir(d)
	}
	t.Cleanup(func() { syncDirHook = syncDir })
	if err := WriteSecretFile(path, []byte("new")); err != nil {
		t.Fatal(err)
	}
	if len(synced) != 1 || synced[0] != dir {
		t.Errorf("directories synced: %v, want [%s]", synced, dir)
	}
	syncDirHook = func(string) error { return errors.New("disk on fire") }
	if err := WriteSecretFile(path, []byte("new")); err == nil || !strings.Contains(err.Error(), "disk on fire") {
		t.Errorf("a failed directory sync: %v", err)
	}
	if err := syncDir(dir); err != nil {
		t.Errorf("syncDir on a real directory: %v", err)
	}
	if err := syncDir(filepath.Join(dir, "missing")); err == nil && runtime.GOOS != "windows" {
		t.Error("syncDir on a missing directory succeeded")
	}
}
