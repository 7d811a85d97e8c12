package credential

import (
	"context"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/store"
)

// What closure asks of the credential service: CloseAccount disables the
// account, tombstones its agents with the closure's reason, marks its apps
// revoked and revokes at the broker every key that carried an agent (the
// bootstrap credential's, the node's) and every app key; renewal is then
// refused with that reason. PurgeAccount deletes its agents, host records,
// apps and mint records, keeps the revocations and the tombstones (without
// the account id), and the agent stays refused.
func TestCloseAccount(t *testing.T) {
	ctx := context.Background()
	svc, cs, rv := newTestService(t)
	ob, err := mail.NewOutbox(filepath.Join(t.TempDir(), "outbox"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	acc := account.New(account.Config{Store: cs, Mail: ob})
	a, _, err := acc.CreateAccount(ctx, "ana@example.org")
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.RunTx(ctx, func(tx store.Tx) error {
		return tx.Update(account.CollAccounts, a.ID, map[string]any{"verified": true})
	}); err != nil {
		t.Fatal(err)
	}
	g, err := acc.AdminMintAgentKey(ctx, a.ID, "coder")
	if err != nil {
		t.Fatal(err)
	}
	agent, node := mustGen[keys.AgentRole](t), mustGen[keys.NodeRole](t)
	if _, err := svc.Bootstrap(ctx, BootstrapRequest{Token: g.Token, AgentID: agent.Public(), Proof: protocol.SignBootstrap(agent, g.Token)}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.NodeCredential(ctx, nodeRequest(t, node, agent)); err != nil {
		t.Fatal(err)
	}
	app, err := svc.CreateApp(ctx, a.ID, "dashboard")
	if err != nil {
		t.Fatal(err)
	}
	bootKey := mintedKey(t, cs, "bootstrap")

	closed, err := svc.CloseAccount(ctx, a.ID)
	if err != nil || !slices.Equal(closed.Agents, []string{agent.Public()}) || closed.Revoked != 3 {
		t.Fatalf("closed %+v, %v", closed, err)
	}
	for _, k := range []string{bootKey, node.Public(), app.PublicKey} {
		if !slices.Contains(rv.keys, k) {
			t.Errorf("%s was not revoked at the broker (%v)", k, rv.keys)
		}
	}
	acct, _ := acc.GetAccount(ctx, a.ID)
	if !acct.Disabled {
		t.Error("the account is not disabled")
	}
	_, err = svc.NodeCredential(ctx, nodeRequest(t, node, agent))
	if errs.CodeOf(err) != errs.Forbidden || !strings.Contains(err.Error(), ReasonAccountClosed) {
		t.Fatalf("renewal after closing: %v", err)
	}
	if again, err := svc.CloseAccount(ctx, a.ID); err != nil || again.Revoked != 3 {
		t.Fatalf("again: %+v %v", again, err)
	}

	if _, err := svc.PurgeAccount(ctx, a.ID, closed.Agents); err != nil {
		t.Fatal(err)
	}
	for _, coll := range []string{CollAgents, CollApps, CollMints} {
		var left []map[string]any
		if err := store.List(ctx, cs, coll, store.Where("account_id", a.ID), &left); err != nil || len(left) != 0 {
			t.Errorf("%s left: %v %v", coll, left, err)
		}
	}
	var hs hosts
	if err := store.Get(ctx, cs, CollHosts, agent.Public(), &hs); err == nil {
		t.Errorf("host record left: %+v", hs)
	}
	var tomb Tombstone
	if err := store.Get(ctx, cs, CollTombstones, agent.Public(), &tomb); err != nil || tomb.AccountID != "" || tomb.Reason != ReasonAccountClosed {
		t.Errorf("tombstone %+v %v", tomb, err)
	}
	var revs []revocation
	if err := store.List(ctx, cs, CollRevocations, store.Query{}, &revs); err != nil || len(revs) != 3 {
		t.Errorf("revocations %v %v", revs, err)
	}
	if _, err := svc.NodeCredential(ctx, nodeRequest(t, node, agent)); errs.CodeOf(err) != errs.Forbidden {
		t.Errorf("renewal after the purge: %v", err)
	}
}

// mintedKey is the credential key of the one mint of kind.
func mintedKey(t *testing.T, st store.Store, kind string) string {
	t.Helper()
	var ms []Mint
	if err := store.List(context.Background(), st, CollMints, store.Where("kind", kind), &ms); err != nil || len(ms) != 1 {
		t.Fatalf("mints of kind %s: %v %v", kind, ms, err)
	}
	return ms[0].Key
}

// Closure revokes every unexpired credential minted for the account or
// its agents, not only the last maxHostKeys keys each agent's host record
// remembers: here more node credentials than that carried the agent, and
// one node credential was minted for it before any account owned it (its
// mint record names no account). An expired mint's key is left alone.
func TestCloseAccountRevokesEveryLiveMint(t *testing.T) {
	ctx := context.Background()
	svc, cs, rv := newTestService(t)
	ob, err := mail.NewOutbox(filepath.Join(t.TempDir(), "outbox"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	acc := account.New(account.Config{Store: cs, Mail: ob})
	a, _, err := acc.CreateAccount(ctx, "ana@example.org")
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.RunTx(ctx, func(tx store.Tx) error {
		return tx.Update(account.CollAccounts, a.ID, map[string]any{"verified": true})
	}); err != nil {
		t.Fatal(err)
	}
	agent := mustGen[keys.AgentRole](t)
	// Before the account owns the agent: a node credential for it.
	early := mustGen[keys.NodeRole](t)
	if _, err := svc.NodeCredential(ctx, nodeRequest(t, early, agent)); err != nil {
		t.Fatal(err)
	}
	g, err := acc.AdminMintAgentKey(ctx, a.ID, "coder")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Bootstrap(ctx, BootstrapRequest{Token: g.Token, AgentID: agent.Public(), Proof: protocol.SignBootstrap(agent, g.Token)}); err != nil {
		t.Fatal(err)
	}
	want := []string{early.Public(), mintedKey(t, cs, "bootstrap")}
	for range maxHostKeys + 3 {
		node := mustGen[keys.NodeRole](t)
		if _, err := svc.NodeCredential(ctx, nodeRequest(t, node, agent)); err != nil {
			t.Fatal(err)
		}
		want = append(want, node.Public())
	}
	expired := mustGen[keys.NodeRole](t).Public()
	if err := cs.RunTx(ctx, func(tx store.Tx) error {
		return tx.Create(CollMints, "expired", Mint{ID: "expired", Kind: "node", Key: expired, Agents: []string{agent.Public()}, AccountID: a.ID,
			IssuedAt: ms(time.Now().Add(-2 * time.Hour)), ExpiresAt: ms(time.Now().Add(-time.Hour))})
	}); err != nil {
		t.Fatal(err)
	}
	var hs hosts
	if err := store.Get(ctx, cs, CollHosts, agent.Public(), &hs); err != nil || len(hs.Keys) != maxHostKeys {
		t.Fatalf("host record: %d keys, %v", len(hs.Keys), err)
	}

	closed, err := svc.CloseAccount(ctx, a.ID)
	if err != nil || closed.Revoked != len(want) {
		t.Fatalf("closed %+v, %v; want %d revoked", closed, err, len(want))
	}
	for _, k := range want {
		if !slices.Contains(rv.keys, k) {
			t.Errorf("%s was not revoked at the broker", k)
		}
	}
	if slices.Contains(rv.keys, expired) {
		t.Error("an expired credential's key was revoked")
	}
}
