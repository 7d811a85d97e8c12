package keys_test

// The differential test of the verification seam: every path behind
// keys.Verify (voi without and with a kept expansion, through a KeyCache)
// must accept exactly what crypto/ed25519.Verify accepts. The cases are the
// edge-case corpora voi ships (testdata/voi), the signatures the project's
// own conformance vectors check, random signatures, and systematic
// corruptions of all of them. The counts pinned per source keep the table
// from silently shrinking into a test that asserts nothing.

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/ed25519"
	"crypto/sha512"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"

	"agentmesh.dev/mesh/conformance/vectors"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// vcase is one (public key, message, signature) triple.
type vcase struct {
	name          string
	pub, msg, sig []byte
	// expect, when set, is the verdict the vector file gives for the
	// standard library's rules; it checks that the file was read right.
	expect *bool
}

// useVerifier selects v for the rest of the test. Tests never rely on the
// default: MESH_ED25519_VERIFIER may be set in the environment.
func useVerifier(t testing.TB, v keys.Verifier) {
	prev := keys.SetVerifier(v)
	t.Cleanup(func() { keys.SetVerifier(prev) })
}

// reference is crypto/ed25519's answer; a key that is not 32 bytes (which
// would make it panic) verifies nothing.
func reference(c vcase) bool {
	return len(c.pub) == ed25519.PublicKeySize && ed25519.Verify(c.pub, c.msg, c.sig)
}

// userKey is pub in nkeys user form, whatever its 32 bytes are.
func userKey(t testing.TB, pub []byte) string {
	t.Helper()
	u, err := nkeys.Encode(nkeys.PrefixByteUser, pub)
	if err != nil {
		t.Fatalf("encode %x: %v", pub, err)
	}
	return string(u)
}

// agree checks c on every voi path against the reference and returns the
// reference's answer. The verifier must be Voi. cache is shared across
// cases, so an expansion made for one case serves later ones with the same
// key and other messages and signatures.
func agree(t testing.TB, cache *keys.KeyCache, c vcase) bool {
	t.Helper()
	want := reference(c)
	type answer struct {
		path string
		ok   bool
	}
	got := []answer{{"keys.Verify", keys.Verify(c.pub, c.msg, c.sig)}}
	vk, err := keys.NewVerifyingKey(c.pub)
	switch {
	case len(c.pub) != ed25519.PublicKeySize:
		if err == nil {
			t.Errorf("%s: NewVerifyingKey accepted a %d-byte key", c.name, len(c.pub))
		}
	case err != nil:
		t.Errorf("%s: NewVerifyingKey(%x): %v", c.name, c.pub, err)
	default:
		got = append(got,
			answer{"VerifyingKey first use", vk.Verify(c.msg, c.sig)},
			answer{"VerifyingKey expanded", vk.Verify(c.msg, c.sig)})
		k, err := cache.Get(userKey(t, c.pub))
		if err != nil {
			t.Fatalf("%s: KeyCache.Get: %v", c.name, err)
		}
		if !bytes.Equal(k.PublicKey(), c.pub) {
			t.Fatalf("%s: KeyCache.Get gave key %x for %x", c.name, k.PublicKey(), c.pub)
		}
		got = append(got, answer{"KeyCache", k.Verify(c.msg, c.sig)})
	}
	for _, g := range got {
		if g.ok != want {
			t.Errorf("%s: %s says %v, crypto/ed25519 says %v\n pub %x\n sig %x\n msg %x",
				c.name, g.path, g.ok, want, c.pub, c.sig, c.msg)
		}
	}
	return want
}

// count is how many cases a source has and how many of them verify.
type count struct{ cases, accepted int }

func (c count) String() string { return fmt.Sprintf("%d cases, %d accepted", c.cases, c.accepted) }

// run checks cases and their corruptions, returning both counts.
func run(t testing.TB, cache *keys.KeyCache, cases []vcase) (plain, corrupted count) {
	t.Helper()
	for _, c := range cases {
		plain.cases++
		if c.expect != nil && reference(c) != *c.expect {
			t.Errorf("%s: crypto/ed25519 says %v, the vector file %v", c.name, reference(c), *c.expect)
		}
		if agree(t, cache, c) {
			plain.accepted++
		}
		for _, m := range corruptions(c) {
			corrupted.cases++
			if agree(t, cache, m) {
				corrupted.accepted++
			}
		}
	}
	return plain, corrupted
}

// groupOrder is L = 2^252 + 27742317777372353535851937790883648493,
// little-endian.
var groupOrder = [32]byte{
	0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9, 0xde, 0x14,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
}

// addOrder returns s + L as 32 little-endian bytes, or false when the sum
// needs a 33rd byte. s + L is the same scalar as s, encoded non-canonically.
func addOrder(s []byte) ([]byte, bool) {
	out := make([]byte, 32)
	carry := 0
	for i := range 32 {
		v := int(s[i]) + int(groupOrder[i]) + carry
		out[i], carry = byte(v), v>>8
	}
	return out, carry == 0
}

// corruptions are variations of c that a verifier must judge exactly as the
// reference does: almost all are invalid, and some (a non-canonical S, a
// flipped sign bit on a small-order key) are where implementations differ.
func corruptions(c vcase) []vcase {
	var out []vcase
	add := func(what string, pub, msg, sig []byte) {
		out = append(out, vcase{c.name + "/" + what, pub, msg, sig, nil})
	}
	flip := func(b []byte, i int, bit uint) []byte {
		b = bytes.Clone(b)
		b[i] ^= 1 << bit
		return b
	}
	if len(c.sig) == ed25519.SignatureSize {
		for _, f := range []struct {
			byte int
			bit  uint
		}{{0, 0}, {31, 7}, {32, 0}, {63, 4}, {63, 5}, {63, 7}} {
			add(fmt.Sprintf("sig[%d]^%d", f.byte, 1<<f.bit), c.pub, c.msg, flip(c.sig, f.byte, f.bit))
		}
		if s, ok := addOrder(c.sig[32:]); ok {
			add("S+L", c.pub, c.msg, append(bytes.Clone(c.sig[:32]), s...))
		}
		add("S=L", c.pub, c.msg, append(bytes.Clone(c.sig[:32]), groupOrder[:]...))
		add("sig[:63]", c.pub, c.msg, c.sig[:63])
		add("sig+0", c.pub, c.msg, append(bytes.Clone(c.sig), 0))
	}
	add("no sig", c.pub, c.msg, nil)
	if len(c.msg) > 0 {
		add("msg[0]^1", c.pub, flip(c.msg, 0, 0), c.sig)
		add("msg[:n-1]", c.pub, c.msg[:len(c.msg)-1], c.sig)
	}
	add("msg+0", c.pub, append(bytes.Clone(c.msg), 0), c.sig)
	if len(c.pub) == ed25519.PublicKeySize {
		add("pub[0]^1", flip(c.pub, 0, 0), c.msg, c.sig)
		add("pub[31]^128", flip(c.pub, 31, 7), c.msg, c.sig) // the sign of x
		add("pub[:31]", c.pub[:31], c.msg, c.sig)
	}
	return out
}

// ---- the sources ----

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("bad hex %q: %v", s, err)
	}
	return b
}

func readGzip(t testing.TB, name string) []byte {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "voi", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(zr); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return buf.Bytes()
}

func decodeJSON(t testing.TB, name string, v any) {
	t.Helper()
	if err := json.Unmarshal(readGzip(t, name), v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

// wellFormed fails t unless every case has a 32-byte key, as every case of
// the sources does: a key field that did not parse would otherwise turn a
// vector into a trivially refused one.
func wellFormed(t testing.TB, cases []vcase) []vcase {
	t.Helper()
	for _, c := range cases {
		if len(c.pub) != ed25519.PublicKeySize {
			t.Fatalf("%s: a %d-byte key", c.name, len(c.pub))
		}
	}
	return cases
}

// speccheckStdLib is the standard library's verdict on each speccheck case,
// as voi's tests and the paper's table give it.
var speccheckStdLib = []bool{
	true,  // 0: small order A, small order R
	true,  // 1: small order A, mixed order R
	true,  // 2: mixed order A, small order R
	true,  // 3: mixed order A, mixed order R
	false, // 4: only a cofactored verifier accepts it
	false, // 5: only a cofactored verifier accepts it (8(hA))
	false, // 6: non-canonical S (S > L)
	false, // 7: non-canonical S (S >> L)
	false, // 8: non-canonical small order R, accepted if R is reduced before hashing
	false, // 9: non-canonical small order R, accepted if R is not reduced before hashing
	false, // 10: non-canonical small order A, accepted if A is reduced before hashing
	true,  // 11: non-canonical small order A hashed as sent
}

// speccheckCases are the 12 cases of "Taming the many EdDSAs".
func speccheckCases(t testing.TB) []vcase {
	var vs []struct {
		Message   string `json:"message"`
		PubKey    string `json:"pub_key"`
		Signature string `json:"signature"`
	}
	decodeJSON(t, "speccheck_cases.json.gz", &vs)
	var out []vcase
	for i, v := range vs {
		out = append(out, vcase{fmt.Sprintf("speccheck/%d", i), unhex(t, v.PubKey), unhex(t, v.Message), unhex(t, v.Signature), &speccheckStdLib[i]})
	}
	return out
}

// zip215Cases are the ZIP-215 vectors, all over the message "Zcash".
func zip215Cases(t testing.TB) []vcase {
	var vs [][2]string
	decodeJSON(t, "zip215.json.gz", &vs)
	var out []vcase
	for i, v := range vs {
		out = append(out, vcase{fmt.Sprintf("zip215/%d", i), unhex(t, v[0]), []byte("Zcash"), unhex(t, v[1]), nil})
	}
	return out
}

// wycheproofCases are Project Wycheproof's Ed25519 verification tests.
func wycheproofCases(t testing.TB) []vcase {
	var doc struct {
		NumberOfTests int
		TestGroups    []struct {
			Key   struct{ PK string }
			Tests []struct {
				TcID     int
				Msg, Sig string
				Result   string
			}
		}
	}
	decodeJSON(t, "eddsa_test.json.gz", &doc)
	var out []vcase
	for _, g := range doc.TestGroups {
		for _, tc := range g.Tests {
			valid := tc.Result == "valid"
			out = append(out, vcase{fmt.Sprintf("wycheproof/%d(%s)", tc.TcID, tc.Result), unhex(t, g.Key.PK), unhex(t, tc.Msg), unhex(t, tc.Sig), &valid})
		}
	}
	if len(out) != doc.NumberOfTests {
		t.Fatalf("wycheproof: read %d tests, the file says %d", len(out), doc.NumberOfTests)
	}
	return out
}

// ed25519vectorsCases are the point edge cases of C2SP's ed25519vectors.
func ed25519vectorsCases(t testing.TB) []vcase {
	var vs []struct {
		A, R, S, M string
		Flags      []string
	}
	decodeJSON(t, "ed25519vectors.json.gz", &vs)
	var out []vcase
	for i, v := range vs {
		// The standard library's rules by the file's flags (as voi's own
		// test reads them): small-order A and R and a non-canonical A are
		// accepted; a non-canonical R, and a signature that only the
		// cofactored equation accepts ("LowOrderResidue"), are not.
		valid := !slices.Contains(v.Flags, "NonCanonicalR") && !slices.Contains(v.Flags, "LowOrderResidue")
		sig := append(unhex(t, v.R), unhex(t, v.S)...)
		out = append(out, vcase{fmt.Sprintf("ed25519vectors/%d%v", i, v.Flags), unhex(t, v.A), []byte(v.M), sig, &valid})
	}
	return out
}

// signInputCases are lines of the reference implementation's sign.input:
// seed+pub : pub : msg : sig+msg.
func signInputCases(t testing.TB) []vcase {
	var out []vcase
	valid := true
	sc := bufio.NewScanner(bytes.NewReader(readGzip(t, "sign.input.gz")))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		p := strings.Split(sc.Text(), ":")
		if len(p) != 5 {
			t.Fatalf("sign.input line %d has %d fields", len(out)+1, len(p))
		}
		out = append(out, vcase{fmt.Sprintf("sign.input/%d", len(out)+1), unhex(t, p[1]), unhex(t, p[2]), unhex(t, p[3])[:ed25519.SignatureSize], &valid})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// randomCases are signatures by fresh keys over messages of 0 to 2,048
// bytes (600 bytes, an envelope's size, among them), from a fixed seed.
func randomCases(n int) []vcase {
	rng := rand.New(rand.NewChaCha8([32]byte{'m', 'e', 's', 'h'}))
	var out []vcase
	for i := range n {
		var seed [32]byte
		for j := range seed {
			seed[j] = byte(rng.Uint32())
		}
		priv := ed25519.NewKeyFromSeed(seed[:])
		size := rng.IntN(2049)
		if i%4 == 0 {
			size = 600
		}
		msg := make([]byte, size)
		for j := range msg {
			msg[j] = byte(rng.Uint32())
		}
		out = append(out, vcase{fmt.Sprintf("random/%d", i), priv.Public().(ed25519.PublicKey), msg, ed25519.Sign(priv, msg), nil})
	}
	return out
}

// smallOrderPoints are the encodings of the eight points of small order,
// then non-canonical encodings of some of them (y ≥ p, or x = 0 with the
// sign bit set).
var smallOrderPoints = []string{
	"0100000000000000000000000000000000000000000000000000000000000000", // identity
	"ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f", // order 2
	"0000000000000000000000000000000000000000000000000000000000000000", // order 4
	"0000000000000000000000000000000000000000000000000000000000000080",
	"26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05", // order 8
	"26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85",
	"c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
	"c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa",
	"0100000000000000000000000000000000000000000000000000000000000080", // identity, x = -0
	"ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff", // order 2, x = -0
	"eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f", // y = p+1
	"eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
	"edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f", // y = p
	"edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
}

// smallOrderCases combine every small-order A with every small-order R, a
// zero, one or non-canonical S, and three messages: the signatures that
// cofactorless and cofactored verifiers, and strict and lax decoders,
// judge differently.
func smallOrderCases(t testing.TB) []vcase {
	long := bytes.Repeat([]byte("0123456789"), 60)
	var out []vcase
	for ai, a := range smallOrderPoints {
		for ri, r := range smallOrderPoints {
			for si, s := range [][]byte{make([]byte, 32), append([]byte{1}, make([]byte, 31)...), groupOrder[:]} {
				for mi, m := range [][]byte{nil, []byte("agentmesh"), long} {
					out = append(out, vcase{fmt.Sprintf("small-order/A%d/R%d/S%d/m%d", ai, ri, si, mi),
						unhex(t, a), m, append(unhex(t, r), s...), nil})
				}
			}
		}
	}
	return out
}

// conformanceDir is where the project's conformance fixtures live, as the
// conformance runner's own test finds them.
func conformanceDir() string {
	if d := os.Getenv("MESH_CONFORMANCE_DIR"); d != "" {
		return d
	}
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "shared", "conformance")
}

// projectCases are the signatures the project's own code checks: every
// fixture the conformance runner verifies (envelopes, vouches, rosters,
// room descriptors, allowances, agreements, manifest key claims and the
// refusals around them) and the protocol package's golden envelope. They
// are collected by running that code under the Compare verifier, which
// hands each (key, message, signature) it checks to a hook.
func projectCases(t testing.TB) (cases []vcase, fixtures bool) {
	t.Helper()
	useVerifier(t, keys.Compare)
	seen := map[string]bool{}
	var out []vcase
	var source string
	remove := keys.SetCompareHook(func(pub, msg, sig []byte) {
		id := string(pub) + string(sig) + string(msg)
		if !seen[id] {
			seen[id] = true
			// msg sits in a pooled buffer that is reused after the call.
			out = append(out, vcase{fmt.Sprintf("%s/%d", source, len(out)), bytes.Clone(pub), bytes.Clone(msg), bytes.Clone(sig), nil})
		}
	})
	defer remove()

	source = "protocol/envelope.golden"
	golden, err := os.ReadFile(filepath.Join("..", "protocol", "testdata", "envelope.golden"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := protocol.Decode(bytes.TrimSpace(golden)); err != nil {
		t.Fatalf("envelope.golden: %v", err)
	}

	dir := conformanceDir()
	if _, err := os.Stat(dir); err != nil {
		t.Logf("conformance fixtures not found at %s (set MESH_CONFORMANCE_DIR); only the golden envelope is used", dir)
		return out, false
	}
	source = "conformance"
	r, err := vectors.Run(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK() {
		t.Fatalf("the conformance run fails (see conformance/vectors); its signatures cannot serve as vectors")
	}
	return out, true
}

// TestVerifyAgreesWithStdlib is the differential test: on every case of
// every source and every corruption of each, each path of the voi verifier
// answers what crypto/ed25519.Verify answers.
func TestVerifyAgreesWithStdlib(t *testing.T) {
	project, fixtures := projectCases(t) // runs under Compare; collect before switching
	projectCount := count{1, 1}          // the golden envelope alone
	if fixtures {
		projectCount = count{42, 26}
	}
	useVerifier(t, keys.Voi)
	cache := keys.NewKeyCache(0)
	tests := []struct {
		name           string
		cases          []vcase
		plain, corrupt count
		atLeast        bool // the source lies outside the repository and may grow
	}{
		// Accepted counts are the standard library's, and each file's own
		// verdicts (speccheck's table, Wycheproof's results, the
		// ed25519vectors flags) are checked case by case in run. Corrupted
		// cases that still verify are real: a small-order key with the
		// identity as R verifies any message, flipping the sign bit of a
		// point with x = 0 leaves it the same point, and Wycheproof's
		// over-long signatures verify once truncated.
		//
		// speccheck: 0-3 and 11 (small-order A and R, a non-canonical A
		// hashed as sent); not the cofactored-only 4-5, the non-canonical
		// S of 6-7 or R of 8-9, nor 10.
		{"speccheck", wellFormed(t, speccheckCases(t)), count{12, 5}, count{204, 8}, false},
		// ZIP-215 vectors are for a cofactored verifier that takes
		// non-canonical R; the standard library refuses most.
		{"zip215", wellFormed(t, zip215Cases(t)), count{196, 12}, count{3332, 77}, false},
		{"wycheproof", wellFormed(t, wycheproofCases(t)), count{145, 84}, count{2337, 2}, false},
		{"ed25519vectors", wellFormed(t, ed25519vectorsCases(t)), count{768, 198}, count{13056, 273}, false},
		{"sign.input", wellFormed(t, signInputCases(t)), count{128, 128}, count{2174, 0}, false},
		{"random", wellFormed(t, randomCases(256)), count{256, 256}, count{4352, 0}, false},
		{"small-order", wellFormed(t, smallOrderCases(t)), count{1764, 49}, count{28812, 309}, false},
		{"project", wellFormed(t, project), projectCount, count{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			plain, corrupt := run(t, cache, tc.cases)
			t.Logf("%s: %v; corrupted: %v", tc.name, plain, corrupt)
			if tc.atLeast {
				if plain.cases < tc.plain.cases || plain.accepted < tc.plain.accepted {
					t.Errorf("%s: %v, want at least %v", tc.name, plain, tc.plain)
				}
				return
			}
			if plain != tc.plain || corrupt != tc.corrupt {
				t.Errorf("%s: %v and corrupted %v, want %v and %v", tc.name, plain, corrupt, tc.plain, tc.corrupt)
			}
		})
	}
	if n := cache.Len(); n > 2*keys.DefaultKeyCacheSize {
		t.Errorf("the key cache holds %d keys, more than its bound %d", n, 2*keys.DefaultKeyCacheSize)
	}
}

// TestCompareCountsAndAnswersStdlib: the Compare verifier answers what the
// standard library answers and checks every signature with both; a
// disagreement is counted (and the reference's answer still wins).
func TestCompareCountsAndAnswersStdlib(t *testing.T) {
	useVerifier(t, keys.Compare)
	cases := append(speccheckCases(t), randomCases(8)...)
	cases = append(cases, vcase{"short key", make([]byte, 31), []byte("m"), make([]byte, 64), nil})
	checked0, disagreed0 := keys.CompareCounts()
	var wantChecked uint64
	for _, c := range cases {
		want := reference(c)
		if got := keys.Verify(c.pub, c.msg, c.sig); got != want {
			t.Errorf("%s: Compare keys.Verify = %v, want the reference's %v", c.name, got, want)
		}
		if vk, err := keys.NewVerifyingKey(c.pub); err == nil {
			if got := vk.Verify(c.msg, c.sig); got != want {
				t.Errorf("%s: Compare VerifyingKey = %v, want %v", c.name, got, want)
			}
			wantChecked += 2
		}
	}
	checked, disagreed := keys.CompareCounts()
	if checked-checked0 != wantChecked || disagreed != disagreed0 {
		t.Errorf("Compare counted %d checked and %d disagreements, want %d and 0",
			checked-checked0, disagreed-disagreed0, wantChecked)
	}

	// A disagreement is counted and logged with public material only.
	var logged bytes.Buffer
	prevLog := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logged, nil)))
	defer slog.SetDefault(prevLog)
	c := cases[len(cases)-2] // a random signature, with a message
	keys.Tally(c.pub, c.msg, c.sig, true, false)
	if checked, disagreed := keys.CompareCounts(); checked-checked0 != wantChecked+1 || disagreed-disagreed0 != 1 {
		t.Errorf("after one disagreement: %d checked and %d disagreements, want %d and 1",
			checked-checked0, disagreed-disagreed0, wantChecked+1)
	}
	line := logged.String()
	for _, want := range []string{"level=ERROR", "verifiers disagree", hex.EncodeToString(c.pub), hex.EncodeToString(c.sig),
		fmt.Sprintf("msg_bytes=%d", len(c.msg)), "stdlib=true", "voi=false"} {
		if !strings.Contains(line, want) {
			t.Errorf("the disagreement log lacks %q: %s", want, line)
		}
	}
	if strings.Contains(line, hex.EncodeToString(c.msg[:16])) {
		t.Errorf("the disagreement log shows the message: %s", line)
	}
}

// TestStdLibVerifierIsTheReference: with StdLib selected every path is
// crypto/ed25519 itself.
func TestStdLibVerifierIsTheReference(t *testing.T) {
	useVerifier(t, keys.StdLib)
	for _, c := range speccheckCases(t) {
		want := reference(c)
		vk, err := keys.NewVerifyingKey(c.pub)
		if err != nil {
			t.Fatal(err)
		}
		if keys.Verify(c.pub, c.msg, c.sig) != want || vk.Verify(c.msg, c.sig) != want {
			t.Errorf("%s: StdLib verifier differs from crypto/ed25519 (%v)", c.name, want)
		}
	}
}

func TestSetVerifier(t *testing.T) {
	useVerifier(t, keys.Voi)
	if prev := keys.SetVerifier(keys.StdLib); prev != keys.Voi {
		t.Errorf("SetVerifier returned %v, want the previous voi", prev)
	}
	if keys.CurrentVerifier() != keys.StdLib {
		t.Errorf("CurrentVerifier = %v after SetVerifier(StdLib)", keys.CurrentVerifier())
	}
	if prev := keys.SetVerifier(keys.Compare); prev != keys.StdLib {
		t.Errorf("SetVerifier returned %v, want stdlib", prev)
	}
	for _, v := range []keys.Verifier{keys.Voi, keys.StdLib, keys.Compare} {
		back, err := keys.ParseVerifier(v.String())
		if err != nil || back != v {
			t.Errorf("ParseVerifier(%q) = %v, %v", v.String(), back, err)
		}
	}
	if v, err := keys.ParseVerifier("fast"); err == nil || v != keys.StdLib {
		t.Errorf("ParseVerifier(fast) = %v, %v; want an error and the reference", v, err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("SetVerifier(7) did not panic")
			}
		}()
		keys.SetVerifier(keys.Verifier(7))
	}()
	if keys.CurrentVerifier() != keys.Compare {
		t.Errorf("a refused SetVerifier changed the verifier to %v", keys.CurrentVerifier())
	}
}

// TestVerifierEnv runs this test binary again with MESH_ED25519_VERIFIER
// set, to see what the process starts with.
func TestVerifierEnv(t *testing.T) {
	if os.Getenv("KEYS_TEST_PRINT_VERIFIER") == "1" {
		fmt.Printf("verifier=%s\n", keys.CurrentVerifier())
		return
	}
	tests := []struct{ env, want, warns string }{
		{"", "voi", ""},
		{"voi", "voi", ""},
		{"stdlib", "stdlib", ""},
		{"compare", "compare", ""},
		{"fast", "stdlib", "using the standard library's Ed25519 verifier"},
	}
	for _, tc := range tests {
		cmd := exec.Command(os.Args[0], "-test.run=^TestVerifierEnv$", "-test.count=1")
		cmd.Env = append(os.Environ(), "KEYS_TEST_PRINT_VERIFIER=1", keys.VerifierEnv+"="+tc.env)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s=%q: %v\n%s", keys.VerifierEnv, tc.env, err, out)
		}
		if !strings.Contains(string(out), "verifier="+tc.want+"\n") {
			t.Errorf("%s=%q: want verifier %s, got:\n%s", keys.VerifierEnv, tc.env, tc.want, out)
		}
		if tc.warns != "" && !strings.Contains(string(out), tc.warns) {
			t.Errorf("%s=%q: no warning %q in:\n%s", keys.VerifierEnv, tc.env, tc.warns, out)
		}
	}
}

// TestKeyCacheBound: however many distinct keys arrive, the cache never
// holds more than two generations, and a key in steady use keeps its
// entry (and its expansion) through the turnover.
func TestKeyCacheBound(t *testing.T) {
	useVerifier(t, keys.Voi)
	const size = 8
	c := keys.NewKeyCache(size)
	hot := randomCases(1)[0]
	hotKey := userKey(t, hot.pub)
	first, err := c.Get(hotKey)
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range randomCases(200) {
		if _, err := c.Get(userKey(t, k.pub)); err != nil {
			t.Fatal(err)
		}
		if n := c.Len(); n > 2*size {
			t.Fatalf("after %d keys the cache holds %d, more than 2×%d", i+1, n, size)
		}
		if i%(size/2) == 0 {
			again, err := c.Get(hotKey)
			if err != nil {
				t.Fatal(err)
			}
			if again != first {
				t.Fatalf("after %d other keys the hot key was dropped and rebuilt", i+1)
			}
			if !again.Verify(hot.msg, hot.sig) {
				t.Fatal("the cached hot key no longer verifies its signature")
			}
		}
	}
	if n := c.Len(); n < size || n > 2*size {
		t.Errorf("the cache holds %d keys; want between %d and %d", n, size, 2*size)
	}
	if d := keys.NewKeyCache(0); d == nil {
		t.Fatal("NewKeyCache(0) is nil")
	}
}

// TestKeyCacheConcurrent: goroutines sharing a small cache, through its
// turnover, each get the right key and verify with it (run with -race).
func TestKeyCacheConcurrent(t *testing.T) {
	useVerifier(t, keys.Voi)
	c := keys.NewKeyCache(4)
	cases := randomCases(24)
	names := make([]string, len(cases))
	for i, tc := range cases {
		names[i] = userKey(t, tc.pub)
	}
	done := make(chan error)
	for g := range 4 {
		go func() {
			var err error
			for i := range 3 * len(cases) {
				j := (i * (g + 1)) % len(cases)
				tc := cases[j]
				k, e := c.Get(names[j])
				switch {
				case e != nil:
					err = e
				case !bytes.Equal(k.PublicKey(), tc.pub) || !k.Verify(tc.msg, tc.sig):
					err = fmt.Errorf("%s: wrong key or no verification", tc.name)
				}
				if err != nil {
					break
				}
			}
			done <- err
		}()
	}
	for range 4 {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
	if n := c.Len(); n > 8 {
		t.Errorf("the cache holds %d keys, more than 2×4", n)
	}
}

// TestInvalidKeys: what is not a user public key is an error at the cache
// and is not cached; a key of the wrong length verifies nothing (the
// standard library would panic); 32 bytes that are no curve point make a
// key that verifies nothing.
func TestInvalidKeys(t *testing.T) {
	useVerifier(t, keys.Voi)
	c := keys.NewKeyCache(4)
	account, err := keys.Generate[keys.AccountRole]()
	if err != nil {
		t.Fatal(err)
	}
	agent, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		t.Fatal(err)
	}
	seed := agent.Seed()
	good := agent.Public()
	badSum := good[:55] + map[bool]string{true: "B", false: "A"}[good[55] == 'A']
	for _, s := range []string{"", "U", good[:55], good + "A", strings.ToLower(good), badSum, account.Public(), string(seed), "U" + strings.Repeat("A", 55)} {
		if _, err := c.Get(s); err == nil {
			t.Errorf("KeyCache.Get(%q) accepted it", s)
		}
	}
	if c.Len() != 0 {
		t.Errorf("refused keys were cached: %d entries", c.Len())
	}
	msg := []byte("agentmesh")
	sig := agent.Sign(msg)
	if k, err := keys.UserKeys().Get(good); err != nil || !k.Verify(msg, sig) {
		t.Errorf("the shared cache's key for the agent's own public key does not verify its signature: %v", err)
	}
	for _, n := range []int{0, 31, 33, 64} {
		if keys.Verify(make([]byte, n), msg, sig) {
			t.Errorf("a %d-byte key verified", n)
		}
		if _, err := keys.NewVerifyingKey(make([]byte, n)); err == nil {
			t.Errorf("NewVerifyingKey took %d bytes", n)
		}
	}
	// 2 is not the y of any curve point (x² = (y²−1)/(dy²+1) has no root),
	// which the standard library agrees with by refusing everything.
	notPoint := append([]byte{2}, make([]byte, 31)...)
	vk, err := keys.NewVerifyingKey(notPoint)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range [][]byte{sig, make([]byte, 64)} {
		c := vcase{"not a point", notPoint, msg, s, nil}
		if reference(c) || keys.Verify(notPoint, msg, s) || vk.Verify(msg, s) {
			t.Errorf("a key that is not a curve point verified %x", s)
		}
	}
	// The wrapped key is a copy: changing the caller's slice changes nothing.
	pub := bytes.Clone(agent.PublicKey())
	vk, err = keys.NewVerifyingKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	pub[0] ^= 1
	if !vk.Verify(msg, sig) {
		t.Error("NewVerifyingKey kept the caller's slice")
	}
}

// FuzzVerify: on any input, voi (plain, expanded, through a cache) answers
// what crypto/ed25519 answers, both for the raw (pub, msg, sig) and for a
// valid signature by a key derived from pub with sig XORed into it, which
// keeps the fuzzer near signatures that verify.
func FuzzVerify(f *testing.F) {
	for _, src := range []func(testing.TB) []vcase{speccheckCases, zip215Cases, wycheproofCases, signInputCases} {
		for _, c := range src(f) {
			f.Add(c.pub, c.msg, c.sig)
		}
	}
	for i, c := range ed25519vectorsCases(f) {
		if i%4 == 0 {
			f.Add(c.pub, c.msg, c.sig)
		}
	}
	for i, c := range smallOrderCases(f) {
		if i%37 == 0 {
			f.Add(c.pub, c.msg, c.sig)
		}
	}
	for _, c := range randomCases(16) {
		f.Add(c.pub, c.msg, c.sig)
		f.Add(c.pub, c.msg, []byte(nil)) // the valid signature itself
	}
	cache := keys.NewKeyCache(64)
	f.Fuzz(func(t *testing.T, pub, msg, sig []byte) {
		useVerifier(t, keys.Voi)
		agree(t, cache, vcase{"raw", pub, msg, sig, nil})

		h := sha512.Sum512(pub)
		priv := ed25519.NewKeyFromSeed(h[:32])
		near := vcase{"near-valid", bytes.Clone(priv.Public().(ed25519.PublicKey)), msg, ed25519.Sign(priv, msg), nil}
		for i, b := range sig {
			switch {
			case i < 64:
				near.sig[i] ^= b
			case i < 96:
				near.pub[i-64] ^= b
			}
		}
		untouched := !slices.ContainsFunc(sig[:min(len(sig), 96)], func(b byte) bool { return b != 0 })
		if agree(t, cache, near) != untouched {
			// Only an untouched signature by an untouched key should
			// verify; anything else verifying would be a forgery.
			t.Errorf("near-valid: verified %v with mask %x", reference(near), sig)
		}
	})
}

// BenchmarkVerify compares the implementations on a 600-byte message (an
// envelope's size): the standard library, voi expanding the key on every
// call, voi with the key expanded once, and the decoder's path (a key
// cache lookup by the sender's `U...` string, then the expanded verify).
func BenchmarkVerify(b *testing.B) {
	agent, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		b.Fatal(err)
	}
	msg := bytes.Repeat([]byte("agentmesh "), 60)
	sig := agent.Sign(msg)
	pub := agent.PublicKey()
	check := func(b *testing.B, ok bool) {
		if !ok {
			b.Fatal("verify failed")
		}
	}
	b.Run("stdlib", func(b *testing.B) {
		b.SetBytes(int64(len(msg)))
		b.ReportAllocs()
		for b.Loop() {
			check(b, ed25519.Verify(pub, msg, sig))
		}
	})
	b.Run("voi", func(b *testing.B) {
		useVerifier(b, keys.Voi)
		b.SetBytes(int64(len(msg)))
		b.ReportAllocs()
		for b.Loop() {
			check(b, keys.Verify(pub, msg, sig))
		}
	})
	b.Run("voi_expanded_cached", func(b *testing.B) {
		useVerifier(b, keys.Voi)
		vk, err := keys.NewVerifyingKey(pub)
		if err != nil {
			b.Fatal(err)
		}
		check(b, vk.Verify(msg, sig)) // expand outside the loop
		b.SetBytes(int64(len(msg)))
		b.ReportAllocs()
		for b.Loop() {
			check(b, vk.Verify(msg, sig))
		}
	})
	b.Run("voi_keycache", func(b *testing.B) {
		useVerifier(b, keys.Voi)
		c := keys.NewKeyCache(0)
		from := agent.Public()
		b.SetBytes(int64(len(msg)))
		b.ReportAllocs()
		for b.Loop() {
			k, err := c.Get(from)
			if err != nil {
				b.Fatal(err)
			}
			check(b, k.Verify(msg, sig))
		}
	})
}
