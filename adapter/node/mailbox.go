package node

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/protocol"
)

// The offline mailbox (bus.md "Mailboxes", upstream-notes §6.1): one stream
// MESH_MAILBOX over every inbox, and a durable pull consumer inbox_<agent>
// per agent, both made by the registry. The node reaches them only through
// the scoped JetStream API its credential allows: STREAM.INFO on the
// mailbox stream, CONSUMER.INFO and MSG.NEXT on its own consumer, and its
// acknowledgements.

// drainBatch is the pull batch size.
const drainBatch = 100

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

// drainLocked reads the stream's last sequence once (the bound), then pulls
// batches of up to 100 until a batch reaches the bound or nothing is left.
// Every message goes through the same receive order as live traffic, with
// the mailbox freshness window; requests get no accept and are answered at
// the sender's inbox. A message is acknowledged once handled; one whose
// answer could not be published stays for redelivery.
func (a *Agent) drainLocked() int {
	if a.ctx.Err() != nil || a.Sandbox() {
		return 0
	}
	ctx, cancel := context.WithTimeout(a.ctx, time.Minute)
	defer cancel()
	stream, err := a.n.js.Stream(ctx, protocol.MailboxStream)
	if err != nil {
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			a.n.log.Warn("mailbox: stream info", "agent", a.id, "err", err)
		}
		return 0
	}
	bound := stream.CachedInfo().State.LastSeq
	if bound == 0 {
		return 0
	}
	cons, err := a.n.js.Consumer(ctx, protocol.MailboxStream, protocol.MailboxConsumer(a.id))
	if err != nil {
		if !errors.Is(err, jetstream.ErrConsumerNotFound) {
			a.n.log.Warn("mailbox: consumer info", "agent", a.id, "err", err)
		}
		return 0
	}
	info := cons.CachedInfo()
	taken := 0
	for info.NumPending+uint64(info.NumAckPending) > 0 && ctx.Err() == nil {
		batch, err := cons.FetchNoWait(drainBatch)
		if err != nil {
			a.n.log.Warn("mailbox: fetch", "agent", a.id, "err", err)
			return taken
		}
		got, reached, ok := a.drainBatch(ctx, batch, bound)
		taken += got
		if !ok || got == 0 || reached {
			break
		}
		if info, err = cons.Info(ctx); err != nil {
			a.n.log.Warn("mailbox: consumer info", "agent", a.id, "err", err)
			break
		}
	}
	if taken > 0 {
		a.n.log.Info("mailbox drained", "agent", a.id, "messages", taken)
	}
	return taken
}

// liveGrace is how long a drained batch waits before its messages go
// through the receive order. The stream stores every request, including
// those arriving live at this very moment; a request still queued on the
// live subscription should be claimed by the live path (which answers on
// the reply subject, after an accept), and is then a duplicate here.
const liveGrace = 250 * time.Millisecond

// drainBatch handles one batch. reached reports a message at or past the
// bound; ok is false when the batch stalled.
func (a *Agent) drainBatch(ctx context.Context, batch jetstream.MessageBatch, bound uint64) (got int, reached, ok bool) {
	var msgs []jetstream.Msg
	stall := time.NewTimer(10 * time.Second)
	defer stall.Stop()
collect:
	for {
		select {
		case msg, open := <-batch.Messages():
			if !open {
				if err := batch.Error(); err != nil {
					a.n.log.Warn("mailbox: batch", "agent", a.id, "err", err)
				}
				break collect
			}
			msgs = append(msgs, msg)
		case <-stall.C:
			a.n.log.Warn("mailbox: a pull got no answer", "agent", a.id)
			return 0, false, false
		case <-ctx.Done():
			return 0, false, false
		}
	}
	if len(msgs) == 0 {
		return 0, false, true
	}
	select {
	case <-time.After(liveGrace):
	case <-ctx.Done():
		return 0, false, false
	}
	for _, msg := range msgs {
		got++
		if meta, err := msg.Metadata(); err == nil && meta.Sequence.Stream >= bound {
			reached = true
		}
		err := a.receive(msg.Data(), origin{src: protocol.SourceMailbox, progress: func() { _ = msg.InProgress() }})
		if err != nil {
			a.n.log.Warn("mailbox: answer not sent; left for redelivery", "agent", a.id, "err", err)
			continue
		}
		if err := msg.Ack(); err != nil {
			a.n.log.Warn("mailbox: ack", "agent", a.id, "err", err)
		}
	}
	return got, reached, true
}
