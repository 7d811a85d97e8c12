package rooms

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// driveEndpoints are the drive's verbs: attach, fetch, note, notes.
func (w *Worker) driveEndpoints() []endpoint {
	return []endpoint{
		{"attach", protocol.RoomVerbSubject("attach"), w.attach},
		{"fetch", protocol.RoomVerbSubject("fetch"), w.fetch},
		{"note", protocol.RoomVerbSubject("note"), w.note},
		{"notes", protocol.RoomVerbSubject("notes"), w.notes},
	}
}

// attach answers mesh.rooms.attach: puts a file on the room's drive (the
// inline form) or records a link to one the room does not hold (the link
// form), and answers {ref, digest, size, media_type, external?}.
//
// The same bytes attached twice to one room are one file: the second attach
// answers the first's entry and counts nothing.
//
// The order of the writes (docs/rooms-drive.md): a new entry is counted
// first (one of the room's Limits.DriveFiles entries, and
// DriveEntryOverhead bytes in the room and the operator's quota), then the
// file's bytes in the room and the quota (the operator's is where 100 MB
// refuses), then the bytes are stored, then the index entry is written. So
// an entry on the drive is always counted, and no crash lets an operator
// past the limit; a crash between the counts and the index leaves at most
// one entry counted with no entry, which the room's reclaim or expiry
// gives back with the rest of its drive. The bytes are published only onto
// an empty subject: whoever stores them keeps the count, every other attach
// of the same bytes gives its count back, so a crash after the bytes
// (counted, not yet indexed) is healed by the retry.
func (w *Worker) attach(ctx context.Context, r *bus.Request) (any, error) {
	a, err := parseAttach(r.Env.Payload, w.limits.FileBytes)
	if err != nil {
		return nil, err
	}
	_, room, err := w.gate.Access(ctx, a.Descriptor, r.Env.From)
	if err != nil {
		return nil, err
	}
	if room.Operator == "" {
		return nil, fmt.Errorf("rooms: room %s has no operator to count its drive against", room.ID)
	}
	f := driveFile{Ref: driveRef(room.ID, a.DigestHex), Name: a.Name, Version: a.Version, Digest: a.Digest,
		MediaType: a.MediaType, Size: a.Size, AttachedBy: r.Env.From, AttachedAt: protocol.FormatTime(w.now()),
		Origin: a.Origin, Role: a.Role}
	cur, found, err := w.driveEntry(ctx, room.ID, a.DigestHex)
	if err != nil {
		return nil, err
	}
	// The digest's entry is answered as it is, unless it is a link and
	// this attach brings the bytes, which replace it.
	if found && (a.external() || cur.External == nil) {
		return attachReply(cur), nil
	}
	counted := false
	if !found {
		if counted, err = w.countEntry(ctx, room, a.DigestHex); err != nil {
			return nil, err
		}
	}
	if a.external() {
		f.External = &a.Location
	} else if _, err := w.storeCounted(ctx, room, a); err != nil {
		if counted {
			w.giveBackEntry(room)
		}
		return nil, err
	}
	got, created, err := w.index(ctx, room.ID, a.DigestHex, f, !a.external())
	if counted && (err != nil || !created) {
		// Another attach of the digest indexed it first (and counted its
		// own entry), or the index was not written: a retry counts again.
		w.giveBackEntry(room)
	}
	if err != nil {
		if !a.external() {
			// Counted and stored: a retry of the same bytes indexes it
			// without counting them again.
			w.svc.Log.Warn("drive: bytes stored but not indexed", "room", room.ID, "digest", a.Digest, "err", err)
		}
		return nil, err
	}
	return attachReply(got), nil
}

// countEntry counts a new entry of the room's drive: one of its
// Limits.DriveFiles entries (QUOTA_EXCEEDED past it), and
// DriveEntryOverhead bytes in the room and the operator's quota
// (QUOTA_EXCEEDED past the operator's limit). It reports whether it
// counted: over the operator's limit with the digest's bytes stored
// already (an attach that counted them and its entry, then crashed before
// indexing, or is indexing now) it counts nothing and lets the attach
// index them.
func (w *Worker) countEntry(ctx context.Context, room *Room, digestHex string) (bool, error) {
	if err := w.countRoomDrive(ctx, room.ID, 1, DriveEntryOverhead); err != nil {
		return false, err
	}
	if err := w.countQuota(ctx, room.Operator, DriveEntryOverhead); err != nil {
		w.giveBackEntry(&Room{ID: room.ID}) // the room's count only
		if errs.As(err).Code != errs.QuotaExceeded {
			return false, err
		}
		if _, found, gerr := w.driveBytes(ctx, room.ID, digestHex); gerr != nil || !found {
			return false, err
		}
		return false, nil
	}
	return true, nil
}

// giveBackEntry returns countEntry's counts: the room's, and the quota's
// when room names its operator. It runs to its end whatever happened to
// the request's context.
func (w *Worker) giveBackEntry(room *Room) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if room.Operator != "" {
		if err := w.countQuota(ctx, room.Operator, -DriveEntryOverhead); err != nil {
			w.svc.Log.Error("drive: give back an entry's quota", "room", room.ID, "err", err)
		}
	}
	if err := w.countRoomDrive(ctx, room.ID, -1, -DriveEntryOverhead); err != nil && errs.As(err).Code != errs.NotFound {
		w.svc.Log.Error("drive: give back an entry's room count", "room", room.ID, "err", err)
	}
}

// storeCounted counts the file's bytes in the room and the operator's
// quota, then stores them. It reports whether this call stored them (and so
// keeps the count); when the bytes were already stored by another attach,
// the count is given back and the file is indexed all the same.
func (w *Worker) storeCounted(ctx context.Context, room *Room, a *attachRequest) (stored bool, err error) {
	if room.Operator == "" {
		return false, fmt.Errorf("rooms: room %s has no operator to count its drive against", room.ID)
	}
	if err := w.countRoomDrive(ctx, room.ID, 0, a.Size); err != nil {
		return false, err
	}
	if err := w.countQuota(ctx, room.Operator, a.Size); err != nil {
		w.giveBack(room, a, true, false)
		if errs.As(err).Code != errs.QuotaExceeded {
			return false, err
		}
		// Over the limit, unless these bytes are stored already (counted
		// by the attach that stored them, which crashed before indexing,
		// or is indexing now).
		if _, found, gerr := w.driveBytes(ctx, room.ID, a.DigestHex); gerr != nil || !found {
			return false, err
		}
		return false, nil
	}
	msg := nats.NewMsg(DriveSubject(room.ID, a.DigestHex))
	msg.Data = a.Data
	_, err = w.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(0))
	switch {
	case err == nil:
		return true, nil
	case bus.IsConflict(err):
		// Stored already, and counted by whoever stored them.
		w.giveBack(room, a, true, true)
		return false, nil
	default:
		w.giveBack(room, a, true, true)
		return false, fmt.Errorf("rooms: store drive file %s of room %s: %w", a.Digest, room.ID, err)
	}
}

// countRoomDrive adds files entries and n bytes to the room's drive
// counts, refusing an entry past Limits.DriveFiles (QUOTA_EXCEEDED). A room
// being removed takes no more (NOT_FOUND: its drive is purged, or about to
// be); counts given back (negative) are taken off all the same, since the
// removal gives back to the quota what the room counts when it ends.
func (w *Worker) countRoomDrive(ctx context.Context, roomID string, files int, n int64) error {
	now := w.now()
	limit := w.limits.DriveFiles
	_, _, err := bus.CAS(ctx, w.kv, RoomKey(roomID), func(cur *Room, exists bool) (*Room, error) {
		switch {
		case !exists || ((n > 0 || files > 0) && cur.ClosedAt != nil):
			return nil, errs.Newf(errs.NotFound, "room %s is not provisioned on this mesh (or was reclaimed or expired)", roomID)
		case files > 0 && cur.DriveFiles+files > limit:
			return nil, errs.Newf(errs.QuotaExceeded,
				"room %s's drive holds %d entries (files and links), its limit of %d: reclaim the room and start another, or keep further files in mesh.artifacts and name them in a message",
				roomID, cur.DriveFiles, limit).WithDetails(map[string]any{"limit": "drive_files", "max": limit})
		}
		cur.DriveFiles = max(cur.DriveFiles+files, 0)
		cur.DriveBytes = max(cur.DriveBytes+n, 0)
		if n > 0 {
			cur.LastActive = now
		}
		return cur, nil
	})
	return err
}

// countQuota adds n bytes to the operator's drive count, refusing with
// QUOTA_EXCEEDED past the limit. A negative n gives bytes back (floor 0).
func (w *Worker) countQuota(ctx context.Context, operator string, n int64) error {
	limit := w.limits.DriveBytesPerOperator
	_, _, err := bus.CAS(ctx, w.kv, QuotaKey(operator), func(cur *Quota, exists bool) (*Quota, error) {
		var q Quota
		if exists {
			q = *cur
		}
		if n > 0 && q.DriveBytes+n > limit {
			return nil, errs.Newf(errs.QuotaExceeded,
				"the drives of %s's rooms hold %d of %d bytes; this %d-byte entry does not fit: reclaim a room the operator no longer needs, or keep the file in mesh.artifacts and attach a link",
				operator, q.DriveBytes, limit, n)
		}
		q.DriveBytes = max(q.DriveBytes+n, 0)
		return &q, nil
	})
	return err
}

// giveBack returns an attach's byte counts (the room's, and the quota's
// when quota is set). It runs to its end whatever happened to the
// request's context: a count left behind is a count with no file.
func (w *Worker) giveBack(room *Room, a *attachRequest, roomCounted, quotaCounted bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if quotaCounted {
		if err := w.countQuota(ctx, room.Operator, -a.Size); err != nil {
			w.svc.Log.Error("drive: give back quota", "room", room.ID, "digest", a.Digest, "err", err)
		}
	}
	if roomCounted {
		if err := w.countRoomDrive(ctx, room.ID, 0, -a.Size); err != nil && errs.As(err).Code != errs.NotFound {
			w.svc.Log.Error("drive: give back room count", "room", room.ID, "digest", a.Digest, "err", err)
		}
	}
}

// index writes f as the room's entry for its digest, unless one is there:
// a link entry is replaced by the file itself when upgrade (the bytes are
// better than a claim about them); otherwise the entry there is kept and
// answered. It returns the entry the drive now holds, and whether this
// call created it (an entry where there was none).
func (w *Worker) index(ctx context.Context, roomID, digestHex string, f driveFile, upgrade bool) (driveFile, bool, error) {
	created := false
	next, _, err := bus.CAS(ctx, w.kv, DriveKey(roomID, digestHex), func(cur *driveFile, exists bool) (*driveFile, error) {
		created = !exists
		if exists && !(upgrade && cur.External != nil) {
			return nil, bus.ErrNoChange
		}
		return &f, nil
	})
	if err != nil {
		return driveFile{}, false, fmt.Errorf("rooms: index drive file %s of room %s: %w", f.Digest, roomID, err)
	}
	return *next, created, nil
}

// attachReply is attach's answer for entry f.
func attachReply(f driveFile) map[string]any {
	out := map[string]any{"ref": f.Ref, "digest": f.Digest, "size": f.Size, "media_type": f.MediaType}
	if f.External != nil {
		out["external"] = *f.External
	}
	return out
}

// driveEntry reads one drive entry from the bucket's stream leader, so a
// call just after the attach that wrote it (on another copy, through
// another server) finds it.
func (w *Worker) driveEntry(ctx context.Context, roomID, digestHex string) (driveFile, bool, error) {
	raw, found, err := bus.LeaderGet(ctx, w.svc.NC, Bucket, DriveKey(roomID, digestHex))
	if err != nil || !found {
		return driveFile{}, false, err
	}
	var f driveFile
	if err := json.Unmarshal(raw, &f); err != nil {
		return driveFile{}, false, fmt.Errorf("rooms: decode %s: %w", DriveKey(roomID, digestHex), err)
	}
	return f, true, nil
}

// driveBytes reads a file's bytes from MESH_DRIVE through the stream's
// leader (a follower may not have the newest message yet).
func (w *Worker) driveBytes(ctx context.Context, roomID, digestHex string) ([]byte, bool, error) {
	req, err := json.Marshal(struct {
		LastBy string `json:"last_by_subj"`
	}{DriveSubject(roomID, digestHex)})
	if err != nil {
		return nil, false, err
	}
	msg, err := w.svc.NC.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+DriveStream, req)
	if err != nil {
		return nil, false, fmt.Errorf("rooms: read drive file %s of room %s: %w", digestHex, roomID, err)
	}
	var resp struct {
		Message *struct {
			Data []byte `json:"data"`
		} `json:"message"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return nil, false, fmt.Errorf("rooms: read drive file %s of room %s: %w", digestHex, roomID, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return nil, false, nil
	case resp.Error != nil:
		return nil, false, fmt.Errorf("rooms: read drive file %s of room %s: %w", digestHex, roomID, resp.Error)
	case resp.Message == nil:
		return nil, false, fmt.Errorf("rooms: read drive file %s of room %s: an answer with no message", digestHex, roomID)
	}
	return resp.Message.Data, true, nil
}

// fetch answers mesh.rooms.fetch {descriptor, ref} with the file and its
// bytes: {ref, name, version, digest, media_type, size, origin?, data_b64}.
func (w *Worker) fetch(ctx context.Context, r *bus.Request) (any, error) {
	var p struct {
		Descriptor json.RawMessage `json:"descriptor"`
		Ref        string          `json:"ref"`
	}
	if err := r.Decode(&p); err != nil {
		return nil, err
	}
	_, room, err := w.gate.Access(ctx, p.Descriptor, r.Env.From)
	if err != nil {
		return nil, err
	}
	refRoom, digestHex, err := parseDriveRef(p.Ref)
	if err != nil {
		return nil, err
	}
	if refRoom != room.ID {
		return nil, errs.Newf(errs.NotFound, "%s is a file of another room, not of room %s", p.Ref, room.ID)
	}
	f, found, err := w.driveEntry(ctx, room.ID, digestHex)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, errs.Newf(errs.NotFound, "room %s's drive has no file %s; mesh.rooms.status lists the files it holds", room.ID, p.Ref)
	}
	if f.External != nil {
		return nil, errs.Newf(errs.NotFound, "room %s holds no bytes for %s: it is a link to %s; fetch it there and check it against %s",
			room.ID, p.Ref, *f.External, f.Digest)
	}
	data, found, err := w.driveBytes(ctx, room.ID, digestHex)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, errs.Newf(errs.ArtifactGone, "the bytes of %s are no longer on room %s's drive", p.Ref, room.ID)
	}
	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != digestHex {
		return nil, fmt.Errorf("rooms: drive file %s of room %s does not match its digest", digestHex, room.ID)
	}
	out := map[string]any{"ref": f.Ref, "name": f.Name, "version": f.Version, "digest": f.Digest,
		"media_type": f.MediaType, "size": f.Size, "data_b64": base64.StdEncoding.EncodeToString(data)}
	if f.Origin != nil {
		out["origin"] = *f.Origin
	}
	return out, nil
}
