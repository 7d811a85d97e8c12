package daemon

import (
	"context"
	"fmt"

	"agentmesh.dev/mesh/adapter/control"
	"agentmesh.dev/mesh/shared/errs"
)

// registration answers the control socket's "registration": the registry
// record of r.To (an agent id, or a handle resolved and pinned like a
// send's recipient), read over the running adapter's connection.
func (a *adapter) registration(ctx context.Context, r control.Request) (any, error) {
	cfg := a.cfg
	cfg.RegistrarURL = firstNonEmpty(r.RegistrarURL, cfg.RegistrarURL)
	id, err := resolveRecipient(ctx, cfg, r.To, SendOptions{AcceptNewBinding: r.AcceptNewBinding})
	if err != nil {
		return nil, err
	}
	if err := a.notConnected(ctx); err != nil {
		return nil, err
	}
	return a.readRegistration(ctx, id)
}

func (a *adapter) readRegistration(ctx context.Context, id string) (map[string]any, error) {
	rec, err := a.node.Registration(ctx, a.keys.Agent, id)
	if errs.CodeOf(err) == errs.NotFound {
		return nil, fmt.Errorf("agent %s is not registered (or its manifest is private)", id)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the registration of %s: %w", id, err)
	}
	return rec, nil
}

// Registration reads the registry record of to without a running adapter:
// the agent comes up for the length of the read (in inbox mode, so a
// message arriving meanwhile is kept), like Send. A handle is resolved
// before the agent comes up.
func Registration(ctx context.Context, cfg Config, to string, opt SendOptions) (map[string]any, error) {
	cfg.Mode = ModeInbox
	conf, err := cfg.Dir.Config()
	if err != nil {
		return nil, err
	}
	rcfg := cfg
	rcfg.RegistrarURL = firstNonEmpty(opt.RegistrarURL, cfg.RegistrarURL, conf.RegistrarURL)
	id, err := resolveRecipient(ctx, rcfg, to, opt)
	if err != nil {
		return nil, err
	}
	a, closeAll, err := open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	return a.readRegistration(ctx, id)
}
