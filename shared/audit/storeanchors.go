package audit

import (
	"context"
	"errors"
	"fmt"

	"agentmesh.dev/mesh/shared/store"
)

// CollAnchors is the control-plane collection of the anchor records, one
// document per date (its id).
const CollAnchors = "audit_anchors"

// StoreAnchors keeps the anchor records in the control plane's document
// store (DESIGN §6: anchors are control-plane documents), each write a
// transaction: the AnchorStore the control plane's anchor job and export
// use, in the cloud (Firestore) and in meshd (bbolt) alike.
type StoreAnchors struct {
	Store store.Store
}

// Create implements AnchorStore.
func (s StoreAnchors) Create(ctx context.Context, a *Anchor) error {
	if _, err := ParseDate(a.Date); err != nil {
		return err
	}
	err := s.Store.RunTx(ctx, func(tx store.Tx) error { return tx.Create(CollAnchors, a.Date, a) })
	if errors.Is(err, store.ErrExists) {
		return ErrAnchorExists
	}
	if err != nil {
		return fmt.Errorf("audit: store the anchor of %s: %w", a.Date, err)
	}
	return nil
}

// Get implements AnchorStore.
func (s StoreAnchors) Get(ctx context.Context, date string) (*Anchor, error) {
	if _, err := ParseDate(date); err != nil {
		return nil, err
	}
	var a Anchor
	err := store.Get(ctx, s.Store, CollAnchors, date, &a)
	if errors.Is(err, store.ErrNotFound) {
		return nil, ErrNoAnchor
	}
	if err != nil {
		return nil, fmt.Errorf("audit: read the anchor of %s: %w", date, err)
	}
	return &a, nil
}

// Update implements AnchorStore: one transaction, which the store runs
// again on contention (so fn may run more than once).
func (s StoreAnchors) Update(ctx context.Context, date string, fn func(*Anchor) error) (*Anchor, error) {
	if _, err := ParseDate(date); err != nil {
		return nil, err
	}
	var out *Anchor
	err := s.Store.RunTx(ctx, func(tx store.Tx) error {
		var a Anchor
		if err := tx.Get(CollAnchors, date, &a); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return ErrNoAnchor
			}
			return err
		}
		before := a
		if err := fn(&a); errors.Is(err, ErrNoChange) {
			out = &before
			return nil
		} else if err != nil {
			return err
		}
		if a.Date != date {
			return errors.New("audit: an update may not change an anchor's date")
		}
		out = &a
		return tx.Set(CollAnchors, date, &a)
	})
	if errors.Is(err, ErrNoAnchor) {
		return nil, ErrNoAnchor
	}
	if err != nil {
		return nil, fmt.Errorf("audit: update the anchor of %s: %w", date, err)
	}
	return out, nil
}

// List implements AnchorStore.
func (s StoreAnchors) List(ctx context.Context, limit int) ([]*Anchor, error) {
	var as []Anchor
	if err := store.List(ctx, s.Store, CollAnchors, store.Query{OrderBy: "date", Desc: true, Limit: limit}, &as); err != nil {
		return nil, fmt.Errorf("audit: list the anchors: %w", err)
	}
	out := make([]*Anchor, len(as))
	for i := range as {
		out[i] = &as[i]
	}
	return out, nil
}
