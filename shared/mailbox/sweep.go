package mailbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
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
// reaped.
//
// A registered, non-sandbox agent's mail is left to the stream's own limits
// (MaxAge, per-agent count) while the agent reads its mailbox: while it has
// fetched within MaxAge (ReadersBucket). An agent that has not keeps only
// its mail of the last UnreadAge: an upstream SDK agent never fetches (it
// looks for a stream of its own, docs/protocol.md "0.2 and 0.3 peers"), and
// since protocol 0.3 every call it makes adds the accept and the answer to
// its box, which would otherwise sit at its per-agent bound for MaxAge.
// The rule starts MaxAge after the readers bucket was made, so that every
// agent that fetched in that time is known by then (mail older than that
// is past MaxAge anyway).
//
// It returns how many subjects it purged (wholly or in part). Copies may
// sweep at the same time: purges are idempotent.
func (w *Worker) Sweep(ctx context.Context) (int, error) {
	info, err := w.stream.Info(ctx, jetstream.WithSubjectFilter("mesh.agent.>"))
	if err != nil {
		return 0, fmt.Errorf("mailbox stream info: %w", err)
	}
	now := w.now()
	cutoff := now.Add(-w.cfg.SweepGrace)
	unread, err := w.unreadRule(ctx, now)
	if err != nil {
		return 0, err
	}
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
				done, err := unread.apply(ctx, w, agent, subject)
				if err != nil {
					errList = append(errList, err)
				} else if done {
					purged++
				}
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

// unread is the sweep's rule for the boxes of agents that do not fetch.
type unread struct {
	armed  bool
	cutoff time.Time // mail stored before it goes
}

// unreadRule is the rule of one sweep at now: armed once the readers
// bucket is MaxAge old, purging mail older than UnreadAge.
func (w *Worker) unreadRule(ctx context.Context, now time.Time) (unread, error) {
	st, err := w.readers.Status(ctx)
	if err != nil {
		return unread{}, fmt.Errorf("kv %s: status: %w", ReadersBucket, err)
	}
	var created time.Time
	if s, ok := st.(*jetstream.KeyValueBucketStatus); ok && s.StreamInfo() != nil {
		created = s.StreamInfo().Created
	}
	l := w.cfg.Limits.orDefault()
	return unread{armed: !created.IsZero() && now.Sub(created) >= l.MaxAge, cutoff: now.Add(-l.UnreadAge)}, nil
}

// apply purges the mail of agent on subject stored before the cutoff, when
// the rule is armed and the agent has not fetched within MaxAge. It reports
// whether it purged anything.
func (u unread) apply(ctx context.Context, w *Worker, agent, subject string) (bool, error) {
	if !u.armed {
		return false, nil
	}
	_, err := w.readers.Get(ctx, agent)
	switch {
	case err == nil:
		return false, nil // it reads its mail
	case !errors.Is(err, jetstream.ErrKeyNotFound):
		return false, fmt.Errorf("kv %s: get %s: %w", ReadersBucket, agent, err)
	}
	// The oldest messages first, up to the first one young enough to
	// stay: at most the box's bound, and each one read is purged.
	var last uint64
	for seq := uint64(1); ; {
		m, err := w.stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return false, fmt.Errorf("mailbox: read %s: %w", subject, err)
		}
		if m.Subject != subject || !m.Time.Before(u.cutoff) {
			break
		}
		last, seq = m.Sequence, m.Sequence+1
	}
	if last == 0 {
		return false, nil
	}
	if err := w.stream.Purge(ctx, jetstream.WithPurgeSubject(subject), jetstream.WithPurgeSequence(last+1)); err != nil {
		return false, fmt.Errorf("mailbox: purge %s: %w", subject, err)
	}
	return true, nil
}

// readerRefresh is how often a copy writes again that an agent fetched: a
// node drains every minute, the bucket keeps a key MaxAge.
const readerRefresh = time.Hour

// readerNotes remembers when this copy last wrote each agent's key.
type readerNotes struct {
	mu sync.Mutex
	at map[string]time.Time
}

// noteReader records in ReadersBucket that agent fetches its mail, at most
// once per readerRefresh per copy. A failure is only logged: the fetch
// goes on, and the next one writes again.
func (w *Worker) noteReader(ctx context.Context, agent string) {
	now := w.now()
	w.noted.mu.Lock()
	if w.noted.at == nil || len(w.noted.at) > maxLimited {
		w.noted.at = map[string]time.Time{}
	}
	last, ok := w.noted.at[agent]
	if ok && now.Sub(last) < readerRefresh {
		w.noted.mu.Unlock()
		return
	}
	w.noted.at[agent] = now
	w.noted.mu.Unlock()
	b, _ := json.Marshal(map[string]string{"fetched_at": protocol.FormatTime(now)})
	if _, err := w.readers.Put(ctx, agent, b); err != nil {
		w.noted.mu.Lock()
		delete(w.noted.at, agent)
		w.noted.mu.Unlock()
		w.log.Warn("mailbox: could not record that the agent fetches its mail", "agent", agent, "err", err)
	}
}
