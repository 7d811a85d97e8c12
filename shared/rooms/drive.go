package rooms

// driveEndpoints are the drive's verbs: attach, fetch, note, notes.
// (Owned by the drive work.)
func (w *Worker) driveEndpoints() []endpoint { return nil }
