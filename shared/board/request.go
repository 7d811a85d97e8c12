package board

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// Verbs of the board (protocol.BoardVerbs), each on
// protocol.BoardVerbSubject(verb).
const (
	VerbPost     = "post"
	VerbList     = "list"
	VerbClaim    = "claim"
	VerbComplete = "complete"
	VerbAbandon  = "abandon"
	VerbWithdraw = "withdraw"
)

// request is a board call's payload, decoded and checked for its verb. The
// descriptor is checked by rooms.Access.
type request struct {
	Descriptor json.RawMessage
	Title      string
	Detail     string
	Offering   string
	// LeaseMS is the lease asked for (post, claim), 0 when none is named;
	// at least MinLease, not yet clamped to the operator's maximum.
	LeaseMS   int64
	ItemID    string
	Note      string
	Artifacts []string
	// After pages a list: only items posted after this item.
	After string
}

// wire is a payload as sent. Members a verb does not take are ignored.
type wire struct {
	Descriptor json.RawMessage `json:"descriptor"`
	Title      *string         `json:"title"`
	Detail     *string         `json:"detail"`
	Offering   *string         `json:"offering"`
	LeaseMS    json.RawMessage `json:"lease_ms"`
	ItemID     *string         `json:"item_id"`
	Note       *string         `json:"note"`
	Artifacts  []string        `json:"artifacts"`
	After      *string         `json:"after"`
}

// itemID is the form of an item id: a UUID in lowercase text (protocol.NewID).
var itemID = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// decodeRequest reads the payload of a call to verb. Anything that does not
// fit is INPUT_INVALID, with a message naming the member and its rule.
func decodeRequest(verb string, payload []byte) (*request, error) {
	var w wire
	if err := json.Unmarshal(payload, &w); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) && typeErr.Field != "" {
			return nil, errs.Newf(errs.InputInvalid, "%s: member %s must be %s", protocol.BoardVerbSubject(verb), typeErr.Field, typeName(typeErr.Field))
		}
		return nil, errs.Newf(errs.InputInvalid, "%s: the payload must be an object carrying the room's descriptor", protocol.BoardVerbSubject(verb))
	}
	r := &request{Descriptor: w.Descriptor}
	var err error
	switch verb {
	case VerbPost:
		if err = r.title(w.Title); err == nil {
			if r.Detail, err = text("detail", w.Detail, MaxDetail); err == nil {
				if err = r.offering(w.Offering); err == nil {
					r.LeaseMS, err = leaseMS(w.LeaseMS)
				}
			}
		}
	case VerbList:
		if w.After != nil {
			r.After, err = id("after", w.After)
		}
	case VerbClaim:
		if r.ItemID, err = id("item_id", w.ItemID); err == nil {
			r.LeaseMS, err = leaseMS(w.LeaseMS)
		}
	case VerbComplete:
		if r.ItemID, err = id("item_id", w.ItemID); err == nil {
			if r.Note, err = text("note", w.Note, MaxNote); err == nil {
				r.Artifacts, err = artifacts(w.Artifacts)
			}
		}
	case VerbAbandon, VerbWithdraw:
		r.ItemID, err = id("item_id", w.ItemID)
	default:
		return nil, fmt.Errorf("board: no verb %q", verb)
	}
	if err != nil {
		return nil, err
	}
	return r, nil
}

func typeName(field string) string {
	switch field {
	case "artifacts":
		return "a list of artifact refs (strings)"
	case "descriptor":
		return "the room's descriptor, an object or its token"
	default:
		return "a string"
	}
}

func (r *request) title(s *string) error {
	switch {
	case s == nil || strings.TrimSpace(*s) == "":
		return errs.New(errs.InputInvalid, "title is required: one line saying what the work is")
	case utf8.RuneCountInString(*s) > MaxTitle:
		return errs.Newf(errs.InputInvalid, "title is %d characters; at most %d (put the rest in detail)", utf8.RuneCountInString(*s), MaxTitle)
	case strings.ContainsFunc(*s, unicode.IsControl):
		return errs.New(errs.InputInvalid, "title must be one line without control characters (put the rest in detail)")
	}
	r.Title = *s
	return nil
}

func (r *request) offering(s *string) error {
	if s == nil {
		return nil
	}
	if !protocol.ValidToken(*s) {
		return errs.New(errs.InputInvalid, "offering must be an offering id: one token of [A-Za-z0-9_-], 1 to 128 characters")
	}
	r.Offering = *s
	return nil
}

// text is an optional free-text member of at most limit characters.
func text(name string, s *string, limit int) (string, error) {
	if s == nil {
		return "", nil
	}
	if n := utf8.RuneCountInString(*s); n > limit {
		return "", errs.Newf(errs.InputInvalid, "%s is %d characters; at most %d", name, n, limit)
	}
	return *s, nil
}

// id is an item id member.
func id(name string, s *string) (string, error) {
	switch {
	case s == nil || *s == "":
		return "", errs.Newf(errs.InputInvalid, "%s is required: the item's item_id, as listed", name)
	case !itemID.MatchString(*s):
		return "", errs.Newf(errs.InputInvalid, "%s %q is not an item id (a UUID, as listed)", name, truncate(*s, 64))
	}
	return *s, nil
}

// leaseMS is an optional lease in whole milliseconds, at least MinLease.
// Its upper clamp is the worker's (Limits.LeaseMax).
func leaseMS(raw json.RawMessage) (int64, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, nil
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		return 0, errs.Newf(errs.InputInvalid, "lease_ms must be a whole number of milliseconds, not %s", truncate(string(raw), 32))
	}
	if n < MinLease.Milliseconds() {
		return 0, errs.Newf(errs.InputInvalid, "lease_ms is %d; a lease is at least %d ms (one minute)", n, MinLease.Milliseconds())
	}
	return n, nil
}

func artifacts(refs []string) ([]string, error) {
	if len(refs) > MaxArtifacts {
		return nil, errs.Newf(errs.InputInvalid, "artifacts names %d refs; at most %d", len(refs), MaxArtifacts)
	}
	for i, ref := range refs {
		if ref == "" || len(ref) > MaxRef || strings.ContainsFunc(ref, unicode.IsControl) {
			return nil, errs.Newf(errs.InputInvalid, "artifacts[%d] must be an artifact ref: 1 to %d bytes, no control characters", i, MaxRef)
		}
	}
	if len(refs) == 0 {
		return nil, nil
	}
	return refs, nil
}

// truncate shortens what is quoted back in a message.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
