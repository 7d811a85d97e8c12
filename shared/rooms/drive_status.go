package rooms

import "context"

// driveStatus is the drive member of mesh.rooms.status: the room's files
// (upstream-notes §7 drive.artifacts[]) and the drive's use. (The drive
// work replaces this file.)
func (w *Worker) driveStatus(ctx context.Context, room *Room) map[string]any {
	return map[string]any{"artifacts": []any{}}
}
