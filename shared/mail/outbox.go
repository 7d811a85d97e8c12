package mail

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	netmail "net/mail"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"
)

// outboxFrom is the sender written into outbox messages; nothing delivers
// them, so it only has to be well formed.
const outboxFrom = "meshd <meshd@localhost>"

// Outbox is the one-machine sender: it writes each message to its own file
// under a directory and logs one line saying where it went, so that the
// person running meshd can open it. It never contacts a mail server.
//
// THE OUTBOX FILES ARE THE SECRET. A message may carry a one-time login code
// or an agent key in its text, so each file is written with mode 0600 in a
// directory kept at mode 0700, and the log line names the recipient, subject,
// kind and path but never the text. Anyone who can read the directory can
// sign in as the recipients; treat it like the data directory's key files.
//
// Each file is a complete RFC 5322 message, the text in UTF-8 as it is
// (Content-Transfer-Encoding 8bit, where SMTP sends quoted-printable) so
// that a key or a link stays on one line for a person to copy, written
// atomically (temporary file, fsync, rename), and named
//
//	<UTC time, YYYYMMDDTHHMMSS.nnnnnnnnnZ>-<kind>-<random>.eml
//
// so that names sort in the order messages were written (ties within one
// Outbox are broken by advancing the time by a nanosecond). Kind "mail" is
// used when the message has none. An Outbox is safe for concurrent use.
type Outbox struct {
	dir  string
	log  *slog.Logger
	from *netmail.Address
	now  func() time.Time

	mu   sync.Mutex
	last time.Time
}

var _ Sender = (*Outbox)(nil)

const (
	outboxDirMode  = 0o700
	outboxFileMode = 0o600
	outboxExt      = ".eml"
	outboxTempPfx  = ".tmp-"
)

// NewOutbox creates dir if needed (and tightens it to mode 0700) and returns
// a sender that writes there and logs with logger, which must not be nil.
func NewOutbox(dir string, logger *slog.Logger) (*Outbox, error) {
	if dir == "" {
		return nil, errors.New("mail: outbox directory is empty")
	}
	if logger == nil {
		return nil, errors.New("mail: outbox needs a logger to say where mail went")
	}
	if err := os.MkdirAll(dir, outboxDirMode); err != nil {
		return nil, fmt.Errorf("mail: outbox: %w", err)
	}
	if err := os.Chmod(dir, outboxDirMode); err != nil {
		return nil, fmt.Errorf("mail: outbox: %w", err)
	}
	from, err := parseAddress("sender", outboxFrom)
	if err != nil {
		return nil, err
	}
	return &Outbox{dir: dir, log: logger, from: from, now: time.Now}, nil
}

// Dir is the directory the outbox writes to.
func (o *Outbox) Dir() string { return o.dir }

// stamp returns the time for the next file, strictly after the last one.
func (o *Outbox) stamp() time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	t := o.now().UTC()
	if !t.After(o.last) {
		t = o.last.Add(time.Nanosecond)
	}
	o.last = t
	return t
}

// Send writes m to a new file in the outbox and logs where it went. The log
// line never includes m.Text.
func (o *Outbox) Send(ctx context.Context, m Message) error {
	c, err := check(m)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	at := o.stamp()
	id, err := newMessageID(o.from)
	if err != nil {
		return err
	}
	raw, err := render(o.from, c, at, id, plain8bit)
	if err != nil {
		return err
	}
	var rnd [6]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return fmt.Errorf("mail: outbox: %w", err)
	}
	kind := m.Kind
	if kind == "" {
		kind = "mail"
	}
	name := at.Format("20060102T150405.000000000Z") + "-" + kind + "-" + hex.EncodeToString(rnd[:]) + outboxExt
	path := filepath.Join(o.dir, name)
	if err := writeFileAtomic(o.dir, path, raw); err != nil {
		return fmt.Errorf("mail: outbox: %w", err)
	}
	o.log.InfoContext(ctx, "mail written to the outbox",
		slog.String("to", c.to.Address),
		slog.String("subject", m.Subject),
		slog.String("kind", kind),
		slog.String("path", path))
	return nil
}

// writeFileAtomic writes data to a 0600 temporary file in dir, syncs it and
// renames it to path, then syncs dir, so a reader sees all of it or nothing.
func writeFileAtomic(dir, path string, data []byte) (err error) {
	f, err := os.CreateTemp(dir, outboxTempPfx+"*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	if err = f.Chmod(outboxFileMode); err != nil {
		f.Close()
		return err
	}
	if _, err = f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err = f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	if d, derr := os.Open(dir); derr == nil {
		_ = d.Sync() // best effort: not every filesystem syncs directories
		d.Close()
	}
	return nil
}

// ReadOutbox returns the messages in an outbox directory, oldest first (in
// file-name order), for meshd's admin commands and for tests. Temporary files
// of writes in progress are skipped. A directory that does not exist yet is
// an empty outbox.
func ReadOutbox(dir string) ([]Message, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("mail: read outbox: %w", err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		n := e.Name()
		if e.Type().IsRegular() && strings.HasSuffix(n, outboxExt) && !strings.HasPrefix(n, ".") {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	out := make([]Message, 0, len(names))
	for _, n := range names {
		raw, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			return nil, fmt.Errorf("mail: read outbox: %w", err)
		}
		m, err := ParseMessage(raw)
		if err != nil {
			return nil, fmt.Errorf("mail: read outbox: %s: %w", n, err)
		}
		out = append(out, m)
	}
	return out, nil
}
