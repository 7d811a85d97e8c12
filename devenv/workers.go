package devenv

import (
	"context"
	"fmt"
	"time"

	"agentmesh.dev/mesh/shared/activity"
	"agentmesh.dev/mesh/shared/admission"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/feeds"
	"agentmesh.dev/mesh/shared/mailbox"
	"agentmesh.dev/mesh/shared/presence"
	"agentmesh.dev/mesh/shared/registry"
	"agentmesh.dev/mesh/shared/tasks"
)

// Workers are the running bus workers: Copies of each, every copy on its
// own connection in its worker's queue group, exactly as separate Cloud Run
// instances would be.
type Workers struct {
	Registry  []*registry.Worker
	Presence  []*presence.Worker
	Feeds     []*feeds.Worker
	Tasks     []*tasks.Worker
	Admission []*admission.Worker
	Activity  []*activity.Worker
	Mailbox   []*mailbox.Worker
}

// WorkerConfig tunes the workers a mesh runs.
type WorkerConfig struct {
	// Copies of each worker (1 by default; tests run 3).
	Copies int
	// None runs no worker: for tests that start their own copies.
	None      bool
	Registry  registry.Config
	Presence  presence.Config
	Tasks     tasks.Config
	Admission admission.Config
	Activity  activity.Config
	Mailbox   mailbox.Config
}

// Workers returns the running workers.
func (m *Mesh) Workers() *Workers { return m.workers }

// startWorkers starts every worker, Copies times.
func (m *Mesh) startWorkers(cfg Config) error {
	w := &Workers{}
	m.workers = w
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
	env := func(name string, i int) (bus.Env, error) {
		nc, err := m.ConnectService(fmt.Sprintf("worker-%s-%d", name, i))
		if err != nil {
			return bus.Env{}, fmt.Errorf("devenv: %s worker: %w", name, err)
		}
		stops = append(stops, func() error { nc.Close(); return nil })
		return bus.Env{NC: nc, Key: m.servicesKey, Log: m.log.With("worker", name, "copy", i), Now: now}, nil
	}
	for i := range copies {
		e, err := env("registry", i)
		if err != nil {
			return err
		}
		r, err := registry.Start(ctx, e, cfg.Workers.Registry)
		if err != nil {
			return fmt.Errorf("devenv: registry: %w", err)
		}
		w.Registry, stops = append(w.Registry, r), append(stops, r.Stop)

		if e, err = env("presence", i); err != nil {
			return err
		}
		p, err := presence.Start(ctx, e, cfg.Workers.Presence)
		if err != nil {
			return fmt.Errorf("devenv: presence: %w", err)
		}
		w.Presence, stops = append(w.Presence, p), append(stops, p.Stop)

		if e, err = env("feeds", i); err != nil {
			return err
		}
		f, err := feeds.Start(ctx, e, feeds.Config{})
		if err != nil {
			return fmt.Errorf("devenv: feeds: %w", err)
		}
		w.Feeds, stops = append(w.Feeds, f), append(stops, f.Stop)

		if e, err = env("tasks", i); err != nil {
			return err
		}
		tk, err := tasks.Start(ctx, e, cfg.Workers.Tasks)
		if err != nil {
			return fmt.Errorf("devenv: tasks: %w", err)
		}
		w.Tasks, stops = append(w.Tasks, tk), append(stops, tk.Stop)

		if e, err = env("admission", i); err != nil {
			return err
		}
		a, err := admission.Start(ctx, e, cfg.Workers.Admission)
		if err != nil {
			return fmt.Errorf("devenv: admission: %w", err)
		}
		w.Admission, stops = append(w.Admission, a), append(stops, a.Stop)

		if e, err = env("activity", i); err != nil {
			return err
		}
		ac, err := activity.Start(ctx, e, cfg.Workers.Activity)
		if err != nil {
			return fmt.Errorf("devenv: activity: %w", err)
		}
		w.Activity, stops = append(w.Activity, ac), append(stops, ac.Stop)

		if e, err = env("mailbox", i); err != nil {
			return err
		}
		mb, err := mailbox.Start(ctx, e, cfg.Workers.Mailbox)
		if err != nil {
			return fmt.Errorf("devenv: mailbox: %w", err)
		}
		w.Mailbox, stops = append(w.Mailbox, mb), append(stops, mb.Stop)
	}
	m.log.Info("bus workers running", "copies", copies)
	return nil
}
