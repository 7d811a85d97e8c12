package reliability

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/devenv"
	"agentmesh.dev/mesh/shared/activity"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/mailbox"
	"agentmesh.dev/mesh/shared/protocol"
)

// crashSoak reports whether the long runs were asked for (MESH_SOAK=1).
func crashSoak() bool { return os.Getenv("MESH_SOAK") == "1" }

// crashPlan sizes the SIGKILL test: the default run is small enough for
// go test ./... on two cores; MESH_SOAK=1 kills more often under a longer
// load.
type crashPlan struct {
	kills      int
	recipients int
	// killAfter is the most the load runs, once every kind of write has
	// been acknowledged in the round, before the kill.
	killAfter time.Duration
	// accountEvery paces sign-ups, mailEvery the mail senders.
	accountEvery, mailEvery time.Duration
	keysPerAccount          int
	exchangers              int
}

func crashPlanFor() crashPlan {
	if crashSoak() {
		return crashPlan{kills: 20, recipients: 6, killAfter: 3 * time.Second, accountEvery: 150 * time.Millisecond,
			mailEvery: time.Millisecond, keysPerAccount: 3, exchangers: 3}
	}
	return crashPlan{kills: 5, recipients: 3, killAfter: 800 * time.Millisecond, accountEvery: 250 * time.Millisecond,
		mailEvery: 3 * time.Millisecond, keysPerAccount: 2, exchangers: 2}
}

// TestMeshdSurvivesSIGKILLUnderLoad runs the real meshd binary, drives a
// load through its public doors (sign-ups by mailed code, am_ keys minted
// on the admin socket and exchanged at POST /v1/bootstrap, registrations
// and mail on the bus), kills it with SIGKILL at a random point of the
// load, starts it again on the same data directory and ports, and checks
// that every write it acknowledged before the kill is there: accounts
// (their sessions work), minted keys (listed, unused ones still unused),
// consumed keys (a second exchange is refused), registrations, and mail
// in the offline mailboxes; and that mail deleted by an acknowledged ack
// does not come back. Five kills by default, twenty with MESH_SOAK=1.
func TestMeshdSurvivesSIGKILLUnderLoad(t *testing.T) {
	plan := crashPlanFor()
	bin := crashBuildMeshd(t, t.TempDir())
	m := crashNewMeshd(t, bin,
		// The load signs up far more accounts from one address than a
		// person would; the limits against floods are not under test.
		"--limit-signup-per-address", "100000/1h", "--limit-signup-per-network", "100000/1h",
		"--limit-signup-overall", "100000/1h",
		// Mail is acknowledged (deleted) as it is confirmed, but a round
		// may end before that: room for all of it.
		"--limit-mailbox-per-agent", "100000")
	started := time.Now()
	m.start()
	t.Logf("meshd ready in %s", time.Since(started).Round(time.Millisecond))

	led := newCrashLedger()
	recipients := crashRecipients(t, m, led, plan.recipients)

	var restarts []time.Duration
	var total crashTotals
	for round := 1; round <= plan.kills; round++ {
		before := led.counts()
		load := crashStartLoad(m, led, plan, round, recipients)
		if err := load.waitEveryKind(before, 60*time.Second); err != nil {
			load.stop()
			t.Fatalf("round %d: %v", round, err)
		}
		time.Sleep(rand.N(plan.killAfter))
		m.kill()
		load.stop()
		for _, err := range load.errors() {
			t.Errorf("round %d: while meshd ran: %v", round, err)
		}
		atKill := led.counts()

		start := time.Now()
		m.start()
		restarts = append(restarts, time.Since(start))
		crashVerify(t, m, led, recipients, round)
		if t.Failed() {
			t.FailNow()
		}
		k := atKill
		t.Logf("round %d: SIGKILL after %d accounts, %d keys minted (%d exchanged, %d of them spares of an earlier round, %d exchanges cut off), "+
			"%d registrations, %d mail sent (%d stored and unread, %d deleted by acks); restarted in %s and all of it checked",
			round, k.accounts, k.keys, k.consumed, k.sparesUsed, k.inFlight, k.registered, k.sent, k.stored, k.deleted,
			restarts[len(restarts)-1].Round(time.Millisecond))
		total.add(k, before)
	}
	t.Logf("%d SIGKILLs and restarts (slowest restart %s); acknowledged before the kills: %d accounts, %d keys minted, %d exchanged, "+
		"%d registrations, %d mail stored unread at a kill; all there after each restart",
		plan.kills, slices.Max(restarts).Round(time.Millisecond), total.last.accounts, total.last.keys, total.last.consumed,
		total.last.registered, total.storedAtKills)
}

// crashTotals sums what the rounds left for the restarts to find.
type crashTotals struct {
	last          crashCounts
	storedAtKills int
}

func (t *crashTotals) add(atKill, _ crashCounts) {
	t.last = atKill
	t.storedAtKills += atKill.stored
}

// crashRecipient is an agent that is registered and never listens: all
// its mail waits in the mailbox stream.
type crashRecipient struct {
	crashAgent
}

// crashRecipients makes an account with n agents, exchanged and
// registered, before the first kill.
func crashRecipients(t *testing.T, m *crashMeshd, led *crashLedger, n int) []*crashRecipient {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	c := crashNewClient(m)
	acct, session, err := c.signUp(ctx, m, "recipients@crash.test")
	if err != nil {
		t.Fatal(err)
	}
	led.accounts[acct] = session
	var out []*crashRecipient
	for i := range n {
		id, token, err := c.mintKey(ctx, acct, fmt.Sprintf("recipient-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		agent := crashNewAgent(t)
		cred, err := c.bootstrap(ctx, token, agent)
		if err != nil {
			t.Fatal(err)
		}
		r := &crashRecipient{crashAgent{key: agent, cred: cred}}
		led.keys = append(led.keys, &crashKey{id: id, token: token, account: acct, attempted: true, consumed: &r.crashAgent})
		nc, err := cred.connect(m.urls.MeshTCP, "recipient")
		if err != nil {
			t.Fatal(err)
		}
		err = crashRegister(ctx, nc, agent, cred.Node)
		nc.Close()
		if err != nil {
			t.Fatal(err)
		}
		led.registered[agent.Public()] = cred.Node.Public()
		out = append(out, r)
	}
	return out
}

func crashNewAgent(t *testing.T) *keys.Agent {
	t.Helper()
	k, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// crashLoad is one round's load, running until the kill.
type crashLoad struct {
	m          *crashMeshd
	led        *crashLedger
	plan       crashPlan
	round      int
	recipients []*crashRecipient
	c          *crashClient

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	conns   []*nats.Conn
	senders []*crashAgentConn
	errs    []error
	// progress of this round: deletions acknowledged by the mailbox.
	ackedDeletes int

	toRegister chan *crashAgent
}

type crashAgentConn struct {
	agent *keys.Agent
	nc    *nats.Conn
}

func crashStartLoad(m *crashMeshd, led *crashLedger, plan crashPlan, round int, recipients []*crashRecipient) *crashLoad {
	ctx, cancel := context.WithCancel(context.Background())
	l := &crashLoad{m: m, led: led, plan: plan, round: round, recipients: recipients, c: crashNewClient(m),
		ctx: ctx, cancel: cancel, toRegister: make(chan *crashAgent, 1024)}
	l.run(l.signUps)
	for range plan.exchangers {
		l.run(l.exchanges)
	}
	l.run(l.registrations)
	l.run(l.mail)
	l.run(l.confirmations)
	return l
}

func (l *crashLoad) run(f func()) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		f()
	}()
}

// stop ends the load (after the kill: everything in flight has failed or
// fails at once) and closes its connections.
func (l *crashLoad) stop() {
	l.cancel()
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, nc := range l.conns {
		nc.Close()
	}
}

// fail records a refusal the mesh answered while it ran: with meshd alive
// nothing in the load should be refused, and a request cut off by the kill
// fails without an answer (statusOf 0).
func (l *crashLoad) fail(what string, err error) {
	if crashStatusOf(err) == 0 || l.ctx.Err() != nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs = append(l.errs, fmt.Errorf("%s: %w", what, err))
}

func (l *crashLoad) errors() []error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.errs
}

func (l *crashLoad) keep(nc *nats.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.conns = append(l.conns, nc)
}

func (l *crashLoad) pause(d time.Duration) bool {
	select {
	case <-l.ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// waitEveryKind waits until this round has had at least one acknowledged
// write of every kind beyond before, so each kill lands with every kind
// in flight and something of each to check.
func (l *crashLoad) waitEveryKind(before crashCounts, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		c := l.led.counts()
		l.mu.Lock()
		deletes := l.ackedDeletes
		l.mu.Unlock()
		if c.accounts > before.accounts && c.keys > before.keys && c.consumed > before.consumed &&
			(l.round == 1 || c.sparesUsed > before.sparesUsed) && c.registered > before.registered &&
			c.stored+c.deleted > before.stored+before.deleted && deletes > 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the load acknowledged too little in %s: %+v (before %+v), %d deletes; errors %v",
				timeout, c, before, deletes, l.errors())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// signUps makes accounts by mailed code and mints keys for each.
func (l *crashLoad) signUps() {
	for n := 0; ; n++ {
		email := fmt.Sprintf("r%d-%d@crash.test", l.round, n)
		id, session, err := l.c.signUp(l.ctx, l.m, email)
		if err != nil {
			l.fail("sign-up", err)
			return
		}
		l.led.mu.Lock()
		l.led.accounts[id] = session
		l.led.mu.Unlock()
		// One more key than the round exchanges: the spare waits for the
		// next round, across the kill.
		for i := range l.plan.keysPerAccount + 1 {
			kid, token, err := l.c.mintKey(l.ctx, id, fmt.Sprintf("agent-%d", i))
			if err != nil {
				l.fail("mint", err)
				return
			}
			l.led.mu.Lock()
			l.led.keys = append(l.led.keys, &crashKey{id: kid, token: token, account: id, round: l.round,
				spare: i == l.plan.keysPerAccount})
			l.led.mu.Unlock()
		}
		if !l.pause(l.plan.accountEvery) {
			return
		}
	}
}

// exchanges spends minted keys (of this round or an earlier one: a key
// minted before a kill must still work after it).
func (l *crashLoad) exchanges() {
	for l.ctx.Err() == nil {
		k := l.led.takeKey(l.round)
		if k == nil {
			if !l.pause(10 * time.Millisecond) {
				return
			}
			continue
		}
		agent, err := keys.Generate[keys.AgentRole]()
		if err != nil {
			panic(err)
		}
		cred, err := l.c.bootstrap(l.ctx, k.token, agent)
		if err != nil {
			l.fail("bootstrap", err)
			return
		}
		a := &crashAgent{key: agent, cred: cred}
		l.led.mu.Lock()
		k.consumed = a
		l.led.mu.Unlock()
		select {
		case l.toRegister <- a:
		default: // enough agents waiting to register
		}
	}
}

// registrations connects exchanged agents and registers them; each then
// sends mail.
func (l *crashLoad) registrations() {
	for {
		var a *crashAgent
		select {
		case <-l.ctx.Done():
			return
		case a = <-l.toRegister:
		}
		nc, err := a.cred.connect(l.m.urls.MeshTCP, "sender")
		if err != nil {
			return // the kill
		}
		l.keep(nc)
		ctx, cancel := context.WithTimeout(l.ctx, 10*time.Second)
		err = crashRegister(ctx, nc, a.key, a.cred.Node)
		cancel()
		if err != nil {
			return // the kill: the registry answers every well-formed registration
		}
		l.led.mu.Lock()
		l.led.registered[a.key.Public()] = a.cred.Node.Public()
		l.led.mu.Unlock()
		l.mu.Lock()
		l.senders = append(l.senders, &crashAgentConn{agent: a.key, nc: nc})
		l.mu.Unlock()
	}
}

// mail sends from the registered agents to the recipients, round robin.
func (l *crashLoad) mail() {
	for n := 0; l.pause(l.plan.mailEvery); n++ {
		l.mu.Lock()
		if len(l.senders) == 0 {
			l.mu.Unlock()
			continue
		}
		s := l.senders[n%len(l.senders)]
		l.mu.Unlock()
		to := l.recipients[n%len(l.recipients)].key.Public()
		// Recorded before the publish: a publish the kill cuts off is sent
		// and never confirmed, which the checks allow.
		id, err := crashMailTo(s.nc, s.agent, to, n)
		if id != "" {
			l.led.mu.Lock()
			l.led.sent[id] = to
			l.led.mu.Unlock()
		}
		if err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			return
		}
	}
}

// confirmations reads each recipient's mailbox as its node would, marks
// what it finds confirmed, and every other pass acknowledges (deletes) it.
func (l *crashLoad) confirmations() {
	conns := make([]*nats.Conn, len(l.recipients))
	for i, r := range l.recipients {
		nc, err := r.cred.connect(l.m.urls.MeshTCP, "recipient")
		if err != nil {
			return
		}
		l.keep(nc)
		conns[i] = nc
	}
	// Within the mailbox's fetch limit (60 per agent in 10 s).
	for pass := 0; l.pause(300 * time.Millisecond); pass++ {
		for i, r := range l.recipients {
			ctx, cancel := context.WithTimeout(l.ctx, 10*time.Second)
			ids, box, _, err := crashMailbox(ctx, conns[i], r.key)
			if err == nil {
				l.led.mu.Lock()
				for _, id := range ids {
					if _, ok := l.led.acked[id]; !ok {
						l.led.confirmed[id] = r.key.Public()
					}
				}
				l.led.mu.Unlock()
				if upTo := crashOlderHalf(ids); pass%2 == 1 && upTo > 0 {
					// The older half: the newer stays stored and unread, for
					// the restart to find whenever the kill comes.
					err = mailbox.Ack(ctx, conns[i], r.key, box, upTo, nil)
					if err == nil {
						n := 0
						l.led.mu.Lock()
						for seq, id := range ids {
							if seq < upTo {
								delete(l.led.confirmed, id)
								l.led.acked[id] = r.key.Public()
								n++
							}
						}
						l.led.mu.Unlock()
						l.mu.Lock()
						l.ackedDeletes += n
						l.mu.Unlock()
					}
				}
			}
			cancel()
			if err != nil {
				return // the kill
			}
		}
	}
}

// crashOlderHalf is the ack's up_to that deletes the older half of the
// mail read (0 when there are fewer than two).
func crashOlderHalf(ids map[uint64]string) uint64 {
	if len(ids) < 2 {
		return 0
	}
	seqs := slices.Sorted(maps.Keys(ids))
	return seqs[len(seqs)/2]
}

// crashVerify checks, on the restarted meshd, every write the ledger
// holds, then acknowledges the mail it read so the boxes stay small.
func crashVerify(t *testing.T, m *crashMeshd, led *crashLedger, recipients []*crashRecipient, round int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	c := crashNewClient(m)
	led.mu.Lock()
	defer led.mu.Unlock()

	// Accounts: each session still signs in.
	for id, session := range led.accounts {
		out, err := c.call(ctx, http.MethodGet, "/v1/session", nil, session)
		if err != nil || out["account_id"] != id {
			t.Errorf("round %d: account %s: the session acknowledged before the kill does not work: %v %v", round, id, out, err)
		}
	}

	// Minted keys: listed, in the state the load left them.
	byAccount := map[string][]*crashKey{}
	for _, k := range led.keys {
		byAccount[k.account] = append(byAccount[k.account], k)
	}
	for acct, ks := range byAccount {
		listed, err := c.agentTokens(ctx, acct, led.accounts[acct])
		if err != nil {
			t.Errorf("round %d: account %s: list agent keys: %v", round, acct, err)
			continue
		}
		for _, k := range ks {
			got, ok := listed[k.id]
			switch {
			case !ok:
				t.Errorf("round %d: minted key %s of account %s is gone", round, k.id, acct)
			case k.consumed != nil && (got["state"] != "used" || got["agent_id"] != k.consumed.key.Public()):
				t.Errorf("round %d: key %s was exchanged for %s before the kill; now %v", round, k.id, k.consumed.key.Public(), got)
			case !k.attempted && got["state"] != "unused":
				t.Errorf("round %d: key %s was never exchanged; now %v", round, k.id, got)
			}
		}
	}

	// Consumed keys: a second exchange, even the same one again, is refused.
	for _, k := range led.keys {
		if k.consumed == nil {
			continue
		}
		_, err := c.bootstrap(ctx, k.token, k.consumed.key)
		if crashStatusOf(err) != http.StatusUnauthorized {
			t.Errorf("round %d: key %s was spent before the kill; exchanging it again: %v, want 401", round, k.id, err)
		}
	}

	// Registrations, read through a recipient's credential.
	asker := recipients[0]
	nc, err := asker.cred.connect(m.urls.MeshTCP, "verify")
	if err != nil {
		t.Fatalf("round %d: connect after the restart: %v", round, err)
	}
	defer nc.Close()
	for agent, node := range led.registered {
		got, err := crashRegistration(ctx, nc, asker.key, agent)
		if err != nil || got != node {
			t.Errorf("round %d: agent %s registered (node %s) before the kill; now %q, %v", round, agent, node, got, err)
		}
	}

	// Mail: everything confirmed is there, nothing acknowledged came back,
	// nothing is there that nobody sent. Then it is acknowledged.
	for _, r := range recipients {
		rc, err := r.cred.connect(m.urls.MeshTCP, "verify-recipient")
		if err != nil {
			t.Fatalf("round %d: connect after the restart: %v", round, err)
		}
		ids, box, last, err := crashMailbox(ctx, rc, r.key)
		if err != nil {
			rc.Close()
			t.Fatalf("round %d: fetch %s's mail: %v", round, r.key.Public(), err)
		}
		have := map[string]bool{}
		for seq, id := range ids {
			have[id] = true
			switch to, sent := led.sent[id]; {
			case !sent || to != r.key.Public():
				t.Errorf("round %d: %s's mailbox holds #%d %s, which the load never sent it", round, r.key.Public(), seq, id)
			case led.acked[id] != "":
				t.Errorf("round %d: mail %s was deleted by an acknowledged ack before the kill and is back (#%d)", round, id, seq)
			}
		}
		for id, to := range led.confirmed {
			if to == r.key.Public() && !have[id] {
				t.Errorf("round %d: mail %s to %s was stored before the kill and is gone", round, id, to)
			}
		}
		if len(ids) > 0 {
			if err := mailbox.Ack(ctx, rc, r.key, box, last+1, nil); err != nil {
				t.Errorf("round %d: ack: %v", round, err)
			} else {
				for _, id := range ids {
					delete(led.confirmed, id)
					led.acked[id] = r.key.Public()
				}
			}
		}
		rc.Close()
	}
}

// TestWorkerCopyCrashUnderLoad runs the whole mesh in-process with three
// copies of every worker, as the cloud runs them, under a load of
// registrations, mail to offline agents drained as nodes drain it, and
// answers on agent outboxes; it kills copy 1 of every worker and later copy
// 2 (their connections closed at the broker, which is all the rest of the
// mesh sees of a process dying; ten kills with MESH_SOAK=1), and each
// comes back as Cloud Run would bring it back (its client reconnects). A request a dying copy held is
// not answered; its caller's retry is, by another copy. Checked: every
// registration acknowledged is there, every mail sent is fetched and
// deleted (fetched twice only where an ack went unanswered), and the taps
// of the copies back record everything sent after they returned.
func TestWorkerCopyCrashUnderLoad(t *testing.T) {
	ctx := t.Context()
	m, err := devenv.Start(ctx, devenv.Config{DataDir: t.TempDir(), Workers: devenv.WorkerConfig{Copies: 3}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	conn := func(name string, opts ...nats.Option) *nats.Conn {
		nc, err := m.ConnectService(name, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	caller := conn("load")
	sys, err := m.ConnectSystem("kick")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sys.Close)
	account := m.Trust().PublicKeys().MeshAccount

	lctx, stopLoad := context.WithCancel(ctx)
	var lwg sync.WaitGroup
	run := func(f func()) {
		lwg.Add(1)
		go func() { defer lwg.Done(); f() }()
	}

	// Registrations from six callers at once, so that a dying copy is
	// likely to hold some, each tried until the registry answers it.
	var regMu sync.Mutex
	registered := map[string]string{}
	var retries atomic.Int64
	for range 6 {
		run(func() {
			for lctx.Err() == nil {
				agent, node := crashNewAgent(t), crashNewNode(t)
				for lctx.Err() == nil {
					rctx, cancel := context.WithTimeout(lctx, 2*time.Second)
					err := crashRegister(rctx, caller, agent, node)
					cancel()
					if err == nil {
						regMu.Lock()
						registered[agent.Public()] = node.Public()
						regMu.Unlock()
						break
					}
					retries.Add(1)
				}
			}
		})
	}

	// Mail to offline agents, drained as nodes drain it.
	offline := make([]*keys.Agent, 20)
	for i := range offline {
		offline[i] = crashNewAgent(t)
	}
	sender := crashNewAgent(t)
	var mailMu sync.Mutex
	var sentMail []burstMsg
	run(func() {
		for n := 0; lctx.Err() == nil; n++ {
			to := offline[n%len(offline)].Public()
			id, err := crashMailTo(caller, sender, to, n)
			if err != nil {
				t.Error(err)
				return
			}
			mailMu.Lock()
			sentMail = append(sentMail, burstMsg{id: id})
			mailMu.Unlock()
			time.Sleep(2 * time.Millisecond)
		}
	})
	drained := newBurstDrain()
	drained.timeout = 2 * time.Second
	dctx, stopDrain := context.WithCancel(ctx)
	var dwg sync.WaitGroup
	drainer := conn("drainer", nats.CustomInboxPrefix(protocol.PrivateInboxPrefix("Ucrash")))
	for _, a := range offline {
		dwg.Add(1)
		go func() { defer dwg.Done(); drained.drain(dctx, drainer, a) }()
	}
	defer func() { stopDrain(); dwg.Wait() }()

	// Answers on outboxes, for the activity taps.
	performer, requester := crashNewAgent(t), crashNewAgent(t)
	answer := func() []byte {
		e, err := protocol.New(protocol.TypeRespond, performer.Public(), map[string]any{"status": "completed", "output": map[string]any{"text": "ok"}})
		if err != nil {
			t.Fatal(err)
		}
		e.To, e.InReplyTo = requester.Public(), protocol.NewID()
		return burstSign(t, e, performer)
	}
	run(func() {
		for lctx.Err() == nil {
			if err := caller.Publish(protocol.OutboxSubject(performer.Public()), answer()); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	})

	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(60 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	waitFor("the load to get going", func() bool {
		regMu.Lock()
		defer regMu.Unlock()
		return len(registered) >= 5 && drained.count() >= 50
	})

	// Kill copy 1 of every worker, then copy 2, each once the one before is
	// back and serving.
	kills, rounds := 0, []string{"-1", "-2"}
	if crashSoak() {
		rounds = slices.Repeat(rounds, 5)
	}
	for _, copyN := range rounds {
		server, all, err := crashConnz(ctx, sys, account, "worker-")
		if err != nil {
			t.Fatal(err)
		}
		victims := map[string]uint64{}
		for name, cid := range all {
			if strings.HasSuffix(name, copyN) {
				victims[name] = cid
			}
		}
		if len(victims) == 0 {
			t.Fatalf("no worker connection ends in %s: %v", copyN, all)
		}
		if err := crashKick(ctx, sys, server, victims); err != nil {
			t.Fatal(err)
		}
		kills += len(victims)
		waitFor("the killed copies to come back", func() bool {
			_, now, err := crashConnz(ctx, sys, account, "worker-")
			if err != nil {
				return false
			}
			for name, cid := range victims {
				if c, ok := now[name]; !ok || c == cid {
					return false
				}
			}
			return true
		})
		time.Sleep(300 * time.Millisecond) // load on the copy that came back
	}

	stopLoad()
	lwg.Wait()

	// Every registration the registry answered is there: read in one pass
	// over the registry's bucket (thousands of them), and a sample through
	// mesh.registry.get as a client reads them.
	js, err := jetstream.New(caller)
	if err != nil {
		t.Fatal(err)
	}
	stored := crashRegistryNodes(t, js)
	regMu.Lock()
	n := 0
	for agent, node := range registered {
		if stored[agent] != node {
			t.Errorf("registration of %s (node %s) acknowledged; the registry holds %q", agent, node, stored[agent])
		}
		if n++; n <= 50 {
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			got, err := crashRegistration(rctx, caller, sender, agent)
			cancel()
			if err != nil || got != node {
				t.Errorf("registration of %s acknowledged; mesh.registry.get answers %q %v", agent, got, err)
			}
		}
	}
	nreg := len(registered)
	regMu.Unlock()

	// Every mail sent is fetched and deleted.
	mailMu.Lock()
	sent := slices.Clone(sentMail)
	mailMu.Unlock()
	waitFor("every mail to be fetched", func() bool { return drained.count() >= len(sent) })
	if err := drained.check(sent); err != nil {
		t.Error(err)
	}
	st, err := js.Stream(ctx, protocol.MailboxStream)
	if err != nil {
		t.Fatal(err)
	}
	waitFor("the mailbox stream to empty", func() bool {
		info, err := st.Info(ctx)
		return err == nil && info.State.Msgs == 0
	})

	// The taps, all three copies back, record everything sent now.
	taps := m.Workers().Activity
	var before activity.Stats
	waitFor("the taps to settle", func() bool {
		s := burstTapStats(taps)
		time.Sleep(300 * time.Millisecond)
		before = burstTapStats(taps)
		return s == before
	})
	const after = 300
	for range after {
		if err := caller.Publish(protocol.OutboxSubject(performer.Public()), answer()); err != nil {
			t.Fatal(err)
		}
	}
	waitFor("the taps to record the answers sent after the kills", func() bool {
		return burstTapStats(taps).Recorded >= before.Recorded+2*after
	})
	if s := burstTapStats(taps); s.Recorded != before.Recorded+2*after || s.Duplicates != before.Duplicates {
		t.Errorf("taps %+v after %d answers, from %+v", s, after, before)
	}
	t.Logf("killed %d worker connections in %d rounds (one copy of every worker each, copies 1 and 2 in turn); %d registrations acknowledged, %d retried after no answer; "+
		"%d mails sent and fetched (%d fetches or acks failed and were tried again); taps recorded %d items (%d overflowed)",
		kills, len(rounds), nreg, retries.Load(), len(sent), drained.failures(), before.Recorded, before.Overflow)
}

// crashRegistryNodes reads every registration in mesh_registry: the node
// each names, by agent.
func crashRegistryNodes(t *testing.T, js jetstream.JetStream) map[string]string {
	t.Helper()
	kv, err := js.KeyValue(t.Context(), "mesh_registry")
	if err != nil {
		t.Fatal(err)
	}
	w, err := kv.WatchAll(t.Context(), jetstream.IgnoreDeletes())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	out := map[string]string{}
	for e := range w.Updates() {
		if e == nil {
			return out // the initial values are in
		}
		var rec struct {
			Node struct {
				ID string `json:"id"`
			} `json:"node"`
		}
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			t.Fatalf("registration %s: %v", e.Key(), err)
		}
		out[e.Key()] = rec.Node.ID
	}
	t.Fatal("the registry watch ended early")
	return nil
}

func crashNewNode(t *testing.T) *keys.Node {
	t.Helper()
	k, err := keys.Generate[keys.NodeRole]()
	if err != nil {
		t.Fatal(err)
	}
	return k
}
