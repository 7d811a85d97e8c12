package grant_test

import (
	"context"
	"path/filepath"
	"slices"
	"testing"

	"agentmesh.dev/mesh/shared/grant"
	"agentmesh.dev/mesh/shared/store"
	"agentmesh.dev/mesh/shared/store/boltstore"
)

// What closure asks of the grants, on the store alone: the account's
// grants with what the actions log says the mesh created in each project
// (successful writes only, once each); forgetting them, and the log,
// leaving other accounts' alone; quiet the second time.
func TestGrantsForClosure(t *testing.T) {
	ctx := context.Background()
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "control.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	pool := "projects/acme/locations/europe-west1/workerPools/mesh-scout"
	secret := "projects/acme/secrets/mesh-scout-agent-key"
	err = st.RunTx(ctx, func(tx store.Tx) error {
		for _, g := range []grant.Grant{
			{ID: "g1", AccountID: "acct_a", Provider: grant.ProviderGCP, ProjectID: "acme", ServiceAccount: "mesh-agent@acme.iam.gserviceaccount.com"},
			{ID: "g2", AccountID: "acct_b", Provider: grant.ProviderGCP, ProjectID: "bobs", ServiceAccount: "x@bobs.iam.gserviceaccount.com"},
		} {
			if err := tx.Set(grant.CollGrants, g.AccountID+"."+g.Provider, g); err != nil {
				return err
			}
		}
		for i, a := range []grant.Action{
			{AccountID: "acct_a", ProjectID: "acme", Call: "secretmanager.CreateSecret", Resource: secret, Outcome: "ALREADY_EXISTS"},
			{AccountID: "acct_a", ProjectID: "acme", Call: "secretmanager.AddSecretVersion", Resource: secret, Outcome: "ok"},
			{AccountID: "acct_a", ProjectID: "acme", Call: "run.UpdateWorkerPool", Resource: pool, Outcome: "ok"},
			{AccountID: "acct_a", ProjectID: "acme", Call: "run.UpdateWorkerPool", Resource: pool, Outcome: "ok"},
			{AccountID: "acct_a", ProjectID: "acme", Call: "run.UpdateWorkerPool", Resource: pool + "-2", Outcome: "PERMISSION_DENIED"},
			{AccountID: "acct_a", ProjectID: "acme", Call: "resourcemanager.GetProject", Resource: "projects/acme", Outcome: "ok"},
			{AccountID: "acct_b", ProjectID: "bobs", Call: "run.UpdateWorkerPool", Resource: "projects/bobs/x", Outcome: "ok"},
		} {
			a.ID = string(rune('a' + i))
			if err := tx.Set(grant.CollActions, a.ID, a); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	held, err := grant.HeldBy(ctx, st, "acct_a")
	if err != nil || len(held) != 1 || held[0].ProjectID != "acme" || !slices.Equal(held[0].Created, []string{pool, secret}) {
		t.Fatalf("held %+v, %v", held, err)
	}
	if n, err := grant.ForgetAccount(ctx, st, "acct_a"); err != nil || n != 1 {
		t.Fatalf("forgot %d, %v", n, err)
	}
	if n, err := grant.PurgeActions(ctx, st, "acct_a"); err != nil || n != 6 {
		t.Fatalf("purged %d, %v", n, err)
	}
	for _, f := range []func() (int, error){
		func() (int, error) { return grant.ForgetAccount(ctx, st, "acct_a") },
		func() (int, error) { return grant.PurgeActions(ctx, st, "acct_a") },
	} {
		if n, err := f(); err != nil || n != 0 {
			t.Errorf("again: %d, %v", n, err)
		}
	}
	if held, err := grant.HeldBy(ctx, st, "acct_b"); err != nil || len(held) != 1 || len(held[0].Created) != 1 {
		t.Errorf("the other account's: %+v %v", held, err)
	}
}
