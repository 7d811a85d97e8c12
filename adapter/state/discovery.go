package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Nodes is the node discovery directory: one file per running node on this
// machine (<nodes>/<node-id>.json). It sits beside the state directory
// (~/.mesh/nodes for the default ~/.mesh/adapter), so every adapter and any
// other mesh program under ~/.mesh sees the others, whatever their own
// state directories.
type Nodes struct {
	Dir string
}

// NodesFor is the discovery directory of a state directory.
func NodesFor(d *Dir) Nodes { return Nodes{Dir: filepath.Join(filepath.Dir(d.Path), NodesDir)} }

// Announcement is one running node: enough for another adapter, or a
// person, to see which nodes run on this machine and how to reach them.
type Announcement struct {
	NodeID    string `json:"node_id"`
	AgentID   string `json:"agent_id"`
	Name      string `json:"name"`
	Mode      string `json:"mode"` // inbox | cmd
	PID       int    `json:"pid"`
	Socket    string `json:"socket"`
	StartedAt string `json:"started_at"`
}

// Announce writes a's file; the returned func removes it (call it on exit).
func (n Nodes) Announce(a Announcement) (func(), error) {
	dir := n.Dir
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("node discovery directory: %w", err)
	}
	b, err := json.MarshalIndent(a, "", "  ")
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, a.NodeID+".json")
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return nil, fmt.Errorf("node discovery directory: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, fmt.Errorf("node discovery directory: %w", err)
	}
	return func() { _ = os.Remove(path) }, nil
}

// Live lists the announced adapters whose control socket answers,
// other than self, and removes the files of those that do not (they
// crashed without cleaning up).
func (n Nodes) Live(self string) ([]Announcement, error) {
	dir := n.Dir
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("node discovery directory: %w", err)
	}
	var live []Announcement
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		var a Announcement
		if json.Unmarshal(b, &a) != nil || a.NodeID == "" {
			_ = os.Remove(path)
			continue
		}
		if a.NodeID == self {
			continue
		}
		if !reachable(a.Socket) {
			_ = os.Remove(path)
			continue
		}
		live = append(live, a)
	}
	sort.Slice(live, func(i, j int) bool { return live[i].StartedAt < live[j].StartedAt })
	return live, nil
}

// reachable reports whether a unix socket accepts a connection.
func reachable(socket string) bool {
	if socket == "" {
		return false
	}
	c, err := net.DialTimeout("unix", socket, 500*time.Millisecond)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}
