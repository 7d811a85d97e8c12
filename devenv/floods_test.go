package devenv_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/devenv"
	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/guest"
)

// postFrom posts body as the client at ip: the mesh trusts one proxy hop,
// so the right-most X-Forwarded-For address is the client.
func (c *cp) postFrom(ip, path string, body any) (int, map[string]any) {
	c.t.Helper()
	var rd io.Reader = http.NoBody
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			c.t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(http.MethodPost, c.base+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Forwarded-For", ip)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	raw, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(raw, &out); err != nil {
		c.t.Fatalf("POST %s: %d, not JSON: %s", path, resp.StatusCode, raw)
	}
	return resp.StatusCode, out
}

// isLimited checks a refusal is the project's 429: JSON with the error
// text, RATE_LIMITED, when to retry and which limit.
func isLimited(t *testing.T, st int, out map[string]any, limit string) {
	t.Helper()
	ms, _ := out["retry_after_ms"].(float64)
	details, _ := out["details"].(map[string]any)
	if st != http.StatusTooManyRequests || out["code"] != string(errs.RateLimited) || out["error"] == "" || ms <= 0 ||
		(limit != "" && details["limit"] != limit) {
		t.Fatalf("want 429 %s with retry_after_ms, got %d %v", limit, st, out)
	}
}

func startFloodCP(t *testing.T) *cp {
	// The HTTP limit per address (600 a minute on meshd) is out of the way,
	// as it is for a flood spread over addresses.
	return startCP(t, func(c *devenv.Config) { c.TrustedProxyHops = 1; c.RateLimit = 1 << 20 })
}

// 34 addresses, on one /24 or on 34 of them, cannot take the whole guest
// pool: one network holds at most 10 leases, and the last 10 free leases go
// one each to networks that hold none, so a newcomer still gets one.
func TestGuestFloodKeepsThePoolOpen(t *testing.T) {
	c := startFloodCP(t)
	d := guest.DefaultLimits()
	leased := 0
	for i := range 34 {
		for range 3 {
			st, out := c.postFrom(fmt.Sprintf("198.51.100.%d", i+1), "/v1/guest", nil)
			if st == http.StatusOK {
				leased++
				continue
			}
			isLimited(t, st, out, "")
		}
	}
	if leased != d.LivePerNetwork {
		t.Fatalf("34 addresses of one /24 hold %d leases, want %d", leased, d.LivePerNetwork)
	}
	st, out := c.postFrom("198.51.100.200", "/v1/guest", nil)
	isLimited(t, st, out, "guest-live-per-network")

	for i := range 34 {
		for range 3 {
			st, out := c.postFrom(fmt.Sprintf("10.%d.0.1", i), "/v1/guest", nil)
			if st == http.StatusOK {
				leased++
				continue
			}
			isLimited(t, st, out, "") // never 503: the pool is not empty
		}
	}
	_, status := c.do(http.MethodGet, "/auth/status", nil, "")
	if status["issued"] != float64(leased) || status["available"].(float64) < 1 || leased >= d.Pool {
		t.Fatalf("after 68 addresses asked 204 times: %d leased, status %v", leased, status)
	}
	if st, out := c.postFrom("203.0.113.9", "/v1/guest", nil); st != http.StatusOK {
		t.Fatalf("a newcomer after the flood: %d %v", st, out)
	}
	t.Logf("68 addresses (34 on one /24, 34 on their own /24s) asking 3 times each: %d leases of %d", leased, d.Pool)
}

// One address makes at most the sign-up limit of accounts per window; the
// next request makes no account and mails nothing; an hour later (on the
// control plane's clock) it may again.
func TestAccountFloodFromOneAddress(t *testing.T) {
	c := startFloodCP(t)
	n := account.DefaultLimits().SignUp.PerAddress.Max
	for i := range n {
		if st, out := c.postFrom("192.0.2.7", "/v1/accounts", map[string]any{"email": fmt.Sprintf("flood%d@example.org", i)}); st != http.StatusAccepted {
			t.Fatalf("sign-up %d: %d %v", i+1, st, out)
		}
	}
	st, out := c.postFrom("192.0.2.7", "/v1/accounts", map[string]any{"email": "one-too-many@example.org"})
	isLimited(t, st, out, "signup-per-address")
	if !strings.Contains(out["error"].(string), "from your address") {
		t.Errorf("the refusal does not say what was limited: %v", out)
	}
	if _, err := c.m.Control().Accounts.AccountByEmail(t.Context(), "one-too-many@example.org"); errs.CodeOf(err) != errs.NotFound {
		t.Errorf("the refused sign-up made an account: %v", err)
	}
	mailed := 0
	for _, m := range c.smtp.Messages() {
		if strings.HasPrefix(m.To[0], "flood") {
			mailed++
		}
		if m.To[0] == "one-too-many@example.org" {
			t.Error("the refused sign-up was mailed")
		}
	}
	if mailed != n {
		t.Errorf("%d sign-up mails, want %d", mailed, n)
	}
	// Another address of the same /24 still signs up.
	if st, out := c.postFrom("192.0.2.8", "/v1/accounts", map[string]any{"email": "neighbour@example.org"}); st != http.StatusAccepted {
		t.Errorf("a neighbour: %d %v", st, out)
	}
	c.clock.Advance(2 * time.Hour)
	if st, out := c.postFrom("192.0.2.7", "/v1/accounts", map[string]any{"email": "one-too-many@example.org"}); st != http.StatusAccepted {
		t.Errorf("two hours later: %d %v", st, out)
	}
}

// Whoever asks and through whichever route, one address is mailed at most
// MailPerRecipient codes a window: the next request is refused and nothing
// is sent.
func TestCodeMailFloodToOneAddress(t *testing.T) {
	c := startFloodCP(t)
	const victim = "victim@example.org"
	n := account.DefaultLimits().MailPerRecipient.Max
	routes := []struct {
		path string
		body map[string]any
	}{
		{"/v1/accounts", map[string]any{"email": victim}},
		{"/v1/login", map[string]any{"email": victim}},
		{"/v1/connect", map[string]any{"email": victim, "app_name": "flood"}},
	}
	for i := range n {
		r := routes[i%len(routes)]
		if st, out := c.postFrom(fmt.Sprintf("10.%d.0.1", i), r.path, r.body); st != http.StatusAccepted {
			t.Fatalf("request %d (%s): %d %v", i+1, r.path, st, out)
		}
	}
	count := func() int {
		k := 0
		for _, m := range c.smtp.Messages() {
			if m.To[0] == victim {
				k++
			}
		}
		return k
	}
	if got := count(); got != n {
		t.Fatalf("%d mails to the victim, want %d", got, n)
	}
	for _, r := range routes {
		st, out := c.postFrom("172.16.0.1", r.path, r.body)
		isLimited(t, st, out, "mail-per-recipient")
	}
	if got := count(); got != n {
		t.Fatalf("refused requests mailed the victim: %d mails, want %d", got, n)
	}
}
