package activity

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
)

// Which agents an app may read about is the control plane's to say (its
// store holds accounts, apps and agents), and the worker never reads that
// store: in the cloud it cannot (Firestore is the functions'). So the
// control plane mirrors the answer onto the bus, one record per live app
// under AppAgentsPrefix+<app key> in the worker's own bucket (a prefix
// there costs no stream, DESIGN §5), written whenever the answer may
// change and checked against the store by the credential sweep
// (credential.Service.ResyncApps). A key with no record is no live app.
// meshd and the cloud take this one path.

// AppAgentsPrefix is the prefix of the app records in UsageBucket.
const AppAgentsPrefix = "appagents."

// appRecord is the value under AppAgentsPrefix+<app key>: the agents of
// the account that owns the app (credential.Service.AppAgents).
type appRecord struct {
	Agents []string `json:"agents"`
}

// UsageBucketConfig is UsageBucket's configuration at replicas: the
// worker's, and the control plane's when it writes an app record before
// any worker made the bucket (the worker then raises the replicas to its
// own).
func UsageBucketConfig(replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{Bucket: UsageBucket,
		Description: "per-agent message counters, keyed by agent id; the catalog, keyed catalog.<agent id>; the agents each live app may read about, keyed appagents.<app key>",
		Replicas:    bus.Replicas(replicas)}
}

// appAgents reads the agents the app whose key is appKey may read about:
// errs.NotFound when appKey has no record (no live app, a revoked app or
// a disabled account's). It reads the stream's leader (bus.LeaderGet), as
// a security decision must: a follower may answer before it has the
// control plane's last write, the deletion of a revoked app's record.
func (w *Worker) appAgents(ctx context.Context, appKey string) ([]string, error) {
	if !keys.IsUserPublicKey(appKey) {
		return nil, errs.Newf(errs.NotFound, "%s is no app key", appKey)
	}
	b, found, err := bus.LeaderGet(ctx, w.svc.NC, UsageBucket, AppAgentsPrefix+appKey)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, errs.Newf(errs.NotFound, "%s is no live app", appKey)
	}
	var rec appRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, fmt.Errorf("app record %s: %w", appKey, err)
	}
	return rec.Agents, nil
}

// AppAgentsMirror is the control plane's side of the app records
// (credential.AppMirror). Every write is a compare-and-set against the
// revision read before the store was, so a write made from an older read
// of the store never replaces one made from a newer read.
type AppAgentsMirror struct {
	JS jetstream.JetStream
	// Replicas of the bucket when the mirror is the first to make it.
	Replicas int
	// Timeout bounds each Sync and Resync (a minute when zero: a resync
	// reads the store for every account that has a live app).
	Timeout time.Duration

	mu sync.Mutex
	kv jetstream.KeyValue
}

// Answer says, from the control plane's store read when it is called,
// which app keys are live and the agents each may read about. An app key
// the answer leaves out has its record deleted.
// (An alias, so the control plane's interface names it without importing
// this package.)
type Answer = func(ctx context.Context) (map[string][]string, error)

// maxSyncAttempts bounds Sync's rounds when other writers keep changing the
// same records; past it, the credential sweep corrects what is left.
const maxSyncAttempts = 5

// Sync brings the records of appKeys in line with answer, read after the
// records' revisions: until no record changed under it, or
// maxSyncAttempts rounds. It reports how many records it wrote or
// deleted.
func (m *AppAgentsMirror) Sync(ctx context.Context, appKeys []string, answer Answer) (int, error) {
	ctx, cancel := m.timeout(ctx)
	defer cancel()
	kv, err := m.bucket(ctx)
	if err != nil {
		return 0, err
	}
	filters := make([]string, 0, len(appKeys))
	for _, k := range appKeys {
		if keys.IsUserPublicKey(k) {
			filters = append(filters, AppAgentsPrefix+k)
		}
	}
	if len(filters) == 0 {
		return 0, nil
	}
	written := 0
	for attempt := 1; ; attempt++ {
		n, conflicts, err := m.round(ctx, kv, filters, false, answer)
		written += n
		if err != nil || conflicts == 0 {
			return written, err
		}
		if attempt == maxSyncAttempts {
			return written, fmt.Errorf("app records: %d kept changing under %d rounds", conflicts, attempt)
		}
	}
}

// Resync brings every app record in line with answer, which names every
// live app: records of keys it leaves out are deleted, missing ones
// written. A record changed by another writer since it was read is left to
// that writer, which read the store later or will write again (Sync). It
// reports how many records it corrected.
func (m *AppAgentsMirror) Resync(ctx context.Context, answer Answer) (int, error) {
	ctx, cancel := m.timeout(ctx)
	defer cancel()
	kv, err := m.bucket(ctx)
	if err != nil {
		return 0, err
	}
	n, _, err := m.round(ctx, kv, []string{AppAgentsPrefix + "*"}, true, answer)
	return n, err
}

// round reads the records on filters (with their revisions, deleted ones
// too), then answer, then writes each difference by compare-and-set. With
// all, the answer's keys without a record are written as well. It returns
// the writes and the compare-and-sets lost to another writer.
func (m *AppAgentsMirror) round(ctx context.Context, kv jetstream.KeyValue, filters []string, all bool, answer Answer) (written, conflicts int, err error) {
	recorded, err := records(ctx, kv, filters)
	if err != nil {
		return 0, 0, err
	}
	want, err := answer(ctx)
	if err != nil {
		return 0, 0, err
	}
	if !all {
		// Only the keys whose revisions were read may be written.
		for _, f := range filters {
			if _, ok := recorded[f]; !ok {
				recorded[f] = appEntry{}
			}
		}
	} else {
		for k := range want {
			if keys.IsUserPublicKey(k) {
				if _, ok := recorded[AppAgentsPrefix+k]; !ok {
					recorded[AppAgentsPrefix+k] = appEntry{}
				}
			}
		}
	}
	for key, cur := range recorded {
		agents, live := want[key[len(AppAgentsPrefix):]]
		switch {
		case live && cur.live && !cur.bad && slices.Equal(agents, cur.agents):
			continue
		case live:
			b, err := json.Marshal(appRecord{Agents: agents})
			if err != nil {
				return written, conflicts, err
			}
			// Revision 0 expects no message at all on the key.
			_, err = kv.Update(ctx, key, b, cur.rev)
			if err == nil {
				written++
				continue
			}
			if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
				return written, conflicts, fmt.Errorf("app record %s: %w", key, err)
			}
			conflicts++
		case cur.live:
			err := kv.Delete(ctx, key, jetstream.LastRevision(cur.rev))
			if err == nil {
				written++
				continue
			}
			if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
				return written, conflicts, fmt.Errorf("app record %s: delete: %w", key, err)
			}
			conflicts++
		}
	}
	return written, conflicts, nil
}

// appEntry is what an app key holds: its last revision (a deletion's too, 0 when
// never written) and, when live, the agents; bad when the value is
// unreadable (it is rewritten, or deleted).
type appEntry struct {
	rev       uint64
	live, bad bool
	agents    []string
}

// records reads the last revision of every key on filters through a watch,
// which a consumer serves from the stream's leader.
func records(ctx context.Context, kv jetstream.KeyValue, filters []string) (map[string]appEntry, error) {
	watch, err := kv.WatchFiltered(ctx, slices.Clone(filters))
	if err != nil {
		return nil, fmt.Errorf("kv %s: watch: %w", kv.Bucket(), err)
	}
	defer func() { _ = watch.Stop() }()
	out := map[string]appEntry{}
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-watch.Updates():
			if !ok {
				return nil, fmt.Errorf("kv %s: watch closed", kv.Bucket())
			}
			if e == nil {
				return out, nil
			}
			r := appEntry{rev: e.Revision()}
			if e.Operation() == jetstream.KeyValuePut {
				var rec appRecord
				r.live, r.bad = true, json.Unmarshal(e.Value(), &rec) != nil
				r.agents = rec.Agents
			}
			out[e.Key()] = r
		}
	}
}

func (m *AppAgentsMirror) timeout(ctx context.Context) (context.Context, context.CancelFunc) {
	d := m.Timeout
	if d <= 0 {
		d = time.Minute
	}
	return context.WithTimeout(ctx, d)
}

// bucket binds UsageBucket as it is, or makes it when no worker has yet,
// so it never lowers the replicas the workers set.
func (m *AppAgentsMirror) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.kv != nil {
		return m.kv, nil
	}
	kv, err := m.JS.KeyValue(ctx, UsageBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = m.JS.CreateKeyValue(ctx, UsageBucketConfig(m.Replicas))
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = m.JS.KeyValue(ctx, UsageBucket)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("kv bucket %s: %w", UsageBucket, err)
	}
	m.kv = kv
	return kv, nil
}
