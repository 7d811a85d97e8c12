package registry

import (
	"context"
	"fmt"
	"time"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/protocol"
)

// Availability stamps.
const (
	AvailOnline  = "online"
	AvailOffline = "offline"
)

// presenceEntry is the part of a mesh_presence record the registry reads:
// {node, agents, availability, last_seen, online} (docs/bus.md).
type presenceEntry struct {
	Availability string `json:"availability"`
	LastSeen     string `json:"last_seen"`
	Online       bool   `json:"online"`
	beatReport
}

// beatReport is what a node's last heartbeat said of itself
// (upstream-notes §6.3); the presence worker keeps only well-formed values.
type beatReport struct {
	ActiveTasks   *int64   `json:"active_tasks,omitempty"`
	Capacity      *int64   `json:"capacity,omitempty"`
	UptimeSeconds *int64   `json:"uptime_seconds,omitempty"`
	Load          *float64 `json:"load,omitempty"`
}

func (b beatReport) empty() bool {
	return b.ActiveTasks == nil && b.Capacity == nil && b.UptimeSeconds == nil && b.Load == nil
}

// nodeState is what the registry knows of a node's liveness.
type nodeState struct {
	known    bool // the node has a presence record
	entry    presenceEntry
	lastSeen time.Time // zero when unknown
}

// live: the presence worker says the node is online and the node did not
// itself declare availability offline.
func (s nodeState) live() bool {
	return s.known && s.entry.Online && s.entry.Availability != AvailOffline
}

// availability is the stamp on a manifest: "offline" for a node that is
// not live (or never seen), else what the node reported ("online", "busy",
// "degraded"), "online" when it reported nothing.
func (s nodeState) availability() string {
	if !s.live() {
		return AvailOffline
	}
	if s.entry.Availability != "" {
		return s.entry.Availability
	}
	return AvailOnline
}

// presence reads mesh_presence for one operation, once per node.
type presence struct {
	w     *Worker
	cache map[string]nodeState
}

func newPresence(w *Worker) *presence { return &presence{w: w, cache: map[string]nodeState{}} }

func (p *presence) node(ctx context.Context, node string) (nodeState, error) {
	if s, ok := p.cache[node]; ok {
		return s, nil
	}
	var s nodeState
	kv, err := p.w.presence.get(ctx, p.w.js)
	if err != nil {
		return s, err
	}
	if kv != nil && node != "" {
		e, found, err := bus.GetJSON[presenceEntry](ctx, kv, node)
		switch {
		case err != nil && found:
			// A record of another shape: the node reads as never seen.
			p.w.log.Warn("undecodable presence record", "node", node, "err", err)
		case err != nil:
			return s, fmt.Errorf("kv %s: get %s: %w", PresenceBucket, node, err)
		case found:
			s.known, s.entry = true, e
			if t, err := protocol.ParseTime(e.LastSeen); err == nil {
				s.lastSeen = t
			}
		}
	}
	p.cache[node] = s
	return s, nil
}
