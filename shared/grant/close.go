package grant

import (
	"cmp"
	"context"
	"slices"

	"agentmesh.dev/mesh/shared/store"
)

// What account closure (shared/closure) asks of the grants. These work on
// the store alone, so that a closure on an instance without a deployer
// (whose grant routes answer 501) still forgets a grant recorded earlier.
// Each is idempotent.

// Held is one of an account's grants as closure reports it: the binding
// the customer made, and what the mesh created in the project.
type Held struct {
	Provider       string `json:"provider"`
	ProjectID      string `json:"project_id"`
	ServiceAccount string `json:"service_account"`
	// Created names what the mesh wrote in the project and the customer
	// must delete there: the worker pools and secrets of its deploys.
	Created []string `json:"created,omitempty"`
}

// createdBy are the calls whose resource stays in the customer's project.
// AddSecretVersion names the secret, so a secret that already existed
// (CreateSecret answered ALREADY_EXISTS) is counted from its new version.
var createdBy = map[string]bool{"run.UpdateWorkerPool": true, "secretmanager.CreateSecret": true, "secretmanager.AddSecretVersion": true}

// HeldBy lists the account's grants with what the actions log says the
// mesh created in each project (successful writes only), sorted.
func HeldBy(ctx context.Context, st store.Store, accountID string) ([]Held, error) {
	var gs []Grant
	var as []Action
	err := st.RunTx(ctx, func(tx store.Tx) error {
		if err := tx.Query(CollGrants, store.Where("account_id", accountID), &gs); err != nil {
			return err
		}
		return tx.Query(CollActions, store.Where("account_id", accountID), &as)
	})
	if err != nil {
		return nil, txErr(err)
	}
	out := make([]Held, 0, len(gs))
	for _, g := range gs {
		h := Held{Provider: g.Provider, ProjectID: g.ProjectID, ServiceAccount: g.ServiceAccount}
		for _, a := range as {
			if a.ProjectID == g.ProjectID && a.Outcome == "ok" && createdBy[a.Call] && !slices.Contains(h.Created, a.Resource) {
				h.Created = append(h.Created, a.Resource)
			}
		}
		slices.Sort(h.Created)
		out = append(out, h)
	}
	slices.SortFunc(out, func(a, b Held) int { return cmp.Compare(a.Provider, b.Provider) })
	return out, nil
}

// ForgetAccount forgets every grant of the account, as DELETE does one:
// nothing in the customer's project changes. It reports how many it
// forgot now.
func ForgetAccount(ctx context.Context, st store.Store, accountID string) (int, error) {
	n, err := store.DeleteWhere(ctx, st, CollGrants, store.Where("account_id", accountID), func(d map[string]any) string {
		p, _ := d["provider"].(string)
		if p == "" {
			return ""
		}
		return docID(accountID, p)
	})
	return n, txErr(err)
}

// PurgeActions deletes the account's actions log.
func PurgeActions(ctx context.Context, st store.Store, accountID string) (int, error) {
	n, err := store.DeleteWhere(ctx, st, CollActions, store.Where("account_id", accountID), store.Member("id"))
	return n, txErr(err)
}
