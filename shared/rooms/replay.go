package rooms

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
)

// Replay limits (upstream-notes §7).
const (
	DefaultReplayLimit = 100
	MaxReplayLimit     = 1000
)

// maxAnswerBytes bounds what one answer carries: the transport's message
// cap (1 MiB) less room for the answer's own envelope.
const maxAnswerBytes = 1<<20 - 32<<10

// RecordedMessage is one message of a replay: its position in the record
// (seq, opaque and increasing) and the envelope exactly as recorded, or
// null when it alone is too long for an answer.
type RecordedMessage struct {
	Seq      uint64          `json:"seq"`
	Envelope json.RawMessage `json:"envelope"`
}

// replay answers mesh.rooms.replay {descriptor, from_seq?, limit?} with
// {messages, next_seq, done}: up to limit messages of the record from
// from_seq on, in one batch read of the room's record subject. next_seq is
// where the next page starts; done says nothing more is recorded yet.
func (w *Worker) replay(ctx context.Context, r *bus.Request) (any, error) {
	var p struct {
		roomCall
		FromSeq *int64 `json:"from_seq"`
		Limit   *int   `json:"limit"`
	}
	_, room, err := w.access(ctx, r, &p)
	if err != nil {
		return nil, err
	}
	from, limit := uint64(1), DefaultReplayLimit
	if p.FromSeq != nil {
		if *p.FromSeq < 1 {
			return nil, errs.New(errs.InputInvalid, "from_seq must be 1 or more: a seq of an earlier replay, or 1 for the start")
		}
		from = uint64(*p.FromSeq)
	}
	if p.Limit != nil {
		if *p.Limit < 1 {
			return nil, errs.Newf(errs.InputInvalid, "limit must be 1 to %d", MaxReplayLimit)
		}
		limit = min(*p.Limit, MaxReplayLimit)
	}
	msgs, next, done, err := w.readRecord(ctx, room.ID, from, limit, maxAnswerBytes)
	if err != nil {
		return nil, err
	}
	return map[string]any{"messages": msgs, "next_seq": next, "done": done}, nil
}

// readRecord reads up to limit messages of a room's record from seq from
// on, at most budget bytes of them, in one request. It returns the
// messages, the seq to read from next and whether the record had nothing
// more when it was read.
func (w *Worker) readRecord(ctx context.Context, roomID string, from uint64, limit, budget int) ([]RecordedMessage, uint64, bool, error) {
	it, err := jetstreamext.GetBatch(ctx, w.js, RecordStream, limit, jetstreamext.GetBatchSeq(from),
		jetstreamext.GetBatchSubject(RecordSubject(roomID)), jetstreamext.GetBatchMaxBytes(budget))
	if err != nil {
		return nil, 0, false, fmt.Errorf("rooms: replay %s: %w", roomID, err)
	}
	msgs := []RecordedMessage{}
	next, done, size := from, true, 0
	for m, err := range it {
		if errors.Is(err, jetstreamext.ErrNoMessages) {
			break
		}
		if err != nil {
			return nil, 0, false, fmt.Errorf("rooms: replay %s: %w", roomID, err)
		}
		if size += len(m.Data) + 32; size > budget && len(msgs) > 0 {
			// The server stops after the message that crosses its byte
			// budget; this page ends before it.
			done = false
			break
		}
		env := json.RawMessage(m.Data)
		if len(m.Data) > budget {
			env = json.RawMessage("null")
		}
		msgs = append(msgs, RecordedMessage{Seq: m.Sequence, Envelope: env})
		next = m.Sequence + 1
		done = pending(m) == 0
	}
	return msgs, next, done, nil
}

// pending is the batch read's count of messages after m (-1 when absent).
func pending(m *jetstream.RawStreamMsg) int64 {
	n, err := strconv.ParseInt(m.Header.Get("Nats-Num-Pending"), 10, 64)
	if err != nil {
		return -1
	}
	return n
}
