package rooms

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
)

// recordDedupWindow covers the live freshness window (10 min old, 5 min
// ahead), so a replayed room message is recorded once: the record is
// published with Nats-Msg-Id <from>:<id>.
const recordDedupWindow = 15 * time.Minute

// driveOverhead is room for a drive message's headers beside the file.
const driveOverhead = 4 << 10

// bindStreams creates (or updates) the record and drive streams. Both allow
// direct gets, which the batch reads (jetstreamext) need.
func (w *Worker) bindStreams(ctx context.Context) error {
	for _, cfg := range []jetstream.StreamConfig{
		{
			Name:        RecordStream,
			Description: "durable rooms' records: one subject per room",
			Subjects:    []string{RecordSubject("*")},
			Storage:     jetstream.FileStorage,
			Replicas:    bus.Replicas(w.cfg.Replicas),
			// The per-room message cap is the stream's: a room's 10,001st
			// message is refused by the server, whatever copy appends it.
			MaxMsgsPerSubject:    w.limits.RecordMsgs,
			Discard:              jetstream.DiscardNew,
			DiscardNewPerSubject: true,
			Duplicates:           recordDedupWindow,
			AllowDirect:          true,
		},
		{
			Name:              DriveStream,
			Description:       "durable rooms' drive files: one message per file",
			Subjects:          []string{DriveSubject("*", "*")},
			Storage:           jetstream.FileStorage,
			Replicas:          bus.Replicas(w.cfg.Replicas),
			MaxMsgsPerSubject: 1,
			MaxMsgSize:        int32(w.limits.FileBytes + driveOverhead),
			AllowDirect:       true,
		},
	} {
		if _, err := w.js.CreateOrUpdateStream(ctx, cfg); err != nil {
			return fmt.Errorf("%s: stream %s: %w", Name, cfg.Name, err)
		}
	}
	return nil
}
