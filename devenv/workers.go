package devenv

import (
	"context"
	"fmt"
	"time"

	"agentmesh.dev/mesh/shared/activity"
	"agentmesh.dev/mesh/shared/admission"
	"agentmesh.dev/mesh/shared/agreements"
	"agentmesh.dev/mesh/shared/artifacts"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/clearing"
	"agentmesh.dev/mesh/shared/feeds"
	"agentmesh.dev/mesh/shared/mailbox"
	"agentmesh.dev/mesh/shared/presence"
	"agentmesh.dev/mesh/shared/registry"
	"agentmesh.dev/mesh/shared/rooms"
	"agentmesh.dev/mesh/shared/tasks"
	"agentmesh.dev/mesh/workers"
)

// Workers are the running bus workers: Copies of each row of the workers
// table, every copy on its own connection in its worker's queue group,
// exactly as separate Cloud Run instances would be.
type Workers struct {
	Registry  []*registry.Worker
	Presence  []*presence.Worker
	Feeds     []*feeds.Worker
	Tasks     []*tasks.Worker
	Admission []*admission.Worker
	Activity  []*activity.Worker
	Mailbox   []*mailbox.Worker
	Rooms     []*rooms.Worker
	// Agreements are the agreements service's copies.
	Agreements []*agreements.Worker
	Clearing   []*clearing.Worker
}

// add files a started copy under its worker, for tests that reach into one.
func (w *Workers) add(s workers.Stopper) {
	switch s := s.(type) {
	case *registry.Worker:
		w.Registry = append(w.Registry, s)
	case *presence.Worker:
		w.Presence = append(w.Presence, s)
	case *feeds.Worker:
		w.Feeds = append(w.Feeds, s)
	case *tasks.Worker:
		w.Tasks = append(w.Tasks, s)
	case *admission.Worker:
		w.Admission = append(w.Admission, s)
	case *activity.Worker:
		w.Activity = append(w.Activity, s)
	case *mailbox.Worker:
		w.Mailbox = append(w.Mailbox, s)
	case *rooms.Worker:
		w.Rooms = append(w.Rooms, s)
	case *agreements.Worker:
		w.Agreements = append(w.Agreements, s)
	case *clearing.Worker:
		w.Clearing = append(w.Clearing, s)
	}
}

// WorkerConfig tunes the workers a mesh runs. Zero fields take the service
// packages' defaults, which are also the production configuration of the
// workers table, except the replicas: one machine runs one of each.
type WorkerConfig struct {
	// Copies of each worker (1 by default; tests run 3).
	Copies int
	// None runs no worker: for tests that start their own copies.
	None bool
	// Replicas of the workers' streams and buckets: 1 by default, the
	// only count a single broker serves, and on a cluster
	// workers.ProductionReplicas (or the cluster's size, if smaller).
	Replicas  int
	Registry  registry.Config
	Presence  presence.Config
	Feeds     feeds.Config
	Tasks     tasks.Config
	Admission admission.Config
	Activity  activity.Config
	Mailbox   mailbox.Config
	Artifacts artifacts.Config
	// Rooms.Owners is the mesh's own registrar unless a test names another.
	Rooms rooms.Config
	// Agreements.ConsoleURL is the mesh's own console unless a test names
	// another; Agreements.MarkupPct is always Config.MarkupPct (admission
	// quotes the retail price the clearing charges).
	Agreements agreements.Config
	// Clearing.MarkupPct is always Config.MarkupPct: the markup the
	// clearing charges is the one /v1/capabilities reports.
	Clearing clearing.Config
}

// table is c as the workers table's configuration.
func (c WorkerConfig) table() workers.Config {
	return workers.Config{Replicas: c.Replicas, Registry: c.Registry, Presence: c.Presence, Feeds: c.Feeds, Tasks: c.Tasks,
		Admission: c.Admission, Activity: c.Activity, Mailbox: c.Mailbox, Artifacts: c.Artifacts, Rooms: c.Rooms,
		Agreements: c.Agreements, Clearing: c.Clearing}
}

// Workers returns the running workers.
func (m *Mesh) Workers() *Workers { return m.workers }

// startWorkers starts every row of the workers table, Copies times.
func (m *Mesh) startWorkers(cfg Config) error {
	w := &Workers{}
	m.workers = w
	m.roomOwners = &registrarOwners{}
	if cfg.Workers.None {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	copies := max(cfg.Workers.Copies, 1)
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	var stops []func() error
	// Stop every worker before its connection, and all before the broker.
	m.closers = append(m.closers, func() error {
		cancel()
		for i := len(stops) - 1; i >= 0; i-- {
			_ = stops[i]()
		}
		return nil
	})
	wcfg := cfg.Workers.table()
	if wcfg.Rooms.Owners == nil {
		wcfg.Rooms.Owners = m.roomOwners
	}
	wcfg.Rooms.Credentials = m.roomCredentials()
	if wcfg.Agreements.ConsoleURL == "" && wcfg.Agreements.Console == nil {
		// The console's URL is known once the HTTP listener is up, after
		// the workers start.
		wcfg.Agreements.Console = func() string { s, _ := m.console.Load().(string); return s }
	}
	wcfg.Clearing.MarkupPct = cfg.MarkupPct
	wcfg.Agreements.MarkupPct = cfg.MarkupPct
	if wcfg.Replicas == 0 && cfg.Cluster > 1 {
		wcfg.Replicas = min(workers.ProductionReplicas, cfg.Cluster)
	}
	table := workers.Table()
	for i := range copies {
		for _, row := range table {
			nc, err := m.ConnectService(fmt.Sprintf("worker-%s-%d", row.Name, i))
			if err != nil {
				return fmt.Errorf("devenv: %s worker: %w", row.Name, err)
			}
			stops = append(stops, func() error { nc.Close(); return nil })
			env := bus.Env{NC: nc, Key: m.servicesKey, Log: m.log.With("worker", row.Name, "copy", i), Now: now}
			s, err := row.Start(ctx, env, wcfg)
			if err != nil {
				return fmt.Errorf("devenv: %s: %w", row.Name, err)
			}
			w.add(s)
			stops = append(stops, s.Stop)
		}
	}
	m.log.Info("bus workers running", "workers", len(table), "copies", copies)
	return nil
}
