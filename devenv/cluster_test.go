package devenv

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/broker"
)

// With Cluster set, the mesh runs on three brokers forming one JetStream
// cluster: its URLs list every member, every stream and bucket the workers
// make is R3 and fully replicated, and the mesh answers /healthz.
func TestMeshOnACluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-server cluster")
	}
	m, err := Start(t.Context(), Config{DataDir: t.TempDir(), Cluster: 3, ClusterResolverSync: 200 * time.Millisecond,
		Workers: WorkerConfig{Copies: 2}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.Cluster() == nil || m.Broker() != nil {
		t.Fatal("the mesh is not on a cluster")
	}
	if n := len(strings.Split(m.URLs().MeshTCP, ",")); n != 3 {
		t.Fatalf("mesh_tcp_url %q lists %d servers", m.URLs().MeshTCP, n)
	}
	if n := len(strings.Split(m.URLs().MeshWS, ",")); n != 3 {
		t.Fatalf("mesh_ws_url %q lists %d servers", m.URLs().MeshWS, n)
	}
	resp, err := http.Get(m.URLs().Control + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz %d", resp.StatusCode)
	}
	nc, err := m.ConnectService("test")
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
	rs, err := broker.WaitReplicated(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) < 8 {
		t.Fatalf("only %d streams: %v", len(rs), rs)
	}
	for _, r := range rs {
		if r.Replicas != 3 {
			t.Errorf("%s is R%d on the cluster", r.Stream, r.Replicas)
		}
	}
}
