package node

import (
	"context"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/mailbox"
	"agentmesh.dev/mesh/shared/protocol"
)

// The offline mailbox (bus.md "Mailboxes", upstream-notes §6.1): one stream
// MESH_MAILBOX over every inbox, read through the mailbox worker. The node
// asks mesh.mailbox.fetch as the agent (the agent's signature is the whole
// access check) and gets the agent's mail in stream order; once it has
// handled a message it asks mesh.mailbox.ack to delete it. Nothing is made
// per agent at the broker, and the node's credential reaches no JetStream
// subject.

// drainBatch is the fetch batch size; drainRounds bounds one drain (the
// next drain, a minute later or at the next reconnect, goes on).
const (
	drainBatch  = 100
	drainRounds = 20
	// maxTries is how many drains a message whose answer cannot be
	// published is tried in before it is given up (and deleted).
	maxTries = 5
)

// drainAfterLive is how many messages taken live at the agent's inbox
// (each also captured by the mailbox stream) ask for a drain, half the
// default per-agent cap (mailbox.DefaultLimits): a busy agent's box would
// otherwise fill with what it already handled between two timed drains,
// and the stream would refuse the mail of its next absence.
const drainAfterLive = 128

// countCaptured counts a message taken live at the agent's inbox, and asks
// for a drain every drainAfterLive of them.
func (a *Agent) countCaptured() {
	if a.captured.Add(1)%drainAfterLive == 0 {
		a.kickDrain()
	}
}

// kickDrain asks for a drain soon (coalesced).
func (a *Agent) kickDrain() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

// drainLoop drains at start, on every kick (reconnect) and every DrainEvery;
// drains never overlap, and a failed one does not stop the next.
func (a *Agent) drainLoop() {
	defer a.loops.Done()
	t := time.NewTicker(a.n.cfg.DrainEvery)
	defer t.Stop()
	for {
		a.drainOnce()
		select {
		case <-a.ctx.Done():
			return
		case <-a.kick:
		case <-t.C:
		}
	}
}

// DrainNow drains the mailbox once, now, and returns how many messages it
// took. It waits for a drain already running.
func (a *Agent) DrainNow() int {
	a.drainMu.Lock()
	defer a.drainMu.Unlock()
	return a.drainLocked()
}

func (a *Agent) drainOnce() {
	a.drainMu.Lock()
	defer a.drainMu.Unlock()
	a.drainLocked()
	a.drains.Add(1)
}

// drainLocked fetches the mailbox in batches of up to 100 until a batch
// says nothing is left (or drainRounds). Every message goes through the
// same receive order as live traffic, with the mailbox freshness window;
// requests get no accept and are answered at the sender's inbox. A message
// is deleted once handled; one whose answer could not be published stays
// for the next drain (at most maxTries), and from then on this drain
// deletes what it handles one by one, so the one that stays is not swept
// away with the rest.
func (a *Agent) drainLocked() int {
	if a.ctx.Err() != nil || a.Sandbox() {
		return 0
	}
	ctx, cancel := context.WithTimeout(a.ctx, 5*time.Minute)
	defer cancel()
	taken, after, stuck := 0, uint64(0), false
	for range drainRounds {
		fctx, fcancel := context.WithTimeout(ctx, 15*time.Second)
		mail, res, err := mailbox.Fetch(fctx, a.n.nc, a.key, after, drainBatch)
		fcancel()
		if err != nil {
			if errs.CodeOf(err) == errs.TransportNoResponders {
				a.n.log.Debug("mailbox: no mailbox worker answers", "agent", a.id)
			} else if ctx.Err() == nil {
				a.n.log.Warn("mailbox: fetch", "agent", a.id, "err", err)
			}
			break
		}
		if len(mail) == 0 {
			break
		}
		// A request still queued on the live subscription should be claimed
		// by the live path (which answers on the reply subject, after an
		// accept), and is then a duplicate here.
		select {
		case <-time.After(liveGrace):
		case <-ctx.Done():
			return taken
		}
		// Purging below a sequence is right only when every message up to
		// it was received: one lost in transit (a slow consumer) or a count
		// that does not match would be purged unhandled. Then the drain
		// acknowledges one by one.
		if len(mail) != res.Count || !ascending(mail, after) {
			stuck = true
		}
		var upTo uint64
		var singles []uint64
		for _, m := range mail {
			taken++
			if err := a.receive(m.Data, origin{src: protocol.SourceMailbox, lastTry: a.lastTry(m.Seq)}); err != nil && a.retry(m.Seq) {
				a.n.log.Warn("mailbox: answer not sent; left for the next drain", "agent", a.id, "seq", m.Seq, "err", err)
				stuck = true
				continue
			}
			a.forgetTries(m.Seq)
			if stuck {
				singles = append(singles, m.Seq)
			} else {
				upTo = m.Seq + 1
			}
		}
		if upTo > 0 || len(singles) > 0 {
			actx, acancel := context.WithTimeout(ctx, 15*time.Second)
			err := mailbox.Ack(actx, a.n.nc, a.key, res.Box, upTo, singles)
			acancel()
			if err != nil {
				// Not deleted: the next drain sees them again, and the
				// journal keeps them from being answered twice.
				a.n.log.Warn("mailbox: ack", "agent", a.id, "err", err)
				break
			}
		}
		after = res.Last
		if !res.More {
			break
		}
	}
	if taken > 0 {
		a.n.log.Info("mailbox drained", "agent", a.id, "messages", taken)
	}
	return taken
}

// ascending reports whether the fetched sequences rise strictly from
// after, as the worker sends them.
func ascending(mail []mailbox.Mail, after uint64) bool {
	for _, m := range mail {
		if m.Seq <= after {
			return false
		}
		after = m.Seq
	}
	return true
}

// liveGrace is how long a drained batch waits before its messages go
// through the receive order. The stream stores every request, including
// those arriving live at this very moment.
const liveGrace = 250 * time.Millisecond

// retry counts a failed try of the message at seq and reports whether it
// stays for another drain.
func (a *Agent) retry(seq uint64) bool {
	a.triesMu.Lock()
	defer a.triesMu.Unlock()
	if a.tries == nil {
		a.tries = map[uint64]int{}
	}
	a.tries[seq]++
	if a.tries[seq] >= maxTries {
		delete(a.tries, seq)
		return false
	}
	if len(a.tries) > 10*drainBatch {
		clear(a.tries) // bounded: a forgotten count only allows more tries
	}
	return true
}

// lastTry reports whether this drain is the last that may leave seq in the
// mailbox (retry then answers false).
func (a *Agent) lastTry(seq uint64) bool {
	a.triesMu.Lock()
	defer a.triesMu.Unlock()
	return a.tries[seq] >= maxTries-1
}

func (a *Agent) forgetTries(seq uint64) {
	a.triesMu.Lock()
	delete(a.tries, seq)
	a.triesMu.Unlock()
}
