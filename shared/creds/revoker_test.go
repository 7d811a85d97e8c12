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

// The cloud's Revoker brings the cluster's list in line with the store's
// records: a missing revocation comes back, a forgotten one goes unless it
// was revoked later, and a revocation in neither list stays.
func TestRevokerSyncsOverNATS(t *testing.T) {
	m := startMesh(t)
	sys, err := m.ConnectSystem("test-syncer")
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Close()
	r := &creds.Revoker{Trust: m.Trust(), Sys: sys}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	old, later, byHand, lost := agentCredKey(t), agentCredKey(t), agentCredKey(t), agentCredKey(t)
	now := time.Now().Truncate(time.Second)
	for k, at := range map[string]time.Time{old: now.Add(-40 * 24 * time.Hour), later: now, byHand: now.Add(-400 * 24 * time.Hour)} {
		if err := r.Revoke(ctx, []string{k}, at); err != nil {
			t.Fatal(err)
		}
	}
	keep := map[string]time.Time{lost: now}
	forget := map[string]time.Time{old: now.Add(-40 * 24 * time.Hour), later: now.Add(-40 * 24 * time.Hour)}
	if added, forgotten, err := r.SyncRevocations(ctx, keep, forget); err != nil || added != 1 || forgotten != 1 {
		t.Fatalf("sync: added %d, forgotten %d, %v", added, forgotten, err)
	}
	msg, err := sys.RequestWithContext(ctx, creds.AccountLookupSubject(m.Trust().PublicKeys().MeshAccount), nil)
	if err != nil {
		t.Fatal(err)
	}
	claims, err := jwt.DecodeAccountClaims(string(msg.Data))
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]bool{old: false, later: true, byHand: true, lost: true} {
		if got := !creds.RevokedAt(claims, k).IsZero(); got != want {
			t.Errorf("after sync: %s revoked %v, want %v", k, got, want)
		}
	}
	if added, forgotten, err := r.SyncRevocations(ctx, keep, forget); err != nil || added+forgotten != 0 {
		t.Errorf("second sync: added %d, forgotten %d, %v (nothing left to do)", added, forgotten, err)
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

// Two revokers (two copies of the rooms worker, or a copy and the control
// plane) revoking different keys at the same moments: each reads the same
// account JWT, adds its own key and pushes; the resolver keeps one of two
// JWTs issued in one second, so without reading back one revocation
// would be lost. Every key is revoked at the end.
func TestConcurrentRevokersLoseNothing(t *testing.T) {
	m := startMesh(t)
	const rounds = 4
	revokers := make([]*creds.Revoker, 2)
	for i := range revokers {
		sys, err := m.ConnectSystem("test-revoker")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(sys.Close)
		revokers[i] = &creds.Revoker{Trust: m.Trust(), Sys: sys}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	keysOf := make([][]string, len(revokers))
	for i := range keysOf {
		for range rounds {
			keysOf[i] = append(keysOf[i], agentCredKey(t))
		}
	}
	errc := make(chan error, len(revokers)*rounds)
	for round := range rounds {
		// Both start each round together, so both read the same JWT.
		start := make(chan struct{})
		done := make(chan struct{}, len(revokers))
		for i, r := range revokers {
			go func() {
				<-start
				errc <- r.Revoke(ctx, []string{keysOf[i][round]}, time.Now())
				done <- struct{}{}
			}()
		}
		close(start)
		for range revokers {
			<-done
		}
	}
	close(errc)
	for err := range errc {
		if err != nil {
			t.Fatal(err)
		}
	}
	msg, err := revokers[0].Sys.RequestWithContext(ctx, creds.AccountLookupSubject(m.Trust().PublicKeys().MeshAccount), nil)
	if err != nil {
		t.Fatal(err)
	}
	claims, err := jwt.DecodeAccountClaims(string(msg.Data))
	if err != nil {
		t.Fatal(err)
	}
	lost := 0
	for i := range keysOf {
		for round, k := range keysOf[i] {
			if creds.RevokedAt(claims, k).IsZero() {
				t.Errorf("revoker %d, round %d: revocation of %s lost", i, round, k)
				lost++
			}
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d revocations lost", lost, len(revokers)*rounds)
	}
}
