package activity_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/activity"
	"agentmesh.dev/mesh/shared/bus/bustest"
)

// fixed is an answer of the control plane's store: app key → its
// account's agents.
func fixed(m map[string][]string) activity.Answer {
	return func(context.Context) (map[string][]string, error) { return m, nil }
}

// mirrorHarness is the control plane's side of the app records on a bus
// with no worker yet.
type mirrorHarness struct {
	t      *testing.T
	m      *bustest.Bus
	js     jetstream.JetStream
	mirror *activity.AppAgentsMirror
}

func startMirror(t *testing.T) *mirrorHarness {
	t.Helper()
	m := bustest.Start(t)
	js, err := jetstream.New(bustest.Client(t, m))
	if err != nil {
		t.Fatal(err)
	}
	return &mirrorHarness{t: t, m: m, js: js, mirror: &activity.AppAgentsMirror{JS: js}}
}

// record reads the app's record: its agents, or nil and false.
func (h *mirrorHarness) record(app string) ([]string, bool) {
	h.t.Helper()
	kv, err := h.js.KeyValue(h.t.Context(), activity.UsageBucket)
	if err != nil {
		h.t.Fatal(err)
	}
	e, err := kv.Get(h.t.Context(), activity.AppAgentsPrefix+app)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, false
	}
	if err != nil {
		h.t.Fatal(err)
	}
	var v struct {
		Agents []string `json:"agents"`
	}
	if err := json.Unmarshal(e.Value(), &v); err != nil {
		h.t.Fatalf("record of %s: %v", app, err)
	}
	return v.Agents, true
}

func (h *mirrorHarness) want(app string, agents ...string) {
	h.t.Helper()
	got, ok := h.record(app)
	switch {
	case agents == nil && ok:
		h.t.Errorf("app %s… still has a record: %v", app[:8], got)
	case agents != nil && (!ok || !slices.Equal(got, agents)):
		h.t.Errorf("app %s… record %v (present %v), want %v", app[:8], got, ok, agents)
	}
}

// Sync writes the records of the live apps it is asked about, deletes the
// others', writes nothing when the records already say the answer, and
// rewrites an unreadable record; the bucket it made on a bus without a
// worker is the one a worker then binds.
func TestAppMirrorSync(t *testing.T) {
	h := startMirror(t)
	ctx := t.Context()
	a, b, agent, later := bustest.Agent(t).Public(), bustest.Agent(t).Public(), bustest.Agent(t).Public(), bustest.Agent(t).Public()
	answer := map[string][]string{a: {agent, a, b}, b: {agent, a, b}}
	if n, err := h.mirror.Sync(ctx, []string{a, b}, fixed(answer)); err != nil || n != 2 {
		t.Fatalf("first sync: %d %v", n, err)
	}
	h.want(a, agent, a, b)
	h.want(b, agent, a, b)
	if n, err := h.mirror.Sync(ctx, []string{a, b}, fixed(answer)); err != nil || n != 0 {
		t.Errorf("sync with nothing to change: %d %v", n, err)
	}
	// An agent bound, b revoked: only the keys asked about are written.
	answer = map[string][]string{a: {agent, later, a, b}}
	if n, err := h.mirror.Sync(ctx, []string{a, b}, fixed(answer)); err != nil || n != 2 {
		t.Fatalf("sync after a change: %d %v", n, err)
	}
	h.want(a, agent, later, a, b)
	h.want(b)
	// A revoked app's record stays deleted; a record deleted before is
	// written again by a compare-and-set on its deletion.
	if n, err := h.mirror.Sync(ctx, []string{b}, fixed(nil)); err != nil || n != 0 {
		t.Errorf("deleting a deleted record: %d %v", n, err)
	}
	if n, err := h.mirror.Sync(ctx, []string{b}, fixed(map[string][]string{b: {b}})); err != nil || n != 1 {
		t.Errorf("writing over a deletion: %d %v", n, err)
	}
	h.want(b, b)
	kv, err := h.js.KeyValue(ctx, activity.UsageBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, activity.AppAgentsPrefix+b, []byte("not json")); err != nil {
		t.Fatal(err)
	}
	if n, err := h.mirror.Sync(ctx, []string{b}, fixed(map[string][]string{b: {b}})); err != nil || n != 1 {
		t.Errorf("sync over an unreadable record: %d %v", n, err)
	}
	h.want(b, b)
	// Keys that are no public keys are never written.
	if n, err := h.mirror.Sync(ctx, []string{"app.*", ""}, fixed(map[string][]string{"app.*": {a}})); err != nil || n != 0 {
		t.Errorf("sync of bad keys: %d %v", n, err)
	}
}

// Resync deletes the records of apps the store no longer calls live,
// writes the missing ones and corrects the wrong ones, each once.
func TestAppMirrorResync(t *testing.T) {
	h := startMirror(t)
	ctx := t.Context()
	live, wrong, missing, revoked, agent := bustest.Agent(t).Public(), bustest.Agent(t).Public(), bustest.Agent(t).Public(),
		bustest.Agent(t).Public(), bustest.Agent(t).Public()
	if _, err := h.mirror.Sync(ctx, []string{live, wrong, revoked}, fixed(map[string][]string{live: {agent}, wrong: {live}, revoked: {revoked}})); err != nil {
		t.Fatal(err)
	}
	store := map[string][]string{live: {agent}, wrong: {agent, wrong}, missing: {missing}}
	if n, err := h.mirror.Resync(ctx, fixed(store)); err != nil || n != 3 {
		t.Fatalf("resync: %d %v, want 3 corrections", n, err)
	}
	h.want(live, agent)
	h.want(wrong, agent, wrong)
	h.want(missing, missing)
	h.want(revoked)
	if n, err := h.mirror.Resync(ctx, fixed(store)); err != nil || n != 0 {
		t.Errorf("resync with nothing to correct: %d %v", n, err)
	}
	// A worker binds the bucket the mirror made, records and all.
	w, err := activity.Start(ctx, bustest.Env(t, h.m, "activity", nil), activity.Config{})
	if err != nil {
		t.Fatalf("a worker on the mirror's bucket: %v", err)
	}
	t.Cleanup(func() { _ = w.Stop() })
	h.want(live, agent)
}

// A write made from an older read of the store never replaces one made
// from a newer read: a resync whose answer was read before a Sync wrote
// leaves that Sync's record, and a Sync whose records changed while it
// read the store reads it again.
func TestAppMirrorNeverWritesAnOlderAnswer(t *testing.T) {
	h := startMirror(t)
	ctx := t.Context()
	app, old, bound := bustest.Agent(t).Public(), bustest.Agent(t).Public(), bustest.Agent(t).Public()
	other := &activity.AppAgentsMirror{JS: h.js}
	if _, err := h.mirror.Sync(ctx, []string{app}, fixed(map[string][]string{app: {old}})); err != nil {
		t.Fatal(err)
	}
	// The resync reads the store (old only), then an agent is bound and
	// its Sync writes before the resync does.
	n, err := h.mirror.Resync(ctx, func(ctx context.Context) (map[string][]string, error) {
		if _, err := other.Sync(ctx, []string{app}, fixed(map[string][]string{app: {old, bound}})); err != nil {
			return nil, err
		}
		return map[string][]string{app: {old}}, nil
	})
	if err != nil || n != 0 {
		t.Errorf("resync under a newer write: %d %v", n, err)
	}
	h.want(app, old, bound)

	// A Sync whose first read of the store is overtaken reads it again.
	reads := 0
	n, err = h.mirror.Sync(ctx, []string{app}, func(ctx context.Context) (map[string][]string, error) {
		reads++
		if reads == 1 {
			if _, err := other.Sync(ctx, []string{app}, fixed(map[string][]string{app: {bound}})); err != nil {
				return nil, err
			}
			return map[string][]string{app: {old}}, nil // what it read before the other's commit
		}
		return map[string][]string{app: {bound, old}}, nil
	})
	if err != nil || n != 1 || reads != 2 {
		t.Errorf("sync overtaken: %d writes, %d reads, %v", n, reads, err)
	}
	h.want(app, bound, old)
}
