package agreements

import (
	"context"
	"encoding/json"
	"slices"
	"time"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/errs"
)

// Volume windows of an engagement's volume clause (commerce.Volume): the
// clock hour and the UTC day.
const (
	WindowHour = "hour"
	WindowDay  = "day"
)

// counter is the value under a volume key: the requests admitted in one
// window.
type counter struct {
	Count int64 `json:"count"`
}

// window is one volume window that limits a request.
type window struct {
	name  string
	key   string
	limit int64
	end   time.Time
}

// VolumeKey is the counter of seller's requests from client in the window
// (WindowHour or WindowDay) that starts at start:
// vol.<seller>.<client>.<h|d>.<start, UTC, yyyymmddhh or yyyymmdd>.
func VolumeKey(seller, client, win string, start time.Time) string {
	start = start.UTC()
	if win == WindowHour {
		return commerce.VolumePrefix + seller + "." + client + ".h." + start.Format("2006010215")
	}
	return commerce.VolumePrefix + seller + "." + client + ".d." + start.Format("20060102")
}

// windows are the limited windows of v at now.
func windows(seller, client string, v commerce.Volume, now time.Time) []window {
	now = now.UTC()
	var out []window
	if v.PerHour > 0 {
		start := now.Truncate(time.Hour)
		out = append(out, window{WindowHour, VolumeKey(seller, client, WindowHour, start), v.PerHour, start.Add(time.Hour)})
	}
	if v.PerDay > 0 {
		start := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
		out = append(out, window{WindowDay, VolumeKey(seller, client, WindowDay, start), v.PerDay, start.AddDate(0, 0, 1)})
	}
	return out
}

// volume counts the request against the volume clause of the engagement
// between seller and client for offering, when one is in force
// (commerce.EngagementTerms.InForce) and has a volume clause. Each window's
// counter is taken by compare-and-set, so however many copies answer at
// once exactly the limit is admitted; a window that is full refuses with
// RATE_LIMITED and the time to its end (Agent SoW §5.6: refused with a
// retry time, not held), and gives back what the earlier windows took.
func (w *Worker) volume(ctx context.Context, seller, client, offering string, now time.Time) (string, *errs.Error, error) {
	b, found, err := bus.LeaderGet(ctx, w.svc.NC, commerce.Bucket, commerce.EngagementKey(seller, client, offering))
	if err != nil {
		return "", nil, errs.Wrap(errs.Unavailable, "the engagement terms could not be read just now; retry", err)
	}
	if !found {
		return "", nil, nil
	}
	var t commerce.EngagementTerms
	if err := json.Unmarshal(b, &t); err != nil {
		w.svc.Log.Error("engagement terms that do not decode", "seller", seller, "client", client, "offering", offering, "err", err)
		return "", nil, errs.Wrap(errs.Unavailable, "the engagement terms could not be read; retry later", err)
	}
	if !t.InForce(now) || (len(t.Offerings) > 0 && !slices.Contains(t.Offerings, offering)) {
		return "", nil, nil
	}
	if t.Volume == nil {
		return t.SowID, nil, nil
	}
	var taken []window
	for _, win := range windows(seller, client, *t.Volume, now) {
		full := false
		_, _, err := bus.CAS(ctx, w.kv, win.key, func(cur *counter, exists bool) (*counter, error) {
			n := int64(0)
			if exists {
				n = cur.Count
			}
			if full = n >= win.limit; full {
				return nil, bus.ErrNoChange
			}
			return &counter{Count: n + 1}, nil
		})
		if err != nil {
			w.giveBack(ctx, taken)
			return "", nil, errs.Wrap(errs.Unavailable, "the engagement's volume could not be counted just now; retry", err)
		}
		if full {
			w.giveBack(ctx, taken)
			retry := max(win.end.Sub(now).Milliseconds(), 1)
			return "", errs.Newf(errs.RateLimited, "the engagement %s admits %d requests per %s and this %s's are taken; retry after %s",
				t.SowID, win.limit, win.name, win.name, win.end.Format(time.RFC3339)).
				WithDetails(map[string]any{"sow_id": t.SowID, "window": win.name, "limit": win.limit}).
				WithRetryAfter(retry), nil
		}
		taken = append(taken, win)
	}
	return t.SowID, nil, nil
}

// giveBack returns the units taken in windows before a later one refused.
// A failure is logged: the window then counts one request too many, which
// refuses early rather than admitting over the limit.
func (w *Worker) giveBack(ctx context.Context, taken []window) {
	for _, win := range taken {
		_, _, err := bus.CAS(ctx, w.kv, win.key, func(cur *counter, exists bool) (*counter, error) {
			if !exists || cur.Count == 0 {
				return nil, bus.ErrNoChange
			}
			return &counter{Count: cur.Count - 1}, nil
		})
		if err != nil {
			w.svc.Log.Warn("a volume unit was not given back", "key", win.key, "err", err)
		}
	}
}
