package keys_test

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/nats-io/nkeys"

	"agentmesh.dev/mesh/shared/keys"
)

// agentFromSeed is the agent key of a raw 32-byte Ed25519 seed.
func agentFromSeed(t testing.TB, seed []byte) *keys.Agent {
	t.Helper()
	s, err := nkeys.EncodeSeed(nkeys.PrefixByteUser, seed)
	if err != nil {
		t.Fatal(err)
	}
	k, err := keys.FromSeed[keys.AgentRole](s)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// signsLikeStdlib checks that the key signs msg with exactly the bytes
// crypto/ed25519 gives, under every setting of the seam.
func signsLikeStdlib(t testing.TB, seed, msg []byte) {
	t.Helper()
	want := ed25519.Sign(ed25519.NewKeyFromSeed(seed), msg)
	k := agentFromSeed(t, seed)
	for _, v := range []keys.Verifier{keys.Voi, keys.StdLib, keys.Compare} {
		prev := keys.SetVerifier(v)
		got := k.Sign(msg)
		keys.SetVerifier(prev)
		if !bytes.Equal(got, want) {
			t.Fatalf("%v: signature of %d bytes by %x differs from crypto/ed25519's:\n got %x\nwant %x", v, len(msg), seed, got, want)
		}
	}
}

// Ed25519 signing is deterministic, so the fast signer must give the
// standard library's bytes: on the 128 sign.input vectors (whose expected
// signatures are checked too) and on random keys and messages of 0 to
// 4,096 bytes.
func TestSignMatchesStdlib(t *testing.T) {
	sc := bufio.NewScanner(bytes.NewReader(readGzip(t, "sign.input.gz")))
	sc.Buffer(nil, 1<<20)
	n := 0
	for sc.Scan() {
		p := strings.Split(sc.Text(), ":")
		seed, msg, sig := unhex(t, p[0])[:ed25519.SeedSize], unhex(t, p[2]), unhex(t, p[3])[:ed25519.SignatureSize]
		if got := agentFromSeed(t, seed).Sign(msg); !bytes.Equal(got, sig) {
			t.Fatalf("sign.input/%d: %x, want %x", n+1, got, sig)
		}
		signsLikeStdlib(t, seed, msg)
		n++
	}
	if n != 128 {
		t.Fatalf("read %d sign.input vectors, want 128", n)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 1000 {
		seed, msg := make([]byte, ed25519.SeedSize), make([]byte, r.IntN(4097))
		for i := range seed {
			seed[i] = byte(r.Uint32())
		}
		for i := range msg {
			msg[i] = byte(r.Uint32())
		}
		signsLikeStdlib(t, seed, msg)
	}
}

func FuzzSign(f *testing.F) {
	f.Add(make([]byte, ed25519.SeedSize), []byte{})
	f.Add(bytes.Repeat([]byte{0xff}, ed25519.SeedSize), []byte("agentmesh-envelope-v1\n{}"))
	f.Fuzz(func(t *testing.T, seed, msg []byte) {
		if len(seed) != ed25519.SeedSize {
			return
		}
		signsLikeStdlib(t, seed, msg)
	})
}

func BenchmarkSign(b *testing.B) {
	k, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		b.Fatal(err)
	}
	msg := bytes.Repeat([]byte("agentmesh "), 60)
	for _, v := range []keys.Verifier{keys.StdLib, keys.Voi} {
		b.Run(v.String(), func(b *testing.B) {
			useVerifier(b, v)
			b.ReportAllocs()
			for b.Loop() {
				k.Sign(msg)
			}
		})
	}
}

// The nkeys pair handed to the JWT library signs through the same fast
// signer, with nkeys's own bytes.
func TestNKeySignsLikeNkeys(t *testing.T) {
	k, err := keys.Generate[keys.AccountRole]()
	if err != nil {
		t.Fatal(err)
	}
	ref, err := nkeys.FromSeed(k.Seed())
	if err != nil {
		t.Fatal(err)
	}
	msg := []byte("a jwt header.a jwt payload")
	got, err := k.NKey().Sign(msg)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := ref.Sign(msg)
	if !bytes.Equal(got, want) {
		t.Fatalf("NKey().Sign = %x, nkeys = %x", got, want)
	}
	if pub, _ := k.NKey().PublicKey(); pub != k.Public() {
		t.Fatalf("NKey().PublicKey = %s", pub)
	}
}
