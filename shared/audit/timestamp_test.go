package audit_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/digitorus/timestamp"

	"agentmesh.dev/mesh/shared/audit"
	"agentmesh.dev/mesh/shared/audit/tsa"
)

// newTSA is a test-only authority.
func newTSA(t testing.TB, name string) *tsa.Authority {
	t.Helper()
	a, err := tsa.New(name)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// tokenFrom asks a directly (no HTTP) for a token over digest.
func tokenFrom(t testing.TB, a *tsa.Authority, digest []byte, nonce *big.Int, certs bool) []byte {
	t.Helper()
	q, err := (&timestamp.Request{HashAlgorithm: crypto.SHA256, HashedMessage: digest, Nonce: nonce, Certificates: certs}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	resp, err := a.Respond(q)
	if err != nil {
		t.Fatal(err)
	}
	ts, err := timestamp.ParseResponse(resp)
	if err != nil {
		t.Fatal(err)
	}
	return ts.RawToken
}

func TestVerifyToken(t *testing.T) {
	good, other := newTSA(t, "good"), newTSA(t, "other")
	digest := sha256.Sum256([]byte("an anchor document"))
	otherDigest := sha256.Sum256([]byte("another document"))
	nonce := big.NewInt(424242)

	weak := weakTSA(t)

	check := audit.TokenCheck{Digest: digest[:], Nonce: nonce, Root: good.Root()}
	cases := []struct {
		name  string
		token []byte
		check audit.TokenCheck
		want  error
	}{
		{"valid", tokenFrom(t, good, digest[:], nonce, true), check, nil},
		{"no certificate", tokenFrom(t, good, digest[:], nonce, false), check, audit.ErrTokenNoCertificate},
		{"another authority", tokenFrom(t, other, digest[:], nonce, true), check, audit.ErrTokenChain},
		{"another nonce", tokenFrom(t, good, digest[:], big.NewInt(7), true), check, audit.ErrTokenNonce},
		{"another message", tokenFrom(t, good, otherDigest[:], nonce, true), check, audit.ErrTokenMessage},
		{"non-critical EKU", tokenFrom(t, weak, digest[:], nonce, true), audit.TokenCheck{Digest: digest[:], Nonce: nonce, Root: weak.Root()}, audit.ErrTokenEKU},
		{"garbage", []byte("not a token"), check, audit.ErrTokenMalformed},
		{"truncated", tokenFrom(t, good, digest[:], nonce, true)[:200], check, audit.ErrTokenMalformed},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			info, err := audit.VerifyToken(c.token, c.check)
			if c.want == nil {
				if err != nil {
					t.Fatalf("VerifyToken: %v", err)
				}
				if info.Time.IsZero() || info.Signer == nil || !info.Policy.Equal(tsa.Policy) {
					t.Fatalf("info = %+v", info)
				}
				return
			}
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
		})
	}
}

// weakTSA is an authority whose signer's extended key usage is not
// critical, which RFC 3161 forbids.
func weakTSA(t testing.TB) *tsa.Authority {
	t.Helper()
	base := newTSA(t, "weak-root")
	// A fresh root with a key this test holds, and a signer under it.
	rootKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := *base.Root()
	tmpl.PublicKey = nil
	der, err := x509.CreateCertificate(rand.Reader, &tmpl, &tmpl, rootKey.Public(), rootKey)
	if err != nil {
		t.Fatal(err)
	}
	root, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tsa.IssueSigner(root, rootKey, key.Public(), pkix.Name{CommonName: "weak"}, false)
	if err != nil {
		t.Fatal(err)
	}
	return tsa.FromParts("weak", root, cert, key)
}

func TestStamperRequest(t *testing.T) {
	good := newTSA(t, "good")
	srv := httptest.NewServer(good)
	defer srv.Close()
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "down", http.StatusInternalServerError)
	}))
	defer failing.Close()
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		resp, _ := timestamp.CreateErrorResponse(timestamp.Rejection, timestamp.SystemFailure)
		_, _ = w.Write(resp)
	}))
	defer refusing.Close()
	impostor := httptest.NewServer(newTSA(t, "impostor"))
	defer impostor.Close()

	digest := sha256.Sum256([]byte("doc"))
	s := &audit.Stamper{Client: srv.Client()}
	st, err := s.Request(t.Context(), audit.Authority{Name: "good", URL: srv.URL, Root: good.Root()}, digest[:])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Verify(digest[:]); err != nil {
		t.Fatalf("the stamp does not verify: %v", err)
	}
	for _, c := range []struct {
		name, url, want string
	}{
		{"500", failing.URL, "answered HTTP 500"},
		{"rejection", refusing.URL, "refused or malformed answer"},
		{"another root", impostor.URL, audit.ErrTokenChain.Error()},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := s.Request(t.Context(), audit.Authority{Name: "good", URL: c.url, Root: good.Root()}, digest[:])
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want %q", err, c.want)
			}
		})
	}
}
