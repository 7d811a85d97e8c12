package activity_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/audit"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// auditHeader is what adapter/node states on the outbox copy of the
// answer that ends req.
func auditHeader(req *protocol.Envelope, offering, duration string) nats.Header {
	h := nats.Header{}
	h.Set(protocol.HdrAuditInput, protocol.InputSHA256(req))
	h.Set(protocol.HdrAuditOffering, offering)
	h.Set(protocol.HdrAuditDuration, duration)
	return h
}

// auditCounts adds the copies' audit counters.
func (h *harness) auditCounts() (rows, dups, failed uint64) {
	for _, w := range h.workers {
		s := w.Stats()
		rows, dups, failed = rows+s.AuditRows, dups+s.AuditDuplicates, failed+s.AuditFailed
	}
	return
}

// publishAnswer sends an outbox copy with its headers and waits until the
// copies have appended (or found) n rows more.
func (h *harness) publishAnswer(agent string, data []byte, hdr nats.Header, n uint64) {
	h.t.Helper()
	r0, d0, f0 := h.auditCounts()
	if err := h.nc.PublishMsg(&nats.Msg{Subject: protocol.OutboxSubject(agent), Data: data, Header: hdr}); err != nil {
		h.t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		r, d, f := h.auditCounts()
		if f > f0 {
			h.t.Fatalf("an audit row failed")
		}
		if r+d >= r0+d0+n {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("%d audit rows of %d were written", r+d-r0-d0, n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (h *harness) chains() *audit.Chains {
	h.t.Helper()
	c, err := audit.BindChains(h.t.Context(), h.js)
	if err != nil {
		h.t.Fatal(err)
	}
	return c
}

func (h *harness) rows(agent string) []audit.Row {
	h.t.Helper()
	rows, err := h.chains().Rows(h.t.Context(), agent)
	if err != nil {
		h.t.Fatal(err)
	}
	return rows
}

// An answer whose copy states that it ends its request becomes one row, in
// the responder's chain, naming the requester as peer, with what the copy
// states and what the signed answer says; the same answer again (a
// republish, a replay) adds nothing; answers that do not end a request
// (no audit headers) add nothing; a statement that cannot be a row's is
// recorded empty rather than as told.
func TestAuditRowsOfAnswers(t *testing.T) {
	h := start(t)
	alice, bob := bustest.Agent(t), bustest.Agent(t)
	a, b := alice.Public(), bob.Public()

	req, _ := request(t, alice, b)
	ans, data := response(t, bob, req, map[string]any{"status": "completed", "output": map[string]any{"text": secret}})
	// The accept and a progress answer carry no headers: no rows.
	_, acc := response(t, bob, req, map[string]any{"status": protocol.StatusAccepted})
	h.publish(protocol.OutboxSubject(b), acc, 2)
	h.publishAnswer(b, data, auditHeader(req, "chat", "1520"), 1)
	h.publishAnswer(b, data, auditHeader(req, "chat", "1520"), 1) // republished

	at, _ := protocol.ParseTime(ans.TS)
	want := audit.Row{V: 1, Agent: b, Seq: 1, At: protocol.FormatTime(at), Role: audit.RoleResponder, Peer: a, Offering: "chat",
		RequestID: req.ID, Outcome: "completed", DurationMS: 1520, InputSHA256: protocol.InputSHA256(req), Prev: audit.GenesisPrev}
	if got := h.rows(b); len(got) != 1 || got[0] != want {
		t.Fatalf("responder's chain %+v\nwant %+v", got, want)
	}
	if got := h.rows(a); len(got) != 0 {
		t.Fatalf("requester's chain %+v, want none", got)
	}
	if _, dups, _ := h.auditCounts(); dups != 1 {
		t.Fatalf("%d duplicates, want the republished answer's row", dups)
	}

	// A refusal: the error code is the outcome. A task's terminal update:
	// its task id. Statements that cannot be a row's: recorded empty.
	req2, _ := request(t, alice, b)
	_, refusal := response(t, bob, req2, errs.New(errs.OfferingNotFound, "no offering "+secret).BusPayload())
	h.publishAnswer(b, refusal, auditHeader(req2, strings.Repeat("o", 300), "-4"), 1)
	req3, _ := request(t, alice, b)
	upd, _ := protocol.NewReply(req3, b, map[string]any{"status": "completed"})
	upd.TaskID = "task-7"
	bad := auditHeader(req3, "work", "12")
	bad.Set(protocol.HdrAuditInput, "not-a-digest")
	h.publishAnswer(b, sign(t, bob, upd), bad, 1)
	rows := h.rows(b)
	if len(rows) != 3 {
		t.Fatalf("%d rows", len(rows))
	}
	if r := rows[1]; r.Outcome != string(errs.OfferingNotFound) || r.Offering != "" || r.DurationMS != 0 || r.InputSHA256 != protocol.InputSHA256(req2) {
		t.Fatalf("refusal row %+v", r)
	}
	if r := rows[2]; r.TaskID != "task-7" || r.Outcome != "completed" || r.InputSHA256 != "" || r.Offering != "work" || r.DurationMS != 12 {
		t.Fatalf("task row %+v", r)
	}
	// A protocol 0.3 late answer is a request in reply to the held one.
	req4, _ := request(t, alice, b)
	late, err := protocol.New(protocol.TypeRequest, b, map[string]any{"offering": "chat", "input": map[string]any{}, "status": "completed"})
	if err != nil {
		t.Fatal(err)
	}
	late.To, late.InReplyTo = a, req4.ID
	h.publishAnswer(b, sign(t, bob, late), auditHeader(req4, "chat", "5"), 1)
	if rows := h.rows(b); len(rows) != 4 || rows[3].RequestID != req4.ID || rows[3].Role != audit.RoleResponder || rows[3].Peer != a {
		t.Fatalf("responder's chain %+v", rows)
	}

	// An answer to someone who is not an agent (an app's key): the same,
	// one row in the responder's chain.
	app, err := keys.Generate[keys.NodeRole]()
	if err != nil {
		t.Fatal(err)
	}
	req5, err := protocol.New(protocol.TypeRequest, app.Public(), map[string]any{"offering": "chat"})
	if err != nil {
		t.Fatal(err)
	}
	_, data5 := response(t, bob, req5, map[string]any{"status": "completed"})
	h.publishAnswer(b, data5, auditHeader(req5, "chat", "1"), 1)
	if rows := h.rows(b); len(rows) != 5 || rows[4].Peer != app.Public() {
		t.Fatalf("responder's chain %+v", rows)
	}

	// Headers on someone else's outbox, or a stale answer: no rows (each
	// is dropped by the timeline's checks, which come first); the answer
	// after them makes its one, in alice's chain.
	req6, _ := request(t, bob, a)
	_, forged := response(t, alice, req6, map[string]any{"status": "completed"})
	if err := h.nc.PublishMsg(&nats.Msg{Subject: protocol.OutboxSubject(b), Data: forged, Header: auditHeader(req6, "chat", "1")}); err != nil {
		t.Fatal(err)
	}
	stale, _ := protocol.NewReply(req6, a, map[string]any{"status": "completed"})
	stale.TS = protocol.FormatTime(time.Now().Add(-time.Hour))
	if err := h.nc.PublishMsg(&nats.Msg{Subject: protocol.OutboxSubject(a), Data: sign(t, alice, stale), Header: auditHeader(req6, "chat", "1")}); err != nil {
		t.Fatal(err)
	}
	_, fine := response(t, alice, req6, map[string]any{"status": "completed"})
	h.publishAnswer(a, fine, auditHeader(req6, "chat", "1"), 1)
	if rb, ra := h.rows(b), h.rows(a); len(rb) != 5 || len(ra) != 1 || ra[0].Role != audit.RoleResponder || ra[0].Peer != b {
		t.Fatalf("after a misattributed and a stale answer: %d rows of bob, %d of alice", len(rb), len(ra))
	}
}

// Answers to one responder from many requesters, spread over the three
// copies' taps, each make exactly one row, in the responder's chain, and
// every chain links.
func TestAuditRowsThreeCopiesOnePerParty(t *testing.T) {
	h := start(t)
	bob := bustest.Agent(t)
	requesters := []*keys.Agent{bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)}
	const per = 20
	r0, _, _ := h.auditCounts()
	var wg sync.WaitGroup
	for _, rq := range requesters {
		wg.Go(func() {
			for i := range per {
				req, _ := request(t, rq, bob.Public())
				_, data := response(t, bob, req, map[string]any{"status": "completed"})
				hdr := auditHeader(req, "chat", fmt.Sprint(i))
				for range 2 { // each answer twice: a republish
					if err := h.nc.PublishMsg(&nats.Msg{Subject: protocol.OutboxSubject(bob.Public()), Data: data, Header: hdr}); err != nil {
						t.Error(err)
					}
				}
			}
		})
	}
	wg.Wait()
	want := uint64(2 * per * len(requesters))
	deadline := time.Now().Add(20 * time.Second)
	for {
		r, d, f := h.auditCounts()
		if f > 0 {
			t.Fatal("an audit row failed")
		}
		if r+d-r0 >= want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d appends", r+d-r0, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if rows := h.rows(bob.Public()); len(rows) != per*len(requesters) {
		t.Fatalf("responder: %d rows, want %d", len(rows), per*len(requesters))
	}
	for _, rq := range requesters {
		if rows := h.rows(rq.Public()); len(rows) != 0 {
			t.Fatalf("requester: %d rows, want none", len(rows))
		}
	}
	var copies int
	for _, w := range h.workers {
		if w.Stats().AuditRows > 0 {
			copies++
		}
	}
	t.Logf("rows appended by %d of %d copies", copies, len(h.workers))
}

// An agent that answers with another agent in to and request ids it made
// up writes nothing into that agent's chain: its rows go to its own chain
// only (the broker attributes the outbox), whatever the answer names.
func TestAuditForgedAnswerWritesNoRowInAnotherChain(t *testing.T) {
	h := start(t)
	mallory, victim := bustest.Agent(t), bustest.Agent(t)
	m, v := mallory.Public(), victim.Public()
	for i := range 3 {
		// A request the victim never sent: only its id and sender are used.
		never, err := protocol.New(protocol.TypeRequest, v, map[string]any{"offering": "chat"})
		if err != nil {
			t.Fatal(err)
		}
		never.ID = fmt.Sprintf("made-up-%d", i)
		forged, data := response(t, mallory, never, map[string]any{"status": "completed"})
		if forged.To != v || forged.InReplyTo != never.ID {
			t.Fatalf("forged answer to %q in reply to %q", forged.To, forged.InReplyTo)
		}
		h.publishAnswer(m, data, auditHeader(never, "chat", "1"), 1)
	}
	if rows := h.rows(v); len(rows) != 0 {
		t.Fatalf("the victim's chain has %d rows written on another agent's word: %+v", len(rows), rows)
	}
	rows := h.rows(m)
	if len(rows) != 3 {
		t.Fatalf("the answering agent's chain has %d rows, want 3", len(rows))
	}
	for _, r := range rows {
		if r.Agent != m || r.Role != audit.RoleResponder || r.Peer != v {
			t.Fatalf("row %+v: want the answering agent's, naming the other as peer", r)
		}
	}
}
