package rooms

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"
)

// kvSubjectPrefix is the prefix of the bucket's keys as subjects of its
// stream.
const kvSubjectPrefix = "$KV." + Bucket + "."

// eachLast calls f with the key and current value of every live key of the
// bucket matching filter (a key pattern, wildcards allowed), in one request:
// a direct get of the last message of each matching subject (DESIGN §5).
// A room's drive index and notes are listed this way.
//
// The server answers at most 1,024 subjects at once (deleted keys count);
// past that the listing falls back to a filtered watch, which has no bound.
func (w *Worker) eachLast(ctx context.Context, filter string, f func(key string, v []byte) error) error {
	it, err := jetstreamext.GetLastMsgsFor(ctx, w.js, "KV_"+Bucket, []string{kvSubjectPrefix + filter})
	if err != nil {
		return fmt.Errorf("rooms: list %s: %w", filter, err)
	}
	for msg, err := range it {
		switch {
		case errors.Is(err, jetstreamext.ErrNoMessages):
			return nil
		case errors.Is(err, jetstreamext.ErrBatchUnsupported):
			// The server's "too many results" (and any server without
			// batch gets) arrives as this; nothing was delivered yet.
			return w.eachWatched(ctx, filter, f)
		case err != nil:
			return fmt.Errorf("rooms: list %s: %w", filter, err)
		}
		if msg.Header.Get("KV-Operation") != "" {
			continue // a deleted or purged key
		}
		if err := f(strings.TrimPrefix(msg.Subject, kvSubjectPrefix), msg.Data); err != nil {
			return err
		}
	}
	return nil
}

// eachWatched is eachLast through a filtered watch of the bucket: an
// ordered consumer that delivers the current values and stops.
func (w *Worker) eachWatched(ctx context.Context, filter string, f func(key string, v []byte) error) error {
	watch, err := w.kv.Watch(ctx, filter, jetstream.IgnoreDeletes())
	if err != nil {
		return fmt.Errorf("rooms: watch %s: %w", filter, err)
	}
	defer func() { _ = watch.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-watch.Updates():
			if !ok {
				return fmt.Errorf("rooms: watch %s closed", filter)
			}
			if e == nil {
				return nil
			}
			if err := f(e.Key(), e.Value()); err != nil {
				return err
			}
		}
	}
}

// driveListing is a room's drive index, oldest attach first: the
// drive.artifacts[] of mesh.rooms.status (upstream's RoomFile objects and
// the role). Links are listed with their external location.
func (w *Worker) driveListing(ctx context.Context, roomID string) ([]driveFile, error) {
	files := []driveFile{}
	err := w.eachLast(ctx, DriveKey(roomID, "*"), func(key string, v []byte) error {
		var f driveFile
		if err := json.Unmarshal(v, &f); err != nil {
			return fmt.Errorf("rooms: decode %s: %w", key, err)
		}
		files = append(files, f)
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(files, func(a, b driveFile) int { return strings.Compare(driveFileKey(a), driveFileKey(b)) })
	return files, nil
}
