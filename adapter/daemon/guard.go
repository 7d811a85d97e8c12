package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"agentmesh.dev/mesh/adapter/state"
	"agentmesh.dev/mesh/shared/protocol"
)

// GuardResult is the answer of the control socket's guard and unguard.
type GuardResult struct {
	AgentID  string `json:"agent_id"`
	Guarded  bool   `json:"guarded"`
	OwnerKey string `json:"owner_key,omitempty"`
	Contacts int    `json:"contacts"`
}

// guard submits the owner-signed roster (raw, as `contacts export` wrote
// it; empty keeps the roster the admission service holds) to
// mesh.admission.guard, moves the agent to its guarded inbox, and records
// it in guard.json so a restarted adapter comes back guarded.
func (a *adapter) guard(ctx context.Context, raw json.RawMessage) (GuardResult, error) {
	if a.guest != nil {
		return GuardResult{}, errors.New("a guest (sandbox) agent has no mailbox and cannot be guarded: redeem an agent key with `mesh-adapter up` first")
	}
	var roster map[string]any
	var rec state.Guard
	if len(raw) > 0 && string(raw) != "null" {
		if err := json.Unmarshal(raw, &roster); err != nil {
			return GuardResult{}, fmt.Errorf("the roster is not a JSON object: %w", err)
		}
		rec.OwnerKey, _ = roster["owner_key"].(string)
		if entries, ok := roster["entries"].([]any); ok {
			rec.Contacts = len(entries)
		}
	}
	var arg any
	if roster != nil {
		arg = roster
	}
	guarded, err := a.agent.Guard(ctx, arg)
	if err != nil {
		return GuardResult{}, fmt.Errorf("the admission service refused or did not answer: %w", err)
	}
	rec.Guarded, rec.UpdatedAt = guarded, protocol.FormatTime(time.Now())
	if roster == nil {
		if prev, err := a.dir.Guard(); err == nil {
			rec.OwnerKey, rec.Contacts = prev.OwnerKey, prev.Contacts
		}
	}
	if err := a.dir.SaveGuard(rec); err != nil {
		return GuardResult{}, fmt.Errorf("guarded, but not recorded for the next start: %w", err)
	}
	return GuardResult{AgentID: a.id.AgentID, Guarded: guarded, OwnerKey: rec.OwnerKey, Contacts: rec.Contacts}, nil
}

// unguard withdraws the guard (mesh.admission.unguard): the agent takes
// its requests at its public inbox again.
func (a *adapter) unguard(ctx context.Context) (GuardResult, error) {
	if err := a.agent.Unguard(ctx); err != nil {
		return GuardResult{}, fmt.Errorf("the admission service refused or did not answer: %w", err)
	}
	if err := a.dir.SaveGuard(state.Guard{UpdatedAt: protocol.FormatTime(time.Now())}); err != nil {
		return GuardResult{}, fmt.Errorf("unguarded, but not recorded for the next start: %w", err)
	}
	return GuardResult{AgentID: a.id.AgentID}, nil
}

// reguard asks for the guard again at start, when guard.json says the
// agent was guarded: the agent already serves its guarded inbox, and the
// admission service, which keeps the roster, confirms it takes the public
// one (it may have lost its record). A failure is reported, not fatal: the
// agent then takes requests only as the service relays them.
func (a *adapter) reguard(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if _, err := a.agent.Guard(ctx, nil); err != nil {
		fmt.Fprintf(a.cfg.Out, "warning: this agent was guarded, and the admission service did not confirm it still is (%v); run `mesh-adapter guard` again, or `mesh-adapter unguard`\n", err)
	}
}
