package rooms

import "context"

// driveStatus is the drive member of mesh.rooms.status: the room's files
// (upstream-notes §7 drive.artifacts[], oldest first), the room's drive
// bytes and the limits that apply to them.
func (w *Worker) driveStatus(ctx context.Context, room *Room) (map[string]any, error) {
	files, err := w.driveListing(ctx, room.ID)
	if err != nil {
		return nil, err
	}
	return map[string]any{"artifacts": files, "bytes": room.DriveBytes,
		"file_limit": w.limits.FileBytes, "operator_limit": w.limits.DriveBytesPerOperator}, nil
}
