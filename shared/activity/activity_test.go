package activity_test

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/activity"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

const secret = "s3cr3t-payload-text-never-stored"

type harness struct {
	t       *testing.T
	m       *bustest.Bus
	nc      *nats.Conn
	js      jetstream.JetStream
	reg     jetstream.KeyValue
	caller  *keys.Agent
	cfg     activity.Config
	workers []*activity.Worker
}

func start(t *testing.T, official ...string) *harness {
	t.Helper()
	m := bustest.Start(t)
	// The tests read as the account views do, signed by the services key;
	// access.go's tests read as apps and others.
	h := &harness{t: t, m: m, nc: bustest.Client(t, m), caller: m.ServicesKey(), cfg: activity.Config{Official: official}}
	h.js, _ = jetstream.New(h.nc)
	var err error
	if h.reg, err = bus.Bucket(t.Context(), h.js, jetstream.KeyValueConfig{Bucket: activity.RegistryBucket}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		w, err := activity.Start(t.Context(), bustest.Env(t, m, fmt.Sprintf("activity-%d", i), nil), h.cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Stop() })
		h.workers = append(h.workers, w)
	}
	return h
}

func (h *harness) call(subject string, q map[string]any, out any) error {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(h.t.Context(), 5*time.Second)
	defer cancel()
	rep, err := bus.Call(ctx, h.nc, h.caller, subject, protocol.TypeRequest, "", q)
	if err != nil {
		return err
	}
	return rep.DecodePayload(out)
}

type listing struct {
	Items []activity.Item `json:"items"`
	Total int             `json:"total"`
}

func (h *harness) activity(q map[string]any) listing {
	h.t.Helper()
	var l listing
	if err := h.call(protocol.SubjActivityList, q, &l); err != nil {
		h.t.Fatal(err)
	}
	return l
}

func (h *harness) usage(q map[string]any) []activity.Usage {
	h.t.Helper()
	var u struct {
		Agents []activity.Usage `json:"agents"`
	}
	if err := h.call(protocol.SubjUsageList, q, &u); err != nil {
		h.t.Fatal(err)
	}
	return u.Agents
}

func (h *harness) stats() activity.Stats {
	var s activity.Stats
	for _, w := range h.workers {
		x := w.Stats()
		s.Recorded += x.Recorded
		s.Duplicates += x.Duplicates
		s.Dropped += x.Dropped
		s.Accepts += x.Accepts
	}
	return s
}

// publish sends one envelope on subject and waits until the copies have
// handled it: n outcomes (a record, a duplicate, a drop or an accept; an
// answer yields two, its request's and its own), so the timeline order is
// publish order.
func (h *harness) publish(subject string, data []byte, n uint64) {
	h.t.Helper()
	before := h.stats()
	if err := h.nc.Publish(subject, data); err != nil {
		h.t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		s := h.stats()
		if s.Recorded+s.Duplicates+s.Dropped+s.Accepts >= before.Recorded+before.Duplicates+before.Dropped+before.Accepts+n {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("the message on %s was not handled", subject)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func sign(t *testing.T, k *keys.Agent, e *protocol.Envelope) []byte {
	t.Helper()
	if err := e.Sign(k); err != nil {
		t.Fatal(err)
	}
	b, err := e.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func request(t *testing.T, from *keys.Agent, to string) (*protocol.Envelope, []byte) {
	t.Helper()
	e, err := protocol.New(protocol.TypeRequest, from.Public(), map[string]any{"offering": "chat", "input": map[string]any{"text": secret}})
	if err != nil {
		t.Fatal(err)
	}
	e.To = to
	return e, sign(t, from, e)
}

func response(t *testing.T, from *keys.Agent, req *protocol.Envelope, payload map[string]any) (*protocol.Envelope, []byte) {
	t.Helper()
	e, err := protocol.NewReply(req, from.Public(), payload)
	if err != nil {
		t.Fatal(err)
	}
	return e, sign(t, from, e)
}

// Responses and span events through the taps of three copies appear in
// the timeline exactly once, each respond with the request it answers,
// newest first, with the filters and limit applied; the counters are
// exact; no content is stored anywhere.
func TestTimelineAndUsage(t *testing.T) {
	h := start(t)
	alice, bob := bustest.Agent(t), bustest.Agent(t)
	a, b := alice.Public(), bob.Public()

	const N = 5
	var want []string // ids in publish order
	for i := range N {
		// alice's request itself is never published: the timeline learns
		// it from bob's answers.
		req, _ := request(t, alice, b)
		want = append(want, "request:"+req.ID)
		_, acc := response(t, bob, req, map[string]any{"status": protocol.StatusAccepted})
		h.publish(protocol.OutboxSubject(b), acc, 2)
		payload := map[string]any{"status": "completed", "output": map[string]any{"text": "answer " + secret}}
		if i == N-1 {
			payload = errs.New(errs.OfferingNotFound, "no such offering: "+secret).BusPayload()
		}
		_, data := response(t, bob, req, payload)
		h.publish(protocol.OutboxSubject(b), data, 2)
		if i == 0 {
			// The same answer again (a retry, same id): recorded and
			// counted once.
			h.publish(protocol.OutboxSubject(b), data, 2)
		}
	}
	// A span event from alice on her own trace subject.
	span, err := protocol.New(protocol.TypeEmit, a, map[string]any{"name": secret})
	if err != nil {
		t.Fatal(err)
	}
	h.publish(protocol.TraceSubject(a), sign(t, alice, span), 1)
	// Dropped: bob's span on alice's trace subject; a respond from alice on
	// bob's outbox; a request on an outbox; a stale respond.
	bad, _ := protocol.New(protocol.TypeEmit, b, map[string]any{})
	h.publish(protocol.TraceSubject(a), sign(t, bob, bad), 1)
	other, _ := request(t, bob, a)
	_, forged := response(t, alice, other, map[string]any{"status": "completed"})
	h.publish(protocol.OutboxSubject(b), forged, 1)
	_, reqOnOutbox := request(t, bob, a)
	h.publish(protocol.OutboxSubject(b), reqOnOutbox, 1)
	old, _ := protocol.NewReply(other, b, map[string]any{"status": "completed"})
	old.TS = protocol.FormatTime(time.Now().Add(-time.Hour))
	h.publish(protocol.OutboxSubject(b), sign(t, bob, old), 1)

	s := h.stats()
	// 5 requests, 5 answers, 1 span; each accept records its request and
	// no record of its own; each answer's request, and the retried answer
	// with its request, are duplicates.
	const total = 5 + 5 + 1
	if s.Recorded != total || s.Duplicates != 5+2 || s.Dropped != 4 || s.Accepts != N {
		t.Fatalf("stats %+v", s)
	}

	all := h.activity(map[string]any{})
	if all.Total != total || len(all.Items) != total {
		t.Fatalf("activity total %d items %d", all.Total, len(all.Items))
	}
	seen := map[string]int{}
	for _, it := range all.Items {
		seen[it.Kind+":"+it.ID]++
		if it.ObservedAt == "" || it.TS == "" {
			t.Fatalf("item without times: %+v", it)
		}
	}
	for k, n := range seen {
		if n != 1 {
			t.Fatalf("%s recorded %d times", k, n)
		}
	}
	// Newest first: the span, then bob's failed answer and the request it
	// answers.
	if it := all.Items[0]; it.Kind != activity.KindTrace || it.From != a || it.SpanID != span.Trace.SpanID {
		t.Fatalf("newest item %+v", it)
	}
	if it := all.Items[1]; it.Kind != activity.KindResponse || it.From != b || it.To != a || it.Status != "failed" || it.Error != "OFFERING_NOT_FOUND" || it.InReplyTo == "" {
		t.Fatalf("second item %+v", it)
	}
	if it := all.Items[2]; it.Kind != activity.KindRequest || it.From != a || it.To != b || it.Type != "request" || "request:"+it.ID != want[N-1] || it.TraceID != all.Items[1].TraceID {
		t.Fatalf("third item %+v", it)
	}
	// The oldest is the first request.
	if it := all.Items[total-1]; it.Kind+":"+it.ID != want[0] {
		t.Fatalf("oldest item %+v, want %s", it, want[0])
	}

	// Filters and limit.
	fromA := h.activity(map[string]any{"from": a})
	if fromA.Total != 6 || len(fromA.Items) != 6 {
		t.Fatalf("from alice: %d/%d", fromA.Total, len(fromA.Items))
	}
	for _, it := range fromA.Items {
		if it.From != a {
			t.Fatalf("from filter let through %+v", it)
		}
	}
	toA := h.activity(map[string]any{"to": a, "limit": 3})
	if toA.Total != 5 || len(toA.Items) != 3 || toA.Items[0].Error != "OFFERING_NOT_FOUND" {
		t.Fatalf("to alice limit 3: total %d items %d", toA.Total, len(toA.Items))
	}
	both := h.activity(map[string]any{"from": b, "to": a})
	if both.Total != 5 {
		t.Fatalf("from bob to alice: %d", both.Total)
	}
	if l := h.activity(map[string]any{"limit": 2}); l.Total != total || len(l.Items) != 2 || l.Items[0].ID != all.Items[0].ID || l.Items[1].ID != all.Items[1].ID {
		t.Fatalf("limit 2: %+v", l)
	}
	if l := h.activity(map[string]any{"limit": 5000}); len(l.Items) != total {
		t.Fatalf("limit over the max: %d", len(l.Items))
	}
	for _, q := range []map[string]any{{"limit": 0}, {"limit": 1.5}, {"limit": "10"}, {"from": "bob"}} {
		if err := h.call(protocol.SubjActivityList, q, &listing{}); errs.CodeOf(err) != errs.InvalidQuery {
			t.Fatalf("query %v: %v", q, err)
		}
	}

	// Counters: bob received 5 requests and sent 5 answers, one failed
	// (accepts are not messages); alice only sent. Each copy writes what it
	// counted every FlushEvery, so the totals are exact once they settle.
	var u []activity.Usage
	deadline := time.Now().Add(5 * time.Second)
	for {
		u = h.usage(map[string]any{})
		if len(u) == 1 && u[0].MessagesIn == 5 && u[0].MessagesOut == 5 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(u) != 1 {
		t.Fatalf("usage rows %+v", u)
	}
	ub := u[0]
	if ub.Agent != b || ub.MessagesIn != 5 || ub.MessagesOut != 5 || ub.Errors != 1 || ub.FirstSeen == "" || ub.LastActive < ub.FirstSeen {
		t.Fatalf("bob's counters %+v", ub)
	}
	if one := h.usage(map[string]any{"agent": b}); len(one) != 1 || one[0] != ub {
		t.Fatalf("usage of bob %+v", one)
	}
	if none := h.usage(map[string]any{"agent": a}); len(none) != 0 {
		t.Fatalf("usage of alice %+v", none)
	}

	// No content anywhere: not in the stream, not in the counters.
	ctx := t.Context()
	cons, err := h.js.OrderedConsumer(ctx, activity.Stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.FetchNoWait(1000)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for m := range batch.Messages() {
		n++
		if strings.Contains(string(m.Data()), secret) || strings.Contains(string(m.Data()), "answer") {
			t.Fatalf("content in the timeline: %s", m.Data())
		}
	}
	if n != total {
		t.Fatalf("stream holds %d records", n)
	}
	kv, err := h.js.KeyValue(ctx, activity.UsageBucket)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(e.Value()), secret) {
		t.Fatal("content in the counters")
	}
}

// Without a registry bucket the catalog is empty, not an error.
func TestCatalogWithoutRegistry(t *testing.T) {
	m := bustest.Start(t)
	w, err := activity.Start(t.Context(), bustest.Env(t, m, "activity", nil), activity.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	rep, err := bus.Call(ctx, bustest.Client(t, m), bustest.Agent(t), protocol.SubjCatalogList, protocol.TypeRequest, "", map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	if string(rep.Payload) != `{"entries":[],"next":null,"total":0}` {
		t.Fatalf("catalog without registry: %s", rep.Payload)
	}
	rep, err = bus.Call(ctx, bustest.Client(t, m), m.ServicesKey(), protocol.SubjActivityList, protocol.TypeRequest, "", map[string]any{})
	if err != nil || string(rep.Payload) != `{"items":[],"total":0}` {
		t.Fatalf("empty activity: %s %v", rep.Payload, err)
	}
}

// An answer whose request is not yet in the timeline (no accept went out
// first: adapter/node AcceptCopyDelay) is one record holding both; the
// listing shows them as two items under every filter that matches either,
// the counters are exact, and a later answer to the same request (a task's
// update) is recorded on its own. A call an agent makes to itself is
// listed once.
func TestAnswerCarriesItsRequest(t *testing.T) {
	h := start(t)
	alice, bob, carol := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)
	a, b, c := alice.Public(), bob.Public(), carol.Public()

	req, _ := request(t, alice, b)
	_, answer := response(t, bob, req, map[string]any{"status": "working", "task_id": "t-1"})
	h.publish(protocol.OutboxSubject(b), answer, 2)
	if s := h.stats(); s.Recorded != 2 || s.Duplicates != 0 {
		t.Fatalf("stats after the first answer %+v", s)
	}
	if l := h.activity(map[string]any{}); l.Total != 1 || len(l.Items) != 2 {
		t.Fatalf("one record, two items: total %d items %d", l.Total, len(l.Items))
	}
	// The task's final update answers the same request: its own record.
	_, final := response(t, bob, req, map[string]any{"status": "completed", "task_id": "t-1"})
	h.publish(protocol.OutboxSubject(b), final, 2) // the request a duplicate, then the answer alone
	if s := h.stats(); s.Recorded != 3 || s.Duplicates != 1 {
		t.Fatalf("stats after the second answer %+v", s)
	}

	selfReq, _ := request(t, carol, c)
	_, selfAnswer := response(t, carol, selfReq, map[string]any{"status": "completed"})
	h.publish(protocol.OutboxSubject(c), selfAnswer, 2)

	for _, tc := range []struct {
		q     map[string]any
		kinds string // newest first
	}{
		{map[string]any{"from": a}, "request"},
		{map[string]any{"from": b}, "response,response"},
		{map[string]any{"to": a}, "response,response"},
		{map[string]any{"to": b}, "request"},
		{map[string]any{"from": a, "to": b}, "request"},
		{map[string]any{"from": b, "to": a}, "response,response"},
		{map[string]any{"from": c}, "response,request"},
		{map[string]any{"to": c}, "response,request"},
		{map[string]any{"from": c, "to": c}, "response,request"},
		{map[string]any{"limit": 3}, "response,request,response"},
	} {
		l := h.activity(tc.q)
		var kinds []string
		for _, it := range l.Items {
			kinds = append(kinds, it.Kind)
			if f, ok := tc.q["from"]; ok && it.From != f {
				t.Fatalf("%v: item from %s", tc.q, it.From)
			}
			if to, ok := tc.q["to"]; ok && it.To != to {
				t.Fatalf("%v: item to %s", tc.q, it.To)
			}
		}
		if got := strings.Join(kinds, ","); got != tc.kinds {
			t.Fatalf("%v: items %s, want %s", tc.q, got, tc.kinds)
		}
		if _, filtered := tc.q["limit"]; !filtered && l.Total != len(l.Items) {
			t.Fatalf("%v: total %d for %d items", tc.q, l.Total, len(l.Items))
		}
	}

	// bob: one request in, two answers out; carol: one in, one out.
	want := map[string][2]int64{b: {1, 2}, c: {1, 1}}
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := map[string][2]int64{}
		for _, u := range h.usage(map[string]any{}) {
			got[u.Agent] = [2]int64{u.MessagesIn, u.MessagesOut}
		}
		if maps.Equal(got, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("counters %v, want %v", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The same answer published twice (a node republishing after a forced
// reconnect, or an agent replaying its own respond) is recorded and counted
// once, whether it rode in its request's record or was recorded alone.
func TestReplayedAnswerCountsOnce(t *testing.T) {
	h := start(t)
	alice, bob := bustest.Agent(t), bustest.Agent(t)
	b := bob.Public()

	req, _ := request(t, alice, b)
	_, answer := response(t, bob, req, map[string]any{"status": "completed"})
	h.publish(protocol.OutboxSubject(b), answer, 2) // the request's record, carrying the answer
	h.publish(protocol.OutboxSubject(b), answer, 2) // again: the request a duplicate, and so is its answer
	// A slow call: its accept records the request, the answer is alone.
	slow, _ := request(t, alice, b)
	_, acc := response(t, bob, slow, map[string]any{"status": protocol.StatusAccepted})
	h.publish(protocol.OutboxSubject(b), acc, 2)
	_, late := response(t, bob, slow, map[string]any{"status": "completed"})
	h.publish(protocol.OutboxSubject(b), late, 2)
	h.publish(protocol.OutboxSubject(b), late, 2)

	if s := h.stats(); s.Recorded != 4 || s.Duplicates != 5 {
		t.Fatalf("stats %+v, want 4 items recorded (two requests, two answers) and 5 duplicates", s)
	}
	if l := h.activity(map[string]any{"from": b}); l.Total != 2 {
		t.Fatalf("bob's answers listed %d times, want 2", l.Total)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		u := h.usage(map[string]any{"agent": b})
		if len(u) == 1 && u[0].MessagesIn == 2 && u[0].MessagesOut == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("bob's counters %+v, want 2 in and 2 out", u)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A timeline made before it persisted asynchronously (the broker refuses
// to change a stream's persist mode) keeps its mode, and the worker starts.
func TestStartsOnAnOlderTimeline(t *testing.T) {
	m := bustest.Start(t)
	js, _ := jetstream.New(bustest.Client(t, m))
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: activity.Stream,
		Subjects: []string{activity.SubjectPrefix + "*.*"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	w, err := activity.Start(t.Context(), bustest.Env(t, m, "activity-0", nil), activity.Config{})
	if err != nil {
		t.Fatalf("start on a timeline in the default persist mode: %v", err)
	}
	_ = w.Stop()
	st, err := js.Stream(t.Context(), activity.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if c := st.CachedInfo().Config; c.PersistMode != jetstream.DefaultPersistMode || c.MaxMsgs != activity.MaxMsgs {
		t.Fatalf("timeline config %+v", c)
	}
}

// A copy that falls behind holds at most Config.TapPendingMsgs tapped
// messages; what arrives beyond them is dropped unread and counted in
// Stats.Overflow, and what it held is recorded once it catches up. The
// copy is held back through its clock, which the tap reads first.
func TestTapBacklogIsBounded(t *testing.T) {
	m := bustest.Start(t)
	nc := bustest.Client(t, m)
	var held atomic.Bool
	release := make(chan struct{})
	env := bustest.Env(t, m, "activity-behind", nil)
	env.Now = func() time.Time {
		if held.Load() {
			<-release
		}
		return time.Now()
	}
	const pending = 3
	w, err := activity.Start(t.Context(), env, activity.Config{TapPendingMsgs: pending, TapPendingBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop() })

	alice, bob := bustest.Agent(t), bustest.Agent(t)
	answer := func() []byte {
		req, _ := request(t, alice, bob.Public())
		_, data := response(t, bob, req, map[string]any{"status": "completed", "output": map[string]any{"text": "ok"}})
		return data
	}
	held.Store(true)
	const sent = 10
	for range sent {
		if err := nc.Publish(protocol.OutboxSubject(bob.Public()), answer()); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// The first is in the handler, waiting on the clock, and still counts
	// as pending until handled; pending-1 wait behind it; the rest overflow.
	want := uint64(sent - pending)
	deadline := time.Now().Add(5 * time.Second)
	for w.Stats().Overflow < want && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	held.Store(false)
	close(release)
	for w.Stats().Recorded < 2*(sent-want) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if s := w.Stats(); s.Overflow != want || s.Recorded != 2*(sent-want) {
		t.Fatalf("stats %+v: want %d overflowed and %d items recorded", s, want, 2*(sent-want))
	}
	_ = w.Stop()
	if s := w.Stats(); s.Overflow != want {
		t.Fatalf("after Stop the overflow reads %d, want %d", s.Overflow, want)
	}
}
