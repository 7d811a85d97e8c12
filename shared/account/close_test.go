package account_test

import (
	"context"
	"testing"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/store"
)

// What closure asks of the account service: the counts of its preview;
// revoking every unused agent key and API token (quiet the second time);
// ending the sessions; purging the records, after which the account and
// its address's index are gone and the address may sign up afresh.
func TestAccountClosure(t *testing.T) {
	ctx := context.Background()
	svc, st := newService(t)
	a, _, err := svc.CreateAccount(ctx, "ana@example.org")
	if err != nil {
		t.Fatal(err)
	}
	other, _, err := svc.CreateAccount(ctx, "bo@example.org")
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{a.ID, other.ID} {
		if _, err := svc.AdminMintAgentKey(ctx, id, "coder"); err != nil {
			t.Fatal(err)
		}
	}
	p := &account.Principal{AccountID: a.ID, Account: a, Via: "session"}
	tok, _, err := svc.CreateAPIToken(ctx, p, "reader", []string{"read"})
	if err != nil {
		t.Fatal(err)
	}
	// A session, as a sign-in leaves it.
	if err := st.RunTx(ctx, func(tx store.Tx) error {
		return tx.Create(account.CollSessions, "s1", account.Session{ID: "s1", AccountID: a.ID, ExpiresAt: 1 << 50})
	}); err != nil {
		t.Fatal(err)
	}

	c, err := svc.Counts(ctx, a.ID)
	if err != nil || c != (account.KeyCounts{UnusedAgentKeys: 1, APITokens: 1, Sessions: 1}) {
		t.Fatalf("counts %+v %v", c, err)
	}
	if n, err := svc.RevokeKeys(ctx, a.ID); err != nil || n != 2 {
		t.Fatalf("revoked %d, %v", n, err)
	}
	if n, err := svc.RevokeKeys(ctx, a.ID); err != nil || n != 0 {
		t.Fatalf("again: %d, %v", n, err)
	}
	if _, err := svc.Authenticate(ctx, a.ID, tok, "read"); errs.CodeOf(err) != errs.Unauthorized {
		t.Errorf("a revoked API token: %v", err)
	}
	if n, err := svc.EndSessions(ctx, a.ID, a.Email); err != nil || n != 1 {
		t.Fatalf("ended %d, %v", n, err)
	}
	if n, err := svc.PurgeAccount(ctx, a.ID, a.Email); err != nil || n != 2 {
		t.Fatalf("purged %d, %v", n, err)
	}
	if _, err := svc.PurgeAccount(ctx, a.ID, a.Email); err != nil {
		t.Fatalf("again: %v", err)
	}
	if _, err := svc.GetAccount(ctx, a.ID); errs.CodeOf(err) != errs.NotFound {
		t.Errorf("the account after the purge: %v", err)
	}
	if _, err := svc.AccountByEmail(ctx, a.Email); errs.CodeOf(err) != errs.NotFound {
		t.Errorf("the address after the purge: %v", err)
	}
	// The other account is untouched.
	if c, err := svc.Counts(ctx, other.ID); err != nil || c.UnusedAgentKeys != 1 {
		t.Errorf("the other account: %+v %v", c, err)
	}
	fresh, created, err := svc.CreateAccount(ctx, "ana@example.org")
	if err != nil || !created || fresh.ID == a.ID {
		t.Errorf("signing up again: %+v %v %v", fresh, created, err)
	}
}
