package devenv_test

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/protocol"
)

// connectMail waits for the approval mail to addr and returns its text and
// code.
func (c *cp) connectMail(addr string) (string, string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	msg, err := c.smtp.Wait(ctx, addr)
	if err != nil {
		c.t.Fatalf("no mail to %s: %v", addr, err)
	}
	m := codeRE.FindStringSubmatch(msg.Message.Text)
	if m == nil {
		c.t.Fatalf("no code in mail: %q", msg.Message.Text)
	}
	return msg.Message.Text, m[1]
}

// noMail asserts nothing more is mailed to addr for a moment.
func (c *cp) noMail(addr string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if msg, err := c.smtp.Wait(ctx, addr); err == nil {
		c.t.Errorf("unexpected mail to %s: %q", addr, msg.Message.Subject)
	}
}

// startConnect posts /v1/connect without a session and returns the
// request id and the mailed code.
func (c *cp) startConnect(email, app string) (string, string) {
	c.t.Helper()
	st, out := c.post("/v1/connect", map[string]any{"email": email, "app_name": app}, "")
	if st != http.StatusAccepted || out["status"] != "verification_required" || out["poll_after_ms"] != 2000.0 {
		c.t.Fatalf("connect: %d %v", st, out)
	}
	if _, err := protocol.ParseTime(out["expires_at"].(string)); err != nil {
		c.t.Fatalf("expires_at: %v", out)
	}
	text, code := c.connectMail(strings.ToLower(email))
	if want := fmt.Sprintf("An app called %q asks to connect to your agentmesh account", app); !strings.Contains(text, want) {
		c.t.Fatalf("mail does not name the app: %q", text)
	}
	return out["request_id"].(string), code
}

// useAppCreds connects to the broker with the creds-file form and
// publishes on the app's own feed: no permission violation.
func useAppCreds(t *testing.T, c *cp, out map[string]any) {
	t.Helper()
	errCh := make(chan error, 8)
	nc, err := nats.Connect(c.m.URLs().MeshTCP, nats.UserCredentialBytes([]byte(out["creds"].(string))), nats.MaxReconnects(0),
		inboxOption(t, out), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errCh <- err }))
	if err != nil {
		t.Fatalf("connect with the app credentials: %v", err)
	}
	defer nc.Close()
	if err := nc.Publish(protocol.FeedSubject(out["public_key"].(string), "status"), []byte("up")); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errCh:
		t.Fatalf("the app was refused on its own feed: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
}

func wrongCode(code string) string {
	if code == "000000" {
		return "111111"
	}
	return "000000"
}

func TestConnectByMailedCode(t *testing.T) {
	c := startCP(t)
	id, code := c.startConnect("Ana@Example.org", "dashboard")

	st, out := c.post("/v1/connect/status", map[string]any{"request_id": id}, "")
	if st != 200 || out["status"] != "pending" || out["app_name"] != "dashboard" || out["poll_after_ms"] != 2000.0 || out["seed"] != nil {
		t.Fatalf("poll: %d %v", st, out)
	}
	st, out = c.post("/v1/connect/status", map[string]any{"request_id": id, "code": wrongCode(code)}, "")
	if st != 401 || out["code"] != "UNAUTHORIZED" {
		t.Fatalf("wrong code: %d %v", st, out)
	}

	st, out = c.post("/v1/connect/status", map[string]any{"request_id": id, "code": code}, "")
	if st != 200 || out["status"] != "connected" || out["request_id"] != id || out["seed"] == "" || out["seed"] == nil ||
		out["jwt"] == nil || out["creds"] == nil || out["name"] != "dashboard" || !strings.HasPrefix(out["app_id"].(string), "app_") ||
		!strings.Contains(out["note"].(string), "shown once") {
		t.Fatalf("approve: %d %v", st, out)
	}
	appID := out["app_id"].(string)
	useAppCreds(t, c, out)

	// Credentials are handed out once: afterwards, the app id and a note.
	for _, body := range []map[string]any{{"request_id": id}, {"request_id": id, "code": code}} {
		st, again := c.post("/v1/connect/status", body, "")
		if st != 200 || again["status"] != "connected" || again["app_id"] != appID || again["seed"] != nil || again["jwt"] != nil ||
			!strings.Contains(again["note"].(string), "not shown again") {
			t.Fatalf("again %v: %d %v", body, st, again)
		}
	}

	// The code proved the address: the account is verified, signs in, and
	// lists the app.
	acct, tok := c.signIn("ana@example.org")
	st, list := c.do(http.MethodGet, "/v1/accounts/"+acct+"/apps", nil, tok)
	if st != 200 || len(list["apps"].([]any)) != 1 || list["apps"].([]any)[0].(map[string]any)["app_id"] != appID {
		t.Fatalf("apps: %d %v", st, list)
	}
}

// A new address and an existing one get the same answer and the same mail.
func TestConnectDoesNotRevealAccounts(t *testing.T) {
	c := startCP(t)
	c.signIn("old@example.org")
	st1, a := c.post("/v1/connect", map[string]any{"email": "old@example.org", "app_name": "dashboard"}, "")
	st2, b := c.post("/v1/connect", map[string]any{"email": "new@example.org", "app_name": "dashboard"}, "")
	if st1 != st2 || st1 != 202 || !slices.Equal(slices.Sorted(maps.Keys(a)), slices.Sorted(maps.Keys(b))) {
		t.Fatalf("answers differ: %d %v / %d %v", st1, a, st2, b)
	}
	for k, v := range a {
		if k != "request_id" && k != "expires_at" && b[k] != v {
			t.Errorf("%s: %v vs %v", k, v, b[k])
		}
	}
	oldText, _ := c.connectMail("old@example.org")
	newText, _ := c.connectMail("new@example.org")
	strip := func(s, addr string) string { return codeRE.ReplaceAllString(strings.ReplaceAll(s, addr, ""), "") }
	if strip(oldText, "old@example.org") != strip(newText, "new@example.org") {
		t.Errorf("mails differ:\n%s\n%s", oldText, newText)
	}
}

func TestConnectWrongCodesBurn(t *testing.T) {
	c := startCP(t)
	id, code := c.startConnect("ana@example.org", "dashboard")
	for i := range 5 {
		st, out := c.post("/v1/connect/status", map[string]any{"request_id": id, "code": wrongCode(code)}, "")
		if st != 401 {
			t.Fatalf("wrong code %d: %d %v", i, st, out)
		}
		if i == 4 && !strings.Contains(out["error"].(string), "last try") {
			t.Errorf("last try: %v", out)
		}
	}
	for _, body := range []map[string]any{{"request_id": id}, {"request_id": id, "code": code}} {
		st, out := c.post("/v1/connect/status", body, "")
		if st != 200 || out["status"] != "denied" || out["seed"] != nil {
			t.Fatalf("burned %v: %d %v", body, st, out)
		}
	}
}

func TestConnectExpires(t *testing.T) {
	c := startCP(t)
	id, code := c.startConnect("ana@example.org", "dashboard")
	c.clock.Advance(16 * time.Minute)
	for _, body := range []map[string]any{{"request_id": id}, {"request_id": id, "code": code}} {
		st, out := c.post("/v1/connect/status", body, "")
		if st != 200 || out["status"] != "expired" || out["seed"] != nil {
			t.Fatalf("expired %v: %d %v", body, st, out)
		}
	}
}

// With the session of the account that owns the address, the app is made
// at once and nothing is mailed; another account's session does not count.
func TestConnectWithSession(t *testing.T) {
	c := startCP(t)
	_, tok := c.signIn("ana@example.org")
	_, other := c.signIn("bo@example.org")
	st, out := c.post("/v1/connect", map[string]any{"email": "ana@example.org", "app_name": "dashboard"}, tok)
	if st != 200 || out["status"] != "connected" || out["seed"] == nil || out["request_id"] != nil {
		t.Fatalf("fast path: %d %v", st, out)
	}
	useAppCreds(t, c, out)
	c.noMail("ana@example.org")

	st, out = c.post("/v1/connect", map[string]any{"email": "ana@example.org", "app_name": "dashboard"}, other)
	if st != 202 || out["status"] != "verification_required" || out["seed"] != nil {
		t.Fatalf("another account's session: %d %v", st, out)
	}
	c.connectMail("ana@example.org")
}

func TestConnectRefusals(t *testing.T) {
	c := startCP(t)
	for _, body := range []map[string]any{
		{"email": "ana@example.org", "app_name": "dashboard", "scopes": []string{"all"}},
		{"email": "ana@example.org"},
		{"email": "not-an-address", "app_name": "dashboard"},
		{},
	} {
		if st, out := c.post("/v1/connect", body, ""); st != 400 || out["code"] != "INVALID_REQUEST" {
			t.Errorf("connect %v: %d %v", body, st, out)
		}
	}
	c.noMail("ana@example.org")
	id, _ := c.startConnect("ana@example.org", "dashboard")
	if st, out := c.post("/v1/connect/status", map[string]any{"request_id": id, "extra": true}, ""); st != 400 || !strings.Contains(out["error"].(string), "unknown member") {
		t.Errorf("status with an unknown member: %d %v", st, out)
	}
	if st, out := c.post("/v1/connect/status", map[string]any{}, ""); st != 400 {
		t.Errorf("status without request_id: %d %v", st, out)
	}
	for _, unknown := range []string{protocol.NewID(), "nope"} {
		if st, out := c.post("/v1/connect/status", map[string]any{"request_id": unknown}, ""); st != 404 || out["code"] != "NOT_FOUND" {
			t.Errorf("unknown id %q: %d %v", unknown, st, out)
		}
	}
}

// Concurrent status calls with the right code: exactly one gets a seed.
func TestConnectConcurrentApproval(t *testing.T) {
	c := startCP(t)
	id, code := c.startConnect("ana@example.org", "dashboard")
	const n = 8
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		seeds int
		tally = map[string]int{}
		start = make(chan struct{})
	)
	for range n {
		wg.Go(func() {
			<-start
			st, out := c.post("/v1/connect/status", map[string]any{"request_id": id, "code": code}, "")
			mu.Lock()
			defer mu.Unlock()
			tally[fmt.Sprintf("%d %v seed=%v", st, out["status"], out["seed"] != nil)]++
			switch {
			case st == 200 && out["seed"] != nil:
				seeds++
			case st == 200 && out["status"] == "connected", st == 409:
			default:
				t.Errorf("racer: %d %v", st, out)
			}
		})
	}
	close(start)
	wg.Wait()
	t.Logf("answers: %v", tally)
	if seeds != 1 {
		t.Fatalf("%d calls got a seed, want exactly 1", seeds)
	}
	st, out := c.post("/v1/connect/status", map[string]any{"request_id": id}, "")
	if st != 200 || out["status"] != "connected" || out["seed"] != nil {
		t.Fatalf("after: %d %v", st, out)
	}
	acct, tok := c.signIn("ana@example.org")
	if st, list := c.do(http.MethodGet, "/v1/accounts/"+acct+"/apps", nil, tok); st != 200 || len(list["apps"].([]any)) != 1 {
		t.Errorf("apps: %d %v", st, list)
	}
}
