package node

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Journal remembers which inbound envelopes this node has already handled,
// keyed by (from, id), so that a request answered live is not answered again
// when the offline mailbox delivers its stored copy (bus.md "Mailboxes";
// DESIGN §5). The in-process dedup memory covers one process; the journal
// covers restarts.
//
// The runtime records a request when it first answers it (the accept, or a
// refusal that replaces the accept, or the answer to a drained request) and a
// respond when it has routed it to the caller waiting on it or to OnReply.
type Journal interface {
	// Answered reports whether (from, id) was recorded within the retention.
	Answered(from, id string) bool
	// Record remembers (from, id).
	Record(from, id string) error
}

// JournalRetention is how long an entry is kept: the mailbox keeps mail for
// seven days, so nothing older can come back.
const JournalRetention = 7 * 24 * time.Hour

// journalEntry is a journal's key: a struct rather than a joined string, so
// a lookup allocates nothing.
type journalEntry struct{ from, id string }

func journalKey(from, id string) journalEntry { return journalEntry{from, id} }

// MemJournal is an in-memory Journal: it covers one process only. It is the
// default when Config.Journal is nil.
type MemJournal struct {
	mu      sync.Mutex
	now     func() time.Time
	entries map[journalEntry]time.Time
	adds    int
}

// NewMemJournal returns an empty in-memory journal (now nil: time.Now).
func NewMemJournal(now func() time.Time) *MemJournal {
	if now == nil {
		now = time.Now
	}
	return &MemJournal{now: now, entries: map[journalEntry]time.Time{}}
}

// Answered implements Journal.
func (j *MemJournal) Answered(from, id string) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	at, ok := j.entries[journalKey(from, id)]
	return ok && j.now().Sub(at) <= JournalRetention
}

// Record implements Journal. Entries past the retention are dropped every
// 10,000 additions.
func (j *MemJournal) Record(from, id string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	now := j.now()
	j.entries[journalKey(from, id)] = now
	if j.adds++; j.adds%10000 == 0 {
		for k, at := range j.entries {
			if now.Sub(at) > JournalRetention {
				delete(j.entries, k)
			}
		}
	}
	return nil
}

// FileJournal is a Journal kept in an append-only file (mode 0600), one line
// per entry: "<unix ms> <from> <id>". Entries older than seven days are
// dropped when the file is opened and whenever it is compacted (rewritten
// atomically once it holds twice as many lines as live entries, and at least
// 10,000). A torn last line, left by a crash in the middle of a write, is
// ignored.
//
// Each Record is one write(2) before the answer it stands for is published,
// so a crash of the process loses nothing; the file is not fsynced per entry,
// so a power cut can lose the last few seconds of entries (the requests they
// cover would then be answered a second time from the mailbox).
type FileJournal struct {
	mu      sync.Mutex
	path    string
	now     func() time.Time
	f       *os.File
	entries map[journalEntry]time.Time
	lines   int
}

// OpenFileJournal opens (or creates) the journal at path. now nil is time.Now.
func OpenFileJournal(path string, now func() time.Time) (*FileJournal, error) {
	if now == nil {
		now = time.Now
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	j := &FileJournal{path: path, now: now, entries: map[journalEntry]time.Time{}}
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("journal: %w", err)
	}
	cutoff := now().Add(-JournalRetention)
	total := 0
	for line := range bytes.SplitSeq(data, []byte{'\n'}) {
		if len(line) == 0 {
			continue
		}
		total++
		f := strings.Fields(string(line))
		if len(f) != 3 {
			continue
		}
		ms, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		at := time.UnixMilli(ms)
		if at.Before(cutoff) {
			continue
		}
		k := journalKey(f[1], f[2])
		if prev, ok := j.entries[k]; !ok || at.After(prev) {
			j.entries[k] = at
		}
	}
	if total != len(j.entries) || (err == nil && len(data) > 0 && data[len(data)-1] != '\n') {
		// Something was dropped (expired, duplicate or torn): rewrite.
		if err := j.compactLocked(); err != nil {
			return nil, err
		}
	} else {
		j.lines = total
	}
	if j.f == nil {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("journal: %w", err)
		}
		if err := f.Chmod(0o600); err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("journal: %w", err)
		}
		j.f = f
	}
	return j, nil
}

// Answered implements Journal.
func (j *FileJournal) Answered(from, id string) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	at, ok := j.entries[journalKey(from, id)]
	return ok && j.now().Sub(at) <= JournalRetention
}

// Record implements Journal.
func (j *FileJournal) Record(from, id string) error {
	if strings.ContainsAny(from+id, " \n\r\t") || from == "" || id == "" {
		return fmt.Errorf("journal: (from, id) must be non-empty and without white space")
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil {
		return errors.New("journal: closed")
	}
	now := j.now()
	line := strconv.FormatInt(now.UnixMilli(), 10) + " " + from + " " + id + "\n"
	if _, err := j.f.WriteString(line); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	j.entries[journalKey(from, id)] = now
	j.lines++
	if j.lines >= 10000 && j.lines >= 2*len(j.entries) {
		j.pruneLocked(now)
		return j.compactLocked()
	}
	return nil
}

func (j *FileJournal) pruneLocked(now time.Time) {
	for k, at := range j.entries {
		if now.Sub(at) > JournalRetention {
			delete(j.entries, k)
		}
	}
}

// compactLocked rewrites the file with the live entries only, atomically
// (temporary file, fsync, rename), and reopens it for appending.
func (j *FileJournal) compactLocked() error {
	var b strings.Builder
	for k, at := range j.entries {
		b.WriteString(strconv.FormatInt(at.UnixMilli(), 10) + " " + k.from + " " + k.id + "\n")
	}
	tmp, err := os.CreateTemp(filepath.Dir(j.path), ".journal-*")
	if err != nil {
		return fmt.Errorf("journal: compact: %w", err)
	}
	defer os.Remove(tmp.Name())
	// One err throughout: a failed chmod, write or sync must stop the
	// rename below, or a torn journal would replace a whole one.
	err = tmp.Chmod(0o600)
	if err == nil {
		_, err = tmp.WriteString(b.String())
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("journal: compact: %w", err)
	}
	if j.f != nil {
		_ = j.f.Close()
		j.f = nil
	}
	if err := os.Rename(tmp.Name(), j.path); err != nil {
		return fmt.Errorf("journal: compact: %w", err)
	}
	f, err := os.OpenFile(j.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	j.f = f
	j.lines = len(j.entries)
	return nil
}

// Close closes the file. Record fails afterwards; Answered still answers
// from memory.
func (j *FileJournal) Close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil {
		return nil
	}
	err := j.f.Close()
	j.f = nil
	return err
}

// Len is the number of live entries (for tests and diagnostics).
func (j *FileJournal) Len() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.entries)
}
