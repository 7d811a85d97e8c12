package admission_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/admission"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/mailbox"
	"agentmesh.dev/mesh/shared/protocol"
)

// The signature-tags fixture's roster: signed by an owner key that is not
// the guarded agent.
const fixtureRoster = `{"admission":"v1","owner_key":"UBMBH4BK6EIHQFVMHLSABFSQXB3JXUFZOXVZQTIERO33AD4HHAI3D7QP",
 "defaults":{"contact":"allow","registered":"hold","anonymous":"block"},
 "limits":{"per_sender_per_hour":12,"inbound_model_budget_per_day":500000},
 "entries":[{"subject":"UAKQRYZBYFOC65OQZVJ3QPCIERDTRNNZPMOJUYXC3DGPRCDWSKD4HV5A","stance":"allow","note":"conformance vector","updated_at":"2026-07-27T15:00:00.000Z"}],
 "updated_at":"2026-07-27T15:00:00.000Z",
 "sig":"kWdzzQ1lm6Zy1seMst6BwDoxx7L6SBEIcjkZdPimOPUQgjSLnZiKSAuAHZrJCsg8KTGlbpFl1E4sBp4bBsc8DQ=="}`

type harness struct {
	t       *testing.T
	m       *bustest.Bus
	nc      *nats.Conn
	js      jetstream.JetStream
	kv      jetstream.KeyValue
	held    jetstream.KeyValue
	reg     jetstream.KeyValue
	workers []*admission.Worker
	// clientNC is client's connection, made when first needed.
	clientNC *nats.Conn
}

// start runs a mesh with a registry bucket and three copies of the worker,
// each on its own connection.
func start(t *testing.T, cfg admission.Config) *harness {
	t.Helper()
	return startCopies(t, cfg, 3)
}

func startCopies(t *testing.T, cfg admission.Config, copies int) *harness {
	t.Helper()
	m := bustest.Start(t)
	h := &harness{t: t, m: m, nc: bustest.Client(t, m)}
	h.js, _ = jetstream.New(h.nc)
	ctx := t.Context()
	var err error
	if h.reg, err = bus.Bucket(ctx, h.js, jetstream.KeyValueConfig{Bucket: admission.RegistryBucket}); err != nil {
		t.Fatal(err)
	}
	for i := range copies {
		w, err := admission.Start(ctx, bustest.Env(t, m, fmt.Sprintf("admission-%d", i), nil), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Stop() })
		h.workers = append(h.workers, w)
	}
	if h.kv, err = h.js.KeyValue(ctx, admission.Bucket); err != nil {
		t.Fatal(err)
	}
	if h.held, err = h.js.KeyValue(ctx, admission.HeldBucket); err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *harness) stats() admission.Stats {
	var s admission.Stats
	for _, w := range h.workers {
		x := w.Stats()
		s.Relayed += x.Relayed
		s.Answers += x.Answers
		s.Queued += x.Queued
		s.Held += x.Held
		s.Blocked += x.Blocked
		s.Dropped += x.Dropped
	}
	return s
}

func (h *harness) register(agent string, sandbox bool) {
	h.t.Helper()
	b, _ := json.Marshal(map[string]any{"id": agent, "name": "x", "visibility": "public", "sandbox": sandbox})
	if _, err := h.reg.Put(h.t.Context(), agent, b); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) call(k keys.Signer, subject string, payload any) (*protocol.Envelope, error) {
	ctx, cancel := context.WithTimeout(h.t.Context(), 5*time.Second)
	defer cancel()
	return bus.Call(ctx, h.nc, k, subject, protocol.TypeRequest, "", payload)
}

func (h *harness) guard(k keys.Signer, payload any) {
	h.t.Helper()
	rep, err := h.call(k, protocol.SubjAdmissionGuard, payload)
	if err != nil {
		h.t.Fatal(err)
	}
	var p struct {
		Status string         `json:"status"`
		Output map[string]any `json:"output"`
	}
	if err := rep.DecodePayload(&p); err != nil || p.Status != admission.StatusGuarded || p.Output["ok"] != true || p.Output["guarded"] != true {
		h.t.Fatalf("guard answered %s", rep.Payload)
	}
	if rep.From != h.m.ServicesKey().Public() {
		h.t.Fatalf("guard answer signed by %s", rep.From)
	}
}

func (h *harness) record(agent string) (admission.Record, bool) {
	h.t.Helper()
	r, found, err := bus.GetJSON[admission.Record](h.t.Context(), h.kv, agent)
	if err != nil {
		h.t.Fatal(err)
	}
	return r, found
}

// mailbox runs the mailbox worker, which makes the stream and reads the
// box the stored guard names.
func (h *harness) mailbox(limits ...mailbox.Limits) {
	h.t.Helper()
	var cfg mailbox.Config
	if len(limits) > 0 {
		cfg.Limits = limits[0]
	}
	w, err := mailbox.Start(h.t.Context(), bustest.Env(h.t, h.m, "mailbox", nil), cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = w.Stop() })
}

// client is a connection whose replies arrive under a client's private
// prefix, the only kind the mailbox answers a fetch on.
func (h *harness) client() *nats.Conn {
	h.t.Helper()
	if h.clientNC == nil {
		nc, err := h.m.ConnectService("test-client", nats.CustomInboxPrefix(protocol.PrivateInboxPrefix("Utest")))
		if err != nil {
			h.t.Fatal(err)
		}
		h.t.Cleanup(nc.Close)
		h.clientNC = nc
	}
	return h.clientNC
}

// fetch reads agent's mail as its node would: the box it came from and
// the messages in order.
func (h *harness) fetch(agent *keys.Agent) (string, []mailbox.Mail) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(h.t.Context(), 5*time.Second)
	defer cancel()
	mail, res, err := mailbox.Fetch(ctx, h.client(), agent, 0, mailbox.MaxFetch)
	if err != nil {
		h.t.Fatal(err)
	}
	return res.Box, mail
}

// drain fetches agent's mail and deletes what it got, returning the ids.
func (h *harness) drain(agent *keys.Agent) []string {
	h.t.Helper()
	box, mail := h.fetch(agent)
	var ids []string
	for _, m := range mail {
		env, err := protocol.Decode(m.Data)
		if err != nil {
			h.t.Fatal(err)
		}
		ids = append(ids, env.ID)
	}
	if len(mail) > 0 {
		ctx, cancel := context.WithTimeout(h.t.Context(), 5*time.Second)
		defer cancel()
		if err := mailbox.Ack(ctx, h.client(), agent, box, mail[len(mail)-1].Seq+1, nil); err != nil {
			h.t.Fatal(err)
		}
	}
	return ids
}

func signedRoster(t *testing.T, owner *keys.Agent, entries map[string]string) map[string]any {
	t.Helper()
	list := []any{}
	for subj, stance := range entries {
		list = append(list, map[string]any{"subject": subj, "stance": stance, "note": "", "updated_at": "2026-07-27T15:00:00.000Z"})
	}
	r := map[string]any{"admission": "v1", "owner_key": owner.Public(),
		"defaults": map[string]any{"contact": "allow", "registered": "hold", "anonymous": "block"},
		"limits":   map[string]any{"per_sender_per_hour": 12, "inbound_model_budget_per_day": 500000},
		"entries":  list, "updated_at": "2026-07-27T15:00:00.000Z"}
	sig, err := protocol.SignRoster(r, owner)
	if err != nil {
		t.Fatal(err)
	}
	r["sig"] = sig
	return r
}

// Guard and unguard answer as pinned, write KV mesh_admission, keep the
// roster across a bare re-guard, refuse a roster that does not verify, and
// switch the box the mailbox worker reads between .inbox and .inbox.guarded.
func TestGuardUnguard(t *testing.T) {
	h := start(t, admission.Config{})
	agent, owner := bustest.Agent(t), bustest.Agent(t)
	a := agent.Public()

	// No stream yet: the guard is stored and the mail switch is skipped.
	h.guard(agent, map[string]any{})
	if r, ok := h.record(a); !ok || !r.Guarded || r.HasRoster() || r.UpdatedAt == "" {
		t.Fatalf("record after guard: %+v", r)
	}
	if _, err := h.call(agent, protocol.SubjAdmissionUnguard, map[string]any{}); err != nil {
		t.Fatal(err)
	}

	// With the mailbox running, the worker reads the box the guard names.
	h.mailbox()
	if box, _ := h.fetch(agent); box != mailbox.BoxOpen {
		t.Fatalf("initial box %s", box)
	}
	roster := signedRoster(t, owner, map[string]string{bustest.Agent(t).Public(): "allow"})
	h.guard(agent, map[string]any{"roster": roster})
	if box, _ := h.fetch(agent); box != mailbox.BoxGuarded {
		t.Fatalf("guarded box %s", box)
	}
	r, _ := h.record(a)
	if !r.Guarded || r.OwnerKey != owner.Public() || !r.HasRoster() {
		t.Fatalf("record with roster: %+v", r)
	}
	if v, _ := protocol.ParseJSON(r.Roster); protocol.VerifyRoster(v) != nil {
		t.Fatal("the stored roster no longer verifies")
	}

	// A bare guard keeps the roster.
	h.guard(agent, map[string]any{})
	if r2, _ := h.record(a); string(r2.Roster) != string(r.Roster) {
		t.Fatal("a bare guard dropped the roster")
	}

	// A tampered roster is refused and changes nothing.
	bad := signedRoster(t, owner, nil)
	bad["defaults"] = map[string]any{"contact": "allow", "registered": "allow", "anonymous": "allow"}
	if _, err := h.call(agent, protocol.SubjAdmissionGuard, map[string]any{"roster": bad}); errs.CodeOf(err) != errs.IdentityMismatch {
		t.Fatalf("tampered roster: %v", err)
	}
	if r2, _ := h.record(a); string(r2.Roster) != string(r.Roster) {
		t.Fatal("a refused roster was stored")
	}

	// Unguard: the filter goes back, the roster is kept.
	rep, err := h.call(agent, protocol.SubjAdmissionUnguard, map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	var p struct {
		Status string         `json:"status"`
		Output map[string]any `json:"output"`
	}
	if rep.DecodePayload(&p); p.Status != admission.StatusUnguarded || p.Output["ok"] != true || p.Output["guarded"] != false {
		t.Fatalf("unguard answered %s", rep.Payload)
	}
	if box, _ := h.fetch(agent); box != mailbox.BoxOpen {
		t.Fatalf("unguarded box %s", box)
	}
	if r2, _ := h.record(a); r2.Guarded || !r2.HasRoster() {
		t.Fatalf("record after unguard: %+v", r2)
	}

	// The signature-tags fixture roster (owner ≠ agent) is accepted and its
	// owner recorded; {roster:null} removes it.
	var fx any
	if err := json.Unmarshal([]byte(fixtureRoster), &fx); err != nil {
		t.Fatal(err)
	}
	h.guard(agent, map[string]any{"roster": fx})
	if r2, _ := h.record(a); r2.OwnerKey != "UBMBH4BK6EIHQFVMHLSABFSQXB3JXUFZOXVZQTIERO33AD4HHAI3D7QP" {
		t.Fatalf("fixture roster owner %q", r2.OwnerKey)
	}
	h.guard(agent, map[string]any{"roster": nil})
	if r2, _ := h.record(a); !r2.Guarded || r2.HasRoster() || r2.OwnerKey != "" {
		t.Fatalf("roster:null left %+v", r2)
	}

	// A sandbox registration cannot be guarded.
	guest := bustest.Agent(t)
	h.register(guest.Public(), true)
	if _, err := h.call(guest, protocol.SubjAdmissionGuard, map[string]any{}); errs.CodeOf(err) != errs.Unauthorized {
		t.Fatalf("sandbox guard: %v", err)
	}
}

// node is a test node serving a guarded inbox: it answers an accept and
// then a completed respond, and records what it received.
type node struct {
	mu   sync.Mutex
	seen [][]byte
	sub  *nats.Subscription
}

func serve(t *testing.T, nc *nats.Conn, agent *keys.Agent) *node {
	t.Helper()
	n := &node{}
	sub, err := nc.Subscribe(protocol.GuardedInboxSubject(agent.Public()), func(m *nats.Msg) {
		n.mu.Lock()
		n.seen = append(n.seen, m.Data)
		n.mu.Unlock()
		req, err := protocol.Decode(m.Data)
		if err != nil {
			return
		}
		acc, _ := protocol.NewAccept(req, agent.Public())
		_ = acc.Sign(agent)
		b, _ := acc.Marshal()
		_ = m.Respond(b)
		rep, _ := protocol.NewReply(req, agent.Public(), map[string]any{"status": "completed", "output": map[string]any{"text": "hello back"}})
		_ = rep.Sign(agent)
		b, _ = rep.Marshal()
		_ = m.Respond(b)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	n.sub = sub
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return n
}

func (n *node) received() [][]byte {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([][]byte(nil), n.seen...)
}

// signedRequest is a request from a protocol 0.2-style sender, which reads
// every answer on its reply subject.
func signedRequest(t *testing.T, from *keys.Agent, to string) ([]byte, *protocol.Envelope) {
	t.Helper()
	return signedVersioned(t, "0.2.0", from, to, "")
}

// signedVersioned is a request of protocol version v (with in_reply_to, a
// protocol 0.3 late answer).
func signedVersioned(t *testing.T, v string, from *keys.Agent, to, inReplyTo string) ([]byte, *protocol.Envelope) {
	t.Helper()
	e, err := protocol.New(protocol.TypeRequest, from.Public(), map[string]any{"offering": "chat", "input": map[string]any{"text": "hi"}})
	if err != nil {
		t.Fatal(err)
	}
	e.V, e.To, e.InReplyTo = v, to, inReplyTo
	if err := e.Sign(from); err != nil {
		t.Fatal(err)
	}
	b, err := e.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b, e
}

// send publishes data on the agent's public inbox and collects the answers
// until one is not an accept, or wait passes with nothing new.
func send(t *testing.T, nc *nats.Conn, agent string, data []byte, wait time.Duration) []*protocol.Envelope {
	t.Helper()
	// A client's reply subject (the harness connection is a service's,
	// whose own prefix the admission service does not answer on).
	inbox := protocol.PrivateInboxPrefix("Utest") + "." + protocol.RandomToken()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(protocol.InboxSubject(agent), inbox, data); err != nil {
		t.Fatal(err)
	}
	var out []*protocol.Envelope
	for {
		m, err := sub.NextMsg(wait)
		if err != nil {
			return out
		}
		e, err := protocol.Decode(m.Data)
		if err != nil {
			t.Fatalf("undecodable answer: %v", err)
		}
		out = append(out, e)
		if !protocol.IsAccepted(e) {
			return out
		}
	}
}

func queuedAck(t *testing.T, h *harness, req *protocol.Envelope, got []*protocol.Envelope) protocol.QueuedAck {
	t.Helper()
	if len(got) != 1 {
		t.Fatalf("want one queued ack, got %d answers", len(got))
	}
	e := got[0]
	if e.From != h.m.ServicesKey().Public() || e.InReplyTo != req.ID || e.To != req.From || e.Type != protocol.TypeRespond {
		t.Fatalf("queued ack envelope from=%s in_reply_to=%s to=%s", e.From, e.InReplyTo, e.To)
	}
	if protocol.ResponseStatus(e) != admission.StatusQueued {
		t.Fatalf("queued ack status %s", e.Payload)
	}
	ack, ok := protocol.QueuedAckOf(e)
	if !ok || !ack.Queued || ack.InboxID == "" || ack.Text != admission.QueuedText {
		t.Fatalf("queued ack payload %s", e.Payload)
	}
	var shape map[string]any
	_ = json.Unmarshal(e.Payload, &shape)
	if len(shape) != 2 || len(shape["output"].(map[string]any)) != 3 {
		t.Fatalf("queued ack shape %s", e.Payload)
	}
	return ack
}

// A guarded agent with a roster: a contact is relayed exactly once and gets
// the node's answers unchanged; a held and a blocked sender get identical
// queued acks and never reach the node; the held one is recorded for the
// owner; an unsigned request is dropped without an answer; with the node
// offline an allowed sender gets the queued ack and the request waits in
// the mailbox.
func TestRelayWithRoster(t *testing.T) {
	h := start(t, admission.Config{RelayTimeout: 700 * time.Millisecond})
	agent, owner := bustest.Agent(t), bustest.Agent(t)
	a := agent.Public()
	contact, blockedContact, registered, anonymous, guest := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)
	h.register(registered.Public(), false)
	h.register(blockedContact.Public(), false)
	h.register(guest.Public(), true)
	h.mailbox()
	h.guard(agent, map[string]any{"roster": signedRoster(t, owner, map[string]string{
		contact.Public(): "allow", blockedContact.Public(): "block"})})
	nodeConn := bustest.Client(t, h.m)
	n := serve(t, nodeConn, agent)

	// Allowed: relayed once, both answers forwarded byte for byte.
	data, req := signedRequest(t, contact, a)
	got := send(t, h.nc, a, data, 3*time.Second)
	if len(got) != 2 || !protocol.IsAccepted(got[0]) || protocol.ResponseStatus(got[1]) != "completed" || got[1].From != a || got[1].InReplyTo != req.ID {
		t.Fatalf("contact got %d answers", len(got))
	}
	time.Sleep(200 * time.Millisecond)
	if seen := n.received(); len(seen) != 1 || string(seen[0]) != string(data) {
		t.Fatalf("node saw %d requests (want exactly the sender's bytes once)", len(seen))
	}

	// Blocked (roster entry), held (registered tier), blocked (anonymous
	// tier, and a sandbox registration counts as anonymous): identical acks.
	var acks []protocol.QueuedAck
	var heldReq *protocol.Envelope
	var heldData []byte
	for _, s := range []*keys.Agent{blockedContact, registered, anonymous, guest} {
		d, r := signedRequest(t, s, a)
		if s == registered {
			heldReq, heldData = r, d
		}
		acks = append(acks, queuedAck(t, h, r, send(t, h.nc, a, d, 3*time.Second)))
	}
	for i := 1; i < len(acks); i++ {
		if acks[i].Text != acks[0].Text || acks[i].InboxID == acks[0].InboxID {
			t.Fatal("queued acks differ in shape or reuse an inbox id")
		}
	}
	if len(n.received()) != 1 {
		t.Fatal("a held or blocked request reached the node")
	}
	keysHeld, err := h.held.ListKeys(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var heldKeys []string
	for k := range keysHeld.Keys() {
		heldKeys = append(heldKeys, k)
	}
	if len(heldKeys) != 1 || heldKeys[0] != a+"."+heldReq.ID {
		t.Fatalf("held keys %v", heldKeys)
	}
	hr, _, _ := bus.GetJSON[admission.Held](t.Context(), h.held, heldKeys[0])
	if hr.From != registered.Public() || hr.ReceivedAt == "" || string(hr.Envelope) != string(heldData) {
		t.Fatalf("held record %+v", hr)
	}
	if s := h.stats(); s.Held != 1 || s.Blocked != 3 || s.Queued != 4 || s.Relayed != 1 {
		t.Fatalf("stats %+v", s)
	}

	// Unsigned: dropped, no answer, the node never sees it.
	unsigned := []byte(strings.Replace(string(data), `"sig":"`, `"sig":"AA`, 1))
	if got := send(t, h.nc, a, unsigned, 500*time.Millisecond); len(got) != 0 {
		t.Fatalf("unsigned request answered %d times", len(got))
	}
	if len(n.received()) != 1 || h.stats().Dropped != 1 {
		t.Fatalf("unsigned request: node saw %d, stats %+v", len(n.received()), h.stats())
	}

	// The node goes offline: the allowed sender gets the queued ack after
	// the relay timeout and the relayed copy waits in the mailbox on the
	// guarded subject, where the mailbox worker reads for a guarded agent.
	// Flushed, so the broker has dropped the interest before the next
	// request: otherwise the relay may still find it and wait it out.
	_ = n.sub.Unsubscribe()
	_ = nodeConn.Flush()
	data2, req2 := signedRequest(t, contact, a)
	queuedAck(t, h, req2, send(t, h.nc, a, data2, 3*time.Second))
	var mailed []string
	box, mail := h.fetch(agent)
	if box != mailbox.BoxGuarded {
		t.Fatalf("mail read from the %s box", box)
	}
	for _, m := range mail {
		mailed = append(mailed, string(m.Data))
	}
	// The first relay (answered live) and the offline one are both there;
	// the node's journal skips the one it already answered.
	if len(mailed) != 2 || mailed[0] != string(data) || mailed[1] != string(data2) {
		t.Fatalf("mailbox holds %d guarded messages", len(mailed))
	}
}

// Without a roster: registered senders are relayed, anonymous ones get the
// queued ack; a node that is offline with no mailbox (nobody listens on the
// guarded inbox) yields the queued ack at once. An agent that is not
// guarded is left alone.
func TestRelayWithoutRoster(t *testing.T) {
	h := start(t, admission.Config{RelayTimeout: 5 * time.Second})
	agent := bustest.Agent(t)
	a := agent.Public()
	registered, anonymous := bustest.Agent(t), bustest.Agent(t)
	h.register(registered.Public(), false)
	h.guard(agent, map[string]any{})
	nodeConn := bustest.Client(t, h.m)
	n := serve(t, nodeConn, agent)

	data, _ := signedRequest(t, registered, a)
	if got := send(t, h.nc, a, data, 3*time.Second); len(got) != 2 || protocol.ResponseStatus(got[1]) != "completed" {
		t.Fatalf("registered sender got %d answers", len(got))
	}
	d2, r2 := signedRequest(t, anonymous, a)
	queuedAck(t, h, r2, send(t, h.nc, a, d2, 3*time.Second))
	if len(n.received()) != 1 {
		t.Fatalf("node saw %d", len(n.received()))
	}

	// Offline without a mailbox: no responders, the ack comes at once.
	// Flushed, so the broker has dropped the interest before the next
	// request: otherwise the relay may still find it and wait it out.
	_ = n.sub.Unsubscribe()
	_ = nodeConn.Flush()
	begin := time.Now()
	d3, r3 := signedRequest(t, registered, a)
	queuedAck(t, h, r3, send(t, h.nc, a, d3, 3*time.Second))
	if time.Since(begin) > 2*time.Second {
		t.Fatal("no responders did not short-cut the relay timeout")
	}

	// Not guarded: the agent's own node answers; admission stays silent.
	other := bustest.Agent(t)
	var live atomic.Int64
	c := bustest.Client(t, h.m)
	sub, err := c.Subscribe(protocol.InboxSubject(other.Public()), func(m *nats.Msg) {
		live.Add(1)
		req, _ := protocol.Decode(m.Data)
		rep, _ := protocol.NewReply(req, other.Public(), map[string]any{"status": "completed"})
		_ = rep.Sign(other)
		b, _ := rep.Marshal()
		_ = m.Respond(b)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	_ = c.Flush()
	before := h.stats()
	d4, _ := signedRequest(t, anonymous, other.Public())
	if got := send(t, h.nc, other.Public(), d4, 300*time.Millisecond); len(got) != 1 || got[0].From != other.Public() {
		t.Fatalf("unguarded agent: %d answers", len(got))
	}
	time.Sleep(200 * time.Millisecond)
	if after := h.stats(); after != before || live.Load() != 1 {
		t.Fatalf("admission touched an unguarded agent's traffic: %+v → %+v", before, after)
	}

	// Unguarded again: the next request goes to the agent's public inbox
	// untouched (within the cache bound).
	if _, err := h.call(agent, protocol.SubjAdmissionUnguard, map[string]any{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	before = h.stats()
	d5, _ := signedRequest(t, anonymous, a)
	if got := send(t, h.nc, a, d5, 300*time.Millisecond); len(got) != 0 {
		t.Fatalf("unguarded agent with no node: admission answered %d", len(got))
	}
	if after := h.stats(); after != before {
		t.Fatalf("admission judged an unguarded agent: %+v → %+v", before, after)
	}

	// Guarded again: every copy drops its cached "unguarded" at once.
	h.guard(agent, map[string]any{})
	time.Sleep(200 * time.Millisecond)
	d6, r6 := signedRequest(t, anonymous, a)
	queuedAck(t, h, r6, send(t, h.nc, a, d6, 3*time.Second))
}

// Many allowed requests through three copies: each relayed exactly once.
func TestRelayExactlyOnce(t *testing.T) {
	h := start(t, admission.Config{})
	agent := bustest.Agent(t)
	a := agent.Public()
	sender := bustest.Agent(t)
	h.register(sender.Public(), false)
	h.guard(agent, map[string]any{})
	nodeConn := bustest.Client(t, h.m)
	n := serve(t, nodeConn, agent)
	const N = 30
	var wg sync.WaitGroup
	for range N {
		wg.Add(1)
		go func() {
			defer wg.Done()
			data, _ := signedRequest(t, sender, a)
			if got := send(t, h.nc, a, data, 3*time.Second); len(got) != 2 {
				t.Errorf("got %d answers", len(got))
			}
		}()
	}
	wg.Wait()
	time.Sleep(200 * time.Millisecond)
	if len(n.received()) != N || h.stats().Relayed != N {
		t.Fatalf("node saw %d of %d, stats %+v", len(n.received()), N, h.stats())
	}
}

// stalled is a test node that accepts every request on a guarded inbox and
// finishes none until told to: each relay it accepts holds its slot.
type stalled struct {
	mu      sync.Mutex
	pending []*nats.Msg
	agent   *keys.Agent
}

func stall(t *testing.T, nc *nats.Conn, agent *keys.Agent) *stalled {
	t.Helper()
	s := &stalled{agent: agent}
	sub, err := nc.Subscribe(protocol.GuardedInboxSubject(agent.Public()), func(m *nats.Msg) {
		req, err := protocol.Decode(m.Data)
		if err != nil {
			return
		}
		acc, _ := protocol.NewAccept(req, agent.Public())
		_ = acc.Sign(agent)
		b, _ := acc.Marshal()
		_ = m.Respond(b)
		s.mu.Lock()
		s.pending = append(s.pending, m)
		s.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return s
}

// finish answers every accepted request, which frees their slots.
func (s *stalled) finish() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range s.pending {
		req, _ := protocol.Decode(m.Data)
		rep, _ := protocol.NewReply(req, s.agent.Public(), map[string]any{"status": "completed"})
		_ = rep.Sign(s.agent)
		b, _ := rep.Marshal()
		_ = m.Respond(b)
	}
	s.pending = nil
}

// busyRefusal checks that got is the services-signed, retryable refusal of
// req with code.
func busyRefusal(t *testing.T, h *harness, req *protocol.Envelope, got []*protocol.Envelope, code errs.Code) {
	t.Helper()
	if len(got) != 1 {
		t.Fatalf("want one refusal, got %d answers", len(got))
	}
	e := got[0]
	if e.From != h.m.ServicesKey().Public() || e.InReplyTo != req.ID || e.Type != protocol.TypeRespond {
		t.Fatalf("refusal from=%s in_reply_to=%s type=%s", e.From, e.InReplyTo, e.Type)
	}
	if x := bus.ErrorOf(e); x == nil || x.Code != code || !x.Retryable || x.RetryAfterMS <= 0 {
		t.Fatalf("refusal payload %s, want retryable %s", e.Payload, code)
	}
}

// Relay slots run out without stalling anyone: a guarded agent whose node
// accepts and never finishes holds at most MaxRelaysPerAgent slots, and its
// next request is refused at once with AGENT_OVERLOADED (retryable) while
// another guarded agent is still served; when the copy's MaxRelays are all
// held, a new request is refused at once with UNAVAILABLE instead of
// blocking the inbox subscription; finished relays free their slots.
func TestRelaySlotsRefuseInsteadOfBlocking(t *testing.T) {
	h := startCopies(t, admission.Config{MaxRelays: 4, MaxRelaysPerAgent: 2, AnswerTimeout: time.Minute}, 1)
	sender := bustest.Agent(t)
	h.register(sender.Public(), false)
	greedy, greedy2, other := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)
	for _, a := range []*keys.Agent{greedy, greedy2, other} {
		h.guard(a, map[string]any{})
	}
	c := bustest.Client(t, h.m)
	g1, g2 := stall(t, c, greedy), stall(t, c, greedy2)
	serve(t, c, other)
	accepted := func(a *keys.Agent) {
		t.Helper()
		data, _ := signedRequest(t, sender, a.Public())
		if got := send(t, h.nc, a.Public(), data, 300*time.Millisecond); len(got) != 1 || !protocol.IsAccepted(got[0]) {
			t.Fatalf("want the accept alone, got %d answers", len(got))
		}
	}
	completed := func(a *keys.Agent) {
		t.Helper()
		data, _ := signedRequest(t, sender, a.Public())
		if got := send(t, h.nc, a.Public(), data, 3*time.Second); len(got) != 2 || protocol.ResponseStatus(got[1]) != "completed" {
			t.Fatalf("want accept and answer, got %d answers", len(got))
		}
	}
	refused := func(a *keys.Agent, code errs.Code) {
		t.Helper()
		data, req := signedRequest(t, sender, a.Public())
		begin := time.Now()
		busyRefusal(t, h, req, send(t, h.nc, a.Public(), data, 3*time.Second), code)
		if d := time.Since(begin); d > time.Second {
			t.Fatalf("the refusal took %v: the subscription waited", d)
		}
	}

	accepted(greedy)
	accepted(greedy)
	refused(greedy, errs.AgentOverloaded)
	completed(other)
	completed(other)

	accepted(greedy2)
	accepted(greedy2) // the copy's four slots are all held now
	refused(other, errs.Unavailable)
	refused(greedy, errs.AgentOverloaded)
	if s := h.workers[0].Stats(); s.Busy != 3 || s.Relayed != 6 {
		t.Fatalf("stats %+v", s)
	}

	g1.finish()
	g2.finish()
	deadline := time.Now().Add(3 * time.Second)
	for h.workers[0].Stats().Answers < 4+4+4 { // 2 accepts+answers for other, 4 accepts, 4 answers
		if time.Now().After(deadline) {
			t.Fatalf("finished relays not forwarded: %+v", h.workers[0].Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // the relays return their slots after forwarding
	completed(other)
	accepted(greedy) // its slots are free again (its node still only accepts)
}

// Switching the guard carries the mailbox across (review M1): offline mail
// that arrived while the agent was open is still delivered after a guard;
// after an unguard, relayed mail not yet drained is delivered and what a
// blocked sender published to the open inbox while guarded is not; mail
// after the unguard is delivered as usual.
func TestGuardSwitchCarriesTheMailbox(t *testing.T) {
	h := start(t, admission.Config{})
	agent, owner, stranger := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)
	a := agent.Public()
	h.mailbox()
	pull := func() []string { t.Helper(); return h.drain(agent) }
	stream, err := h.js.Stream(t.Context(), protocol.MailboxStream)
	if err != nil {
		t.Fatal(err)
	}
	// publish waits until the stream holds the message: the stream stores
	// asynchronously, and a switch only carries what is stored when it runs.
	publish := func(subject string, from *keys.Agent) string {
		t.Helper()
		data, env := signedRequest(t, from, a)
		if err := h.nc.Publish(subject, data); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if m, err := stream.GetLastMsgForSubject(t.Context(), subject); err == nil && bytes.Equal(m.Data, data) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the stream never stored %s", env.ID)
			}
		}
		return env.ID
	}

	// Offline mail while open, then a guard.
	before := publish(protocol.InboxSubject(a), stranger)
	h.guard(agent, map[string]any{"roster": signedRoster(t, owner, nil)})
	if got := pull(); len(got) != 1 || got[0] != before {
		t.Fatalf("after the guard the mailbox delivered %v, want the mail from before it", got)
	}

	// While guarded: a stranger (anonymous: blocked) on the open inbox,
	// and a relayed message on the guarded inbox that is not drained.
	publish(protocol.InboxSubject(a), stranger) // blocked
	relayed := publish(protocol.GuardedInboxSubject(a), bustest.Agent(t))

	if _, err := h.call(agent, protocol.SubjAdmissionUnguard, map[string]any{}); err != nil {
		t.Fatal(err)
	}
	if got := pull(); len(got) != 1 || got[0] != relayed {
		t.Fatalf("after the unguard the mailbox delivered %v, want only the relayed message %s", got, relayed)
	}
	after := publish(protocol.InboxSubject(a), stranger)
	if got := pull(); len(got) != 1 || got[0] != after {
		t.Fatalf("after the unguard, new mail: %v", got)
	}
}

// A switch whose other box cannot take the mail (it is full: the stream
// discards new mail per box) leaves the originals where they are instead of
// purging them.
func TestGuardSwitchKeepsWhatTheOtherBoxRefuses(t *testing.T) {
	h := start(t, admission.Config{})
	agent, owner, stranger := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)
	a := agent.Public()
	h.mailbox(mailbox.Limits{MaxMsgsPerAgent: 2})
	stream, err := h.js.Stream(t.Context(), protocol.MailboxStream)
	if err != nil {
		t.Fatal(err)
	}
	stored := func(subject string) uint64 {
		t.Helper()
		info, err := stream.Info(t.Context(), jetstream.WithSubjectFilter(subject))
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Subjects[subject]
	}
	publish := func(subject string) {
		t.Helper()
		before := stored(subject)
		data, _ := signedRequest(t, stranger, a)
		if err := h.nc.Publish(subject, data); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(5 * time.Second); stored(subject) == before; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the stream never stored a message on %s", subject)
			}
		}
	}
	// The guarded box is full; one message waits on the open one.
	publish(protocol.GuardedInboxSubject(a))
	publish(protocol.GuardedInboxSubject(a))
	publish(protocol.InboxSubject(a))
	h.guard(agent, map[string]any{"roster": signedRoster(t, owner, nil)})
	if got := stored(protocol.InboxSubject(a)); got != 1 {
		t.Fatalf("the open box holds %d messages after a switch its copy could not make, want 1", got)
	}
}

// Unguarding with the open inbox full of what blocked senders sent (it
// holds at most MaxMsgsPerAgent): that mail is dropped first, so the
// relayed mail moving there has room and is read (review finding: it was
// discarded, and the guarded originals purged).
func TestUnguardMakesRoomForTheRelayedMail(t *testing.T) {
	h := start(t, admission.Config{})
	agent, owner, stranger := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)
	a := agent.Public()
	h.mailbox(mailbox.Limits{MaxMsgsPerAgent: 2})
	h.guard(agent, map[string]any{"roster": signedRoster(t, owner, nil)})
	stream, err := h.js.Stream(t.Context(), protocol.MailboxStream)
	if err != nil {
		t.Fatal(err)
	}
	publish := func(subject string) string {
		t.Helper()
		data, env := signedRequest(t, stranger, a)
		if err := h.nc.Publish(subject, data); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if m, err := stream.GetLastMsgForSubject(t.Context(), subject); err == nil && bytes.Equal(m.Data, data) {
				return env.ID
			}
			if time.Now().After(deadline) {
				t.Fatalf("the stream never stored %s", env.ID)
			}
		}
	}
	publish(protocol.InboxSubject(a)) // blocked
	publish(protocol.InboxSubject(a)) // blocked: the open inbox is full
	relayed := publish(protocol.GuardedInboxSubject(a))
	if _, err := h.call(agent, protocol.SubjAdmissionUnguard, map[string]any{}); err != nil {
		t.Fatal(err)
	}
	if got := h.drain(agent); len(got) != 1 || got[0] != relayed {
		t.Fatalf("after the unguard the agent read %v, want the relayed %s", got, relayed)
	}
}

// A protocol 0.3 request through the relay: the node answers at the
// sender's inbox and sends only its first answer on the relay subject, as a
// sign of life; the relay passes that one on and stops at once (no queued
// ack follows). With the node offline the sender still gets the queued ack
// on its reply subject, the one thing a 0.3 client reads there.
func TestRelayOfAProtocol03Request(t *testing.T) {
	h := start(t, admission.Config{RelayTimeout: 700 * time.Millisecond, AnswerTimeout: time.Minute, MaxRelaysPerAgent: 1})
	agent, contact := bustest.Agent(t), bustest.Agent(t)
	a := agent.Public()
	h.register(contact.Public(), false)
	h.guard(agent, map[string]any{})
	nodeConn := bustest.Client(t, h.m)
	n := serve(t, nodeConn, agent)

	// Twice, with one relay slot for the agent: a relay that waited for
	// more answers would hold it for AnswerTimeout and the second request
	// would be refused as busy.
	for i := range 2 {
		data, req := signedVersioned(t, "0.3.0", contact, a, "")
		got := send(t, h.nc, a, data, 2*time.Second)
		if len(got) != 1 || !protocol.IsAccepted(got[0]) || got[0].InReplyTo != req.ID {
			t.Fatalf("request %d: the 0.3 sender got %d answers on its reply subject (want the accept alone)", i, len(got))
		}
	}
	if len(n.received()) != 2 || h.stats().Answers != 2 || h.stats().Queued != 0 {
		t.Fatalf("node saw %d requests; stats %+v", len(n.received()), h.stats())
	}

	_ = n.sub.Unsubscribe()
	_ = nodeConn.Flush()
	data2, req2 := signedVersioned(t, "0.3.0", contact, a, "")
	queuedAck(t, h, req2, send(t, h.nc, a, data2, 3*time.Second))
}

// Answers at a guarded agent's public inbox (a respond, or a protocol 0.3
// late answer: a request naming the original in in_reply_to) are never
// acknowledged: one from an allowed sender is passed to the guarded inbox
// as it is, so that the mailbox keeps it for an offline agent; one from a
// sender the roster holds (here by the default for registered senders) is
// kept for the owner, like a held request; a blocked sender's is dropped.
// The agent's node takes any of them live while its call waits.
func TestAnswersAtAGuardedInbox(t *testing.T) {
	h := start(t, admission.Config{RelayTimeout: 700 * time.Millisecond})
	agent, owner := bustest.Agent(t), bustest.Agent(t)
	a := agent.Public()
	contact, registered, blocked := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)
	h.register(registered.Public(), false)
	h.guard(agent, map[string]any{"roster": signedRoster(t, owner, map[string]string{
		contact.Public(): "allow", blocked.Public(): "block"})})
	guarded, err := h.nc.SubscribeSync(protocol.GuardedInboxSubject(a))
	if err != nil {
		t.Fatal(err)
	}
	_ = h.nc.Flush()

	answer := func(from *keys.Agent, late bool) []byte {
		t.Helper()
		if late {
			b, _ := signedVersioned(t, "0.3.0", from, a, protocol.NewID())
			return b
		}
		_, orig := signedVersioned(t, "0.3.0", agent, from.Public(), "")
		rep, err := protocol.NewReply(orig, from.Public(), map[string]any{"status": "completed", "output": map[string]any{"text": "yes"}})
		if err != nil {
			t.Fatal(err)
		}
		if err := rep.Sign(from); err != nil {
			t.Fatal(err)
		}
		b, _ := rep.Marshal()
		return b
	}
	heldWant := map[string][]byte{} // held key → the envelope kept for the owner
	for _, late := range []bool{false, true} {
		want := answer(contact, late)
		if got := send(t, h.nc, a, want, 500*time.Millisecond); len(got) != 0 {
			t.Fatalf("an allowed answer (late=%v) was answered %d times", late, len(got))
		}
		m, err := guarded.NextMsg(2 * time.Second)
		if err != nil || string(m.Data) != string(want) {
			t.Fatalf("an allowed answer (late=%v) did not reach the guarded inbox unchanged: %v", late, err)
		}
		for _, s := range []*keys.Agent{registered, blocked} {
			b := answer(s, late)
			if got := send(t, h.nc, a, b, 500*time.Millisecond); len(got) != 0 {
				t.Fatalf("a held or blocked answer (late=%v) was answered %d times", late, len(got))
			}
			if s == registered {
				e, err := protocol.Decode(b)
				if err != nil {
					t.Fatal(err)
				}
				heldWant[a+"."+e.ID] = b
			}
		}
	}
	if m, err := guarded.NextMsg(500 * time.Millisecond); err == nil {
		t.Fatalf("an answer from outside the roster reached the guarded inbox: %s", m.Data)
	}
	// The registered sender's answers (the roster's default for it is
	// hold) are kept for the owner, exactly as they came; the blocked
	// sender's are not.
	for key, want := range heldWant {
		e, err := h.held.Get(t.Context(), key)
		if err != nil {
			t.Fatalf("the held answer %s: %v", key, err)
		}
		var rec admission.Held
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			t.Fatal(err)
		}
		if rec.Agent != a || rec.From != registered.Public() || !bytes.Equal(rec.Envelope, want) {
			t.Fatalf("held %+v", rec)
		}
	}
	keysHeld, err := h.held.ListKeys(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for range keysHeld.Keys() {
		n++
	}
	if n != len(heldWant) {
		t.Fatalf("%d entries held, want %d", n, len(heldWant))
	}
	if s := h.stats(); s.Held != 2 || s.Queued != 0 || s.Relayed != 0 || s.Blocked != 2 || s.Dropped != 0 || s.Answers != 2 {
		t.Fatalf("stats %+v", s)
	}
}

// Only guarded agents' public inboxes reach the service: a copy takes an
// agent's inbox from the guard on (the copy that answers the guard before
// it answers, the others from the KV watch), a copy started later takes
// those already guarded, and an unguard gives the inbox back. The traffic
// of every other agent costs the service nothing.
func TestOnlyGuardedInboxesReachTheService(t *testing.T) {
	h := startCopies(t, admission.Config{}, 1)
	open, guarded := bustest.Agent(t), bustest.Agent(t)
	h.register(open.Public(), false)
	h.register(guarded.Public(), false)
	seen := func(ws ...*admission.Worker) uint64 {
		var n uint64
		for _, w := range ws {
			n += w.Stats().Seen
		}
		return n
	}
	// send publishes junk on the open inbox and then on the guarded one,
	// and returns how many of the two the copies ws took: one copy gets
	// both in publish order, so once the second is counted so is the
	// first, if it was taken at all.
	send := func(ws ...*admission.Worker) uint64 {
		t.Helper()
		before := seen(ws...)
		for _, k := range []*keys.Agent{open, guarded} {
			if err := h.nc.Publish(protocol.InboxSubject(k.Public()), []byte("{}")); err != nil {
				t.Fatal(err)
			}
		}
		deadline := time.Now().Add(5 * time.Second)
		for seen(ws...) == before {
			if time.Now().After(deadline) {
				t.Fatal("the guarded inbox's message never reached the service")
			}
			time.Sleep(2 * time.Millisecond)
		}
		return seen(ws...) - before
	}

	h.guard(guarded, map[string]any{})
	if n := send(h.workers[0]); n != 1 {
		t.Fatalf("the service took %d messages, want the guarded agent's only", n)
	}
	// A copy started now takes the guarded inbox from the stored records.
	late, err := admission.Start(t.Context(), bustest.Env(t, h.m, "admission-late", nil), admission.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = late.Stop() })
	_ = h.workers[0].Stop()
	if n := send(late); n != 1 {
		t.Fatalf("the late copy took %d messages", n)
	}
	// After an unguard the inbox is the node's again.
	if _, err := h.call(guarded, protocol.SubjAdmissionUnguard, map[string]any{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		before := seen(late)
		if err := h.nc.Publish(protocol.InboxSubject(guarded.Public()), []byte("{}")); err != nil {
			t.Fatal(err)
		}
		h.guard(open, map[string]any{}) // a round trip through the copy, which now takes open's inbox
		if err := h.nc.Publish(protocol.InboxSubject(open.Public()), []byte("{}")); err != nil {
			t.Fatal(err)
		}
		for seen(late) == before && time.Now().Before(deadline) {
			time.Sleep(2 * time.Millisecond)
		}
		if seen(late)-before == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the unguarded inbox still reaches the service")
		}
	}
}
