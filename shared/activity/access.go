package activity

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"

	"github.com/synadia-io/orbit.go/jetstreamext"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// Who reads the timeline and the counters (docs/bus.md "Who may call
// what"). The broker lets only app credentials (and the services) publish
// mesh.activity.list and mesh.usage.list (creds.AppPermissions); the
// worker then answers:
//
//   - the services key (the account's HTTP views, which pick the account's
//     agents themselves): about any agent;
//   - an app's key (the app signs with it): about the agents of the account
//     that owns the app, as the control plane's record of the app says
//     (appagents.go), on a private reply only, since what an account's
//     agents did is not for every credential on the shared _INBOX.;
//     the reply must be under the app's own private prefix, so a signed
//     request replayed by another credential with its own private reply
//     prefix is refused, and likewise the services key's under _MESH_SVC.;
//   - any other signer (an app revoked or of a disabled account, an
//     operator test credential signing as some agent): FORBIDDEN.

// scope is who the caller of r may read about: all (nil, the services) or
// the agents in the set.
func (w *Worker) scope(ctx context.Context, r *bus.Request) (map[string]bool, error) {
	if r.Env.From == w.svc.Key.Public() {
		if !strings.HasPrefix(r.Reply, protocol.ServiceInboxPrefix+".") {
			return nil, errs.Newf(errs.InvalidRequest,
				"%s signed by the services key is answered only under %s.", r.Subject, protocol.ServiceInboxPrefix)
		}
		return nil, nil
	}
	agents, err := w.appAgents(ctx, r.Env.From)
	if errs.CodeOf(err) == errs.NotFound {
		return nil, errs.Newf(errs.Forbidden,
			"%s answers an app credential about its own account's agents (sign with the app key) and the account's HTTP views; %s is no live app", r.Subject, r.Env.From)
	}
	if err != nil {
		return nil, errs.OrUnavailable(err, "the app's account could not be read; try again")
	}
	// The signer's own private prefix, not merely a private one: another
	// credential replaying the app's signed request with its own
	// _MESH_INBOX.<key> reply would otherwise read the account's data.
	if !strings.HasPrefix(r.Reply, protocol.PrivateInboxPrefix(r.Env.From)+".") {
		return nil, errs.New(errs.InvalidRequest,
			"an account's activity and usage go only to the app's own private reply: connect with the app's inbox_prefix (_MESH_INBOX.<app key>)")
	}
	in := make(map[string]bool, len(agents))
	for _, a := range agents {
		in[a] = true
	}
	return in, nil
}

// notYours is the refusal of a filter naming an agent outside the scope.
func notYours(agent string) error {
	return errs.Newf(errs.Forbidden, "agent %s is not one of this app's account's agents", agent)
}

// usageOf reads the counters of agents, at most maxUsageBatch subjects a
// request (the broker answers at most 1,024 in one).
func (w *Worker) usageOf(ctx context.Context, agents []string) ([]Usage, error) {
	out := []Usage{}
	for batch := range slices.Chunk(agents, maxUsageBatch) {
		subjects := make([]string, len(batch))
		for i, a := range batch {
			subjects[i] = "$KV." + UsageBucket + "." + a
		}
		got, err := w.lastValues(ctx, subjects)
		if err != nil {
			return nil, err
		}
		out = append(out, got...)
	}
	return out, nil
}

const maxUsageBatch = 1000

// allUsage reads every agent's counters: one request for the last value
// of every single-token key (catalog and app keys have two), or a pass over the
// bucket past what one request answers.
func (w *Worker) allUsage(ctx context.Context) ([]Usage, error) {
	out, err := w.lastValues(ctx, []string{"$KV." + UsageBucket + ".*"})
	if err == nil {
		return out, nil
	}
	out = []Usage{}
	err = bus.EachValue(ctx, w.usage, func(key string, v []byte) {
		if strings.HasPrefix(key, CatalogPrefix) || strings.HasPrefix(key, AppAgentsPrefix) {
			return
		}
		var u Usage
		if json.Unmarshal(v, &u) == nil {
			out = append(out, u)
		}
	})
	return out, err
}

// lastValues reads the usage values on subjects in one direct get.
func (w *Worker) lastValues(ctx context.Context, subjects []string) ([]Usage, error) {
	out := []Usage{}
	msgs, err := jetstreamext.GetLastMsgsFor(ctx, w.svc.JS, "KV_"+UsageBucket, subjects)
	if err != nil {
		return nil, err
	}
	for m, err := range msgs {
		if errors.Is(err, jetstreamext.ErrNoMessages) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if m.Header.Get("KV-Operation") != "" {
			continue
		}
		var u Usage
		if json.Unmarshal(m.Data, &u) == nil && keys.IsUserPublicKey(u.Agent) {
			out = append(out, u)
		}
	}
	return out, nil
}
