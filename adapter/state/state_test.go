package state_test

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

	"agentmesh.dev/mesh/adapter/state"
)

func TestIdentityAndConfig(t *testing.T) {
	base := t.TempDir()
	d, err := state.Open(filepath.Join(base, "adapter"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Identity(); !errors.Is(err, state.ErrNoIdentity) {
		t.Fatalf("fresh directory: %v", err)
	}
	id, err := state.NewIdentity("helper", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.SaveIdentity(id); err != nil {
		t.Fatal(err)
	}
	got, err := d.Identity()
	if err != nil || got != id {
		t.Fatalf("identity round trip: %+v %v", got, err)
	}
	ks, err := got.Keys()
	if err != nil || ks.Agent.Public() != id.AgentID {
		t.Fatalf("keys: %v", err)
	}
	for _, f := range []string{state.IdentityFile} {
		if fi, err := os.Stat(d.File(f)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s mode %v %v", f, fi.Mode(), err)
		}
	}
	// A seed that is not the agent's is refused.
	bad := id
	bad.AgentID = "UAKQRYZBYFOC65OQZVJ3QPCIERDTRNNZPMOJUYXC3DGPRCDWSKD4HV5A"
	if _, err := bad.Keys(); err == nil {
		t.Fatal("a mismatched identity decoded")
	}
	// Files others can read are refused, the directory too.
	if err := os.Chmod(d.File(state.IdentityFile), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Identity(); err == nil {
		t.Fatal("read an identity readable by others")
	}
	if err := os.Chmod(d.Path, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := state.Open(d.Path); err == nil {
		t.Fatal("opened a state directory readable by others")
	}
	if err := os.Chmod(d.Path, 0o700); err != nil {
		t.Fatal(err)
	}
	c := state.Config{ControlURL: "http://x", NATSURLs: []string{"nats://y"}, Credential: &state.Credential{Kind: "node", JWT: "j"}}
	if err := d.SaveConfig(c); err != nil {
		t.Fatal(err)
	}
	if got, err := d.Config(); err != nil || got.Credential.JWT != "j" || got.NATSURLs[0] != "nats://y" {
		t.Fatalf("config round trip: %+v %v", got, err)
	}
}

// The discovery directory lists the nodes whose sockets answer and
// forgets the others.
func TestDiscovery(t *testing.T) {
	base, err := os.MkdirTemp("", "disc")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(base)
	d, err := state.Open(filepath.Join(base, "a"))
	if err != nil {
		t.Fatal(err)
	}
	n := state.NodesFor(d)
	if n.Dir != filepath.Join(base, "nodes") {
		t.Fatalf("discovery directory %s", n.Dir)
	}
	sock := filepath.Join(base, "live.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, a := range []state.Announcement{{NodeID: "N1", Name: "live", Socket: sock}, {NodeID: "N2", Name: "dead", Socket: filepath.Join(base, "gone.sock")}, {NodeID: "SELF", Socket: sock}} {
		if _, err := n.Announce(a); err != nil {
			t.Fatal(err)
		}
	}
	live, err := n.Live("SELF")
	if err != nil || len(live) != 1 || live[0].Name != "live" {
		t.Fatalf("live nodes %+v %v", live, err)
	}
	if _, err := os.Stat(filepath.Join(n.Dir, "N2.json")); !os.IsNotExist(err) {
		t.Fatal("a dead node's file was kept")
	}
}
