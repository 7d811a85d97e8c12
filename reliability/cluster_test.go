// Package reliability_test is the mesh's reliability suite: whole meshes
// (devenv) under load while parts of them fail, with assertions on what
// was acknowledged, never on how long anything took.
//
// This file: the mesh on a three-server JetStream cluster, every worker in
// three copies, one server killed mid-load and restarted. MESH_SOAK=1
// turns the short run (one loss, a small load; the default in go test
// ./...) into a soak of MESH_SOAK_DURATION (10m by default) that kills
// each server in turn.
package reliability_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/adapter/node"
	"agentmesh.dev/mesh/devenv"
	"agentmesh.dev/mesh/shared/broker"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/creds"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/registry"
)

// A mesh on three servers, with three copies of every worker, under a load
// of registrations, agent requests, tasks, feed emits and offline mail,
// loses the server that leads the most streams and gets it back (in turn
// each server, over and over, in the soak). Then:
//   - every acknowledged registration is in the registry, on its node, and
//     no agent was announced registered twice;
//   - every request a caller got an answer to was handled exactly once,
//     no request was handled twice, and every handled request was answered
//     exactly once (late answers included);
//   - every task read back completed still reads completed with its output;
//   - the feed holds at least the newest sequence read back;
//   - every message the mailbox worker returned is delivered to its
//     recipient exactly once when it comes online, and no mail twice;
//   - every stream and bucket is back to three current replicas.
//
// The mesh keeps serving while a server is down: the run waits (with a
// deadline, not a clock) for requests and registrations answered during
// the outage before it restarts the server.
func TestClusterSurvivesAServerLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a mesh on a three-server cluster under load")
	}
	soak := soakDuration(t)
	budget := 3 * time.Minute
	if soak > 0 {
		budget = soak + 5*time.Minute
	}
	ctx, cancel := context.WithTimeout(t.Context(), budget)
	defer cancel()
	started := time.Now()

	cm := startClusterMesh(t)
	fail := &failures{}
	events, stopEvents := cm.registeredEvents()
	defer stopEvents()

	req := &requests{cm: cm, fail: fail}
	defer req.close()
	if err := req.open(ctx, 4, 2); err != nil {
		t.Fatal(err)
	}
	fd := &feed{cm: cm, fail: fail}
	if err := fd.open(ctx); err != nil {
		t.Fatal(err)
	}
	defer fd.node.Close()
	ml := &mail{cm: cm, fail: fail}
	if err := ml.open(ctx, mailBoxes(max(soak, 2*time.Minute)), 200); err != nil {
		t.Fatal(err)
	}
	reg := &registrations{cm: cm, fail: fail}
	defer reg.close()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	goLoad := func(f func()) { wg.Add(1); go func() { defer wg.Done(); f() }() }
	for g := range len(req.callers) {
		goLoad(func() { req.callLoop(ctx, stop, g) })
	}
	goLoad(func() { req.taskLoop(ctx, stop) })
	goLoad(func() { reg.run(ctx, stop) })
	goLoad(func() { fd.run(ctx, stop) })
	goLoad(func() { ml.run(ctx, stop) })
	stopLoad := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopLoad()

	// progress waits until every load has moved on by the given amounts
	// since the last call.
	type mark struct{ answered, regs, tasks, feed, mail int }
	read := func() mark {
		return mark{int(req.inTime.Load()), reg.acked.len(), req.tasksAcked.len(), int(fd.acked.Load()), ml.acked.len()}
	}
	last := read()
	progress := func(what string, want mark) {
		t.Helper()
		from := last
		pctx, cancel := context.WithTimeout(ctx, phaseLimit)
		defer cancel()
		for {
			now := read()
			if now.answered-from.answered >= want.answered && now.regs-from.regs >= want.regs &&
				now.tasks-from.tasks >= want.tasks && now.feed-from.feed >= want.feed && now.mail-from.mail >= want.mail {
				break
			}
			select {
			case <-pctx.Done():
				t.Fatalf("%s: no progress in %s: from %+v to %+v, wanted %+v more; failures: %s", what, phaseLimit, from, now, want, fail)
			case <-time.After(50 * time.Millisecond):
			}
		}
		last = read()
	}

	progress("the load getting going", mark{answered: 40, regs: 8, tasks: 3, feed: 10, mail: 10})
	cycles := 0
	var killed []string
	for {
		victim := cm.mostLeader(ctx)
		killed = append(killed, cm.c.ServerName(victim))
		if err := cm.c.Kill(victim); err != nil {
			t.Fatal(err)
		}
		progress(fmt.Sprintf("the mesh serving with %s down", cm.c.ServerName(victim)),
			mark{answered: 40, regs: 4, tasks: 2, feed: 5, mail: 5})
		if err := cm.c.Restart(ctx, victim); err != nil {
			t.Fatal(err)
		}
		progress(fmt.Sprintf("the mesh serving after %s returned", cm.c.ServerName(victim)),
			mark{answered: 40, regs: 4, tasks: 2, feed: 5, mail: 5})
		cycles++
		if soak == 0 || time.Since(started) > soak {
			break
		}
		// Full replication before the next loss: a second loss while the
		// first server still catches up would leave some streams without
		// a quorum, which R3 does not promise to survive.
		if _, err := broker.WaitReplicated(ctx, cm.js); err != nil {
			t.Fatal(err)
		}
	}
	stopLoad()

	// The cluster is whole again: every stream and bucket has three current
	// replicas.
	rs, err := broker.WaitReplicated(ctx, cm.js)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.Replicas != 3 {
			t.Errorf("%s is R%d", r.Stream, r.Replicas)
		}
	}

	// Registrations: every acknowledged one is there, on its node; none
	// announced twice.
	regKV, err := cm.js.KeyValue(ctx, registry.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	stored := map[string]string{}
	if err := bus.EachValue(ctx, regKV, func(key string, v []byte) {
		var rec struct {
			Node struct {
				ID string `json:"id"`
			} `json:"node"`
		}
		if jsonUnmarshal(v, &rec) == nil {
			stored[key] = rec.Node.ID
		}
	}); err != nil {
		t.Fatal(err)
	}
	for agent, nodeID := range reg.acked.snapshot() {
		if got, ok := stored[agent]; !ok {
			t.Errorf("acknowledged registration of %s lost", agent)
		} else if got != nodeID {
			t.Errorf("registration of %s names node %s, not %s", agent, got, nodeID)
		}
	}
	if dup := events.over(1); len(dup) > 0 {
		t.Errorf("agents announced registered more than once: %v", dup)
	}

	// Requests: drain the responders' boxes (every request is in the
	// mailbox stream too, answered live or not). Then no request was
	// handled twice or answered twice, and every answered one was handled
	// exactly once. An answer is a publish: one in flight through the
	// server that went away is lost with it, and its caller saw
	// TRANSPORT_TIMEOUT (the request is not acknowledged, and it is not
	// run again unless the caller asks again); those are counted.
	for _, a := range req.responders {
		for a.DrainNow() > 0 {
		}
	}
	sent := req.sent.snapshot()
	unanswered := func() int {
		n := 0
		for id := range sent {
			if req.handled.get(id) > 0 && req.answered.get(id) == 0 {
				n++
			}
		}
		return n
	}
	// Late answers (of requests drained just now) are on their way: wait
	// for them a little, then count what is still missing.
	lateCtx, lateCancel := context.WithTimeout(ctx, 5*time.Second)
	for unanswered() > 0 && lateCtx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
	}
	lateCancel()
	for _, a := range req.responders {
		if n := a.DrainNow(); n > 0 {
			t.Errorf("a responder's box still held %d requests after it was drained", n)
		}
	}
	lostRequests, lostAnswers := 0, 0
	for id := range sent {
		h, a := req.handled.get(id), req.answered.get(id)
		switch {
		case h > 1:
			t.Errorf("request %s handled %d times", id, h)
		case a > 1:
			t.Errorf("request %s answered %d times", id, a)
		case a == 1 && h != 1:
			t.Errorf("request %s answered but handled %d times", id, h)
		case h == 1 && a == 0:
			lostAnswers++
		case h == 0:
			lostRequests++ // never delivered: the caller saw an error, nothing was acknowledged
		}
	}

	// Tasks: every one read back completed still is, with its output.
	for id, n := range req.tasksAcked.snapshot() {
		rec, err := readTask(ctx, req.callers[0], req.responders[0].ID(), id)
		if err != nil {
			t.Errorf("acknowledged task %s: %v", id, err)
			continue
		}
		out, _ := rec["output"].(map[string]any)
		if rec["state"] != "completed" || out == nil || out["n"] != n {
			t.Errorf("acknowledged task %s reads %v", id, rec)
		}
	}

	// Feed: it holds the newest sequence read back, or a newer one.
	seq, err := fd.read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if seq < fd.acked.Load() {
		t.Errorf("the feed went back from %d to %d", fd.acked.Load(), seq)
	}

	// Mail: the recipients come online; every message the mailbox returned
	// is delivered exactly once, none twice.
	back, err := ml.deliver(ctx)
	if err != nil {
		t.Fatal(err)
	}
	closeBack := func() {
		for _, n := range back {
			_ = n.Close()
		}
	}
	defer closeBack()
	ackedMail := ml.acked.snapshot()
	for id := range ackedMail {
		if n := ml.handled.get(id); n != 1 {
			t.Errorf("acknowledged mail %s delivered %d times", id, n)
		}
	}
	if dup := ml.handled.over(1); len(dup) > 0 {
		t.Errorf("mail delivered more than once: %v", dup)
	}

	t.Logf("%d cycle(s) in %s, servers killed in turn: %v", cycles, time.Since(started).Round(time.Second), killed)
	t.Logf("registrations acknowledged %d (announced %d); requests sent %d, answered in time %d, handled %d, never delivered %d, answer lost %d; tasks acknowledged %d, left unconfirmed %d; feed sent %d, acknowledged up to %d, holds %d; mail sent %d, acknowledged %d, delivered %d",
		reg.acked.len(), events.len(), len(sent), req.inTime.Load(), req.handled.len(), lostRequests, lostAnswers,
		req.tasksAcked.len(), req.tasksUnacked.Load(), fd.sent.Load(), fd.acked.Load(), seq,
		ml.sent.len(), len(ackedMail), ml.handled.len())
	t.Logf("failed operations (not acknowledged, so allowed): %s", fail)

	// The mesh stops, its nodes first: no worker is left waiting on
	// something the lost server took with it, and every server stops.
	req.close()
	reg.close()
	_ = fd.node.Close()
	closeBack()
	stopStart := time.Now()
	stopped := make(chan error, 1)
	go func() {
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		stopped <- cm.m.Shutdown(sctx)
	}()
	select {
	case err := <-stopped:
		if err != nil {
			t.Errorf("stopping the mesh: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("the mesh did not stop after the server loss")
	}
	// Shutdown returns at its deadline with the servers still writing;
	// the data directory's lock is released once they have stopped.
	waitFor(ctx, t, "the servers stopping", func() bool {
		l, err := devenv.LockDataDir(cm.dir, "reliability test")
		if err == nil {
			_ = l.Unlock()
		}
		return err == nil
	})
	t.Logf("the mesh stopped in %s", time.Since(stopStart).Round(time.Millisecond))
}

// phaseLimit bounds each phase of the run: a load that makes no progress
// for this long is stuck, and the test says where rather than hang.
const phaseLimit = time.Minute

// A credential revoked while one server is down cannot use that server
// once it is back: the revocation, pushed once to the two running servers,
// reaches the third from them, and the broker there refuses the key.
func TestClusterRevocationReachesAServerThatWasDown(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a mesh on a three-server cluster")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cm := startClusterMesh(t)

	// A node credential, connected to the server about to go down.
	const down = 2
	roster := newAgentKeys(t, 1)
	nk, userJWT := mintNode(t, cm, roster)
	signNonce := nk.SignNonce
	nc, err := nats.Connect(cm.c.ClientURLs()[down], nats.UserJWT(func() (string, error) { return userJWT, nil }, signNonce),
		nats.MaxReconnects(0), quietErrors)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	if err := cm.c.Kill(down); err != nil {
		t.Fatal(err)
	}
	// Revoked through the mesh, as the control plane revokes, while the
	// server is down.
	if err := cm.m.Revoke(ctx, []string{nk.Public()}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := cm.c.Restart(ctx, down); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "the returned server learning the revocation", func() bool {
		ac, err := cm.c.Server(down).MeshAccountClaims()
		return err == nil && !creds.RevokedAt(ac, nk.Public()).IsZero()
	})
	// Every server holds it, and the returned one refuses the key.
	for i := range cm.c.Size() {
		ac, err := cm.c.Server(i).MeshAccountClaims()
		if err != nil || creds.RevokedAt(ac, nk.Public()).IsZero() {
			t.Errorf("server %d lacks the revocation (%v)", i, err)
		}
	}
	// The resolver stores the JWT before the server applies it to the
	// account in memory; on a loaded machine a connection in between is
	// still accepted, so wait for the refusal itself (within ctx).
	waitFor(ctx, t, "the returned server refusing the revoked credential", func() bool {
		c, err := nats.Connect(cm.c.ClientURLs()[down], nats.UserJWT(func() (string, error) { return userJWT, nil }, signNonce),
			nats.MaxReconnects(0), quietErrors)
		if err == nil {
			c.Close()
			return false
		}
		return strings.Contains(strings.ToLower(err.Error()), "authorization")
	})
	// A fresh credential for the same roster, issued after the revocation,
	// connects to the returned server: only the revoked key is refused.
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second))) // a later second than the revocation's
	nk2, jwt2 := mintNode(t, cm, roster)
	fresh, err := nats.Connect(cm.c.ClientURLs()[down], nats.UserJWT(func() (string, error) { return jwt2, nil },
		nk2.SignNonce), nats.MaxReconnects(0), quietErrors)
	if err != nil {
		t.Fatalf("a new credential cannot connect to the returned server: %v", err)
	}
	fresh.Close()
}

// quietErrors keeps nats.go from printing the asynchronous errors these
// deliberately refused connections get.
var quietErrors = nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})

// mintNode mints a node credential for roster, as POST
// /v1/node-credential would.
func mintNode(t *testing.T, cm *clusterMesh, roster []*keys.Agent) (*keys.Node, string) {
	t.Helper()
	nk, err := keys.Generate[keys.NodeRole]()
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(roster))
	for i, k := range roster {
		ids[i] = k.Public()
	}
	userJWT, err := cm.m.Trust().MintUser(creds.UserSpec{PublicKey: nk.Public(), Name: "reliability", Kind: creds.KindNode, Hosted: ids,
		Permissions: creds.NodePermissions(ids, creds.PrivateOnly(nk.Public())), Expires: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	return nk, userJWT
}

// readTask reads a task's record as its requester.
func readTask(ctx context.Context, requester *node.Agent, performer, id string) (map[string]any, error) {
	h, err := requester.TaskFrom(performer, id)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	gctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return h.Get(gctx)
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }
