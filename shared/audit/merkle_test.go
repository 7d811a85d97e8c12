package audit_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"testing"

	"agentmesh.dev/mesh/shared/audit"
	"agentmesh.dev/mesh/shared/keys"
)

// The reference below is RFC 6962 §2.1 written out as the RFC states it,
// independently of transparency-dev/merkle:
//
//	MTH({}) = SHA-256()
//	MTH({d(0)}) = SHA-256(0x00 || d(0))
//	MTH(D[n]) = SHA-256(0x01 || MTH(D[0:k]) || MTH(D[k:n])), k the largest power of two < n
//
// and §2.1.1's audit path:
//
//	PATH(0, {d(0)}) = {}
//	PATH(m, D[n]) = PATH(m, D[0:k]) : MTH(D[k:n])     for m < k
//	PATH(m, D[n]) = PATH(m - k, D[k:n]) : MTH(D[0:k]) for m >= k

func refMTH(d [][]byte) []byte {
	switch n := len(d); n {
	case 0:
		s := sha256.Sum256(nil)
		return s[:]
	case 1:
		s := sha256.Sum256(append([]byte{0}, d[0]...))
		return s[:]
	default:
		k := largestPowerOfTwoBelow(n)
		b := append([]byte{1}, refMTH(d[:k])...)
		s := sha256.Sum256(append(b, refMTH(d[k:])...))
		return s[:]
	}
}

func refPath(m int, d [][]byte) [][]byte {
	n := len(d)
	if n <= 1 {
		return nil
	}
	k := largestPowerOfTwoBelow(n)
	if m < k {
		return append(refPath(m, d[:k]), refMTH(d[k:]))
	}
	return append(refPath(m-k, d[k:]), refMTH(d[:k]))
}

func largestPowerOfTwoBelow(n int) int {
	k := 1
	for k<<1 < n {
		k <<= 1
	}
	return k
}

// heads makes n heads sorted by agent.
func heads(t testing.TB, n int) []audit.Head {
	t.Helper()
	agents := make([]string, n)
	for i := range agents {
		k, err := keys.Generate[keys.AgentRole]()
		if err != nil {
			t.Fatal(err)
		}
		agents[i] = k.Public()
	}
	slices.Sort(agents)
	out := make([]audit.Head, n)
	for i, a := range agents {
		sum := sha256.Sum256([]byte(a))
		out[i] = audit.Head{Agent: a, Seq: int64(i*7 + 1), Hash: hex.EncodeToString(sum[:])}
	}
	return out
}

func TestTreeMatchesRFC6962Reference(t *testing.T) {
	for _, n := range []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 31, 33, 100} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			hs := heads(t, n)
			leaves := make([][]byte, n)
			for i, h := range hs {
				d, err := audit.LeafData(h)
				if err != nil {
					t.Fatal(err)
				}
				leaves[i] = d
			}
			tree, err := audit.NewTree(hs)
			if err != nil {
				t.Fatal(err)
			}
			if want := hex.EncodeToString(refMTH(leaves)); tree.Root() != want {
				t.Fatalf("root %s, the reference says %s", tree.Root(), want)
			}
			proofs, err := tree.Proofs("2026-01-02")
			if err != nil {
				t.Fatal(err)
			}
			for i, p := range proofs {
				ref := refPath(i, leaves)
				if len(ref) != len(p.Path) {
					t.Fatalf("leaf %d: path of %d nodes, the reference has %d", i, len(p.Path), len(ref))
				}
				for j := range ref {
					if hex.EncodeToString(ref[j]) != p.Path[j] {
						t.Fatalf("leaf %d: node %d differs from the reference", i, j)
					}
				}
				if err := p.Verify(tree.Root()); err != nil {
					t.Fatalf("leaf %d: %v", i, err)
				}
				if len(p.Path) > 0 {
					bad := p
					bad.Path = append([]string(nil), p.Path...)
					bad.Path[0] = flipHex(bad.Path[0])
					if bad.Verify(tree.Root()) == nil {
						t.Fatalf("leaf %d: a changed node still verifies", i)
					}
				}
				other := p
				other.Seq++
				if other.Verify(tree.Root()) == nil {
					t.Fatalf("leaf %d: another head verifies", i)
				}
			}
		})
	}
}

// The leaf is the canonical JSON of the head, keys sorted.
func TestLeafData(t *testing.T) {
	h := audit.Head{Agent: "UA", Seq: 3, Hash: "ab"}
	d, err := audit.LeafData(h)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"agent":"UA","hash":"ab","seq":3}`; string(d) != want {
		t.Fatalf("leaf %s, want %s", d, want)
	}
}

func TestTreeRefusesUnsortedHeads(t *testing.T) {
	hs := heads(t, 3)
	hs[0], hs[1] = hs[1], hs[0]
	if _, err := audit.NewTree(hs); !errors.Is(err, audit.ErrHeadsOrder) {
		t.Fatalf("err = %v", err)
	}
	hs = heads(t, 2)
	hs[1].Agent = hs[0].Agent
	if _, err := audit.NewTree(hs); !errors.Is(err, audit.ErrHeadsOrder) {
		t.Fatalf("duplicate agent: err = %v", err)
	}
}

// flipHex changes the first hex digit of s.
func flipHex(s string) string {
	c := byte('0')
	if s[0] == '0' {
		c = '1'
	}
	return string(c) + s[1:]
}
