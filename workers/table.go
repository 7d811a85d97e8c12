// Package workers is the table of the mesh's bus workers: one row per
// worker, with how to start one copy of it and how it runs in production.
// devenv (meshd, tests) starts every row in-process; each worker binary
// (workers/cmd/<name>-worker, one Cloud Run service) runs one row by name
// with Main; the Terraform generator reads the rows' instance counts and
// production configuration. DESIGN §2: a worker is one row of this table,
// never wired by hand elsewhere.
package workers

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"agentmesh.dev/mesh/shared/activity"
	"agentmesh.dev/mesh/shared/admission"
	"agentmesh.dev/mesh/shared/agreements"
	"agentmesh.dev/mesh/shared/artifacts"
	"agentmesh.dev/mesh/shared/board"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/clearing"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/feeds"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/mailbox"
	"agentmesh.dev/mesh/shared/presence"
	"agentmesh.dev/mesh/shared/ratelimit"
	"agentmesh.dev/mesh/shared/registry"
	"agentmesh.dev/mesh/shared/rooms"
	"agentmesh.dev/mesh/shared/tasks"
)

// Stopper is a started worker copy.
type Stopper interface{ Stop() error }

// Config configures the workers: the replicas of their streams and buckets,
// and each worker's own configuration (the service package's Config, whose
// zero fields take that package's defaults). One Config serves every row: a
// row reads Replicas and its own field.
type Config struct {
	// Replicas of every worker's streams and buckets, unless the worker's
	// own Config sets Replicas: 0 is 1 (one server, meshd); production is
	// ProductionReplicas on the cloud's three-server cluster. Replicas are
	// configuration, never code (DESIGN §4).
	Replicas  int
	Registry  registry.Config
	Presence  presence.Config
	Feeds     feeds.Config
	Tasks     tasks.Config
	Admission admission.Config
	// Activity.Official is the catalog's list of official agent ids: empty
	// by default (no agent is official until the deployer names it, with
	// --catalog-official or MESH_CATALOG_OFFICIAL for activity-worker).
	Activity activity.Config
	Mailbox  mailbox.Config
	// Rooms.Owners resolves room creators to their handles: none by
	// default (provision answers UNAVAILABLE) until the deployer names the
	// registrar, with --registrar-url or MESH_REGISTRAR_URL for
	// rooms-worker (the cloud's Terraform sets it); meshd gives its
	// registrar in process.
	Rooms rooms.Config
	// Board is the work board of durable rooms; it shares the rooms'
	// bucket (mesh_rooms).
	Board     board.Config
	Artifacts artifacts.Config
	// Agreements.MarkupPct and Official price the resale path at admission
	// as Clearing's do (Official, when empty, is Activity.Official).
	// Agreements.ConsoleURL is where approval URLs point: none by default
	// (the refusal then names the bare approval path) until the deployer
	// names the console, with --console-url or MESH_CONSOLE_URL for
	// agreements-worker (the cloud's Terraform sets it); meshd gives its
	// own console.
	Agreements agreements.Config
	// Clearing.MarkupPct is the markup of the resale path, in whole
	// percent (CREDITS_PLATFORM_MARKUP_PCT, 10 in production; meshd passes
	// its own); a sale is charged on the path its admission ticket names
	// (the agreements worker asks the catalog which agents are official).
	Clearing clearing.Config
}

// replicas is n, or the table-wide Replicas when n is unset.
func (c Config) replicas(n int) int {
	if n > 0 {
		return n
	}
	return c.Replicas
}

// Worker is one row of the table. Everything but Start and Knobs is plain
// data, for the Terraform generator as much as for devenv.
type Worker struct {
	// Name is the worker's name: its micro service name and queue group
	// (mesh-<name>), its binary (<name>-worker) and its Cloud Run service.
	Name string
	// Description is one line saying what the worker answers.
	Description string
	// MinInstances and MaxInstances are its Cloud Run instance counts. A bus
	// worker has no HTTP traffic to wake it, so at least one copy always
	// runs; every copy joins the same queue group, so more share the load.
	// One to three for every worker until one is measured to need more.
	MinInstances, MaxInstances int
	// CPU and Memory are one instance's Cloud Run resources (CPU always
	// allocated: the worker answers the bus, not HTTP requests).
	CPU, Memory string
	// Production is the configuration the worker's binary runs with in the
	// cloud: ProductionReplicas and the worker's limits, spelled out (they
	// are also the service package's defaults). Only Replicas and the
	// worker's own field are set.
	Production Config
	// Start runs one copy of the worker in env with its part of cfg.
	Start func(ctx context.Context, env bus.Env, cfg Config) (Stopper, error)
	// Knobs are the worker's own settings beyond the common ones, as flags
	// and MESH_* variables of its binary; each writes into cfg. Nil: none.
	Knobs func(cfg *Config) []ratelimit.Knob
	// CloudEnv are MESH_* variables of the worker's knobs that the cloud
	// deployment sets, as Terraform expressions (the generator writes them
	// into the worker's Cloud Run service). Nil: none.
	CloudEnv map[string]string
}

// ProductionReplicas is the replica count of every stream and bucket on the
// cloud's three-server JetStream cluster (DESIGN §4).
const ProductionReplicas = 3

// Table is every worker, in the order devenv starts them. It returns a new
// slice each time: the table is not package state anyone can change.
func Table() []Worker {
	return []Worker{
		{
			Name:         registry.Name,
			Description:  "agent registry: register, discover, get, node list; reclaims expired and sandbox registrations",
			MinInstances: 1, MaxInstances: 3, CPU: "1", Memory: "512Mi",
			Production: Config{Replicas: ProductionReplicas, Registry: registry.Config{
				ReapEvery: registry.DefaultReapEvery, SandboxTTL: registry.DefaultSandboxTTL}},
			Start: func(ctx context.Context, env bus.Env, cfg Config) (Stopper, error) {
				c := cfg.Registry
				c.Replicas = cfg.replicas(c.Replicas)
				return registry.Start(ctx, env, c)
			},
		},
		{
			Name:         presence.Name,
			Description:  "node presence from heartbeats: mesh.presence.get, online and offline events",
			MinInstances: 1, MaxInstances: 3, CPU: "1", Memory: "512Mi",
			Production: Config{Replicas: ProductionReplicas, Presence: presence.Config{
				OfflineAfter: presence.DefaultOfflineAfter, SweepEvery: presence.DefaultSweepEvery}},
			Start: func(ctx context.Context, env bus.Env, cfg Config) (Stopper, error) {
				c := cfg.Presence
				c.Replicas = cfg.replicas(c.Replicas)
				return presence.Start(ctx, env, c)
			},
		},
		{
			Name:         feeds.Name,
			Description:  "latest envelope and history of every feed: stores mesh.feed.*.*, answers mesh.feed.get",
			MinInstances: 1, MaxInstances: 3, CPU: "1", Memory: "512Mi",
			Production: Config{Replicas: ProductionReplicas, Feeds: feeds.Config{History: feeds.DefaultHistory}},
			Start: func(ctx context.Context, env bus.Env, cfg Config) (Stopper, error) {
				c := cfg.Feeds
				c.Replicas = cfg.replicas(c.Replicas)
				return feeds.Start(ctx, env, c)
			},
		},
		{
			Name:         tasks.DefaultName,
			Description:  "task manager: records mesh.task.*.update, answers mesh.task.get.*",
			MinInstances: 1, MaxInstances: 3, CPU: "1", Memory: "512Mi",
			Production: Config{Replicas: ProductionReplicas, Tasks: tasks.Config{
				TTL: tasks.DefaultTTL, HistoryLimit: tasks.DefaultHistoryLimit,
				ReorderWindow: tasks.DefaultReorderWindow, MaxHeld: tasks.DefaultMaxHeld}},
			Start: func(ctx context.Context, env bus.Env, cfg Config) (Stopper, error) {
				c := cfg.Tasks
				c.Replicas = cfg.replicas(c.Replicas)
				return tasks.Start(ctx, env, c)
			},
		},
		{
			Name:         admission.Name,
			Description:  "inbox guard and roster admission; relays the requests of guarded inboxes",
			MinInstances: 1, MaxInstances: 3, CPU: "1", Memory: "512Mi",
			Production: Config{Replicas: ProductionReplicas, Admission: admission.Config{
				RelayTimeout: admission.DefaultRelayTimeout, AnswerTimeout: admission.DefaultAnswerTimeout,
				MaxRelays: admission.DefaultMaxRelays, MaxRelaysPerAgent: admission.DefaultMaxRelaysPerAgent}},
			Start: func(ctx context.Context, env bus.Env, cfg Config) (Stopper, error) {
				c := cfg.Admission
				c.Replicas = cfg.replicas(c.Replicas)
				return admission.Start(ctx, env, c)
			},
		},
		{
			Name:         activity.Name,
			Description:  "activity timeline, usage counters and catalog: mesh.activity.list, mesh.usage.list, mesh.catalog.list",
			MinInstances: 1, MaxInstances: 3, CPU: "1", Memory: "512Mi",
			Production: Config{Replicas: ProductionReplicas, Activity: activity.Config{
				FlushEvery: activity.DefaultFlushEvery}},
			Start: func(ctx context.Context, env bus.Env, cfg Config) (Stopper, error) {
				c := cfg.Activity
				c.Replicas = cfg.replicas(c.Replicas)
				return activity.Start(ctx, env, c)
			},
			Knobs: func(cfg *Config) []ratelimit.Knob {
				return []ratelimit.Knob{officialKnob(&cfg.Activity.Official)}
			},
		},
		{
			Name:         mailbox.Name,
			Description:  "offline mailboxes: mesh.mailbox.fetch and ack, the control plane's known question, the sweep of unread mail",
			MinInstances: 1, MaxInstances: 3, CPU: "1", Memory: "512Mi",
			Production: Config{Replicas: ProductionReplicas, Mailbox: mailbox.Config{
				Limits: mailbox.DefaultLimits, SweepEvery: mailbox.DefaultSweepEvery, SweepGrace: mailbox.DefaultSweepGrace}},
			Start: func(ctx context.Context, env bus.Env, cfg Config) (Stopper, error) {
				c := cfg.Mailbox
				c.Replicas = cfg.replicas(c.Replicas)
				return mailbox.Start(ctx, env, c)
			},
			Knobs: func(cfg *Config) []ratelimit.Knob { return cfg.Mailbox.Limits.Knobs() },
		},
		{
			Name:         rooms.Name,
			Description:  "durable rooms: the mesh.rooms verbs, the record of room traffic, idle expiry",
			MinInstances: 1, MaxInstances: 3, CPU: "1", Memory: "512Mi",
			Production: Config{Replicas: ProductionReplicas, Rooms: rooms.Config{Limits: rooms.DefaultLimits}},
			Start: func(ctx context.Context, env bus.Env, cfg Config) (Stopper, error) {
				c := cfg.Rooms
				c.Replicas = cfg.replicas(c.Replicas)
				return rooms.Start(ctx, env, c)
			},
			Knobs:    func(cfg *Config) []ratelimit.Knob { return []ratelimit.Knob{registrarKnob(&cfg.Rooms.Owners)} },
			CloudEnv: map[string]string{"MESH_REGISTRAR_URL": "${local.control_url}"},
		},
		{
			Name:         board.Name,
			Description:  "work board of durable rooms: mesh.board.post, list, claim, complete, abandon, withdraw",
			MinInstances: 1, MaxInstances: 3, CPU: "1", Memory: "512Mi",
			Production: Config{Replicas: ProductionReplicas, Board: board.Config{Limits: board.DefaultLimits}},
			Start: func(ctx context.Context, env bus.Env, cfg Config) (Stopper, error) {
				c := cfg.Board
				c.Replicas = cfg.replicas(c.Replicas)
				return board.Start(ctx, env, c)
			},
			Knobs: func(cfg *Config) []ratelimit.Knob { return cfg.Board.Limits.Knobs() },
		},
		{
			Name:         artifacts.Name,
			Description:  "artifact store on the mesh_artifacts object store: mesh.artifacts.put, put.begin, put.commit, fetch, stat, remove, usage, link; the sweep of expired artifacts",
			MinInstances: 1, MaxInstances: 3, CPU: "1", Memory: "512Mi",
			Production: Config{Replicas: ProductionReplicas, Artifacts: artifacts.Config{
				Limits: artifacts.DefaultLimits, SweepEvery: artifacts.DefaultSweepEvery}},
			Start: func(ctx context.Context, env bus.Env, cfg Config) (Stopper, error) {
				c := cfg.Artifacts
				c.Replicas = cfg.replicas(c.Replicas)
				return artifacts.Start(ctx, env, c)
			},
			Knobs: func(cfg *Config) []ratelimit.Knob { return cfg.Artifacts.Limits.Knobs() },
		},
		{
			Name:         agreements.Name,
			Description:  "agreements to paid SKUs and admission at the seller's node: mesh.agreements.file, list, revoke; mesh.commerce.admit",
			MinInstances: 1, MaxInstances: 3, CPU: "1", Memory: "512Mi",
			Production: Config{Replicas: ProductionReplicas, Agreements: agreements.Config{MarkupPct: clearing.DefaultMarkupPct}},
			Start: func(ctx context.Context, env bus.Env, cfg Config) (Stopper, error) {
				c := cfg.Agreements
				c.Replicas = cfg.replicas(c.Replicas)
				if len(c.Official) == 0 {
					c.Official = cfg.Activity.Official
				}
				return agreements.Start(ctx, env, c)
			},
			Knobs: func(cfg *Config) []ratelimit.Knob {
				return []ratelimit.Knob{consoleKnob(&cfg.Agreements.ConsoleURL), officialKnob(&cfg.Agreements.Official), markupKnob(&cfg.Agreements.MarkupPct)}
			},
			// Admission quotes the retail price the clearing charges: the
			// same markup (the functions' CREDITS_PLATFORM_MARKUP_PCT).
			CloudEnv: map[string]string{"MESH_CONSOLE_URL": "${local.control_url}/console/",
				"MESH_MARKUP_PCT": `${lookup(var.function_extra_env, "CREDITS_PLATFORM_MARKUP_PCT", "10")}`},
		},
		{
			Name:         clearing.Name,
			Description:  "credits: meters, rates and settles answers to paid internal SKUs (the resale markup included); mesh.internal.credits.grant, mesh.credits.balance, mesh.credits.history",
			MinInstances: 1, MaxInstances: 3, CPU: "1", Memory: "512Mi",
			Production: Config{Replicas: ProductionReplicas, Clearing: clearing.Config{MarkupPct: clearing.DefaultMarkupPct,
				SweepEvery: clearing.DefaultSweepEvery, Grace: clearing.DefaultGrace, Keep: clearing.DefaultKeep}},
			Start: func(ctx context.Context, env bus.Env, cfg Config) (Stopper, error) {
				c := cfg.Clearing
				c.Replicas = cfg.replicas(c.Replicas)
				return clearing.Start(ctx, env, c)
			},
			Knobs: func(cfg *Config) []ratelimit.Knob {
				return []ratelimit.Knob{markupKnob(&cfg.Clearing.MarkupPct)}
			},
			// The functions report the markup the clearing charges
			// (/v1/capabilities): one value for both, the functions'
			// CREDITS_PLATFORM_MARKUP_PCT (function_extra_env; 10 unset).
			CloudEnv: map[string]string{"MESH_MARKUP_PCT": `${lookup(var.function_extra_env, "CREDITS_PLATFORM_MARKUP_PCT", "10")}`},
		},
	}
}

// Lookup is the row named name.
func Lookup(name string) (Worker, error) {
	var names []string
	for _, w := range Table() {
		if w.Name == name {
			return w, nil
		}
		names = append(names, w.Name)
	}
	return Worker{}, fmt.Errorf("no worker %q (the workers are %s)", name, strings.Join(names, ", "))
}

// officialKnob sets the catalog's official agent ids from a comma-separated
// list; an id that is not an agent's public key is refused, so a typo does
// not leave the catalog silently without its official agent.
func officialKnob(ids *[]string) ratelimit.Knob {
	return ratelimit.Knob{Flag: "catalog-official", Env: "MESH_CATALOG_OFFICIAL", Default: strings.Join(*ids, ","),
		Help: "comma-separated agent ids the catalog marks official (none by default)",
		Set: func(s string) error {
			var list []string
			for _, id := range strings.Split(s, ",") {
				if id = strings.TrimSpace(id); id == "" {
					continue
				}
				if !keys.IsUserPublicKey(id) {
					return fmt.Errorf("%q is not an agent id (U followed by 55 characters)", id)
				}
				list = append(list, id)
			}
			*ids = list
			return nil
		}}
}

// registrarKnob names the registrar the rooms worker resolves room creators
// with (rooms.RegistrarOwners): its base URL, whose /api/resolve and
// /api/registrar-key it reads.
func registrarKnob(owners *rooms.Owners) ratelimit.Knob {
	return ratelimit.Knob{Flag: "registrar-url", Env: "MESH_REGISTRAR_URL", Default: "none",
		Help: "the registrar that resolves room creators to their handles, e.g. https://mesh.example.org (none: durable rooms cannot be provisioned)",
		Set: func(s string) error {
			if strings.TrimSpace(s) == "" {
				*owners = nil
				return nil
			}
			o, err := rooms.NewRegistrarOwners(s)
			if err != nil {
				return err
			}
			*owners = o
			return nil
		}}
}

// consoleKnob names the console the agreements worker's approval URLs
// point at (commerce.ApprovalURL): its base URL, such as
// https://mesh.example.org/console/.
func consoleKnob(url *string) ratelimit.Knob {
	return ratelimit.Knob{Flag: "console-url", Env: "MESH_CONSOLE_URL", Default: *url,
		Help: "the console whose /agreements/approve page approval URLs name, e.g. https://mesh.example.org/console/ (empty: the bare path)",
		Set: func(s string) error {
			s = strings.TrimSpace(s)
			if s != "" && !strings.HasPrefix(s, "https://") && !strings.HasPrefix(s, "http://") {
				return fmt.Errorf("%q is not an http(s) URL", s)
			}
			*url = s
			return nil
		}}
}

// markupKnob sets the platform markup of the resale path: a whole
// percentage. The cloud sets it from the control plane's own
// CREDITS_PLATFORM_MARKUP_PCT, which /v1/capabilities reports, so both say
// one thing (meshd passes its one value to both).
func markupKnob(pct *int) ratelimit.Knob {
	return ratelimit.Knob{Flag: "markup-pct", Env: "MESH_MARKUP_PCT", Default: strconv.Itoa(*pct),
		Help: "the platform markup on the resale path (official catalog agents), in whole percent",
		Set: func(s string) error {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || commerce.CheckMarkup(n) != nil {
				return fmt.Errorf("the markup is a whole percentage from 0 to %d, not %q", commerce.MaxMarkupPct, s)
			}
			*pct = n
			return nil
		}}
}
