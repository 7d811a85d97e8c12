package devenv

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// TestRoomCredentialsOnTheMesh: the rooms worker's Credentials on this
// mesh mint room credentials the mesh's broker accepts, and revoking one
// closes its live connection and refuses it from then on, on one server
// and on a cluster (where the revocation reaches every member).
func TestRoomCredentialsOnTheMesh(t *testing.T) {
	for _, cluster := range []int{0, 3} {
		t.Run(fmt.Sprintf("cluster of %d", cluster), func(t *testing.T) {
			if cluster > 0 && testing.Short() {
				t.Skip("starts a three-server cluster")
			}
			m, err := Start(t.Context(), Config{DataDir: t.TempDir(), Cluster: cluster, ClusterResolverSync: 200 * time.Millisecond,
				Workers: WorkerConfig{None: true}})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			member, err := keys.Generate[keys.AgentRole]()
			if err != nil {
				t.Fatal(err)
			}
			rc := m.roomCredentials()
			cred, err := rc.MintRoom("room-1", member.Public(), time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			key, err := keys.FromSeed[keys.CredentialRole]([]byte(cred.Seed))
			if err != nil || key.Public() != cred.UserKey {
				t.Fatalf("the seed is not the credential's key: %v", err)
			}
			dial := func(url string) (*nats.Conn, chan struct{}, error) {
				closed := make(chan struct{})
				nc, err := nats.Connect(url, nats.UserJWT(func() (string, error) { return cred.JWT, nil }, key.SignNonce),
					nats.CustomInboxPrefix(protocol.ACLRoomInboxPrefix("room-1")), nats.NoReconnect(),
					nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}), // the revocation, expected
					nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
				return nc, closed, err
			}
			nc, closed, err := dial(m.URLs().MeshTCP)
			if err != nil {
				t.Fatalf("connect with the room credential: %v", err)
			}
			defer nc.Close()
			sub, err := nc.SubscribeSync(protocol.ACLRoomSubject("room-1", "main"))
			if err != nil {
				t.Fatal(err)
			}
			if err := nc.Publish(protocol.ACLRoomSubject("room-1", "main"), []byte("hi")); err != nil {
				t.Fatal(err)
			}
			if msg, err := sub.NextMsg(asyncWait); err != nil || string(msg.Data) != "hi" {
				t.Fatalf("the room's own traffic: %v %v", msg, err)
			}

			start := time.Now()
			if err := rc.Revoke(t.Context(), []string{cred.UserKey}, cred.Expires); err != nil {
				t.Fatal(err)
			}
			select {
			case <-closed:
				t.Logf("the room connection closed %s after the revocation was asked for", time.Since(start).Round(time.Microsecond))
			case <-time.After(asyncWait):
				t.Fatalf("the revoked room credential's connection is open %s later", asyncWait)
			}
			// Every server refuses it (a cluster's members take the update
			// from one push, each as it arrives).
			for _, url := range strings.Split(m.URLs().MeshTCP, ",") {
				deadline := time.Now().Add(asyncWait)
				for {
					nc, _, err := dial(url)
					if err != nil {
						break
					}
					nc.Close()
					if time.Now().After(deadline) {
						t.Fatalf("%s still accepts the revoked room credential %s later", url, asyncWait)
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
		})
	}
}
