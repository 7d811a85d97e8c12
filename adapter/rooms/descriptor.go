// Package rooms is the agent runtime's rooms and work-board client (spec
// §2.8, §3.5, §3.6, §4.3; upstream-notes §7, §8): it builds and signs room
// descriptors, provisions durable rooms, invites other agents (a pairwise
// rooms.invite request), posts room messages (join, say, artifact, leave)
// as signed emits, replays the record, puts files on the drive and notes
// them, exports and verifies the signed dossier, keeps the acl grade's
// second connection on a short-lived room credential, and calls the work
// board. The rooms an agent holds are remembered in the adapter's state
// directory (Store).
//
// It takes the node's connection and the agent key: every call is a signed
// request envelope from the agent, every room message a signed emit.
package rooms

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	srooms "agentmesh.dev/mesh/shared/rooms"
)

// Grades, re-exported for callers that do not import the service package.
const (
	GradeCapability = srooms.GradeCapability
	GradeACL        = srooms.GradeACL
	GradeSealed     = srooms.GradeSealed
)

// DefaultChannel is the one channel a room gets unless told otherwise;
// the room messages other than say go on a room's first channel.
const DefaultChannel = "main"

// roomIDBytes is the randomness of a room id (upstream-notes §7: base64url
// of 18 random bytes, 24 characters).
const roomIDBytes = 18

// maxNameLen bounds a room's name: it is shown to every member.
const maxNameLen = 200

// Room is a room as this agent holds it: the verified descriptor (Raw, the
// exact signed object) and what the descriptor says.
type Room struct {
	*srooms.Descriptor
}

// Token is the descriptor's token form: base64url (no padding) of its JSON.
func (r Room) Token() string { return base64.RawURLEncoding.EncodeToString(r.Raw) }

// FirstChannel is where room messages other than say go.
func (r Room) FirstChannel() string { return r.Channels[0] }

// HasChannel reports whether the descriptor names channel.
func (r Room) HasChannel(channel string) bool {
	for _, c := range r.Channels {
		if c == channel {
			return true
		}
	}
	return false
}

// ACL reports whether the room is of the acl grade: its traffic rides the
// second connection.
func (r Room) ACL() bool { return r.Privacy == GradeACL }

// NewRoom describes a new room.
type NewRoom struct {
	Name string
	// Privacy is capability (the default) or acl; sealed rooms need a room
	// key this runtime does not manage, and are refused.
	Privacy string
	// Ephemeral rooms are never recorded: no record, drive or board.
	Ephemeral bool
	// Channels default to ["main"].
	Channels []string
}

// NewDescriptor builds and signs a room descriptor with the creator's key
// (upstream-notes §7): {rooms:"v1", room_id, name, channels, record,
// policy:{}, privacy, creator, created_at, sig}.
func NewDescriptor(creator *keys.Agent, spec NewRoom, now time.Time) (Room, error) {
	privacy := spec.Privacy
	if privacy == "" {
		privacy = GradeCapability
	}
	switch privacy {
	case GradeCapability:
	case GradeACL:
		if spec.Ephemeral {
			return Room{}, errs.New(errs.InputInvalid, "an acl room is always durable: drop --ephemeral or choose the capability grade")
		}
	case GradeSealed:
		return Room{}, errs.New(errs.InputInvalid, "sealed rooms need a room key this adapter does not manage; choose capability or acl")
	default:
		return Room{}, errs.Newf(errs.InputInvalid, "privacy %q is not capability or acl", privacy)
	}
	name := strings.TrimSpace(spec.Name)
	if len([]rune(name)) > maxNameLen {
		return Room{}, errs.Newf(errs.InputInvalid, "a room name is at most %d characters", maxNameLen)
	}
	channels := spec.Channels
	if len(channels) == 0 {
		channels = []string{DefaultChannel}
	}
	for _, c := range channels {
		if !protocol.ValidToken(c) {
			return Room{}, errs.Newf(errs.InputInvalid, "channel %q must be one subject token: letters, digits, _ or -", c)
		}
	}
	id, err := NewRoomID()
	if err != nil {
		return Room{}, err
	}
	record := srooms.DurableRecord(id)
	if spec.Ephemeral {
		record = srooms.RecordEphemeral
	}
	d := map[string]any{
		"rooms":      srooms.DescriptorVersion,
		"room_id":    id,
		"channels":   channels,
		"record":     record,
		"policy":     map[string]any{},
		"privacy":    privacy,
		"creator":    creator.Public(),
		"created_at": protocol.FormatTime(now),
	}
	if name != "" {
		d["name"] = name
	}
	sig, err := protocol.SignRoomDescriptor(d, creator)
	if err != nil {
		return Room{}, fmt.Errorf("sign the room descriptor: %w", err)
	}
	d["sig"] = sig
	raw, err := json.Marshal(d)
	if err != nil {
		return Room{}, err
	}
	return ParseRoom(raw)
}

// NewRoomID is base64url of 18 random bytes, never starting with '-': a
// person types the id as a command's argument, and one in 64 ids would
// otherwise read as a flag (mesh-adapter room say -Xb… "hi").
func NewRoomID() (string, error) {
	b := make([]byte, roomIDBytes)
	for {
		if _, err := rand.Read(b); err != nil {
			return "", fmt.Errorf("room id: %w", err)
		}
		if id := base64.RawURLEncoding.EncodeToString(b); id[0] != '-' {
			return id, nil
		}
	}
}

// ParseRoom reads and verifies a descriptor: the JSON object, a JSON
// string holding its token, or the bare token. The signature is checked
// against the descriptor's own creator.
func ParseRoom(raw []byte) (Room, error) {
	s := strings.TrimSpace(string(raw))
	if s != "" && s[0] != '{' && s[0] != '"' {
		// A bare token, as a person pastes it.
		b, err := json.Marshal(s)
		if err != nil {
			return Room{}, err
		}
		raw = b
	}
	d, err := srooms.ParseDescriptor(json.RawMessage(raw))
	if err != nil {
		return Room{}, err
	}
	return Room{Descriptor: d}, nil
}
