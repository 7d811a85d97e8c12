package artifacts

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"

	"agentmesh.dev/mesh/shared/errs"
)

// DigestPrefix starts a digest's text form, sha256:<64 lowercase hex>: one
// hash means one thing mesh-wide (the rooms' drive uses it too).
const DigestPrefix = "sha256:"

// DefaultMediaType is the media type of bytes stored without one.
const DefaultMediaType = "application/octet-stream"

// Refs. An artifact's ref is its read capability (whoever holds it may
// fetch), so its id is 18 random bytes; a link is another such id, naming
// the artifact for a while.
const (
	refPrefix  = "mesh:artifacts:"
	linkPrefix = refPrefix + "link:"
)

// idPattern is an object or link id: base64url of 18 random bytes.
var idPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{24}$`)

// Ref is the reference of object id.
func Ref(id string) string { return refPrefix + id }

// LinkRef is the reference of link id.
func LinkRef(id string) string { return linkPrefix + id }

// parseRef reads an artifact ref or a link ref into its id.
func parseRef(ref string) (id string, isLink bool, err error) {
	if id, ok := strings.CutPrefix(ref, linkPrefix); ok && idPattern.MatchString(id) {
		return id, true, nil
	}
	if id, ok := strings.CutPrefix(ref, refPrefix); ok && idPattern.MatchString(id) {
		return id, false, nil
	}
	return "", false, errs.New(errs.InputInvalid, "ref must be an artifact ref as put or put.commit returned it (mesh:artifacts:<id>), or a link from mesh.artifacts.link")
}

// Bounds of text members.
const (
	maxName      = 256
	maxMediaType = 255
)

// putRequest is a decoded mesh.artifacts.put payload: a whole small file
// (Data, with its media type, name and retention), or one part of an upload
// begun with put.begin (ObjectID and Index set).
type putRequest struct {
	Data       []byte
	MediaType  string
	Name       string
	RetainDays int
	// A part of a begun upload.
	ObjectID string
	Index    int
}

// part reports whether the request is a part of a begun upload.
func (p *putRequest) part() bool { return p.ObjectID != "" }

// parsePut decodes mesh.artifacts.put (untrusted input: FuzzParsePut).
// maxData is the most bytes one put carries (Limits.ChunkBytes); more is
// PAYLOAD_TOO_LARGE before the base64 is decoded.
func parsePut(raw []byte, maxData int64) (*putRequest, error) {
	var w struct {
		DataB64    *string `json:"data_b64"`
		MediaType  *string `json:"media_type"`
		Name       *string `json:"name"`
		RetainDays *int    `json:"retain_days"`
		ObjectID   *string `json:"object_id"`
		Index      *int    `json:"index"`
	}
	if err := json.Unmarshal(raw, &w); err != nil {
		return nil, errs.Wrap(errs.InputInvalid, "put payload is not a JSON object of the put shape", err)
	}
	if w.DataB64 == nil {
		return nil, errs.New(errs.InputInvalid, "put needs data_b64: the bytes in standard base64")
	}
	p := &putRequest{}
	if w.ObjectID != nil {
		if !idPattern.MatchString(*w.ObjectID) {
			return nil, errs.New(errs.InputInvalid, "object_id must be the id put.begin returned")
		}
		if w.Index == nil || *w.Index < 0 {
			return nil, errs.New(errs.InputInvalid, "a part of an upload needs its index: 0 for the first chunk_bytes bytes, 1 for the next, and so on")
		}
		if w.MediaType != nil || w.Name != nil || w.RetainDays != nil {
			return nil, errs.New(errs.InputInvalid, "media_type, name and retain_days are put.begin's; a part carries object_id, index and data_b64")
		}
		p.ObjectID, p.Index = *w.ObjectID, *w.Index
	} else if w.Index != nil {
		return nil, errs.New(errs.InputInvalid, "index belongs to a part of an upload: give the object_id put.begin returned")
	}
	if n := b64Len(*w.DataB64); n > maxData {
		if p.part() {
			return nil, errs.Newf(errs.PayloadTooLarge, "a part is at most %d bytes (chunk_bytes); this one is %d", maxData, n)
		}
		return nil, errs.Newf(errs.PayloadTooLarge,
			"put takes files of at most %d bytes in one message; this one is %d: send it in parts with put.begin, put {object_id, index, data_b64} and put.commit", maxData, n)
	}
	data, err := base64.StdEncoding.DecodeString(*w.DataB64)
	if err != nil {
		return nil, errs.Wrap(errs.InputInvalid, "data_b64 is not standard base64 (RFC 4648 §4, padded)", err)
	}
	if int64(len(data)) > maxData {
		return nil, errs.Newf(errs.PayloadTooLarge, "at most %d bytes in one put; this one is %d", maxData, len(data))
	}
	p.Data = data
	if p.part() {
		return p, nil
	}
	if p.MediaType, p.Name, p.RetainDays, err = describe(w.MediaType, w.Name, w.RetainDays); err != nil {
		return nil, err
	}
	return p, nil
}

// beginRequest is a decoded mesh.artifacts.put.begin payload.
type beginRequest struct {
	Size       int64
	DigestHex  string
	MediaType  string
	Name       string
	RetainDays int
}

// parseBegin decodes mesh.artifacts.put.begin (untrusted input:
// FuzzParseBegin). maxSize is the largest artifact.
func parseBegin(raw []byte, maxSize int64) (*beginRequest, error) {
	var w struct {
		Size       *int64  `json:"size"`
		Digest     *string `json:"digest"`
		MediaType  *string `json:"media_type"`
		Name       *string `json:"name"`
		RetainDays *int    `json:"retain_days"`
	}
	if err := json.Unmarshal(raw, &w); err != nil {
		return nil, errs.Wrap(errs.InputInvalid, "put.begin payload is not a JSON object of the put.begin shape", err)
	}
	if w.Size == nil || *w.Size < 1 {
		return nil, errs.New(errs.InputInvalid, "put.begin needs size: the file's length in bytes, at least 1")
	}
	if *w.Size > maxSize {
		return nil, errs.Newf(errs.PayloadTooLarge, "an artifact is at most %d bytes; this one is %d", maxSize, *w.Size)
	}
	if w.Digest == nil {
		return nil, errs.New(errs.InputInvalid, "put.begin needs digest: sha256:<64 hex> of the whole file, which put.commit checks")
	}
	b := &beginRequest{Size: *w.Size}
	var err error
	if b.DigestHex, err = parseDigest(*w.Digest); err != nil {
		return nil, err
	}
	if b.MediaType, b.Name, b.RetainDays, err = describe(w.MediaType, w.Name, w.RetainDays); err != nil {
		return nil, err
	}
	return b, nil
}

// describe checks the members that describe a stored file.
func describe(mediaType, name *string, retainDays *int) (string, string, int, error) {
	mt, err := text("media_type", mediaType, maxMediaType)
	if err != nil {
		return "", "", 0, err
	}
	if mt == "" {
		mt = DefaultMediaType
	}
	n, err := text("name", name, maxName)
	if err != nil {
		return "", "", 0, err
	}
	days := 0
	if retainDays != nil {
		if *retainDays < 0 {
			return "", "", 0, errs.New(errs.InputInvalid, "retain_days must not be negative (omit it for the mesh's default)")
		}
		days = *retainDays
	}
	return mt, n, days, nil
}

// parseDigest reads sha256:<64 hex> into its lowercase hex.
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

// text checks an optional text member: at most max runes, valid UTF-8, no
// control characters.
func text(name string, v *string, max int) (string, error) {
	if v == nil {
		return "", nil
	}
	s := strings.TrimSpace(*v)
	switch {
	case !utf8.ValidString(s):
		return "", errs.Newf(errs.InputInvalid, "%s is not valid UTF-8", name)
	case utf8.RuneCountInString(s) > max:
		return "", errs.Newf(errs.InputInvalid, "%s is longer than %d characters", name, max)
	case strings.IndexFunc(s, unicode.IsControl) >= 0:
		return "", errs.Newf(errs.InputInvalid, "%s must not contain control characters", name)
	}
	return s, nil
}

// b64Len is the length of the bytes a padded standard base64 text decodes
// to, should it decode (the decoder skips line breaks).
func b64Len(s string) int64 {
	n := int64(len(s)-strings.Count(s, "\n")-strings.Count(s, "\r")) / 4 * 3
	switch {
	case strings.HasSuffix(s, "=="):
		return n - 2
	case strings.HasSuffix(s, "="):
		return n - 1
	}
	return n
}
