package devenv_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/adapter/daemon"
	"agentmesh.dev/mesh/adapter/node"
	"agentmesh.dev/mesh/devenv"
	auditfn "agentmesh.dev/mesh/functions/audit"
	"agentmesh.dev/mesh/shared/audit"
	"agentmesh.dev/mesh/shared/audit/audittest"
	"agentmesh.dev/mesh/shared/audit/tsa"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// auditAgent is an agent of the account on this project's runtime, with
// the credential its am_ key exchange gave it.
func (c *cp) auditAgent(acct, name string, handler node.Handler) *node.Agent {
	c.t.Helper()
	k := newAgent(c.t)
	red, err := daemon.Bootstrap(c.t.Context(), c.base, c.agentKey(acct, name), k, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	nk, err := keys.FromSeed[keys.NodeRole]([]byte(red.Credential.Seed))
	if err != nil {
		c.t.Fatal(err)
	}
	n, err := node.Start(c.t.Context(), node.Config{NATSURL: c.m.URLs().MeshTCP, NodeKey: nk,
		Credential: node.Credential{JWT: red.Credential.JWT, Sign: nk.SignNonce}, HeartbeatEvery: time.Second, DrainEvery: time.Second})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { _ = n.Close() })
	if handler == nil {
		handler = func(context.Context, *node.Call) error { return errors.New("unused") }
	}
	a, err := n.Host(c.t.Context(), node.AgentConfig{Key: k, Name: name, Handler: handler,
		Offerings: []node.Offering{{ID: "chat"}, {ID: "work"}}, AvailabilityClass: "always_on"})
	if err != nil {
		c.t.Fatal(err)
	}
	return a
}

// rawGet is a GET whose answer is returned as it came.
func (c *cp) rawGet(path, bearer string) (int, []byte) {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodGet, c.base+path, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatal(err)
	}
	return resp.StatusCode, body
}

// The audit records end to end, on a mesh with three copies of every
// worker and its two local test-only timestamp authorities: agents of an
// account answer each other's requests; every answered request is one row,
// in the responder's chain, naming the requester as peer (none in the
// requester's chain), and each credential mint one row of its agent; the
// day's anchor is stamped by both authorities; the account's export, fetched over HTTP with its session,
// passes audit.Check and cmd/audit-verify pinned to the export key the
// mesh publishes and the authorities' roots; and one changed row, one
// changed proof node, a token from another authority, a wrong nonce and a
// manifest re-signed with another key each fail, with their own message.
func TestAuditEndToEnd(t *testing.T) {
	c := startCP(t, func(cfg *devenv.Config) {
		cfg.Workers.Copies = 3
		// The anchor job runs as if two days had passed, so today (when
		// the traffic happens) has ended for it.
		cfg.Audit.Now = func() time.Time { return time.Now().Add(48 * time.Hour) }
	})
	acct, session := c.signIn("ana@example.org")
	bob := c.auditAgent(acct, "bob", func(ctx context.Context, call *node.Call) error {
		switch call.Offering {
		case "work":
			task, err := call.StartTask()
			if err != nil {
				return err
			}
			return task.Complete(map[string]any{"done": true})
		}
		return call.Reply(map[string]any{"text": "hello yourself"})
	})
	alice := c.auditAgent(acct, "alice", nil)

	// Four requests of alice to bob: two bare answers, a task, and an
	// offering bob does not have (refused: answered all the same).
	inputs := []struct {
		offering string
		input    map[string]any
		outcome  string
	}{
		{"chat", map[string]any{"text": "hello"}, "completed"},
		{"chat", map[string]any{"text": "again", "n": 2}, "completed"},
		{"work", map[string]any{"job": "sum"}, "completed"},
		{"nope", map[string]any{}, "OFFERING_NOT_FOUND"},
	}
	ids := map[string]int{}
	for i, in := range inputs {
		res, err := alice.Request(t.Context(), bob.ID(), in.offering, in.input, node.RequestOptions{})
		if res == nil || (err != nil) != (in.outcome != "completed") {
			t.Fatalf("request %d: %+v, %v", i, res, err)
		}
		ids[res.RequestID] = i
	}

	// Rows: the activity worker's copies append them as the answers'
	// outbox copies come by; the control plane appended one row per
	// bootstrap mint.
	chains, err := c.m.Control().Deps.Audit.Chains(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	rowsOf := func(agent string) []audit.Row {
		rows, err := chains.Rows(t.Context(), agent)
		if err != nil {
			t.Fatal(err)
		}
		return rows
	}
	deadline := time.Now().Add(20 * time.Second)
	for len(rowsOf(bob.ID())) < 1+len(inputs) || len(rowsOf(alice.ID())) < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("rows: bob %d, alice %d", len(rowsOf(bob.ID())), len(rowsOf(alice.ID())))
		}
		time.Sleep(20 * time.Millisecond)
	}
	var appended, dups, failed uint64
	for _, w := range c.m.Workers().Activity {
		s := w.Stats()
		appended, dups, failed = appended+s.AuditRows, dups+s.AuditDuplicates, failed+s.AuditFailed
	}
	if appended != uint64(len(inputs)) || failed != 0 {
		t.Fatalf("the activity copies appended %d rows (%d duplicates, %d failed), want %d", appended, dups, failed, len(inputs))
	}
	for _, party := range []struct {
		agent *node.Agent
		role  string
		peer  string
		rows  int
	}{{bob, audit.RoleResponder, alice.ID(), len(inputs)}, {alice, audit.RoleRequester, bob.ID(), 0}} {
		rows := rowsOf(party.agent.ID())
		if len(rows) != 1+party.rows {
			t.Fatalf("%s: %d rows, want %d", party.role, len(rows), 1+party.rows)
		}
		if r := rows[0]; r.Role != audit.RoleAccount || r.Peer != acct || r.Offering != "credential.mint" || r.Outcome != audit.AccountOutcome {
			t.Fatalf("%s: the first row is not its bootstrap mint: %+v", party.role, r)
		}
		seen := map[string]bool{}
		for _, r := range rows[1:] {
			i, ok := ids[r.RequestID]
			if !ok || seen[r.RequestID] || r.Role != party.role || r.Peer != party.peer {
				t.Fatalf("%s: row %+v (a request not made, seen twice, or of the wrong party)", party.role, r)
			}
			seen[r.RequestID] = true
			in := inputs[i]
			canon, _ := protocol.Canonical(in.input)
			sum := sha256.Sum256(canon)
			if r.Offering != in.offering || r.Outcome != in.outcome || r.InputSHA256 != hex.EncodeToString(sum[:]) || (in.offering == "work") != (r.TaskID != "") {
				t.Fatalf("%s: row %+v for %+v", party.role, r, in)
			}
		}
	}

	// The anchor job, as Cloud Scheduler runs its row; twice, one anchor.
	job := func() map[string]any {
		rec := httptest.NewRecorder()
		c.m.Control().Deps.Function(auditfn.Routes[0]).ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/jobs/audit-anchor", nil))
		var out map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil || rec.Code != 200 {
			t.Fatalf("anchor job: %d %s", rec.Code, rec.Body)
		}
		return out
	}
	if out := job(); out["count"] != float64(1) {
		t.Fatalf("anchor job: %v", out)
	}
	if out := job(); out["count"] != float64(0) {
		t.Fatalf("anchor job again: %v", out)
	}
	st, out := c.do(http.MethodGet, "/v1/anchors", nil, "")
	anchors, _ := out["anchors"].([]any)
	if st != 200 || len(anchors) != 1 || out["test_only"] != true || !strings.Contains(fmt.Sprint(out["note"]), "TEST-ONLY") {
		t.Fatalf("anchors: %d %v", st, out)
	}
	if a := anchors[0].(map[string]any); a["status"] != audit.StatusStamped || a["heads"] != float64(2) || a["rows"] != float64(2+len(inputs)) {
		t.Fatalf("anchor %v", a)
	}
	st, out = c.do(http.MethodGet, "/v1/anchors/authorities", nil, "")
	auths, _ := out["authorities"].([]any)
	if st != 200 || len(auths) != 2 || out["test_only"] != true {
		t.Fatalf("authorities: %d %v", st, out)
	}
	dir := t.TempDir()
	var roots []byte
	for _, a := range auths {
		m := a.(map[string]any)
		if m["test_only"] != true || !slices.Contains(devenv.LocalAuthorities, m["name"].(string)) || !strings.Contains(m["root_pem"].(string), "BEGIN CERTIFICATE") {
			t.Fatalf("authority %v", m)
		}
		roots = append(roots, m["root_pem"].(string)...)
	}
	rootsFile := filepath.Join(dir, "roots.pem")
	if err := os.WriteFile(rootsFile, roots, 0o644); err != nil {
		t.Fatal(err)
	}
	st, out = c.do(http.MethodGet, "/v1/capabilities", nil, "")
	caps, _ := out["audit"].(map[string]any)
	exportKey, _ := caps["export_key"].(string)
	if st != 200 || !keys.IsUserPublicKey(exportKey) || out["services_key"] != c.m.ServicesKey().Public() || caps["test_only_authorities"] != true {
		t.Fatalf("capabilities: %d %v", st, out)
	}

	// The export, over HTTP with the account's session.
	st, data := c.rawGet("/v1/accounts/"+acct+"/audit/export", session)
	if st != 200 {
		t.Fatalf("export: %d %s", st, data)
	}
	if strings.Contains(string(data), "hello") {
		t.Fatal("the export carries an input")
	}
	bundle, err := audit.ParseBundle(data)
	if err != nil {
		t.Fatal(err)
	}
	trust := audit.Trust{Signer: exportKey}
	for _, a := range auths {
		as, err := audit.ParseAuthorities([]byte(fmt.Sprintf(`[{"name":"x","url":"http://x","root_pem":%q}]`, a.(map[string]any)["root_pem"])))
		if err != nil {
			t.Fatal(err)
		}
		trust.Roots = append(trust.Roots, as[0].Root)
	}
	sum, err := audit.Check(bundle, trust)
	// The anchor's first stamp is from after its date ended (the local
	// authorities keep the anchor job's clock).
	day, _ := audit.ParseDate(bundle.Anchors[0].Document.Date)
	if len(sum.Stamped) != 1 || sum.Stamped[0].Date != bundle.Anchors[0].Document.Date || sum.Stamped[0].Earliest.Before(day.AddDate(0, 0, 1)) {
		t.Fatalf("stamped %+v", sum.Stamped)
	}
	sum.Stamped = nil
	want := audit.Summary{Chains: 2, Rows: 2 + len(inputs), AnchoredRows: 2 + len(inputs), Anchors: 1, Stamps: 2, Proofs: 2,
		FirstAnchor: bundle.Anchors[0].Document.Date, LastAnchor: bundle.Anchors[0].Document.Date}
	if err != nil || !reflect.DeepEqual(sum, want) {
		t.Fatalf("check: %+v, %v\nwant %+v", sum, err, want)
	}

	verifier := buildAuditVerify(t)
	write := func(name string, b *audit.Bundle) string {
		data, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	verify := func(file string) (string, int) {
		out, err := exec.Command(verifier, "-key", exportKey, "-roots", rootsFile, file).CombinedOutput()
		var exit *exec.ExitError
		switch {
		case err == nil:
			return string(out), 0
		case errors.As(err, &exit):
			return string(out), exit.ExitCode()
		}
		t.Fatal(err)
		return "", 0
	}
	if out, code := verify(filepath.Join(dir, "bundle.json")); code != 2 {
		t.Fatalf("audit-verify of no file: %d %s", code, out)
	}
	if err := os.WriteFile(filepath.Join(dir, "bundle.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, code := verify(filepath.Join(dir, "bundle.json")); code != 0 || !strings.HasPrefix(out, fmt.Sprintf("verified: 2 chains, %d rows (%d under a timestamped anchor), 1 anchors", want.Rows, want.Rows)) {
		t.Fatalf("audit-verify: %d %s", code, out)
	}

	// One link changed at a time: each fails, with its own message.
	intruder, err := tsa.New("intruder")
	if err != nil {
		t.Fatal(err)
	}
	digest, err := bundle.Anchors[0].Document.Digest()
	if err != nil {
		t.Fatal(err)
	}
	nonce, _ := new(big.Int).SetString(bundle.Anchors[0].Stamps[0].Nonce, 10)
	otherKey := newAgent(t)
	tampers := []struct {
		name   string
		mutate func(*audit.Bundle)
		link   error
		says   string
	}{
		{"one changed row", func(b *audit.Bundle) {
			for i := range b.Chains {
				if b.Chains[i].Agent == bob.ID() { // the chain with rows after its second
					b.Chains[i].Rows[1].DurationMS++
				}
			}
		}, audit.ErrChainLink, "row 3 does not link to row 2"},
		{"one changed proof node", func(b *audit.Bundle) { b.Proofs[0].Path[0] = flipHex(b.Proofs[0].Path[0]) }, audit.ErrProof, "does not lead to the root of the anchor"},
		{"a token from another authority", func(b *audit.Bundle) { b.Anchors[0].Stamps[0].Token = audittest.Token(t, intruder, digest, nonce) },
			audit.ErrTokenChain, "the token's signer does not chain to the authority's root"},
		{"a wrong nonce", func(b *audit.Bundle) { b.Anchors[0].Stamps[0].Nonce = new(big.Int).Add(nonce, big.NewInt(1)).String() },
			audit.ErrTokenNonce, "the token's nonce differs from the request's"},
		{"a manifest re-signed with another key", func(b *audit.Bundle) {
			if err := b.Sign(otherKey); err != nil {
				t.Fatal(err)
			}
		}, audit.ErrManifestSigner, "not by the expected export key"},
	}
	messages := map[string]string{}
	for _, tc := range tampers {
		b, err := audit.ParseBundle(data)
		if err != nil {
			t.Fatal(err)
		}
		tc.mutate(b)
		_, err = audit.Check(b, trust)
		if !errors.Is(err, tc.link) || !strings.Contains(err.Error(), tc.says) {
			t.Fatalf("%s: %v, want %v saying %q", tc.name, err, tc.link, tc.says)
		}
		if other, dup := messages[err.Error()]; dup {
			t.Fatalf("%s and %s fail with the same message %q", tc.name, other, err)
		}
		messages[err.Error()] = tc.name
		out, code := verify(write(strings.ReplaceAll(tc.name, " ", "-")+".json", b))
		if code != 1 || !strings.Contains(out, "audit-verify: FAILED: "+err.Error()) {
			t.Fatalf("audit-verify of %s: %d %s", tc.name, code, out)
		}
	}
	// Re-signed with another key without naming it: the signature itself
	// fails, even with nothing pinned.
	b, _ := audit.ParseBundle(data)
	msg, _ := json.Marshal(b.Manifest)
	b.Signature = base64.RawURLEncoding.EncodeToString(otherKey.Sign(msg))
	if err := audit.Verify(b); !errors.Is(err, audit.ErrManifestSignature) {
		t.Fatalf("a signature by another key: %v", err)
	}
}

// flipHex changes the first hex digit of s.
func flipHex(s string) string {
	c := byte('0')
	if s[0] == '0' {
		c = '1'
	}
	return string(c) + s[1:]
}

// buildAuditVerify builds cmd/audit-verify for the test.
func buildAuditVerify(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds cmd/audit-verify")
	}
	bin := filepath.Join(t.TempDir(), "audit-verify")
	if out, err := exec.Command("go", "build", "-o", bin, "agentmesh.dev/mesh/cmd/audit-verify").CombinedOutput(); err != nil {
		t.Fatalf("build audit-verify: %v\n%s", err, out)
	}
	return bin
}
