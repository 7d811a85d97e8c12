// Package cloudlog writes log/slog records as the JSON lines Cloud Logging
// reads from a Cloud Function's or Cloud Run container's stderr: the level
// as "severity" (DEBUG, INFO, WARNING, ERROR), the text as "message", and
// the request's trace from X-Cloud-Trace-Context as
// "logging.googleapis.com/trace", so every line a request logs is grouped
// under it in the console.
package cloudlog

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
)

// Field names Cloud Logging gives a meaning to in a structured log line.
const (
	fieldTrace   = "logging.googleapis.com/trace"
	fieldSpan    = "logging.googleapis.com/spanId"
	fieldSampled = "logging.googleapis.com/trace_sampled"
)

// New returns a logger writing Cloud Logging's JSON lines to w at level
// and above. project names the Google Cloud project the traces belong to
// ("" leaves traces out).
func New(w io.Writer, level slog.Leveler, project string) *slog.Logger {
	h := slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: replace})
	return slog.New(&traceHandler{Handler: h, project: project})
}

// replace renames the top-level level and message to Cloud Logging's names.
func replace(groups []string, a slog.Attr) slog.Attr {
	if len(groups) > 0 {
		return a
	}
	switch a.Key {
	case slog.LevelKey:
		return slog.String("severity", Severity(a.Value.Any().(slog.Level)))
	case slog.MessageKey:
		a.Key = "message"
	}
	return a
}

// Severity is Cloud Logging's name for a slog level.
func Severity(l slog.Level) string {
	switch {
	case l < slog.LevelInfo:
		return "DEBUG"
	case l < slog.LevelWarn:
		return "INFO"
	case l < slog.LevelError:
		return "WARNING"
	default:
		return "ERROR"
	}
}

type traceHandler struct {
	slog.Handler
	project string
}

func (h *traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if t, ok := ctx.Value(traceKey{}).(trace); ok && h.project != "" {
		r = r.Clone()
		r.AddAttrs(slog.String(fieldTrace, "projects/"+h.project+"/traces/"+t.id))
		if t.span != "" {
			// The header carries the span as a decimal number; the log
			// field wants 16 hex digits.
			if n, err := strconv.ParseUint(t.span, 10, 64); err == nil {
				r.AddAttrs(slog.String(fieldSpan, fmt.Sprintf("%016x", n)))
			}
		}
		if t.sampled {
			r.AddAttrs(slog.Bool(fieldSampled, true))
		}
	}
	return h.Handler.Handle(ctx, r)
}

func (h *traceHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &traceHandler{Handler: h.Handler.WithAttrs(as), project: h.project}
}

func (h *traceHandler) WithGroup(name string) slog.Handler {
	return &traceHandler{Handler: h.Handler.WithGroup(name), project: h.project}
}

type traceKey struct{}

type trace struct {
	id, span string
	sampled  bool
}

// ParseTraceContext reads X-Cloud-Trace-Context: "TRACE_ID/SPAN_ID;o=1",
// the span and option optional. A malformed header (anything but 32 hex
// digits for the trace, decimal digits for the span) yields ok false, so a
// caller cannot write arbitrary text into the log's trace field.
func ParseTraceContext(h string) (id, span string, sampled, ok bool) {
	id, rest, _ := strings.Cut(h, "/")
	if len(id) != 32 || !isHex(id) {
		return "", "", false, false
	}
	span, opts, _ := strings.Cut(rest, ";")
	if span != "" && !isDigits(span) {
		return "", "", false, false
	}
	return id, span, opts == "o=1", true
}

func isHex(s string) bool {
	for _, c := range []byte(s) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return true
}

func isDigits(s string) bool {
	if len(s) > 20 {
		return false
	}
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// Trace puts the request's X-Cloud-Trace-Context into its context, where
// a logger from New finds it.
func Trace(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id, span, sampled, ok := ParseTraceContext(r.Header.Get("X-Cloud-Trace-Context")); ok {
			r = r.WithContext(context.WithValue(r.Context(), traceKey{}, trace{id: id, span: span, sampled: sampled}))
		}
		next.ServeHTTP(w, r)
	})
}
