package rooms

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// NoteKind is the kind of note the service writes: a screening note
// (upstream EXT-5 §8.4), the one kind defined.
const NoteKind = "screening/v1"

// Note verdicts: three, closed (a note is read mechanically).
var noteVerdicts = []string{"pass", "flag", "hold"}

// Bounds of a note's text.
const (
	maxNoteReason = 1000
	maxNoteSource = 128
)

// roomNote is one member's note on one drive file, key
// note.<room_id>.<hex digest>.<agent>: a statement about those bytes,
// attributed to the member whose signed call wrote it. Notes sit beside the
// drive; the record is never written.
type roomNote struct {
	Note    string      `json:"note"`
	Digest  string      `json:"digest"`
	Verdict string      `json:"verdict"`
	Reason  string      `json:"reason,omitempty"`
	By      string      `json:"by"`
	At      string      `json:"at"`
	Source  *noteSource `json:"source,omitempty"`
}

// noteSource names who judged, as the writer says: opaque to the mesh.
type noteSource struct {
	ID      string `json:"id,omitempty"`
	Policy  string `json:"policy,omitempty"`
	Version string `json:"version,omitempty"`
}

// note answers mesh.rooms.note {descriptor, digest, verdict, reason?,
// source?} with {noted, digest, note, notes_on_file}. The author is the
// envelope's signer; a by or at in the payload is not read. Noting a file
// again replaces the member's own note: one note per member per file.
func (w *Worker) note(ctx context.Context, r *bus.Request) (any, error) {
	var p struct {
		Descriptor json.RawMessage `json:"descriptor"`
		Digest     string          `json:"digest"`
		Verdict    string          `json:"verdict"`
		Reason     *string         `json:"reason"`
		Source     *struct {
			ID      *string `json:"id"`
			Policy  *string `json:"policy"`
			Version *string `json:"version"`
		} `json:"source"`
	}
	if err := r.Decode(&p); err != nil {
		return nil, err
	}
	_, room, err := w.gate.Access(ctx, p.Descriptor, r.Env.From)
	if err != nil {
		return nil, err
	}
	digestHex, err := parseDigest(p.Digest)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(noteVerdicts, p.Verdict) {
		return nil, errs.New(errs.InputInvalid, "verdict must be pass, flag or hold")
	}
	n := roomNote{Note: NoteKind, Digest: DigestPrefix + digestHex, Verdict: p.Verdict, By: r.Env.From,
		At: protocol.FormatTime(w.now())}
	if n.Reason, err = text("reason", p.Reason, maxNoteReason, false); err != nil {
		return nil, err
	}
	if p.Source != nil {
		var s noteSource
		if s.ID, err = text("source.id", p.Source.ID, maxNoteSource, false); err != nil {
			return nil, err
		}
		if s.Policy, err = text("source.policy", p.Source.Policy, maxNoteSource, false); err != nil {
			return nil, err
		}
		if s.Version, err = text("source.version", p.Source.Version, maxNoteSource, false); err != nil {
			return nil, err
		}
		if s != (noteSource{}) {
			n.Source = &s
		}
	}
	if _, found, err := w.driveEntry(ctx, room.ID, digestHex); err != nil {
		return nil, err
	} else if !found {
		return nil, errs.Newf(errs.NotFound, "room %s's drive has no file %s: a note is on a file the room holds; attach it first", room.ID, n.Digest)
	}
	b, err := json.Marshal(n)
	if err != nil {
		return nil, err
	}
	if _, err := w.kv.Put(ctx, NoteKey(room.ID, digestHex, r.Env.From), b); err != nil {
		return nil, fmt.Errorf("rooms: write note on %s of room %s: %w", n.Digest, room.ID, err)
	}
	onFile, err := w.roomNotes(ctx, room.ID, digestHex)
	if err != nil {
		return nil, err
	}
	// The note just written counts whether or not the listing (a direct
	// get, which a replica may answer before it has the write) shows it.
	count := 1
	for _, o := range onFile {
		if o.By != n.By {
			count++
		}
	}
	return map[string]any{"noted": true, "digest": n.Digest, "note": n, "notes_on_file": count}, nil
}

// notes answers mesh.rooms.notes {descriptor, digest?, after?, limit?} with
// {notes, next?}: the notes on one file, or on every noted file of the
// room, by digest, then oldest first, one page at a time (at most limit,
// MaxDrivePage by default and at most, and pageBytes of them; next names
// where the next page starts). A file nobody noted has none.
func (w *Worker) notes(ctx context.Context, r *bus.Request) (any, error) {
	var p struct {
		Descriptor json.RawMessage `json:"descriptor"`
		Digest     *string         `json:"digest"`
		After      *string         `json:"after"`
		Limit      *int            `json:"limit"`
	}
	if err := r.Decode(&p); err != nil {
		return nil, err
	}
	_, room, err := w.gate.Access(ctx, p.Descriptor, r.Env.From)
	if err != nil {
		return nil, err
	}
	digestHex := "*"
	if p.Digest != nil {
		if digestHex, err = parseDigest(*p.Digest); err != nil {
			return nil, err
		}
	}
	after, limit, err := pageRequest(p.After, p.Limit, "limit", MaxDrivePage, MaxDrivePage)
	if err != nil {
		return nil, err
	}
	list, err := w.roomNotes(ctx, room.ID, digestHex)
	if err != nil {
		return nil, err
	}
	page, next, err := pageOf(list, noteKey, after, limit)
	if err != nil {
		return nil, err
	}
	out := map[string]any{"notes": page}
	if next != "" {
		out["next"] = next
	}
	return out, nil
}

// noteKey orders the notes and is their page cursor: the file's digest,
// when the note was written, its author.
func noteKey(n roomNote) string {
	return strings.TrimPrefix(n.Digest, DigestPrefix) + "/" + n.At + "/" + n.By
}

// roomNotes lists the notes on one file of a room (digestHex "*": on every
// file), by digest, then time, then author.
func (w *Worker) roomNotes(ctx context.Context, roomID, digestHex string) ([]roomNote, error) {
	list := []roomNote{}
	err := w.eachLast(ctx, NoteKey(roomID, digestHex, "*"), func(key string, v []byte) error {
		var n roomNote
		if err := json.Unmarshal(v, &n); err != nil {
			return fmt.Errorf("rooms: decode %s: %w", key, err)
		}
		list = append(list, n)
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(list, func(a, b roomNote) int { return strings.Compare(noteKey(a), noteKey(b)) })
	return list, nil
}
