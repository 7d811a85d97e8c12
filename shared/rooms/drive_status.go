package rooms

import (
	"context"
	"strings"
)

// driveStatus is the drive member of mesh.rooms.status: one page of the
// room's entries (upstream-notes §7 drive.artifacts[], oldest first, after
// the cursor after, at most limit of them and pageBytes of JSON, with next
// when more follow), the room's entries and drive bytes, and the limits
// that apply to them.
func (w *Worker) driveStatus(ctx context.Context, room *Room, after string, limit int) (map[string]any, error) {
	files, err := w.driveListing(ctx, room.ID)
	if err != nil {
		return nil, err
	}
	page, next, err := pageOf(files, driveFileKey, after, limit)
	if err != nil {
		return nil, err
	}
	out := map[string]any{"artifacts": page, "bytes": room.DriveBytes, "files": room.DriveFiles,
		"max_files": w.limits.DriveFiles, "entry_overhead": DriveEntryOverhead,
		"file_limit": w.limits.FileBytes, "operator_limit": w.limits.DriveBytesPerOperator}
	if next != "" {
		out["next"] = next
	}
	return out, nil
}

// driveFileKey orders the drive's listing and is its page cursor: when
// the entry was attached, then its digest.
func driveFileKey(f driveFile) string {
	return f.AttachedAt + "/" + strings.TrimPrefix(f.Digest, DigestPrefix)
}
