package audit_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/audit"
	"agentmesh.dev/mesh/shared/audit/audittest"
	"agentmesh.dev/mesh/shared/audit/tsa"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/store/boltstore"
)

// switchTSA is a test-only authority behind a switch: while down it
// answers 500. It counts the queries it gets.
type switchTSA struct {
	a       *tsa.Authority
	srv     *httptest.Server
	down    atomic.Bool
	queries atomic.Int32
}

func newSwitchTSA(t *testing.T, name string) *switchTSA {
	s := &switchTSA{a: newTSA(t, name)}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.queries.Add(1)
		if s.down.Load() {
			http.Error(w, "down for maintenance", http.StatusInternalServerError)
			return
		}
		s.a.ServeHTTP(w, r)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *switchTSA) config() audit.Authority {
	return audit.Authority{Name: s.a.Name(), URL: s.srv.URL, Root: s.a.Root()}
}

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Set(t time.Time) { c.mu.Lock(); c.t = t; c.mu.Unlock() }

type anchorEnv struct {
	chains *audittest.MemChains
	store  audit.AnchorStore
	tsas   []*switchTSA
	clock  *clock
	agents []string
}

// newAnchorEnv has three chains written on 2026-03-04 and a clock five
// minutes into 2026-03-05.
func newAnchorEnv(t *testing.T) *anchorEnv {
	e := &anchorEnv{chains: audittest.NewMemChains(), store: audit.NewMemAnchors(),
		tsas:  []*switchTSA{newSwitchTSA(t, "tsa-a"), newSwitchTSA(t, "tsa-b")},
		clock: &clock{t: time.Date(2026, 3, 5, 0, 5, 0, 0, time.UTC)}}
	day := time.Date(2026, 3, 4, 9, 0, 0, 0, time.UTC)
	for i := range 3 {
		a := audittest.Agent(t)
		e.agents = append(e.agents, a)
		for j := range i + 2 {
			if _, err := e.chains.Append(audittest.Entry(a, j), day.Add(time.Duration(i*10+j)*time.Minute)); err != nil {
				t.Fatal(err)
			}
		}
	}
	return e
}

func (e *anchorEnv) anchorer(t *testing.T) *audit.Anchorer {
	an, err := audit.NewAnchorer(audit.AnchorerConfig{Mesh: "test-mesh", Ledger: e.chains, Store: e.store,
		Authorities: []audit.Authority{e.tsas[0].config(), e.tsas[1].config()}, Now: e.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	return an
}

func TestAnchorTwiceMakesOneAnchor(t *testing.T) {
	e := newAnchorEnv(t)
	an := e.anchorer(t)
	first, err := an.Anchor(t.Context(), "2026-03-04")
	if err != nil {
		t.Fatal(err)
	}
	second, err := an.Anchor(t.Context(), "2026-03-04")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := an.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	all, err := e.store.List(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 1 || first.Document != second.Document || second.Status != audit.StatusStamped || len(second.Stamps) != 2 || second.Attempts != 1 {
		t.Fatalf("anchors %d, first %+v, second %+v", len(all), first.Document, second)
	}
	for _, s := range e.tsas {
		if n := s.queries.Load(); n != 1 {
			t.Fatalf("%s was asked %d times", s.a.Name(), n)
		}
	}

	// The document: the root of the heads at the end of the date, the
	// counts, the mesh, nothing else; its recorded hash is the SHA-256 of
	// its canonical bytes, which both tokens stamp.
	heads, _ := e.chains.HeadsAt(t.Context(), time.Date(2026, 3, 5, 0, 0, 0, 0, time.UTC))
	tree, err := audit.NewTree(heads)
	if err != nil {
		t.Fatal(err)
	}
	want := audit.Document{V: 1, Date: "2026-03-04", Root: tree.Root(), Mesh: "test-mesh", Heads: 3, Rows: 2 + 3 + 4}
	if second.Document != want {
		t.Fatalf("document %+v, want %+v", second.Document, want)
	}
	canon, _ := second.Document.Canonical()
	sum := sha256.Sum256(canon)
	if hex.EncodeToString(sum[:]) != second.DocumentSHA256 {
		t.Fatal("the recorded hash is not the document's")
	}
	if !strings.HasPrefix(string(canon), `{"date":"2026-03-04","heads":3,"mesh":"test-mesh","root":"`) {
		t.Fatalf("canonical document %s", canon)
	}
	for _, st := range second.Stamps {
		if _, err := st.Verify(sum[:]); err != nil {
			t.Fatalf("stamp of %s: %v", st.Authority, err)
		}
	}
	// The proofs of the heads went to the chains, once.
	for _, a := range e.agents {
		ps, _ := e.chains.Proofs(t.Context(), a)
		if len(ps) != 1 || ps[0].Date != "2026-03-04" || ps[0].Verify(want.Root) != nil {
			t.Fatalf("proofs of %s: %+v", a, ps)
		}
	}
}

func TestAnchorConcurrentRunsMakeOneAnchor(t *testing.T) {
	e := newAnchorEnv(t)
	var wg sync.WaitGroup
	for range 4 {
		an := e.anchorer(t)
		wg.Go(func() {
			if _, err := an.Anchor(t.Context(), "2026-03-04"); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	all, _ := e.store.List(t.Context(), 0)
	if len(all) != 1 || all[0].Status != audit.StatusStamped || len(all[0].Stamps) != 2 {
		t.Fatalf("%d anchors: %+v", len(all), all)
	}
}

func TestAnchorAuthority500FailsAndIsRetried(t *testing.T) {
	e := newAnchorEnv(t)
	an := e.anchorer(t)
	e.tsas[1].down.Store(true)
	a, err := an.Anchor(t.Context(), "2026-03-04")
	if err != nil {
		t.Fatal(err)
	}
	if a.Status != audit.StatusFailed || len(a.Stamps) != 1 || a.Stamps[0].Authority != "tsa-a" || !strings.Contains(a.LastError, "HTTP 500") {
		t.Fatalf("after a 500: %+v", a)
	}
	// Still down: the next run asks again, and only the one that failed.
	if _, err := an.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	e.tsas[1].down.Store(false)
	done, err := an.Run(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(done) != 1 || done[0].Status != audit.StatusStamped || len(done[0].Stamps) != 2 || done[0].LastError != "" || done[0].Attempts != 3 {
		t.Fatalf("after the retry: %+v", done)
	}
	if a, b := e.tsas[0].queries.Load(), e.tsas[1].queries.Load(); a != 1 || b != 3 {
		t.Fatalf("queries: %d to the one that worked, %d to the one that failed", a, b)
	}
	// Stamped is final: the next run leaves it alone.
	if again, err := an.Run(t.Context()); err != nil || len(again) != 0 {
		t.Fatalf("%+v, %v", again, err)
	}
}

func TestAnchorWaitsForTheDateToEnd(t *testing.T) {
	e := newAnchorEnv(t)
	e.clock.Set(time.Date(2026, 3, 5, 0, 0, 30, 0, time.UTC)) // inside the grace
	an := e.anchorer(t)
	if _, err := an.Anchor(t.Context(), "2026-03-04"); !errors.Is(err, audit.ErrTooEarly) {
		t.Fatalf("err = %v", err)
	}
	if _, err := an.Anchor(t.Context(), "2026-03-05"); !errors.Is(err, audit.ErrTooEarly) {
		t.Fatalf("today: err = %v", err)
	}
	done, err := an.Run(t.Context())
	if err != nil || len(done) != 1 || done[0].Date != "2026-03-03" || done[0].Document.Heads != 0 {
		t.Fatalf("%+v, %v", done, err)
	}
	if _, err := an.Anchor(t.Context(), "2026-3-4"); err == nil {
		t.Fatal("a malformed date was anchored")
	}
}

func TestRunCatchesUpMissedDates(t *testing.T) {
	e := newAnchorEnv(t)
	an := e.anchorer(t)
	// A new mesh anchors the last date only.
	done, err := an.Run(t.Context())
	if err != nil || len(done) != 1 || done[0].Date != "2026-03-04" {
		t.Fatalf("%+v, %v", done, err)
	}
	// Three days without a run: the missed dates are anchored.
	e.clock.Set(time.Date(2026, 3, 8, 0, 5, 0, 0, time.UTC))
	done, err = an.Run(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var dates []string
	for _, a := range done {
		dates = append(dates, a.Date)
	}
	if strings.Join(dates, " ") != "2026-03-05 2026-03-06 2026-03-07" {
		t.Fatalf("anchored %v", dates)
	}
}

func TestNewAnchorerNeedsTwoAuthorities(t *testing.T) {
	e := newAnchorEnv(t)
	cfg := audit.AnchorerConfig{Mesh: "m", Ledger: e.chains, Store: e.store, Authorities: []audit.Authority{e.tsas[0].config()}}
	if _, err := audit.NewAnchorer(cfg); err == nil || !strings.Contains(err.Error(), "at least 2") {
		t.Fatalf("err = %v", err)
	}
	cfg.Authorities = []audit.Authority{e.tsas[0].config(), e.tsas[0].config()}
	if _, err := audit.NewAnchorer(cfg); err == nil {
		t.Fatal("the same authority twice was accepted")
	}
}

// testAnchorStore is the contract every AnchorStore keeps.
func testAnchorStore(t *testing.T, s audit.AnchorStore) {
	ctx := t.Context()
	if _, err := s.Get(ctx, "2026-01-01"); !errors.Is(err, audit.ErrNoAnchor) {
		t.Fatalf("get of none: %v", err)
	}
	if _, err := s.Update(ctx, "2026-01-01", func(*audit.Anchor) error { return nil }); !errors.Is(err, audit.ErrNoAnchor) {
		t.Fatalf("update of none: %v", err)
	}
	for _, d := range []string{"2026-01-02", "2026-01-01", "2026-01-03"} {
		if err := s.Create(ctx, &audit.Anchor{Date: d, Status: audit.StatusPending}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Create(ctx, &audit.Anchor{Date: "2026-01-01"}); !errors.Is(err, audit.ErrAnchorExists) {
		t.Fatalf("second create: %v", err)
	}
	list, err := s.List(ctx, 2)
	if err != nil || len(list) != 2 || list[0].Date != "2026-01-03" || list[1].Date != "2026-01-02" {
		t.Fatalf("list: %+v, %v", list, err)
	}
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			if _, err := s.Update(context.Background(), "2026-01-01", func(a *audit.Anchor) error { a.Attempts++; return nil }); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	a, err := s.Update(ctx, "2026-01-01", func(*audit.Anchor) error { return audit.ErrNoChange })
	if err != nil || a.Attempts != 10 || a.Status != audit.StatusPending {
		t.Fatalf("after 10 concurrent updates: %+v, %v", a, err)
	}
	if _, err := s.Update(ctx, "2026-01-01", func(a *audit.Anchor) error { a.Date = "2026-01-09"; return nil }); err == nil {
		t.Fatal("an update moved an anchor to another date")
	}
}

func TestMemAnchors(t *testing.T) { testAnchorStore(t, audit.NewMemAnchors()) }

func TestStoreAnchors(t *testing.T) {
	st, err := boltstore.Open(filepath.Join(t.TempDir(), "control.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	s := audit.StoreAnchors{Store: st}
	testAnchorStore(t, s)
	// A stamped record comes back as it was written, tokens and
	// certificates included.
	at := time.Date(2026, 1, 5, 0, 1, 2, 3_000_000, time.UTC)
	want := &audit.Anchor{Date: "2026-01-04", Document: audit.Document{V: 1, Date: "2026-01-04", Root: strings.Repeat("ab", 32), Mesh: "m", Heads: 2, Rows: 7},
		DocumentSHA256: strings.Repeat("cd", 32), Status: audit.StatusStamped, ProofsRecorded: true, Attempts: 1,
		Stamps: []audit.Stamp{{Authority: "tsa-one", Nonce: "1234", Token: []byte{0x30, 0x82, 0, 1}, Time: at, Root: []byte{1, 2, 3},
			Intermediates: [][]byte{{4, 5}, {6}}}}, CreatedAt: at, UpdatedAt: at}
	if err := s.Create(t.Context(), want); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(t.Context(), want.Date)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("read back %+v, %v\nwant %+v", got, err, want)
	}
}

func TestStreamAnchors(t *testing.T) {
	b := bustest.Start(t)
	testAnchorStore(t, openChains(t, b, "audit", nil).Anchors())
}

// A run that stopped after making the record is finished by the next; if
// an account was closed in between, the anchor stands without proofs and
// says why.
func TestAnchorResumed(t *testing.T) {
	for _, closed := range []bool{false, true} {
		t.Run(fmt.Sprint("closed=", closed), func(t *testing.T) {
			e := newAnchorEnv(t)
			heads, _ := e.chains.HeadsAt(t.Context(), time.Date(2026, 3, 5, 0, 0, 0, 0, time.UTC))
			tree, err := audit.NewTree(heads)
			if err != nil {
				t.Fatal(err)
			}
			doc := audit.Document{V: 1, Date: "2026-03-04", Root: tree.Root(), Mesh: "test-mesh", Heads: 3, Rows: 9}
			digest, _ := doc.Digest()
			if err := e.store.Create(t.Context(), &audit.Anchor{Date: doc.Date, Document: doc, DocumentSHA256: hex.EncodeToString(digest), Status: audit.StatusPending}); err != nil {
				t.Fatal(err)
			}
			if closed {
				if err := e.chains.Purge(t.Context(), e.agents[0]); err != nil {
					t.Fatal(err)
				}
			}
			done, err := e.anchorer(t).Run(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if len(done) != 1 || done[0].Status != audit.StatusStamped || done[0].Document != doc || !done[0].ProofsRecorded {
				t.Fatalf("%+v", done)
			}
			ps, _ := e.chains.Proofs(t.Context(), e.agents[1])
			if closed != (done[0].ProofsNote != "") || closed != (len(ps) == 0) {
				t.Fatalf("closed=%v: note %q, %d proofs", closed, done[0].ProofsNote, len(ps))
			}
		})
	}
}

// An authority whose clock says the date has not ended yet gives a stamp
// a verifier refuses: the anchorer does not keep it (the anchor stays
// failed and the authority is asked again), and an export leaves out an
// anchor stamped by fewer than MinAuthorities authorities, so it still
// verifies.
func TestAnchorRefusesAStampFromBeforeTheDateEnded(t *testing.T) {
	chains, store := audittest.NewMemChains(), audit.NewMemAnchors()
	now := time.Now().UTC()
	date := now.Format(time.DateOnly)
	agent := audittest.Agent(t)
	if _, err := chains.Append(audittest.Entry(agent, 1), now); err != nil {
		t.Fatal(err)
	}
	clk := &clock{t: now.Add(48 * time.Hour)}
	early, onTime := newSwitchTSA(t, "tsa-early"), newSwitchTSA(t, "tsa-on-time")
	early.a.Now = func() time.Time { return now } // today has not ended for it
	onTime.a.Now = clk.Now
	an, err := audit.NewAnchorer(audit.AnchorerConfig{Mesh: "test-mesh", Ledger: chains, Store: store,
		Authorities: []audit.Authority{early.config(), onTime.config()}, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	a, err := an.Anchor(t.Context(), date)
	if err != nil {
		t.Fatal(err)
	}
	if a.Status != audit.StatusFailed || len(a.Stamps) != 1 || a.Stamps[0].Authority != "tsa-on-time" || !strings.Contains(a.LastError, "before the date ended") {
		t.Fatalf("anchor %+v", a)
	}
	signer := bustest.Agent(t)
	b, err := (&audit.Exporter{Mesh: "test-mesh", Chains: chains, Anchors: store, Signer: signer, Now: clk.Now}).Export(t.Context(), "acct", []string{agent})
	if err != nil {
		t.Fatal(err)
	}
	s, err := audit.Check(b, audit.Trust{Signer: signer.Public()})
	if err != nil || s.Anchors != 0 || s.Proofs != 0 || s.Rows != 1 {
		t.Fatalf("export of a once-stamped anchor: %+v, %v", s, err)
	}
}
