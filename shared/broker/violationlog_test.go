package broker

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// brokerLine is a permission violation as nats-server 2.15 logs it.
func brokerLine(user, kind, subject string, sid int) string {
	prefix := fmt.Sprintf(`127.0.0.1:%d - cid:%d - "v1.55.0:go" - "AABLBFGBGFJVLCTM7LB3ZPIMOKF23FFXXZFJSBTSV2V3KUO5EEZPEH45/MESH/jwt:%s" - `, 30000+sid, sid, user)
	switch kind {
	case "publish":
		return prefix + fmt.Sprintf("Publish Violation - Subject %q", subject)
	case "reply":
		return prefix + fmt.Sprintf("Publish Violation - Reply %q", subject)
	case "queue":
		return prefix + fmt.Sprintf("Subscription Violation - Subject %q, Queue: %q, SID %d", subject, "q", sid)
	}
	return prefix + fmt.Sprintf("Subscription Violation - Subject %q, SID %d", subject, sid)
}

type logLine map[string]any

func readLines(t *testing.T, buf *bytes.Buffer) []logLine {
	t.Helper()
	var out []logLine
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if l == "" {
			continue
		}
		var m logLine
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatal(err)
		}
		out = append(out, m)
	}
	buf.Reset()
	return out
}

// A flood of permission violations is at most one warning per (user, kind,
// subject) per window, with the count of the lines it stood for; other
// broker errors pass as they are.
func TestViolationsAreAggregated(t *testing.T) {
	var buf bytes.Buffer
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := &natsLogger{log: slog.New(slog.NewJSONHandler(&buf, nil))}
	l.violations = newViolationLog(l.log, func() time.Time { return now })
	const eve, bob = "UEVE", "UBOB"

	for i := range 1000 {
		l.Errorf("%s", brokerLine(eve, "publish", "mesh.peer.x", i))
	}
	lines := readLines(t, &buf)
	if len(lines) != 1 {
		t.Fatalf("1,000 violations wrote %d lines", len(lines))
	}
	if w := lines[0]; w["level"] != "WARN" || w["msg"] != "permissions violation" || w["user"] != eve || w["kind"] != "publish" ||
		w["subject"] != "mesh.peer.x" || w["suppressed"] != nil {
		t.Errorf("first line %v", w)
	}

	// Another subject, another kind, another user: each its own line.
	l.Errorf("%s", brokerLine(eve, "subscribe", "$KV.mesh_registry.>", 1))
	l.Errorf("%s", brokerLine(eve, "queue", "$KV.mesh_registry.>", 2)) // same key as the line above
	l.Errorf("%s", brokerLine(eve, "reply", "_INBOX.x", 3))
	l.Errorf("%s", brokerLine(bob, "publish", "mesh.peer.x", 4))
	l.Errorf("Publish Violation - Subject %q", "no.client.prefix") // no user: still one key
	l.Errorf("%s", "JetStream resource limits exceeded for account")
	lines = readLines(t, &buf)
	var got []string
	for _, w := range lines {
		got = append(got, fmt.Sprintf("%s|%v|%v|%v", w["level"], w["user"], w["kind"], w["subject"]))
	}
	want := []string{"WARN|UEVE|subscribe|$KV.mesh_registry.>", "WARN|UEVE|publish reply|_INBOX.x", "WARN|UBOB|publish|mesh.peer.x",
		"WARN|unknown|publish|no.client.prefix", "ERROR|<nil>|<nil>|<nil>"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	// After the window the key writes again, and the count of what it
	// stood for is written (on a summary line when the window rolled over,
	// else on its next line); so is the count of the queue subscription
	// that was suppressed quietly.
	now = now.Add(ViolationWindow)
	l.Errorf("%s", brokerLine(eve, "publish", "mesh.peer.x", 2000))
	counted := map[string]float64{}
	fresh := 0
	for _, w := range readLines(t, &buf) {
		n, _ := w["suppressed"].(float64)
		counted[fmt.Sprint(w["user"], " ", w["kind"], " ", w["subject"])] += n
		if w["msg"] == "permissions violation" {
			fresh++
		}
	}
	if fresh != 1 || counted["UEVE publish mesh.peer.x"] != 999 || counted["UEVE subscribe $KV.mesh_registry.>"] != 1 {
		t.Fatalf("after the window: %d new lines, counts %v", fresh, counted)
	}

	// A client walking through subjects meets the cap, and the count of
	// what it dropped is reported when the window passes.
	now = now.Add(ViolationWindow)
	for i := range 500 {
		l.Errorf("%s", brokerLine(eve, "publish", fmt.Sprintf("mesh.peer.%d", i), i))
	}
	if n := len(readLines(t, &buf)); n > ViolationLinesPerWindow+5 {
		t.Fatalf("500 subjects wrote %d lines; the cap is %d", n, ViolationLinesPerWindow)
	}
	now = now.Add(ViolationWindow)
	l.violations.flush()
	found := false
	for _, w := range readLines(t, &buf) {
		if w["msg"] == "permissions violations suppressed" && w["suppressed_over_cap"] != nil {
			found = w["suppressed_over_cap"] == float64(500-ViolationLinesPerWindow)
			if !found {
				t.Errorf("over-cap summary %v", w)
			}
		}
	}
	if !found {
		t.Error("no summary of the lines over the cap")
	}
	// Nothing is remembered beyond two windows.
	if n := len(l.violations.keys); n > ViolationLinesPerWindow {
		t.Errorf("%d keys remembered", n)
	}
}

// A protocol 0.3 client's mailbox probes (upstream-notes §15) are refused
// by the broker every minute; that is routine, written at debug level and
// never as a warning. Other JetStream calls stay violations.
func TestMailboxProbesAreNotWarnings(t *testing.T) {
	var buf bytes.Buffer
	l := &natsLogger{log: slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	l.violations = newViolationLog(l.log, time.Now)
	const sdk = "USDK"
	probes := []string{"$JS.API.INFO", "$JS.API.STREAM.INFO.MESH_INBOX_USDK", "$JS.API.CONSUMER.INFO.MESH_INBOX_USDK.inbox_USDK",
		"$JS.API.CONSUMER.CREATE.MESH_INBOX_USDK.inbox_USDK", "$JS.API.CONSUMER.DURABLE.CREATE.MESH_INBOX_USDK.inbox_USDK"}
	for _, s := range probes {
		l.Errorf("%s", brokerLine(sdk, "publish", s, 1))
	}
	for _, w := range readLines(t, &buf) {
		if w["level"] != "DEBUG" {
			t.Errorf("a mailbox probe was logged as %v: %v", w["level"], w)
		}
	}
	for _, s := range []string{"$JS.API.STREAM.INFO.MESH_MAILBOX", "$JS.API.STREAM.PURGE.MESH_INBOX_USDK", "$JS.API.CONSUMER.MSG.NEXT.MESH_MAILBOX.x"} {
		l.Errorf("%s", brokerLine(sdk, "publish", s, 2))
		if lines := readLines(t, &buf); len(lines) != 1 || lines[0]["level"] != "WARN" {
			t.Errorf("%s: %v", s, lines)
		}
	}
	l.Errorf("%s", brokerLine(sdk, "subscribe", "$JS.API.INFO", 3))
	if lines := readLines(t, &buf); len(lines) != 1 || lines[0]["level"] != "WARN" {
		t.Errorf("a subscription to the probe subject is a violation: %v", lines)
	}
}
