// Package daemon is the long-lived adapter (`mesh-adapter start`): one node
// on the agent runtime hosting one agent, in inbox mode (requests wait in
// the local queue for `reply`, `ack` or a budget refusal) or in command
// mode (each request is piped to a fresh run of a command whose stdout is
// the answer), with the control socket the short commands talk to and an
// announcement in the node discovery directory.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"sync"
	"time"

	"agentmesh.dev/mesh/adapter/allowance"
	"agentmesh.dev/mesh/adapter/control"
	"agentmesh.dev/mesh/adapter/inbox"
	"agentmesh.dev/mesh/adapter/node"
	"agentmesh.dev/mesh/adapter/rooms"
	"agentmesh.dev/mesh/adapter/state"
	"agentmesh.dev/mesh/shared/protocol"
)

// Modes.
const (
	ModeInbox = "inbox"
	ModeCmd   = "cmd"
)

// Offering is what the adapter's agent offers: text messages. Requests
// carry {text} as input; answers carry {text} as output.
const Offering = "chat"

// Config is what Run needs.
type Config struct {
	Dir  *state.Dir
	Mode string
	// Name names the agent (inbox mode); kept from the identity when empty.
	Name string
	// Command and Raw are command mode's: the command line (run by
	// /bin/sh -c) and whether it gets the bare sender text instead of the
	// provenance frame.
	Command string
	Raw     bool
	// CommandTimeout bounds one run of the command (10 minutes).
	CommandTimeout time.Duration
	// ControlURL and RegistrarURL override the saved ones.
	ControlURL, RegistrarURL string
	// Out receives what a person running the adapter should see: the agent
	// id, the other nodes on this machine, warnings.
	Out io.Writer
	Log *slog.Logger
	// HTTP is the control-plane client (nil: a client with a 15 s timeout).
	HTTP *http.Client
	// Ready, when set, is called once the adapter serves.
	Ready func(agentID string)
}

// adapter is one running adapter.
type adapter struct {
	cfg   Config
	dir   *state.Dir
	id    state.Identity
	keys  state.Keys
	cc    controlClient
	node  *node.Node
	agent *node.Agent
	queue *inbox.Queue
	allow *allowance.Store
	guest *guestLease // the lease, when the identity is a guest's
	// rooms is the agent's rooms and board client; the rooms it holds
	// are remembered in the state directory (rooms.StoreFile), in held.
	rooms *rooms.Client
	held  *rooms.Store
	log   *slog.Logger
	// natsURL is the bus the node connects to; renews is whether the node
	// has a renewer (a guest's lease has none).
	natsURL string
	renews  bool

	// replies are the sends waiting for an answer that comes later, at
	// the agent's inbox (after a queued ack): request id → the channel.
	// Only an answer from the agent the request went to is handed over.
	repMu   sync.Mutex
	replies map[string]chan *node.Result

	// msgLocks serialise replies and acks per inbox message.
	msgLocks seqLocks
}

// Run serves until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	a, closeAll, err := open(ctx, cfg)
	if err != nil {
		return err
	}
	defer closeAll()
	l, err := control.Listen(cfg.Dir.File(state.SocketFile))
	if err != nil {
		return err
	}
	nodes := state.NodesFor(cfg.Dir)
	unannounce, err := nodes.Announce(state.Announcement{NodeID: a.node.ID(), AgentID: a.id.AgentID, Name: a.id.Name, Mode: cfg.Mode,
		PID: os.Getpid(), Socket: cfg.Dir.File(state.SocketFile), StartedAt: protocol.FormatTime(time.Now())})
	if err != nil {
		a.log.Warn("node discovery", "err", err)
	} else {
		defer unannounce()
	}
	a.greet(nodes)
	if cfg.Ready != nil {
		cfg.Ready(a.id.AgentID)
	}
	return control.Serve(ctx, l, a.serveControl, a.log)
}

// Send sends one message without a running adapter: it brings the agent
// up for the length of the wait (in inbox mode, so a message arriving
// meanwhile is kept), sends, and waits for the answer. A handle is
// resolved before the agent comes up, so a refused one changes nothing.
func Send(ctx context.Context, cfg Config, to, text string, wait time.Duration, opt SendOptions) (*SendResult, error) {
	cfg.Mode = ModeInbox
	conf, err := cfg.Dir.Config()
	if err != nil {
		return nil, err
	}
	rcfg := cfg
	rcfg.RegistrarURL = firstNonEmpty(opt.RegistrarURL, cfg.RegistrarURL, conf.RegistrarURL)
	agentID, err := resolveRecipient(ctx, rcfg, to, opt)
	if err != nil {
		return nil, err
	}
	a, closeAll, err := open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	return a.deliver(ctx, agentID, to, text, wait, opt)
}

// open connects the node and hosts the agent; closeAll undoes it all.
//
// The adapter is not a named result: the undo functions refer to it, and a
// `return nil, nil, err` would set a named one to nil before they run.
func open(ctx context.Context, cfg Config) (_ *adapter, closeAll func(), err error) {
	if cfg.Mode != ModeInbox && cfg.Mode != ModeCmd {
		return nil, nil, fmt.Errorf("unknown mode %q", cfg.Mode)
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.HTTP == nil {
		cfg.HTTP = &http.Client{Timeout: 15 * time.Second}
	}
	if cfg.CommandTimeout <= 0 {
		cfg.CommandTimeout = 10 * time.Minute
	}
	conf, err := cfg.Dir.Config()
	if err != nil {
		return nil, nil, err
	}
	cfg.RegistrarURL = firstNonEmpty(cfg.RegistrarURL, conf.RegistrarURL)
	a := &adapter{cfg: cfg, dir: cfg.Dir, log: cfg.Log, replies: map[string]chan *node.Result{}}
	a.cc = controlClient{base: firstNonEmpty(cfg.ControlURL, conf.ControlURL), http: cfg.HTTP}
	var undo []func()
	undoAll := func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	// On failure undo what was done. undoAll, not the named closeAll: a
	// `return nil, nil, err` has set closeAll to nil before this runs.
	defer func() {
		if err != nil {
			undoAll()
		}
	}()

	var cred node.Credential
	var renewer node.Renewer
	switch {
	case conf.Credential == nil || conf.Credential.Kind == "guest":
		// A guest is leased only for a directory without an identity, or
		// whose identity is a guest's: never over an agent that `up` saved
		// (its seeds are the only proof of an agent the account may own).
		switch id, err := cfg.Dir.Identity(); {
		case err == nil && !id.Guest:
			return nil, nil, fmt.Errorf("this state directory holds agent %s (%s), but no credential for it: its `mesh-adapter up` did not finish. "+
				"Run `mesh-adapter up <agent-key>` again with this state directory (%s): it retries as agent %s. "+
				"No guest identity is leased over it; for a guest, use another --state-dir", id.AgentID, id.Name, cfg.Dir.Path, id.AgentID)
		case err != nil && !errors.Is(err, state.ErrNoIdentity):
			return nil, nil, err
		}
		g, err := a.startGuest(ctx, &conf)
		if err != nil {
			return nil, nil, err
		}
		a.guest = g
		undo = append(undo, func() {
			rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := g.release(rctx, a.cc); err != nil {
				a.log.Warn("guest lease not released; it lapses when idle", "err", err)
			}
		})
		cred = node.Credential{JWT: g.JWT, Sign: g.Key.SignNonce}
	default:
		if a.id, err = cfg.Dir.Identity(); err != nil {
			return nil, nil, err
		}
		if a.keys, err = a.id.Keys(); err != nil {
			return nil, nil, err
		}
		if cfg.Name != "" && cfg.Name != a.id.Name {
			a.id.Name = cfg.Name
			if err := cfg.Dir.SaveIdentity(a.id); err != nil {
				return nil, nil, err
			}
		}
		if err := adoptCredentialKey(cfg.Dir, &a.id, &a.keys, conf.Credential); err != nil {
			return nil, nil, err
		}
		if cred, err = credentialFor(conf.Credential, a.keys.Node); err != nil {
			return nil, nil, err
		}
		if a.cc.base != "" {
			renewer = &savingRenewer{dir: cfg.Dir, inner: &node.NodeCredentialRenewer{ControlURL: a.cc.base, NodeKey: a.keys.Node, HTTPClient: cfg.HTTP}}
		}
	}
	if len(conf.NATSURLs) == 0 {
		return nil, nil, errors.New("no bus endpoint saved: run `mesh-adapter up <agent-key>` again")
	}
	if a.allow, err = allowance.Open(cfg.Dir.Path, a.id.AgentID, a.keys.Owner); err != nil {
		return nil, nil, err
	}
	if a.queue, err = inbox.Open(cfg.Dir.File(state.InboxFile), 2*time.Second); err != nil {
		return nil, nil, err
	}
	undo = append(undo, func() { _ = a.queue.Close() })
	journal, err := node.OpenFileJournal(cfg.Dir.File(state.JournalFile), nil)
	if err != nil {
		return nil, nil, err
	}
	undo = append(undo, func() { _ = journal.Close() })
	a.natsURL, a.renews = conf.NATSURLs[0], renewer != nil
	if a.node, err = a.startNode(ctx, node.Config{NATSURL: a.natsURL, NodeKey: a.keys.Node, ServicesKey: a.servicesKey(ctx, &conf),
		Credential: cred, Renewer: renewer, Journal: journal, Log: a.log, Warn: a.warn, Name: "mesh-adapter " + a.id.Name}, renewer); err != nil {
		return nil, nil, err
	}
	undo = append(undo, func() { _ = a.node.Close() })
	guard, err := cfg.Dir.Guard()
	if err != nil {
		return nil, nil, err
	}
	guard.Guarded = guard.Guarded && a.guest == nil
	// Room invites are answered by the runtime, remembering the room,
	// whatever the mode (a drained invite too).
	held := rooms.OpenStore(cfg.Dir.File(rooms.StoreFile), nil)
	a.held = held
	// What the agent sells (skus.json, `start --skus`); the owner key
	// attests the agent in every registration, so agreements to these SKUs
	// are made with the owner, not with this node.
	skus, err := cfg.Dir.SKUs()
	if err != nil {
		return nil, nil, err
	}
	acfg := node.AgentConfig{Key: a.keys.Agent, Name: a.id.Name, Description: "mesh-adapter (" + cfg.Mode + " mode)",
		Offerings:         []node.Offering{{ID: Offering, Name: "Chat", Description: "send a text message; the answer is text"}},
		AvailabilityClass: "intermittent", Sandbox: a.guest != nil, Visibility: "unlisted",
		Admit: a.admit, Handler: a.handle, OnReply: a.onReply, Guarded: guard.Guarded, RoomInvite: a.roomInvite(held),
		Owner: a.keys.Owner, SKUs: skus}
	if a.agent, err = a.node.Host(ctx, acfg); err != nil {
		var rev *node.ErrRevoked
		if errors.As(err, &rev) {
			return nil, nil, refused(rev)
		}
		return nil, nil, fmt.Errorf("register the agent: %w", err)
	}
	if a.rooms, err = rooms.New(rooms.Config{Conn: a.node.Conn(), Key: a.keys.Agent, Agent: a.agent, Store: held,
		Handle: a.id.Handle, URL: a.natsURL, Log: a.log, OnACLStop: a.aclStopped}); err != nil {
		return nil, nil, err
	}
	undo = append(undo, a.rooms.Close)
	if guard.Guarded {
		a.reguard(ctx)
	}
	if a.guest != nil {
		lctx, stop := context.WithCancel(ctx)
		undo = append(undo, stop)
		go a.keepLease(lctx, a.guest)
	}
	return a, undoAll, nil
}

// startGuest leases a guest credential when nothing better is saved. A
// guest identity lasts as long as its lease: each start leases a new key.
func (a *adapter) startGuest(ctx context.Context, conf *state.Config) (*guestLease, error) {
	g, err := leaseGuest(ctx, a.cc)
	if err != nil {
		return nil, err
	}
	name := a.cfg.Name
	if name == "" {
		name = "guest"
	}
	if a.id, err = state.NewIdentity(name, g.Key); err != nil {
		return nil, err
	}
	// A guest credential is its own node: the guest key signs the vouch,
	// the heartbeats and the broker's nonce.
	a.id.Guest, a.id.NodeSeed = true, string(g.Key.Seed())
	if a.keys, err = a.id.Keys(); err != nil {
		return nil, err
	}
	if err := a.dir.SaveIdentity(a.id); err != nil {
		return nil, err
	}
	conf.ControlURL = a.cc.base
	conf.NATSURLs = g.NATS
	conf.Credential = &state.Credential{Kind: "guest", JWT: g.JWT, ExpiresAt: g.ExpiresAt}
	if err := a.dir.SaveConfig(*conf); err != nil {
		return nil, err
	}
	return g, nil
}

// keepLease heartbeats the guest lease at a third of its idle time.
func (a *adapter) keepLease(ctx context.Context, g *guestLease) {
	every := time.Minute
	if exp, err := protocol.ParseTime(g.ExpiresAt); err == nil {
		if d := time.Until(exp) / 3; d > 5*time.Second && d < every {
			every = d
		}
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := g.heartbeat(ctx, a.cc); err != nil {
				fmt.Fprintf(a.cfg.Out, "warning: the guest lease could not be renewed: %v\n", err)
			}
		}
	}
}

// greet prints the agent id and the other nodes on this machine.
func (a *adapter) greet(nodes state.Nodes) {
	fmt.Fprintf(a.cfg.Out, "agent id: %s\n", a.id.AgentID)
	fmt.Fprintf(a.cfg.Out, "name:     %s\n", a.id.Name)
	switch a.cfg.Mode {
	case ModeInbox:
		fmt.Fprintln(a.cfg.Out, "mode:     inbox (read with `mesh-adapter inbox`, answer with `mesh-adapter reply`)")
	case ModeCmd:
		fmt.Fprintf(a.cfg.Out, "mode:     command (%s)\n", a.cfg.Command)
	}
	if a.guest != nil {
		fmt.Fprintln(a.cfg.Out, "note:     no agent key redeemed, so this is a guest (sandbox) identity that ends with this run;\n          run `mesh-adapter up <agent-key>` for one that lasts")
	}
	live, err := nodes.Live(a.node.ID())
	if err != nil {
		a.log.Warn("node discovery", "err", err)
	}
	for _, n := range live {
		fmt.Fprintf(a.cfg.Out, "also here: %s (%s, %s mode, pid %d)\n", n.Name, n.AgentID, n.Mode, n.PID)
	}
}

// warn prints the runtime's security warnings where the person sees them.
func (a *adapter) warn(w node.Warning) {
	fmt.Fprintf(a.cfg.Out, "warning: %s: %s\n", w.Code, w.Message)
}

func firstNonEmpty(s ...string) string {
	for _, x := range s {
		if x != "" {
			return x
		}
	}
	return ""
}
