package agreements

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

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

// VolumeKey is the counter of seller's requests from client under
// version version of engagement sowID in the window (WindowHour or
// WindowDay) that starts at start:
// vol.<seller>.<client>.<sow>.<version>.<h|d>.<start, UTC, yyyymmddhh or
// yyyymmdd>, where <sow> is SowToken(sowID). Two engagements between the
// same pair never share a counter, and an amendment (a new version, whose
// volume may differ) starts its own.
func VolumeKey(seller, client, sowID string, version int, win string, start time.Time) string {
	start = start.UTC()
	base := commerce.VolumePrefix + seller + "." + client + "." + SowToken(sowID) + "." + strconv.Itoa(version)
	if win == WindowHour {
		return base + ".h." + start.Format(hourLayout)
	}
	return base + ".d." + start.Format(dayLayout)
}

// Layouts of a window's start in a volume key.
const (
	hourLayout = "2006010215"
	dayLayout  = "20060102"
)

// SowToken is a sow id as one key token: a SoW's id is the document's,
// any string, so the key carries the first 128 bits of its SHA-256, in hex.
func SowToken(sowID string) string {
	sum := sha256.Sum256([]byte(sowID))
	return hex.EncodeToString(sum[:16])
}

// windowEnd is when the window of a volume key ends (ok false for a key
// that is no volume counter of this form).
func windowEnd(key string) (time.Time, bool) {
	parts := strings.Split(strings.TrimPrefix(key, commerce.VolumePrefix), ".")
	if len(parts) < 2 {
		return time.Time{}, false
	}
	win, start := parts[len(parts)-2], parts[len(parts)-1]
	switch win {
	case "h":
		t, err := time.Parse(hourLayout, start)
		return t.Add(time.Hour), err == nil
	case "d":
		t, err := time.Parse(dayLayout, start)
		return t.AddDate(0, 0, 1), err == nil
	}
	return time.Time{}, false
}

// windows are the limited windows of t's volume at now.
func windows(seller, client string, t commerce.EngagementTerms, now time.Time) []window {
	v := *t.Volume
	now = now.UTC()
	var out []window
	if v.PerHour > 0 {
		start := now.Truncate(time.Hour)
		out = append(out, window{WindowHour, VolumeKey(seller, client, t.SowID, t.Version, WindowHour, start), v.PerHour, start.Add(time.Hour)})
	}
	if v.PerDay > 0 {
		start := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
		out = append(out, window{WindowDay, VolumeKey(seller, client, t.SowID, t.Version, WindowDay, start), v.PerDay, start.AddDate(0, 0, 1)})
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
	for _, win := range windows(seller, client, t, now) {
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

// Volume counters are swept: a window's counter is never written again
// once the window has ended, and is kept a day past its end (for whoever
// looks into a refusal), then removed.
const (
	// DefaultSweepEvery is how often each copy sweeps the counters.
	DefaultSweepEvery = time.Hour
	// counterKeep is how long a counter is kept after its window ends.
	counterKeep = 24 * time.Hour
)

// sweepLoop runs Sweep every every until ctx ends.
func (w *Worker) sweepLoop(ctx context.Context, every time.Duration) {
	defer w.done.Done()
	bus.Every(ctx, every, func(sctx context.Context) {
		if n, err := w.Sweep(sctx); err != nil {
			if ctx.Err() == nil {
				w.svc.Log.Warn("volume counter sweep", "err", err, "removed", n)
			}
		} else if n > 0 {
			w.svc.Log.Info("volume counters of ended windows removed", "count", n)
		}
	})
}

// Sweep removes every volume counter whose window ended more than a day
// ago, and answers how many it removed. Each is purged from the bucket's
// stream (no delete marker is left behind to accumulate). Copies may sweep
// at the same time: purging a subject twice is harmless, and no request
// counts in a window that has ended.
func (w *Worker) Sweep(ctx context.Context) (int, error) {
	cutoff := w.now().Add(-counterKeep)
	var old []string
	err := w.keys(ctx, commerce.VolumePrefix+">", func(key string) bool {
		if end, ok := windowEnd(key); ok && end.Before(cutoff) {
			old = append(old, key)
		}
		return true
	})
	if err != nil {
		return 0, err
	}
	if len(old) == 0 {
		return 0, nil
	}
	stream, err := w.svc.JS.Stream(ctx, "KV_"+commerce.Bucket)
	if err != nil {
		return 0, fmt.Errorf("%s: sweep: the bucket's stream: %w", Name, err)
	}
	n := 0
	for _, key := range old {
		if err := stream.Purge(ctx, jetstream.WithPurgeSubject("$KV."+commerce.Bucket+"."+key)); err != nil {
			return n, fmt.Errorf("%s: sweep %s: %w", Name, key, err)
		}
		n++
	}
	return n, nil
}
