package allowance

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// The durable spend ledger.
//
// protocol.Ledger has the accounting rules but lives in memory and cannot
// be enumerated, so it cannot be saved. This ledger keeps the same rules
// (empty ids are not scopes, non-positive amounts are ignored, sums
// saturate) over totals that are written to disk after every metered
// invocation; ledger_test.go checks it against protocol.Ledger.
//
// The file is a snapshot of totals rewritten atomically (temporary file,
// fsync, rename, directory fsync), not an append log. Why:
//   - a crash at any point leaves either the old snapshot or the new one,
//     never a torn file, so at most the invocation being metered is lost and
//     nothing is ever counted twice (there is no replay step that could
//     apply an entry again);
//   - its size is bounded by the number of tasks, contexts and retained
//     days, not by the number of invocations, so it needs no compaction;
//   - an invocation is seconds of model time, so rewriting a few kilobytes
//     per invocation costs nothing that matters.
// The price is that writers must not race: one process (the running
// adapter) meters per state directory, and Store serialises its own calls.

// ledgerVersion is the only ledger file version this code reads.
const ledgerVersion = 1

// dayRetention is how many distinct UTC days of day-scope spend are kept.
// Only the current day is ever admitted against; a few more are kept for
// `allowance show` and for clocks that disagree by a day. Retention counts
// the newest day keys present rather than days before "now", so a clock
// that jumps forward once cannot erase today's spend. Task and context
// totals are never dropped: their ceilings cap a total, and forgetting one
// would hand the spend back.
const dayRetention = 31

type spendKey struct{ scope, key, currency string }

// ledger holds spend totals per (scope, key, currency). Spend is tagged
// with the currency it was metered in, so a later allowance in another
// currency is never charged micro-units of a different unit.
type ledger struct {
	spent map[spendKey]int64
}

func newLedger() *ledger { return &ledger{spent: map[spendKey]int64{}} }

// ledgerFile is the on-disk form: entries sorted by scope, key, currency,
// so the same totals always serialise to the same bytes.
type ledgerFile struct {
	V     int           `json:"v"`
	Spent []ledgerEntry `json:"spent"`
}

type ledgerEntry struct {
	Scope       string `json:"scope"`
	Key         string `json:"key"`
	Currency    string `json:"currency"`
	AmountMicro int64  `json:"amount_micro"`
}

// record adds cost to taskID, contextID and the UTC day of at, as
// protocol.Ledger.Record does.
func (l *ledger) record(taskID, contextID string, at time.Time, cost protocol.Money) {
	if cost.AmountMicro <= 0 {
		return
	}
	for _, k := range []spendKey{
		{protocol.ScopeTask, taskID, cost.Currency},
		{protocol.ScopeContext, contextID, cost.Currency},
		{protocol.ScopeDay, protocol.DayKey(at), cost.Currency},
	} {
		if k.key != "" {
			k.key = fileKey(k.key)
			l.spent[k] = saturatingAdd(l.spent[k], cost.AmountMicro)
		}
	}
}

func saturatingAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// lookup is the spend in one currency, as the SpendLookup Policy.Admit
// reads.
func (l *ledger) lookup(currency string) protocol.SpendLookup {
	return protocol.SpendFunc(func(scope, key string) int64 {
		return l.spent[spendKey{scope, fileKey(key), currency}]
	})
}

// fileKey is key as it survives a save: the JSON encoder replaces invalid
// UTF-8 with U+FFFD, so keys are stored that way from the start and spend
// never moves to another key across a restart. Ids that differ only in
// invalid bytes then share one total, which over-counts (the safe side).
func fileKey(key string) string { return strings.ToValidUTF8(key, "\uFFFD") }

// exhausted is the SpendLookup used when the ledger cannot be read: every
// scope has spent everything, so every ceiling is exhausted (fail closed).
var exhausted = protocol.SpendFunc(func(string, string) int64 { return math.MaxInt64 })

// pruneDays keeps the newest dayRetention day keys. DayKey's YYYY-MM-DD
// sorts chronologically as text.
func (l *ledger) pruneDays() {
	seen := map[string]bool{}
	for k := range l.spent {
		if k.scope == protocol.ScopeDay {
			seen[k.key] = true
		}
	}
	if len(seen) <= dayRetention {
		return
	}
	days := slices.Sorted(maps.Keys(seen))
	for _, day := range days[:len(days)-dayRetention] {
		for k := range l.spent {
			if k.scope == protocol.ScopeDay && k.key == day {
				delete(l.spent, k)
			}
		}
	}
}

func (l *ledger) encode() ([]byte, error) {
	f := ledgerFile{V: ledgerVersion, Spent: make([]ledgerEntry, 0, len(l.spent))}
	for k, v := range l.spent {
		f.Spent = append(f.Spent, ledgerEntry{Scope: k.scope, Key: k.key, Currency: k.currency, AmountMicro: v})
	}
	slices.SortFunc(f.Spent, func(a, b ledgerEntry) int {
		return strings.Compare(a.Scope+"\x00"+a.Key+"\x00"+a.Currency, b.Scope+"\x00"+b.Key+"\x00"+b.Currency)
	})
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode spend ledger: %w", err)
	}
	return append(b, '\n'), nil
}

// decodeLedger parses a ledger file strictly: unknown members, fractional
// or negative amounts, unknown scopes and duplicate entries are all
// refused. A ledger this code did not write is not trusted to be partly
// right, since a wrong total is a wrong admission.
func decodeLedger(data []byte) (*ledger, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f ledgerFile
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("spend ledger is not valid: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("spend ledger is not valid: data after the JSON object")
	}
	if f.V != ledgerVersion {
		return nil, fmt.Errorf("spend ledger has version %d; this adapter reads version %d", f.V, ledgerVersion)
	}
	l := newLedger()
	for i, e := range f.Spent {
		if err := e.check(); err != nil {
			return nil, fmt.Errorf("spend ledger entry %d: %w", i, err)
		}
		k := spendKey{e.Scope, e.Key, e.Currency}
		if _, dup := l.spent[k]; dup {
			return nil, fmt.Errorf("spend ledger entry %d: duplicate %s %q %s", i, e.Scope, e.Key, e.Currency)
		}
		l.spent[k] = e.AmountMicro
	}
	return l, nil
}

func (e ledgerEntry) check() error {
	switch {
	case e.Scope != protocol.ScopeTask && e.Scope != protocol.ScopeContext && e.Scope != protocol.ScopeDay:
		return fmt.Errorf("unknown scope %q", e.Scope)
	case e.Key == "":
		return errors.New("empty key")
	case e.Scope == protocol.ScopeDay && !isDayKey(e.Key):
		return fmt.Errorf("day key %q is not a YYYY-MM-DD date", e.Key)
	case !protocol.IsCurrency(e.Currency):
		return fmt.Errorf("currency %q is not an ISO 4217 code", e.Currency)
	case e.AmountMicro < 0:
		return fmt.Errorf("negative amount %d", e.AmountMicro)
	}
	return nil
}

func isDayKey(s string) bool {
	t, err := time.Parse(time.DateOnly, s)
	return err == nil && protocol.DayKey(t) == s
}

// readLedger loads the ledger at path; a missing file is an empty ledger
// (nothing metered yet).
func readLedger(path string) (*ledger, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return newLedger(), nil
	}
	if err != nil {
		return nil, fmt.Errorf("read spend ledger: %w", err)
	}
	l, err := decodeLedger(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return l, nil
}

// saveLedger is how Meter persists the ledger; tests replace it to
// simulate a crash between metering and saving.
var saveLedger = writeLedger

// writeLedger replaces the ledger at path atomically, mode 0600.
func writeLedger(path string, l *ledger) error {
	b, err := l.encode()
	if err != nil {
		return err
	}
	return writeDurable(path, b)
}

// writeDurable is keys.WriteSecretFile: temporary file, fsync, rename,
// 0600, and an fsync of the directory, without which a power loss could
// undo the rename and with it more than the last write.
func writeDurable(path string, data []byte) error {
	return keys.WriteSecretFile(path, data)
}

// syncDir fsyncs dir so a rename or removal in it is durable. Best effort:
// some filesystems (and Windows) cannot sync a directory, and the rename
// itself has already happened.
func syncDir(dir string) {
	d, err := os.Open(dir)
	if err != nil {
		return
	}
	_ = d.Sync()
	_ = d.Close()
}
