package broker_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/broker"
	"agentmesh.dev/mesh/shared/creds"
)

func startCluster(t *testing.T, dir string, trust *creds.Trust) *broker.Cluster {
	t.Helper()
	c, err := broker.StartCluster(t.Context(), broker.ClusterConfig{DataDir: dir, Trust: trust, Name: "test",
		ResolverSync: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Shutdown)
	return c
}

// Three members form one JetStream cluster: an R3 stream keeps every
// acknowledged message through the loss of the member that led it, takes
// writes while that member is down, and is whole again on all three after
// the member returns on its ports and directory.
func TestClusterKeepsAcknowledgedWritesThroughAMemberLoss(t *testing.T) {
	trust, err := creds.Generate()
	if err != nil {
		t.Fatal(err)
	}
	c := startCluster(t, t.TempDir(), trust)
	if c.Size() != 3 || !c.Healthy() || len(strings.Split(c.ClientURL(), ",")) != 3 {
		t.Fatalf("size %d healthy %t urls %q", c.Size(), c.Healthy(), c.ClientURL())
	}
	nc, err := c.ConnectService("test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "R3", Subjects: []string{"r3.>"}, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	acked := map[uint64]string{}
	publish := func(n int, tag string) {
		for i := range n {
			body := fmt.Sprintf("%s-%d", tag, i)
			// A publish may fail while leaders move; only acknowledged ones
			// count. One whose ack was lost with the server waits out its
			// own timeout, not the test's.
			pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			ack, err := js.Publish(pctx, "r3."+tag, []byte(body))
			cancel()
			if err == nil {
				acked[ack.Sequence] = body
			}
		}
	}
	publish(50, "before")
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	leader := -1
	for i := range c.Size() {
		if c.ServerName(i) == info.Cluster.Leader {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatalf("leader %q is not a member", info.Cluster.Leader)
	}
	if err := c.Kill(leader); err != nil {
		t.Fatal(err)
	}
	// Healthy once the cluster's own connection has moved to another
	// member, if it was on the one killed.
	if c.Server(leader) != nil || c.Running() != 2 {
		t.Fatalf("after the kill: running %d", c.Running())
	}
	for !c.Healthy() {
		select {
		case <-ctx.Done():
			t.Fatal("two members of three running, and the cluster is not healthy")
		case <-time.After(20 * time.Millisecond):
		}
	}
	publish(50, "during")
	if err := c.Restart(ctx, leader); err != nil {
		t.Fatal(err)
	}
	publish(50, "after")
	rs, err := broker.WaitReplicated(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 || rs[0].Replicas != 3 || !rs[0].Full() {
		t.Fatalf("replication %v", rs)
	}
	if len(acked) < 100 {
		t.Fatalf("only %d of 150 publishes acknowledged", len(acked))
	}
	for seq, body := range acked {
		m, err := st.GetMsg(ctx, seq)
		if err != nil || string(m.Data) != body {
			t.Fatalf("acknowledged message %d (%s) lost: %v", seq, body, err)
		}
	}
	// Full means the returned member is current with the leader too.
}

// An account update pushed once reaches every running member; one pushed
// while a member is down reaches it from the others once it is back, and
// a credential revoked then cannot connect to it.
func TestClusterRevocationReachesAReturningMember(t *testing.T) {
	trust, err := creds.Generate()
	if err != nil {
		t.Fatal(err)
	}
	c := startCluster(t, t.TempDir(), trust)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	early, err := trust.MintServiceUser("early")
	if err != nil {
		t.Fatal(err)
	}
	late, err := trust.MintServiceUser("late")
	if err != nil {
		t.Fatal(err)
	}
	revoke := func(u creds.UserCreds) {
		t.Helper()
		if err := c.UpdateMeshAccount(ctx, func(ac *jwt.AccountClaims) error {
			return creds.RevokeCredentials(ac, time.Now(), u.Key.Public())
		}); err != nil {
			t.Fatal(err)
		}
	}
	revoked := func(i int, u creds.UserCreds) bool {
		ac, err := c.Server(i).MeshAccountClaims()
		if err != nil {
			t.Fatal(err)
		}
		_, ok := ac.Revocations[u.Key.Public()]
		return ok
	}
	waitRevoked := func(i int, u creds.UserCreds) {
		t.Helper()
		for !revoked(i, u) {
			select {
			case <-ctx.Done():
				t.Fatalf("member %d never learnt the revocation of %s", i, u.Key.Public())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}

	revoke(early)
	for i := range c.Size() {
		waitRevoked(i, early)
	}

	const down = 2
	if err := c.Kill(down); err != nil {
		t.Fatal(err)
	}
	revoke(late)
	if err := c.Restart(ctx, down); err != nil {
		t.Fatal(err)
	}
	waitRevoked(down, late)
	// Both revocations hold on the returning member: the late one was not
	// overwritten by its stale copy, nor the early one dropped.
	if !revoked(down, early) {
		t.Fatal("the returning member lost the earlier revocation")
	}
	for i := range c.Size() {
		if !revoked(i, late) || !revoked(i, early) {
			t.Fatalf("member %d lacks a revocation after the sync", i)
		}
	}
	// The broker refuses the revoked credential on the returned member.
	_, err = nats.Connect(c.ClientURLs()[down], late.NATSOption(), nats.MaxReconnects(0))
	if err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Fatalf("a revoked credential connected to the returned member: %v", err)
	}
	// A credential that is not revoked still connects there.
	fresh, err := trust.MintServiceUser("fresh")
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(c.ClientURLs()[down], fresh.NATSOption(), nats.MaxReconnects(0))
	if err != nil {
		t.Fatalf("a good credential cannot connect to the returned member: %v", err)
	}
	nc.Close()
	// An edit that changes nothing succeeds and pushes nothing, as on one
	// broker (the credential sweep's SyncRevocations, when in line).
	before, err := c.Server(0).MeshAccountClaims()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.UpdateMeshAccount(ctx, func(*jwt.AccountClaims) error { return broker.ErrUnchanged }); err != nil {
		t.Fatalf("an unchanged edit: %v", err)
	}
	if after, err := c.Server(0).MeshAccountClaims(); err != nil || after.IssuedAt != before.IssuedAt {
		t.Errorf("an unchanged edit pushed a new account JWT (%v)", err)
	}
}

// The cloud's NATS-only revoker (creds.Revoker) builds each update on the
// newest JWT any member holds: a member back from an outage, whose
// resolver has not synced yet, answers lookups with the JWT it had, and an
// update built on that one would drop the revocations made while it was
// down.
func TestRevokerOnAClusterIgnoresAStaleMember(t *testing.T) {
	trust, err := creds.Generate()
	if err != nil {
		t.Fatal(err)
	}
	// No resolver sync during the test: the returning member stays stale.
	c, err := broker.StartCluster(t.Context(), broker.ClusterConfig{DataDir: t.TempDir(), Trust: trust, Name: "test",
		ResolverSync: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Shutdown)
	sys, err := c.ConnectSystem("revoker")
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Close()
	r := &creds.Revoker{Trust: trust, Sys: sys}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	k1, _ := trust.MintServiceUser("k1")
	k2, _ := trust.MintServiceUser("k2")

	const down = 1
	if err := c.Kill(down); err != nil {
		t.Fatal(err)
	}
	if err := r.Revoke(ctx, []string{k1.Key.Public()}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := c.Restart(ctx, down); err != nil {
		t.Fatal(err)
	}
	if ac, err := c.Server(down).MeshAccountClaims(); err != nil || ac.Revocations[k1.Key.Public()] != 0 {
		t.Fatalf("the returning member is not stale (%v); the test proves nothing", err)
	}
	// Wait until the returning member's route is up, so it answers lookups.
	for !routed(c, down) {
		select {
		case <-ctx.Done():
			t.Fatal("the returning member never joined the routes")
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err := r.Revoke(ctx, []string{k2.Key.Public()}, time.Now()); err != nil {
		t.Fatal(err)
	}
	for i := range c.Size() {
		for {
			ac, err := c.Server(i).MeshAccountClaims()
			if err != nil {
				t.Fatal(err)
			}
			if ac.Revocations[k2.Key.Public()] != 0 {
				if ac.Revocations[k1.Key.Public()] == 0 {
					t.Fatalf("member %d: the revocation made while member %d was down is lost", i, down)
				}
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("member %d never took the second revocation", i)
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
}

// routed reports whether member i has routes to every other member.
func routed(c *broker.Cluster, i int) bool {
	return c.Server(i).Routes() >= c.Size()-1
}
