package allowance

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/protocol"
)

// Spend metered by one Store is seen by a Store opened later on the same
// directory: the ledger survives a restart.
func TestLedgerSurvivesReopen(t *testing.T) {
	now := at("2026-07-28T15:00:00Z")
	s := newStore(t)
	mustSet(t, s, SetRequest{Amount: usd(1_000_000), Per1k: microRate}, now)
	mustSet(t, s, SetRequest{Amount: usd(300_000), ScopeTask: true}, now)
	mustMeter(t, s, "task-1", "ctx", charsFor(250_000), 0, now)
	mustMeter(t, s, "task-2", "ctx", charsFor(700_000), 0, now)

	again, err := Open(s.dir, fixtureAgent(t), fixtureOwner(t))
	if err != nil {
		t.Fatal(err)
	}
	// Day: 950000 spent, 50000 left. Task 1: 250000 spent, 50000 left.
	d := again.Admit("task-1", "ctx", charsFor(50_001), now)
	if d.Admit || d.Remaining != 50_000 {
		t.Fatalf("after reopen decided %+v; want refusal with 50000 remaining", d)
	}
	if d := again.Admit("task-1", "ctx", charsFor(50_000), now); !d.Admit {
		t.Fatalf("after reopen, the exact remainder was refused: %+v", d)
	}
	r := again.Show(now)
	if got := r.Ceilings[0].SpentMicro; got != 950_000 {
		t.Fatalf("Show after reopen: day spent %d, want 950000", got)
	}
}

// The ledger file is stable, sorted, readable JSON.
func TestLedgerFileGolden(t *testing.T) {
	now := at("2026-07-28T15:00:00Z")
	s := newStore(t)
	mustSet(t, s, SetRequest{Amount: usd(10_000_000), Per1k: usdp(1_500)}, now)
	mustMeter(t, s, "task-b", "meetup-s1-e4", 40_000, 20_000, now)
	mustMeter(t, s, "task-a", "", 4_000, 0, now.AddDate(0, 0, -1))
	mustMeter(t, s, "task-b", "meetup-s1-e4", 400, 0, now)
	b, err := os.ReadFile(s.ledgerPath())
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "ledger.golden.json", b)
}

// The durable ledger follows protocol.Ledger's accounting rules exactly,
// through a save and reload: same records, same answers.
func TestLedgerMatchesProtocolLedger(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 2026))
	ours, ref := newLedger(), protocol.NewLedger()
	pick := func(xs ...string) string { return xs[rng.IntN(len(xs))] }
	base := at("2026-07-01T00:00:00Z")
	for range 2000 {
		task, ctx := pick("", "t1", "t2", "t3"), pick("", "c1", "c2")
		when := base.Add(time.Duration(rng.Int64N(int64(40 * 24 * time.Hour))))
		micro := rng.Int64N(2_000_000) - 100_000 // some negatives: ignored
		if rng.IntN(50) == 0 {
			micro = math.MaxInt64 - rng.Int64N(10) // saturation
		}
		ours.record(task, ctx, when, usd(micro))
		ref.Record(task, ctx, when, micro)
	}
	b, err := ours.encode()
	if err != nil {
		t.Fatal(err)
	}
	reloaded, err := decodeLedger(b)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		day := protocol.DayKey(base.AddDate(0, 0, i))
		compareSpend(t, reloaded, ref, protocol.ScopeDay, day)
	}
	for _, k := range []string{"t1", "t2", "t3", ""} {
		compareSpend(t, reloaded, ref, protocol.ScopeTask, k)
	}
	for _, k := range []string{"c1", "c2", ""} {
		compareSpend(t, reloaded, ref, protocol.ScopeContext, k)
	}
}

func compareSpend(t *testing.T, ours *ledger, ref *protocol.Ledger, scope, key string) {
	t.Helper()
	if got, want := ours.lookup("USD").SpentMicro(scope, key), ref.SpentMicro(scope, key); got != want {
		t.Errorf("%s %q: durable ledger %d, protocol.Ledger %d", scope, key, got, want)
	}
}

// A crash between metering and saving loses that one invocation and
// nothing else; the next invocation is counted once; nothing is ever
// counted twice.
func TestCrashBetweenMeteringAndSaving(t *testing.T) {
	now := at("2026-07-28T15:00:00Z")
	s := newStore(t)
	mustSet(t, s, SetRequest{Amount: usd(1_000_000), Per1k: microRate}, now)
	mustMeter(t, s, "t", "c", charsFor(100), 0, now)
	before, _ := os.ReadFile(s.ledgerPath())

	crash := errors.New("power cut")
	saveLedger = func(string, *ledger) error { return crash }
	_, err := s.Meter("t", "c", charsFor(1_000), 0, now)
	saveLedger = writeLedger
	if !errors.Is(err, crash) {
		t.Fatalf("Meter with a failing save: %v", err)
	}
	if after, _ := os.ReadFile(s.ledgerPath()); !bytes.Equal(before, after) {
		t.Fatal("a failed save changed the ledger")
	}

	// A leftover temporary file from a crash inside WriteSecretFile is
	// never read as the ledger.
	if err := os.WriteFile(filepath.Join(s.dir, ".tmp-"+LedgerFile+"-123"), []byte(`{"v":1,"spent":[{"scope":"day","key":"2026-07-28","currency":"USD","amount_micro":999999}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	restarted, err := Open(s.dir, fixtureAgent(t), fixtureOwner(t))
	if err != nil {
		t.Fatal(err)
	}
	mustMeter(t, restarted, "t", "c", charsFor(10), 0, now)
	for _, k := range [][2]string{{protocol.ScopeTask, "t"}, {protocol.ScopeContext, "c"}, {protocol.ScopeDay, "2026-07-28"}} {
		if got := spentOn(t, restarted, k[0], k[1], "USD"); got != 110 {
			t.Errorf("%s %s: %d spent, want 110 (100 + 10; the crashed 1000 lost, nothing doubled)", k[0], k[1], got)
		}
	}
}

// A ledger that cannot be read is never guessed at: admission counts every
// ceiling as exhausted, metering refuses to overwrite it, Show says so.
func TestCorruptLedgerFailsClosed(t *testing.T) {
	now := at("2026-07-28T15:00:00Z")
	for _, c := range []struct{ name, content string }{
		{"not json", "{"},
		{"empty", ""},
		{"other version", `{"v":2,"spent":[]}`},
		{"unknown member", `{"v":1,"spent":[],"refunds":[]}`},
		{"fractional amount", `{"v":1,"spent":[{"scope":"day","key":"2026-07-28","currency":"USD","amount_micro":1.5}]}`},
		{"negative amount", `{"v":1,"spent":[{"scope":"day","key":"2026-07-28","currency":"USD","amount_micro":-1}]}`},
		{"unknown scope", `{"v":1,"spent":[{"scope":"week","key":"w1","currency":"USD","amount_micro":1}]}`},
		{"bad day key", `{"v":1,"spent":[{"scope":"day","key":"yesterday","currency":"USD","amount_micro":1}]}`},
		{"empty key", `{"v":1,"spent":[{"scope":"task","key":"","currency":"USD","amount_micro":1}]}`},
		{"bad currency", `{"v":1,"spent":[{"scope":"task","key":"t","currency":"usd","amount_micro":1}]}`},
		{"duplicate", `{"v":1,"spent":[{"scope":"task","key":"t","currency":"USD","amount_micro":1},{"scope":"task","key":"t","currency":"USD","amount_micro":1}]}`},
		{"trailing data", `{"v":1,"spent":[]} {}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newStore(t)
			mustSet(t, s, SetRequest{Amount: usd(1_000_000), Per1k: microRate}, now)
			if err := os.WriteFile(s.ledgerPath(), []byte(c.content), 0o600); err != nil {
				t.Fatal(err)
			}
			if d := s.Admit("t", "", charsFor(1), now); d.Admit || d.Remaining != 0 {
				t.Fatalf("unreadable ledger, yet decided %+v", d)
			}
			if _, err := s.Meter("t", "", charsFor(1), 0, now); err == nil || !strings.Contains(err.Error(), "not overwriting") {
				t.Fatalf("Meter over an unreadable ledger: %v", err)
			}
			if b, _ := os.ReadFile(s.ledgerPath()); string(b) != c.content {
				t.Fatal("Meter overwrote an unreadable ledger")
			}
			r := s.Show(now)
			if r.LedgerError == "" || r.Ceilings[0].RemainingMicro != 0 || !strings.Contains(r.Text(), "UNREADABLE") {
				t.Fatalf("Show with an unreadable ledger: %+v\n%s", r, r.Text())
			}
		})
	}
}

// Day totals are kept for the newest 31 day keys; task and context totals
// are never dropped, and a clock that jumps ahead once does not erase
// today.
func TestLedgerDayRetention(t *testing.T) {
	start := at("2026-06-01T12:00:00Z")
	s := newStore(t)
	mustSet(t, s, SetRequest{Amount: usd(protocol.MaxSafeInteger), Per1k: microRate}, start)
	for i := range 40 {
		mustMeter(t, s, "long-task", "long-ctx", charsFor(10), 0, start.AddDate(0, 0, i))
	}
	mustMeter(t, s, "long-task", "long-ctx", charsFor(10), 0, start.AddDate(5, 0, 0)) // a clock far ahead
	l, err := readLedger(s.ledgerPath())
	if err != nil {
		t.Fatal(err)
	}
	days := 0
	for k := range l.spent {
		if k.scope == protocol.ScopeDay {
			days++
		}
	}
	if days != dayRetention {
		t.Errorf("%d day totals kept, want %d", days, dayRetention)
	}
	last := protocol.DayKey(start.AddDate(0, 0, 39))
	if got := l.lookup("USD").SpentMicro(protocol.ScopeDay, last); got != 10 {
		t.Errorf("the last real day %s lost its spend (%d) to a clock jump", last, got)
	}
	for _, k := range [][2]string{{protocol.ScopeTask, "long-task"}, {protocol.ScopeContext, "long-ctx"}} {
		if got := l.lookup("USD").SpentMicro(k[0], k[1]); got != 410 {
			t.Errorf("%s total %d, want 410: task and context totals are never pruned", k[0], got)
		}
	}
}

// Concurrent invocations of one process are all counted.
func TestConcurrentMeter(t *testing.T) {
	now := at("2026-07-28T15:00:00Z")
	s := newStore(t)
	mustSet(t, s, SetRequest{Amount: usd(protocol.MaxSafeInteger), Per1k: microRate}, now)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for range 10 {
				if _, err := s.Meter(fmt.Sprintf("t%d", g), "shared", charsFor(3), 0, now); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if got := spentOn(t, s, protocol.ScopeContext, "shared", "USD"); got != 8*10*3 {
		t.Fatalf("context spent %d, want %d", got, 8*10*3)
	}
}

// Spend is kept per currency: after the owner clears a USD allowance and
// sets one in EUR, the USD micro-units are not charged as euros.
func TestLedgerKeepsCurrenciesApart(t *testing.T) {
	now := at("2026-07-28T15:00:00Z")
	s := newStore(t)
	mustSet(t, s, SetRequest{Amount: usd(1_000_000), Per1k: microRate}, now)
	mustMeter(t, s, "t", "", charsFor(900_000), 0, now)
	if err := s.Clear(); err != nil {
		t.Fatal(err)
	}
	eur := protocol.Money{AmountMicro: 1_000_000, Currency: "EUR"}
	mustSet(t, s, SetRequest{Amount: eur, Per1k: &protocol.Money{AmountMicro: 1_000, Currency: "EUR"}}, now)
	if d := s.Admit("t", "", charsFor(1_000_000), now); !d.Admit {
		t.Fatalf("USD spend was charged against the EUR ceiling: %+v", d)
	}
	if got := spentOn(t, s, protocol.ScopeDay, "2026-07-28", "USD"); got != 900_000 {
		t.Fatalf("USD spend %d was lost", got)
	}
}

// Ids are stored as they survive JSON (invalid UTF-8 as U+FFFD), so spend
// on an odd task id is still found after a restart.
func TestLedgerKeysSurviveEncoding(t *testing.T) {
	now := at("2026-07-28T15:00:00Z")
	s := newStore(t)
	mustSet(t, s, SetRequest{Amount: usd(100), Per1k: microRate, ScopeTask: true}, now)
	odd := "task-\xff<&>"
	mustMeter(t, s, odd, "", charsFor(100), 0, now)
	again, err := Open(s.dir, fixtureAgent(t), fixtureOwner(t))
	if err != nil {
		t.Fatal(err)
	}
	if d := again.Admit(odd, "", charsFor(1), now); d.Admit {
		t.Fatalf("spend on %q was lost across a restart: %+v", odd, d)
	}
}
