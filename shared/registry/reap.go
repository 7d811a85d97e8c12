package registry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
)

// Reap reclaims registrations (upstream-notes §2.4): every registration
// whose vouch expired (reason vouch_expired), and every sandbox
// registration whose node has been silent for SandboxTTL (reason
// sandbox_idle), silence counted from the node's last heartbeat in
// mesh_presence or, when later or when the node was never seen, from the
// last (re-)registration. A non-sandbox registration is never reclaimed for
// missed heartbeats. Each reclamation is a compare-and-set delete that
// re-checks the condition on the current record, so copies reaping at once
// reclaim (and emit registry.agent_reaped for) each registration once (the
// mailbox worker's sweep purges the mail of keys left with no
// registration). It returns how many this call reclaimed.
func (w *Worker) Reap(ctx context.Context) (int, error) {
	recs, err := w.records(ctx)
	if err != nil {
		return 0, err
	}
	now := w.now()
	p := newPresence(w)
	n := 0
	var errList []error
	for _, rec := range recs {
		reason, err := w.reapReason(ctx, p, rec, now)
		if err != nil {
			errList = append(errList, err)
			continue
		}
		if reason == "" {
			continue
		}
		agent := rec.id()
		var why string
		_, changed, err := bus.CAS(ctx, w.kv, agent, func(cur *record, exists bool) (*record, error) {
			why = ""
			if !exists {
				return nil, bus.ErrNoChange
			}
			// Decide again on what is stored now: the agent may have
			// renewed its vouch or moved since the listing.
			r, err := w.reapReason(ctx, p, *cur, now)
			if err != nil {
				return nil, err
			}
			if r == "" {
				return nil, bus.ErrNoChange
			}
			why = r
			return nil, nil
		})
		if err != nil {
			errList = append(errList, err)
			continue
		}
		if !changed {
			continue
		}
		n++
		if err := w.svc.Emit(Name, EventReaped, map[string]any{"agent_id": agent, "reason": why}); err != nil {
			w.log.Warn("emit", "event", EventReaped, "agent", agent, "err", err)
		}
	}
	return n, errors.Join(errList...)
}

// reapReason says why rec should be reclaimed at now, or "" to keep it.
func (w *Worker) reapReason(ctx context.Context, p *presence, rec record, now time.Time) (string, error) {
	if exp, ok := rec.time("vouch_expires_at"); ok && now.After(exp) {
		return ReasonVouchExpired, nil
	}
	if !rec.sandbox() {
		return "", nil
	}
	st, err := p.node(ctx, rec.nodeID())
	if err != nil {
		return "", err
	}
	var since time.Time
	for _, t := range []string{"registered_at", "updated_at"} {
		if at, ok := rec.time(t); ok && at.After(since) {
			since = at
		}
	}
	if st.lastSeen.After(since) {
		since = st.lastSeen
	}
	if !since.IsZero() && now.Sub(since) > w.cfg.SandboxTTL {
		return ReasonSandboxIdle, nil
	}
	return "", nil
}

// MaxEvict bounds one mesh.internal.guest.evict request.
const MaxEvict = 1000

// evictGuests serves mesh.internal.guest.evict, which the control plane
// calls when guest leases end (spec §3.3: "registration deregistered"):
// {keys:[guest keys]} → {evicted:[the agent ids removed]}. It removes the
// sandbox registration of each guest key and every sandbox registration a
// guest key attested as its node: an agent a guest vouches for is sandbox
// (its node is a guest key, or it arrived on the guest's bound subject) and
// over with the lease. Only sandbox registrations are
// removed, each by a compare-and-set delete that checks the stored record
// again, so copies evicting at once remove (and emit
// registry.agent_reaped with reason guest_lease_ended for) each once. A
// key with no registration is not an error: the guest may never have
// registered, or the sweep got there first. Only the services key may
// call it (FORBIDDEN otherwise).
func (w *Worker) evictGuests(ctx context.Context, r *bus.Request) (any, error) {
	if err := w.svc.RequireServices(r); err != nil {
		return nil, err
	}
	raw, ok := r.Object()["keys"].([]any)
	if !ok || len(raw) > MaxEvict {
		return nil, errs.Newf(errs.InvalidRequest, "evict takes {keys: [guest public keys]}, at most %d", MaxEvict)
	}
	guests := make(map[string]bool, len(raw))
	var targets []string
	for _, v := range raw {
		agent, ok := v.(string)
		if !ok || !keys.IsUserPublicKey(agent) {
			return nil, errs.Newf(errs.InvalidRequest, "evict: %v is not a public key", v)
		}
		if !guests[agent] {
			guests[agent] = true
			targets = append(targets, agent)
		}
	}
	if len(guests) > 0 {
		recs, err := w.records(ctx)
		if err != nil {
			return nil, errs.OrUnavailable(err, "the registry could not be read; try again")
		}
		for _, rec := range recs {
			if rec.sandbox() && guests[rec.nodeID()] && !guests[rec.id()] {
				targets = append(targets, rec.id())
			}
		}
	}
	evicted := []string{}
	var errList []error
	for _, agent := range targets {
		_, changed, err := bus.CAS(ctx, w.kv, agent, func(cur *record, exists bool) (*record, error) {
			if !exists || !cur.sandbox() || !(guests[cur.id()] || guests[cur.nodeID()]) {
				return nil, bus.ErrNoChange
			}
			return nil, nil
		})
		if err != nil {
			errList = append(errList, fmt.Errorf("evict %s: %w", agent, err))
			continue
		}
		if !changed {
			continue
		}
		evicted = append(evicted, agent)
		if err := w.svc.Emit(Name, EventReaped, map[string]any{"agent_id": agent, "reason": ReasonLeaseEnded}); err != nil {
			w.log.Warn("emit", "event", EventReaped, "agent", agent, "err", err)
		}
	}
	if err := errors.Join(errList...); err != nil {
		return nil, errs.OrUnavailable(err, "the registry could not remove every guest registration; try again")
	}
	return map[string]any{"evicted": evicted}, nil
}
