package registry

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// wantType refuses an envelope of the wrong type for the subject (spec
// §4.3: register and deregister take "register", the reads "discover").
func wantType(r *bus.Request, t protocol.Type) error {
	if r.Env.Type != t {
		return errs.Newf(errs.InvalidEnvelope, "%s takes a %q envelope, not %q", r.Subject, t, r.Env.Type)
	}
	return nil
}

// register serves mesh.registry.register and its node-bound form
// mesh.registry.register.<node>, whose token must be the attesting node.
//
// Sandbox is decided by what the control plane issued and the broker
// enforces, never by what the sender claims alone. A registration is
// sandbox when
//
//   - its agent key or its vouching node key is a live guest key: the guest
//     service records every leased key in GuestsBucket before it hands the
//     credential out, and removes it only once the lease has ended and the
//     credential is revoked. So a guest is sandbox on whichever register
//     subject it uses, and so is every agent a guest key vouches for;
//   - it arrived on a bound subject: a control plane that cannot record
//     its guests issues them only their own bound subject
//     (creds.PinnedGuestPermissions), and a node that registers there is
//     sandboxed with them;
//   - it declares trust_tier "sandbox".
//
// Nothing else: an agent that is its own node (node.id == id), the shape of
// an upstream SDK's standalone agent on an am_ credential, is listed like
// any other (spec §5). The sender chooses node.id and trust_tier, so these
// only ever add sandbox. A failed read of the roster refuses the
// registration (UNAVAILABLE) rather than list what may be a guest.
func (w *Worker) register(ctx context.Context, r *bus.Request) (any, error) {
	if err := wantType(r, protocol.TypeRegister); err != nil {
		return nil, err
	}
	now := w.now()
	tok, bound := strings.CutPrefix(r.Subject, protocol.SubjRegister+".")
	m, err := parseManifest(r.Payload, r.Env.From, now)
	if err != nil {
		return nil, err
	}
	if bound && tok != m.node {
		return nil, errs.Newf(errs.Unauthorized, "registration arrived on %s but is attested by node %s", r.Subject, m.node)
	}
	guest, err := isGuest(ctx, w.svc.NC, m.id, m.node)
	if err != nil {
		return nil, errs.OrUnavailable(err, "the registry could not check the guest leases; try again")
	}
	m.file(bound || guest || m.declaresSandbox())
	if err := m.sellable(); err != nil {
		return nil, err
	}
	var created, moved bool
	var prevNode string
	_, changed, err := bus.CAS(ctx, w.kv, m.id, func(cur *record, exists bool) (*record, error) {
		next := record(maps.Clone(m.rec))
		created, moved, prevNode = !exists, false, ""
		next["registered_at"] = protocol.FormatTime(now)
		if exists {
			prevNode = cur.nodeID()
			moved = prevNode != m.node
			// A renewal (same node) keeps the first registration time; a
			// migration to another node is a new registration.
			if ra := cur.str("registered_at"); ra != "" && !moved {
				next["registered_at"] = ra
			}
		}
		return &next, nil
	})
	if err != nil {
		return nil, errs.OrUnavailable(err, "the registry could not store the registration; try again")
	}
	if changed && (created || moved) {
		data := map[string]any{"agent_id": m.id, "node": m.node, "sandbox": m.sandbox}
		if moved {
			data["previous_node"] = prevNode
		}
		if err := w.svc.Emit(Name, EventRegistered, data); err != nil {
			w.log.Warn("emit", "event", EventRegistered, "agent", m.id, "err", err)
		}
	}
	return map[string]any{"status": "registered", "agent_id": m.id, "visibility": m.rec.visibility(), "sandbox": m.sandbox}, nil
}

var errNotRegistered = errors.New("not registered")

// deregister serves mesh.registry.deregister: only the agent itself may
// remove its registration.
func (w *Worker) deregister(ctx context.Context, r *bus.Request) (any, error) {
	if err := wantType(r, protocol.TypeRegister); err != nil {
		return nil, err
	}
	agent, ok := r.Object()["agent_id"].(string)
	if !ok || !keys.IsUserPublicKey(agent) {
		return nil, errs.New(errs.InvalidEnvelope, "deregister takes {agent_id}, the agent's public key")
	}
	if agent != r.Env.From {
		return nil, errs.New(errs.IdentityMismatch, "only the agent itself may deregister it: sign with the agent key")
	}
	_, changed, err := bus.CAS(ctx, w.kv, agent, func(_ *record, exists bool) (*record, error) {
		if !exists {
			return nil, errNotRegistered
		}
		return nil, nil
	})
	if errors.Is(err, errNotRegistered) {
		return nil, errs.Newf(errs.NotFound, "agent %s is not registered", agent)
	}
	if err != nil {
		return nil, errs.OrUnavailable(err, "the registry could not remove the registration; try again")
	}
	if changed {
		if err := w.svc.Emit(Name, EventDeregistered, map[string]any{"agent_id": agent}); err != nil {
			w.log.Warn("emit", "event", EventDeregistered, "agent", agent, "err", err)
		}
	}
	return map[string]any{"status": "deregistered", "agent_id": agent}, nil
}

// get serves mesh.registry.get.<agentId>: any registered agent by id,
// unlisted included; a private one only to the agent itself or its node.
func (w *Worker) get(ctx context.Context, r *bus.Request) (any, error) {
	if err := wantType(r, protocol.TypeDiscover); err != nil {
		return nil, err
	}
	agent := strings.TrimPrefix(r.Subject, protocol.SubjRegistryGetPfx)
	notFound := errs.Newf(errs.NotFound, "agent %s is not registered", agent)
	if !keys.IsUserPublicKey(agent) {
		return nil, notFound
	}
	rec, found, err := getRecord(ctx, w, agent)
	if err != nil {
		return nil, errs.OrUnavailable(err, "the registry could not be read; try again")
	}
	if !found {
		return nil, notFound
	}
	// A private manifest is for the agent and its node, and only where
	// they alone read the answer: not on the shared _INBOX., which every
	// upstream-style credential may subscribe (docs/security.md).
	if rec.visibility() == VisibilityPrivate && (r.Env.From != agent && r.Env.From != rec.nodeID() || !r.PrivateReply()) {
		return nil, notFound
	}
	p := newPresence(w)
	st, err := p.node(ctx, rec.nodeID())
	if err != nil {
		return nil, errs.OrUnavailable(err, "presence could not be read; try again")
	}
	return rec.stamped(st.availability()), nil
}

func getRecord(ctx context.Context, w *Worker, agent string) (record, bool, error) {
	return bus.GetJSON[record](ctx, w.kv, agent)
}

func sortedKeys(m map[string]bool) []string {
	return slices.Sorted(maps.Keys(m))
}
