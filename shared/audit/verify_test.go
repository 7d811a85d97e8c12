package audit_test

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/audit"
	"agentmesh.dev/mesh/shared/audit/audittest"
	"agentmesh.dev/mesh/shared/bus/bustest"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// clone copies a bundle through its JSON, as a verifier reads it.
func clone(t testing.TB, b *audit.Bundle) *audit.Bundle {
	t.Helper()
	data, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	c, err := audit.ParseBundle(data)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestVerifyBundle(t *testing.T) {
	f := audittest.NewFixture(t)
	intruder := audittest.NewAuthority(t, "intruder")
	otherKey := bustest.Agent(t)
	b := f.Bundle
	if len(b.Chains) != 3 || len(b.Anchors) != 2 || len(b.Authorities) != 2 || len(b.Proofs) < 4 {
		t.Fatalf("fixture: %d chains, %d anchors, %d authorities, %d proofs", len(b.Chains), len(b.Anchors), len(b.Authorities), len(b.Proofs))
	}
	// A token by another authority over the same document, with the same
	// nonce, put in place of the first stamp of the first anchor.
	digest, err := b.Anchors[0].Document.Digest()
	if err != nil {
		t.Fatal(err)
	}
	nonce, _ := new(big.Int).SetString(b.Anchors[0].Stamps[0].Nonce, 10)
	foreignToken := tokenFrom(t, intruder.Authority, digest, nonce, true)

	cases := []struct {
		name   string
		mutate func(*audit.Bundle)
		trust  audit.Trust
		want   error
		says   string
	}{
		{name: "valid", trust: f.Trust},
		{name: "valid, trusting the bundle's own keys", trust: audit.Trust{}},
		{name: "one changed row", mutate: func(b *audit.Bundle) { b.Chains[0].Rows[1].Outcome = "failed" },
			want: audit.ErrChainLink, says: "row 3 does not link to row 2"},
		{name: "changed last row", mutate: func(b *audit.Bundle) { b.Chains[1].Rows[2].DurationMS++ },
			want: audit.ErrChainHead, says: "its last row is not the head the manifest signs"},
		{name: "removed row", mutate: func(b *audit.Bundle) { b.Chains[0].Rows = b.Chains[0].Rows[1:] },
			want: audit.ErrChainLink, says: "row 1 says it is row 2"},
		{name: "one changed proof node", mutate: func(b *audit.Bundle) { b.Proofs[0].Path[0] = flipHex(b.Proofs[0].Path[0]) },
			want: audit.ErrProof, says: "the inclusion proof does not lead to the root of the anchor of"},
		{name: "proof of a row not shipped", mutate: func(b *audit.Bundle) { b.Proofs[0].Seq = 99 },
			want: audit.ErrProof, says: "the anchored head is not that row as shipped"},
		{name: "a token from another authority", mutate: func(b *audit.Bundle) { b.Anchors[0].Stamps[0].Token = foreignToken },
			want: audit.ErrTokenChain, says: "the token's signer does not chain to the authority's root"},
		{name: "a wrong nonce", mutate: func(b *audit.Bundle) { b.Anchors[0].Stamps[0].Nonce = "12345" },
			want: audit.ErrTokenNonce, says: "the token's nonce differs from the request's"},
		{name: "a changed anchor root", mutate: func(b *audit.Bundle) { b.Anchors[1].Document.Root = flipHex(b.Anchors[1].Document.Root) },
			want: audit.ErrTokenMessage, says: "the token stamps another message"},
		{name: "a token without certificates", mutate: func(b *audit.Bundle) {
			b.Anchors[0].Stamps[0].Token = tokenFrom(t, f.Authorities[0].Authority, digest, nonce, false)
		}, want: audit.ErrTokenNoCertificate, says: "carries no certificate"},
		{name: "an anchor without stamps", mutate: func(b *audit.Bundle) { b.Anchors[0].Stamps = nil },
			want: audit.ErrAnchor, says: "carries 0 timestamps; it needs 2, of distinct authorities"},
		{name: "an anchor with one stamp", mutate: func(b *audit.Bundle) { b.Anchors[0].Stamps = b.Anchors[0].Stamps[:1] },
			want: audit.ErrAnchor, says: "carries 1 timestamps; it needs 2, of distinct authorities"},
		{name: "an anchor with one authority's stamp twice", mutate: func(b *audit.Bundle) { b.Anchors[0].Stamps[1] = b.Anchors[0].Stamps[0] },
			want: audit.ErrAnchor, says: "carries two stamps of authority"},
		{name: "an anchor stamped before its date ended", mutate: func(b *audit.Bundle) {
			// Tomorrow's anchor, stamped now by both authorities: each token
			// is valid, but made before the heads of that date were final.
			restamp(t, f, &b.Anchors[1], time.Now().UTC().AddDate(0, 0, 1).Format(time.DateOnly))
		}, want: audit.ErrStampTime, says: "before the date ended"},
		{name: "the manifest re-signed with another key", mutate: func(b *audit.Bundle) {
			msg, _ := json.Marshal(b.Manifest) // any bytes: the signature is another key's
			b.Signature = base64.RawURLEncoding.EncodeToString(otherKey.Sign(msg))
		}, want: audit.ErrManifestSignature, says: "the manifest's signature does not verify under its signer key"},
		{name: "the manifest re-signed with another key that it names", mutate: func(b *audit.Bundle) {
			if err := b.Sign(otherKey); err != nil {
				t.Fatal(err)
			}
		}, trust: f.Trust, want: audit.ErrManifestSigner, says: "not by the expected export key"},
		{name: "a changed rows digest", mutate: func(b *audit.Bundle) {
			b.Manifest.RowsSHA256 = flipHex(b.Manifest.RowsSHA256)
			if err := b.Sign(f.Signer); err != nil {
				t.Fatal(err)
			}
		}, want: audit.ErrRowsDigest, says: "the digest over the shipped rows"},
		{name: "an untrusted authority", mutate: nil, trust: audit.Trust{Roots: []*x509.Certificate{intruder.Root()}},
			want: audit.ErrAuthority, says: "its root is not among the trusted roots"},
		{name: "an authority not shipped", mutate: func(b *audit.Bundle) { b.Authorities = b.Authorities[:1] },
			want: audit.ErrStamp, says: "which the bundle does not carry"},
		{name: "an anchor not shipped", mutate: func(b *audit.Bundle) { b.Anchors = b.Anchors[1:] },
			want: audit.ErrProof, says: "which the bundle does not carry"},
	}
	messages := map[string]string{}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := clone(t, f.Bundle)
			if c.mutate != nil {
				c.mutate(b)
				b = clone(t, b)
			}
			_, err := audit.Check(b, c.trust)
			if c.want == nil {
				if err != nil {
					t.Fatalf("Check: %v", err)
				}
				return
			}
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("err = %v\nwant %v saying %q", err, c.want, c.says)
			}
			messages[c.name] = err.Error()
		})
	}
	// The five tampers of the issue each fail with their own message.
	seen := map[string]string{}
	for _, name := range []string{"one changed row", "one changed proof node", "a token from another authority", "a wrong nonce", "the manifest re-signed with another key"} {
		m := messages[name]
		if m == "" {
			t.Fatalf("%s: no message", name)
		}
		if other, dup := seen[m]; dup {
			t.Fatalf("%s and %s fail with the same message %q", name, other, m)
		}
		seen[m] = name
	}
}

// restamp moves an anchor document to date and has the fixture's
// authorities stamp it again, each with its stamp's nonce.
func restamp(t testing.TB, f *audittest.Fixture, a *audit.BundleAnchor, date string) {
	t.Helper()
	a.Document.Date = date
	digest, err := a.Document.Digest()
	if err != nil {
		t.Fatal(err)
	}
	for i := range a.Stamps {
		st := &a.Stamps[i]
		nonce, _ := new(big.Int).SetString(st.Nonce, 10)
		for _, au := range f.Authorities {
			if sum := sha256.Sum256(au.Root().Raw); hex.EncodeToString(sum[:]) == st.Authority {
				st.Token = tokenFrom(t, au.Authority, digest, nonce, true)
			}
		}
	}
}

func TestVerifySummary(t *testing.T) {
	f := audittest.NewFixture(t)
	s, err := audit.Check(f.Bundle, f.Trust)
	if err != nil {
		t.Fatal(err)
	}
	// 5 + 3 + 3 rows; every row but the third chain's last is under an
	// anchor; Date1 proves two heads, Date2 two more (the second chain did
	// not move, so its Date1 proof stands).
	// Each anchor's earliest stamp: at or after the end of its date.
	if len(s.Stamped) != 2 || s.Stamped[0].Date != audittest.Date1 || s.Stamped[1].Date != audittest.Date2 {
		t.Fatalf("stamped %+v", s.Stamped)
	}
	for _, st := range s.Stamped {
		day, _ := audit.ParseDate(st.Date)
		if st.Earliest.Before(day.AddDate(0, 0, 1)) {
			t.Fatalf("anchor of %s: earliest stamp %s", st.Date, st.Earliest)
		}
	}
	s.Stamped = nil
	want := audit.Summary{Chains: 3, Rows: 11, AnchoredRows: 10, Anchors: 2, Stamps: 4, Proofs: 4, FirstAnchor: audittest.Date1, LastAnchor: audittest.Date2}
	if !reflect.DeepEqual(s, want) {
		t.Fatalf("summary %+v, want %+v", s, want)
	}
	if f.Bundle.Manifest.Account != "acct-fixture" || f.Bundle.Manifest.Mesh != audittest.Mesh {
		t.Fatalf("manifest %+v", f.Bundle.Manifest)
	}
	for _, a := range f.Bundle.Anchors {
		if a.Document.Heads > 4 || strings.Contains(mustJSON(t, a.Document), f.Agents[0]) {
			t.Fatalf("an anchor document names an agent: %+v", a.Document)
		}
	}
	for _, p := range f.Bundle.Proofs {
		if p.Agent == f.Other {
			t.Fatal("the export carries a proof of an agent it does not export")
		}
	}
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestParseBundleRefuses(t *testing.T) {
	f := audittest.NewFixture(t)
	data := []byte(mustJSON(t, f.Bundle))
	for name, bad := range map[string]string{
		"unknown member":  strings.Replace(string(data), `"v":1,`, `"v":1,"extra":true,`, 1),
		"another version": strings.Replace(string(data), `"v":1,`, `"v":2,`, 1),
		"trailing data":   string(data) + "{}",
		"not JSON":        "PK\x03\x04",
	} {
		if _, err := audit.ParseBundle([]byte(bad)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// The golden bundle was made once by the fixture; it must keep verifying,
// long after its certificates' validity (tokens are checked at their own
// time) and whatever the code that made it becomes.
func TestGoldenBundle(t *testing.T) {
	path := filepath.Join("testdata", "bundle.json")
	if *update {
		f := audittest.NewFixture(t)
		data, err := json.MarshalIndent(f.Bundle, "", " ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b, err := audit.ParseBundle(data)
	if err != nil {
		t.Fatal(err)
	}
	s, err := audit.Check(b, audit.Trust{})
	if err != nil {
		t.Fatal(err)
	}
	if s.Chains != 3 || s.Anchors != 2 || s.Stamps != 4 {
		t.Fatalf("summary %+v", s)
	}
}

// The formats, byte for byte: a row's canonical JSON and hash, an anchor
// document's canonical JSON.
func TestFormatsGolden(t *testing.T) {
	row := audit.Row{V: 1, Agent: "UAGENTKEY", Seq: 2, At: "2026-03-04T10:11:12.345Z", Role: audit.RoleResponder, Peer: "UPEERKEY",
		Offering: "summarize", TaskID: "task-1", RequestID: "0190f2a4-0000-7000-8000-000000000001", Outcome: "completed",
		DurationMS: 1520, InputSHA256: audit.InputDigest([]byte("input")), Prev: strings.Repeat("ab", 32)}
	canon, err := row.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	hash, err := row.Hash()
	if err != nil {
		t.Fatal(err)
	}
	doc := audit.Document{V: 1, Date: "2026-03-04", Root: strings.Repeat("cd", 32), Mesh: "example", Heads: 3, Rows: 42}
	dcanon, err := doc.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	dsum, _ := doc.Digest()
	leaf, err := audit.LeafData(audit.Head{Agent: row.Agent, Seq: row.Seq, Hash: hash})
	if err != nil {
		t.Fatal(err)
	}
	got := "row: " + string(canon) + "\nrow hash: " + hash + "\nleaf: " + string(leaf) +
		"\ndocument: " + string(dcanon) + "\ndocument sha256: " + hex.EncodeToString(dsum) + "\n"
	path := filepath.Join("testdata", "formats.golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Fatalf("formats changed:\n%s\nwant:\n%s", got, want)
	}
}

// FuzzVerifyBundle feeds arbitrary JSON to the bundle decoder and the
// verifier: neither may panic or hang.
func FuzzVerifyBundle(f *testing.F) {
	golden, err := os.ReadFile(filepath.Join("testdata", "bundle.json"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(golden)
	f.Add([]byte(`{"v":1,"manifest":{"v":1,"heads":[]},"chains":[],"proofs":[{"date":"2026-01-01","seq":1,"index":5,"size":2,"path":["00"]}],"anchors":[],"authorities":[]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := audit.ParseBundle(data)
		if err != nil {
			return
		}
		_, _ = audit.Check(b, audit.Trust{})
	})
}
