package audit

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/digitorus/pkcs7"
	"github.com/digitorus/timestamp"
)

// Authority is one RFC 3161 timestamp authority the anchors are stamped by,
// from configuration: where to ask, and the root its signer must chain to.
type Authority struct {
	// Name is how documents and errors name it.
	Name string
	// URL receives timestamp queries (HTTP POST, application/timestamp-query).
	URL string
	// Root is the trust anchor its signer must chain to.
	Root *x509.Certificate
	// Intermediates complete the chain when a token does not carry them.
	Intermediates []*x509.Certificate
}

// ID names the authority by its root: the lowercase hex SHA-256 of the
// root certificate's DER. Two authorities under one root are one trust.
func (a *Authority) ID() string { return RootID(a.Root.Raw) }

// RootID is the ID of an authority whose root certificate's DER is root.
func RootID(root []byte) string {
	sum := sha256.Sum256(root)
	return hex.EncodeToString(sum[:])
}

// The refusals of VerifyToken, one per link of a token's verification.
var (
	ErrTokenMalformed     = errors.New("the token is not a well-formed RFC 3161 timestamp token")
	ErrTokenNoCertificate = errors.New("the token carries no certificate, so nothing in it could be checked")
	ErrTokenSignature     = errors.New("the token's signature does not verify")
	ErrTokenSigner        = errors.New("the token's signing-certificate attribute does not name its signer")
	ErrTokenEKU           = errors.New("the token's signer lacks the critical timeStamping extended key usage")
	ErrTokenChain         = errors.New("the token's signer does not chain to the authority's root")
	ErrTokenMessage       = errors.New("the token stamps another message")
	ErrTokenNonce         = errors.New("the token's nonce differs from the request's")
)

// Object identifiers of RFC 3161 and RFC 5035.
var (
	oidTSTInfo               = asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 9, 16, 1, 4}
	oidSigningCertificate    = asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 9, 16, 2, 12}
	oidSigningCertificateV2  = asn1.ObjectIdentifier{1, 2, 840, 113549, 1, 9, 16, 2, 47}
	oidExtKeyUsage           = asn1.ObjectIdentifier{2, 5, 29, 37}
	oidSHA256                = asn1.ObjectIdentifier{2, 16, 840, 1, 101, 3, 4, 2, 1}
	oidSHA384                = asn1.ObjectIdentifier{2, 16, 840, 1, 101, 3, 4, 2, 2}
	oidSHA512                = asn1.ObjectIdentifier{2, 16, 840, 1, 101, 3, 4, 2, 3}
	essHashes                = map[string]crypto.Hash{oidSHA256.String(): crypto.SHA256, oidSHA384.String(): crypto.SHA384, oidSHA512.String(): crypto.SHA512}
	maxTokenCertificates     = 16
	maxTokenSize             = 64 << 10
	maxTimestampResponseSize = int64(maxTokenSize + 1024)
)

// essCertIDv2 and essCertID are the first members of the RFC 5035 and RFC
// 2634 signing-certificate attributes, which bind a token to its signer's
// certificate.
type essCertIDv2 struct {
	HashAlgorithm pkix.AlgorithmIdentifier `asn1:"optional"`
	CertHash      []byte
	IssuerSerial  asn1.RawValue `asn1:"optional"`
}

type signingCertificateV2 struct {
	Certs    []essCertIDv2
	Policies asn1.RawValue `asn1:"optional"`
}

type essCertID struct {
	CertHash     []byte
	IssuerSerial asn1.RawValue `asn1:"optional"`
}

type signingCertificate struct {
	Certs    []essCertID
	Policies asn1.RawValue `asn1:"optional"`
}

// TokenInfo is what a verified token says.
type TokenInfo struct {
	// Time is the authority's time of the stamp (genTime).
	Time   time.Time
	Serial *big.Int
	Policy asn1.ObjectIdentifier
	// Signer is the authority's signing certificate.
	Signer *x509.Certificate
}

// TokenCheck is what a token must match.
type TokenCheck struct {
	// Digest is the SHA-256 of the stamped message.
	Digest []byte
	// Nonce is the request's nonce.
	Nonce *big.Int
	// Root and Intermediates are the authority's.
	Root          *x509.Certificate
	Intermediates []*x509.Certificate
}

// VerifyToken checks an RFC 3161 TimeStampToken (CMS SignedData, DER) for
// every link: it carries its signer's certificate; its one signer's
// signature verifies over signed attributes that name a TSTInfo and the
// signer's certificate; the signer has the critical timeStamping extended
// key usage and no other, and chains to the authority's root at the
// stamp's own time (so a token verifies after its certificates expire);
// the stamped message is SHA-256 of the given digest; and the nonce is the
// request's. The timestamp library alone checks none of this when a token
// carries no certificate, and no chain or usage ever.
func VerifyToken(token []byte, want TokenCheck) (info *TokenInfo, err error) {
	// The ASN.1 parsers below are third-party code reading untrusted
	// input: a panic in them is a malformed token, not a crash.
	defer func() {
		if r := recover(); r != nil {
			info, err = nil, fmt.Errorf("%w: %v", ErrTokenMalformed, r)
		}
	}()
	if len(token) > maxTokenSize {
		return nil, fmt.Errorf("%w: larger than %d bytes", ErrTokenMalformed, maxTokenSize)
	}
	if want.Root == nil || want.Nonce == nil || len(want.Digest) != sha256.Size {
		return nil, errors.New("audit: VerifyToken needs a root, a nonce and a SHA-256 digest")
	}
	p7, err := parsePKCS7(token)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTokenMalformed, err)
	}
	if len(p7.Certificates) == 0 {
		return nil, ErrTokenNoCertificate
	}
	if len(p7.Certificates) > maxTokenCertificates {
		return nil, fmt.Errorf("%w: more than %d certificates", ErrTokenMalformed, maxTokenCertificates)
	}
	signer := p7.GetOnlySigner()
	if signer == nil {
		return nil, fmt.Errorf("%w: it must have one signer whose certificate it carries", ErrTokenMalformed)
	}
	// Without signed attributes the content type and the signer's
	// certificate would be unauthenticated: RFC 3161 requires both.
	var ct asn1.ObjectIdentifier
	if err := p7.UnmarshalSignedAttribute(pkcs7.OIDAttributeContentType, &ct); err != nil {
		return nil, fmt.Errorf("%w: no signed content type: %v", ErrTokenMalformed, err)
	}
	if !ct.Equal(oidTSTInfo) {
		return nil, fmt.Errorf("%w: it signs a %s, not a TSTInfo", ErrTokenMalformed, ct)
	}
	if err := p7.Verify(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTokenSignature, err)
	}
	if err := checkSigningCertificate(p7, signer); err != nil {
		return nil, err
	}
	ts, err := parseTSTInfo(token)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTokenMalformed, err)
	}
	if err := checkTimeStampingEKU(signer); err != nil {
		return nil, err
	}
	inter := x509.NewCertPool()
	for _, c := range p7.Certificates {
		inter.AddCert(c)
	}
	for _, c := range want.Intermediates {
		inter.AddCert(c)
	}
	roots := x509.NewCertPool()
	roots.AddCert(want.Root)
	if _, err := signer.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: ts.Time,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageTimeStamping}}); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTokenChain, err)
	}
	if ts.HashAlgorithm != crypto.SHA256 || !bytes.Equal(ts.HashedMessage, want.Digest) {
		return nil, ErrTokenMessage
	}
	if ts.Nonce == nil || ts.Nonce.Cmp(want.Nonce) != 0 {
		return nil, ErrTokenNonce
	}
	return &TokenInfo{Time: ts.Time, Serial: ts.SerialNumber, Policy: ts.Policy, Signer: signer}, nil
}

// berMu serialises the parsers of github.com/digitorus/pkcs7, whose BER
// transcoder writes a package-level variable (a debug indent counter) on
// every parse: two parses at once are a data race. Tokens are parsed a few
// times a day, so one at a time costs nothing.
var berMu sync.Mutex

func parsePKCS7(der []byte) (*pkcs7.PKCS7, error) {
	berMu.Lock()
	defer berMu.Unlock()
	return pkcs7.Parse(der)
}

func parseResponse(raw []byte) (*timestamp.Timestamp, error) {
	berMu.Lock()
	defer berMu.Unlock()
	return timestamp.ParseResponse(raw)
}

func parseTSTInfo(token []byte) (*timestamp.Timestamp, error) {
	berMu.Lock()
	defer berMu.Unlock()
	return timestamp.Parse(token)
}

// checkSigningCertificate checks that the signed signing-certificate
// attribute (v2, or v1 with SHA-1) names the signer's certificate: without
// it a signer could be swapped for another certificate with the same key.
func checkSigningCertificate(p7 *pkcs7.PKCS7, signer *x509.Certificate) error {
	var v2 signingCertificateV2
	if err := p7.UnmarshalSignedAttribute(oidSigningCertificateV2, &v2); err == nil {
		if len(v2.Certs) == 0 {
			return ErrTokenSigner
		}
		h := crypto.SHA256
		if alg := v2.Certs[0].HashAlgorithm.Algorithm; len(alg) > 0 {
			var ok bool
			if h, ok = essHashes[alg.String()]; !ok {
				return fmt.Errorf("%w: unknown hash %s", ErrTokenSigner, alg)
			}
		}
		d := h.New()
		d.Write(signer.Raw)
		if !bytes.Equal(d.Sum(nil), v2.Certs[0].CertHash) {
			return ErrTokenSigner
		}
		return nil
	}
	var v1 signingCertificate
	if err := p7.UnmarshalSignedAttribute(oidSigningCertificate, &v1); err != nil {
		return fmt.Errorf("%w: it has no signing-certificate attribute", ErrTokenSigner)
	}
	sum := sha1.Sum(signer.Raw)
	if len(v1.Certs) == 0 || !bytes.Equal(sum[:], v1.Certs[0].CertHash) {
		return ErrTokenSigner
	}
	return nil
}

// checkTimeStampingEKU checks RFC 3161 §2.3: the signer's certificate has
// one extended key usage extension, critical, naming timeStamping alone.
func checkTimeStampingEKU(c *x509.Certificate) error {
	n := 0
	for _, e := range c.Extensions {
		if e.Id.Equal(oidExtKeyUsage) {
			if !e.Critical {
				return fmt.Errorf("%w: the extension is not critical", ErrTokenEKU)
			}
			n++
		}
	}
	if n != 1 || len(c.UnknownExtKeyUsage) != 0 || !slices.Equal(c.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageTimeStamping}) {
		return ErrTokenEKU
	}
	return nil
}

// Stamp is one authority's timestamp of an anchor document, as the anchor
// record keeps it: the token, the nonce it was asked with, and the
// authority's root and intermediates at the time, so the stamp still
// verifies after the authority leaves the configuration.
type Stamp struct {
	Authority string `json:"authority"`
	// Nonce is the request's nonce, in decimal.
	Nonce string `json:"nonce"`
	// Token is the TimeStampToken (CMS SignedData), DER.
	Token []byte `json:"token"`
	// Time is the authority's time of the stamp.
	Time time.Time `json:"time"`
	// Root and Intermediates are the authority's certificates, DER.
	Root          []byte   `json:"root"`
	Intermediates [][]byte `json:"intermediates,omitempty"`
}

// Verify checks the stamp's token against digest with the stamp's own
// nonce and certificates.
func (s *Stamp) Verify(digest []byte) (*TokenInfo, error) {
	check, err := s.check(digest)
	if err != nil {
		return nil, err
	}
	return VerifyToken(s.Token, check)
}

func (s *Stamp) check(digest []byte) (TokenCheck, error) {
	root, err := x509.ParseCertificate(s.Root)
	if err != nil {
		return TokenCheck{}, fmt.Errorf("the root of %s does not parse: %w", s.Authority, err)
	}
	inter := make([]*x509.Certificate, len(s.Intermediates))
	for i, der := range s.Intermediates {
		if inter[i], err = x509.ParseCertificate(der); err != nil {
			return TokenCheck{}, fmt.Errorf("an intermediate of %s does not parse: %w", s.Authority, err)
		}
	}
	nonce, ok := parseNonce(s.Nonce)
	if !ok {
		return TokenCheck{}, fmt.Errorf("the nonce of %s's stamp is not a decimal integer", s.Authority)
	}
	return TokenCheck{Digest: digest, Nonce: nonce, Root: root, Intermediates: inter}, nil
}

// Stamper asks timestamp authorities for tokens over HTTP.
type Stamper struct {
	// Client makes the requests; it carries the timeouts and transport.
	Client *http.Client
}

// Request asks authority a to stamp the message whose SHA-256 is digest,
// with a fresh random nonce, and returns the stamp once its token passed
// VerifyToken.
func (s *Stamper) Request(ctx context.Context, a Authority, digest []byte) (Stamp, error) {
	nonce, err := newNonce()
	if err != nil {
		return Stamp{}, err
	}
	req := timestamp.Request{HashAlgorithm: crypto.SHA256, HashedMessage: digest, Certificates: true, Nonce: nonce}
	body, err := req.Marshal()
	if err != nil {
		return Stamp{}, fmt.Errorf("timestamp request for %s: %w", a.Name, err)
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, a.URL, bytes.NewReader(body))
	if err != nil {
		return Stamp{}, fmt.Errorf("timestamp request for %s: %w", a.Name, err)
	}
	hreq.Header.Set("Content-Type", "application/timestamp-query")
	hreq.Header.Set("Accept", "application/timestamp-reply")
	client := s.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(hreq)
	if err != nil {
		return Stamp{}, fmt.Errorf("timestamp authority %s: %w", a.Name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Stamp{}, fmt.Errorf("timestamp authority %s answered HTTP %d", a.Name, resp.StatusCode)
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxTimestampResponseSize+1))
	if err != nil {
		return Stamp{}, fmt.Errorf("timestamp authority %s: %w", a.Name, err)
	}
	if int64(len(raw)) > maxTimestampResponseSize {
		return Stamp{}, fmt.Errorf("timestamp authority %s answered more than %d bytes", a.Name, maxTimestampResponseSize)
	}
	token, err := responseToken(raw)
	if err != nil {
		return Stamp{}, fmt.Errorf("timestamp authority %s: %w", a.Name, err)
	}
	info, err := VerifyToken(token, TokenCheck{Digest: digest, Nonce: nonce, Root: a.Root, Intermediates: a.Intermediates})
	if err != nil {
		return Stamp{}, fmt.Errorf("timestamp authority %s: %w", a.Name, err)
	}
	st := Stamp{Authority: a.Name, Nonce: nonce.String(), Token: token, Time: info.Time.UTC(), Root: a.Root.Raw}
	for _, c := range a.Intermediates {
		st.Intermediates = append(st.Intermediates, c.Raw)
	}
	return st, nil
}

// responseToken takes the token out of a TimeStampResp, refusing one whose
// status is not granted.
func responseToken(raw []byte) (token []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			token, err = nil, fmt.Errorf("%w: %v", ErrTokenMalformed, r)
		}
	}()
	ts, err := parseResponse(raw)
	if err != nil {
		return nil, fmt.Errorf("refused or malformed answer: %w", err)
	}
	return ts.RawToken, nil
}

// parseNonce reads a decimal nonce: a positive integer of at most 40
// digits (a nonce is 128 bits at most here, and 64 at least anywhere).
func parseNonce(s string) (*big.Int, bool) {
	if len(s) == 0 || len(s) > 40 || s[0] == '0' || s[0] == '+' || s[0] == '-' {
		return nil, false
	}
	n, ok := new(big.Int).SetString(s, 10)
	return n, ok
}

// newNonce is a random 128-bit positive nonce.
func newNonce() (*big.Int, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	b[0] |= 0x40 // never zero, never shorter than 15 bytes
	b[0] &= 0x7f
	return new(big.Int).SetBytes(b[:]), nil
}
