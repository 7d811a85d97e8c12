package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/devenv"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// adminJSON runs `meshd admin --json …` and decodes its one JSON object.
func adminJSON(t *testing.T, dataDir string, args ...string) map[string]any {
	t.Helper()
	var stdout, stderr bytes.Buffer
	full := append([]string{"admin", "--data-dir", dataDir, "--json"}, args...)
	if err := run(context.Background(), full, noEnv, &stdout, &stderr); err != nil {
		t.Fatalf("meshd %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	var out map[string]any
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("meshd %s printed %q, not one JSON object", strings.Join(args, " "), stdout.String())
	}
	return out
}

func postJSON(t *testing.T, url string, body any) (int, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

// On one meshd: the operator mints an am_ key, the agent exchanges it,
// connects with the creds it got, renews through the node-credential door
// with its agent and node keys, and is cut off when the operator retires it.
func TestAdminKeyToBootstrapToRenewal(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "mesh")
	urls, _, stop := runUntilReady(t, dataDir)
	defer stop()

	acct := adminJSON(t, dataDir, "account", "create", "--email", "ops@example.org")["account_id"].(string)
	if again := adminJSON(t, dataDir, "account", "create", "--email", "OPS@example.org"); again["account_id"] != acct || again["created"] != false {
		t.Errorf("creating the same account twice: %v", again)
	}
	grant := adminJSON(t, dataDir, "agent-token", "--account", acct, "--name", "coder")
	token := grant["token"].(string)
	if !strings.HasPrefix(token, "am_") || grant["expires_in"] != 604800.0 {
		t.Fatalf("agent-token: %v", grant)
	}

	agent, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		t.Fatal(err)
	}
	st, boot := postJSON(t, urls["control_url"]+"/v1/bootstrap", map[string]any{"token": token, "agent_id": agent.Public()})
	if st != 200 {
		t.Fatalf("bootstrap: %d %v", st, boot)
	}
	nc, err := nats.Connect(urls["mesh_tcp_url"], nats.UserCredentialBytes([]byte(boot["creds"].(string))), nats.MaxReconnects(0))
	if err != nil {
		t.Fatalf("connect with the returned creds: %v", err)
	}
	sub, err := nc.SubscribeSync(protocol.InboxSubject(agent.Public()))
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Publish(protocol.InboxSubject(agent.Public()), []byte("ping")); err != nil {
		t.Fatal(err)
	}
	if _, err := sub.NextMsg(2 * time.Second); err != nil {
		t.Fatalf("own inbox round trip: %v", err)
	}
	nc.Close()

	// Renewal: the adapter's node key and the agent's consent.
	node, err := keys.Generate[keys.NodeRole]()
	if err != nil {
		t.Fatal(err)
	}
	ts := time.Now().Unix()
	nodeSig, err := protocol.SignNodeCred(node, ts, []string{agent.Public()})
	if err != nil {
		t.Fatal(err)
	}
	st, renewed := postJSON(t, boot["renew_url"].(string), map[string]any{"node_id": node.Public(), "ts": ts, "node_sig": nodeSig,
		"agents": []any{map[string]any{"id": agent.Public(), "sig": protocol.SignNodeAgent(agent, ts, node.Public())}}})
	if st != 200 {
		t.Fatalf("renewal: %d %v", st, renewed)
	}
	closed := make(chan struct{})
	nc2, err := nats.Connect(urls["mesh_tcp_url"], nats.UserJWT(
		func() (string, error) { return renewed["jwt"].(string), nil }, node.SignNonce),
		nats.MaxReconnects(0), nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	if err != nil {
		t.Fatalf("connect with the renewed node credential: %v", err)
	}
	defer nc2.Close()

	adminJSON(t, dataDir, "agent", "retire", agent.Public(), "--reason", "test over")
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the node was not cut off within 5 s of the retirement")
	}
	st, out := postJSON(t, boot["renew_url"].(string), map[string]any{"node_id": node.Public(), "ts": ts, "node_sig": nodeSig,
		"agents": []any{map[string]any{"id": agent.Public(), "sig": protocol.SignNodeAgent(agent, ts, node.Public())}}})
	if st != 403 || !strings.Contains(out["error"].(string), "test over") {
		t.Errorf("renewal after retirement: %d %v", st, out)
	}
}

// With no meshd running, the admin commands act on the stopped mesh's files,
// and what they record is there when it starts again.
func TestAdminOnAStoppedMesh(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "mesh")
	_, _, stop := runUntilReady(t, dataDir)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	acct := adminJSON(t, dataDir, "account", "create", "--email", "later@example.org")["account_id"].(string)
	token := adminJSON(t, dataDir, "agent-token", "--account", acct, "--name", "offline")["token"].(string)

	urls, _, stop := runUntilReady(t, dataDir)
	defer stop()
	agent, _ := keys.Generate[keys.AgentRole]()
	if st, out := postJSON(t, urls["control_url"]+"/v1/bootstrap", map[string]any{"token": token, "agent_id": agent.Public()}); st != 200 {
		t.Fatalf("a key minted while meshd was stopped: %d %v", st, out)
	}

	var stderr bytes.Buffer
	err := run(context.Background(), []string{"admin", "--data-dir", dataDir, "agent", "retire", agent.Public()}, noEnv, &bytes.Buffer{}, &stderr)
	if err == nil || !strings.Contains(stderr.String(), "--reason") {
		t.Errorf("retire without a reason: %v %q", err, stderr.String())
	}
	err = run(context.Background(), []string{"admin", "--data-dir", filepath.Join(t.TempDir(), "none"), "account", "create", "--email", "x@example.org"},
		noEnv, &bytes.Buffer{}, &stderr)
	if err == nil || !strings.Contains(err.Error(), "no mesh") {
		t.Errorf("admin on a directory with no mesh: %v", err)
	}
}

// runAdmin runs meshd with args exactly as given and returns its output.
func runAdmin(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err = run(context.Background(), args, noEnv, &out, &errOut)
	return out.String(), errOut.String(), err
}

// Every admin command takes its flags before or after its words (the new
// user's `account create --email x --json` said "needs --email").
func TestAdminFlagsAnywhere(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "mesh")
	_, _, stop := runUntilReady(t, dataDir)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	decode := func(args []string, out, errOut string, err error) map[string]any {
		t.Helper()
		if err != nil {
			t.Fatalf("meshd %s: %v\n%s", strings.Join(args, " "), err, errOut)
		}
		var v map[string]any
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("meshd %s printed %q, not one JSON object", strings.Join(args, " "), out)
		}
		return v
	}
	var acct string
	for i, args := range [][]string{
		{"admin", "account", "create", "--email", "a@example.org", "--json", "--data-dir", dataDir},
		{"--data-dir", dataDir, "admin", "--json", "account", "create", "--email", "a@example.org"},
		{"admin", "account", "--email", "a@example.org", "create", "--data-dir", dataDir, "--json"},
		{"--json", "admin", "account", "create", "--data-dir=" + dataDir, "--email=a@example.org"},
	} {
		out, errOut, err := runAdmin(t, args...)
		got := decode(args, out, errOut, err)
		if i == 0 {
			acct, _ = got["account_id"].(string)
		}
		if got["account_id"] != acct || acct == "" {
			t.Errorf("meshd %s: %v, want account %s", strings.Join(args, " "), got, acct)
		}
	}
	args := []string{"admin", "agent-token", "--account", acct, "--data-dir", dataDir, "--name", "coder", "--json"}
	out, errOut, err := runAdmin(t, args...)
	if tok, _ := decode(args, out, errOut, err)["token"].(string); !strings.HasPrefix(tok, "am_") {
		t.Errorf("agent-token with flags after its word: %s", out)
	}
	// The text answer says plainly whether the key's name claims a handle.
	out, errOut, err = runAdmin(t, "admin", "agent-token", "--account", acct, "--name", "writer", "--data-dir", dataDir)
	if err != nil || !strings.HasPrefix(out, "am_") || !strings.Contains(out, "No handle yet: the account has no operator name, and writer.a@example.org is claimed only") {
		t.Errorf("agent-token for an account with no operator name: %v %q %q", err, out, errOut)
	}
	out, errOut, err = runAdmin(t, "admin", "agent-token", "--account", acct, "--name", "writer", "--operator", "Ana López", "--data-dir", dataDir)
	if err != nil || !strings.Contains(out, "When the agent starts it claims the handle writer.a@example.org") {
		t.Errorf("agent-token --operator: %v %q %q", err, out, errOut)
	}
	if out, errOut, err = runAdmin(t, "admin", "account", "disable", acct, "--data-dir", dataDir, "--reason", "test over"); err != nil ||
		!strings.Contains(out, "disabled") {
		t.Errorf("account disable with flags after its id: %v %q %q", err, out, errOut)
	}

	// A flag the command does not take is named, with that command's usage.
	_, errOut, err = runAdmin(t, "admin", "account", "create", "--email", "b@example.org", "--reason", "x", "--data-dir", dataDir)
	if !errors.Is(err, errUsage) || !strings.Contains(errOut, "account create does not take --reason") ||
		!strings.Contains(errOut, "Usage: meshd admin account create") {
		t.Errorf("a flag of another command: %v %q", err, errOut)
	}
	_, errOut, err = runAdmin(t, "admin", "account", "--data-dir", dataDir)
	if !errors.Is(err, errUsage) || !strings.Contains(errOut, "account create") || strings.Contains(errOut, "agent-token") {
		t.Errorf("account without its command: %v %q", err, errOut)
	}
}

// An admin command never opens the files of a data directory another
// process has locked (a meshd starting or stopping, whose socket does not
// answer): it says so instead.
func TestAdminWaitsForALockedDataDir(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "mesh")
	_, _, stop := runUntilReady(t, dataDir)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	lock, err := devenv.LockDataDir(dataDir, "meshd")
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Unlock()
	_, _, err = runAdmin(t, "admin", "--data-dir", dataDir, "account", "create", "--email", "x@example.org")
	want := fmt.Sprintf("a meshd is running on this data dir (pid %d) but its admin socket", os.Getpid())
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("admin on a locked data dir: %v, want %q", err, want)
	}
}

// The operator test credential: refused without --ttl or with more than a
// day, written 0600 with --ttl (nothing secret printed), wide on mesh.>
// and _INBOX.> yet refused $KV.> and $SYS.> by the broker, and closed and
// refused by the broker once revoked.
func TestAdminOperatorCredential(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "mesh")
	urls, stdout, stop := runUntilReady(t, dataDir)
	defer stop()

	for _, args := range [][]string{
		{"admin", "--data-dir", dataDir, "operator-credential"},
		{"admin", "--data-dir", dataDir, "operator-credential", "--ttl", ""},
		{"admin", "--data-dir", dataDir, "operator-credential", "--ttl", "25h"},
		{"admin", "--data-dir", dataDir, "operator-credential", "--ttl", "-1h"},
		{"admin", "--data-dir", dataDir, "operator-credential", "--ttl", "soon"},
	} {
		_, errOut, err := runAdmin(t, args...)
		if !errors.Is(err, errUsage) || !strings.Contains(errOut, "--ttl") {
			t.Errorf("meshd %s: %v %q, want a usage error naming --ttl", strings.Join(args, " "), err, errOut)
		}
	}
	if entries, _ := filepath.Glob(filepath.Join(dataDir, "operator-*.creds")); len(entries) > 0 {
		t.Fatalf("a refused command wrote %v", entries)
	}

	out := filepath.Join(t.TempDir(), "op.creds")
	res := adminJSON(t, dataDir, "operator-credential", "--ttl", "1h", "--out", out, "--label", "suite run 7")
	key, _ := res["public_key"].(string)
	if !keys.IsUserPublicKey(key) || res["creds_file"] != out || !strings.Contains(res["name"].(string), "OPERATOR TEST CREDENTIAL") ||
		res["seed"] != nil || res["jwt"] != nil || res["creds"] != nil {
		t.Fatalf("operator-credential answered %v", res)
	}
	if exp, err := protocol.ParseTime(res["expires_at"].(string)); err != nil || time.Until(exp) > time.Hour || time.Until(exp) < 55*time.Minute {
		t.Errorf("expires_at %v, want an hour from now", res["expires_at"])
	}
	fi, err := os.Stat(out)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("creds file: %v %v", fi, err)
	}
	cf, _ := os.ReadFile(out)
	seed, err := jwt.ParseDecoratedNKey(cf)
	if err != nil {
		t.Fatalf("the creds file holds no seed: %v", err)
	}
	raw, _ := seed.Seed()
	if strings.Contains(stdout.String(), string(raw)) {
		t.Error("meshd printed the operator credential's seed")
	}
	// The text form names the file and the key, and how to revoke; no seed.
	text, _, err := runAdmin(t, "admin", "--data-dir", dataDir, "operator-credential", "--ttl", "30m", "--out", filepath.Join(t.TempDir(), "two.creds"))
	if err != nil || !strings.Contains(text, "operator-credential revoke U") || strings.Contains(text, "NKEY") || strings.Contains(text, "eyJ") {
		t.Errorf("text answer: %v %q", err, text)
	}
	// Never over an existing file.
	if _, _, err := runAdmin(t, "admin", "--data-dir", dataDir, "operator-credential", "--ttl", "1h", "--out", out); err == nil ||
		!strings.Contains(err.Error(), "not written") {
		t.Errorf("a second mint onto the same file: %v", err)
	}

	violations := make(chan error, 16)
	closed := make(chan struct{})
	nc, err := nats.Connect(urls["mesh_tcp_url"], nats.UserCredentials(out), nats.MaxReconnects(0),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { violations <- err }),
		nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	if err != nil {
		t.Fatalf("connect with the operator creds: %v", err)
	}
	defer nc.Close()
	// Any agent's inbox, both ways, and a reply on the shared _INBOX.
	a, b := newKey(t), newKey(t)
	for _, agent := range []string{a, b} {
		sub, err := nc.SubscribeSync(protocol.InboxSubject(agent))
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.Publish(protocol.InboxSubject(agent), []byte("hello "+agent)); err != nil {
			t.Fatal(err)
		}
		if m, err := sub.NextMsg(5 * time.Second); err != nil || string(m.Data) != "hello "+agent {
			t.Fatalf("round trip on %s's inbox: %v", agent, err)
		}
	}
	echo, err := nc.Subscribe("mesh.event.echo", func(m *nats.Msg) { _ = m.Respond(m.Data) })
	if err != nil {
		t.Fatal(err)
	}
	if r, err := nc.Request("mesh.event.echo", []byte("ping"), 5*time.Second); err != nil || string(r.Data) != "ping" {
		t.Fatalf("request on _INBOX.: %v", err)
	}
	_ = echo.Unsubscribe()
	// The broker refuses the denied namespaces (the refusal is asynchronous:
	// silence fails the test).
	for _, subj := range []string{"$KV.mesh_registry." + a, "$SYS.REQ.SERVER.PING", "$JS.API.INFO", "mesh.internal.guest.erase"} {
		if err := nc.Publish(subj, []byte("x")); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-violations:
			if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
				t.Errorf("publish %s: %v", subj, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("publish %s: no permissions violation from the broker", subj)
		}
	}

	if got := adminJSON(t, dataDir, "operator-credential", "revoke", key); got["ok"] != true {
		t.Fatalf("revoke: %v", got)
	}
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the operator credential's connection was not closed within 5 s of its revocation")
	}
	if nc2, err := nats.Connect(urls["mesh_tcp_url"], nats.UserCredentials(out), nats.MaxReconnects(0)); err == nil {
		nc2.Close()
		t.Fatal("a revoked operator credential connected again")
	} else if !errors.Is(err, nats.ErrAuthorization) && !strings.Contains(err.Error(), "Authorization") {
		t.Errorf("a revoked operator credential refused with %v", err)
	}
	// Only operator credentials are revoked through this command.
	if _, _, err := runAdmin(t, "admin", "--data-dir", dataDir, "operator-credential", "revoke", a); err == nil ||
		!strings.Contains(err.Error(), "no operator credential") {
		t.Errorf("revoking a key that is no operator credential: %v", err)
	}
}

func newKey(t *testing.T) string {
	t.Helper()
	k, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		t.Fatal(err)
	}
	return k.Public()
}

// The operator's catalog commands on a running meshd: official on and off
// over an agent's entry, which outlives the agent's deregistration,
// removal and its restore; on a stopped mesh they say the catalog needs the running meshd.
func TestAdminCatalog(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "mesh")
	urls, _, stop := runUntilReady(t, dataDir)
	stopped := false
	defer func() {
		if !stopped {
			stop()
		}
	}()
	acct := adminJSON(t, dataDir, "account", "create", "--email", "cat@example.org")["account_id"].(string)
	token := adminJSON(t, dataDir, "agent-token", "--account", acct, "--name", "finder")["token"].(string)
	agent, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		t.Fatal(err)
	}
	node, err := keys.Generate[keys.NodeRole]()
	if err != nil {
		t.Fatal(err)
	}
	st, boot := postJSON(t, urls["control_url"]+"/v1/bootstrap", map[string]any{"token": token, "agent_id": agent.Public()})
	if st != 200 {
		t.Fatalf("bootstrap: %d %v", st, boot)
	}
	nc, err := nats.Connect(urls["mesh_tcp_url"], nats.UserCredentialBytes([]byte(boot["creds"].(string))))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	vouch, err := protocol.NewVouch(node, agent.Public(), time.Now(), time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bus.Call(ctx, nc, agent, protocol.SubjRegister, protocol.TypeRegister, "", map[string]any{
		"id": agent.Public(), "name": "finder", "endpoint": protocol.InboxSubject(agent.Public()), "visibility": "public",
		"node": map[string]any{"id": node.Public(), "attestation": vouch}, "offerings": []any{map[string]any{"id": "find", "name": "Find"}},
	}); err != nil {
		t.Fatalf("register: %v", err)
	}
	// The agent's own credential reads the catalog (every non-guest kind may).
	entry := func(what string, ok func(map[string]any) bool) {
		t.Helper()
		for {
			rep, err := bus.Call(ctx, nc, agent, protocol.SubjCatalogList, protocol.TypeDiscover, "", map[string]any{})
			if err != nil {
				t.Fatalf("catalog: %v", err)
			}
			var c struct {
				Entries []map[string]any `json:"entries"`
			}
			_ = rep.DecodePayload(&c)
			if len(c.Entries) == 1 && c.Entries[0]["agent_id"] == agent.Public() && ok(c.Entries[0]) {
				return
			}
			select {
			case <-ctx.Done():
				t.Fatalf("the catalog never showed %s: %v", what, c.Entries)
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	entry("the agent", func(e map[string]any) bool { return e["available"] == true && e["official"] == false })

	out, errOut, err := runAdmin(t, "admin", "--data-dir", dataDir, "catalog", "official", agent.Public(), "on")
	if err != nil || !strings.Contains(out, "is official") {
		t.Fatalf("catalog official on: %v %q %q", err, out, errOut)
	}
	entry("official", func(e map[string]any) bool { return e["official"] == true })
	if _, err := bus.Call(ctx, nc, agent, protocol.SubjDeregister, protocol.TypeRegister, "", map[string]any{"agent_id": agent.Public()}); err != nil {
		t.Fatalf("deregister: %v", err)
	}
	entry("the deregistered agent, still official", func(e map[string]any) bool { return e["available"] == false && e["official"] == true })
	if got := adminJSON(t, dataDir, "catalog", "official", agent.Public(), "off"); got["entry"].(map[string]any)["official"] != false {
		t.Fatalf("catalog official off: %v", got)
	}
	if _, _, err := runAdmin(t, "admin", "--data-dir", dataDir, "catalog", "official", agent.Public(), "maybe"); err == nil || !strings.Contains(err.Error(), "on or off") {
		t.Errorf("catalog official maybe: %v", err)
	}
	if got := adminJSON(t, dataDir, "catalog", "remove", agent.Public()); got["removed"] != true {
		t.Fatalf("catalog remove: %v", got)
	}
	if out, _, err := runAdmin(t, "admin", "--data-dir", dataDir, "catalog", "remove", agent.Public()); err != nil || !strings.Contains(out, "was not in the catalog") {
		t.Errorf("removing again: %v %q", err, out)
	}
	// The operator lifts the removal; the agent's next registration lists it.
	if out, _, err := runAdmin(t, "admin", "--data-dir", dataDir, "catalog", "restore", agent.Public()); err != nil || !strings.Contains(out, "when it next registers") {
		t.Fatalf("catalog restore: %v %q", err, out)
	}
	if out, _, err := runAdmin(t, "admin", "--data-dir", dataDir, "catalog", "restore", agent.Public()); err != nil || !strings.Contains(out, "nothing to restore") {
		t.Errorf("restoring again: %v %q", err, out)
	}
	if _, err := bus.Call(ctx, nc, agent, protocol.SubjRegister, protocol.TypeRegister, "", map[string]any{
		"id": agent.Public(), "name": "finder", "endpoint": protocol.InboxSubject(agent.Public()), "visibility": "public",
		"node": map[string]any{"id": node.Public(), "attestation": vouch}, "offerings": []any{map[string]any{"id": "find", "name": "Find"}},
	}); err != nil {
		t.Fatalf("register again: %v", err)
	}
	entry("the agent back after the restore", func(e map[string]any) bool { return e["available"] == true })

	nc.Close()
	stopped = true
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runAdmin(t, "admin", "--data-dir", dataDir, "catalog", "official", agent.Public(), "on"); err == nil || !strings.Contains(err.Error(), "start meshd") {
		t.Errorf("catalog official on a stopped mesh: %v", err)
	}
}

// The operator grants credits on a running meshd: the answer is the
// balance after it, and each grant adds; a bad amount is a usage error;
// on a stopped mesh it says the balances need the running meshd.
func TestAdminCreditsGrant(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "mesh")
	_, _, stop := runUntilReady(t, dataDir)
	stopped := false
	defer func() {
		if !stopped {
			stop()
		}
	}()
	owner, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		t.Fatal(err)
	}
	out, errOut, err := runAdmin(t, "admin", "--data-dir", dataDir, "credits", "grant", owner.Public(), "2.5", "--reason", "welcome")
	if err != nil || !strings.Contains(out, "granted 2.5 credits to "+owner.Public()+"; its balance is 2.5 credits") {
		t.Fatalf("grant: %v %q %q", err, out, errOut)
	}
	if got := adminJSON(t, dataDir, "credits", "grant", owner.Public(), "0.5"); got["credits"] != 3_000_000.0 || got["currency"] != "XCR" {
		t.Fatalf("second grant: %v", got)
	}
	if out, _, err := runAdmin(t, "admin", "--data-dir", dataDir, "credits", "balance", owner.Public()); err != nil || !strings.Contains(out, owner.Public()+" has 3 credits") {
		t.Fatalf("balance: %v %q", err, out)
	}
	if got := adminJSON(t, dataDir, "credits", "balance", "platform"); got["owner"] != "platform" || got["credits"] != 0.0 {
		t.Fatalf("the platform's balance: %v", got)
	}
	for _, bad := range []string{"0", "-1", "1.0000001", "lots"} {
		if _, _, err := runAdmin(t, "admin", "--data-dir", dataDir, "credits", "grant", owner.Public(), bad); err == nil || !strings.Contains(err.Error(), "usage") && !strings.Contains(err.Error(), "amount") {
			t.Errorf("grant %q: %v", bad, err)
		}
	}
	if _, _, err := runAdmin(t, "admin", "--data-dir", dataDir, "credits", "grant", "not-a-key", "1"); err == nil {
		t.Error("a grant to something that is not a key was made")
	}
	stopped = true
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runAdmin(t, "admin", "--data-dir", dataDir, "credits", "grant", owner.Public(), "1"); err == nil || !strings.Contains(err.Error(), "start meshd") {
		t.Errorf("grant on a stopped mesh: %v", err)
	}
}
