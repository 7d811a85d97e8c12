package broker

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// LevelTrace is below slog.LevelDebug; a logger enabled at this level also
// receives the broker's protocol trace.
const LevelTrace = slog.LevelDebug - 4

// natsLogger adapts slog to the nats-server Logger interface.
//
// Levels: the broker's notices are routine (listening, JetStream started,
// ready), so they go to Debug and an info-level meshd log stays readable;
// warnings and errors keep their level. Fatalf does not exit the process: the
// embedded broker calls it when a listener cannot bind, and Start reports the
// message as its error instead.
//
// Permission violations are not the broker's errors but a client's refused
// publish or subscribe, and one client can cause thousands a second: they
// go through violations (violationlog.go), at most one warning per (user,
// kind, subject) a minute, with the count of those suppressed.
type natsLogger struct {
	log        *slog.Logger
	violations *violationLog

	mu    sync.Mutex
	fatal string // first Fatalf message, if any
}

func newNATSLogger(log *slog.Logger) *natsLogger {
	log = log.With("component", "nats")
	return &natsLogger{log: log, violations: newViolationLog(log, time.Now)}
}

func (l *natsLogger) logf(level slog.Level, format string, v ...any) {
	ctx := context.Background()
	if !l.log.Enabled(ctx, level) {
		return
	}
	l.log.Log(ctx, level, fmt.Sprintf(format, v...))
}

func (l *natsLogger) Noticef(format string, v ...any) { l.logf(slog.LevelDebug, format, v...) }
func (l *natsLogger) Warnf(format string, v ...any)   { l.logf(slog.LevelWarn, format, v...) }

func (l *natsLogger) Errorf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	if l.violations.take(msg) {
		return
	}
	if l.log.Enabled(context.Background(), slog.LevelError) {
		l.log.Error(msg)
	}
}

func (l *natsLogger) Debugf(format string, v ...any) { l.logf(slog.LevelDebug, format, v...) }
func (l *natsLogger) Tracef(format string, v ...any) { l.logf(LevelTrace, format, v...) }

func (l *natsLogger) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.mu.Lock()
	if l.fatal == "" {
		l.fatal = msg
	}
	l.mu.Unlock()
	l.log.Error(msg, "fatal", true)
}

// fatalMessage returns the first fatal message the broker reported, or "".
func (l *natsLogger) fatalMessage() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fatal
}
