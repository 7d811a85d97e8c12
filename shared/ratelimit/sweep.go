package ratelimit

import (
	"context"
	"errors"
	"slices"
	"time"

	"agentmesh.dev/mesh/shared/store"
)

// SweepBatch is how many counters one sweep transaction deletes at most
// (Firestore allows 500 writes in a transaction).
const SweepBatch = 100

// Sweep deletes the counters of coll that no longer matter at now (two
// windows after their last count), so that a flood from many addresses
// leaves nothing behind. The store's queries are equality only, so the
// collection is listed whole; each counter is read again in the deleting
// transaction and kept if it was counted meanwhile. It returns how many
// it deleted.
func Sweep(ctx context.Context, st store.Store, coll string, now time.Time) (int, error) {
	var cs []counter
	if err := store.List(ctx, st, coll, store.Query{}, &cs); err != nil {
		return 0, err
	}
	expired := func(c counter) bool { return c.ID != "" && c.ExpiresAt != 0 && now.UnixMilli() >= c.ExpiresAt }
	var ids []string
	for _, c := range cs {
		if expired(c) {
			ids = append(ids, c.ID)
		}
	}
	deleted := 0
	for batch := range slices.Chunk(ids, SweepBatch) {
		n := 0
		err := st.RunTx(ctx, func(tx store.Tx) error {
			var gone []string
			for _, id := range batch {
				var c counter
				switch err := tx.Get(coll, id, &c); {
				case errors.Is(err, store.ErrNotFound):
					continue
				case err != nil:
					return err
				}
				if expired(c) {
					gone = append(gone, id)
				}
			}
			for _, id := range gone {
				if err := tx.Delete(coll, id); err != nil {
					return err
				}
			}
			n = len(gone)
			return nil
		})
		if err != nil {
			return deleted, err
		}
		deleted += n
	}
	return deleted, nil
}
