// Package registry is the agent registry of the mesh (spec §2.6, §4.3,
// upstream-notes §2): agents register a manifest carrying their node's
// vouch, which is verified before anything is stored; the registry keeps one
// record per agent in KV mesh_registry, answers discovery, get and the node
// list, and reclaims registrations whose vouch expired and sandbox registrations whose node went
// quiet.
//
// Every copy is stateless: records live in KV and every transition other
// parties hear about (registered, deregistered, reaped) is emitted only by
// the copy whose compare-and-set made it, so N copies emit it once.
package registry

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/protocol"
)

// Name is the worker's name: its micro service is mesh-registry and its
// copies share the queue group bus.QueueGroup(Name).
const Name = "registry"

// Buckets. The registry owns Bucket; it only reads the presence bucket,
// and only when it exists (the presence worker creates it), and the guest
// roster GuestsBucket, which the control plane writes and every copy binds
// at start (guests.go).
const (
	Bucket         = "mesh_registry"
	PresenceBucket = "mesh_presence"
)

// Event types, emitted on mesh.event.registry.<type>.
const (
	EventRegistered   = "agent_registered"
	EventDeregistered = "agent_deregistered"
	EventReaped       = "agent_reaped"
)

// Reap reasons.
const (
	ReasonVouchExpired = "vouch_expired"
	ReasonSandboxIdle  = "sandbox_idle"
	ReasonLeaseEnded   = "guest_lease_ended"
	// ReasonAccountClosed is the reason of a registration removed because
	// its agent's account was closed (mesh.internal.registry.remove).
	ReasonAccountClosed = "account_closed"
)

// Defaults.
const (
	DefaultReapEvery  = 10 * time.Minute
	DefaultSandboxTTL = time.Hour
)

// Config tunes the worker; zero values take the defaults.
type Config struct {
	// Now is the worker's clock (nil: the env's clock).
	Now func() time.Time
	// ReapEvery is how often each copy runs Reap (10 min).
	ReapEvery time.Duration
	// SandboxTTL is how long a sandbox registration survives its node's
	// silence (1 h: spec §3.3, "guest registration swept").
	SandboxTTL time.Duration
	// Replicas of the registrations bucket (bus.Replicas: 0 is 1, one
	// server; the cloud's cluster runs 3, set by the workers table), and
	// of the guest roster.
	Replicas int
}

// Worker is one running copy of the registry.
type Worker struct {
	svc *bus.Service
	js  jetstream.JetStream
	kv  jetstream.KeyValue
	cfg Config
	now func() time.Time
	log *slog.Logger

	presence *optionalBucket

	cancel   context.CancelFunc
	done     sync.WaitGroup
	stopOnce sync.Once
	stopErr  error
}

// Start runs one copy of the registry in env: binds mesh_registry, serves the registry subjects in the
// worker's queue group and reaps every cfg.ReapEvery until ctx ends or Stop.
func Start(ctx context.Context, env bus.Env, cfg Config) (*Worker, error) {
	if cfg.ReapEvery <= 0 {
		cfg.ReapEvery = DefaultReapEvery
	}
	if cfg.SandboxTTL <= 0 {
		cfg.SandboxTTL = DefaultSandboxTTL
	}
	if cfg.Now == nil {
		cfg.Now = env.Now
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	svc, err := bus.NewServiceIn(env, Name, "agent registry: register, discover, get, node list")
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Worker, error) {
		_ = svc.Stop()
		return nil, err
	}
	kv, err := bus.Bucket(ctx, svc.JS, jetstream.KeyValueConfig{Bucket: Bucket, Description: "agent registrations, keyed by agent id",
		Replicas: bus.Replicas(cfg.Replicas)})
	if err != nil {
		return fail(err)
	}
	// Bound (created if need be) before the endpoints exist, so no
	// registration is ever judged without it.
	if _, err := bus.Bucket(ctx, svc.JS, guestsConfig(cfg.Replicas)); err != nil {
		return fail(err)
	}
	w := &Worker{svc: svc, js: svc.JS, kv: kv, cfg: cfg, now: cfg.Now, log: svc.Log,
		presence: newOptionalBucket(svc.JS, PresenceBucket)}
	for _, ep := range []struct {
		name, subject string
		h             bus.Handler
	}{
		{"register", protocol.SubjRegister, w.register},
		// The node-bound form (upstream §2.1 clause b): the token must be
		// the attesting node, which the broker can pin per connection. It
		// pins guests there when the control plane cannot record them, so
		// every registration on it is sandbox (register).
		{"register-bound", protocol.SubjRegister + ".*", w.register},
		{"deregister", protocol.SubjDeregister, w.deregister},
		{"discover", protocol.SubjDiscover, w.discover},
		{"get", protocol.SubjRegistryGetPfx + "*", w.get},
		{"nodes-list", protocol.SubjNodesList, w.nodesList},
		{"guest-evict", protocol.SubjGuestEvict, w.evictGuests},
		{"remove", protocol.SubjRegistryRemove, w.remove},
	} {
		if err := svc.Endpoint(ep.name, ep.subject, ep.h); err != nil {
			return fail(fmt.Errorf("%s: endpoint %s: %w", Name, ep.subject, err))
		}
	}
	if err := env.NC.Flush(); err != nil {
		return fail(fmt.Errorf("%s: flush: %w", Name, err))
	}
	loopCtx, cancel := context.WithCancel(ctx)
	w.cancel = cancel
	w.done.Add(1)
	go w.reapLoop(loopCtx)
	return w, nil
}

// Stop unsubscribes the endpoints and ends the reaper. Safe to call twice.
func (w *Worker) Stop() error {
	w.stopOnce.Do(func() {
		w.cancel()
		w.done.Wait()
		w.stopErr = w.svc.Stop()
	})
	return w.stopErr
}

// reapLoop runs Reap every ReapEvery until Start's ctx ends or Stop.
func (w *Worker) reapLoop(ctx context.Context) {
	defer w.done.Done()
	bus.Every(ctx, w.cfg.ReapEvery, func(ctx context.Context) {
		if n, err := w.Reap(ctx); err != nil {
			w.log.Warn("reap", "err", err, "reaped", n)
		} else if n > 0 {
			w.log.Info("reaped registrations", "count", n)
		}
	})
}

// optionalBucket is a bucket another worker owns, bound through
// bus.LazyBucket once it exists (asked for again at most every two seconds
// while it does not). The get method keeps the call shape the registry's
// readers use.
type optionalBucket struct{ bus.LazyBucket }

func newOptionalBucket(js jetstream.JetStream, name string) *optionalBucket {
	return &optionalBucket{bus.LazyBucket{JS: js, Bucket: name}}
}

// get returns the bucket, or nil while it does not exist. The handle it was
// bound with is used; js is ignored.
func (b *optionalBucket) get(ctx context.Context, _ jetstream.JetStream) (jetstream.KeyValue, error) {
	kv, err := b.Get(ctx)
	if err != nil {
		return nil, fmt.Errorf("kv bucket %s: %w", b.Bucket, err)
	}
	return kv, nil
}
