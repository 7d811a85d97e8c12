package audit

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"agentmesh.dev/mesh/shared/keys"
)

// The links of a bundle's verification. Every error of Check wraps one,
// and its message says which chain, row, anchor or stamp failed.
var (
	ErrManifestSignature = errors.New("manifest signature")
	ErrManifestSigner    = errors.New("manifest signer")
	ErrManifest          = errors.New("manifest")
	ErrChainLink         = errors.New("chain link")
	ErrChainHead         = errors.New("chain head")
	ErrRowsDigest        = errors.New("rows digest")
	ErrAuthority         = errors.New("timestamp authority")
	ErrAnchor            = errors.New("anchor")
	ErrStamp             = errors.New("timestamp")
	ErrStampTime         = errors.New("timestamp time")
	ErrProof             = errors.New("inclusion proof")
)

// Trust is what a verifier knows besides the bundle. With none, a bundle
// is checked against the keys it names itself: it then proves it was not
// changed since it was made, and that its anchored rows existed when the
// named authorities say, as far as those authorities are trusted.
type Trust struct {
	// Signer, when set, is the only export key accepted (the mesh
	// publishes it).
	Signer string
	// Roots, when set, are the only authority roots accepted.
	Roots []*x509.Certificate
}

// Summary is what a verified bundle contains.
type Summary struct {
	Chains, Rows int
	// AnchoredRows are the rows an anchor's stamped root commits to.
	AnchoredRows int
	Anchors      int
	Stamps       int
	Proofs       int
	// FirstAnchor and LastAnchor are the dates of the anchors.
	FirstAnchor, LastAnchor string
	// Stamped is each anchor's earliest stamp time, in the bundle's order:
	// the rows under it existed by then, as its authorities say.
	Stamped []AnchorStamped
}

// AnchorStamped is when an anchor was first stamped.
type AnchorStamped struct {
	Date     string
	Earliest time.Time
}

// Verify checks every link of a bundle offline, trusting the keys it
// names: see Check.
func Verify(b *Bundle) error {
	_, err := Check(b, Trust{})
	return err
}

// Check verifies a bundle with no network, link by link, and returns the
// first link that fails: the manifest's signature (and its signer, when
// trust names one); every chain, row by row (each row's seq, agent and
// prev), ending at the head the manifest signs; the digest over the rows;
// every authority's certificates; every anchor document's stamps (each
// token's signature, chain to its authority's root, critical timeStamping
// usage, message = SHA-256 of the canonical document, nonce); and every
// inclusion proof, from a row of the chains to its anchor's root.
func Check(b *Bundle, trust Trust) (Summary, error) {
	var s Summary
	if b.V != BundleVersion || b.Manifest.V != BundleVersion {
		return s, fmt.Errorf("%w: bundle version %d, manifest version %d; this verifier reads version %d", ErrManifest, b.V, b.Manifest.V, BundleVersion)
	}
	if err := checkManifest(b, trust); err != nil {
		return s, err
	}
	rowHashes, err := checkChains(b)
	if err != nil {
		return s, err
	}
	s.Chains = len(b.Chains)
	for _, c := range b.Chains {
		s.Rows += len(c.Rows)
	}
	auths, err := checkAuthorities(b, trust)
	if err != nil {
		return s, err
	}
	docs := map[string]*Document{}
	for i := range b.Anchors {
		a := &b.Anchors[i]
		earliest, err := checkAnchor(a, b.Manifest.Mesh, auths)
		if err != nil {
			return s, err
		}
		s.Stamped = append(s.Stamped, AnchorStamped{Date: a.Document.Date, Earliest: earliest})
		if docs[a.Document.Date] != nil {
			return s, fmt.Errorf("%w: the anchor of %s is shipped twice", ErrAnchor, a.Document.Date)
		}
		docs[a.Document.Date] = &a.Document
		s.Anchors++
		s.Stamps += len(a.Stamps)
		if s.FirstAnchor == "" || a.Document.Date < s.FirstAnchor {
			s.FirstAnchor = a.Document.Date
		}
		s.LastAnchor = max(s.LastAnchor, a.Document.Date)
	}
	anchored := map[string]int64{}
	for i := range b.Proofs {
		p := &b.Proofs[i]
		if err := checkProof(p, docs, rowHashes); err != nil {
			return s, err
		}
		anchored[p.Agent] = max(anchored[p.Agent], p.Seq)
		s.Proofs++
	}
	for _, n := range anchored {
		s.AnchoredRows += int(n)
	}
	return s, nil
}

// checkManifest checks the manifest's signature and, with trust, its
// signer.
func checkManifest(b *Bundle, trust Trust) error {
	m := &b.Manifest
	if trust.Signer != "" && m.Signer != trust.Signer {
		return fmt.Errorf("%w: the manifest is signed by %s, not by the expected export key %s", ErrManifestSigner, m.Signer, trust.Signer)
	}
	pub, err := keys.DecodeUserPublicKey(m.Signer)
	if err != nil {
		return fmt.Errorf("%w: the manifest's signer is not an Ed25519 key: %v", ErrManifestSignature, err)
	}
	sig, err := base64.RawURLEncoding.DecodeString(b.Signature)
	if err != nil {
		return fmt.Errorf("%w: the signature is not base64url: %v", ErrManifestSignature, err)
	}
	msg, err := m.signedBytes()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrManifest, err)
	}
	if !keys.Verify(pub, msg, sig) {
		return fmt.Errorf("%w: the manifest's signature does not verify under its signer key %s", ErrManifestSignature, m.Signer)
	}
	return nil
}

// checkChains checks every chain row by row against the manifest's heads
// and the rows digest, and returns every row's hash by agent.
func checkChains(b *Bundle) (map[string][]string, error) {
	heads := b.Manifest.Heads
	if len(heads) != len(b.Chains) {
		return nil, fmt.Errorf("%w: the manifest lists %d chains, the bundle ships %d", ErrManifest, len(heads), len(b.Chains))
	}
	out := make(map[string][]string, len(b.Chains))
	for i, c := range b.Chains {
		if c.Agent != heads[i].Agent {
			return nil, fmt.Errorf("%w: chain %d is of %s, the manifest lists %s there", ErrManifest, i+1, c.Agent, heads[i].Agent)
		}
		if i > 0 && heads[i-1].Agent >= c.Agent {
			return nil, fmt.Errorf("%w: the chains are not sorted by agent, one per agent", ErrManifest)
		}
		hashes := make([]string, len(c.Rows))
		prev := GenesisPrev
		for j := range c.Rows {
			r := &c.Rows[j]
			n := j + 1
			switch {
			case r.V != RowVersion:
				return nil, fmt.Errorf("%w: chain %s: row %d has version %d", ErrChainLink, c.Agent, n, r.V)
			case r.Agent != c.Agent:
				return nil, fmt.Errorf("%w: chain %s: row %d is of agent %s", ErrChainLink, c.Agent, n, r.Agent)
			case r.Seq != int64(n):
				return nil, fmt.Errorf("%w: chain %s: row %d says it is row %d (a row is missing, repeated or moved)", ErrChainLink, c.Agent, n, r.Seq)
			case r.Prev != prev && n == 1:
				return nil, fmt.Errorf("%w: chain %s: row 1 does not begin the chain (its prev is not the genesis value)", ErrChainLink, c.Agent)
			case r.Prev != prev:
				return nil, fmt.Errorf("%w: chain %s: row %d does not link to row %d (its prev is not row %d's hash: one of them was changed)", ErrChainLink, c.Agent, n, n-1, n-1)
			}
			h, err := r.Hash()
			if err != nil {
				return nil, fmt.Errorf("%w: chain %s: row %d: %v", ErrChainLink, c.Agent, n, err)
			}
			hashes[j], prev = h, h
		}
		if len(c.Rows) == 0 || heads[i].Seq != int64(len(c.Rows)) || heads[i].Hash != prev {
			return nil, fmt.Errorf("%w: chain %s: its last row is not the head the manifest signs (row %d, or the last row, was changed, added or removed)", ErrChainHead, c.Agent, heads[i].Seq)
		}
		out[c.Agent] = hashes
	}
	digest, err := rowsDigest(b.Chains)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrRowsDigest, err)
	}
	if digest != b.Manifest.RowsSHA256 {
		return nil, fmt.Errorf("%w: the digest over the shipped rows is not the one the manifest signs", ErrRowsDigest)
	}
	return out, nil
}

// checkAuthorities checks each authority's ID and certificates and, with
// trust, its root; it returns them by ID.
func checkAuthorities(b *Bundle, trust Trust) (map[string]*Authority, error) {
	out := map[string]*Authority{}
	for _, ba := range b.Authorities {
		sum := sha256.Sum256(ba.Root)
		if hex.EncodeToString(sum[:]) != ba.ID {
			return nil, fmt.Errorf("%w: %s: its ID is not the SHA-256 of its root", ErrAuthority, ba.Name)
		}
		if out[ba.ID] != nil {
			return nil, fmt.Errorf("%w: %s is shipped twice", ErrAuthority, ba.Name)
		}
		root, err := x509.ParseCertificate(ba.Root)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: its root does not parse: %v", ErrAuthority, ba.Name, err)
		}
		a := &Authority{Name: ba.Name, Root: root}
		for _, der := range ba.Intermediates {
			c, err := x509.ParseCertificate(der)
			if err != nil {
				return nil, fmt.Errorf("%w: %s: an intermediate does not parse: %v", ErrAuthority, ba.Name, err)
			}
			a.Intermediates = append(a.Intermediates, c)
		}
		if len(trust.Roots) > 0 && !trusted(root, trust.Roots) {
			return nil, fmt.Errorf("%w: %s: its root is not among the trusted roots", ErrAuthority, ba.Name)
		}
		out[ba.ID] = a
	}
	return out, nil
}

func trusted(root *x509.Certificate, roots []*x509.Certificate) bool {
	for _, r := range roots {
		if bytes.Equal(r.Raw, root.Raw) {
			return true
		}
	}
	return false
}

// checkAnchor checks an anchor document and each of its stamps, and
// returns the earliest stamp's time. An anchor needs stamps of
// MinAuthorities distinct authorities (distinct roots and signing
// certificates: one authority that lies must not be the whole proof), each
// made at or after the end of the document's date (00:00 UTC the next
// day), when the heads it commits to were final: a stamp from before then
// would say the rows existed before the day they commit to had ended.
func checkAnchor(a *BundleAnchor, mesh string, auths map[string]*Authority) (time.Time, error) {
	d := &a.Document
	day, err := ParseDate(d.Date)
	if err != nil || d.V != DocumentVersion || !IsHash(d.Root) {
		return time.Time{}, fmt.Errorf("%w: %q is not a version %d anchor document", ErrAnchor, d.Date, DocumentVersion)
	}
	if d.Mesh != mesh {
		return time.Time{}, fmt.Errorf("%w: the anchor of %s is of mesh %q, the export of mesh %q", ErrAnchor, d.Date, d.Mesh, mesh)
	}
	if len(a.Stamps) < MinAuthorities {
		return time.Time{}, fmt.Errorf("%w: the anchor of %s carries %d timestamps; it needs %d, of distinct authorities", ErrAnchor, d.Date, len(a.Stamps), MinAuthorities)
	}
	digest, err := d.Digest()
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: the anchor of %s: %v", ErrAnchor, d.Date, err)
	}
	end := day.AddDate(0, 0, 1)
	var earliest time.Time
	roots, signers := map[string]bool{}, map[[sha256.Size]byte]bool{}
	for _, st := range a.Stamps {
		au := auths[st.Authority]
		if au == nil {
			return time.Time{}, fmt.Errorf("%w: the anchor of %s: a stamp names authority %s, which the bundle does not carry", ErrStamp, d.Date, st.Authority)
		}
		if roots[st.Authority] {
			return time.Time{}, fmt.Errorf("%w: the anchor of %s carries two stamps of authority %s; its stamps must be of %d distinct authorities", ErrAnchor, d.Date, au.Name, MinAuthorities)
		}
		roots[st.Authority] = true
		check := TokenCheck{Digest: digest, Root: au.Root, Intermediates: au.Intermediates}
		var ok bool
		if check.Nonce, ok = parseNonce(st.Nonce); !ok {
			return time.Time{}, fmt.Errorf("%w: the anchor of %s, stamp by %s: the nonce is not a decimal integer", ErrStamp, d.Date, au.Name)
		}
		info, err := VerifyToken(st.Token, check)
		if err != nil {
			return time.Time{}, fmt.Errorf("%w: the anchor of %s, stamp by %s: %w", ErrStamp, d.Date, au.Name, err)
		}
		signer := sha256.Sum256(info.Signer.Raw)
		if signers[signer] {
			return time.Time{}, fmt.Errorf("%w: the anchor of %s: the stamp by %s is signed by the same certificate as another stamp; its stamps must be of %d distinct authorities", ErrAnchor, d.Date, au.Name, MinAuthorities)
		}
		signers[signer] = true
		if info.Time.Before(end) {
			return time.Time{}, fmt.Errorf("%w: the anchor of %s, stamp by %s: stamped at %s, before the date ended (%s)", ErrStampTime, d.Date, au.Name, info.Time.UTC().Format(time.RFC3339), end.Format(time.RFC3339))
		}
		if earliest.IsZero() || info.Time.Before(earliest) {
			earliest = info.Time.UTC()
		}
	}
	return earliest, nil
}

// checkProof checks that a proof is about a shipped row and leads to its
// anchor's root.
func checkProof(p *Proof, docs map[string]*Document, rowHashes map[string][]string) error {
	d := docs[p.Date]
	if d == nil {
		return fmt.Errorf("%w: chain %s, row %d: the proof names the anchor of %s, which the bundle does not carry", ErrProof, p.Agent, p.Seq, p.Date)
	}
	hashes := rowHashes[p.Agent]
	if p.Seq < 1 || p.Seq > int64(len(hashes)) || hashes[p.Seq-1] != p.Hash {
		return fmt.Errorf("%w: chain %s, row %d: the anchored head is not that row as shipped", ErrProof, p.Agent, p.Seq)
	}
	if p.Size != d.Heads {
		return fmt.Errorf("%w: chain %s, row %d: the proof is for a tree of %d heads, the anchor of %s has %d", ErrProof, p.Agent, p.Seq, p.Size, p.Date, d.Heads)
	}
	if err := p.Verify(d.Root); err != nil {
		return fmt.Errorf("%w: chain %s, row %d: the inclusion proof does not lead to the root of the anchor of %s: %v", ErrProof, p.Agent, p.Seq, p.Date, err)
	}
	return nil
}
