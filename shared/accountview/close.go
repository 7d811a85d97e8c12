package accountview

import (
	"context"
	"errors"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/store"
)

// What account closure (shared/closure) asks of the subscriptions. They
// are a store document, so these need no bus.

// SubscriptionCount is how many catalog agents the account subscribes to.
func SubscriptionCount(ctx context.Context, st store.Store, accountID string) (int, error) {
	var subs subscriptions
	err := store.Get(ctx, st, CollSubscriptions, accountID, &subs)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return 0, errs.OrUnavailable(err, "the account store is unavailable; retry shortly")
	}
	return len(subs.Agents), nil
}

// DropSubscriptions deletes the account's subscriptions; dropping what is
// gone is quiet.
func DropSubscriptions(ctx context.Context, st store.Store, accountID string) error {
	err := st.RunTx(ctx, func(tx store.Tx) error { return tx.Delete(CollSubscriptions, accountID) })
	return errs.OrUnavailable(err, "the account store is unavailable; retry shortly")
}
