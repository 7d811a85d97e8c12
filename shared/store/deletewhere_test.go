package store_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"agentmesh.dev/mesh/shared/store"
	"agentmesh.dev/mesh/shared/store/boltstore"
)

type doc struct {
	ID    string `json:"id"`
	Owner string `json:"owner"`
}

// DeleteWhere deletes every match, over more than one batch, and nothing
// else; again it deletes nothing; a document without its id stops it.
func TestDeleteWhere(t *testing.T) {
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	ctx := context.Background()
	n := store.DeleteBatch + 7
	err = st.RunTx(ctx, func(tx store.Tx) error {
		for i := range n {
			if err := tx.Set("docs", fmt.Sprint("a", i), doc{ID: fmt.Sprint("a", i), Owner: "ana"}); err != nil {
				return err
			}
		}
		return tx.Set("docs", "b", doc{ID: "b", Owner: "bo"})
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := store.DeleteWhere(ctx, st, "docs", store.Where("owner", "ana"), store.Member("id"))
	if err != nil || got != n {
		t.Fatalf("deleted %d, %v; want %d", got, err, n)
	}
	var left []doc
	if err := store.List(ctx, st, "docs", store.Query{}, &left); err != nil || len(left) != 1 || left[0].ID != "b" {
		t.Fatalf("left %v, %v", left, err)
	}
	if got, err := store.DeleteWhere(ctx, st, "docs", store.Where("owner", "ana"), store.Member("id")); err != nil || got != 0 {
		t.Fatalf("again: %d, %v", got, err)
	}
	if _, err := store.DeleteWhere(ctx, st, "docs", store.Where("owner", "bo"), store.Member("nope")); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("no id member: %v", err)
	}
}
