package devenv_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/credential"
	"agentmesh.dev/mesh/shared/guest"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/mailbox"
	"agentmesh.dev/mesh/shared/protocol"
)

// Forbidden subjects every hosted credential must be refused, by the
// broker, in both directions.
func forbiddenFor(other string) []string {
	return []string{
		"$KV.mesh_registry.x", "mesh.peer.x", "mesh.aclroom.r1.main", "$SYS.REQ.SERVER.PING",
		protocol.FeedSubject(other, "status"),
		// Service-only: the activity timeline, the guest clearing and the
		// mailbox's history question.
		protocol.SubjGuestEvict, "mesh.internal.activity." + other + "." + other, protocol.SubjMailboxKnown,
		// No client reaches the mailbox stream: another agent's mail is
		// read only through the mailbox worker, signed by that agent.
		"$JS.API.STREAM.INFO." + protocol.MailboxStream,
		"$JS.API.DIRECT.GET." + protocol.MailboxStream + "." + protocol.InboxSubject(other),
		"$JS.API.STREAM.MSG.GET." + protocol.MailboxStream,
		// Nor the services' replies.
		protocol.ServiceInboxPrefix + ".x.1",
	}
}

// forbiddenSubs are the subscriptions every hosted credential is refused:
// another agent's inbox, the key-value space, another credential's reply
// prefix, every private prefix, the services' and the relay's replies.
func forbiddenSubs(other string) []string {
	return []string{
		protocol.InboxSubject(other), protocol.GuardedInboxSubject(other), "$KV.mesh_registry.>",
		protocol.PrivateInboxPrefix(other) + ".>", "_MESH_INBOX.>",
		protocol.ServiceInboxSpace, protocol.RelayReplySpace,
	}
}

// checkFence proves what a connection may and may not do. allowPub is
// published and received on allowSub; each forbidden publish and
// subscription must draw a permissions violation. A connection without the
// shared grant is refused _INBOX.> too.
func checkFence(t *testing.T, nc *nats.Conn, errCh chan error, allowSub, allowPub, other string, shared bool) {
	t.Helper()
	if allowSub != "" {
		sub, err := nc.SubscribeSync(allowSub)
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.Publish(allowPub, []byte("hi")); err != nil {
			t.Fatal(err)
		}
		if _, err := sub.NextMsg(2 * time.Second); err != nil {
			t.Errorf("allowed round trip on %s: %v", allowSub, err)
		}
	}
	for _, s := range forbiddenFor(other) {
		_ = nc.Publish(s, []byte("x"))
		expectViolation(t, errCh, s)
	}
	subs := forbiddenSubs(other)
	if !shared {
		subs = append(subs, protocol.SharedInboxSpace)
	}
	for _, s := range subs {
		if _, err := nc.SubscribeSync(s); err != nil {
			t.Fatal(err)
		}
		expectViolation(t, errCh, s)
	}
}

// inboxOption is the reply prefix a credential answer names.
func inboxOption(t *testing.T, out map[string]any) nats.Option {
	t.Helper()
	p, _ := out["inbox_prefix"].(string)
	if !strings.HasPrefix(p, "_MESH_INBOX.") {
		t.Fatalf("the answer names no private inbox prefix: %v", out["inbox_prefix"])
	}
	return nats.CustomInboxPrefix(p)
}

func TestEveryCredentialKindIsFencedByTheBroker(t *testing.T) {
	c := startCP(t)
	acct, tok := c.signIn("ana@example.org")
	other := newAgent(t).Public()

	for _, private := range []bool{true, false} {
		t.Run(fmt.Sprintf("bootstrap private_inbox=%v", private), func(t *testing.T) {
			agent := newAgent(t)
			body := map[string]any{"token": c.agentKey(acct, "coder"), "agent_id": agent.Public()}
			if private {
				body["private_inbox"] = true
			}
			st, out := c.post("/v1/bootstrap", body, "")
			if st != 200 {
				t.Fatalf("%d %v", st, out)
			}
			errCh := make(chan error, 32)
			nc, err := nats.Connect(c.m.URLs().MeshTCP, nats.UserCredentialBytes([]byte(out["creds"].(string))), nats.MaxReconnects(0),
				inboxOption(t, out), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errCh <- err }))
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			checkFence(t, nc, errCh, protocol.InboxSubject(agent.Public()), protocol.InboxSubject(agent.Public()), other, !private)
		})
	}

	t.Run("node", func(t *testing.T) {
		node, a1, a2 := newNode(t), newAgent(t), newAgent(t)
		req := nodeRequest(node, []*keys.Agent{a1, a2}, time.Now().Unix())
		req["private_inbox"] = true
		st, out := c.post("/v1/node-credential", req, "")
		if st != 200 || out["inbox_prefix"] != protocol.PrivateInboxPrefix(node.Public()) {
			t.Fatalf("%d %v", st, out)
		}
		errCh := make(chan error, 32)
		nc, err := c.connectJWT(out["jwt"].(string), node, errCh, inboxOption(t, out))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		checkFence(t, nc, errCh, protocol.InboxSubject(a2.Public()), protocol.InboxSubject(a2.Public()), other, false)

		// Its agents' offline mail comes through the mailbox worker, signed
		// by the agent; the fetch never returns another agent's mail.
		svc, err := c.m.ConnectService("test-mailbox-setup")
		if err != nil {
			t.Fatal(err)
		}
		defer svc.Close()
		for _, m := range []struct{ to, body string }{{other, "not yours"}, {a1.Public(), "offline mail"}} {
			if err := svc.Publish(protocol.InboxSubject(m.to), []byte(m.body)); err != nil {
				t.Fatal(err)
			}
		}
		var mail []mailbox.Mail
		eventually(t, "the stored mail", func() bool {
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			defer cancel()
			mail, _, err = mailbox.Fetch(ctx, nc, a1, 0, 10)
			return err == nil && len(mail) > 0
		})
		if len(mail) != 1 || string(mail[0].Data) != "offline mail" {
			t.Fatalf("fetched %d messages: %+v", len(mail), mail)
		}
		select {
		case err := <-errCh:
			t.Fatalf("the mailbox fetch was refused: %v", err)
		default:
		}
	})

	t.Run("app", func(t *testing.T) {
		st, out := c.post("/v1/accounts/"+acct+"/apps", map[string]any{"name": "dashboard"}, tok)
		if st != 201 {
			t.Fatalf("%d %v", st, out)
		}
		appKey := out["public_key"].(string)
		errCh := make(chan error, 32)
		nc, err := nats.Connect(c.m.URLs().MeshTCP, nats.UserCredentialBytes([]byte(out["creds"].(string))), nats.MaxReconnects(0),
			nats.CustomInboxPrefix(protocol.PrivateInboxPrefix(appKey)),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errCh <- err }))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		checkFence(t, nc, errCh, protocol.FeedSubject(appKey, "status"), protocol.FeedSubject(appKey, "status"), other, true)
	})

	t.Run("guest", func(t *testing.T) {
		st, out := c.post("/v1/guest", nil, "")
		if st != 200 || out["sandbox"] != true || out["limits"] == nil {
			t.Fatalf("%d %v", st, out)
		}
		errCh := make(chan error, 32)
		nc, err := nats.Connect(c.m.URLs().MeshTCP, nats.UserJWTAndSeed(out["jwt"].(string), out["seed"].(string)), nats.MaxReconnects(0),
			inboxOption(t, out), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errCh <- err }))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		pub := out["publicKey"].(string)
		checkFence(t, nc, errCh, protocol.InboxSubject(pub), protocol.InboxSubject(pub), other, false)
		// No mailbox for a sandbox.
		_ = nc.Publish(protocol.SubjMailboxFetch, nil)
		expectViolation(t, errCh, protocol.SubjMailboxFetch)
	})

	t.Run("job", func(t *testing.T) {
		node, agent := newNode(t), newAgent(t)
		res, err := jobCredential(c, node, agent, "task-42", 0)
		if err != nil {
			t.Fatal(err)
		}
		errCh := make(chan error, 32)
		nc, err := nats.Connect(c.m.URLs().MeshTCP, nats.UserCredentialBytes([]byte(res["creds"].(string))), nats.MaxReconnects(0),
			inboxOption(t, res), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errCh <- err }))
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		checkFence(t, nc, errCh, protocol.TaskUpdateSubject("task-42"), protocol.TaskUpdateSubject("task-42"), other, false)
		_ = nc.Publish(protocol.TaskUpdateSubject("task-43"), nil)
		expectViolation(t, errCh, protocol.TaskUpdateSubject("task-43"))
		_ = nc.Publish(protocol.InboxSubject(other), nil)
		expectViolation(t, errCh, protocol.InboxSubject(other))
	})
}

func jobCredential(c *cp, node *keys.Node, agent *keys.Agent, task string, ttl int64) (map[string]any, error) {
	ts := time.Now().Unix()
	msg := []byte(credential.JobString(ts, node.Public(), agent.Public(), task, ttl))
	body := map[string]any{"node_id": node.Public(), "agent_id": agent.Public(), "task_id": task, "ts": ts,
		"node_sig": base64.StdEncoding.EncodeToString(node.Sign(msg)), "agent_sig": base64.StdEncoding.EncodeToString(agent.Sign(msg))}
	if ttl != 0 {
		body["ttl_seconds"] = ttl
	}
	st, out := c.post("/v1/job-credential", body, "")
	if st != 200 {
		return out, &httpError{st, out}
	}
	return out, nil
}

type httpError struct {
	status int
	body   map[string]any
}

func (e *httpError) Error() string {
	return http.StatusText(e.status) + ": " + e.body["error"].(string)
}

func TestJobCredentialRefusals(t *testing.T) {
	c := startCP(t)
	node, agent := newNode(t), newAgent(t)
	for _, tc := range []struct {
		task string
		ttl  int64
		msg  string
	}{
		{"task.>", 0, "task_id must be"},
		{"t1", 30, "ttl_seconds must be between 60 and 900"},
		{"t1", 3600, "ttl_seconds must be between 60 and 900"},
	} {
		if _, err := jobCredential(c, node, agent, tc.task, tc.ttl); err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s/%d: %v", tc.task, tc.ttl, err)
		}
	}
	// One key alone cannot ask: the agent's signature is required.
	ts := time.Now().Unix()
	msg := []byte(credential.JobString(ts, node.Public(), agent.Public(), "t1", 0))
	sig := base64.StdEncoding.EncodeToString(node.Sign(msg))
	st, out := c.post("/v1/job-credential", map[string]any{"node_id": node.Public(), "agent_id": agent.Public(), "task_id": "t1",
		"ts": ts, "node_sig": sig, "agent_sig": sig}, "")
	if st != 401 || !strings.Contains(out["error"].(string), "agent_sig") {
		t.Errorf("forged agent signature: %d %v", st, out)
	}
	res, err := jobCredential(c, node, agent, "t1", 60)
	if err != nil {
		t.Fatal(err)
	}
	exp, _ := time.Parse(time.RFC3339, res["expires_at"].(string))
	if d := time.Until(exp); d > 61*time.Second || d < 50*time.Second {
		t.Errorf("job credential lives %v, want one minute", d)
	}
}

func TestGuestLeases(t *testing.T) {
	c := startCP(t)
	var grants []map[string]any
	for i := range 3 {
		st, out := c.post("/v1/guest", nil, "")
		if st != 200 {
			t.Fatalf("lease %d: %d %v", i, st, out)
		}
		grants = append(grants, out)
	}
	// The fourth from the same address is over the per-address cap.
	st, out := c.post("/v1/guest", nil, "")
	if st != 429 || out["retry_after_ms"] == nil {
		t.Fatalf("4th lease: %d %v", st, out)
	}
	if _, out := c.do(http.MethodGet, "/auth/status", nil, ""); out["issued"] != 3.0 {
		t.Errorf("auth/status %v", out)
	}
	g := grants[0]
	seed, pub := g["seed"].(string), g["publicKey"].(string)
	k, err := keys.FromSeed[keys.AgentRole]([]byte(seed))
	if err != nil || k.Public() != pub {
		t.Fatalf("guest seed does not match its public key: %v", err)
	}
	ts := time.Now().Unix()
	hb := map[string]any{"publicKey": pub, "ts": ts, "sig": base64.StdEncoding.EncodeToString(k.Sign([]byte(guest.HeartbeatString(pub, ts))))}
	if st, out := c.post("/v1/guest/heartbeat", hb, ""); st != 200 || out["expires_at"] == nil {
		t.Errorf("heartbeat: %d %v", st, out)
	}
	// An unsigned or wrongly signed release is refused.
	if st, _ := c.post("/v1/guest/release", map[string]any{"publicKey": pub, "ts": ts}, ""); st != 400 {
		t.Errorf("unsigned release: %d", st)
	}
	bad := map[string]any{"publicKey": pub, "ts": ts, "sig": hb["sig"]}
	if st, _ := c.post("/v1/guest/release", bad, ""); st != 401 {
		t.Errorf("release signed over the heartbeat string: %d", st)
	}
	nc, err := nats.Connect(c.m.URLs().MeshTCP, nats.UserJWTAndSeed(g["jwt"].(string), seed), nats.MaxReconnects(0))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	rel := map[string]any{"publicKey": pub, "ts": ts, "sig": protocol.SignGuestRelease(k, ts)}
	if st, out := c.post("/v1/guest/release", rel, ""); st != 200 {
		t.Fatalf("release: %d %v", st, out)
	}
	waitClosed(t, nc, "released guest")
	// A released slot frees the address's cap.
	if st, _ := c.post("/v1/guest", nil, ""); st != 200 {
		t.Error("a lease after a release")
	}
	// An idle lease lapses after ten minutes and its credential stops working.
	nc2, err := nats.Connect(c.m.URLs().MeshTCP, nats.UserJWTAndSeed(grants[1]["jwt"].(string), grants[1]["seed"].(string)), nats.MaxReconnects(0))
	if err != nil {
		t.Fatal(err)
	}
	defer nc2.Close()
	c.clock.Advance(11 * time.Minute)
	n, err := c.m.Control().Guests.Sweep(context.Background())
	if err != nil || n != 3 {
		t.Fatalf("sweep ended %d leases (%v), want 3", n, err)
	}
	waitClosed(t, nc2, "lapsed guest")
	if _, out := c.do(http.MethodGet, "/auth/status", nil, ""); out["issued"] != 0.0 {
		t.Errorf("after the sweep: %v", out)
	}
}

func waitClosed(t *testing.T, nc *nats.Conn, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for nc.Status() != nats.CLOSED && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if nc.Status() != nats.CLOSED {
		t.Errorf("%s: still connected", what)
	}
}

func TestApps(t *testing.T) {
	c := startCP(t)
	acct, tok := c.signIn("ana@example.org")
	path := "/v1/accounts/" + acct + "/apps"
	st, out := c.post(path, map[string]any{"name": "dashboard"}, tok)
	if st != 201 || out["seed"] == nil || out["mesh"] == nil {
		t.Fatalf("create: %d %v", st, out)
	}
	appID, seed := out["app_id"].(string), out["seed"].(string)
	st, ref := c.post(path+"/"+appID+"/refresh", nil, tok)
	if st != 200 || ref["seed"] != nil || ref["public_key"] != out["public_key"] {
		t.Fatalf("refresh: %d %v", st, ref)
	}
	nc, err := nats.Connect(c.m.URLs().MeshTCP, nats.UserJWTAndSeed(ref["jwt"].(string), seed), nats.MaxReconnects(0))
	if err != nil {
		t.Fatalf("refreshed JWT with the original seed: %v", err)
	}
	defer nc.Close()
	if st, _ := c.do(http.MethodDelete, path+"/"+appID, nil, tok); st != 200 {
		t.Fatal("revoke")
	}
	waitClosed(t, nc, "revoked app")
	if st, _ := c.post(path+"/"+appID+"/refresh", nil, tok); st != 403 {
		t.Error("a revoked app refreshed")
	}
	if st, _ := c.post(path, map[string]any{"name": "x", "public_key": "U"}, tok); st != 400 {
		t.Error("unknown member accepted")
	}
	// The revoked app freed its slot: ten live apps fit, the eleventh does not.
	for i := range 10 {
		if st, out := c.post(path, map[string]any{"name": "app"}, tok); st != 201 {
			t.Fatalf("app %d: %d %v", i, st, out)
		}
	}
	if st, out := c.post(path, map[string]any{"name": "eleventh"}, tok); st != 403 || out["code"] != "QUOTA_EXCEEDED" {
		t.Errorf("11th app: %d %v", st, out)
	}
}
