package rooms

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// DossierFormat is the dossier's manifest format, and the domain tag its
// signature is made under: the rooms service key signs DossierFormat, a
// line feed, and the canonical JSON of the manifest without sig.
const DossierFormat = "agentmesh-room-dossier-v1"

// Dossier is a room's signed record (upstream-notes §7 RoomDossier): the
// manifest, signed by the rooms service, commits to the record entries and
// the files by their SHA-256, so the whole verifies offline
// (VerifyDossier). Files that are outputs carry their bytes; the others
// are named by digest only.
type Dossier struct {
	Manifest DossierManifest `json:"manifest"`
	Record   []DossierEntry  `json:"record"`
	Files    []DossierFile   `json:"files"`
}

// DossierManifest is the signed part of a dossier.
type DossierManifest struct {
	Format    string  `json:"format"`
	RoomID    string  `json:"room_id"`
	RoomName  string  `json:"room_name"`
	Creator   string  `json:"creator"`
	Operator  string  `json:"operator"`
	CreatedAt string  `json:"created_at"`
	ClosedAt  *string `json:"closed_at"` // null while the room is open
	// Why is "export" (an open room's dossier), "reclaimed" or "expired".
	Why string `json:"why"`
	// Capture is where the entries come from: the room's record.
	Capture string `json:"capture"`
	Entries int    `json:"entries"`
	// EntriesSHA256 is the lower-case hex SHA-256 of the canonical JSON of
	// the record array.
	EntriesSHA256 string `json:"entries_sha256"`
	Files         int    `json:"files"`
	Outputs       int    `json:"outputs"`
	// FilesSHA256 is the lower-case hex SHA-256 of the canonical JSON of
	// the files array without any data_b64 member (the bytes are held to
	// their digest instead).
	FilesSHA256 string `json:"files_sha256"`
	SignerPub   string `json:"signer_pub"`
	Sig         string `json:"sig"`
}

// DossierEntry is one recorded room message.
type DossierEntry struct {
	Seq  uint64 `json:"seq"`
	TS   string `json:"ts"`
	From string `json:"from"`
	Type string `json:"type"`
	// Body is a say's body, and the rest of the payload of the other
	// messages (expel: severity and note; phase; close; board events).
	Body     json.RawMessage `json:"body,omitempty"`
	Member   string          `json:"member,omitempty"`
	Artifact json.RawMessage `json:"artifact,omitempty"`
}

// DossierFile is a drive file, with its bytes (standard base64) when it is
// an output.
type DossierFile struct {
	DriveFile
	DataB64 string `json:"data_b64,omitempty"`
}

// dossier answers mesh.rooms.dossier {descriptor}: any member's export of
// the room's dossier.
func (w *Worker) dossier(ctx context.Context, r *bus.Request) (any, error) {
	var p roomCall
	_, room, err := w.access(ctx, r, &p)
	if err != nil {
		return nil, err
	}
	return w.makeDossier(ctx, room)
}

// makeDossier reads the room's record and drive index and signs their
// dossier. A dossier too long for one answer drops the outputs' bytes (they
// stay named by digest); one still too long is PAYLOAD_TOO_LARGE.
func (w *Worker) makeDossier(ctx context.Context, room *Room) (*Dossier, error) {
	entries, err := w.dossierEntries(ctx, room.ID)
	if err != nil {
		return nil, err
	}
	files, err := w.dossierFiles(ctx, room.ID)
	if err != nil {
		return nil, err
	}
	why := WhyExport
	var closed *string
	if room.ClosedAt != nil {
		why = room.Why
		c := protocol.FormatTime(*room.ClosedAt)
		closed = &c
	}
	m := DossierManifest{Format: DossierFormat, RoomID: room.ID, RoomName: room.Name, Creator: room.Creator, Operator: room.Operator,
		CreatedAt: protocol.FormatTime(room.CreatedAt), ClosedAt: closed, Why: why, Capture: DurableRecord(room.ID),
		Entries: len(entries), Files: len(files), SignerPub: w.svc.Key.Public()}
	for _, f := range files {
		if f.Role == RoleOutput {
			m.Outputs++
		}
	}
	if m.EntriesSHA256, err = canonicalSHA256(entries); err != nil {
		return nil, fmt.Errorf("rooms: dossier entries: %w", err)
	}
	if m.FilesSHA256, err = canonicalSHA256(filesWithoutData(files)); err != nil {
		return nil, fmt.Errorf("rooms: dossier files: %w", err)
	}
	if m.Sig, err = protocol.SignObject(DossierFormat, m, w.svc.Key, protocol.Base64URL); err != nil {
		return nil, fmt.Errorf("rooms: sign dossier: %w", err)
	}
	d := &Dossier{Manifest: m, Record: entries, Files: files}
	size, err := canonicalSize(d)
	if err != nil {
		return nil, err
	}
	if size > maxAnswerBytes {
		for i := range d.Files {
			d.Files[i].DataB64 = ""
		}
		if size, err = canonicalSize(d); err != nil {
			return nil, err
		}
	}
	if size > maxAnswerBytes {
		return nil, errs.Newf(errs.PayloadTooLarge, "the dossier of room %s is %d bytes, more than one answer carries (%d): read its record page by page with mesh.rooms.replay and its drive with mesh.rooms.status (drive_after); to reclaim the room without it, call reclaim with \"dossier\": false",
			room.ID, size, maxAnswerBytes)
	}
	return d, nil
}

// dossierEntries reads the whole record, one batch read per page.
func (w *Worker) dossierEntries(ctx context.Context, roomID string) ([]DossierEntry, error) {
	entries := []DossierEntry{}
	for from := uint64(1); ; {
		msgs, next, done, err := w.readRecord(ctx, roomID, from, MaxReplayLimit, 8<<20)
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			if e, ok := entryOf(m.Seq, m.Envelope); ok {
				entries = append(entries, e)
			}
		}
		if done || len(msgs) == 0 {
			return entries, nil
		}
		from = next
	}
}

// entryOf is the dossier entry of one recorded envelope.
func entryOf(seq uint64, envelope []byte) (DossierEntry, bool) {
	var env struct {
		TS      string                     `json:"ts"`
		From    string                     `json:"from"`
		Payload map[string]json.RawMessage `json:"payload"`
	}
	if json.Unmarshal(envelope, &env) != nil {
		return DossierEntry{}, false
	}
	e := DossierEntry{Seq: seq, TS: env.TS, From: env.From}
	p := env.Payload
	_ = json.Unmarshal(p["type"], &e.Type)
	delete(p, "type")
	rest := func() json.RawMessage {
		if len(p) == 0 {
			return nil
		}
		b, _ := json.Marshal(p)
		return b
	}
	switch e.Type {
	case MsgSay:
		e.Body = p["body"]
	case MsgJoin, MsgLeave:
		_ = json.Unmarshal(p["member"], &e.Member)
	case MsgExpel:
		_ = json.Unmarshal(p["member"], &e.Member)
		delete(p, "member")
		e.Body = rest()
	case MsgArtifact:
		e.Artifact = rest()
	default:
		e.Body = rest()
	}
	return e, true
}

// dossierFiles reads the drive index and the bytes of its outputs, in one
// batch read each.
func (w *Worker) dossierFiles(ctx context.Context, roomID string) ([]DossierFile, error) {
	index, err := w.kvValues(ctx, DriveKey(roomID, "*"))
	if err != nil {
		return nil, err
	}
	files := []DossierFile{}
	var outputs []string
	for _, e := range index {
		var f DriveFile
		if json.Unmarshal(e.Value, &f) != nil {
			continue
		}
		files = append(files, DossierFile{DriveFile: f})
		if hexDigest(f.Digest) != "" && f.Role == RoleOutput && f.External == nil {
			outputs = append(outputs, DriveSubject(roomID, hexDigest(f.Digest)))
		}
	}
	slices.SortFunc(files, func(a, b DossierFile) int {
		return cmp.Or(strings.Compare(a.AttachedAt, b.AttachedAt), strings.Compare(a.Name, b.Name), strings.Compare(a.Digest, b.Digest))
	})
	data := map[string][]byte{}
	for start := 0; start < len(outputs); start += maxMultiLast {
		msgs, err := w.lastMsgs(ctx, DriveStream, outputs[start:min(start+maxMultiLast, len(outputs))])
		if err != nil {
			return nil, fmt.Errorf("rooms: read drive outputs: %w", err)
		}
		for _, m := range msgs {
			data[m.Subject] = m.Data
		}
	}
	for i, f := range files {
		if b, ok := data[DriveSubject(roomID, hexDigest(f.Digest))]; ok && f.Role == RoleOutput && f.External == nil && digestOf(b) == f.Digest {
			files[i].DataB64 = base64.StdEncoding.EncodeToString(b)
		}
	}
	return files, nil
}

// hexDigest is the hex part of a "sha256:<hex>" digest ("" for another
// form).
func hexDigest(d string) string {
	h, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(h) != 64 || strings.Trim(h, "0123456789abcdef") != "" {
		return ""
	}
	return h
}

// digestOf is the "sha256:<hex>" digest of b.
func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func filesWithoutData(files []DossierFile) []DriveFile {
	out := make([]DriveFile, len(files))
	for i, f := range files {
		out[i] = f.DriveFile
	}
	return out
}

// canonicalSHA256 is the lower-case hex SHA-256 of v's canonical JSON.
func canonicalSHA256(v any) (string, error) {
	b, err := protocol.Canonical(v)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

func canonicalSize(v any) (int, error) {
	b, err := protocol.Canonical(v)
	if err != nil {
		return 0, fmt.Errorf("rooms: dossier: %w", err)
	}
	return len(b), nil
}

// VerifyDossier checks a dossier offline: the manifest's signature by its
// signer_pub (under DossierFormat), the entry and file counts, the SHA-256
// of the record and of the files, and each carried file's bytes against
// its digest. It does not say whose key signer_pub is: the caller compares
// it with the rooms service key it trusts (GET /v1/capabilities).
func VerifyDossier(dossier []byte) error {
	var top struct {
		Manifest json.RawMessage `json:"manifest"`
		Record   json.RawMessage `json:"record"`
		Files    json.RawMessage `json:"files"`
	}
	if err := json.Unmarshal(dossier, &top); err != nil {
		return fmt.Errorf("dossier: not a JSON object: %w", err)
	}
	manifest, err := parseAs[map[string]any](top.Manifest, "manifest")
	if err != nil {
		return err
	}
	record, err := parseAs[[]any](top.Record, "record")
	if err != nil {
		return err
	}
	files, err := parseAs[[]any](top.Files, "files")
	if err != nil {
		return err
	}
	if f, _ := manifest["format"].(string); f != DossierFormat {
		return fmt.Errorf("dossier: format is %q, not %s", f, DossierFormat)
	}
	signer, _ := manifest["signer_pub"].(string)
	sig, _ := manifest["sig"].(string)
	if !keys.IsUserPublicKey(signer) || sig == "" {
		return errors.New("dossier: the manifest names no signer_pub or carries no sig")
	}
	if err := protocol.VerifyObject(DossierFormat, manifest, signer, sig, protocol.Base64URL); err != nil {
		return fmt.Errorf("dossier: the manifest's signature does not verify: %w", err)
	}
	if err := checkCount(manifest, "entries", len(record)); err != nil {
		return err
	}
	if err := checkHash(manifest, "entries_sha256", record); err != nil {
		return err
	}
	bare, outputs := make([]any, len(files)), 0
	for i, f := range files {
		m, ok := f.(map[string]any)
		if !ok {
			return fmt.Errorf("dossier: file %d is not an object", i)
		}
		c := make(map[string]any, len(m))
		for k, v := range m {
			if k != "data_b64" {
				c[k] = v
			}
		}
		bare[i] = c
		if m["role"] == RoleOutput {
			outputs++
		}
		if data, has := m["data_b64"]; has {
			s, _ := data.(string)
			b, err := base64.StdEncoding.DecodeString(s)
			if err != nil {
				return fmt.Errorf("dossier: file %d's data_b64 is not base64: %w", i, err)
			}
			if d, _ := m["digest"].(string); digestOf(b) != d {
				return fmt.Errorf("dossier: file %d's bytes are not those of its digest %q", i, d)
			}
		}
	}
	if err := checkCount(manifest, "files", len(files)); err != nil {
		return err
	}
	if err := checkCount(manifest, "outputs", outputs); err != nil {
		return err
	}
	return checkHash(manifest, "files_sha256", bare)
}

func parseAs[T any](raw json.RawMessage, what string) (T, error) {
	var zero T
	if len(raw) == 0 {
		return zero, fmt.Errorf("dossier: no %s", what)
	}
	v, err := protocol.ParseJSON(raw)
	if err != nil {
		return zero, fmt.Errorf("dossier: %s: %w", what, err)
	}
	t, ok := v.(T)
	if !ok {
		return zero, fmt.Errorf("dossier: %s has the wrong shape", what)
	}
	return t, nil
}

func checkCount(manifest map[string]any, member string, n int) error {
	if got, ok := manifest[member].(float64); !ok || got != float64(n) {
		return fmt.Errorf("dossier: the manifest counts %v %s, the dossier has %d", manifest[member], member, n)
	}
	return nil
}

func checkHash(manifest map[string]any, member string, v any) error {
	sum, err := canonicalSHA256(v)
	if err != nil {
		return fmt.Errorf("dossier: %s: %w", member, err)
	}
	if got, _ := manifest[member].(string); got != sum {
		return fmt.Errorf("dossier: %s does not match: the dossier was changed after it was signed", member)
	}
	return nil
}
