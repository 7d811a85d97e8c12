package closure_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/audit"
	"agentmesh.dev/mesh/shared/closure"
	"agentmesh.dev/mesh/shared/credential"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/grant"
	"agentmesh.dev/mesh/shared/mail"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/store"
	"agentmesh.dev/mesh/shared/store/boltstore"
	"agentmesh.dev/mesh/shared/testclock"
)

// world is a closure service over a real account service on an embedded
// store, with fakes for what lives elsewhere (credentials, registrar, bus,
// audit chains, mail) that record every effect, so a test can count how
// often each was done.
type world struct {
	t     *testing.T
	st    store.Store
	clock *testclock.Clock
	acc   *account.Service
	cred  *fakeCredentials
	reg   *fakeRegistrar
	bus   *fakeBus
	audit *fakeChains
	mail  *fakeMail
	svc   *closure.Service
	acct  account.Account
}

const (
	agentA = "UAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
	agentB = "UBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB"
)

func newWorld(t *testing.T, mut ...func(*closure.Config)) *world {
	t.Helper()
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "control.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	w := &world{t: t, st: st, clock: &testclock.Clock{}, mail: &fakeMail{}}
	w.acc = account.New(account.Config{Store: st, Mail: w.mail, Now: w.clock.Now})
	w.acct, _, err = w.acc.CreateAccount(context.Background(), "ana@example.org")
	if err != nil {
		t.Fatal(err)
	}
	w.cred = &fakeCredentials{agents: []string{agentB, agentA}}
	w.reg = &fakeRegistrar{handles: []string{"coder.ana@example.org"}}
	w.bus = &fakeBus{}
	w.audit = &fakeChains{rows: map[string]int64{agentA: 3}, dates: map[string][]string{agentA: {"2026-01-02"}}}
	// A grant with a deploy, in the store as the grant service keeps it.
	err = st.RunTx(context.Background(), func(tx store.Tx) error {
		if err := tx.Set(grant.CollGrants, w.acct.ID+".gcp", grant.Grant{ID: "g1", AccountID: w.acct.ID, Provider: "gcp",
			ProjectID: "acme", ServiceAccount: "mesh-agent@acme.iam.gserviceaccount.com", State: grant.Verified}); err != nil {
			return err
		}
		return tx.Set(grant.CollActions, "a1", grant.Action{ID: "a1", AccountID: w.acct.ID, Provider: "gcp", ProjectID: "acme",
			Call: "run.UpdateWorkerPool", Resource: "projects/acme/locations/europe-west1/workerPools/mesh-scout", Outcome: "ok"})
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg := closure.Config{Store: st, Accounts: w.acc, Credentials: w.cred, Registrar: w.reg, Bus: w.bus, Chains: w.audit, Mail: w.mail,
		BrokerRevokes: true, Deployer: "mesh-deployer@mesh-prod.iam.gserviceaccount.com", Now: w.clock.Now}
	for _, m := range mut {
		m(&cfg)
	}
	w.svc = closure.New(cfg)
	return w
}

// principal is a session of the account whose passkey was confirmed now.
func (w *world) principal() *account.Principal {
	acct, err := w.acc.GetAccount(context.Background(), w.acct.ID)
	if err != nil {
		w.t.Fatal(err)
	}
	return &account.Principal{AccountID: acct.ID, Account: acct, Via: "session", SessionID: "s1", PasskeyAt: w.clock.Now()}
}

// effects are what the fakes were asked to do, by step.
func (w *world) effects() map[string]int {
	return map[string]int{
		closure.StepRecord:         w.cred.listed,
		closure.StepRevokeKeys:     w.cred.closed,
		closure.StepDeregister:     w.bus.count(protocol.SubjRegistryRemove),
		closure.StepReleaseHandles: w.reg.releasedCalls,
		closure.StepEndSessions:    w.reg.sessionsEnded,
		closure.StepPurgeAudit:     w.audit.purgeCalls,
		closure.StepPurgeActivity:  w.bus.count(protocol.SubjGuestErase),
		closure.StepPurgeRecords:   w.cred.purged,
		closure.StepNotify:         len(w.mail.sent),
	}
}

// checkClosed checks the state a finished closure leaves.
func (w *world) checkClosed(job closure.Job) {
	w.t.Helper()
	if !job.Done() || job.Email != "" || len(job.Facts.Agents) != 0 || job.Lease != "" {
		w.t.Fatalf("job %+v", job)
	}
	if _, err := w.acc.GetAccount(context.Background(), w.acct.ID); errs.CodeOf(err) != errs.NotFound {
		w.t.Errorf("the account is still there: %v", err)
	}
	if _, err := w.acc.AccountByEmail(context.Background(), "ana@example.org"); errs.CodeOf(err) != errs.NotFound {
		w.t.Errorf("the address still names an account: %v", err)
	}
	if w.audit.rows[agentA] != 0 || w.reg.live() != 0 {
		w.t.Errorf("audit rows %v, handles %d left", w.audit.rows, w.reg.live())
	}
	var gs []grant.Grant
	if err := store.List(context.Background(), w.st, grant.CollGrants, store.Query{}, &gs); err != nil || len(gs) != 0 {
		w.t.Errorf("grants left: %v %v", gs, err)
	}
	if len(w.mail.sent) == 0 || w.mail.sent[len(w.mail.sent)-1].To != "ana@example.org" {
		w.t.Errorf("no closing mail: %v", w.mail.sent)
	}
}

// Closure killed after each step, for every step: the runner stops after
// k checkpoints (its lease still held, as a Cloud Function that timed out
// leaves it); the scheduled row, once the lease has lapsed, finishes the
// job; every step ran exactly once and was done exactly once, and the
// account is gone.
func TestClosureKilledAfterEachStep(t *testing.T) {
	for k := 0; k <= len(closure.Steps); k++ {
		t.Run(fmt.Sprintf("after_%d_steps", k), func(t *testing.T) {
			w := newWorld(t)
			ctx := context.Background()
			if _, err := w.svc.Begin(ctx, w.principal()); err != nil {
				t.Fatal(err)
			}
			var job closure.Job
			var err error
			for range k {
				if job, err = w.svc.Advance(ctx, w.acct.ID, "runner-that-dies"); err != nil {
					t.Fatal(err)
				}
			}
			if k > 0 && k < len(closure.Steps) {
				// Within the lease nobody else runs it.
				if n, err := w.svc.Resume(ctx); err != nil || n != 0 {
					t.Fatalf("resume within the dead runner's lease: %d %v", n, err)
				}
				if job.Done() {
					t.Fatalf("done after %d steps", k)
				}
			}
			w.clock.Advance(closure.LeaseTTL + time.Second)
			n, err := w.svc.Resume(ctx)
			if err != nil || (k < len(closure.Steps)) != (n == 1) {
				t.Fatalf("resume: %d %v", n, err)
			}
			job, err = w.svc.Get(ctx, w.acct.ID)
			if err != nil {
				t.Fatal(err)
			}
			w.checkClosed(job)
			for _, st := range job.Steps {
				if st.Runs != 1 || st.DoneAt == 0 || st.Note == "" {
					t.Errorf("step %s: %+v", st.Name, st)
				}
			}
			for step, n := range w.effects() {
				if n != 1 {
					t.Errorf("step %s took effect %d times", step, n)
				}
			}
			// Nothing is left to run.
			if n, err := w.svc.Resume(ctx); err != nil || n != 0 {
				t.Errorf("resume after the end: %d %v", n, err)
			}
		})
	}
}

// A runner that dies between a step's work and its checkpoint: the step
// runs again (its run counted twice), does nothing more the second time,
// and the closure completes as if it had not died.
func TestStepCutOffBeforeItsCheckpointRunsAgain(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	w.reg.failAfterRelease = 1 // released, then the answer is lost
	if _, err := w.svc.Begin(ctx, w.principal()); err != nil {
		t.Fatal(err)
	}
	job, err := w.svc.Run(ctx, w.acct.ID)
	if err == nil || job.Done() {
		t.Fatalf("the first run should stop at release_handles: %+v %v", job, err)
	}
	if got, _ := w.svc.Get(ctx, w.acct.ID); !strings.Contains(got.LastError, "release_handles") || got.Lease != "" {
		t.Errorf("after the failed run: last_error %q, lease %q", got.LastError, got.Lease)
	}
	// The failed run gave its lease back: no need to wait for it.
	if n, err := w.svc.Resume(ctx); err != nil || n != 1 {
		t.Fatalf("resume: %d %v", n, err)
	}
	job, _ = w.svc.Get(ctx, w.acct.ID)
	w.checkClosed(job)
	for _, st := range job.Steps {
		want := 1
		if st.Name == closure.StepReleaseHandles {
			want = 2
		}
		if st.Runs != want {
			t.Errorf("step %s ran %d times, want %d", st.Name, st.Runs, want)
		}
	}
	if w.reg.releasedCalls != 2 || w.reg.releasedHandles != 1 {
		t.Errorf("release called %d times, released %d handles", w.reg.releasedCalls, w.reg.releasedHandles)
	}
}

// Two runners at once: the second is told the closure is busy until the
// first's lease lapses, then takes it over; the first, whose lease was
// taken, cannot checkpoint.
func TestLease(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	if _, err := w.svc.Begin(ctx, w.principal()); err != nil {
		t.Fatal(err)
	}
	if _, err := w.svc.Advance(ctx, w.acct.ID, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := w.svc.Advance(ctx, w.acct.ID, "b"); !errors.Is(err, closure.ErrBusy) {
		t.Fatalf("second runner: %v, want ErrBusy", err)
	}
	w.clock.Advance(closure.LeaseTTL + time.Second)
	job, err := w.svc.Advance(ctx, w.acct.ID, "b")
	if err != nil || job.Lease != "b" || job.Steps[1].DoneAt == 0 {
		t.Fatalf("take-over: %+v %v", job, err)
	}
	if _, err := w.svc.Advance(ctx, w.acct.ID, "a"); !errors.Is(err, closure.ErrBusy) {
		t.Fatalf("the first runner after the take-over: %v", err)
	}
}

// Closing needs a session with a passkey confirmed in the last five
// minutes; an API token never closes; a second Begin while the first runs
// returns the same job; and Begin disables the account at once.
func TestBeginNeedsAFreshPasskey(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	p := w.principal()
	p.PasskeyAt = time.Time{}
	_, err := w.svc.Begin(ctx, p)
	var e *errs.Error
	if !errors.As(err, &e) || e.Code != errs.Forbidden || e.Details["passkey_required"] != true {
		t.Fatalf("without a passkey check: %v", err)
	}
	p.PasskeyAt = w.clock.Now().Add(-6 * time.Minute)
	if _, err := w.svc.Begin(ctx, p); errs.CodeOf(err) != errs.Forbidden {
		t.Fatalf("stale passkey check: %v", err)
	}
	tok := w.principal()
	tok.Via = "api_token"
	if _, err := w.svc.Begin(ctx, tok); errs.CodeOf(err) != errs.Forbidden || !strings.Contains(err.Error(), "API tokens") {
		t.Fatalf("an API token: %v", err)
	}
	if _, err := w.svc.Get(ctx, w.acct.ID); errs.CodeOf(err) != errs.NotFound {
		t.Fatalf("a refused Begin left a job: %v", err)
	}
	p = w.principal()
	job, err := w.svc.Begin(ctx, p)
	if err != nil || job.State != closure.StateRunning || len(job.Steps) != len(closure.Steps) {
		t.Fatalf("begin: %+v %v", job, err)
	}
	acct, _ := w.acc.GetAccount(ctx, w.acct.ID)
	if !acct.Disabled {
		t.Fatal("Begin left the account enabled")
	}
	if _, err := w.svc.Advance(ctx, w.acct.ID, "x"); err != nil {
		t.Fatal(err)
	}
	again, err := w.svc.Begin(ctx, p)
	if err != nil || again.Steps[0].DoneAt == 0 || again.StartedAt != job.StartedAt {
		t.Fatalf("second begin: %+v %v", again, err)
	}
}

// The preview names what will go, with counts, and what stays; the
// closing answer's outstanding list is the same list, from the facts noted
// before anything was removed.
func TestPreviewAndOutstanding(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	p := w.principal()
	pv, err := w.svc.Preview(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if !pv.PasskeyFresh || !slices.Equal(pv.Steps, closure.Steps) {
		t.Errorf("preview %+v", pv)
	}
	counts := map[string]int{}
	for _, it := range pv.WillRemove {
		counts[strings.SplitN(it.What, ":", 2)[0]] = it.Count
	}
	for what, n := range map[string]int{"Your agents' credentials": 2, "Your handles (coder.ana@example.org)": 1, "Your cloud grants": 1,
		"Your agents' audit rows, and the proofs that tie them to anchors": 3, "Your agents' registrations": 2} {
		if counts[what] != n {
			t.Errorf("will remove %q: %d, want %d (%v)", what, counts[what], n, counts)
		}
	}
	keeps := strings.Join(pv.WillNotRemove, "\n")
	for _, want := range []string{
		"gcloud iam service-accounts remove-iam-policy-binding mesh-agent@acme.iam.gserviceaccount.com --project acme --member serviceAccount:mesh-deployer@mesh-prod.iam.gserviceaccount.com --role roles/iam.serviceAccountTokenCreator",
		"projects/acme/locations/europe-west1/workerPools/mesh-scout",
		"1 public anchor (2026-01-02)",
		"rooms",
		"Engagements your agents are party to stay on the public record: their signed documents, terminations and reviews",
		"Credits on your agents' owner keys are abandoned, not paid out",
	} {
		if !strings.Contains(keeps, want) {
			t.Errorf("will not remove lacks %q:\n%s", want, keeps)
		}
	}
	if _, err := w.svc.Begin(ctx, p); err != nil {
		t.Fatal(err)
	}
	job, err := w.svc.Run(ctx, w.acct.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(job.Outstanding, pv.WillNotRemove) {
		t.Errorf("outstanding\n%s\nwant the preview's\n%s", strings.Join(job.Outstanding, "\n"), keeps)
	}
	body := w.mail.sent[len(w.mail.sent)-1].Text
	if !strings.Contains(body, "- "+job.Outstanding[0]) {
		t.Errorf("the mail does not carry the list:\n%s", body)
	}
}

// Without a bus or audit chains (and without broker revocation) the
// steps that need them are skipped, and the outstanding list says what
// that leaves.
func TestSkippedStepsAreNamed(t *testing.T) {
	w := newWorld(t, func(c *closure.Config) { c.Bus, c.Chains, c.BrokerRevokes = nil, nil, false })
	ctx := context.Background()
	if _, err := w.svc.Begin(ctx, w.principal()); err != nil {
		t.Fatal(err)
	}
	job, err := w.svc.Run(ctx, w.acct.ID)
	if err != nil || !job.Done() {
		t.Fatalf("%+v %v", job, err)
	}
	for _, st := range job.Steps {
		skip := st.Name == closure.StepDeregister || st.Name == closure.StepPurgeActivity || st.Name == closure.StepPurgeAudit
		if st.Skipped != skip {
			t.Errorf("step %s skipped %v", st.Name, st.Skipped)
		}
	}
	out := strings.Join(job.Outstanding, "\n")
	for _, want := range []string{"no bus connection", "cannot revoke at the broker"} {
		if !strings.Contains(out, want) {
			t.Errorf("outstanding lacks %q:\n%s", want, out)
		}
	}
}

// --- fakes -------------------------------------------------------------------

type fakeCredentials struct {
	mu                     sync.Mutex
	agents                 []string
	listed, closed, purged int
}

func (f *fakeCredentials) Agents(_ context.Context, accountID string) ([]credential.Agent, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.listed++
	var out []credential.Agent
	for _, a := range f.agents {
		out = append(out, credential.Agent{ID: a, AccountID: accountID, Enabled: true})
	}
	return out, nil
}

func (f *fakeCredentials) ListApps(context.Context, string) ([]credential.App, error) {
	return nil, nil
}

func (f *fakeCredentials) CloseAccount(context.Context, string) (credential.Closed, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed++
	return credential.Closed{Agents: f.agents, Revoked: 3}, nil
}

func (f *fakeCredentials) PurgeAccount(_ context.Context, _ string, agents []string) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.purged++
	if len(agents) != 2 {
		return 0, fmt.Errorf("purge got agents %v", agents)
	}
	return len(agents), nil
}

type fakeRegistrar struct {
	mu                             sync.Mutex
	handles                        []string
	releasedCalls, releasedHandles int
	sessionsEnded                  int
	failAfterRelease               int
}

func (f *fakeRegistrar) live() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.handles)
}

func (f *fakeRegistrar) HandlesOf(context.Context, string, string) ([]account.Handle, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []account.Handle
	for _, h := range f.handles {
		out = append(out, account.Handle{Handle: h})
	}
	return out, nil
}

func (f *fakeRegistrar) ReleaseHandles(context.Context, string, string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.releasedCalls++
	out := f.handles
	f.releasedHandles += len(out)
	f.handles = nil
	if f.failAfterRelease > 0 {
		f.failAfterRelease--
		return nil, errors.New("the answer was lost")
	}
	return out, nil
}

func (f *fakeRegistrar) EndSessions(context.Context, string) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sessionsEnded++
	return 0, nil
}

type fakeBus struct {
	mu    sync.Mutex
	calls []string
}

func (f *fakeBus) Call(_ context.Context, subject string, _ protocol.Type, _ any) (map[string]any, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, subject)
	return map[string]any{"removed": []any{}}, nil
}

func (f *fakeBus) count(subject string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.calls {
		if c == subject {
			n++
		}
	}
	return n
}

type fakeChains struct {
	mu         sync.Mutex
	rows       map[string]int64
	dates      map[string][]string
	purgeCalls int
}

func (f *fakeChains) Head(_ context.Context, agent string) (audit.Head, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.rows[agent]
	return audit.Head{Agent: agent, Seq: n}, n > 0, nil
}

func (f *fakeChains) Proofs(_ context.Context, agent string) ([]audit.Proof, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []audit.Proof
	for _, d := range f.dates[agent] {
		out = append(out, audit.Proof{Date: d, Agent: agent})
	}
	return out, nil
}

// Purge counts one call per closure (the first agent's).
func (f *fakeChains) Purge(_ context.Context, agent string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if agent == agentA {
		f.purgeCalls++
	}
	delete(f.rows, agent)
	delete(f.dates, agent)
	return nil
}

type fakeMail struct {
	mu   sync.Mutex
	sent []mail.Message
}

func (f *fakeMail) Send(_ context.Context, m mail.Message) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sent = append(f.sent, m)
	return nil
}
