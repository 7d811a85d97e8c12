package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/devenv"
	"agentmesh.dev/mesh/shared/broker"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/keys"
)

// target is the mesh the load goes to: its broker's TCP address and the
// trust chain that mints meshbench's credentials. Every row connects over
// TCP, in-process mesh or not, so they all pay the same transport.
type target struct {
	name  string
	url   string
	trust *creds.Trust
	close func()
	// cluster is the in-process mesh's cluster (--cluster), else nil.
	cluster *broker.Cluster
}

// openTarget reads a running meshd's data directory, or starts a mesh.
func openTarget(ctx context.Context, o options, progress io.Writer) (*target, error) {
	if o.inProcess || o.cluster {
		return startMesh(ctx, o.cluster, progress)
	}
	b, err := os.ReadFile(filepath.Join(o.dataDir, "meshd.json"))
	if err != nil {
		return nil, fmt.Errorf("is meshd running with --data-dir %s on this host? %w", o.dataDir, err)
	}
	var urls devenv.URLs
	if err := json.Unmarshal(b, &urls); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(o.dataDir, "meshd.json"), err)
	}
	if urls.MeshTCP == "" {
		return nil, fmt.Errorf("%s names no mesh_tcp_url", filepath.Join(o.dataDir, "meshd.json"))
	}
	trust, err := creds.Load(filepath.Join(o.dataDir, "keys"))
	if err != nil {
		return nil, fmt.Errorf("meshbench mints its credentials with the mesh's keys and must run on its host: %w", err)
	}
	return &target{name: urls.MeshTCP, url: urls.MeshTCP, trust: trust, close: func() {}}, nil
}

// startMesh starts a whole mesh in this process, as meshd would, with its
// state in a temporary directory removed at the end.
func startMesh(ctx context.Context, cluster bool, progress io.Writer) (*target, error) {
	dir, err := os.MkdirTemp("", "meshbench-")
	if err != nil {
		return nil, err
	}
	cfg, what := devenv.Config{DataDir: dir}, "a mesh"
	if cluster {
		cfg.Cluster, what = 3, "a mesh on a three-server cluster"
	}
	fmt.Fprintf(progress, "starting %s in this process (data in %s)\n", what, dir)
	m, err := devenv.Start(ctx, cfg)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start the in-process mesh: %w", err)
	}
	name := m.URLs().MeshTCP + " (in-process)"
	if cluster {
		name = m.URLs().MeshTCP + " (in-process cluster of 3)"
	}
	return &target{name: name, url: m.URLs().MeshTCP, trust: m.Trust(), cluster: m.Cluster(), close: func() {
		// A cluster that lost a server may take a while to stop; the
		// data directory goes only once it has.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = m.Shutdown(ctx)
		_ = os.RemoveAll(dir)
	}}, nil
}

// connectService connects to the broker as an internal service (every
// subject of the mesh account, replies under the services' prefix): the
// connection of the raw and signed NATS rows, whose subjects are
// meshbench's own.
func (t *target) connectService(name string) (*nats.Conn, error) {
	key, err := keys.Generate[keys.CredentialRole]()
	if err != nil {
		return nil, err
	}
	jwtStr, err := t.trust.MintUser(creds.UserSpec{PublicKey: key.Public(), Name: name, Kind: creds.KindService,
		Permissions: creds.ServicePermissions(), Expires: time.Now().Add(24 * time.Hour)})
	if err != nil {
		return nil, err
	}
	opts := []nats.Option{nats.Name(name), creds.UserCreds{JWT: jwtStr, Key: key}.NATSOption(), creds.ServiceInbox(), nats.MaxReconnects(0)}
	if t.cluster != nil {
		opts = append(opts, reconnecting()...) // to another server when theirs is killed
	}
	nc, err := nats.Connect(t.url, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", t.url, err)
	}
	return nc, nil
}
