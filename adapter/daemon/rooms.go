package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"agentmesh.dev/mesh/adapter/control"
	"agentmesh.dev/mesh/adapter/node"
	"agentmesh.dev/mesh/adapter/rooms"
)

// roomInvite answers the reserved rooms.invite offering: the store
// remembers the room, and the person running the adapter is told.
func (a *adapter) roomInvite(held *rooms.Store) func(ctx context.Context, c *node.Call) (any, error) {
	return func(ctx context.Context, c *node.Call) (any, error) {
		out, err := held.AcceptInvite(ctx, c)
		if err != nil {
			a.log.Info("a room invite was refused", "from", c.Env.From, "err", err)
			return nil, err
		}
		if m, ok := out.(map[string]any); ok {
			fmt.Fprintf(a.cfg.Out, "room invite: agent %s invited this agent to room %v (see `mesh-adapter room list`)\n", c.Env.From, m["room_id"])
		}
		return out, nil
	}
}

// inviteAnswered takes the late answer to an invite this agent sent (the
// invitee's adapter took it from its mailbox) and tells the person; it
// reports whether r was one.
func (a *adapter) inviteAnswered(r *node.Result) bool {
	if a.held == nil {
		return false
	}
	inv, ok, err := a.held.TakeInvite(r.RequestID, r.From)
	if err != nil {
		a.log.Warn("the invites sent could not be read", "err", err)
	}
	if !ok {
		return false
	}
	if e := answerError(r); e != nil {
		fmt.Fprintf(a.cfg.Out, "room invite: agent %s refused the invite to room %s: %s\n", inv.To, inv.RoomID, OneLine(Describe(e).Error()))
	} else {
		fmt.Fprintf(a.cfg.Out, "room invite: agent %s took the invite to room %s\n", inv.To, inv.RoomID)
	}
	return true
}

// aclStopped tells the person that an acl room's connection ended for good.
func (a *adapter) aclStopped(roomID string, why error) {
	fmt.Fprintf(a.cfg.Out, "warning: acl room %s: %v\n", roomID, why)
}

// room runs a rooms or board command for the control socket. An invite
// names the invitee by agent id or handle; a handle is resolved (and
// pinned) like a send's recipient.
func (a *adapter) room(ctx context.Context, r control.Request) (any, error) {
	var cmd rooms.Command
	if err := json.Unmarshal(r.Room, &cmd); err != nil {
		return nil, fmt.Errorf("the rooms command is not readable: %w", err)
	}
	if a.guest != nil {
		return nil, errGuestRooms
	}
	if err := a.notConnected(ctx); err != nil {
		return nil, err
	}
	if cmd.Verb == "invite" || cmd.Verb == "expel" {
		cfg := a.cfg
		cfg.RegistrarURL = firstNonEmpty(r.RegistrarURL, cfg.RegistrarURL)
		to, err := resolveRecipient(ctx, cfg, cmd.To, SendOptions{AcceptNewBinding: r.AcceptNewBinding})
		if err != nil {
			return nil, err
		}
		cmd.To = to
	}
	return a.rooms.Do(ctx, cmd)
}

var errGuestRooms = errors.New("rooms need an agent of your own: a guest identity reaches no rooms or board; run `mesh-adapter up <agent-key>` first")

// Room runs one rooms or board command without a running adapter: the
// agent comes up for the length of the command (in inbox mode, so a
// message or an invite arriving meanwhile is kept), like Send.
func Room(ctx context.Context, cfg Config, cmd rooms.Command, opt SendOptions) (any, error) {
	cfg.Mode = ModeInbox
	switch id, err := cfg.Dir.Identity(); {
	case err != nil:
		return nil, err
	case id.Guest:
		return nil, errGuestRooms
	}
	conf, err := cfg.Dir.Config()
	if err != nil {
		return nil, err
	}
	if cmd.Verb == "invite" || cmd.Verb == "expel" {
		rcfg := cfg
		rcfg.RegistrarURL = firstNonEmpty(opt.RegistrarURL, cfg.RegistrarURL, conf.RegistrarURL)
		if cmd.To, err = resolveRecipient(ctx, rcfg, cmd.To, opt); err != nil {
			return nil, err
		}
	}
	a, closeAll, err := open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	return a.rooms.Do(ctx, cmd)
}
