package mailbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/mailbox"
	"agentmesh.dev/mesh/shared/protocol"
)

const wait = 5 * time.Second

type harness struct {
	t  *testing.T
	m  *bustest.Bus
	nc *nats.Conn
	// client fetches as a node does: replies under a private prefix.
	client *nats.Conn
	js     jetstream.JetStream
	stream jetstream.Stream
	clock  *bustest.Clock
	ws     []*mailbox.Worker
}

// start runs a mesh with no workers and copies of the mailbox worker.
func start(t *testing.T, copies int, cfg mailbox.Config) *harness {
	t.Helper()
	m := bustest.Start(t)
	h := &harness{t: t, m: m, nc: bustest.Client(t, m), client: clientConn(t, m), clock: &bustest.Clock{}}
	h.js, _ = jetstream.New(h.nc)
	if cfg.Now == nil {
		cfg.Now = h.clock.Now
	}
	for i := range copies {
		w, err := mailbox.Start(t.Context(), bustest.Env(t, m, fmt.Sprintf("mailbox-%d", i), nil), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Stop() })
		h.ws = append(h.ws, w)
	}
	var err error
	if h.stream, err = h.js.Stream(t.Context(), protocol.MailboxStream); err != nil {
		t.Fatal(err)
	}
	return h
}

// mail publishes a signed request from sender to subject and waits until
// the stream holds it (the stream stores a no-ack publish asynchronously).
func (h *harness) mail(subject string, sender *keys.Agent, text string) []byte {
	h.t.Helper()
	e, err := protocol.New(protocol.TypeRequest, sender.Public(), map[string]any{"offering": "chat", "input": map[string]any{"text": text}})
	if err != nil {
		h.t.Fatal(err)
	}
	if err := e.Sign(sender); err != nil {
		h.t.Fatal(err)
	}
	data, err := e.Marshal()
	if err != nil {
		h.t.Fatal(err)
	}
	h.publish(subject, data)
	return data
}

// publish sends raw bytes and waits for the stream to have stored them.
func (h *harness) publish(subject string, data []byte) {
	h.t.Helper()
	before := h.stored(subject)
	if err := h.nc.Publish(subject, data); err != nil {
		h.t.Fatal(err)
	}
	h.eventually("the stream stores a message on "+subject, func() bool { return h.stored(subject) == before+1 })
}

// stored is how many messages the stream holds on subject.
func (h *harness) stored(subject string) uint64 {
	h.t.Helper()
	info, err := h.stream.Info(h.t.Context(), jetstream.WithSubjectFilter(subject))
	if err != nil {
		h.t.Fatal(err)
	}
	return info.State.Subjects[subject]
}

func (h *harness) fetch(agent keys.Signer, after uint64, limit int) ([]mailbox.Mail, mailbox.FetchResult, error) {
	ctx, cancel := context.WithTimeout(h.t.Context(), wait)
	defer cancel()
	return mailbox.Fetch(ctx, h.client, agent, after, limit)
}

// clientConn is a connection whose replies arrive under a client's private
// prefix, the only kind the mailbox answers a fetch on.
func clientConn(t *testing.T, m *bustest.Bus) *nats.Conn {
	t.Helper()
	nc, err := m.ConnectService("test-client", nats.CustomInboxPrefix(protocol.PrivateInboxPrefix("Utest")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func (h *harness) ack(agent keys.Signer, box string, upTo uint64, seqs []uint64) error {
	ctx, cancel := context.WithTimeout(h.t.Context(), wait)
	defer cancel()
	return mailbox.Ack(ctx, h.client, agent, box, upTo, seqs)
}

func (h *harness) eventually(what string, cond func() bool) {
	h.t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func texts(t *testing.T, mail []mailbox.Mail) []string {
	t.Helper()
	var out []string
	for _, m := range mail {
		env, err := protocol.Decode(m.Data)
		if err != nil {
			t.Fatalf("fetched bytes do not verify: %v", err)
		}
		var p struct {
			Input struct {
				Text string `json:"text"`
			} `json:"input"`
		}
		if err := json.Unmarshal(env.Payload, &p); err != nil {
			t.Fatal(err)
		}
		out = append(out, p.Input.Text)
	}
	return out
}

// An agent reads its own mail in order, in batches, and deletes what it
// acknowledges; the signature on the request is what decides whose mail it
// reads, so another agent's fetch or ack never touches it.
func TestFetchAndAckAreTheSignersOwn(t *testing.T) {
	h := start(t, 3, mailbox.Config{})
	a, b, sender := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)
	for i := range 5 {
		h.mail(protocol.InboxSubject(a.Public()), sender, fmt.Sprintf("for a %d", i))
	}
	h.mail(protocol.InboxSubject(b.Public()), sender, "for b")

	mail, res, err := h.fetch(a, 0, 2)
	if err != nil {
		t.Fatal(err)
	}
	if got := texts(t, mail); strings.Join(got, ",") != "for a 0,for a 1" || !res.More || res.Box != mailbox.BoxOpen || res.Last != mail[1].Seq {
		t.Fatalf("first batch %v %+v", got, res)
	}
	rest, res2, err := h.fetch(a, res.Last, 10)
	if err != nil {
		t.Fatal(err)
	}
	if got := texts(t, rest); strings.Join(got, ",") != "for a 2,for a 3,for a 4" || res2.More {
		t.Fatalf("second batch %v %+v", got, res2)
	}

	// b's ack naming a's sequences deletes nothing of a's, and a's fetch
	// signed by b's key reads b's mail, never a's.
	if err := h.ack(b, mailbox.BoxOpen, 0, []uint64{mail[0].Seq, mail[1].Seq}); err != nil {
		t.Fatal(err)
	}
	if err := h.ack(b, mailbox.BoxOpen, rest[2].Seq+100, nil); err != nil {
		t.Fatal(err)
	}
	if n := h.stored(protocol.InboxSubject(a.Public())); n != 5 {
		t.Fatalf("another agent's ack deleted a's mail: %d left", n)
	}
	bm, _, err := h.fetch(b, 0, 10)
	if err != nil || len(bm) != 0 {
		t.Fatalf("b's own box after its own purge: %d messages, %v", len(bm), err)
	}

	// a acknowledges the first two by purge and the fourth singly: the
	// third and fifth stay.
	if err := h.ack(a, mailbox.BoxOpen, mail[1].Seq+1, []uint64{rest[1].Seq}); err != nil {
		t.Fatal(err)
	}
	left, _, err := h.fetch(a, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if got := texts(t, left); strings.Join(got, ",") != "for a 2,for a 4" {
		t.Fatalf("after the ack: %v", got)
	}
}

// A forged envelope (a fetch signed by one key naming itself as another)
// is refused before any handler reads a byte of mail.
func TestFetchRefusesWhatDoesNotVerify(t *testing.T) {
	h := start(t, 1, mailbox.Config{})
	a, mallory, sender := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)
	h.mail(protocol.InboxSubject(a.Public()), sender, "secret")
	e, err := protocol.New(protocol.TypeRequest, a.Public(), mailbox.FetchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	unsigned, err := e.CanonicalUnsigned()
	if err != nil {
		t.Fatal(err)
	}
	// Mallory signs the bytes of a fetch that names a as its sender.
	e.Sig = protocol.Base64URL.Encode(mallory.Sign(append([]byte(protocol.TagEnvelope+"\n"), unsigned...)))
	data, err := e.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	inbox := h.client.NewInbox()
	sub, err := h.client.SubscribeSync(inbox + ".>")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.client.PublishRequest(protocol.SubjMailboxFetch, inbox+".r", data); err != nil {
		t.Fatal(err)
	}
	msg, err := sub.NextMsg(wait)
	if err != nil {
		t.Fatal(err)
	}
	if msg.Subject != inbox+".r" {
		t.Fatalf("a forged fetch got mail on %s", msg.Subject)
	}
	rep, err := protocol.Decode(msg.Data)
	if err != nil {
		t.Fatal(err)
	}
	if e := bus.ErrorOf(rep); e == nil || e.Code != errs.IdentityMismatch {
		t.Fatalf("forged fetch answered %s", rep.Payload)
	}

	// A reply subject outside the reply namespaces is refused too: the
	// worker never publishes mail where a request points it.
	e2, _ := protocol.New(protocol.TypeRequest, a.Public(), mailbox.FetchRequest{})
	_ = e2.Sign(a)
	data2, _ := e2.Marshal()
	spill, err := h.nc.SubscribeSync("mesh.event.spill")
	if err != nil {
		t.Fatal(err)
	}
	spillMore, err := h.nc.SubscribeSync("mesh.event.spill.>")
	if err != nil {
		t.Fatal(err)
	}
	_ = h.nc.PublishRequest(protocol.SubjMailboxFetch, "mesh.event.spill", data2)
	for _, sub := range []*nats.Subscription{spill, spillMore} {
		if m, err := sub.NextMsg(300 * time.Millisecond); err == nil {
			t.Fatalf("the worker published on %s", m.Subject)
		}
	}
}

// The stream holds at most MaxBytes in all and MaxMsgsPerAgent per inbox,
// refusing what comes after (discard new): a flood neither grows the disk
// past the bound nor evicts mail already stored.
func TestStreamLimitsRefuseTheOverflow(t *testing.T) {
	const mib = 1 << 20
	h := start(t, 1, mailbox.Config{Limits: mailbox.Limits{MaxBytes: 100 * mib, MaxMsgsPerAgent: 3, MaxMsgSize: mib}})
	sender := bustest.Agent(t)

	// Per agent: the fourth message for one inbox is not stored, the first
	// three stay.
	victim := bustest.Agent(t).Public()
	for i := range 3 {
		h.mail(protocol.InboxSubject(victim), sender, fmt.Sprintf("kept %d", i))
	}
	_ = h.nc.Publish(protocol.InboxSubject(victim), []byte("over the per-agent limit"))
	_ = h.nc.Flush()
	time.Sleep(100 * time.Millisecond)
	if n := h.stored(protocol.InboxSubject(victim)); n != 3 {
		t.Fatalf("the victim's inbox holds %d messages, want 3", n)
	}

	// In all: 101 messages of (nearly) one MiB to 101 made-up inboxes; the
	// 101st MB is refused and what was stored first stays.
	body := make([]byte, mib-1024)
	var first string
	for i := range 101 {
		subject := protocol.InboxSubject(fmt.Sprintf("junk%03d", i))
		if i == 0 {
			first = subject
		}
		if err := h.nc.Publish(subject, body); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	var info *jetstream.StreamInfo
	h.eventually("the stream to settle", func() bool {
		var err error
		info, err = h.stream.Info(t.Context())
		return err == nil && info.State.Msgs >= 99
	})
	time.Sleep(100 * time.Millisecond)
	info, _ = h.stream.Info(t.Context())
	if info.State.Bytes > 100*mib {
		t.Fatalf("the stream holds %d bytes, over its 100 MiB", info.State.Bytes)
	}
	if n := h.stored(protocol.InboxSubject("junk100")); n != 0 {
		t.Fatal("the 101st MB was stored")
	}
	if h.stored(first) != 1 || h.stored(protocol.InboxSubject(victim)) != 3 {
		t.Fatal("the flood evicted mail stored before it")
	}
	// The broker refuses silently; the worker says so.
	if !h.ws[0].WarnWhenFull(t.Context()) {
		t.Fatal("a full mailbox stream was not reported")
	}
	t.Logf("stream after the flood: %d messages, %.1f MiB", info.State.Msgs, float64(info.State.Bytes)/mib)
}

// The sweep purges mail nobody will read once it has been quiet for the
// grace period: made-up tokens, keys with no registration, sandbox agents.
// A registered agent's mail stays, however long it waits.
func TestSweepPurgesMailNobodyWillRead(t *testing.T) {
	h := start(t, 2, mailbox.Config{SweepGrace: time.Hour, SweepEvery: time.Hour})
	reg, err := bus.Bucket(t.Context(), h.js, jetstream.KeyValueConfig{Bucket: mailbox.RegistryBucket})
	if err != nil {
		t.Fatal(err)
	}
	registered, guest, unknown, sender := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)
	for _, r := range []struct {
		agent   *keys.Agent
		sandbox bool
	}{{registered, false}, {guest, true}} {
		b, _ := json.Marshal(map[string]any{"id": r.agent.Public(), "sandbox": r.sandbox})
		if _, err := reg.Put(t.Context(), r.agent.Public(), b); err != nil {
			t.Fatal(err)
		}
	}
	subjects := map[string]bool{ // subject → kept by the sweep
		protocol.InboxSubject(registered.Public()):        true,
		protocol.GuardedInboxSubject(registered.Public()): true,
		protocol.InboxSubject(guest.Public()):             false,
		protocol.InboxSubject(unknown.Public()):           false,
		protocol.InboxSubject("not-a-key"):                false,
	}
	for s := range subjects {
		h.mail(s, sender, "x")
	}

	// Within the grace period nothing goes: mail may precede a
	// registration.
	n, err := h.ws[0].Sweep(t.Context())
	if err != nil || n != 0 {
		t.Fatalf("sweep within the grace: %d %v", n, err)
	}
	h.clock.Advance(2 * time.Hour)
	if n, err = h.ws[0].Sweep(t.Context()); err != nil || n != 3 {
		t.Fatalf("sweep after the grace purged %d subjects (%v), want 3", n, err)
	}
	// A second copy sweeping the same stream finds nothing more.
	if n, err = h.ws[1].Sweep(t.Context()); err != nil || n != 0 {
		t.Fatalf("second sweep: %d %v", n, err)
	}
	for s, kept := range subjects {
		if got := h.stored(s) == 1; got != kept {
			t.Errorf("%s: kept %v, want %v", s, got, kept)
		}
	}
}

// An agent that does not fetch its mail (an upstream SDK agent never does)
// keeps only its mail of the last UnreadAge once the rule is armed (the
// readers bucket is MaxAge old); one that fetched within MaxAge keeps all
// of it, and so does every agent before the rule is armed.
func TestSweepKeepsLittleForAgentsThatDoNotFetch(t *testing.T) {
	const maxAge, unreadAge = 2 * time.Hour, 3 * time.Hour
	var fixed atomic.Pointer[time.Time] // nil: real time
	now := func() time.Time {
		if p := fixed.Load(); p != nil {
			return *p
		}
		return time.Now()
	}
	h := start(t, 2, mailbox.Config{SweepGrace: time.Hour, SweepEvery: time.Hour, Now: now,
		Limits: mailbox.Limits{MaxAge: maxAge, UnreadAge: unreadAge}})
	reg, err := bus.Bucket(t.Context(), h.js, jetstream.KeyValueConfig{Bucket: mailbox.RegistryBucket})
	if err != nil {
		t.Fatal(err)
	}
	reader, sdk, sender := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)
	for _, a := range []*keys.Agent{reader, sdk} {
		if _, err := reg.Put(t.Context(), a.Public(), []byte(`{"sandbox":false}`)); err != nil {
			t.Fatal(err)
		}
	}
	// The reader fetches (its box is empty yet): the worker notes it.
	if _, _, err := h.fetch(reader, 0, 0); err != nil {
		t.Fatal(err)
	}
	storedAt := func(subject string) time.Time {
		t.Helper()
		m, err := h.stream.GetLastMsgForSubject(t.Context(), subject)
		if err != nil {
			t.Fatal(err)
		}
		return m.Time
	}
	boxes := []string{protocol.InboxSubject(reader.Public()), protocol.InboxSubject(sdk.Public()), protocol.GuardedInboxSubject(sdk.Public())}
	for _, s := range boxes {
		h.mail(s, sender, "old")
	}
	oldest := storedAt(boxes[2])
	time.Sleep(100 * time.Millisecond)
	youngest := time.Now()
	for _, s := range boxes {
		h.mail(s, sender, "new")
	}
	if !storedAt(boxes[0]).After(oldest) {
		t.Fatal("the stream's clock did not move")
	}

	// Not armed yet: the readers bucket is new.
	if n, err := h.ws[0].Sweep(t.Context()); err != nil || n != 0 {
		t.Fatalf("sweep before the rule is armed: %d %v", n, err)
	}
	// Armed, and the old mail is older than UnreadAge: between the two.
	at := oldest.Add(youngest.Sub(oldest)/2 + unreadAge)
	fixed.Store(&at)
	if n, err := h.ws[0].Sweep(t.Context()); err != nil || n != 2 {
		t.Fatalf("sweep purged %d subjects (%v), want the two boxes of the agent that does not fetch", n, err)
	}
	if n, err := h.ws[1].Sweep(t.Context()); err != nil || n != 0 {
		t.Fatalf("second sweep: %d %v", n, err)
	}
	for i, s := range boxes {
		want := uint64(1)
		if i == 0 {
			want = 2
		}
		if got := h.stored(s); got != want {
			t.Errorf("%s holds %d, want %d", s, got, want)
		}
	}
	// What stays of the agent's mail is the new message.
	mail, _, err := h.fetch(sdk, 0, 0)
	if err != nil || len(mail) != 1 || !strings.Contains(string(mail[0].Data), `"new"`) {
		t.Fatalf("left %d messages (%v)", len(mail), err)
	}
}

// The control plane's question: registered or mail, services only.
func TestKnown(t *testing.T) {
	h := start(t, 1, mailbox.Config{})
	reg, err := bus.Bucket(t.Context(), h.js, jetstream.KeyValueConfig{Bucket: mailbox.RegistryBucket})
	if err != nil {
		t.Fatal(err)
	}
	fresh, registered, mailed, sender := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)
	if _, err := reg.Put(t.Context(), registered.Public(), []byte(`{"sandbox":false}`)); err != nil {
		t.Fatal(err)
	}
	h.mail(protocol.GuardedInboxSubject(mailed.Public()), sender, "x")
	history := mailbox.History{Bus: &bus.Caller{NC: h.nc, Key: h.m.ServicesKey()}}
	for _, tc := range []struct {
		agent     *keys.Agent
		reg, mail bool
	}{{fresh, false, false}, {registered, true, false}, {mailed, false, true}} {
		r, m, err := history.AgentHistory(t.Context(), tc.agent.Public())
		if err != nil || r != tc.reg || m != tc.mail {
			t.Errorf("%s: registered %v mail %v (%v), want %v %v", tc.agent.Public()[:8], r, m, err, tc.reg, tc.mail)
		}
	}
	// An agent key may not ask.
	_, _, err = mailbox.History{Bus: &bus.Caller{NC: h.nc, Key: fresh}}.AgentHistory(t.Context(), mailed.Public())
	if errs.CodeOf(err) != errs.Forbidden {
		t.Fatalf("an agent asked known: %v", err)
	}
}

// A mesh upgraded from the version with one durable consumer per agent:
// the worker deletes those consumers at start, keeps the mail they held,
// and moves the stream to its bounded, discard-new configuration.
func TestStartRetiresTheConsumersOfEarlierVersions(t *testing.T) {
	m := bustest.Start(t)
	nc := bustest.Client(t, m)
	js, _ := jetstream.New(nc)
	ctx := t.Context()
	old, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: protocol.MailboxStream, NoAck: true,
		Subjects: []string{protocol.InboxSubject("*"), protocol.GuardedInboxSubject("*")},
		Discard:  jetstream.DiscardOld, MaxAge: 7 * 24 * time.Hour, MaxMsgsPerSubject: 1000})
	if err != nil {
		t.Fatal(err)
	}
	a, sender := bustest.Agent(t), bustest.Agent(t)
	for _, agent := range []string{a.Public(), bustest.Agent(t).Public(), bustest.Agent(t).Public()} {
		if _, err := old.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "inbox_" + agent,
			FilterSubject: protocol.InboxSubject(agent), AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
			t.Fatal(err)
		}
	}
	e, _ := protocol.New(protocol.TypeRequest, sender.Public(), map[string]any{"offering": "chat", "input": map[string]any{}})
	_ = e.Sign(sender)
	data, _ := e.Marshal()
	if err := nc.Publish(protocol.InboxSubject(a.Public()), data); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()

	w, err := mailbox.Start(ctx, bustest.Env(t, m, "mailbox", nil), mailbox.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Stop() })
	info, err := old.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Consumers != 0 || info.Config.Discard != jetstream.DiscardNew || !info.Config.DiscardNewPerSubject || info.Config.MaxBytes != mailbox.DefaultLimits.MaxBytes {
		t.Fatalf("after the upgrade: %d consumers, config %+v", info.State.Consumers, info.Config)
	}
	fctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	mail, _, err := mailbox.Fetch(fctx, clientConn(t, m), a, 0, 10)
	if err != nil || len(mail) != 1 || string(mail[0].Data) != string(data) {
		t.Fatalf("the mail the old consumer held: %d messages, %v", len(mail), err)
	}
}

// A byte bound the broker cannot reserve on this disk (it reserves a
// stream's bound against three quarters of the free space) is halved until
// it can: the mailbox starts smaller rather than not at all.
func TestEnsureStreamFitsTheDisk(t *testing.T) {
	m := bustest.Start(t)
	js, _ := jetstream.New(bustest.Client(t, m))
	got, err := mailbox.EnsureStream(t.Context(), js, mailbox.Limits{MaxBytes: 1 << 60}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got.MaxBytes >= 1<<60 || got.MaxBytes < 16<<20 {
		t.Fatalf("bound in force %d", got.MaxBytes)
	}
	st, err := js.Stream(t.Context(), protocol.MailboxStream)
	if err != nil || st.CachedInfo().Config.MaxBytes != got.MaxBytes {
		t.Fatalf("stream bound %v, %v; want %d", st, err, got.MaxBytes)
	}
	t.Logf("the broker reserved %d GiB", got.MaxBytes>>30)
}

// A node that fetches in a loop is refused past the per-agent burst, which
// a drain never reaches.
func TestFetchesAreLimitedPerAgent(t *testing.T) {
	h := start(t, 1, mailbox.Config{})
	a, b := bustest.Agent(t), bustest.Agent(t)
	for i := range 60 {
		if _, _, err := h.fetch(a, 0, 1); err != nil {
			t.Fatalf("fetch %d: %v", i+1, err)
		}
	}
	if _, _, err := h.fetch(a, 0, 1); errs.CodeOf(err) != errs.RateLimited {
		t.Fatalf("the 61st fetch in the window: %v", err)
	}
	if _, _, err := h.fetch(b, 0, 1); err != nil {
		t.Fatalf("another agent's fetch: %v", err)
	}
	h.clock.Advance(11 * time.Second)
	if _, _, err := h.fetch(a, 0, 1); err != nil {
		t.Fatalf("a fetch in the next window: %v", err)
	}
}
