package mail_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"agentmesh.dev/mesh/shared/mail"
)

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newOutbox(t *testing.T) (*mail.Outbox, string, *syncBuffer) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "outbox")
	var logs syncBuffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	o, err := mail.NewOutbox(dir, logger)
	if err != nil {
		t.Fatal(err)
	}
	return o, dir, &logs
}

func TestOutboxWritesPrivateFilesAndNeverLogsTheBody(t *testing.T) {
	o, dir, logs := newOutbox(t)
	const code = "739-104-SECRET"
	const agentKey = "SUAGENTKEYSECRETSECRETSECRET"
	msgs := []mail.Message{
		{To: "alice@example.com", Subject: "Your mesh login code", Text: "Your code is " + code + "\nIt expires in 10 minutes.", Kind: "login-code"},
		{To: "Bob <bob@example.com>", Subject: "Agent key for “scout” ✓", Text: "Key: " + agentKey, Kind: "agent-key"},
		{To: "carol@example.com", Subject: "No kind", Text: "plain"},
	}
	for _, m := range msgs {
		if err := o.Send(context.Background(), m); err != nil {
			t.Fatalf("Send: %v", err)
		}
	}

	st, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o700 {
		t.Errorf("outbox dir mode %v, want 0700", st.Mode().Perm())
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != len(msgs) {
		t.Fatalf("%d files, want %d", len(entries), len(msgs))
	}
	var names []string
	for _, e := range entries {
		info, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		if info.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v, want 0600", e.Name(), info.Mode().Perm())
		}
		names = append(names, e.Name())
	}
	sort.Strings(names)
	for i, want := range []string{"-login-code-", "-agent-key-", "-mail-"} {
		if !strings.Contains(names[i], want) || !strings.HasSuffix(names[i], ".eml") {
			t.Errorf("file %d is %q, want it to contain %q and end in .eml", i, names[i], want)
		}
	}

	log := logs.String()
	for _, secret := range []string{code, agentKey, "expires in 10 minutes"} {
		if strings.Contains(log, secret) {
			t.Errorf("log holds message text %q:\n%s", secret, log)
		}
	}
	if n := strings.Count(log, `"msg":"mail written to the outbox"`); n != len(msgs) {
		t.Errorf("%d log lines, want %d:\n%s", n, len(msgs), log)
	}
	for _, want := range []string{`"to":"alice@example.com"`, `"subject":"Your mesh login code"`, `"kind":"login-code"`, filepath.Join(dir, names[0])} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %s:\n%s", want, log)
		}
	}

	got, err := mail.ReadOutbox(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []mail.Message{
		{To: "alice@example.com", Subject: msgs[0].Subject, Text: msgs[0].Text, Kind: "login-code"},
		{To: "bob@example.com", Subject: msgs[1].Subject, Text: msgs[1].Text, Kind: "agent-key"},
		{To: "carol@example.com", Subject: "No kind", Text: "plain"},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("ReadOutbox =\n%+v\nwant\n%+v", got, want)
	}
}

func TestOutboxTightensAnExistingDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "outbox")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := mail.NewOutbox(dir, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(dir)
	if st.Mode().Perm() != 0o700 {
		t.Errorf("mode %v, want 0700", st.Mode().Perm())
	}
}

func TestOutboxRefusesInjectionAndWritesNothing(t *testing.T) {
	o, dir, logs := newOutbox(t)
	err := o.Send(context.Background(), mail.Message{To: "a@example.com\r\nBcc: b@example.com", Subject: "s", Text: "code 1234"})
	if !errors.Is(err, mail.ErrInvalidMessage) {
		t.Fatalf("Send = %v, want ErrInvalidMessage", err)
	}
	err = o.Send(context.Background(), mail.Message{To: "a@example.com", Subject: "s\nBcc: b@example.com", Text: "code 1234"})
	if !errors.Is(err, mail.ErrInvalidMessage) {
		t.Fatalf("Send = %v, want ErrInvalidMessage", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("%d files written", len(entries))
	}
	if logs.String() != "" {
		t.Errorf("logged: %s", logs.String())
	}
}

func TestOutboxConcurrentSendsKeepOrderAndNames(t *testing.T) {
	o, dir, _ := newOutbox(t)
	const n = 40
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if err := o.Send(context.Background(), mail.Message{To: "z@example.com", Subject: fmt.Sprint(i), Text: "x", Kind: "login-code"}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	got, err := mail.ReadOutbox(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != n {
		t.Fatalf("%d messages, want %d", len(got), n)
	}
	seen := map[string]bool{}
	for _, m := range got {
		seen[m.Subject] = true
	}
	if len(seen) != n {
		t.Errorf("%d distinct messages, want %d", len(seen), n)
	}
}

func TestReadOutboxSkipsTempFilesAndMissingDir(t *testing.T) {
	o, dir, _ := newOutbox(t)
	if err := o.Send(context.Background(), mail.Message{To: "a@example.com", Subject: "s", Text: "t"}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ".tmp-123"), []byte("half a mess"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := mail.ReadOutbox(dir)
	if err != nil || len(got) != 1 {
		t.Fatalf("ReadOutbox = %v, %v", got, err)
	}
	got, err = mail.ReadOutbox(filepath.Join(dir, "nope"))
	if err != nil || len(got) != 0 {
		t.Fatalf("missing dir: %v, %v", got, err)
	}
}

func TestNewOutboxNeedsALogger(t *testing.T) {
	if _, err := mail.NewOutbox(t.TempDir(), nil); err == nil {
		t.Error("nil logger accepted")
	}
}

// A person copies keys and links from the outbox file itself: each stays
// on one line, as written, with no quoted-printable soft line break ("="
// at a line's end) or "=3D" inside it.
func TestOutboxKeepsKeysAndLinksOnOneLine(t *testing.T) {
	o, dir, _ := newOutbox(t)
	key := "am_" + strings.Repeat("k7Q2x9", 20) // 123 characters
	link := "http://localhost:8080/console/login?email=" + strings.Repeat("ana.lopez", 12) + "%40example.org&next=%2Fconsole%2Fagent-keys"
	cmd := "mesh-adapter --control-url http://127.0.0.1:8080 up " + key
	text := "Run this on the agent's machine:\n\n    " + cmd + "\n\nOr open " + link + " and enter it there.\nÜmlauts stay as they are."
	if err := o.Send(context.Background(), mail.Message{To: "ana@example.org", Subject: "Your new agent key", Text: text, Kind: "agent-key"}); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) != 1 {
		t.Fatalf("outbox: %v, %v", entries, err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, entries[0].Name()))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(raw), "\r\n")
	for _, want := range []string{"    " + cmd, "Or open " + link + " and enter it there.", "Ümlauts stay as they are."} {
		if !slices.Contains(lines, want) {
			t.Errorf("no line %q in the file:\n%s", want, raw)
		}
	}
	if !slices.Contains(lines, "Content-Transfer-Encoding: 8bit") {
		t.Errorf("the file is not 8bit:\n%s", raw)
	}
	got, err := mail.ReadOutbox(dir)
	if err != nil || len(got) != 1 || got[0].Text != text {
		t.Errorf("read back: %+v, %v", got, err)
	}
}
