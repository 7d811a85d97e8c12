package audit

import (
	"cmp"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// BundleVersion is the version of the export bundle and of its manifest.
const BundleVersion = 1

// manifestTag is prefixed to the manifest's canonical JSON before signing
// (as every signed string of the system is tagged, upstream-notes §1.4), so
// the export key's signature over a manifest can never be taken for its
// signature over anything else.
const manifestTag = "mesh-audit-manifest-v1\n"

// Manifest is the signed summary of an export: each chain's head, a digest
// over every shipped row, and the key that signs it.
type Manifest struct {
	V       int    `json:"v"`
	Mesh    string `json:"mesh"`
	Account string `json:"account"`
	// CreatedAt is when the export was made (RFC 3339 UTC, milliseconds).
	CreatedAt string `json:"created_at"`
	// Heads lists each shipped chain's last row, sorted by agent.
	Heads []Head `json:"heads"`
	// RowsSHA256 is the hex SHA-256 over every shipped row, chain by chain
	// in the order of Heads, each row's canonical JSON followed by "\n".
	RowsSHA256 string `json:"rows_sha256"`
	// Signer is the export key (an Ed25519 public key in the mesh's user
	// key form, "U…").
	Signer string `json:"signer"`
}

// signedBytes is what the manifest's signature covers.
func (m *Manifest) signedBytes() ([]byte, error) {
	b, err := protocol.Canonical(m)
	if err != nil {
		return nil, err
	}
	return append([]byte(manifestTag), b...), nil
}

// Bundle is an export: the rows of some agents' chains and everything that
// verifies them offline. docs/audit.md describes it member by member.
type Bundle struct {
	V        int      `json:"v"`
	Manifest Manifest `json:"manifest"`
	// Signature is Ed25519 by Manifest.Signer over "mesh-audit-manifest-v1\n"
	// + JCS(manifest), base64url without padding.
	Signature string        `json:"signature"`
	Chains    []BundleChain `json:"chains"`
	// Proofs lead anchored heads of the chains to their anchors' roots.
	Proofs      []Proof           `json:"proofs"`
	Anchors     []BundleAnchor    `json:"anchors"`
	Authorities []BundleAuthority `json:"authorities"`
}

// BundleChain is one agent's whole chain, first row first.
type BundleChain struct {
	Agent string `json:"agent"`
	Rows  []Row  `json:"rows"`
}

// BundleAnchor is an anchor document and its timestamps.
type BundleAnchor struct {
	Document Document      `json:"document"`
	Stamps   []BundleStamp `json:"stamps"`
}

// BundleStamp is one authority's token over an anchor document.
type BundleStamp struct {
	// Authority is the ID of an entry of Bundle.Authorities.
	Authority string `json:"authority"`
	// Nonce is the nonce the token was asked with, decimal.
	Nonce string `json:"nonce"`
	// Token is the DER TimeStampToken, standard base64.
	Token []byte `json:"token"`
}

// BundleAuthority is a timestamp authority's certificates.
type BundleAuthority struct {
	// ID is the hex SHA-256 of Root.
	ID   string `json:"id"`
	Name string `json:"name"`
	// Root and Intermediates are DER certificates, standard base64.
	Root          []byte   `json:"root"`
	Intermediates [][]byte `json:"intermediates,omitempty"`
}

// SealInput is what an export is made of.
type SealInput struct {
	Mesh, Account string
	CreatedAt     time.Time
	// Chains are whole chains (from seq 1); empty ones are left out.
	Chains []BundleChain
	// Proofs of the chains' heads, each to one of Anchors.
	Proofs  []Proof
	Anchors []*Anchor
}

// rowsDigest is Manifest.RowsSHA256 over chains.
func rowsDigest(chains []BundleChain) (string, error) {
	h := sha256.New()
	for _, c := range chains {
		for i := range c.Rows {
			b, err := c.Rows[i].Canonical()
			if err != nil {
				return "", err
			}
			h.Write(b)
			h.Write([]byte{'\n'})
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Seal makes the bundle of in, signed by signer (the export key).
func Seal(in SealInput, signer keys.Signer) (*Bundle, error) {
	b := &Bundle{V: BundleVersion, Proofs: slices.Clone(in.Proofs)}
	for _, c := range in.Chains {
		if len(c.Rows) > 0 {
			b.Chains = append(b.Chains, c)
		}
	}
	slices.SortFunc(b.Chains, func(x, y BundleChain) int { return strings.Compare(x.Agent, y.Agent) })
	heads := make([]Head, len(b.Chains))
	for i, c := range b.Chains {
		if i > 0 && b.Chains[i-1].Agent == c.Agent {
			return nil, fmt.Errorf("audit: export: chain %s given twice", c.Agent)
		}
		last := &c.Rows[len(c.Rows)-1]
		h, err := last.Hash()
		if err != nil {
			return nil, err
		}
		heads[i] = Head{Agent: c.Agent, Seq: last.Seq, Hash: h}
	}
	digest, err := rowsDigest(b.Chains)
	if err != nil {
		return nil, err
	}
	auths := map[string]int{}
	for _, a := range in.Anchors {
		ba := BundleAnchor{Document: a.Document}
		for _, st := range a.Stamps {
			sum := sha256.Sum256(st.Root)
			id := hex.EncodeToString(sum[:])
			if _, ok := auths[id]; !ok {
				auths[id] = len(b.Authorities)
				b.Authorities = append(b.Authorities, BundleAuthority{ID: id, Name: st.Authority, Root: st.Root, Intermediates: st.Intermediates})
			}
			ba.Stamps = append(ba.Stamps, BundleStamp{Authority: id, Nonce: st.Nonce, Token: st.Token})
		}
		b.Anchors = append(b.Anchors, ba)
	}
	slices.SortFunc(b.Anchors, func(x, y BundleAnchor) int { return strings.Compare(x.Document.Date, y.Document.Date) })
	slices.SortFunc(b.Proofs, func(x, y Proof) int {
		return cmp.Or(strings.Compare(x.Agent, y.Agent), cmp.Compare(x.Seq, y.Seq), strings.Compare(x.Date, y.Date))
	})
	b.Manifest = Manifest{V: BundleVersion, Mesh: in.Mesh, Account: in.Account, CreatedAt: protocol.FormatTime(in.CreatedAt),
		Heads: heads, RowsSHA256: digest, Signer: signer.Public()}
	if err := b.Sign(signer); err != nil {
		return nil, err
	}
	return b, nil
}

// Sign (re)signs the bundle's manifest with signer, naming signer in it.
func (b *Bundle) Sign(signer keys.Signer) error {
	b.Manifest.Signer = signer.Public()
	msg, err := b.Manifest.signedBytes()
	if err != nil {
		return err
	}
	b.Signature = base64.RawURLEncoding.EncodeToString(signer.Sign(msg))
	return nil
}

// MaxBundleSize bounds a bundle ParseBundle reads.
const MaxBundleSize = 1 << 30

// ParseBundle reads a bundle from its JSON, refusing members the format
// does not have.
func ParseBundle(data []byte) (*Bundle, error) {
	if len(data) > MaxBundleSize {
		return nil, fmt.Errorf("audit: bundle: larger than %d bytes", MaxBundleSize)
	}
	var b Bundle
	if err := strictUnmarshal(data, &b); err != nil {
		return nil, fmt.Errorf("audit: the file is not an export bundle: %w", err)
	}
	if b.V != BundleVersion {
		return nil, fmt.Errorf("audit: bundle version %d; this verifier reads version %d", b.V, BundleVersion)
	}
	return &b, nil
}
