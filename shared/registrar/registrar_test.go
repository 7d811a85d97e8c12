package registrar_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/registrar"
	"agentmesh.dev/mesh/shared/store"
	"agentmesh.dev/mesh/shared/store/boltstore"
)

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// mailbox records the mail the registrar sends and can be told to fail.
type mailbox struct {
	mu   sync.Mutex
	sent []mail.Message
	fail bool
}

func (m *mailbox) Send(_ context.Context, msg mail.Message) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail {
		return errors.New("relay down")
	}
	m.sent = append(m.sent, msg)
	return nil
}

var codeRE = regexp.MustCompile(`\b(\d{6})\b`)

// lastCode is the code in the last mail to addr.
func (m *mailbox) lastCode(t *testing.T, addr string) string {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := len(m.sent) - 1; i >= 0; i-- {
		if m.sent[i].To == addr {
			if c := codeRE.FindStringSubmatch(m.sent[i].Text); c != nil {
				return c[1]
			}
		}
	}
	t.Fatalf("no code mailed to %s", addr)
	return ""
}

type env struct {
	t     *testing.T
	svc   *registrar.Service
	st    store.Store
	clock *clock
	mail  *mailbox
	key   *keys.Registrar
	ips   atomic.Int32
}

const regURL = "https://names.example.org"

func newEnv(t *testing.T, mut ...func(*registrar.Config)) *env {
	t.Helper()
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "control.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	key, err := keys.Generate[keys.RegistrarRole]()
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, st: st, clock: &clock{t: time.Date(2026, 8, 1, 12, 0, 0, 0, time.UTC)}, mail: &mailbox{}, key: key}
	cfg := registrar.Config{Store: st, Mail: e.mail, Signer: key, URL: regURL + "/", Now: e.clock.Now}
	for _, f := range mut {
		f(&cfg)
	}
	e.svc = registrar.New(cfg)
	return e
}

// session proves addr by mail and returns a session token.
func (e *env) session(addr string) string {
	e.t.Helper()
	// Each session comes from its own client address, so that setting up
	// many sessions meets no per-IP limit.
	ip := fmt.Sprintf("198.51.%d.%d", e.ips.Add(1)/250, e.ips.Load()%250)
	if _, err := e.svc.StartEmail(e.t.Context(), addr, ip); err != nil {
		e.t.Fatalf("start %s: %v", addr, err)
	}
	v, err := e.svc.Verify(e.t.Context(), addr, e.mail.lastCode(e.t, addr), ip)
	if err != nil {
		e.t.Fatalf("verify %s: %v", addr, err)
	}
	return v.Token
}

// claim claims name for the session, failing the test on error.
func (e *env) claim(tok, name, op string) string {
	e.t.Helper()
	c, err := e.svc.Claim(e.t.Context(), tok, name, op)
	if err != nil {
		e.t.Fatalf("claim %s: %v", name, err)
	}
	return c.Handle
}

func newAgent(t *testing.T) *keys.Agent {
	t.Helper()
	k, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// wantErr checks err's code, HTTP status and a fragment of its message.
func wantErr(t *testing.T, what string, err error, code errs.Code, status int, fragment string) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error, want %s", what, code)
	}
	e := errs.As(err)
	if e.Code != code || e.HTTPStatus() != status || !strings.Contains(e.Message, fragment) {
		t.Fatalf("%s: got %s %d %q, want %s %d containing %q", what, e.Code, e.HTTPStatus(), e.Message, code, status, fragment)
	}
}

func TestEmailCodes(t *testing.T) {
	ctx := t.Context()
	t.Run("a code works once, and deletes the others", func(t *testing.T) {
		e := newEnv(t)
		st, err := e.svc.StartEmail(ctx, "  Ana@Example.ORG ", "192.0.2.1")
		if err != nil || st.Email != "ana@example.org" || st.Delivery != "email" {
			t.Fatalf("start: %+v %v", st, err)
		}
		first := e.mail.lastCode(t, "ana@example.org")
		if _, err := e.svc.StartEmail(ctx, "ana@example.org", "192.0.2.1"); err != nil {
			t.Fatal(err)
		}
		second := e.mail.lastCode(t, "ana@example.org")
		if e.mail.sent[0].Kind != "handle-code" || strings.Contains(e.mail.sent[0].Subject, first) {
			t.Fatalf("mail: %+v", e.mail.sent[0])
		}
		// The first mail's code still works after the second was sent.
		v, err := e.svc.Verify(ctx, "ANA@example.org", first, "192.0.2.1")
		if err != nil || !strings.HasPrefix(v.Token, registrar.SessionPrefix) || !v.ExpiresAt.Equal(e.clock.Now().Add(8*time.Hour)) {
			t.Fatalf("verify: %+v %v", v, err)
		}
		// Every code of the address was deleted with that success.
		_, err = e.svc.Verify(ctx, "ana@example.org", second, "192.0.2.1")
		wantErr(t, "second code after success", err, errs.Unauthorized, 401, "no code is pending")
		_, err = e.svc.Verify(ctx, "ana@example.org", first, "192.0.2.1")
		wantErr(t, "reused code", err, errs.Unauthorized, 401, "unknown or already used")
	})
	t.Run("wrong codes count, the fifth burns", func(t *testing.T) {
		e := newEnv(t)
		if _, err := e.svc.StartEmail(ctx, "bo@example.org", "192.0.2.1"); err != nil {
			t.Fatal(err)
		}
		right := e.mail.lastCode(t, "bo@example.org")
		wrong := "000000"
		if right == wrong {
			wrong = "111111"
		}
		for left := 4; left >= 1; left-- {
			_, err := e.svc.Verify(ctx, "bo@example.org", wrong, "192.0.2.1")
			wantErr(t, "wrong code", err, errs.Unauthorized, 401, "tries left")
			if got := errs.As(err).Details["attempts_left"]; got != left {
				t.Fatalf("attempts_left = %v, want %d", got, left)
			}
		}
		_, err := e.svc.Verify(ctx, "bo@example.org", wrong, "192.0.2.1")
		wantErr(t, "fifth wrong code", err, errs.Unauthorized, 401, "last try")
		_, err = e.svc.Verify(ctx, "bo@example.org", right, "192.0.2.1")
		wantErr(t, "right code after it burned", err, errs.Unauthorized, 401, "no code is pending")
	})
	t.Run("a code expires after 15 minutes", func(t *testing.T) {
		e := newEnv(t)
		if _, err := e.svc.StartEmail(ctx, "cy@example.org", "192.0.2.1"); err != nil {
			t.Fatal(err)
		}
		code := e.mail.lastCode(t, "cy@example.org")
		e.clock.Advance(15 * time.Minute)
		_, err := e.svc.Verify(ctx, "cy@example.org", code, "192.0.2.1")
		wantErr(t, "expired code", err, errs.Unauthorized, 401, "expired")
	})
	t.Run("refusals", func(t *testing.T) {
		e := newEnv(t)
		_, err := e.svc.StartEmail(ctx, "not-an-address", "192.0.2.1")
		wantErr(t, "bad address", err, errs.InvalidRequest, 400, "email must be an address")
		_, err = e.svc.Verify(ctx, "nobody@example.org", "123456", "192.0.2.1")
		wantErr(t, "unknown address", err, errs.Unauthorized, 401, "no code is pending")
		_, err = e.svc.Verify(ctx, "nobody@example.org", " ", "192.0.2.1")
		wantErr(t, "empty code", err, errs.InvalidRequest, 400, "code is required")
		e.mail.fail = true
		_, err = e.svc.StartEmail(ctx, "dee@example.org", "192.0.2.1")
		wantErr(t, "mail down", err, errs.DependencyFailed, 502, "could not be mailed")
	})
}

func TestRateLimits(t *testing.T) {
	ctx := t.Context()
	small := func(c *registrar.Config) {
		c.Limits = registrar.Limits{CodesPerAddress: 2, CodesPerIP: 3, CodesOverall: 4, PairingPerIP: 2}
	}
	for _, tc := range []struct {
		name  string
		sends [][2]string // address, ip
		limit string
	}{
		{"per address", [][2]string{{"a@example.org", "192.0.2.1"}, {"a@example.org", "192.0.2.2"}, {"a@example.org", "192.0.2.3"}}, "code-per-address"},
		{"per IP", [][2]string{{"a@example.org", "192.0.2.1"}, {"b@example.org", "192.0.2.1"}, {"c@example.org", "192.0.2.1"}, {"d@example.org", "192.0.2.1"}}, "code-per-ip"},
		{"overall", [][2]string{{"a@example.org", "192.0.2.1"}, {"b@example.org", "192.0.2.2"}, {"c@example.org", "192.0.2.3"}, {"d@example.org", "192.0.2.4"}, {"e@example.org", "192.0.2.5"}}, "code-overall"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, small)
			last := len(tc.sends) - 1
			for _, s := range tc.sends[:last] {
				if _, err := e.svc.StartEmail(ctx, s[0], s[1]); err != nil {
					t.Fatalf("%v: %v", s, err)
				}
			}
			sent := len(e.mail.sent)
			_, err := e.svc.StartEmail(ctx, tc.sends[last][0], tc.sends[last][1])
			wantErr(t, "over the limit", err, errs.RateLimited, http.StatusTooManyRequests, "too many")
			if got := errs.As(err); got.Details["limit"] != tc.limit || got.RetryAfterMS <= 0 || !got.Retryable {
				t.Fatalf("refusal %+v, want limit %s with retry_after_ms", got, tc.limit)
			}
			if len(e.mail.sent) != sent {
				t.Fatal("a refused request sent mail")
			}
			// Two windows later the counters have rolled off.
			e.clock.Advance(2 * time.Hour)
			if _, err := e.svc.StartEmail(ctx, tc.sends[last][0], tc.sends[last][1]); err != nil {
				t.Fatalf("after the window: %v", err)
			}
		})
	}
	t.Run("a refusal by one limit does not use up the others", func(t *testing.T) {
		e := newEnv(t, small)
		for range 2 {
			if _, err := e.svc.StartEmail(ctx, "a@example.org", "192.0.2.1"); err != nil {
				t.Fatal(err)
			}
		}
		for range 3 { // refused per address; the IP's count stays at 2
			if _, err := e.svc.StartEmail(ctx, "a@example.org", "192.0.2.1"); errs.CodeOf(err) != errs.RateLimited {
				t.Fatalf("want 429, got %v", err)
			}
		}
		if _, err := e.svc.StartEmail(ctx, "b@example.org", "192.0.2.1"); err != nil {
			t.Fatalf("the IP's third code: %v", err)
		}
	})
	t.Run("an IPv6 /64 is one client", func(t *testing.T) {
		e := newEnv(t, small)
		for i, ip := range []string{"2001:db8:1:2::1", "2001:db8:1:2::2", "2001:db8:1:2:ffff:ffff:ffff:ffff"} {
			if _, err := e.svc.StartEmail(ctx, fmt.Sprintf("u%d@example.org", i), ip); err != nil {
				t.Fatalf("%s: %v", ip, err)
			}
		}
		_, err := e.svc.StartEmail(ctx, "u9@example.org", "2001:db8:1:2::abcd")
		wantErr(t, "a fourth address of the /64", err, errs.RateLimited, 429, "verification codes from your address")
		if errs.As(err).Details["limit"] != "code-per-ip" {
			t.Fatalf("limit %v", errs.As(err).Details)
		}
		if _, err := e.svc.StartEmail(ctx, "u9@example.org", "2001:db8:1:3::1"); err != nil {
			t.Fatalf("another /64: %v", err)
		}
		agent := newAgent(t)
		sig := protocol.SignPair(agent, "ABC-DEF")
		for _, ip := range []string{"2001:db8:9::1", "2001:db8:9::2"} {
			_, err := e.svc.CompletePairing(ctx, "ABC-DEF", agent.Public(), sig, ip)
			wantErr(t, "unknown code", err, errs.NotFound, 404, "unknown, used or expired")
		}
		_, err = e.svc.CompletePairing(ctx, "ABC-DEF", agent.Public(), sig, "2001:db8:9::3")
		wantErr(t, "a third pairing from the /64", err, errs.RateLimited, 429, "pairing attempts")
	})
	t.Run("pairing per IP", func(t *testing.T) {
		e := newEnv(t, small)
		agent := newAgent(t)
		for range 2 {
			_, err := e.svc.CompletePairing(ctx, "ABC-DEF", agent.Public(), protocol.SignPair(agent, "ABC-DEF"), "192.0.2.9")
			wantErr(t, "unknown code", err, errs.NotFound, 404, "unknown, used or expired")
		}
		_, err := e.svc.CompletePairing(ctx, "ABC-DEF", agent.Public(), protocol.SignPair(agent, "ABC-DEF"), "192.0.2.9")
		wantErr(t, "third try", err, errs.RateLimited, 429, "pairing attempts")
		if _, err := e.svc.CompletePairing(ctx, "ABC-DEF", agent.Public(), protocol.SignPair(agent, "ABC-DEF"), "192.0.2.10"); errs.CodeOf(err) != errs.NotFound {
			t.Fatalf("another IP: %v", err)
		}
	})
}

func TestSessions(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t)
	tok := e.session("ana@example.org")
	e.clock.Advance(8*time.Hour - time.Second)
	e.claim(tok, "early", "Ana")
	e.clock.Advance(time.Second)
	_, err := e.svc.Claim(ctx, tok, "late", "")
	wantErr(t, "expired session", err, errs.Unauthorized, 401, "expired")
	// An expired session is deleted when it is presented.
	if n := e.count(registrar.CollSessions); n != 0 {
		t.Fatalf("%d sessions left after the expired one was presented", n)
	}
	_, err = e.svc.Claim(ctx, "", "x", "Ana")
	wantErr(t, "no token", err, errs.Unauthorized, 401, "Bearer")
	_, err = e.svc.Claim(ctx, "rgs_forged", "x", "Ana")
	wantErr(t, "unknown token", err, errs.Unauthorized, 401, "unknown or expired")
	_, err = e.svc.StartPairing(ctx, tok, "early.ana@example.org")
	wantErr(t, "pairing with an expired session", err, errs.Unauthorized, 401, "expired")
	// So are sessions presented expired to pair/start and to the list.
	for i, present := range []func(string) error{
		func(tok string) error { _, err := e.svc.StartPairing(ctx, tok, "early.ana@example.org"); return err },
		func(tok string) error { _, err := e.svc.Mine(ctx, tok); return err },
	} {
		v, err := e.svc.SessionFor(ctx, "ana@example.org", "console")
		if err != nil {
			t.Fatal(err)
		}
		e.clock.Advance(8 * time.Hour)
		wantErr(t, "expired session", present(v.Token), errs.Unauthorized, 401, "expired")
		if n := e.count(registrar.CollSessions); n != 0 {
			t.Fatalf("route %d: %d sessions left after the expired one was presented", i, n)
		}
	}

	// The console's session for an address it proved.
	v, err := e.svc.SessionFor(ctx, "Ana@Example.org", "console")
	if err != nil {
		t.Fatal(err)
	}
	h := e.claim(v.Token, "from-console", "")
	if r, err := e.svc.Resolve(ctx, h, ""); err != nil || r.Card.ClaimedVia != "console" || r.Card.Operator.Name != "Ana" {
		t.Fatalf("console claim: %+v %v", r.Card, err)
	}
	for _, p := range []string{"", "Console", "a b", strings.Repeat("x", 65)} {
		_, err := e.svc.SessionFor(ctx, "ana@example.org", p)
		wantErr(t, "provenance "+p, err, errs.InvalidRequest, 400, "provenance")
	}
}

func TestClaim(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t)
	ana := e.session("ana@example.org")

	// The first claim of an address needs the operator name.
	_, err := e.svc.Claim(ctx, ana, "coder", "")
	wantErr(t, "first claim without operator", err, errs.OperatorRequired, 400, "operator name")
	c, err := e.svc.Claim(ctx, ana, "Coder", "Ana Lopez")
	if err != nil || c.Handle != "Coder.ana@example.org" || c.OperatorName != "Ana Lopez" || c.Existing {
		t.Fatalf("first claim: %+v %v", c, err)
	}
	// Later claims inherit it; another name given later is ignored.
	if c, err := e.svc.Claim(ctx, ana, "writer", ""); err != nil || c.OperatorName != "Ana Lopez" {
		t.Fatalf("second claim: %+v %v", c, err)
	}
	if c, err := e.svc.Claim(ctx, ana, "reader", "Someone Else"); err != nil || c.OperatorName != "Ana Lopez" {
		t.Fatalf("third claim: %+v %v", c, err)
	}
	// The same address claiming its own handle again, in any case.
	if c, err := e.svc.Claim(ctx, ana, "CODER", ""); err != nil || !c.Existing || c.Handle != "Coder.ana@example.org" {
		t.Fatalf("reclaim: %+v %v", c, err)
	}
	// Uniqueness is on the case-folded whole string, first come first
	// served: another address whose handle folds to the same string is
	// refused, and the first claim keeps its display case.
	ops := e.session("ops@example.org")
	if h := e.claim(ops, "Bot.Team", "Ops"); h != "Bot.Team.ops@example.org" {
		t.Fatalf("display case: %s", h)
	}
	team := e.session("team.ops@example.org")
	_, err = e.svc.Claim(ctx, team, "bot", "Team")
	wantErr(t, "case-folded collision", err, errs.Conflict, 409, "taken: the handle Bot.Team.ops@example.org")
	// The failed claim set no operator name for that address.
	_, err = e.svc.Claim(ctx, team, "other", "")
	wantErr(t, "operator after a failed claim", err, errs.OperatorRequired, 400, "operator")

	// An account's verified address brings its operator name and links
	// the handle to the account.
	if err := e.st.RunTx(ctx, func(tx store.Tx) error {
		if err := tx.Set(account.CollEmails, "acct@example.org", map[string]any{"account_id": "acct_1"}); err != nil {
			return err
		}
		return tx.Set(account.CollAccounts, "acct_1", account.Account{ID: "acct_1", Email: "acct@example.org", Verified: true, OperatorName: "Acme"})
	}); err != nil {
		t.Fatal(err)
	}
	acct := e.session("acct@example.org")
	if c, err := e.svc.Claim(ctx, acct, "helper", ""); err != nil || c.OperatorName != "Acme" {
		t.Fatalf("account operator: %+v %v", c, err)
	}
	var stored account.Handle
	if err := store.Get(ctx, e.st, account.CollHandles, "helper.acct@example.org", &stored); err != nil || stored.AccountID != "acct_1" || stored.ClaimedVia != "email" {
		t.Fatalf("stored handle: %+v %v", stored, err)
	}
}

func TestNames(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t)
	tok := e.session("ana@example.org")
	e.claim(tok, "first", "Ana")
	for _, tc := range []struct {
		name, want string // want: "" accepted, else a fragment of the refusal
	}{
		{"  spaced-out  ", ""},
		{"dots.are.fine", ""},
		{strings.Repeat("n", 64), ""},
		{"ünïcödé", ""},
		{"<b>bold</b>", ""},
		{"slash/ed%2F", ""},
		{"__under", ""},
		{"", "name is required"},
		{"   ", "name is required"},
		{strings.Repeat("n", 65), "at most 64"},
		{strings.Repeat("é", 33), "at most 64"},
		{"two words", "white space"},
		{"tab\there", "white space"},
		{"no\u00a0break", "white space"},
		{"at@sign", "'@'"},
		{"bell\x07", "control"},
		{"del\x7f", "control"},
		{"coder\u202e", "invisible formatting characters (here U+202E)"},
		{"co\u200bder", "invisible formatting characters (here U+200B)"},
		{"a\u2066b", "invisible formatting characters (here U+2066)"},
		{"x\ufeff", "invisible formatting characters (here U+FEFF)"},
		{"soft\u00adhyphen", "invisible formatting characters (here U+00AD)"},
		{"bad\xffutf8", "UTF-8"},
	} {
		_, err := e.svc.Claim(ctx, tok, tc.name, "")
		if tc.want == "" {
			if err != nil {
				t.Errorf("%q refused: %v", tc.name, err)
			}
			continue
		}
		if err == nil || errs.CodeOf(err) != errs.InvalidRequest || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want a 400 saying %q", tc.name, err, tc.want)
		}
	}
	// A handle that looks like a reserved store id is still a handle.
	odd := e.session("x@y.z__")
	if h := e.claim(odd, "__a", "Odd"); h != "__a.x@y.z__" {
		t.Fatalf("handle %q", h)
	}
	if r, err := e.svc.Resolve(ctx, "__A.x@y.z__", ""); err != nil || r.Card.Handle != "__a.x@y.z__" {
		t.Fatalf("resolve: %+v %v", r.Card, err)
	}
	if r, err := e.svc.Resolve(ctx, "slash/ed%2f.ana@example.org", ""); err != nil || r.Card.Handle != "slash/ed%2F.ana@example.org" {
		t.Fatalf("resolve: %+v %v", r.Card, err)
	}
	other := e.session("bo@example.org")
	for _, op := range []string{strings.Repeat("o", 81), "line\nbreak", "Ana\u202eX", "An\u200ba", "\ufeffAna"} {
		_, err := e.svc.Claim(ctx, other, "x", op)
		wantErr(t, "operator "+op, err, errs.InvalidRequest, 400, "operator_name")
	}
	if _, err := e.svc.Claim(ctx, other, "x", strings.Repeat("ö", 80)); err != nil {
		t.Errorf("80 characters of operator name: %v", err)
	}
}

// Fifty concurrent claims of one handle: exactly one creates it. The
// claimants are 25 addresses whose handles fold to the same string, two
// sessions each; the winner's second session gets the handle as its own,
// every other claim is refused as taken.
func TestConcurrentClaims(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t)
	segs := make([]string, 26)
	for i := range segs {
		segs[i] = string(rune('a' + i))
	}
	type claimant struct{ email, name, token string }
	var cs []claimant
	for k := 1; k <= 25; k++ {
		name, email := strings.Join(segs[:k], "."), strings.Join(segs[k:], ".")+"@example.org"
		if k%2 == 0 {
			name = strings.ToUpper(name)
		}
		for range 2 {
			cs = append(cs, claimant{email, name, e.session(email)})
		}
	}
	type result struct {
		c   claimant
		out registrar.Claimed
		err error
	}
	results := make(chan result, len(cs))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			out, err := e.svc.Claim(ctx, c.token, c.name, "Op "+c.email)
			results <- result{c, out, err}
		}()
	}
	close(start)
	wg.Wait()
	close(results)
	var winner string
	created, existing, taken := 0, 0, 0
	var all []result
	for r := range results {
		all = append(all, r)
		switch {
		case r.err == nil && !r.out.Existing:
			created++
			winner = r.c.email
		case r.err == nil:
			existing++
		case errs.CodeOf(r.err) == errs.Conflict:
			taken++
		default:
			t.Errorf("claim by %s: %v", r.c.email, r.err)
		}
	}
	if created != 1 || existing != 1 || taken != 48 {
		t.Fatalf("created %d, existing %d, taken %d; want 1, 1, 48", created, existing, taken)
	}
	for _, r := range all {
		if r.err == nil && r.c.email != winner {
			t.Errorf("%s also succeeded", r.c.email)
		}
	}
	var h account.Handle
	if err := store.Get(ctx, e.st, account.CollHandles, "a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p.q.r.s.t.u.v.w.x.y.z@example.org", &h); err != nil || h.Email != winner {
		t.Fatalf("stored %+v %v, winner %s", h, err, winner)
	}
}

// count is the number of documents in coll.
func (e *env) count(coll string) int {
	e.t.Helper()
	var docs []map[string]any
	if err := store.List(e.t.Context(), e.st, coll, store.Query{}, &docs); err != nil {
		e.t.Fatal(err)
	}
	return len(docs)
}

// A pairing completion that could not spend a code (a malformed body, a
// signature that does not verify) is refused before the per-IP limit is
// taken, so it writes nothing: a flood of garbage from many addresses
// leaves the store as it was.
func TestPairingRefusalsWriteNothing(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t)
	agent, other := newAgent(t), newAgent(t)
	good := protocol.SignPair(agent, "ABC-DEF")
	for i, tc := range []struct {
		code, agent, sig string
		status           int
	}{
		{"", "", "", 400},
		{"ABC-DEF", "", "", 400},
		{"ABC-DE0", agent.Public(), good, 400},          // 0 is not in the alphabet
		{"ABC-DEF", "Unot-a-key", good, 400},            // not a public key
		{"ABC-DEF", agent.Public(), "", 400},            // no signature
		{"ABC-DEF", agent.Public(), "not base64!", 400}, // not base64
		{"ABC-DEF", agent.Public(), "AAAA", 400},        // not 64 bytes
		{"ABC-DEF", agent.Public(), protocol.SignPair(other, "ABC-DEF"), 401},
	} {
		for j := range 5 {
			_, err := e.svc.CompletePairing(ctx, tc.code, tc.agent, tc.sig, fmt.Sprintf("2001:db8:%x::%x", i, j))
			if err == nil || errs.As(err).HTTPStatus() != tc.status {
				t.Fatalf("case %d: %v, want %d", i, err, tc.status)
			}
		}
	}
	if n := e.count(registrar.CollRateLimits); n != 0 {
		t.Fatalf("refused pairings wrote %d rate-limit counters", n)
	}
	// A well-formed, verifying attempt is counted.
	if _, err := e.svc.CompletePairing(ctx, "ABC-DEF", agent.Public(), good, "192.0.2.1"); errs.CodeOf(err) != errs.NotFound {
		t.Fatalf("unknown code: %v", err)
	}
	if n := e.count(registrar.CollRateLimits); n != 1 {
		t.Fatalf("%d counters, want 1", n)
	}
}

// Refused verification tries are limited per client IP (a /64 for IPv6):
// past the limit nothing is compared, so an attacker cannot go on burning
// another person's pending code, and the owner's right code still works.
func TestVerifyLimitPerIP(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t, func(c *registrar.Config) { c.Limits = registrar.Limits{VerifyFailuresPerIP: 3} })
	if _, err := e.svc.StartEmail(ctx, "victim@example.org", "198.51.100.1"); err != nil {
		t.Fatal(err)
	}
	right := e.mail.lastCode(t, "victim@example.org")
	wrong := "000000"
	if right == wrong {
		wrong = "111111"
	}
	for i := range 3 {
		_, err := e.svc.Verify(ctx, "victim@example.org", wrong, fmt.Sprintf("2001:db8:a::%d", i+1))
		wantErr(t, "wrong code", err, errs.Unauthorized, 401, "tries left")
	}
	for i := range 5 {
		_, err := e.svc.Verify(ctx, "victim@example.org", wrong, fmt.Sprintf("2001:db8:a:0:%d::1", i+1))
		wantErr(t, "over the limit", err, errs.RateLimited, 429, "wrong or unknown verification codes from your address")
		if got := errs.As(err); got.Details["limit"] != "verify-per-ip" || got.RetryAfterMS <= 0 {
			t.Fatalf("refusal %+v", got)
		}
	}
	// Over the limit even a right code is refused: answering it would let
	// the client tell right from wrong with no limit at all.
	_, err := e.svc.Verify(ctx, "victim@example.org", right, "2001:db8:a::9")
	wantErr(t, "right code over the limit", err, errs.RateLimited, 429, "verification codes")
	// The refused tries cost the code nothing: two tries are left, and the
	// owner's own verify works.
	if v, err := e.svc.Verify(ctx, "victim@example.org", right, "198.51.100.1"); err != nil || v.Token == "" {
		t.Fatalf("the owner's verify: %v", err)
	}
	// A try at an address with no code pending counts too.
	for range 3 {
		_, err := e.svc.Verify(ctx, "nobody@example.org", "123456", "192.0.2.50")
		wantErr(t, "no code", err, errs.Unauthorized, 401, "no code is pending")
	}
	_, err = e.svc.Verify(ctx, "nobody@example.org", "123456", "192.0.2.50")
	wantErr(t, "no code, over the limit", err, errs.RateLimited, 429, "verification codes")
	// A right code is not a refusal and counts nothing.
	e2 := newEnv(t, func(c *registrar.Config) { c.Limits = registrar.Limits{VerifyFailuresPerIP: 1} })
	for i := range 3 {
		addr := fmt.Sprintf("u%d@example.org", i)
		if _, err := e2.svc.StartEmail(ctx, addr, "192.0.2.60"); err != nil {
			t.Fatal(err)
		}
		if _, err := e2.svc.Verify(ctx, addr, e2.mail.lastCode(t, addr), "192.0.2.60"); err != nil {
			t.Fatalf("right code %d: %v", i, err)
		}
	}
}

// An address holds at most LivePairingCodes live pairing codes, whatever
// session asks (the console opens one per request); expired ones make room
// and are deleted when the next code is issued.
func TestLivePairingCodesCap(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t, func(c *registrar.Config) { c.Limits = registrar.Limits{LivePairingCodes: 3} })
	tok := e.session("ana@example.org")
	h := e.claim(tok, "coder", "Ana")
	for i := range 3 {
		if _, err := e.svc.StartPairing(ctx, tok, h); err != nil {
			t.Fatalf("code %d: %v", i+1, err)
		}
		e.clock.Advance(time.Minute)
	}
	_, err := e.svc.StartPairing(ctx, tok, h)
	wantErr(t, "fourth live code", err, errs.RateLimited, 429, "already has 3 live pairing codes")
	if got := errs.As(err); got.Details["limit"] != "pair-codes-per-address" || got.RetryAfterMS != (7*time.Minute).Milliseconds() {
		t.Fatalf("refusal %+v (the first code lapses in 7 minutes)", got)
	}
	// Another session of the same address meets the same cap,
	other, err := e.svc.SessionFor(ctx, "ana@example.org", "console")
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.svc.StartPairing(ctx, other.Token, h)
	wantErr(t, "another session", err, errs.RateLimited, 429, "live pairing codes")
	// another address does not.
	bo := e.session("bo@example.org")
	if _, err := e.svc.StartPairing(ctx, bo, e.claim(bo, "coder", "Bo")); err != nil {
		t.Fatalf("another address: %v", err)
	}
	// Once the first code lapses there is room again, and the lapsed code
	// is gone from the store.
	e.clock.Advance(7 * time.Minute)
	if _, err := e.svc.StartPairing(ctx, tok, h); err != nil {
		t.Fatalf("after the first code lapsed: %v", err)
	}
	if n := e.count(registrar.CollPairing); n != 4 { // ana's 2 live + 1 new, bo's 1
		t.Fatalf("%d pairing codes stored, want 4", n)
	}
}

// Only a bare address is accepted: one a mail header reads as exactly that
// address. Anything else is a 400 before any limit is counted or any mail
// sent, so the code always goes to the address it proves.
func TestEmailMustBeABareAddress(t *testing.T) {
	ctx := t.Context()
	e := newEnv(t)
	for _, addr := range []string{
		"ana<attacker@evil.org>", // mailed to attacker@evil.org, proving the whole string
		"<attacker@evil.org>",
		"a,b@example.org",
		"a(b@example.org",
		`"a b"@example.org`,
		`"ana"@example.org`,
		"ana@example.org (Ana)",
		"a..b@example.org",
		"ana@example.org>",
	} {
		_, err := e.svc.StartEmail(ctx, addr, "192.0.2.1")
		wantErr(t, addr, err, errs.InvalidRequest, 400, "email must be")
		_, err = e.svc.Verify(ctx, addr, "123456", "192.0.2.1")
		wantErr(t, "verify "+addr, err, errs.InvalidRequest, 400, "email must be")
		_, err = e.svc.SessionFor(ctx, addr, "console")
		wantErr(t, "session for "+addr, err, errs.InvalidRequest, 400, "email must be")
	}
	_, err := e.svc.StartEmail(ctx, "ana<attacker@evil.org>", "192.0.2.1")
	wantErr(t, "display name", err, errs.InvalidRequest, 400, "bare address like ana@example.org: no display name, angle brackets")
	_, err = e.svc.StartEmail(ctx, "ana\u202e@example.org", "192.0.2.1")
	wantErr(t, "a format character", err, errs.InvalidRequest, 400, "invisible formatting characters (here U+202E)")
	if len(e.mail.sent) != 0 || e.count(registrar.CollRateLimits) != 0 || e.count(registrar.CollCodes) != 0 {
		t.Fatalf("refused addresses sent %d mails and wrote %d counters", len(e.mail.sent), e.count(registrar.CollRateLimits))
	}
	for _, addr := range []string{"Ana@Example.org", "a.b+tag@sub.example.org", "o'brien@example.org", "jörg@exämple.org"} {
		if _, err := e.svc.StartEmail(ctx, addr, "192.0.2.1"); err != nil {
			t.Errorf("%s: %v", addr, err)
		}
	}
}
