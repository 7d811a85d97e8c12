package rooms

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"strings"
	"unicode"
	"unicode/utf8"

	"agentmesh.dev/mesh/shared/errs"
)

// DigestPrefix starts every digest's text form: sha256:<64 lowercase hex>,
// the form artifact refs use mesh-wide (upstream-notes §7, §1.1 artifacts).
const DigestPrefix = "sha256:"

// Bounds of the attach payload's text members. They keep a drive entry
// small (it is listed whole by mesh.rooms.status) without refusing
// anything a person would write.
const (
	maxFileName    = 256
	maxVersion     = 64
	maxMediaType   = 255
	maxOrigin      = 2048
	maxLocation    = 2048
	defaultVersion = "1" // upstream's client default
)

// attachRequest is a decoded mesh.rooms.attach payload: the inline form
// (Data set, Digest computed here) or the link form (Location set, Digest
// the caller's claim).
type attachRequest struct {
	Descriptor json.RawMessage
	Name       string
	Version    string
	MediaType  *string
	Origin     *string
	Role       string
	// Inline form.
	Data []byte
	// Link form.
	Location string
	Size     int64
	// DigestHex is the digest's 64 hex digits; Digest its text form.
	DigestHex, Digest string
}

// external reports whether the request is the link form.
func (a *attachRequest) external() bool { return a.Location != "" }

// attachWire is the payload as sent. Pointers tell absent from empty.
type attachWire struct {
	Descriptor json.RawMessage `json:"descriptor"`
	Name       *string         `json:"name"`
	Version    *string         `json:"version"`
	MediaType  *string         `json:"media_type"`
	Origin     *string         `json:"origin"`
	Role       *string         `json:"role"`
	DataB64    *string         `json:"data_b64"`
	Location   *string         `json:"location"`
	Digest     *string         `json:"digest"`
	Size       *int64          `json:"size"`
}

// parseAttach decodes and checks an attach payload (untrusted input: the
// fuzz target FuzzParseAttach runs it). fileBytes is the largest inline
// file; a larger one is PAYLOAD_TOO_LARGE before its base64 is decoded.
// The descriptor is only carried here: Access verifies it.
func parseAttach(raw []byte, fileBytes int64) (*attachRequest, error) {
	var w attachWire
	if err := json.Unmarshal(raw, &w); err != nil {
		return nil, errs.Wrap(errs.InputInvalid, "attach payload is not a JSON object of the attach shape", err)
	}
	a := &attachRequest{Descriptor: w.Descriptor, Version: defaultVersion}
	var err error
	if a.Name, err = text("name", w.Name, maxFileName, true); err != nil {
		return nil, err
	}
	if w.Version != nil {
		if a.Version, err = text("version", w.Version, maxVersion, true); err != nil {
			return nil, err
		}
	}
	if a.MediaType, err = optText("media_type", w.MediaType, maxMediaType); err != nil {
		return nil, err
	}
	if a.Origin, err = optText("origin", w.Origin, maxOrigin); err != nil {
		return nil, err
	}
	if w.Role != nil {
		switch *w.Role {
		case "", RoleInput, RoleInterim, RoleOutput:
			a.Role = *w.Role
		default:
			return nil, errs.Newf(errs.InputInvalid, "role %q is not input, interim or output", truncate(*w.Role, 32))
		}
	}
	switch {
	case w.DataB64 != nil && w.Location != nil:
		return nil, errs.New(errs.InputInvalid, "give data_b64 (the file) or location and digest (a link), not both")
	case w.DataB64 != nil:
		if w.Digest != nil || w.Size != nil {
			return nil, errs.New(errs.InputInvalid, "digest and size belong to the link form; with data_b64 the drive computes them")
		}
		// Refuse by the encoded length first, so an oversized file is
		// never decoded.
		if n := b64Len(*w.DataB64); n > fileBytes {
			return nil, tooLarge(n, fileBytes)
		}
		data, err := base64.StdEncoding.DecodeString(*w.DataB64)
		if err != nil {
			return nil, errs.Wrap(errs.InputInvalid, "data_b64 is not standard base64 (RFC 4648 §4, padded)", err)
		}
		if int64(len(data)) > fileBytes {
			return nil, tooLarge(int64(len(data)), fileBytes)
		}
		sum := sha256.Sum256(data)
		a.Data, a.DigestHex = data, hex.EncodeToString(sum[:])
		a.Digest = DigestPrefix + a.DigestHex
		a.Size = int64(len(data))
	case w.Location != nil:
		if a.Location, err = text("location", w.Location, maxLocation, true); err != nil {
			return nil, err
		}
		if w.Digest == nil {
			return nil, errs.New(errs.InputInvalid, "a link needs the digest of the bytes at its location (sha256:<64 hex>): a pointer without one says nothing about what a reader will get")
		}
		if a.DigestHex, err = parseDigest(*w.Digest); err != nil {
			return nil, err
		}
		a.Digest = DigestPrefix + a.DigestHex
		if w.Size != nil {
			if *w.Size < 0 {
				return nil, errs.New(errs.InputInvalid, "size must not be negative")
			}
			a.Size = *w.Size
		}
	default:
		return nil, errs.New(errs.InputInvalid, "attach needs data_b64 (the file, standard base64) or location and digest (a link to a file the room does not hold)")
	}
	return a, nil
}

// b64Len is the length of the bytes a padded standard base64 text
// decodes to, should it decode (the decoder skips line breaks).
func b64Len(s string) int64 {
	n := int64(len(s)-strings.Count(s, "\n")-strings.Count(s, "\r")) / 4 * 3
	if strings.HasSuffix(s, "==") {
		return n - 2
	}
	if strings.HasSuffix(s, "=") {
		return n - 1
	}
	return n
}

// tooLarge is the refusal of an inline file over the drive's limit.
func tooLarge(n, limit int64) error {
	return errs.Newf(errs.PayloadTooLarge,
		"the file is %d bytes; a room's drive holds files of at most %d bytes (%d KB): store a larger file with mesh.artifacts (put.begin, put, put.commit) and attach it by link (location and digest)",
		n, limit, limit>>10)
}

// parseDigest reads a digest's text form, sha256:<64 hex> (hex of either
// case), and returns its 64 lowercase hex digits.
func parseDigest(s string) (string, error) {
	h, ok := strings.CutPrefix(s, DigestPrefix)
	if !ok || len(h) != 64 {
		return "", errs.New(errs.InputInvalid, "digest must be sha256:<64 hex digits>")
	}
	h = strings.ToLower(h)
	if _, err := hex.DecodeString(h); err != nil {
		return "", errs.New(errs.InputInvalid, "digest must be sha256:<64 hex digits>")
	}
	return h, nil
}

// text checks a text member: present when required, at most max runes, no
// control characters. Absent and not required is "".
func text(name string, v *string, max int, required bool) (string, error) {
	if v == nil || *v == "" {
		if required {
			return "", errs.Newf(errs.InputInvalid, "%s is required", name)
		}
		return "", nil
	}
	s := *v
	if !utf8.ValidString(s) {
		return "", errs.Newf(errs.InputInvalid, "%s is not valid UTF-8", name)
	}
	if n := utf8.RuneCountInString(s); n > max {
		return "", errs.Newf(errs.InputInvalid, "%s is %d characters; at most %d", name, n, max)
	}
	if strings.IndexFunc(s, unicode.IsControl) >= 0 {
		return "", errs.Newf(errs.InputInvalid, "%s must not contain control characters", name)
	}
	return s, nil
}

// optText is text for a member whose absence is null on the wire.
func optText(name string, v *string, max int) (*string, error) {
	s, err := text(name, v, max, false)
	if err != nil || s == "" {
		return nil, err
	}
	return &s, nil
}

// driveRefPrefix starts a drive file's ref: mesh:rooms:<room_id>/drive/<hex>.
// The ref names the room and the bytes' digest, so the same bytes attached
// twice to one room have one ref (and are one file).
func driveRef(roomID, digestHex string) string {
	return DurableRecord(roomID) + "/drive/" + digestHex
}

// parseDriveRef reads a drive ref back into its room and digest hex.
func parseDriveRef(ref string) (roomID, digestHex string, err error) {
	rest, ok := strings.CutPrefix(ref, "mesh:rooms:")
	if ok {
		roomID, digestHex, ok = strings.Cut(rest, "/drive/")
	}
	if !ok || roomID == "" {
		return "", "", errs.New(errs.InputInvalid, "ref must be a drive ref: mesh:rooms:<room_id>/drive/<64 hex>, as attach returned it")
	}
	if digestHex, err = parseDigest(DigestPrefix + digestHex); err != nil {
		return "", "", errs.New(errs.InputInvalid, "ref must be a drive ref: mesh:rooms:<room_id>/drive/<64 hex>, as attach returned it")
	}
	return roomID, digestHex, nil
}
