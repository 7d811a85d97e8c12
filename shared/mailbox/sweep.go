package mailbox

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/keys"
)

// sweepLoop runs Sweep every SweepEvery until Start's ctx ends or Stop.
func (w *Worker) sweepLoop(ctx context.Context) {
	defer w.done.Done()
	bus.Every(ctx, w.cfg.SweepEvery, func(sctx context.Context) {
		w.warnWhenFull(sctx)
		if n, err := w.Sweep(sctx); err != nil {
			if ctx.Err() == nil {
				w.log.Warn("mailbox sweep", "err", err, "purged", n)
			}
		} else if n > 0 {
			w.log.Info("mailbox sweep purged mail nobody will read", "subjects", n)
		}
	})
}

// fullAt is the share of its byte bound past which the stream is reported
// as filling: past the bound, new mail is refused without a word from the
// broker (the stream takes no-ack publishes), so the operator hears it here.
const fullAt = 0.9

// warnWhenFull logs a warning when the stream holds more than fullAt of
// its byte bound. It reports whether it did.
func (w *Worker) warnWhenFull(ctx context.Context) bool {
	info, err := w.stream.Info(ctx)
	if err != nil || info.Config.MaxBytes <= 0 {
		return false
	}
	if share := float64(info.State.Bytes) / float64(info.Config.MaxBytes); share >= fullAt {
		w.log.Warn("the mailbox stream is nearly full: past its bound, new offline mail is not stored (raise --limit-mailbox-bytes, or see who fills it)",
			"bytes", info.State.Bytes, "max_bytes", info.Config.MaxBytes, "messages", info.State.Msgs, "full_pct", int(share*100))
		return true
	}
	return false
}

// Sweep purges the mail nobody will read: every inbox subject whose agent
// has no registration, or a sandbox one (a guest has no mailbox), and whose
// newest message is older than SweepGrace. This is what reclaims a flood
// sent to made-up keys, and the mail of agents that deregistered or were
// reaped. A registered, non-sandbox agent's mail is left to the stream's
// own limits (MaxAge, per-agent count), however long it stays offline. It
// returns how many subjects it purged. Copies may sweep at the same time:
// purges are idempotent.
func (w *Worker) Sweep(ctx context.Context) (int, error) {
	info, err := w.stream.Info(ctx, jetstream.WithSubjectFilter("mesh.agent.>"))
	if err != nil {
		return 0, fmt.Errorf("mailbox stream info: %w", err)
	}
	cutoff := w.now().Add(-w.cfg.SweepGrace)
	purged := 0
	var errList []error
	for subject := range info.State.Subjects {
		if ctx.Err() != nil {
			break
		}
		// A token that is no agent key can never register: its mail is
		// junk however it got there.
		if agent, ok := agentOf(subject); ok {
			found, sandbox, err := w.registered(ctx, agent)
			if err != nil {
				errList = append(errList, err)
				continue
			}
			if found && !sandbox {
				continue
			}
		}
		last, err := w.stream.GetLastMsgForSubject(ctx, subject)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			errList = append(errList, err)
			continue
		}
		if last.Time.After(cutoff) {
			continue // still in use, or mail a key may yet register for
		}
		// Purge only up to what was read: a message arriving meanwhile
		// stays for the next sweep.
		if err := w.stream.Purge(ctx, jetstream.WithPurgeSubject(subject), jetstream.WithPurgeSequence(last.Sequence+1)); err != nil {
			errList = append(errList, err)
			continue
		}
		purged++
	}
	return purged, errors.Join(errList...)
}

// agentOf returns the agent key of an inbox subject
// mesh.agent.<id>.inbox[.guarded], and false when <id> is not an agent key.
func agentOf(subject string) (string, bool) {
	t := strings.Split(subject, ".")
	if len(t) < 4 || !keys.IsUserPublicKey(t[2]) {
		return "", false
	}
	return t[2], true
}
