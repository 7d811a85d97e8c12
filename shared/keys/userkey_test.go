package keys_test

import (
	"encoding/base32"
	"encoding/binary"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"

	"agentmesh.dev/mesh/shared/keys"
)

// nkeysIsUserPublicKey is IsUserPublicKey as it was, on nkeys: the
// reference the allocation-free check is held to.
func nkeysIsUserPublicKey(s string) bool {
	return len(s) == 56 && s[0] == 'U' && nkeys.IsValidPublicUserKey(s)
}

const b32Alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"

// userKeyInputs are valid user keys, each corrupted at every position by
// characters in and out of the alphabet, other kinds of keys and seeds,
// wrong lengths, random strings, and 56-character strings with line breaks
// that the base32 decoder skips (some hiding a valid shorter key).
func userKeyInputs(t testing.TB) []string {
	t.Helper()
	r := rand.New(rand.NewPCG(1, 2))
	var in []string
	for range 8 {
		k, err := keys.Generate[keys.AgentRole]()
		if err != nil {
			t.Fatal(err)
		}
		pub := k.Public()
		in = append(in, pub, pub[:55], pub+"A", strings.ToLower(pub), " "+pub[1:], pub[:55]+"=")
		for i := range len(pub) {
			for _, c := range []byte(b32Alphabet + "018=a\n\r\x00\xff ") {
				b := []byte(pub)
				b[i] = c
				in = append(in, string(b))
			}
		}
		seed := k.Seed()
		in = append(in, string(seed), string(seed[1:57]))
	}
	for _, role := range []func() (string, error){
		func() (string, error) { k, err := keys.Generate[keys.OperatorRole](); return k.Public(), err },
		func() (string, error) { k, err := keys.Generate[keys.AccountRole](); return k.Public(), err },
	} {
		pub, err := role()
		if err != nil {
			t.Fatal(err)
		}
		in = append(in, pub, "U"+pub[1:])
	}
	// Random keys with a correct checksum under any prefix byte.
	for range 2000 {
		raw := make([]byte, 33, 35)
		for i := range raw {
			raw[i] = byte(r.UintN(256))
		}
		if r.IntN(2) == 0 {
			raw[0] = byte(nkeys.PrefixByteUser) | raw[0]&7
		}
		raw = binary.LittleEndian.AppendUint16(raw, crc16(raw))
		s := base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(raw)
		in = append(in, s)
	}
	// Random strings over the alphabet and over all bytes.
	for range 2000 {
		b := make([]byte, 56)
		b[0] = 'U'
		for i := 1; i < len(b); i++ {
			if r.IntN(4) == 0 {
				b[i] = byte(r.UintN(256))
			} else {
				b[i] = b32Alphabet[r.IntN(32)]
			}
		}
		in = append(in, string(b))
	}
	// A shorter user key (31 key bytes, 55 characters) with a line break
	// inserted: 56 characters that nkeys decodes, checksum and all.
	for range 50 {
		raw := make([]byte, 32, 34)
		raw[0] = byte(nkeys.PrefixByteUser)
		for i := 1; i < len(raw); i++ {
			raw[i] = byte(r.UintN(256))
		}
		raw = binary.LittleEndian.AppendUint16(raw, crc16(raw))
		s := base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(raw)
		at := 1 + r.IntN(len(s)-1)
		for _, br := range []string{"\n", "\r"} {
			in = append(in, s[:at]+br+s[at:])
		}
	}
	return in
}

// crc16 is CRC-16/XMODEM, bit by bit (independent of the table the package
// uses).
func crc16(data []byte) uint16 {
	var crc uint16
	for _, b := range data {
		crc ^= uint16(b) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

func TestIsUserPublicKeyMatchesNkeys(t *testing.T) {
	valid, hidden := 0, 0
	for _, s := range userKeyInputs(t) {
		want := nkeysIsUserPublicKey(s)
		if got := keys.IsUserPublicKey(s); got != want {
			t.Fatalf("IsUserPublicKey(%q) = %v, nkeys says %v", s, got, want)
		}
		if want {
			valid++
			if strings.ContainsAny(s, "\r\n") {
				hidden++
			}
		}
	}
	if valid < 100 || hidden == 0 {
		t.Fatalf("%d valid inputs, %d with line breaks: the inputs do not exercise both answers", valid, hidden)
	}
}

func TestIsUserPublicKeyAllocatesNothing(t *testing.T) {
	k, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		t.Fatal(err)
	}
	pub := k.Public()
	// The last character changed: its checksum no longer holds. (Always
	// "A" would be the key itself when it already ends in "A".)
	last := "A"
	if pub[55] == 'A' {
		last = "B"
	}
	bad := pub[:55] + last
	if n := testing.AllocsPerRun(100, func() {
		if !keys.IsUserPublicKey(pub) || keys.IsUserPublicKey(bad) {
			t.Fatal("wrong answer")
		}
	}); n != 0 {
		t.Fatalf("IsUserPublicKey allocates %v times per call", n)
	}
}

func FuzzIsUserPublicKey(f *testing.F) {
	for i, s := range userKeyInputs(f) {
		if i%7 == 0 {
			f.Add(s)
		}
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := keys.IsUserPublicKey(s), nkeysIsUserPublicKey(s); got != want {
			t.Fatalf("IsUserPublicKey(%q) = %v, nkeys says %v", s, got, want)
		}
	})
}

func BenchmarkIsUserPublicKey(b *testing.B) {
	k, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		b.Fatal(err)
	}
	pub := k.Public()
	b.Run("this", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			keys.IsUserPublicKey(pub)
		}
	})
	b.Run("nkeys", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			nkeysIsUserPublicKey(pub)
		}
	})
}
