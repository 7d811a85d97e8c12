package closure

import (
	"context"
	"errors"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/audit"
)

// BusChains are the audit chains as the control plane reaches them: the
// audit stream is bound when first needed and as it is (audit.BindChains),
// never created or changed here, because its writer decides its replicas
// and limits. Until a writer has created it no chain holds a row, so there
// is nothing to read or purge.
type BusChains struct {
	JS jetstream.JetStream

	mu sync.Mutex
	c  *audit.Chains
}

// bound returns the chains, or nil when the stream does not exist yet.
func (b *BusChains) bound(ctx context.Context) (*audit.Chains, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.c != nil {
		return b.c, nil
	}
	c, err := audit.BindChains(ctx, b.JS)
	if errors.Is(err, audit.ErrNoChains) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	b.c = c
	return c, nil
}

// Head implements Chains.
func (b *BusChains) Head(ctx context.Context, agent string) (audit.Head, bool, error) {
	c, err := b.bound(ctx)
	if c == nil || err != nil {
		return audit.Head{}, false, err
	}
	return c.Head(ctx, agent)
}

// Proofs implements Chains.
func (b *BusChains) Proofs(ctx context.Context, agent string) ([]audit.Proof, error) {
	c, err := b.bound(ctx)
	if c == nil || err != nil {
		return nil, err
	}
	return c.Proofs(ctx, agent)
}

// Purge implements Chains.
func (b *BusChains) Purge(ctx context.Context, agent string) error {
	c, err := b.bound(ctx)
	if c == nil || err != nil {
		return err
	}
	return c.Purge(ctx, agent)
}
