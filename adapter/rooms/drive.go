package rooms

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
	srooms "agentmesh.dev/mesh/shared/rooms"
)

// MaxFile is the largest file a drive takes inline (512 KB): refused here
// before it is sent.
const MaxFile = srooms.DefaultFileBytes

// Artifact roles (the artifact message's role).
var roles = map[string]bool{"": true, "input": true, "interim": true, "output": true}

// Attach describes a file to put on the drive.
type Attach struct {
	Name      string
	Data      []byte
	MediaType string
	// Version is the file's version label (the drive's default, "1",
	// when empty).
	Version string
	// Role is input, interim or output (optional).
	Role string
	// Origin says where the file came from (optional, free text).
	Origin string
}

// Attached is a file on the drive and its artifact message.
type Attached struct {
	RoomID    string `json:"room_id"`
	Ref       string `json:"ref"`
	Name      string `json:"name"`
	Version   string `json:"version"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
	MediaType string `json:"media_type,omitempty"`
	// MessageID is the artifact message posted after the attach.
	MessageID string `json:"message_id"`
}

// Attach puts a file on the room's drive (mesh.rooms.attach with data_b64)
// and posts the artifact message that tells the members.
func (c *Client) Attach(ctx context.Context, ref string, a Attach) (Attached, error) {
	h, r, err := c.room(ref)
	if err != nil {
		return Attached{}, err
	}
	if err := durable(r, "drive"); err != nil {
		return Attached{}, err
	}
	switch {
	case strings.TrimSpace(a.Name) == "":
		return Attached{}, errs.New(errs.InputInvalid, "a file on the drive needs a name")
	case len(a.Data) > MaxFile:
		return Attached{}, errs.Newf(errs.PayloadTooLarge, "the file is %d bytes; a drive file is at most %d bytes (512 KB)", len(a.Data), MaxFile)
	case !roles[a.Role]:
		return Attached{}, errs.Newf(errs.InputInvalid, "role %q is not input, interim or output", a.Role)
	}
	if a.Version == "" {
		a.Version = "1"
	}
	extra := map[string]any{"name": a.Name, "version": a.Version, "data_b64": base64.StdEncoding.EncodeToString(a.Data)}
	if a.Role != "" {
		// The drive keeps the role too: the dossier carries the bytes of
		// outputs.
		extra["role"] = a.Role
	}
	if a.MediaType != "" {
		extra["media_type"] = a.MediaType
	}
	if a.Origin != "" {
		extra["origin"] = a.Origin
	}
	var out struct {
		Ref       string      `json:"ref"`
		Digest    string      `json:"digest"`
		Size      int64       `json:"size"`
		MediaType *string     `json:"media_type"`
		Version   flexVersion `json:"version"`
	}
	if err := c.roomCall(ctx, protocol.RoomVerbSubject("attach"), r, extra, &out); err != nil {
		return Attached{}, err
	}
	if out.Ref == "" || out.Digest == "" {
		return Attached{}, errs.New(errs.InvalidEnvelope, "the rooms service answered the attach without a ref and digest")
	}
	if want := digestHex(a.Data); !sameDigest(out.Digest, want) {
		return Attached{}, errs.Newf(errs.IdentityMismatch, "the drive reports digest %s for the file, but its bytes hash to sha256:%s", out.Digest, want)
	}
	res := Attached{RoomID: r.RoomID, Ref: out.Ref, Name: a.Name, Version: a.Version, Digest: out.Digest, Size: out.Size}
	if out.Version != "" {
		res.Version = string(out.Version)
	}
	if out.MediaType != nil {
		res.MediaType = *out.MediaType
	}
	msg := map[string]any{"type": "artifact", "name": res.Name, "version": res.Version, "ref": res.Ref, "digest": res.Digest, "size": res.Size}
	if res.MediaType != "" {
		msg["media_type"] = res.MediaType
	}
	if a.Role != "" {
		msg["role"] = a.Role
	}
	if a.Origin != "" {
		msg["origin"] = a.Origin
	}
	if err := c.ensureJoined(ctx, h, r); err != nil {
		return res, err
	}
	if res.MessageID, err = c.post(ctx, r, r.FirstChannel(), msg); err != nil {
		return res, fmt.Errorf("the file is on the drive (%s), but its artifact message was not posted: %w", res.Ref, err)
	}
	return res, nil
}

// File is a file fetched from the drive.
type File struct {
	Ref       string `json:"ref"`
	Name      string `json:"name"`
	Version   string `json:"version"`
	Digest    string `json:"digest"`
	MediaType string `json:"media_type,omitempty"`
	Size      int64  `json:"size"`
	Origin    string `json:"origin,omitempty"`
	Data      []byte `json:"data"`
}

// flexVersion reads a file's version written as a string or a number.
type flexVersion string

func (v *flexVersion) UnmarshalJSON(b []byte) error {
	var s string
	if json.Unmarshal(b, &s) == nil {
		*v = flexVersion(s)
		return nil
	}
	var n json.Number
	if err := json.Unmarshal(b, &n); err != nil {
		return err
	}
	*v = flexVersion(n.String())
	return nil
}

// DriveRef is the ref of the file with digest (sha256:<hex>, or the bare
// hex) on room's drive, as the drive names its files.
func DriveRef(roomID, digest string) string {
	return "mesh:rooms:" + roomID + "/drive/" + strings.ToLower(strings.TrimPrefix(digest, "sha256:"))
}

// isDigest reports whether s is a SHA-256 digest (sha256:<hex> or hex).
func isDigest(s string) bool {
	h := strings.TrimPrefix(s, "sha256:")
	_, err := hex.DecodeString(h)
	return len(h) == 64 && err == nil
}

// Fetch gets a file from the drive by its ref (or its digest, which names
// the room's file of that digest) and checks its bytes against the digest.
func (c *Client) Fetch(ctx context.Context, ref, fileRef string) (File, error) {
	_, r, err := c.room(ref)
	if err != nil {
		return File{}, err
	}
	if err := durable(r, "drive"); err != nil {
		return File{}, err
	}
	if strings.TrimSpace(fileRef) == "" {
		return File{}, errs.New(errs.InputInvalid, "name the file: its ref (or digest), as `room read` shows it")
	}
	if isDigest(fileRef) {
		fileRef = DriveRef(r.RoomID, fileRef)
	}
	var out struct {
		Ref       string      `json:"ref"`
		Name      string      `json:"name"`
		Version   flexVersion `json:"version"`
		Digest    string      `json:"digest"`
		MediaType *string     `json:"media_type"`
		Size      int64       `json:"size"`
		Origin    string      `json:"origin"`
		DataB64   string      `json:"data_b64"`
	}
	if err := c.roomCall(ctx, protocol.RoomVerbSubject("fetch"), r, map[string]any{"ref": fileRef}, &out); err != nil {
		return File{}, err
	}
	data, err := base64.StdEncoding.DecodeString(out.DataB64)
	if err != nil {
		return File{}, errs.Wrap(errs.InvalidEnvelope, "the drive's answer holds no readable file (data_b64)", err)
	}
	if !sameDigest(out.Digest, digestHex(data)) {
		return File{}, errs.Newf(errs.IdentityMismatch, "the file fetched does not match its digest %s: it was not kept", out.Digest)
	}
	f := File{Ref: out.Ref, Name: out.Name, Version: string(out.Version), Digest: out.Digest, Size: out.Size, Origin: out.Origin, Data: data}
	if out.MediaType != nil {
		f.MediaType = *out.MediaType
	}
	return f, nil
}

func digestHex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// sameDigest compares a digest as the service writes it (sha256:<hex>, or
// the bare hex) with a hex SHA-256.
func sameDigest(got, wantHex string) bool {
	return strings.EqualFold(strings.TrimPrefix(got, "sha256:"), wantHex)
}

// Verdicts of a note.
var verdicts = map[string]bool{"pass": true, "flag": true, "hold": true}

// NoteSource names what produced a note (optional).
type NoteSource struct {
	ID      string `json:"id"`
	Policy  string `json:"policy,omitempty"`
	Version string `json:"version,omitempty"`
}

// Note is one member's note on one drive file.
type Note struct {
	Note    string      `json:"note"`
	Digest  string      `json:"digest"`
	Verdict string      `json:"verdict"`
	Reason  string      `json:"reason,omitempty"`
	By      string      `json:"by"`
	At      string      `json:"at"`
	Source  *NoteSource `json:"source,omitempty"`
}

// Noted is the answer to a note.
type Noted struct {
	Noted       bool   `json:"noted"`
	Digest      string `json:"digest"`
	Note        Note   `json:"note"`
	NotesOnFile int    `json:"notes_on_file"`
}

// Note notes a drive file (mesh.rooms.note): verdict pass, flag or hold.
// The author is this agent's signature; noting the same file again
// replaces this agent's note. Nothing goes into the record.
func (c *Client) Note(ctx context.Context, ref, digest, verdict, reason string, source *NoteSource) (Noted, error) {
	_, r, err := c.room(ref)
	if err != nil {
		return Noted{}, err
	}
	if err := durable(r, "drive"); err != nil {
		return Noted{}, err
	}
	if !verdicts[verdict] {
		return Noted{}, errs.Newf(errs.InputInvalid, "verdict %q is not pass, flag or hold", verdict)
	}
	if digest == "" {
		return Noted{}, errs.New(errs.InputInvalid, "name the file by its digest, as `room attach` or `room read` shows it")
	}
	extra := map[string]any{"digest": digest, "verdict": verdict}
	if reason != "" {
		extra["reason"] = reason
	}
	if source != nil {
		extra["source"] = source
	}
	var out Noted
	err = c.roomCall(ctx, protocol.RoomVerbSubject("note"), r, extra, &out)
	return out, err
}

// Notes reads the notes on one file (digest), or on every noted file:
// every page (the service answers at most 200 notes at once, and names
// where the next page starts in next).
func (c *Client) Notes(ctx context.Context, ref, digest string) ([]Note, error) {
	_, r, err := c.room(ref)
	if err != nil {
		return nil, err
	}
	if err := durable(r, "drive"); err != nil {
		return nil, err
	}
	notes := []Note{}
	after := ""
	for range maxReplayPages {
		extra := map[string]any{}
		if digest != "" {
			extra["digest"] = digest
		}
		if after != "" {
			extra["after"] = after
		}
		var out struct {
			Notes []Note `json:"notes"`
			Next  string `json:"next"`
		}
		if err := c.roomCall(ctx, protocol.RoomVerbSubject("notes"), r, extra, &out); err != nil {
			return nil, err
		}
		notes = append(notes, out.Notes...)
		if out.Next == "" || out.Next == after {
			break
		}
		after = out.Next
	}
	return notes, nil
}
