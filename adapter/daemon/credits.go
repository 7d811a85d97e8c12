package daemon

import (
	"context"
	"errors"
	"time"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/protocol"
)

// CreditsResult is the answer of the control socket's credits: the
// balance of the agent's registered owner and its latest history rows,
// as the clearing service answers them (docs/commerce.md).
type CreditsResult struct {
	Balance map[string]any `json:"balance"`
	History map[string]any `json:"history"`
}

// creditsHistory is how many history rows `credits` shows.
const creditsHistory = 10

var errGuestCredits = errors.New("credits belong to an owner: a guest identity has none; run `mesh-adapter up <agent-key>` first")

// credits asks the clearing service, as the agent, for its owner's
// balance and latest history (mesh.credits.balance and history: the
// service answers for the owner the agent is registered with).
func (a *adapter) credits(ctx context.Context) (CreditsResult, error) {
	if a.guest != nil {
		return CreditsResult{}, errGuestCredits
	}
	if err := a.notConnected(ctx); err != nil {
		return CreditsResult{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	var out CreditsResult
	for _, q := range []struct {
		verb    string
		payload map[string]any
		dst     *map[string]any
	}{
		{"balance", map[string]any{}, &out.Balance},
		{"history", map[string]any{"limit": creditsHistory}, &out.History},
	} {
		rep, err := bus.Call(ctx, a.node.Conn(), a.keys.Agent, protocol.CreditVerbSubject(q.verb), protocol.TypeRequest, "", q.payload)
		if err != nil {
			return CreditsResult{}, err
		}
		if err := rep.DecodePayload(q.dst); err != nil {
			return CreditsResult{}, err
		}
	}
	return out, nil
}

// Credits reads the credits without a running adapter: the agent comes up
// for the length of the command (in inbox mode), like Room.
func Credits(ctx context.Context, cfg Config) (CreditsResult, error) {
	cfg.Mode = ModeInbox
	switch id, err := cfg.Dir.Identity(); {
	case err != nil:
		return CreditsResult{}, err
	case id.Guest:
		return CreditsResult{}, errGuestCredits
	}
	a, closeAll, err := open(ctx, cfg)
	if err != nil {
		return CreditsResult{}, err
	}
	defer closeAll()
	return a.credits(ctx)
}
