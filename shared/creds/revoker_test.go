package creds_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/keys"
)

// The NATS-only Revoker (the cloud's) cuts a live connection off and keeps
// the revocations already in the account JWT.
func TestRevokerOverNATS(t *testing.T) {
	m := startMesh(t)
	sys, err := m.ConnectSystem("test-revoker")
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Close()
	r := &creds.Revoker{Trust: m.Trust(), Sys: sys}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()

	earlier, err := keys.Generate[keys.CredentialRole]()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Revoke(ctx, []string{earlier.Public()}, time.Now()); err != nil {
		t.Fatal(err)
	}

	nodeKey, err := keys.Generate[keys.NodeRole]()
	if err != nil {
		t.Fatal(err)
	}
	roster := []string{agentKey(t)}
	userJWT := mint(t, m, creds.UserSpec{PublicKey: nodeKey.Public(), Name: "node", Kind: creds.KindNode, Hosted: roster,
		Permissions: creds.NodePermissions(roster, creds.PrivateOnly(nodeKey.Public())), Expires: time.Now().Add(time.Hour)})
	w := dial(t, m, userJWT, nodeKey.SignNonce)
	if err := r.Revoke(ctx, []string{nodeKey.Public()}, time.Now()); err != nil {
		t.Fatal(err)
	}
	expectAsync(t, w.errs, nats.ErrAuthRevoked)

	msg, err := sys.RequestWithContext(ctx, creds.AccountLookupSubject(m.Trust().PublicKeys().MeshAccount), nil)
	if err != nil {
		t.Fatal(err)
	}
	claims, err := jwt.DecodeAccountClaims(string(msg.Data))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{earlier.Public(), nodeKey.Public()} {
		if creds.RevokedAt(claims, k).IsZero() {
			t.Errorf("revocation of %s lost", k)
		}
	}
}

// The cloud's Revoker prunes old revocations on the running cluster and
// keeps the recent ones.
func TestRevokerPrunesOverNATS(t *testing.T) {
	m := startMesh(t)
	sys, err := m.ConnectSystem("test-pruner")
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Close()
	r := &creds.Revoker{Trust: m.Trust(), Sys: sys}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	old, recent := agentCredKey(t), agentCredKey(t)
	now := time.Now()
	if err := r.Revoke(ctx, []string{old}, now.Add(-40*24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := r.Revoke(ctx, []string{recent}, now); err != nil {
		t.Fatal(err)
	}
	if n, err := r.PruneRevocations(ctx, now.Add(-31*24*time.Hour)); err != nil || n != 1 {
		t.Fatalf("prune: %d, %v", n, err)
	}
	msg, err := sys.RequestWithContext(ctx, creds.AccountLookupSubject(m.Trust().PublicKeys().MeshAccount), nil)
	if err != nil {
		t.Fatal(err)
	}
	claims, err := jwt.DecodeAccountClaims(string(msg.Data))
	if err != nil {
		t.Fatal(err)
	}
	if !creds.RevokedAt(claims, old).IsZero() || creds.RevokedAt(claims, recent).IsZero() {
		t.Errorf("after pruning: old %v, recent %v", creds.RevokedAt(claims, old), creds.RevokedAt(claims, recent))
	}
	if n, err := r.PruneRevocations(ctx, now.Add(-31*24*time.Hour)); err != nil || n != 0 {
		t.Errorf("second prune: %d, %v (nothing left to prune)", n, err)
	}
}

func agentCredKey(t *testing.T) string {
	t.Helper()
	k, err := keys.Generate[keys.CredentialRole]()
	if err != nil {
		t.Fatal(err)
	}
	return k.Public()
}
