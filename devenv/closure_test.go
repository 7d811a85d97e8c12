package devenv_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/devenv"
	closurefn "agentmesh.dev/mesh/functions/closure"
	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/audit"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/closure"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/passkey/passkeytest"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/store"
)

// closable is an account with everything closure takes away: a passkey
// confirmed just now, two agents (one on a node credential, one on its
// bootstrap credential) registered in the registry, one holding a handle,
// an app whose credential is connected, an API token, audit rows, and a
// live connection for each credential.
type closable struct {
	c            *cp
	rp           passkeytest.RelyingParty
	dev          *passkeytest.Device
	email        string
	acct, tok    string
	api          string
	agent, other *keys.Agent
	node         *keys.Node
	handle       string
	conns        []*nats.Conn
	creds        []func() (*nats.Conn, error) // connect again with each credential
}

func (c *cp) closable(email string, rp passkeytest.RelyingParty, chains *audit.Chains) *closable {
	c.t.Helper()
	t := c.t
	a := &closable{c: c, email: email, rp: rp}
	a.acct, a.tok = c.signIn(email)
	a.dev = passkeytest.NewDevice([]byte(a.acct))
	if st, out := c.passkeyCeremony(a.acct, a.tok, "register", a.dev, rp); st != 200 {
		t.Fatalf("register a passkey: %d %v", st, out)
	}
	c.passkeyAddedMail(email)
	a.assert()
	g, err := c.m.Control().Accounts.AdminMintAgentKeyFor(context.Background(), a.acct, "coder", "Ana Example")
	if err != nil {
		t.Fatal(err)
	}
	a.agent, a.other, a.node = newAgent(t), newAgent(t), newNode(t)
	st, boot := c.post("/v1/bootstrap", map[string]any{"token": g.Token, "agent_id": a.agent.Public()}, "")
	if st != 200 || boot["handle"] != "coder."+email {
		t.Fatalf("bootstrap: %d %v", st, boot)
	}
	a.handle = boot["handle"].(string)
	st, boot2 := c.post("/v1/bootstrap", map[string]any{"token": c.agentKey(a.acct, "helper two"), "agent_id": a.other.Public()}, "")
	if st != 200 {
		t.Fatalf("bootstrap: %d %v", st, boot2)
	}
	st, nodeCred := c.post("/v1/node-credential", nodeRequest(a.node, []*keys.Agent{a.agent}, c.clock.Now().Unix()), "")
	if st != 200 {
		t.Fatalf("node credential: %d %v", st, nodeCred)
	}
	st, app := c.post("/v1/accounts/"+a.acct+"/apps", map[string]any{"name": "dashboard"}, a.tok)
	if st != 201 {
		t.Fatalf("app: %d %v", st, app)
	}
	st, tok := c.post("/v1/accounts/"+a.acct+"/api-tokens", map[string]any{"name": "reader", "scopes": []string{"read"}}, a.tok)
	if st != 201 {
		t.Fatalf("api token: %d %v", st, tok)
	}
	a.api = tok["token"].(string)

	// The broker's "authentication revoked" is what the test waits for:
	// not worth a line on stderr for each connection.
	quiet := nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})
	byCreds := func(s string) func() (*nats.Conn, error) {
		return func() (*nats.Conn, error) {
			return nats.Connect(c.m.URLs().MeshTCP, nats.UserCredentialBytes([]byte(s)), nats.MaxReconnects(0), nats.Timeout(5*time.Second), quiet)
		}
	}
	a.creds = []func() (*nats.Conn, error){
		func() (*nats.Conn, error) { return c.connectJWT(nodeCred["jwt"].(string), a.node, nil, quiet) },
		byCreds(boot["creds"].(string)),
		byCreds(boot2["creds"].(string)),
		byCreds(app["creds"].(string)),
	}
	for _, connect := range a.creds {
		nc, err := connect()
		if err != nil {
			t.Fatalf("connect before closing: %v", err)
		}
		t.Cleanup(nc.Close)
		a.conns = append(a.conns, nc)
	}
	// Both agents register, each on its own credential's connection.
	now := time.Now()
	for i, ag := range []*keys.Agent{a.agent, a.other} {
		vouch, _ := protocol.NewVouch(a.node, ag.Public(), now, now.Add(time.Hour))
		reg := map[string]any{"id": ag.Public(), "name": fmt.Sprint("agent-", i), "endpoint": protocol.InboxSubject(ag.Public()),
			"node": map[string]any{"id": a.node.Public(), "attestation": vouch}}
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		_, err := bus.Call(ctx, a.conns[1+i], ag, protocol.SubjRegister, protocol.TypeRegister, "", reg)
		cancel()
		if err != nil {
			t.Fatalf("register: %v", err)
		}
	}
	// The agent emits on a stream feed, on its own credential, and the
	// feeds keep it (history and latest) until closure erases them.
	feed, _ := protocol.New(protocol.TypeEmit, a.agent.Public(), map[string]any{"topic": "log", "kind": "stream", "data": "hello"})
	_ = feed.Sign(a.agent)
	fb, _ := feed.Marshal()
	if err := a.conns[1].Publish(protocol.FeedSubject(a.agent.Public(), "log"), fb); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !a.feedHeld() {
		if time.Now().After(deadline) {
			t.Fatal("the feeds never kept the agent's emit")
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i := range 3 {
		e := audit.Entry{Agent: a.agent.Public(), Role: audit.RoleResponder, Peer: a.other.Public(), Offering: "chat",
			RequestID: fmt.Sprint("req-", i), Outcome: "completed", Duration: time.Millisecond, InputSHA256: audit.InputDigest([]byte("x"))}
		if _, _, err := chains.Append(t.Context(), e); err != nil {
			t.Fatal(err)
		}
	}
	return a
}

// feedLatestAndHistory reads the agent's feed "log": whether mesh.feed.get
// finds a latest envelope, and how many its history answers.
func (a *closable) feedLatestAndHistory() (bool, int) {
	t := a.c.t
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	nc, err := a.c.m.ConnectService("test-feed-read")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	svc := &bus.Caller{NC: nc, Key: newAgent(t)}
	latest, err := svc.Call(ctx, protocol.SubjFeedGet, protocol.TypeDiscover, map[string]any{"agent": a.agent.Public(), "topic": "log"})
	if err != nil {
		t.Fatalf("feed get: %v", err)
	}
	hist, err := svc.Call(ctx, protocol.SubjFeedGet, protocol.TypeDiscover, map[string]any{"agent": a.agent.Public(), "topic": "log", "since": 0})
	if err != nil {
		t.Fatalf("feed history: %v", err)
	}
	l, _ := hist["history"].([]any)
	return latest["found"] == true, len(l)
}

func (a *closable) feedHeld() bool {
	found, n := a.feedLatestAndHistory()
	return found && n > 0
}

// assert confirms the passkey, which makes the session fresh.
func (a *closable) assert() {
	a.c.t.Helper()
	if st, out := a.c.passkeyCeremony(a.acct, a.tok, "assert", a.dev, a.rp); st != 200 {
		a.c.t.Fatalf("assert: %d %v", st, out)
	}
}

// checkClosed checks everything the account held is gone or refused:
// the live connections closed and the credentials refused by the broker,
// the registrations gone from the registry, the handle released (resolve
// 404), the session and API token refused, renewal refused, the audit
// rows purged, the account and its address's index deleted, and the
// outstanding list mailed.
func (a *closable) checkClosed(svc *bus.Caller, chains *audit.Chains) {
	c, t := a.c, a.c.t
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for i, nc := range a.conns {
		for nc.Status() != nats.CLOSED && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if nc.Status() != nats.CLOSED {
			t.Errorf("connection %d still open after closure", i)
		}
	}
	for i, connect := range a.creds {
		nc, err := connect()
		if err == nil {
			nc.Close()
			t.Errorf("credential %d still connects after closure", i)
		} else if !strings.Contains(strings.ToLower(err.Error()), "authorization") {
			t.Errorf("credential %d refused for another reason: %v", i, err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	for _, ag := range []*keys.Agent{a.agent, a.other} {
		_, err := svc.Call(ctx, protocol.RegistryGetSubject(ag.Public()), protocol.TypeDiscover, nil)
		if errs.CodeOf(err) != errs.NotFound {
			t.Errorf("registry get %s after closure: %v", ag.Public(), err)
		}
	}
	cat, err := svc.Call(ctx, protocol.SubjCatalogList, protocol.TypeDiscover, map[string]any{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range cat["entries"].([]any) {
		if id := e.(map[string]any)["agent_id"]; id == a.agent.Public() || id == a.other.Public() {
			t.Errorf("catalog entry after closure: %v", e)
		}
	}
	if found, n := a.feedLatestAndHistory(); found || n != 0 {
		t.Errorf("the agent's feed after closure: latest found %v, %d in its history", found, n)
	}
	resp, err := http.Get(c.m.URLs().Registrar + "/api/resolve?handle=" + url.QueryEscape(a.handle))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("resolve %s after closure: %d", a.handle, resp.StatusCode)
	}
	for _, tok := range []string{a.tok, a.api} {
		if st, out := c.do(http.MethodGet, "/v1/accounts/"+a.acct+"/agents", nil, tok); st != http.StatusUnauthorized {
			t.Errorf("a session or token after closure: %d %v", st, out)
		}
	}
	if st, out := c.post("/v1/node-credential", nodeRequest(a.node, []*keys.Agent{a.agent}, c.clock.Now().Unix()), ""); st != http.StatusForbidden ||
		!strings.Contains(out["error"].(string), "closed") {
		t.Errorf("renewal after closure: %d %v", st, out)
	}
	if rows, err := chains.Rows(ctx, a.agent.Public()); err != nil || len(rows) != 0 {
		t.Errorf("audit rows after closure: %d %v", len(rows), err)
	}
	if _, err := c.m.Control().Accounts.GetAccount(ctx, a.acct); errs.CodeOf(err) != errs.NotFound {
		t.Errorf("the account after closure: %v", err)
	}
	var left []map[string]any
	for _, coll := range []string{account.CollSessions, account.CollAPITokens, account.CollAgentKeys, account.CollHandles} {
		if err := store.List(ctx, c.m.Control().Store, coll, store.Where("account_id", a.acct), &left); err != nil || len(left) != 0 {
			t.Errorf("%s of the account after closure: %v %v", coll, left, err)
		}
	}
	for {
		msg, err := c.smtp.Wait(ctx, a.email)
		if err != nil {
			t.Errorf("no closing mail: %v", err)
			break
		}
		if msg.Message.Subject == "Your account is closed" {
			if !strings.Contains(msg.Message.Text, "What closure does not remove") {
				t.Errorf("the closing mail lacks the outstanding list:\n%s", msg.Message.Text)
			}
			break
		}
	}
}

// Account closure end to end. One account is closed by the route: the
// preview names what goes, the close action needs a fresh passkey, and
// answers 200 with the outstanding list. Then, for every k, an account's
// closure is cut off after k steps (the runner dies holding its lease, as
// a Cloud Function that timed out), and the scheduled row, once the lease
// has lapsed, finishes it: every step ran exactly once, and the account's
// agents are gone from the registry, its handles released, its
// credentials refused by the broker.
func TestClosingAnAccount(t *testing.T) {
	c := startCP(t, func(cfg *devenv.Config) {
		// Twelve accounts from one address.
		cfg.AccountLimits = account.DefaultLimits()
		cfg.AccountLimits.SignUp.PerAddress.Max = 100
	})
	rp := passkeytest.RelyingParty{Name: "agentmesh", ID: "localhost", Origin: strings.TrimSuffix(c.m.URLs().Console, "/console/")}
	sc, err := c.m.ConnectService("test-closure")
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	js, err := jetstream.New(sc)
	if err != nil {
		t.Fatal(err)
	}
	chains, err := audit.OpenChains(t.Context(), audit.ChainsConfig{JS: js})
	if err != nil {
		t.Fatal(err)
	}
	svc := &bus.Caller{NC: sc, Key: newAgent(t)}
	ctx := context.Background()

	// By the route.
	a := c.closable("ana@example.org", rp, chains)
	st, pv := c.do(http.MethodGet, "/v1/accounts/"+a.acct+"/close", nil, a.api)
	if st != 200 || pv["passkey_fresh"] != false {
		t.Fatalf("preview with a read token: %d %v", st, pv)
	}
	st, pv = c.do(http.MethodGet, "/v1/accounts/"+a.acct+"/close", nil, a.tok)
	if st != 200 || pv["passkey_fresh"] != true {
		t.Fatalf("preview: %d %v", st, pv)
	}
	removes := map[string]float64{}
	for _, it := range pv["will_remove"].([]any) {
		m := it.(map[string]any)
		removes[strings.SplitN(m["what"].(string), ":", 2)[0]] = m["count"].(float64)
	}
	for what, n := range map[string]float64{"Your agents' credentials": 2, "Your app credentials": 1, "Your handles (coder.ana@example.org)": 1,
		// The three rows appended here, and the account rows of the
		// control plane's three mints (two bootstraps, one node
		// credential: docs/audit.md "Account rows").
		"Your agents' registrations": 2, "Your agents' audit rows, and the proofs that tie them to anchors": 6} {
		if removes[what] != n {
			t.Errorf("will remove %q: %v, want %v (%v)", what, removes[what], n, removes)
		}
	}
	if st, out := c.post("/v1/accounts/"+a.acct+"/close", nil, a.api); st != http.StatusUnauthorized {
		t.Errorf("close with an API token: %d %v", st, out)
	}
	c.clock.Advance(6 * time.Minute) // the passkey check goes stale
	if st, out := c.post("/v1/accounts/"+a.acct+"/close", nil, a.tok); st != http.StatusForbidden ||
		out["details"].(map[string]any)["passkey_required"] != true {
		t.Fatalf("close with a stale passkey check: %d %v", st, out)
	}
	a.assert()
	st, out := c.post("/v1/accounts/"+a.acct+"/close", nil, a.tok)
	if st != 200 || out["state"] != closure.StateDone {
		t.Fatalf("close: %d %v", st, out)
	}
	outstanding := fmt.Sprint(out["outstanding"])
	for _, want := range []string{"rooms", "state stay on your agents' machines", "Mail the mesh sent you"} {
		if !strings.Contains(outstanding, want) {
			t.Errorf("outstanding lacks %q: %s", want, outstanding)
		}
	}
	for _, s := range out["steps"].([]any) {
		if m := s.(map[string]any); m["runs"] != 1.0 || m["done"] != true || m["skipped"] == true {
			t.Errorf("step %v", m)
		}
	}
	a.checkClosed(svc, chains)

	// Cut off after each step, and resumed by the scheduled row.
	resume := c.m.Control().Deps.Function(closurefn.Routes[2])
	for k := range len(closure.Steps) {
		a := c.closable(fmt.Sprintf("k%d@example.org", k), rp, chains)
		p, err := c.m.Control().Accounts.Authenticate(ctx, a.acct, a.tok, "")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.m.Control().Deps.Closure.Begin(ctx, p); err != nil {
			t.Fatal(err)
		}
		for range k {
			if _, err := c.m.Control().Deps.Closure.Advance(ctx, a.acct, "runner-that-dies"); err != nil {
				t.Fatalf("k=%d: %v", k, err)
			}
		}
		// The dead runner's lease lapses, as LeaseTTL later it would. (The
		// clock is not moved: the workers share it, and envelopes signed
		// in real time would look stale to them after ten minutes of it.)
		err = c.m.Control().Store.RunTx(ctx, func(tx store.Tx) error {
			return tx.Update(closure.CollClosures, a.acct, map[string]any{"lease_until": c.clock.Now().Add(-time.Second).UnixMilli()})
		})
		if err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		resume.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/jobs/account-closure-resume", nil))
		if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"count":1`) {
			job, _ := c.m.Control().Deps.Closure.Get(ctx, a.acct)
			t.Fatalf("k=%d: resume: %d %s (%+v)", k, rec.Code, rec.Body, job)
		}
		job, err := c.m.Control().Deps.Closure.Get(ctx, a.acct)
		if err != nil || !job.Done() {
			t.Fatalf("k=%d: %+v %v", k, job, err)
		}
		var names []string
		for _, st := range job.Steps {
			names = append(names, st.Name)
			if st.Runs != 1 || st.DoneAt == 0 || st.Skipped {
				t.Errorf("k=%d: step %+v", k, st)
			}
		}
		if !slices.Equal(names, closure.Steps) {
			t.Errorf("k=%d: steps %v", k, names)
		}
		a.checkClosed(svc, chains)
		t.Logf("cut off after %d steps, resumed: closed", k)
	}
}
