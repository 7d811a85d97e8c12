package accountview

import (
	"context"
	"path/filepath"
	"testing"

	"agentmesh.dev/mesh/shared/store"
	"agentmesh.dev/mesh/shared/store/boltstore"
)

// Closure counts an account's subscriptions and drops them, quietly the
// second time, leaving other accounts' alone.
func TestSubscriptionsForClosure(t *testing.T) {
	ctx := context.Background()
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "control.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	err = st.RunTx(ctx, func(tx store.Tx) error {
		for id, n := range map[string]int{"acct_a": 2, "acct_b": 1} {
			subs := subscriptions{AccountID: id}
			for range n {
				subs.Agents = append(subs.Agents, Subscription{AgentID: "U" + id})
			}
			if err := tx.Set(CollSubscriptions, id, subs); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := SubscriptionCount(ctx, st, "acct_a"); err != nil || n != 2 {
		t.Fatalf("count %d, %v", n, err)
	}
	for range 2 {
		if err := DropSubscriptions(ctx, st, "acct_a"); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := SubscriptionCount(ctx, st, "acct_a"); err != nil || n != 0 {
		t.Errorf("after dropping: %d, %v", n, err)
	}
	if n, err := SubscriptionCount(ctx, st, "acct_b"); err != nil || n != 1 {
		t.Errorf("the other account's: %d, %v", n, err)
	}
}
