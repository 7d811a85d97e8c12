package agreements

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/errs"
)

// scope refuses a request naming an offering outside the scope of the
// engagements between seller and client that grade scope enforced and are
// in force (Agent SoW §5.2: "the provider node MUST refuse, with a typed
// refusal, a request naming an offering that is not listed"). The
// engagement service mirrors those engagements' terms under
// commerce.EngagementScopeKey; with none in force the request goes on to
// general admission. The refusal is FORBIDDEN with details {sow_id,
// offerings}: the engagement and what it does cover.
func (w *Worker) scope(ctx context.Context, seller, client, offering string, now time.Time) (*errs.Error, error) {
	b, found, err := bus.LeaderGet(ctx, w.svc.NC, commerce.Bucket, commerce.EngagementScopeKey(seller, client))
	if err != nil {
		return nil, errs.Wrap(errs.Unavailable, "the engagement scopes could not be read just now; retry", err)
	}
	if !found {
		return nil, nil
	}
	var list []commerce.EngagementTerms
	if err := json.Unmarshal(b, &list); err != nil {
		w.svc.Log.Error("engagement scopes that do not decode", "seller", seller, "client", client, "err", err)
		return nil, errs.Wrap(errs.Unavailable, "the engagement scopes could not be read; retry later", err)
	}
	var sowID string
	var covered []string
	for _, t := range list {
		if !t.InForce(now) {
			continue
		}
		if slices.Contains(t.Offerings, offering) {
			return nil, nil
		}
		if sowID == "" {
			sowID = t.SowID
		}
		covered = append(covered, t.Offerings...)
	}
	if sowID == "" {
		return nil, nil
	}
	slices.Sort(covered)
	covered = slices.Compact(covered)
	return errs.Newf(errs.Forbidden, "the engagement %s in force between this client and seller covers only %s, not %q; a request outside its scope is refused (Agent SoW §5.2)",
		sowID, strings.Join(covered, ", "), offering).
		WithDetails(map[string]any{"sow_id": sowID, "offerings": covered}), nil
}
