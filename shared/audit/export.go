package audit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"agentmesh.dev/mesh/shared/keys"
)

// ChainReader is what an export reads of the chains (Chains implements it).
type ChainReader interface {
	Rows(ctx context.Context, agent string) ([]Row, error)
	Proofs(ctx context.Context, agent string) ([]Proof, error)
}

// Exporter makes signed export bundles.
type Exporter struct {
	Mesh    string
	Chains  ChainReader
	Anchors AnchorStore
	// Signer is the export key; its public half is what verifiers pin.
	Signer keys.Signer
	Now    func() time.Time
}

// Export makes the bundle of the account's agents: every row of their
// chains, the manifest, and for each head an anchor committed to, its
// inclusion proof, the anchor's document, its timestamp tokens and the
// authorities' certificates. Agents without rows are left out. An anchor
// not stamped by any authority yet is left out with its proofs (a later
// export carries them).
func (e *Exporter) Export(ctx context.Context, account string, agents []string) (*Bundle, error) {
	if e.Signer == nil || e.Chains == nil || e.Anchors == nil {
		return nil, errors.New("audit: the exporter needs the chains, the anchors and a signer")
	}
	now := time.Now
	if e.Now != nil {
		now = e.Now
	}
	in := SealInput{Mesh: e.Mesh, Account: account, CreatedAt: now()}
	anchors := map[string]*Anchor{}
	agents = slices.Clone(agents)
	slices.Sort(agents)
	for _, agent := range slices.Compact(agents) {
		rows, err := e.Chains.Rows(ctx, agent)
		if err != nil {
			return nil, err
		}
		if len(rows) == 0 {
			continue
		}
		proofs, err := e.Chains.Proofs(ctx, agent)
		if err != nil {
			return nil, err
		}
		for _, p := range proofs {
			if p.Seq > int64(len(rows)) {
				continue // a head appended after the rows were read
			}
			if p.Seq < 1 {
				return nil, fmt.Errorf("%w: %s: a proof of the anchor of %s names row %d", ErrBrokenChain, agent, p.Date, p.Seq)
			}
			if h, err := rows[p.Seq-1].Hash(); err != nil || h != p.Hash {
				return nil, fmt.Errorf("%w: %s: the proof of the anchor of %s is not about row %d", ErrBrokenChain, agent, p.Date, p.Seq)
			}
			a, seen := anchors[p.Date]
			if !seen {
				a, err = e.Anchors.Get(ctx, p.Date)
				if errors.Is(err, ErrNoAnchor) {
					a = nil
				} else if err != nil {
					return nil, err
				}
				anchors[p.Date] = a
			}
			if a == nil || len(a.Stamps) < MinAuthorities {
				continue // not yet stamped enough to verify (Check): a later export carries it
			}
			in.Proofs = append(in.Proofs, p)
		}
		in.Chains = append(in.Chains, BundleChain{Agent: agent, Rows: rows})
	}
	dates := make([]string, 0, len(anchors))
	for d, a := range anchors {
		if a != nil && len(a.Stamps) >= MinAuthorities {
			dates = append(dates, d)
		}
	}
	slices.Sort(dates)
	for _, d := range dates {
		in.Anchors = append(in.Anchors, anchors[d])
	}
	return Seal(in, e.Signer)
}
