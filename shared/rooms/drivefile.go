package rooms

// DriveFile is one file of a room's drive: the value of its key
// drive.<room_id>.<hex digest> (the bytes are the message on
// DriveSubject(room_id, hex digest) in MESH_DRIVE, exactly the file). Its
// members are those of upstream-notes §7 drive.artifacts[] and the
// artifact message's role. The drive verbs write it; status, the dossier
// and reclaim read it.
type DriveFile struct {
	Ref     string `json:"ref"`
	Name    string `json:"name"`
	Version string `json:"version"` // upstream's clients send a string; "1" by default
	// Digest is "sha256:" and the 64 lower-case hex digits of the file's
	// SHA-256 (the hex part is the key's last token).
	Digest     string  `json:"digest"`
	MediaType  *string `json:"media_type"`
	Size       int64   `json:"size"`
	AttachedBy string  `json:"attached_by"`
	AttachedAt string  `json:"attached_at"` // RFC 3339, milliseconds, UTC
	Origin     *string `json:"origin"`
	// External is where the bytes are when the room holds none (the link
	// form): the digest is then the attaching member's claim.
	External *string `json:"external"`
	// Role is the file's part in the room's work: input, interim or
	// output (the dossier carries the bytes of outputs).
	Role string `json:"role,omitempty"`
}

// driveFile is the drive verbs' name for DriveFile.
type driveFile = DriveFile

// File roles.
const (
	RoleInput   = "input"
	RoleInterim = "interim"
	RoleOutput  = "output"
)
