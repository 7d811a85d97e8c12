package node

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// counter is a handler that answers "echo" and counts invocations per
// request id.
type counter struct {
	mu   sync.Mutex
	seen map[string]int
}

func newCounter() *counter { return &counter{seen: map[string]int{}} }

func (c *counter) handle(ctx context.Context, call *Call) error {
	c.mu.Lock()
	c.seen[call.Env.ID]++
	c.mu.Unlock()
	return call.Reply(map[string]any{"echo": call.RawInput(), "source": call.Source.String()})
}

func (c *counter) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.seen {
		n += v
	}
	return n
}

func (c *counter) count(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen[id]
}

func TestOfflineDeliveryThroughTheMailbox(t *testing.T) {
	tm := newMesh(t)
	ka, kb, nka, nkb := agentKey(t), agentKey(t), nodeKey(t), nodeKey(t)
	late := make(chan *Result, 4)
	nA := tm.startNode(t, nka, []*keys.Agent{ka}, nil)
	a := tm.host(t, nA, AgentConfig{Key: ka, Name: "a", Handler: refuseAll, OnReply: func(r *Result) { late <- r }})
	journal := filepath.Join(t.TempDir(), "b.journal")

	// b was registered once, and its node is not running now.
	startB := func(h *counter) *Node {
		j, err := OpenFileJournal(journal, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = j.Close() })
		n := tm.startNode(t, nkb, []*keys.Agent{kb}, func(c *Config) { c.Journal = j })
		tm.host(t, n, AgentConfig{Key: kb, Name: "b", Handler: h.handle})
		return n
	}
	first := newCounter()
	nB := startB(first)
	if err := nB.Close(); err != nil {
		t.Fatal(err)
	}

	_, err := a.Request(t.Context(), kb.Public(), "echo", "while you were out", RequestOptions{Timeout: 300 * time.Millisecond})
	mustCode(t, err, errs.TransportTimeout)
	reqID := errs.As(err).Details["request_id"].(string)
	if p := tm.mailboxStored(t, kb.Public()); p != 1 {
		t.Fatalf("mailbox holds %d", p)
	}

	// A new node with the same agent key and journal drains it; the answer
	// goes to a's inbox, which routes it to OnReply.
	second := newCounter()
	startB(second)
	select {
	case r := <-late:
		if r.RequestID != reqID || r.From != kb.Public() || r.Status != "completed" || r.Output.(map[string]any)["source"] != "mailbox" || r.Accepted {
			t.Fatalf("late reply %+v", r)
		}
	case <-time.After(asyncWait):
		t.Fatal("the drained request was not answered")
	}
	if second.count(reqID) != 1 {
		t.Fatalf("handled %d times", second.count(reqID))
	}
	eventually(t, "the mailbox acknowledged", func() bool {
		return tm.mailboxStored(t, kb.Public()) == 0
	})
}

func TestAnsweredLiveIsNotAnsweredAgainAfterRestart(t *testing.T) {
	tm := newMesh(t)
	ka, kb, nkb := agentKey(t), agentKey(t), nodeKey(t)
	late := make(chan *Result, 4)
	nA := tm.startNode(t, nodeKey(t), []*keys.Agent{ka}, nil)
	a := tm.host(t, nA, AgentConfig{Key: ka, Name: "a", Handler: refuseAll, OnReply: func(r *Result) { late <- r }})
	path := filepath.Join(t.TempDir(), "journal")

	run := func(h *counter) *Node {
		j, err := OpenFileJournal(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = j.Close() })
		// No periodic drain: the stored copy of the live request stays in
		// the mailbox until the next node starts.
		n := tm.startNode(t, nkb, []*keys.Agent{kb}, func(c *Config) { c.Journal = j; c.DrainEvery = time.Hour })
		b := tm.host(t, n, AgentConfig{Key: kb, Name: "b", Handler: h.handle})
		eventually(t, "the first drain", func() bool { return b.drains.Load() > 0 })
		return n
	}
	first := newCounter()
	n1 := run(first)
	res, err := a.Request(t.Context(), kb.Public(), "echo", "once", RequestOptions{})
	if err != nil || !res.Accepted {
		t.Fatalf("live: %+v %v", res, err)
	}
	eventually(t, "the mailbox to keep a copy of the live request", func() bool {
		return tm.mailboxStored(t, kb.Public()) == 1
	})
	if err := n1.Close(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("journal file: %v %v", fi, err)
	}

	second := newCounter()
	n2 := run(second)
	eventually(t, "the drain to acknowledge the copy", func() bool {
		return tm.mailboxStored(t, kb.Public()) == 0
	})
	select {
	case r := <-late:
		t.Fatalf("answered again: %+v", r)
	case <-time.After(200 * time.Millisecond):
	}
	if second.total() != 0 || first.total() != 1 {
		t.Fatalf("handled %d then %d times", first.total(), second.total())
	}
	// Draining again finds nothing.
	if got := n2.Agent(kb.Public()).DrainNow(); got != 0 {
		t.Fatalf("second drain took %d", got)
	}
}

func TestRenewalUnderTraffic(t *testing.T) {
	tm := newMesh(t)
	ka, kb, nkb := agentKey(t), agentKey(t), nodeKey(t)
	nA := tm.startNode(t, nodeKey(t), []*keys.Agent{ka}, nil)
	stray := make(chan *Result, 256)
	a := tm.host(t, nA, AgentConfig{Key: ka, Name: "a", Handler: refuseAll, OnReply: func(r *Result) { stray <- r }})
	warn := &warnings{}
	var healths atomic.Int64
	h := newCounter()
	nB := tm.startNode(t, nkb, []*keys.Agent{kb}, func(c *Config) {
		c.Renewer = &NodeCredentialRenewer{ControlURL: tm.m.URLs().Control, NodeKey: nkb}
		c.Warn = warn.add
		c.Health = func(Health) { healths.Add(1) }
	})
	tm.host(t, nB, AgentConfig{Key: kb, Name: "b", Handler: h.handle})
	before := nB.Health().Credential

	const total = 200
	var wg sync.WaitGroup
	results := make(chan *Result, total)
	failures := make(chan error, total)
	start := make(chan struct{})
	for i := range total {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			time.Sleep(time.Duration(i) * 250 * time.Microsecond) // spread over 50 ms
			res, err := a.Request(t.Context(), kb.Public(), "echo", i, RequestOptions{Timeout: 10 * time.Second})
			if err != nil {
				failures <- err
				return
			}
			results <- res
		}()
	}
	close(start)
	time.Sleep(10 * time.Millisecond)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := nB.RenewNow(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(failures)
	for err := range failures {
		id, _ := errs.As(err).Details["request_id"].(string)
		t.Errorf("request failed (its handler ran %d times): %v", h.count(id), err)
	}
	close(results)
	seen := map[string]bool{}
	drained := 0
	for r := range results {
		if r.Status != "completed" || seen[r.RequestID] {
			t.Fatalf("result %+v", r)
		}
		seen[r.RequestID] = true
		if r.Output.(map[string]any)["source"] == "mailbox" {
			drained++
		}
	}
	if len(seen) != total {
		t.Fatalf("%d answered", len(seen))
	}
	for id := range seen {
		if n := h.count(id); n != 1 {
			t.Fatalf("request %s handled %d times", id, n)
		}
	}
	if h.total() != total {
		t.Fatalf("handler ran %d times for %d requests", h.total(), total)
	}
	// Nothing extra arrives later (a second answer would land in OnReply).
	nB.Agent(kb.Public()).DrainNow()
	select {
	case r := <-stray:
		t.Fatalf("a second answer: %+v", r)
	case <-time.After(200 * time.Millisecond):
	}
	after := nB.Health().Credential
	if !after.ExpiresAt.After(before.ExpiresAt.Add(24*time.Hour)) || after.LastError != "" || after.Revoked || len(warn.codes()) != 0 {
		t.Fatalf("health before %+v after %+v warnings %v", before, after, warn.codes())
	}
	if healths.Load() == 0 {
		t.Fatal("no health report")
	}
	t.Logf("%d of %d requests arrived during the reconnect and were answered from the mailbox", drained, total)
}

// fakeRenewer mints credentials with the test's trust chain, or fails as
// told.
type fakeRenewer struct {
	tm    *testMesh
	t     *testing.T
	nk    *keys.Node
	life  time.Duration
	fail  atomic.Pointer[error]
	calls atomic.Int64
}

func (f *fakeRenewer) Renew(ctx context.Context, agents []*keys.Agent) (string, time.Time, error) {
	f.calls.Add(1)
	if e := f.fail.Load(); e != nil {
		return "", time.Time{}, *e
	}
	exp := time.Now().Add(f.life)
	return f.tm.nodeCredential(f.t, f.nk, exp, agents...).JWT, exp, nil
}

func TestRenewalSchedule(t *testing.T) {
	tm := newMesh(t)
	kb, nk := agentKey(t), nodeKey(t)
	var off atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(off.Load())) }
	r := &fakeRenewer{tm: tm, t: t, nk: nk, life: 30 * 24 * time.Hour}
	warn := &warnings{}
	n := tm.startNode(t, nk, []*keys.Agent{kb}, func(c *Config) {
		c.Credential = tm.nodeCredential(t, nk, time.Now().Add(3*time.Hour), kb)
		c.Renewer, c.Now, c.Warn, c.CheckEvery = r, now, warn.add, 10*time.Millisecond
	})
	tm.host(t, n, AgentConfig{Key: kb, Name: "b", Handler: refuseAll})
	h := n.Health().Credential
	if d := h.RenewAt.Sub(h.ExpiresAt.Add(-3 * time.Hour)); d < 2*time.Hour-2*time.Second || d > 2*time.Hour+2*time.Second {
		t.Fatalf("renew at %s, expires %s", h.RenewAt, h.ExpiresAt)
	}
	time.Sleep(50 * time.Millisecond)
	if r.calls.Load() != 0 {
		t.Fatal("renewed before two thirds")
	}

	// Two thirds in: renewed once. The new credential lives 30 days from
	// its own issue time, so its renewal point is twenty days out.
	off.Store(int64(2*time.Hour + time.Minute))
	eventually(t, "the renewal", func() bool { return r.calls.Load() == 1 && n.Health().Credential.RenewAt.After(h.RenewAt) })
	h = n.Health().Credential
	if d := time.Until(h.RenewAt); d < 20*24*time.Hour-time.Minute || d > 20*24*time.Hour+time.Minute {
		t.Fatalf("renewed credential: renew at %s", h.RenewAt)
	}
	time.Sleep(50 * time.Millisecond)
	if r.calls.Load() != 1 {
		t.Fatalf("renewed again at once: %d calls", r.calls.Load())
	}

	// A failure is retried an hour later, not before.
	failure := error(&RenewError{Status: 503, Message: "try later"})
	r.fail.Store(&failure)
	off.Store(int64(20*24*time.Hour + time.Minute))
	eventually(t, "a failed attempt", func() bool { return r.calls.Load() == 2 })
	time.Sleep(50 * time.Millisecond)
	if r.calls.Load() != 2 || !warn.has("credential_renewal_failed") || n.Health().Credential.LastError == "" || n.Health().Credential.Revoked {
		t.Fatalf("calls %d warnings %v health %+v", r.calls.Load(), warn.codes(), n.Health().Credential)
	}
	off.Store(int64(20*24*time.Hour + time.Hour + 2*time.Minute))
	eventually(t, "the hourly retry", func() bool { return r.calls.Load() == 3 })

	// A refusal is revocation: reported, and the schedule stops, even past
	// expiry.
	refused := error(&ErrRevoked{Status: 403, Code: "FORBIDDEN", Message: "agent retired"})
	r.fail.Store(&refused)
	off.Store(int64(20*24*time.Hour + 2*time.Hour + 3*time.Minute))
	eventually(t, "the refused attempt", func() bool { return r.calls.Load() == 4 })
	eventually(t, "the revocation in health", func() bool { return n.Health().Credential.Revoked })
	if !warn.has("credential_revoked") || !strings.Contains(n.Health().Credential.LastError, "agent retired") {
		t.Fatalf("warnings %v health %+v", warn.codes(), n.Health().Credential)
	}
	off.Store(int64(31 * 24 * time.Hour))
	time.Sleep(50 * time.Millisecond)
	if r.calls.Load() != 4 || !n.Health().Credential.Expired {
		t.Fatalf("after a refusal: %d calls, health %+v", r.calls.Load(), n.Health().Credential)
	}
}

func TestHostRenewsToCoverANewAgent(t *testing.T) {
	tm := newMesh(t)
	k1, k2, nk := agentKey(t), agentKey(t), nodeKey(t)
	n := tm.startNode(t, nk, []*keys.Agent{k1}, func(c *Config) {
		c.Renewer = &NodeCredentialRenewer{ControlURL: tm.m.URLs().Control, NodeKey: nk}
	})
	tm.host(t, n, AgentConfig{Key: k1, Name: "one", Handler: refuseAll})
	h := newCounter()
	tm.host(t, n, AgentConfig{Key: k2, Name: "two", Offerings: []Offering{{ID: "echo"}}, Handler: h.handle})
	if !n.covers(k1.Public()) || !n.covers(k2.Public()) {
		t.Fatal("the renewed credential does not cover both agents")
	}
	// Agent one asks agent two, on the same node.
	res, err := n.Agent(k1.Public()).Request(t.Context(), k2.Public(), "echo", "hi", RequestOptions{})
	if err != nil || res.Status != "completed" {
		t.Fatalf("%+v %v", res, err)
	}

	// Without a renewer, a node refuses to host what its credential omits.
	n2 := tm.startNode(t, nodeKey(t), []*keys.Agent{agentKey(t)}, nil)
	if _, err := n2.Host(t.Context(), AgentConfig{Key: agentKey(t), Name: "x", Handler: refuseAll}); err == nil || !strings.Contains(err.Error(), "does not cover") {
		t.Fatalf("host: %v", err)
	}
}

func TestRevouch(t *testing.T) {
	tm := newMesh(t)
	kb, nk := agentKey(t), nodeKey(t)
	warn := &warnings{}
	n := tm.startNode(t, nk, []*keys.Agent{kb}, func(c *Config) { c.Warn = warn.add })
	b := tm.host(t, n, AgentConfig{Key: kb, Name: "b", Handler: refuseAll, AvailabilityClass: "intermittent"})
	v1 := b.Vouch()
	vh := n.Health().Vouch[kb.Public()]
	if iss, _ := protocol.ParseTime(v1.IssuedAt); vh.RenewAt.Sub(iss) != 20*24*time.Hour {
		t.Fatalf("vouch renew at %s (issued %s)", vh.RenewAt, v1.IssuedAt)
	}
	time.Sleep(2 * time.Millisecond)
	if err := b.RevouchNow(t.Context()); err != nil {
		t.Fatal(err)
	}
	v2 := b.Vouch()
	att := tm.registered(t, kb, kb.Public())["node"].(map[string]any)["attestation"].(map[string]any)
	if v2.Sig == v1.Sig || v2.IssuedAt == v1.IssuedAt || att["sig"] != v2.Sig {
		t.Fatalf("vouch not renewed: %+v %+v, registered %v", v1, v2, att)
	}
	// With the registry gone the renewal fails, and says so.
	for _, w := range tm.m.Workers().Registry {
		if err := w.Stop(); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "the registry to be gone", func() bool {
		_, err := tm.svc.Request(protocol.SubjRegister, []byte("{}"), time.Second)
		return errors.Is(err, nats.ErrNoResponders)
	})
	if err := b.RevouchNow(t.Context()); err == nil {
		t.Fatal("a re-registration without a registry succeeded")
	}
	if !warn.has("vouch_renewal_failed") || n.Health().Vouch[kb.Public()].LastError == "" || b.Vouch().Sig != v2.Sig {
		t.Fatalf("warnings %v health %+v", warn.codes(), n.Health().Vouch)
	}
}

func TestNodeCredentialRenewerRefusals(t *testing.T) {
	var status atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/node-credential" || r.Method != http.MethodPost {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(int(status.Load()))
		_, _ = w.Write([]byte(`{"ok":false,"error":"agent UABC… retired or revoked: abuse","code":"FORBIDDEN","retryable":false}`))
	}))
	defer srv.Close()
	r := &NodeCredentialRenewer{ControlURL: srv.URL, NodeKey: nodeKey(t)}
	for _, c := range []struct {
		status  int
		revoked bool
	}{{403, true}, {409, true}, {400, true}, {401, false}, {429, false}, {503, false}} {
		status.Store(int64(c.status))
		_, _, err := r.Renew(t.Context(), []*keys.Agent{agentKey(t)})
		var rev *ErrRevoked
		if errors.As(err, &rev) != c.revoked {
			t.Fatalf("%d: %v", c.status, err)
		}
		if c.revoked && (rev.Status != c.status || !strings.Contains(rev.Message, "retired or revoked: abuse")) {
			t.Fatalf("%d: %+v", c.status, rev)
		}
	}
	srv.Close()
	if _, _, err := r.Renew(t.Context(), []*keys.Agent{agentKey(t)}); err == nil || errors.As(err, new(*ErrRevoked)) {
		t.Fatalf("unreachable door: %v", err)
	}
}

func TestFileJournal(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "journal")
	var off atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(off.Load())) }
	j, err := OpenFileJournal(path, now)
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Record("UFROM", "old"); err != nil {
		t.Fatal(err)
	}
	off.Store(int64(6 * 24 * time.Hour))
	if err := j.Record("UFROM", "new"); err != nil {
		t.Fatal(err)
	}
	if err := j.Record("UFROM", "has space"); err == nil {
		t.Fatal("an id with white space was recorded")
	}
	if !j.Answered("UFROM", "old") || !j.Answered("UFROM", "new") || j.Answered("UOTHER", "new") {
		t.Fatal("answered")
	}
	_ = j.Close()
	// A torn line from a crash is ignored.
	f, _ := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	_, _ = f.WriteString("17000 UFROM tor")
	_ = f.Close()

	// Eight days after the first entry it is gone, on load.
	off.Store(int64(8 * 24 * time.Hour))
	j, err = OpenFileJournal(path, now)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if j.Answered("UFROM", "old") || !j.Answered("UFROM", "new") || j.Len() != 1 {
		t.Fatalf("after reload: len %d", j.Len())
	}
	data, _ := os.ReadFile(path)
	if strings.Count(string(data), "\n") != 1 || strings.Contains(string(data), "old") || strings.Contains(string(data), "tor\n") {
		t.Fatalf("compacted file: %q", data)
	}
	fi, _ := os.Stat(path)
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", fi.Mode())
	}
	m := NewMemJournal(nil)
	_ = m.Record("a", "b")
	if !m.Answered("a", "b") || m.Answered("b", "a") {
		t.Fatal("mem journal")
	}
}
