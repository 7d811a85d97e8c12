package tsa_test

import (
	"bytes"
	"crypto"
	"crypto/sha256"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/digitorus/timestamp"

	"agentmesh.dev/mesh/shared/audit/tsa"
)

func TestLoadOrCreateKeepsTheRoot(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tsa")
	a, err := tsa.LoadOrCreate(dir, "local")
	if err != nil {
		t.Fatal(err)
	}
	b, err := tsa.LoadOrCreate(dir, "local")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Root().Raw, b.Root().Raw) || !bytes.Equal(a.Signer().Raw, b.Signer().Raw) {
		t.Fatal("a second start made another authority")
	}
	fi, err := os.Stat(filepath.Join(dir, "tsa-signer.key"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, %v", fi, err)
	}
	for _, c := range []string{a.Root().Subject.CommonName, a.Signer().Subject.CommonName} {
		if !strings.Contains(c, tsa.Label) {
			t.Fatalf("certificate %q does not say it is test-only", c)
		}
	}
	if !bytes.HasPrefix(a.RootPEM(), []byte("-----BEGIN CERTIFICATE-----")) {
		t.Fatal("root PEM")
	}
}

func TestServeHTTP(t *testing.T) {
	a, err := tsa.New("local")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a)
	defer srv.Close()
	digest := sha256.Sum256([]byte("x"))
	q, err := (&timestamp.Request{HashAlgorithm: crypto.SHA256, HashedMessage: digest[:], Nonce: big.NewInt(99), Certificates: true}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	resp, err := srv.Client().Post(srv.URL, "application/timestamp-query", bytes.NewReader(q))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/timestamp-reply" {
		t.Fatalf("%d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var body bytes.Buffer
	_, _ = body.ReadFrom(resp.Body)
	ts, err := timestamp.ParseResponse(body.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ts.HashedMessage, digest[:]) || ts.Nonce.Int64() != 99 || !ts.Policy.Equal(tsa.Policy) || len(ts.Certificates) != 1 {
		t.Fatalf("token %+v", ts)
	}

	get, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	get.Body.Close()
	if get.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("GET: %d", get.StatusCode)
	}
	bad, err := srv.Client().Post(srv.URL, "application/timestamp-query", strings.NewReader("junk"))
	if err != nil {
		t.Fatal(err)
	}
	body.Reset()
	_, _ = body.ReadFrom(bad.Body)
	bad.Body.Close()
	if _, err := timestamp.ParseResponse(body.Bytes()); err == nil {
		t.Fatal("a junk query was granted")
	}
}
