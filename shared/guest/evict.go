package guest

import (
	"context"
	"fmt"
	"time"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/protocol"
)

// BusEvictor is the Evictor of a control plane with a service connection
// to the bus: the registry removes the guests' registrations
// (mesh.internal.guest.evict) and the activity worker erases their rows
// and counters (mesh.internal.guest.erase). Both are idempotent, so a
// retry of a half-done clearing is safe.
type BusEvictor struct {
	Bus *bus.Caller
	// Timeout bounds each call (10 s when zero).
	Timeout time.Duration
}

// evictBatch stays under both workers' per-request bound.
const evictBatch = 500

// EvictGuests implements Evictor.
func (e *BusEvictor) EvictGuests(ctx context.Context, keys []string) error {
	timeout := e.Timeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	for len(keys) > 0 {
		batch := keys[:min(len(keys), evictBatch)]
		keys = keys[len(batch):]
		for _, subject := range []string{protocol.SubjGuestEvict, protocol.SubjGuestErase} {
			cctx, cancel := context.WithTimeout(ctx, timeout)
			_, err := e.Bus.Call(cctx, subject, protocol.TypeRequest, map[string]any{"keys": batch})
			cancel()
			if err != nil {
				return fmt.Errorf("%s: %w", subject, err)
			}
		}
	}
	return nil
}
