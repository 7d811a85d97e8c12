package registrar_test

import (
	"context"
	"testing"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/registrar"
	"agentmesh.dev/mesh/shared/store"
)

// accountOf reads the account of an address straight from the store.
func (e *env) accountOf(email string) *account.Account {
	e.t.Helper()
	var a *account.Account
	if err := e.st.RunTx(e.t.Context(), func(tx store.Tx) error {
		var err error
		a, err = account.AccountOfEmail(tx, email)
		return err
	}); err != nil {
		e.t.Fatal(err)
	}
	return a
}

// The operator name of a claim lives on the address's account, the one
// place every door reads and writes: an address with no account gets one
// (unverified) to hold it, an account's own name wins over one given at a
// claim, and the cards show the account's name.
func TestOperatorNameLivesOnTheAccount(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)

	// A first claim from an address with no account.
	h := e.claim(e.session("ana@example.org"), "coder", "Ana López")
	a := e.accountOf("ana@example.org")
	if a == nil || a.OperatorName != "Ana López" || a.Verified {
		t.Fatalf("the account after a registrar claim: %+v, want an unverified one named Ana López", a)
	}
	if n := e.count(registrar.CollOperators); n != 0 {
		t.Errorf("%d operator records kept by the registrar itself", n)
	}

	// A name set on the account elsewhere (a minted key, the console) is
	// what the registrar answers and the cards show, and no claim
	// without a name is refused for want of one.
	svc := account.New(account.Config{Store: e.st, Mail: nopMail{}})
	acct, _, err := svc.CreateAccount(ctx, "ops@example.org")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.AdminMintAgentKeyFor(ctx, acct.ID, "builder", "Ops Team"); err != nil {
		t.Fatal(err)
	}
	ops := e.session("ops@example.org")
	c, err := e.svc.Claim(ctx, ops, "helper", "")
	if err != nil || c.OperatorName != "Ops Team" {
		t.Fatalf("claim for an account named at minting: %+v %v", c, err)
	}
	if c, err := e.svc.Claim(ctx, ops, "second", "Another Name"); err != nil || c.OperatorName != "Ops Team" {
		t.Fatalf("a later name at a claim: %+v %v", c, err)
	}
	if r, err := e.svc.Resolve(ctx, c.Handle, ""); err != nil || r.Card.Operator.Name != "Ops Team" {
		t.Fatalf("card: %+v %v", r.Card, err)
	}

	// Should the account's name differ from a handle's copy (data from
	// before the name moved to accounts), the card shows the account's.
	if err := e.st.RunTx(ctx, func(tx store.Tx) error {
		return tx.Update(account.CollAccounts, a.ID, map[string]any{"operator_name": "Ana L."})
	}); err != nil {
		t.Fatal(err)
	}
	if r, err := e.svc.Resolve(ctx, h, ""); err != nil || r.Card.Operator.Name != "Ana L." {
		t.Fatalf("card of a handle whose account's name differs from its copy: %+v %v", r.Card, err)
	}
}

type nopMail struct{}

func (nopMail) Send(context.Context, mail.Message) error { return nil }

// Operator names the registrar kept itself before (CollOperators) move to
// the accounts: at the address's next claim, and at the next sweep for the
// rest. An account's own name stays.
func TestLegacyOperatorNamesMoveToAccounts(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	legacy := func(email, name string) {
		t.Helper()
		if err := e.st.RunTx(ctx, func(tx store.Tx) error {
			return tx.Set(registrar.CollOperators, email, map[string]any{"email": email, "name": name, "set_at": 1})
		}); err != nil {
			t.Fatal(err)
		}
	}
	legacy("old@example.org", "Old Name")
	legacy("quiet@example.org", "Quiet Name")
	legacy("named@example.org", "Registrar Name")
	svc := account.New(account.Config{Store: e.st, Mail: nopMail{}})
	named, _, err := svc.CreateAccount(ctx, "named@example.org")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.AdminMintAgentKeyFor(ctx, named.ID, "x", "Account Name"); err != nil {
		t.Fatal(err)
	}

	// At the address's next claim its name moves to its account, and
	// wins over one given now.
	old := e.session("old@example.org")
	c, err := e.svc.Claim(ctx, old, "coder", "Ignored")
	if err != nil || c.OperatorName != "Old Name" {
		t.Fatalf("claim of an address with a legacy name: %+v %v", c, err)
	}
	if a := e.accountOf("old@example.org"); a == nil || a.OperatorName != "Old Name" {
		t.Fatalf("the legacy name did not move to the account: %+v", a)
	}
	if _, err := e.svc.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if n := e.count(registrar.CollOperators); n != 0 {
		t.Errorf("%d legacy records left after the sweep", n)
	}
	if a := e.accountOf("quiet@example.org"); a == nil || a.OperatorName != "Quiet Name" {
		t.Errorf("the sweep did not move quiet@'s name: %+v", a)
	}
	if a := e.accountOf("named@example.org"); a == nil || a.OperatorName != "Account Name" {
		t.Errorf("the sweep replaced an account's own name: %+v", a)
	}
}
