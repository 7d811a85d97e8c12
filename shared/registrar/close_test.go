package registrar_test

import (
	"slices"
	"testing"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/registrar"
	"agentmesh.dev/mesh/shared/store"
)

// Account closure: the handles of an account are those it owns and those
// claimed under its address; releasing them deletes them with their
// pending pairing codes (resolve then answers NOT_FOUND, and the name can
// be claimed again), leaves other addresses' alone, and is quiet the
// second time; ending the address's sessions makes its token unknown.
func TestReleaseHandlesForClosure(t *testing.T) {
	e := newEnv(t)
	ctx := t.Context()
	tok := e.session("ana@example.org")
	coder := e.claim(tok, "coder", "Ana Example")
	helper := e.claim(tok, "helper", "")
	other := e.claim(e.session("bo@example.org"), "coder", "Bo")
	// One handle is owned by the account too (the agent key exchange's).
	if err := e.st.RunTx(ctx, func(tx store.Tx) error {
		return tx.Update(account.CollHandles, registrar.HandleID(coder), map[string]any{"account_id": "acct_1"})
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.StartPairing(ctx, tok, helper); err != nil {
		t.Fatal(err)
	}

	hs, err := e.svc.HandlesOf(ctx, "acct_1", "ana@example.org")
	if err != nil || len(hs) != 2 || hs[0].Handle != coder || hs[1].Handle != helper {
		t.Fatalf("handles of the account: %+v %v", hs, err)
	}
	released, err := e.svc.ReleaseHandles(ctx, "acct_1", "ana@example.org")
	if err != nil || !slices.Equal(released, []string{coder, helper}) {
		t.Fatalf("released %v, %v", released, err)
	}
	for _, h := range []string{coder, helper} {
		if _, err := e.svc.Resolve(ctx, h, ""); errs.CodeOf(err) != errs.NotFound {
			t.Errorf("resolve %s after the release: %v", h, err)
		}
	}
	if _, err := e.svc.Resolve(ctx, other, ""); err != nil {
		t.Errorf("another address's handle: %v", err)
	}
	var codes []map[string]any
	if err := store.List(ctx, e.st, registrar.CollPairing, store.Query{}, &codes); err != nil || len(codes) != 0 {
		t.Errorf("pairing codes left: %v %v", codes, err)
	}
	if released, err := e.svc.ReleaseHandles(ctx, "acct_1", "ana@example.org"); err != nil || len(released) != 0 {
		t.Errorf("again: %v %v", released, err)
	}

	n, err := e.svc.EndSessions(ctx, "ana@example.org")
	if err != nil || n != 1 {
		t.Fatalf("ended %d sessions, %v", n, err)
	}
	if _, err := e.svc.Claim(ctx, tok, "again", ""); errs.CodeOf(err) != errs.Unauthorized {
		t.Errorf("the ended session claims: %v", err)
	}
	// The name is free for whoever proves the address again.
	if h := e.claim(e.session("ana@example.org"), "coder", "Ana Again"); h != coder {
		t.Errorf("claimed again: %s", h)
	}
}
