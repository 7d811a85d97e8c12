package account_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/store"
	"agentmesh.dev/mesh/shared/store/boltstore"
)

// The note a new agent key carries says which handle its label claims, or
// plainly why it claims none, as the key exchange would decide it.
func TestHandleNote(t *testing.T) {
	named := account.Account{ID: "acct_1", Email: "ana@example.org", Verified: true, OperatorName: "Ana"}
	unnamed := named
	unnamed.OperatorName = ""
	for _, tc := range []struct {
		name  string
		label string
		acct  account.Account
		h     *account.Handle
		want  []string
	}{
		{"space", "my agent", named, nil, []string{"No handle", `"my agent"`, "space or an @"}},
		{"at", "a@b", named, nil, []string{"No handle", "space or an @"}},
		{"no operator name", "coder", unnamed, nil, []string{"No handle yet", "coder.ana@example.org", "no operator name", "--operator NAME"}},
		{"free", "coder", named, nil, []string{"claims the handle coder.ana@example.org"}},
		{"held by this account", "coder", named, &account.Handle{Handle: "Coder.ana@example.org", AccountID: "acct_1", Email: "ana@example.org"},
			[]string{"binds the handle Coder.ana@example.org"}},
		{"claimed at the registrar before the account", "coder", named, &account.Handle{Handle: "coder.ana@example.org", Email: "ana@example.org"},
			[]string{"No handle", "before this account's address was verified", "pairing code"}},
		{"another account", "coder", named, &account.Handle{Handle: "coder.ana@example.org", AccountID: "acct_2", Email: "ana@example.org"},
			[]string{"No handle", "before this account's address"}},
		{"taken", "coder", named, &account.Handle{Handle: "coder.ana@example.org", AccountID: "acct_2", Email: "x@example.org"},
			[]string{"No handle", "taken by another account"}},
		{"bound", "coder", named, &account.Handle{Handle: "coder.ana@example.org", AccountID: "acct_1", Email: "ana@example.org", AgentID: "UAGENT"},
			[]string{"No handle, unless", "bound to agent UAGENT"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := account.HandleNote(tc.label, tc.acct, tc.h)
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("HandleNote = %q, want it to say %q", got, w)
				}
			}
			if strings.Count(got, ". ")+1 > 3 || !strings.HasSuffix(got, ".") {
				t.Errorf("HandleNote = %q: want a sentence or two", got)
			}
		})
	}
}

func newService(t *testing.T) (*account.Service, store.Store) {
	t.Helper()
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "control.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	ob, err := mail.NewOutbox(filepath.Join(t.TempDir(), "outbox"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	return account.New(account.Config{Store: st, Mail: ob}), st
}

// Minting names the operator only when the account has none; the answer
// carries the name in force and the note about the handle.
func TestMintKeepsTheFirstOperatorName(t *testing.T) {
	ctx := context.Background()
	svc, _ := newService(t)
	a, _, err := svc.CreateAccount(ctx, "ana@example.org")
	if err != nil {
		t.Fatal(err)
	}
	g, err := svc.AdminMintAgentKey(ctx, a.ID, "coder")
	if err != nil || g.OperatorName != "" || !strings.Contains(g.HandleNote, "no operator name") {
		t.Fatalf("mint with no operator name: %+v %v", g, err)
	}
	g, err = svc.AdminMintAgentKeyFor(ctx, a.ID, "coder", "Ana López")
	if err != nil || g.OperatorName != "Ana López" || !strings.Contains(g.HandleNote, "claims the handle coder.ana@example.org") {
		t.Fatalf("mint naming the operator: %+v %v", g, err)
	}
	g, err = svc.AdminMintAgentKeyFor(ctx, a.ID, "writer", "Someone Else")
	if err != nil || g.OperatorName != "Ana López" {
		t.Fatalf("a later name: %+v %v", g, err)
	}
	if got, _ := svc.GetAccount(ctx, a.ID); got.OperatorName != "Ana López" {
		t.Errorf("account operator name = %q", got.OperatorName)
	}
	if svc.OutboxDir() == "" {
		t.Error("OutboxDir is empty with an outbox sender")
	}
}
