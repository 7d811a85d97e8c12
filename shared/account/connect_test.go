package account_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/store"
	"agentmesh.dev/mesh/shared/store/boltstore"
)

// mailbox keeps every message sent.
type mailbox struct {
	mu   sync.Mutex
	msgs []mail.Message
}

func (m *mailbox) Send(_ context.Context, msg mail.Message) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.msgs = append(m.msgs, msg)
	return nil
}

var sixDigits = regexp.MustCompile(`(?m)^\s+(\d{6})$`)

// last returns the last message and the code on its own line in it.
func (m *mailbox) last(t *testing.T) (mail.Message, string) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.msgs) == 0 {
		t.Fatal("no mail")
	}
	msg := m.msgs[len(m.msgs)-1]
	c := sixDigits.FindStringSubmatch(msg.Text)
	if c == nil {
		c = regexp.MustCompile(`\b(\d{6})\b`).FindStringSubmatch(msg.Text)
	}
	if c == nil {
		t.Fatalf("no code in %q", msg.Text)
	}
	return msg, c[1]
}

func (m *mailbox) count() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.msgs)
}

// issuer is a fake AppIssuer.
type issuer struct {
	mu      sync.Mutex
	issued  []string
	revoked []string
	fail    error         // next IssueApp fails with this, once
	during  func()        // runs inside IssueApp
	gate    chan struct{} // IssueApp waits for it when set
	entered chan struct{} // signalled when IssueApp starts
}

func (f *issuer) IssueApp(_ context.Context, accountID, name string) (string, error) {
	if f.entered != nil {
		f.entered <- struct{}{}
	}
	if f.gate != nil {
		<-f.gate
	}
	if f.during != nil {
		f.during()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		err := f.fail
		f.fail = nil
		return "", err
	}
	id := fmt.Sprintf("app_%d_%s", len(f.issued), name)
	f.issued = append(f.issued, id)
	return id, nil
}

func (f *issuer) RevokeApp(_ context.Context, _, appID string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.revoked = append(f.revoked, appID)
	return nil
}

type fixture struct {
	svc   *account.Service
	st    store.Store
	mail  *mailbox
	mu    sync.Mutex
	now   time.Time
	apps  *issuer
	email string
}

func (f *fixture) clock() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fixture) advance(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	f.mu.Unlock()
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "control.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	f := &fixture{st: st, mail: &mailbox{}, now: time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC), apps: &issuer{}, email: "ana@example.org"}
	f.svc = account.New(account.Config{Store: st, Mail: f.mail, Now: f.clock})
	return f
}

// start begins a connect by mail and returns the request id and code.
func (f *fixture) start(t *testing.T, app string) (string, string) {
	t.Helper()
	res, err := f.svc.StartConnect(context.Background(), f.email, app, "", "192.0.2.1", f.apps)
	if err != nil {
		t.Fatal(err)
	}
	if res.Connected || res.RequestID == "" {
		t.Fatalf("start: %+v", res)
	}
	msg, code := f.mail.last(t)
	if msg.To != f.email || !strings.Contains(msg.Text, fmt.Sprintf("An app called %q asks to connect to your agentmesh account", app)) || msg.Kind != "connect-code" {
		t.Fatalf("mail: %+v", msg)
	}
	return res.RequestID, code
}

func codeOf(err error) errs.Code {
	var e *errs.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

func TestConnectByCode(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	id, code := f.start(t, "dashboard")
	acct, err := f.svc.AccountByEmail(ctx, f.email)
	if err != nil || acct.Verified {
		t.Fatalf("the account should exist, unverified: %+v %v", acct, err)
	}

	st, err := f.svc.ConnectStatus(ctx, id, "", f.apps)
	if err != nil || st.Status != account.ConnectPending || st.AppName != "dashboard" || st.Issued {
		t.Fatalf("poll: %+v %v", st, err)
	}
	wrong := "000000"
	if code == wrong {
		wrong = "111111"
	}
	_, err = f.svc.ConnectStatus(ctx, id, wrong, f.apps)
	var e *errs.Error
	if !errors.As(err, &e) || e.Code != errs.Unauthorized || e.Details["attempts_left"] != 4 {
		t.Fatalf("wrong code: %v", err)
	}

	st, err = f.svc.ConnectStatus(ctx, id, " "+code+" ", f.apps)
	if err != nil || !st.Issued || st.Status != account.ConnectConnected || st.AppID == "" || len(f.apps.issued) != 1 {
		t.Fatalf("right code: %+v %v %v", st, err, f.apps.issued)
	}
	if acct, _ := f.svc.AccountByEmail(ctx, f.email); !acct.Verified || acct.ID != st.AccountID {
		t.Errorf("the code should verify the account: %+v", acct)
	}
	// Once connected: the app id, never a second issue, code or no code.
	for _, c := range []string{"", code, wrong} {
		again, err := f.svc.ConnectStatus(ctx, id, c, f.apps)
		if err != nil || again.Issued || again.Status != account.ConnectConnected || again.AppID != st.AppID {
			t.Fatalf("again with %q: %+v %v", c, again, err)
		}
	}
	if len(f.apps.issued) != 1 {
		t.Errorf("issued %v", f.apps.issued)
	}
}

func TestConnectWrongCodesDeny(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	id, code := f.start(t, "dashboard")
	wrong := fmt.Sprintf("%06d", (atoi(code)+1)%1000000)
	for i := range account.CodeAttempts {
		_, err := f.svc.ConnectStatus(ctx, id, wrong, f.apps)
		if codeOf(err) != errs.Unauthorized {
			t.Fatalf("try %d: %v", i, err)
		}
		if i == account.CodeAttempts-1 && !strings.Contains(err.Error(), "last try") {
			t.Errorf("last try: %v", err)
		}
	}
	st, err := f.svc.ConnectStatus(ctx, id, code, f.apps)
	if err != nil || st.Status != account.ConnectDenied || st.Issued || len(f.apps.issued) != 0 {
		t.Fatalf("after the last try: %+v %v", st, err)
	}
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	return n
}

func TestConnectExpires(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	id, code := f.start(t, "dashboard")
	f.advance(16 * time.Minute)
	for _, c := range []string{"", code} {
		st, err := f.svc.ConnectStatus(ctx, id, c, f.apps)
		if err != nil || st.Status != account.ConnectExpired || st.Issued {
			t.Fatalf("expired with %q: %+v %v", c, st, err)
		}
	}
	if len(f.apps.issued) != 0 {
		t.Error("an expired request issued an app")
	}
}

func TestConnectRefusals(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for _, tc := range []struct{ email, app string }{
		{"not-an-address", "x"}, {"ana@example.org", ""}, {"ana@example.org", strings.Repeat("a", 65)}, {"ana@example.org", "a\x00b"},
	} {
		if _, err := f.svc.StartConnect(ctx, tc.email, tc.app, "", "192.0.2.1", f.apps); codeOf(err) != errs.InvalidRequest {
			t.Errorf("%q %q: %v", tc.email, tc.app, err)
		}
	}
	if f.mail.count() != 0 {
		t.Error("a refused connect sent mail")
	}
	for _, id := range []string{"0190f0c8-0000-7000-8000-000000000000", "nope", "a/b", strings.Repeat("x", 36)} {
		if _, err := f.svc.ConnectStatus(ctx, id, "", f.apps); codeOf(err) != errs.NotFound {
			t.Errorf("%q: %v", id, err)
		}
		if _, err := f.svc.ConnectStatus(ctx, id, "123456", f.apps); codeOf(err) != errs.NotFound {
			t.Errorf("%q with code: %v", id, err)
		}
	}
	if _, err := f.svc.ConnectStatus(ctx, "", "", f.apps); codeOf(err) != errs.InvalidRequest {
		t.Errorf("empty id: %v", err)
	}
}

// The mail limit per address is the sign-in one, shared.
func TestConnectMailLimit(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if _, err := f.svc.StartLogin(ctx, f.email, true, "192.0.2.1"); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		if _, err := f.svc.StartConnect(ctx, f.email, "dashboard", "", "192.0.2.1", f.apps); err != nil {
			t.Fatalf("connect %d: %v", i, err)
		}
	}
	if _, err := f.svc.StartConnect(ctx, f.email, "dashboard", "", "192.0.2.1", f.apps); codeOf(err) != errs.RateLimited {
		t.Fatalf("6th mail: %v", err)
	}
	if f.mail.count() != 5 {
		t.Errorf("%d mails", f.mail.count())
	}
}

func TestConnectSession(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if _, err := f.svc.StartLogin(ctx, f.email, true, "192.0.2.1"); err != nil {
		t.Fatal(err)
	}
	_, code := f.mail.last(t)
	tok, _, acct, err := f.svc.VerifyLogin(ctx, f.email, code)
	if err != nil {
		t.Fatal(err)
	}
	before := f.mail.count()
	res, err := f.svc.StartConnect(ctx, "ANA@example.org", "dashboard", tok, "192.0.2.1", f.apps)
	if err != nil || !res.Connected || res.AccountID != acct.ID || res.AppID == "" || res.RequestID != "" {
		t.Fatalf("fast path: %+v %v", res, err)
	}
	if f.mail.count() != before {
		t.Error("the fast path sent mail")
	}
	// Another address, or a token that is not a live session: the mail path.
	for _, tc := range []struct{ email, bearer string }{{"bo@example.org", tok}, {f.email, "ams_nope"}, {f.email, "amt_nope"}} {
		res, err := f.svc.StartConnect(ctx, tc.email, "dashboard", tc.bearer, "192.0.2.1", f.apps)
		if err != nil || res.Connected || res.RequestID == "" {
			t.Fatalf("%v: %+v %v", tc, res, err)
		}
	}
	if len(f.apps.issued) != 1 {
		t.Errorf("issued %v", f.apps.issued)
	}
}

// A failed issue gives the claim back: the code works again.
func TestConnectIssueFailureReleases(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	id, code := f.start(t, "dashboard")
	f.apps.fail = errs.New(errs.QuotaExceeded, "an account has at most 10 apps")
	if _, err := f.svc.ConnectStatus(ctx, id, code, f.apps); codeOf(err) != errs.QuotaExceeded {
		t.Fatalf("failed issue: %v", err)
	}
	if st, err := f.svc.ConnectStatus(ctx, id, "", f.apps); err != nil || st.Status != account.ConnectPending {
		t.Fatalf("after a failed issue: %+v %v", st, err)
	}
	st, err := f.svc.ConnectStatus(ctx, id, code, f.apps)
	if err != nil || !st.Issued {
		t.Fatalf("retry: %+v %v", st, err)
	}
}

// While one call issues, another with the right code gets a retryable 409;
// afterwards it sees connected. Exactly one call issues.
func TestConnectConcurrentApproval(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	id, code := f.start(t, "dashboard")
	f.apps.gate, f.apps.entered = make(chan struct{}), make(chan struct{}, 1)
	type result struct {
		st  account.ConnectState
		err error
	}
	first := make(chan result, 1)
	go func() {
		st, err := f.svc.ConnectStatus(ctx, id, code, f.apps)
		first <- result{st, err}
	}()
	<-f.apps.entered // the first call holds the claim and is issuing
	var e *errs.Error
	if _, err := f.svc.ConnectStatus(ctx, id, code, f.apps); !errors.As(err, &e) || e.Code != errs.Conflict || !e.Retryable {
		t.Fatalf("racing call: %v", err)
	}
	if st, err := f.svc.ConnectStatus(ctx, id, "", f.apps); err != nil || st.Status != account.ConnectPending {
		t.Fatalf("poll while issuing: %+v %v", st, err)
	}
	close(f.apps.gate)
	r := <-first
	if r.err != nil || !r.st.Issued {
		t.Fatalf("first: %+v %v", r.st, r.err)
	}
	f.apps.entered = nil
	st, err := f.svc.ConnectStatus(ctx, id, code, f.apps)
	if err != nil || st.Issued || st.Status != account.ConnectConnected {
		t.Fatalf("after: %+v %v", st, err)
	}

	// Many at once, no gate: still exactly one.
	id, code = f.start(t, "board")
	f.apps.gate, f.apps.issued = nil, nil
	var wg sync.WaitGroup
	var mu sync.Mutex
	issued := 0
	for range 8 {
		wg.Go(func() {
			st, err := f.svc.ConnectStatus(ctx, id, code, f.apps)
			if err != nil && codeOf(err) != errs.Conflict {
				t.Errorf("racer: %v", err)
			}
			if st.Issued {
				mu.Lock()
				issued++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if issued != 1 || len(f.apps.issued) != 1 {
		t.Errorf("issued %d (%v), want exactly 1", issued, f.apps.issued)
	}
}

// An issued app whose request cannot record it is revoked, not handed out.
func TestConnectLostClaimRevokes(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	id, code := f.start(t, "dashboard")
	f.apps.during = func() {
		// Something else moved the request on while the app was made.
		err := f.st.RunTx(ctx, func(tx store.Tx) error {
			var r account.ConnectRequest
			if err := tx.Get(account.CollConnects, id, &r); err != nil {
				return err
			}
			r.Claim = "claim_someone_else"
			return tx.Set(account.CollConnects, id, r)
		})
		if err != nil {
			t.Error(err)
		}
	}
	st, err := f.svc.ConnectStatus(ctx, id, code, f.apps)
	if codeOf(err) != errs.Conflict || st.Issued {
		t.Fatalf("lost claim: %+v %v", st, err)
	}
	if len(f.apps.issued) != 1 || len(f.apps.revoked) != 1 || f.apps.revoked[0] != f.apps.issued[0] {
		t.Errorf("issued %v revoked %v", f.apps.issued, f.apps.revoked)
	}
}

func TestConnectDisabledAccount(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	id, code := f.start(t, "dashboard")
	acct, err := f.svc.AccountByEmail(ctx, f.email)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.st.RunTx(ctx, func(tx store.Tx) error {
		return tx.Update(account.CollAccounts, acct.ID, map[string]any{"disabled": true})
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.svc.ConnectStatus(ctx, id, code, f.apps); codeOf(err) != errs.Forbidden {
		t.Fatalf("disabled: %v", err)
	}
	if st, err := f.svc.ConnectStatus(ctx, id, "", f.apps); err != nil || st.Status != account.ConnectDenied {
		t.Fatalf("after: %+v %v", st, err)
	}
}
