package mailbox

import "context"

// WarnWhenFull is warnWhenFull, for the tests.
func (w *Worker) WarnWhenFull(ctx context.Context) bool { return w.warnWhenFull(ctx) }
