package audit_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/audit"
	"agentmesh.dev/mesh/shared/bus/bustest"
)

// openChains opens the audit stream on its own service connection, as one
// copy of a writer does.
func openChains(t testing.TB, b *bustest.Bus, name string, wrap func(jetstream.JetStream) jetstream.JetStream) *audit.Chains {
	t.Helper()
	nc, err := b.ConnectService(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if wrap != nil {
		js = wrap(js)
	}
	c, err := audit.OpenChains(t.Context(), audit.ChainsConfig{JS: js})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// entry is a valid entry of agent; id tells entries apart.
func entry(agent, id string) audit.Entry {
	return audit.Entry{Agent: agent, Role: audit.RoleResponder, Peer: "UPEER", Offering: "summarize",
		RequestID: id, Outcome: "completed", Duration: 12 * time.Millisecond, InputSHA256: audit.InputDigest([]byte(id))}
}

func TestAppendThreeConcurrentWriters(t *testing.T) {
	b := bustest.Start(t)
	const writers, perAgent = 3, 40
	agents := []string{bustest.Agent(t).Public(), bustest.Agent(t).Public(), bustest.Agent(t).Public()}
	copies := make([]*audit.Chains, writers)
	for w := range copies {
		copies[w] = openChains(t, b, fmt.Sprintf("audit-writer-%d", w), nil)
	}
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w, c := range copies {
		wg.Go(func() {
			for i := range perAgent {
				for _, a := range agents {
					if _, _, err := c.Append(t.Context(), entry(a, fmt.Sprintf("w%d-%d", w, i))); err != nil {
						errs <- err
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for _, a := range agents {
		// Rows checks as it reads that every row links to the one before.
		rows, err := copies[0].Rows(t.Context(), a)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != writers*perAgent {
			t.Fatalf("%d rows, want %d", len(rows), writers*perAgent)
		}
		var ids []string
		for _, r := range rows {
			ids = append(ids, r.RequestID)
		}
		slices.Sort(ids)
		if len(slices.Compact(ids)) != writers*perAgent {
			t.Fatalf("an entry was recorded twice")
		}
		for _, c := range copies {
			h, ok, err := c.Head(t.Context(), a)
			if err != nil || !ok {
				t.Fatal(ok, err)
			}
			last := rows[len(rows)-1]
			if hash, _ := last.Hash(); h.Seq != last.Seq || h.Hash != hash {
				t.Fatalf("a writer sees head %+v, the chain ends at %d", h, last.Seq)
			}
		}
	}
}

// An entry with a key is recorded once per chain, whoever appends it and
// however often: three writers appending the same keyed entries at once
// (as copies of a writer that each saw one event) leave one row per key,
// and every other append of it is told ErrDuplicate with the row stored.
func TestAppendKeyedEntriesOnce(t *testing.T) {
	b := bustest.Start(t)
	const writers, events = 3, 30
	agent := bustest.Agent(t).Public()
	copies := make([]*audit.Chains, writers)
	for w := range copies {
		copies[w] = openChains(t, b, fmt.Sprintf("audit-keyed-%d", w), nil)
	}
	var wg sync.WaitGroup
	var stored, dups atomic.Int32
	errs := make(chan error, writers)
	for _, c := range copies {
		wg.Go(func() {
			for i := range events {
				e := entry(agent, fmt.Sprintf("req-%d", i))
				e.Key = "responder:UPEER:" + e.RequestID
				e.At = time.UnixMilli(1_700_000_000_000 + int64(i))
				row, _, err := c.Append(t.Context(), e)
				switch {
				case errors.Is(err, audit.ErrDuplicate):
					dups.Add(1)
				case err != nil:
					errs <- err
					return
				default:
					stored.Add(1)
				}
				if row.RequestID != e.RequestID {
					errs <- fmt.Errorf("append of %s answered row %+v", e.RequestID, row)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	rows, err := copies[0].Rows(t.Context(), agent)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != events || stored.Load() != events || dups.Load() != (writers-1)*events {
		t.Fatalf("%d rows, %d stored, %d duplicates; want %d rows", len(rows), stored.Load(), dups.Load(), events)
	}
	// A different key (the other party's row of the same request) is a
	// different event.
	e := entry(agent, "req-0")
	e.Key = "requester:UPEER:req-0"
	if _, _, err := copies[0].Append(t.Context(), e); err != nil {
		t.Fatal(err)
	}
}

// lossyJS stores a publish but reports it lost (as when the acknowledgement
// is lost on the way back), the first n times, after calling between.
type lossyJS struct {
	jetstream.JetStream
	n       atomic.Int32
	between func()
}

func (l *lossyJS) PublishMsg(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	ack, err := l.JetStream.PublishMsg(ctx, msg, opts...)
	if err == nil && l.n.Add(-1) >= 0 {
		if l.between != nil {
			l.between()
		}
		return nil, nats.ErrTimeout
	}
	return ack, err
}

// An append whose acknowledgement is lost is sent again and stored once,
// even when another writer appended in between.
func TestAppendLostAcknowledgementStoresOnce(t *testing.T) {
	b := bustest.Start(t)
	agent := bustest.Agent(t).Public()
	other := openChains(t, b, "audit-other", nil)
	var lossy *lossyJS
	c := openChains(t, b, "audit-lossy", func(js jetstream.JetStream) jetstream.JetStream {
		lossy = &lossyJS{JetStream: js}
		return lossy
	})
	lossy.n.Store(3)
	lossy.between = func() {
		lossy.between = nil
		if _, _, err := other.Append(t.Context(), entry(agent, "other")); err != nil {
			t.Error(err)
		}
	}
	row, _, err := c.Append(t.Context(), entry(agent, "mine"))
	if err != nil {
		t.Fatal(err)
	}
	rows, err := c.Rows(t.Context(), agent)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0].RequestID != "mine" || rows[1].RequestID != "other" || row.Seq != 1 {
		t.Fatalf("rows %+v, appended %+v", rows, row)
	}
}

func TestAppendRefusesInvalidEntries(t *testing.T) {
	b := bustest.Start(t)
	c := openChains(t, b, "audit", nil)
	agent := bustest.Agent(t).Public()
	for name, mod := range map[string]func(*audit.Entry){
		"agent":    func(e *audit.Entry) { e.Agent = "not-a-key" },
		"role":     func(e *audit.Entry) { e.Role = "boss" },
		"peer":     func(e *audit.Entry) { e.Peer = "" },
		"request":  func(e *audit.Entry) { e.RequestID = "" },
		"outcome":  func(e *audit.Entry) { e.Outcome = "line\nbreak" },
		"input":    func(e *audit.Entry) { e.InputSHA256 = "ABC" },
		"key":      func(e *audit.Entry) { e.Key = "a\x00b" },
		"duration": func(e *audit.Entry) { e.Duration = -1 },
	} {
		e := entry(agent, "x")
		mod(&e)
		if _, _, err := c.Append(t.Context(), e); !errors.Is(err, audit.ErrInvalidEntry) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}

// storedAt is the stream's time of the last row of agent.
func storedAt(t testing.TB, b *bustest.Bus, agent string) time.Time {
	t.Helper()
	js, err := jetstream.New(bustest.Client(t, b))
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(t.Context(), audit.Stream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.GetLastMsgForSubject(t.Context(), audit.RowPrefix+agent)
	if err != nil {
		t.Fatal(err)
	}
	return m.Time
}

func TestHeadsAt(t *testing.T) {
	b := bustest.Start(t)
	c := openChains(t, b, "audit", nil)
	ag := []string{bustest.Agent(t).Public(), bustest.Agent(t).Public(), bustest.Agent(t).Public()}
	slices.Sort(ag)
	x, y, late := ag[0], ag[1], ag[2]
	appendN := func(agent string, n int) {
		for i := range n {
			if _, _, err := c.Append(t.Context(), entry(agent, fmt.Sprint(i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	appendN(x, 3)
	appendN(y, 2)
	cut := storedAt(t, b, y).Add(time.Nanosecond)
	appendN(x, 2)
	appendN(late, 1)

	at, err := c.HeadsAt(t.Context(), cut)
	if err != nil {
		t.Fatal(err)
	}
	if len(at) != 2 || at[0].Agent != x || at[0].Seq != 3 || at[1].Agent != y || at[1].Seq != 2 {
		t.Fatalf("heads at the cut: %+v", at)
	}
	rows, _ := c.Rows(t.Context(), x)
	if h, _ := rows[2].Hash(); at[0].Hash != h {
		t.Fatal("the head's hash is not row 3's")
	}
	now, err := c.HeadsAt(t.Context(), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if len(now) != 3 || now[0].Seq != 5 || now[2].Agent != late {
		t.Fatalf("heads now: %+v", now)
	}
	before, err := c.HeadsAt(t.Context(), time.Now().Add(-time.Hour))
	if err != nil || len(before) != 0 {
		t.Fatalf("heads an hour ago: %+v, %v", before, err)
	}
}

func TestRecordProofsOncePerHead(t *testing.T) {
	b := bustest.Start(t)
	copies := []*audit.Chains{openChains(t, b, "audit-1", nil), openChains(t, b, "audit-2", nil), openChains(t, b, "audit-3", nil)}
	c := copies[0]
	ag := []string{bustest.Agent(t).Public(), bustest.Agent(t).Public()}
	slices.Sort(ag)
	for _, a := range ag {
		if _, _, err := c.Append(t.Context(), entry(a, "1")); err != nil {
			t.Fatal(err)
		}
	}
	record := func(date string) {
		hs, err := c.HeadsAt(t.Context(), time.Now().Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		tree, err := audit.NewTree(hs)
		if err != nil {
			t.Fatal(err)
		}
		proofs, err := tree.Proofs(date)
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for _, cp := range copies {
			wg.Go(func() {
				if err := cp.RecordProofs(t.Context(), proofs); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
	}
	record("2026-01-01")
	record("2026-01-01") // again: nothing new
	record("2026-01-02") // heads unchanged: nothing new
	if _, _, err := c.Append(t.Context(), entry(ag[1], "2")); err != nil {
		t.Fatal(err)
	}
	record("2026-01-03")
	want := map[string][]string{ag[0]: {"2026-01-01"}, ag[1]: {"2026-01-01", "2026-01-03"}}
	for a, dates := range want {
		ps, err := c.Proofs(t.Context(), a)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, p := range ps {
			got = append(got, p.Date)
		}
		if !slices.Equal(got, dates) {
			t.Fatalf("%s: proofs of %v, want %v", a, got, dates)
		}
	}
}

func TestPurge(t *testing.T) {
	b := bustest.Start(t)
	c := openChains(t, b, "audit", nil)
	a, keep := bustest.Agent(t).Public(), bustest.Agent(t).Public()
	for _, ag := range []string{a, keep} {
		if _, _, err := c.Append(t.Context(), entry(ag, "1")); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Purge(t.Context(), a); err != nil {
		t.Fatal(err)
	}
	if rows, err := c.Rows(t.Context(), a); err != nil || len(rows) != 0 {
		t.Fatalf("purged chain: %d rows, %v", len(rows), err)
	}
	if rows, err := c.Rows(t.Context(), keep); err != nil || len(rows) != 1 {
		t.Fatalf("other chain: %d rows, %v", len(rows), err)
	}
	// A purged chain begins again from the genesis.
	row, _, err := c.Append(t.Context(), entry(a, "2"))
	if err != nil || row.Seq != 1 || row.Prev != audit.GenesisPrev {
		t.Fatalf("%+v, %v", row, err)
	}
}
