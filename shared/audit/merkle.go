package audit

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/transparency-dev/merkle/compact"
	"github.com/transparency-dev/merkle/proof"
	"github.com/transparency-dev/merkle/rfc6962"

	"agentmesh.dev/mesh/shared/protocol"
)

// The daily root is an RFC 6962 Merkle tree whose leaves are the chain
// heads sorted by agent. The data of a leaf is the canonical JSON of the
// head, {"agent","hash","seq"}; its leaf hash is SHA-256(0x00 || data) and
// an inner node SHA-256(0x01 || left || right), per RFC 6962 §2.1. The tree
// of no heads has the root SHA-256("").

// LeafData is the leaf of a head: JCS({agent, hash, seq}).
func LeafData(h Head) ([]byte, error) {
	return protocol.Canonical(h)
}

// LeafHash is the RFC 6962 leaf hash of a head.
func LeafHash(h Head) ([]byte, error) {
	d, err := LeafData(h)
	if err != nil {
		return nil, err
	}
	return rfc6962.DefaultHasher.HashLeaf(d), nil
}

// Tree is the Merkle tree of one anchor's heads.
type Tree struct {
	heads []Head
	// nodes holds every node of the tree's perfect subtrees, from which
	// the inclusion proofs are built.
	nodes map[compact.NodeID][]byte
	root  []byte
}

// ErrHeadsOrder is returned for heads that are not sorted by agent, one
// per agent.
var ErrHeadsOrder = errors.New("audit: heads must be sorted by agent, one per agent")

// NewTree builds the tree of heads, which must be sorted by agent with one
// head per agent.
func NewTree(heads []Head) (*Tree, error) {
	t := &Tree{heads: heads, nodes: make(map[compact.NodeID][]byte, 2*len(heads))}
	rf := &compact.RangeFactory{Hash: rfc6962.DefaultHasher.HashChildren}
	r := rf.NewEmptyRange(0)
	visit := func(id compact.NodeID, hash []byte) { t.nodes[id] = hash }
	for i, h := range heads {
		if i > 0 && heads[i-1].Agent >= h.Agent {
			return nil, ErrHeadsOrder
		}
		lh, err := LeafHash(h)
		if err != nil {
			return nil, err
		}
		if err := r.Append(lh, visit); err != nil {
			return nil, fmt.Errorf("audit: merkle tree: %w", err)
		}
	}
	root, err := r.GetRootHash(nil)
	if err != nil {
		return nil, fmt.Errorf("audit: merkle root: %w", err)
	}
	if root == nil {
		root = rfc6962.DefaultHasher.EmptyRoot()
	}
	t.root = root
	return t, nil
}

// Root is the tree's root, lowercase hex.
func (t *Tree) Root() string { return hex.EncodeToString(t.root) }

// Size is the number of leaves.
func (t *Tree) Size() uint64 { return uint64(len(t.heads)) }

// Heads are the tree's leaves, in order.
func (t *Tree) Heads() []Head { return t.heads }

// Path is the inclusion proof of leaf i: the RFC 6962 audit path, lowest
// node first, each node lowercase hex.
func (t *Tree) Path(i uint64) ([]string, error) {
	nodes, err := proof.Inclusion(i, t.Size())
	if err != nil {
		return nil, fmt.Errorf("audit: inclusion proof: %w", err)
	}
	hashes := make([][]byte, len(nodes.IDs))
	for j, id := range nodes.IDs {
		h, ok := t.nodes[id]
		if !ok {
			return nil, fmt.Errorf("audit: inclusion proof: node %+v missing", id)
		}
		hashes[j] = h
	}
	path, err := nodes.Rehash(hashes, rfc6962.DefaultHasher.HashChildren)
	if err != nil {
		return nil, fmt.Errorf("audit: inclusion proof: %w", err)
	}
	out := make([]string, len(path))
	for j, p := range path {
		out[j] = hex.EncodeToString(p)
	}
	return out, nil
}

// Proofs returns the inclusion proof of every head, for the anchor of date.
func (t *Tree) Proofs(date string) ([]Proof, error) {
	out := make([]Proof, len(t.heads))
	for i, h := range t.heads {
		path, err := t.Path(uint64(i))
		if err != nil {
			return nil, err
		}
		out[i] = Proof{Date: date, Agent: h.Agent, Seq: h.Seq, Hash: h.Hash, Index: uint64(i), Size: t.Size(), Path: path}
	}
	return out, nil
}

// Proof is the inclusion proof of one chain head in the root of the anchor
// of Date: the head (agent, seq, hash), its leaf index, the number of
// leaves, and the audit path.
type Proof struct {
	Date  string   `json:"date"`
	Agent string   `json:"agent"`
	Seq   int64    `json:"seq"`
	Hash  string   `json:"hash"`
	Index uint64   `json:"index"`
	Size  uint64   `json:"size"`
	Path  []string `json:"path"`
}

// Head is the head the proof is about.
func (p *Proof) Head() Head { return Head{Agent: p.Agent, Seq: p.Seq, Hash: p.Hash} }

// RootOf computes the root the proof leads to.
func (p *Proof) RootOf() (string, error) {
	lh, err := LeafHash(p.Head())
	if err != nil {
		return "", err
	}
	path := make([][]byte, len(p.Path))
	for i, s := range p.Path {
		if !IsHash(s) {
			return "", fmt.Errorf("node %d of the path is not a hex SHA-256", i)
		}
		path[i], _ = hex.DecodeString(s)
	}
	root, err := proof.RootFromInclusionProof(rfc6962.DefaultHasher, p.Index, p.Size, lh, path)
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(root), nil
}

// Verify checks that the proof leads to root.
func (p *Proof) Verify(root string) error {
	got, err := p.RootOf()
	if err != nil {
		return err
	}
	want, err := hex.DecodeString(root)
	if err != nil || !IsHash(root) {
		return errors.New("the root is not a hex SHA-256")
	}
	if g, _ := hex.DecodeString(got); !bytes.Equal(g, want) {
		return errors.New("the path leads to another root")
	}
	return nil
}
