// Package tsa is a TEST-ONLY RFC 3161 timestamp authority: an HTTP server
// that stamps whatever it is asked, signed by a key under a root it made
// itself. Its tokens prove nothing to anyone who does not already trust
// that root; meshd runs it so that anchors work on one machine, and tests
// run it so that they need no network. Production configuration names
// public authorities instead (docs/audit.md).
//
// Its certificates say so: the subject of both is "<name> (TEST-ONLY
// timestamp authority)" and its tokens carry the policy 2.999.3161.1, under
// the ITU-T/ISO arc reserved for examples.
package tsa

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/digitorus/timestamp"

	"agentmesh.dev/mesh/shared/keys"
)

// Policy is the TSA policy of every token of a test-only authority.
var Policy = asn1.ObjectIdentifier{2, 999, 3161, 1}

// Label is appended to the common name of its certificates.
const Label = "(TEST-ONLY timestamp authority)"

// Authority is a test-only timestamp authority. It is safe for concurrent
// use.
type Authority struct {
	name string
	root *x509.Certificate
	cert *x509.Certificate
	key  crypto.Signer
	// Now is the authority's clock (time.Now when nil).
	Now func() time.Time
}

// New makes an authority with a fresh root and signer (ECDSA P-256).
func New(name string) (*Authority, error) {
	rootKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	rootTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name + " root " + Label},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(30, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	rootDER, err := x509.CreateCertificate(rand.Reader, rootTmpl, rootTmpl, rootKey.Public(), rootKey)
	if err != nil {
		return nil, fmt.Errorf("tsa: root: %w", err)
	}
	root, err := x509.ParseCertificate(rootDER)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	cert, err := IssueSigner(root, rootKey, key.Public(), pkix.Name{CommonName: name + " " + Label}, true)
	if err != nil {
		return nil, err
	}
	return FromParts(name, root, cert, key), nil
}

// IssueSigner issues a timestamping certificate for pub under the CA
// (caCert, caKey), valid for 20 years. With criticalEKU false its extended
// key usage extension is not critical, which RFC 3161 forbids: tests use it
// to make a signer that verifiers must refuse.
func IssueSigner(caCert *x509.Certificate, caKey crypto.Signer, pub crypto.PublicKey, subject pkix.Name, criticalEKU bool) (*x509.Certificate, error) {
	eku, err := asn1.Marshal([]asn1.ObjectIdentifier{{1, 3, 6, 1, 5, 5, 7, 3, 8}})
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      subject,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.AddDate(20, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		// The standard library writes extended key usage non-critical;
		// RFC 3161 §2.3 requires it critical, so it is written here.
		ExtraExtensions: []pkix.Extension{{Id: asn1.ObjectIdentifier{2, 5, 29, 37}, Critical: criticalEKU, Value: eku}},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, pub, caKey)
	if err != nil {
		return nil, fmt.Errorf("tsa: signer: %w", err)
	}
	return x509.ParseCertificate(der)
}

// FromParts makes an authority from a root, a signer certificate issued
// under it and the signer's key.
func FromParts(name string, root, signer *x509.Certificate, key crypto.Signer) *Authority {
	return &Authority{name: name, root: root, cert: signer, key: key}
}

// Name is the authority's name.
func (a *Authority) Name() string { return a.name }

// Root is the authority's self-made root: the one certificate a verifier
// must be told to trust.
func (a *Authority) Root() *x509.Certificate { return a.root }

// RootPEM is the root in PEM, as meshd publishes it.
func (a *Authority) RootPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.root.Raw})
}

// Signer is the authority's signing certificate.
func (a *Authority) Signer() *x509.Certificate { return a.cert }

// Respond answers a DER TimeStampReq with a DER TimeStampResp: a granted
// token over the request's message, with its nonce, the signer's
// certificate when the request asked for it, and the current time.
func (a *Authority) Respond(query []byte) ([]byte, error) {
	req, err := timestamp.ParseRequest(query)
	if err != nil {
		return timestamp.CreateErrorResponse(timestamp.Rejection, timestamp.BadDataFormat)
	}
	now := time.Now
	if a.Now != nil {
		now = a.Now
	}
	ts := timestamp.Timestamp{
		HashAlgorithm:     req.HashAlgorithm,
		HashedMessage:     req.HashedMessage,
		Time:              now().UTC().Truncate(time.Millisecond),
		Accuracy:          time.Second,
		Policy:            Policy,
		Nonce:             req.Nonce,
		AddTSACertificate: req.Certificates,
	}
	return ts.CreateResponseWithOpts(a.cert, a.key, crypto.SHA256)
}

// maxQuery bounds a request body; a TimeStampReq is about 100 bytes.
const maxQuery = 16 << 10

// ServeHTTP is the RFC 3161 HTTP transport: POST a TimeStampReq, get a
// TimeStampResp.
func (a *Authority) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "POST a timestamp query (application/timestamp-query)", http.StatusMethodNotAllowed)
		return
	}
	query, err := io.ReadAll(io.LimitReader(r.Body, maxQuery+1))
	if err != nil || len(query) > maxQuery {
		http.Error(w, "the timestamp query could not be read or is too large", http.StatusBadRequest)
		return
	}
	resp, err := a.Respond(query)
	if err != nil {
		http.Error(w, "the timestamp could not be made", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/timestamp-reply")
	_, _ = w.Write(resp)
}

// File names under the directory LoadOrCreate keeps an authority in.
const (
	rootFile   = "tsa-root.pem"
	signerFile = "tsa-signer.pem"
	keyFile    = "tsa-signer.key"
)

// LoadOrCreate loads the authority kept in dir, or makes one and keeps it
// there (the key mode 0600), so that meshd's root stays the same across
// restarts and tokens it stamped keep verifying against what it publishes.
func LoadOrCreate(dir, name string) (*Authority, error) {
	a, err := load(dir, name)
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		return a, err
	}
	if a, err = New(name); err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(a.key)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	for _, f := range []struct {
		name string
		data []byte
	}{
		{keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})},
		{signerFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: a.cert.Raw})},
		// The root last: its presence says the set is complete.
		{rootFile, a.RootPEM()},
	} {
		if err := keys.WriteSecretFile(filepath.Join(dir, f.name), f.data); err != nil {
			return nil, fmt.Errorf("tsa: keep %s: %w", f.name, err)
		}
	}
	return a, nil
}

func load(dir, name string) (*Authority, error) {
	read := func(file, typ string) ([]byte, error) {
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			return nil, err
		}
		blk, rest := pem.Decode(b)
		if blk == nil || blk.Type != typ || len(bytes.TrimSpace(rest)) != 0 {
			return nil, fmt.Errorf("tsa: %s is not one PEM %s", file, typ)
		}
		return blk.Bytes, nil
	}
	rootDER, err := read(rootFile, "CERTIFICATE")
	if err != nil {
		return nil, err
	}
	certDER, err := read(signerFile, "CERTIFICATE")
	if err != nil {
		return nil, err
	}
	keyDER, err := read(keyFile, "PRIVATE KEY")
	if err != nil {
		return nil, err
	}
	root, err := x509.ParseCertificate(rootDER)
	if err != nil {
		return nil, fmt.Errorf("tsa: %s: %w", rootFile, err)
	}
	cert, err := x509.ParseCertificate(certDER)
	if err != nil {
		return nil, fmt.Errorf("tsa: %s: %w", signerFile, err)
	}
	k, err := x509.ParsePKCS8PrivateKey(keyDER)
	if err != nil {
		return nil, fmt.Errorf("tsa: %s: %w", keyFile, err)
	}
	key, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("tsa: %s is not a signing key", keyFile)
	}
	if err := cert.CheckSignatureFrom(root); err != nil {
		return nil, fmt.Errorf("tsa: %s is not issued by %s: %w", signerFile, rootFile, err)
	}
	return FromParts(name, root, cert, key), nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n.Add(n, big.NewInt(1))
}
