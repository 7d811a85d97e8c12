package broker

import (
	"context"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Limits of the broker's permission-violation log.
const (
	// ViolationWindow is how often one (user, kind, subject) may log a
	// permission violation; the lines in between are counted, not written.
	ViolationWindow = time.Minute
	// ViolationLinesPerWindow caps violation lines of all keys together per
	// window, so a client that walks through subjects cannot flood the log
	// either; lines over it are counted too.
	ViolationLinesPerWindow = 100
)

// violationLine matches the broker's permission-violation log lines
// (nats-server client.go pubPermissionViolation, subPermissionViolation,
// replySubjectViolation, maxTokensViolation), after the client prefix
// `<addr> - cid:<n> - "<client>" - "<account>/<name>/jwt:<user>" - `.
var (
	violationLine = regexp.MustCompile(`(Publish|Subscription) Violation(?: Too Many Tokens)? - (Subject|Reply) "((?:[^"\\]|\\.)*)"`)
	violationUser = regexp.MustCompile(`/(?:jwt|nkey|user):([^"\s]+)"`)
)

type violationKey struct{ user, kind, subject string }

type violationCount struct {
	last       time.Time // when this key last wrote a line
	suppressed int       // lines not written since
}

// violationLog turns a flood of permission violations into a few warnings:
// the first violation of a (user, kind, subject) is written at once, the
// next ones within ViolationWindow are counted, and the count is written
// on the key's next line after its window or, when the window rolls over
// first, on a summary line ("permissions violations suppressed"; flush
// rolls it every window). At most ViolationLinesPerWindow violation lines
// are written per window, whatever the keys.
type violationLog struct {
	log *slog.Logger
	now func() time.Time

	mu          sync.Mutex
	keys        map[violationKey]*violationCount
	windowStart time.Time
	written     int // lines written in the current window
	overCap     int // lines dropped by the cap, not yet reported
}

func newViolationLog(log *slog.Logger, now func() time.Time) *violationLog {
	return &violationLog{log: log, now: now, keys: map[violationKey]*violationCount{}}
}

// take handles msg when it is a permission violation (and reports true);
// any other message is left to the caller.
func (v *violationLog) take(msg string) bool {
	m := violationLine.FindStringSubmatch(msg)
	if m == nil {
		return false
	}
	subject := m[3]
	if u, err := strconv.Unquote(`"` + subject + `"`); err == nil {
		subject = u // the broker quotes it with %q
	}
	k := violationKey{user: "unknown", kind: "subscribe", subject: subject}
	switch {
	case m[2] == "Reply":
		k.kind = "publish reply"
	case m[1] == "Publish":
		k.kind = "publish"
	}
	if u := violationUser.FindStringSubmatch(msg); u != nil {
		k.user = u[1]
	}
	if k.kind == "publish" && IsMailboxProbe(subject) {
		// A protocol 0.3 client looks for a per-agent mailbox stream every
		// minute; the refusal is its "no mailbox" (docs/protocol.md).
		v.log.Debug("a client's mailbox probe refused: this mesh has no per-agent mailbox stream", "user", k.user, "subject", subject)
		return true
	}

	v.mu.Lock()
	now := v.now()
	summaries := v.rollLocked(now)
	c := v.keys[k]
	write := false
	suppressed, overCap := 0, 0
	switch {
	case c != nil && now.Sub(c.last) < ViolationWindow:
		c.suppressed++
	case v.written >= ViolationLinesPerWindow:
		v.overCap++
	default:
		if c == nil {
			c = &violationCount{}
			v.keys[k] = c
		}
		write, suppressed, overCap = true, c.suppressed, v.overCap
		c.last, c.suppressed, v.overCap = now, 0, 0
		v.written++
	}
	v.mu.Unlock()

	v.writeSummaries(summaries)
	if write {
		attrs := []slog.Attr{slog.String("user", k.user), slog.String("kind", k.kind), slog.String("subject", k.subject)}
		if suppressed > 0 {
			attrs = append(attrs, slog.Int("suppressed", suppressed))
		}
		if overCap > 0 {
			attrs = append(attrs, slog.Int("suppressed_over_cap", overCap))
		}
		attrs = append(attrs, slog.String("detail", msg))
		v.log.LogAttrs(context.Background(), slog.LevelWarn, "permissions violation", attrs...)
	}
	return true
}

// flush writes the counts of keys whose window passed without another
// line, and of lines dropped by the cap; meshd calls it every window and
// at shutdown.
func (v *violationLog) flush() {
	v.mu.Lock()
	s := v.rollLocked(v.now())
	v.mu.Unlock()
	v.writeSummaries(s)
}

type violationSummary struct {
	k violationKey
	n int
}

// rollLocked starts a new window when the current one is over: keys whose
// own window passed are forgotten, and those with a count are returned for
// a summary line (the map holds at most the keys written in two windows).
func (v *violationLog) rollLocked(now time.Time) []violationSummary {
	if now.Sub(v.windowStart) < ViolationWindow {
		return nil
	}
	v.windowStart, v.written = now, 0
	var out []violationSummary
	for k, c := range v.keys {
		if now.Sub(c.last) < ViolationWindow {
			continue
		}
		if c.suppressed > 0 {
			out = append(out, violationSummary{k, c.suppressed})
		}
		delete(v.keys, k)
	}
	if v.overCap > 0 {
		out = append(out, violationSummary{violationKey{}, v.overCap})
		v.overCap = 0
	}
	return out
}

func (v *violationLog) writeSummaries(s []violationSummary) {
	for _, x := range s {
		if x.k == (violationKey{}) {
			v.log.Warn("permissions violations suppressed", "suppressed_over_cap", x.n, "cap_per_window", ViolationLinesPerWindow, "window", ViolationWindow.String())
			continue
		}
		v.log.Warn("permissions violations suppressed", "user", x.k.user, "kind", x.k.kind, "subject", x.k.subject,
			"suppressed", x.n, "window", ViolationWindow.String())
	}
}

// IsMailboxProbe reports whether subject is one of the JetStream API calls
// with which a protocol 0.3 client looks for its per-agent mailbox stream
// MESH_INBOX_<agent> (upstream-notes §15): the account information, and
// the stream's or its consumer's information. Client credentials may not
// reach the JetStream API, and the client takes the refusal as "no
// mailbox"; the refusal is routine, not a violation worth a warning.
func IsMailboxProbe(subject string) bool {
	if subject == "$JS.API.INFO" {
		return true
	}
	for _, p := range []string{"$JS.API.STREAM.INFO.", "$JS.API.CONSUMER.INFO.", "$JS.API.CONSUMER.CREATE.", "$JS.API.CONSUMER.DURABLE.CREATE."} {
		if rest, ok := strings.CutPrefix(subject, p); ok {
			return strings.HasPrefix(rest, "MESH_INBOX_")
		}
	}
	return false
}
