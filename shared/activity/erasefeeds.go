package activity

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/feeds"
	"agentmesh.dev/mesh/shared/protocol"
)

// eraseFeeds removes what the feeds keep of key's feeds: its history in
// MESH_FEED (every publish on mesh.feed.<key>.*, kept up to 7 days) and
// its latest envelopes in KV mesh_feeds (keys <key>.<topic>). Both go by
// a purge filtered on the key's subjects, which leaves no marker naming
// the key. The feeds worker owns both; the services connection may purge
// them, and a purge is idempotent, so erasing here keeps one call
// (mesh.internal.guest.erase) for guest eviction and account closure. A
// stream not made yet (no feeds worker ran) holds nothing to erase.
func (w *Worker) eraseFeeds(ctx context.Context, key string) error {
	for _, p := range []struct{ stream, filter string }{
		{feeds.Stream, protocol.FeedSubject(key, ">")},
		{"KV_" + feeds.Bucket, "$KV." + feeds.Bucket + "." + key + ".>"},
	} {
		st, err := w.svc.JS.Stream(ctx, p.stream)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("stream %s: %w", p.stream, err)
		}
		if err := st.Purge(ctx, jetstream.WithPurgeSubject(p.filter)); err != nil {
			return fmt.Errorf("stream %s: purge %s: %w", p.stream, p.filter, err)
		}
	}
	return nil
}
