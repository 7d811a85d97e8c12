package rooms

import "context"

// coreEndpoints are the room verbs: provision, reclaim, replay, status,
// mine, cursor, usage, dossier. (Owned by the rooms-core work.)
func (w *Worker) coreEndpoints() []endpoint { return nil }

// startIngest subscribes the room traffic the record keeps.
func (w *Worker) startIngest(ctx context.Context) error { return nil }
