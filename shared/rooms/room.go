// Package rooms is the durable rooms service (spec §2.8, §3.6, §4.3,
// upstream-notes §7): a room's state in the mesh_rooms bucket, its record
// in the MESH_ROOMS stream, its drive in the MESH_DRIVE stream, and the
// acl grade's short-lived room credentials.
//
// This file is the part other services share: the room record, the keys of
// the mesh_rooms bucket, and Access, the one check every call carrying a
// room descriptor makes (the rooms verbs and the work board alike).
package rooms

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// Bucket is the rooms' one KV bucket (DESIGN §5, the stream budget). Its
// keys are prefixed by concern:
//
//	room.<room_id>                   Room
//	member.<agent>.<room_id>         index of the rooms an agent was admitted to or created (mesh.rooms.mine)
//	cursor.<room_id>.<agent>         an agent's read position
//	note.<room_id>.<digest>.<agent>  one member's note on one drive file
//	drive.<room_id>.<digest>         one drive file's metadata (the bytes are in MESH_DRIVE)
//	cred.<room_id>.<agent>           the user keys of an acl member's live room credentials
//	holder.<room_id>.<agent>         an agent that presented a capability or sealed room's descriptor (Gate)
//	quota.<operator>                 an operator's durable rooms and drive bytes
//	board.<room_id>.<item_id>        one work-board item (package board)
const Bucket = "mesh_rooms"

// BucketConfig is the one configuration of the mesh_rooms bucket for
// replicas (bus.Replicas). Every worker that binds the bucket (rooms, board)
// creates-or-updates it with exactly this, so whichever starts first, the
// others neither fail nor flip its configuration back and forth.
func BucketConfig(replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{Bucket: Bucket,
		Description: "durable rooms: rooms, members, cursors, notes, drive index, room credentials, quotas, board items",
		Replicas:    bus.Replicas(replicas)}
}

// Privacy grades of a room (upstream-notes §7).
const (
	GradeCapability = "capability" // membership is holding the signed descriptor
	GradeSealed     = "sealed"     // bodies and files encrypted to a room key
	GradeACL        = "acl"        // an admit list, traffic on room credentials
)

// DescriptorVersion is the descriptor's rooms member.
const DescriptorVersion = "v1"

// RecordEphemeral is a descriptor's record for a room that is not recorded.
const RecordEphemeral = "ephemeral"

// DurableRecord is the record member of a durable room's descriptor.
func DurableRecord(roomID string) string { return "mesh:rooms:" + roomID }

// Descriptor is a room's signed descriptor (upstream-notes §7). Raw keeps
// the exact object as received, which is what the signature covers and
// what is stored; the typed members are read from it.
type Descriptor struct {
	Rooms          string   `json:"rooms"`
	RoomID         string   `json:"room_id"`
	Name           string   `json:"name,omitempty"`
	Channels       []string `json:"channels"`
	Record         string   `json:"record"`
	Privacy        string   `json:"privacy"`
	KeyFingerprint string   `json:"key_fingerprint,omitempty"`
	Creator        string   `json:"creator"`
	CreatedAt      string   `json:"created_at"`
	Sig            string   `json:"sig"`

	Raw json.RawMessage `json:"-"`
}

// Durable reports whether the descriptor names the mesh's record for its
// room.
func (d *Descriptor) Durable() bool { return d.Record == DurableRecord(d.RoomID) }

// ParseDescriptor reads and verifies the descriptor a call carries: raw is
// the descriptor object, or its token form (base64url of its JSON). The
// signature is checked against the descriptor's own creator every time
// (upstream-notes §7: every call carries it, verified each time).
func ParseDescriptor(raw json.RawMessage) (*Descriptor, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, errs.New(errs.InputInvalid, "descriptor is required: the room's signed descriptor, as an object or its token")
	}
	// The token form is base64 of the object: 4/3 of its length, and its
	// quotes.
	if len(raw) > MaxDescriptorBytes/3*4+8 {
		return nil, errDescriptorTooLong(len(raw))
	}
	var token string
	if json.Unmarshal(raw, &token) == nil {
		b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(token, "="))
		if err != nil {
			return nil, errs.Wrap(errs.InputInvalid, "descriptor token is not base64url", err)
		}
		raw = b
	}
	if len(raw) > MaxDescriptorBytes {
		return nil, errDescriptorTooLong(len(raw))
	}
	var obj map[string]any
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, errs.Wrap(errs.InputInvalid, "descriptor is not a JSON object", err)
	}
	// The signature is checked on obj, whose keys are exact; the typed
	// members below are decoded with encoding/json, whose names match
	// case-insensitively. A key that folds onto a member without being it
	// would make the two read different descriptors (a signed "creator",
	// an unsigned "CREATOR" read as the creator), so it is refused.
	for k := range obj {
		for _, m := range descriptorMembers {
			if k != m && strings.EqualFold(k, m) {
				return nil, errs.Newf(errs.InputInvalid, "descriptor member %q is not spelled %q: member names are exact and lower case", truncate(k, 64), m)
			}
		}
	}
	var d Descriptor
	if err := json.Unmarshal(raw, &d); err != nil {
		return nil, errs.Wrap(errs.InputInvalid, "descriptor does not fit the room descriptor shape", err)
	}
	switch {
	case d.Rooms != DescriptorVersion:
		return nil, errs.Newf(errs.InputInvalid, "descriptor rooms is %q; this service speaks %q", d.Rooms, DescriptorVersion)
	case !protocol.ValidToken(d.RoomID):
		return nil, errs.New(errs.InputInvalid, "descriptor room_id must be one subject token: [A-Za-z0-9_-]{1,128}")
	case len(d.Channels) == 0:
		return nil, errs.New(errs.InputInvalid, "descriptor channels must name at least one channel")
	case !keys.IsUserPublicKey(d.Creator):
		return nil, errs.New(errs.InputInvalid, "descriptor creator must be an agent public key")
	}
	for _, c := range d.Channels {
		if !protocol.ValidToken(c) {
			return nil, errs.Newf(errs.InputInvalid, "descriptor channel %q is not one subject token: [A-Za-z0-9_-]{1,128}", c)
		}
	}
	switch d.Privacy {
	case GradeCapability, GradeSealed, GradeACL:
	default:
		return nil, errs.Newf(errs.InputInvalid, "descriptor privacy %q is not capability, sealed or acl", d.Privacy)
	}
	if d.Record != RecordEphemeral && !d.Durable() {
		return nil, errs.Newf(errs.InputInvalid, "descriptor record must be %q or %q", RecordEphemeral, DurableRecord(d.RoomID))
	}
	if d.Privacy == GradeACL && !d.Durable() {
		return nil, errs.New(errs.InputInvalid, "an acl room is always durable: its record must be "+DurableRecord(d.RoomID))
	}
	if err := protocol.VerifyRoomDescriptor(obj); err != nil {
		return nil, err
	}
	d.Raw = append(json.RawMessage(nil), raw...)
	return &d, nil
}

// MaxDescriptorBytes bounds a descriptor's JSON (its token form is
// 4/3 of it): every call carries it, and mesh.rooms.mine answers the
// descriptors of many rooms at once. Upstream's descriptors (channels,
// name, a playbook of a dozen entries) take a few hundred bytes.
const MaxDescriptorBytes = 16 << 10

// descriptorMembers are the descriptor's members (upstream-notes §7):
// ParseDescriptor refuses any other spelling of them.
var descriptorMembers = []string{"rooms", "room_id", "name", "channels", "playbook", "record", "drive", "policy",
	"privacy", "key_fingerprint", "creator", "created_at", "sig"}

func errDescriptorTooLong(n int) error {
	return errs.Newf(errs.InputInvalid, "the descriptor is %d bytes; a room descriptor is at most %d (%d KiB) as JSON: sign a shorter one",
		n, MaxDescriptorBytes, MaxDescriptorBytes>>10)
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

// Room is the record of one durable room, key room.<room_id>.
type Room struct {
	ID         string          `json:"room_id"`
	Name       string          `json:"name,omitempty"`
	Privacy    string          `json:"privacy"`
	Channels   []string        `json:"channels"`
	Creator    string          `json:"creator"`
	Handle     string          `json:"handle"`   // the creator's handle when provisioned
	Operator   string          `json:"operator"` // the quota's owner: the operator id (account.OperatorID)
	Descriptor json.RawMessage `json:"descriptor"`
	CreatedAt  time.Time       `json:"created_at"`
	// LastActive is the last recorded message or call (idle expiry).
	LastActive time.Time `json:"last_active"`
	// Members are the acl grade's admitted agents (the creator included);
	// empty for other grades, where membership is holding the descriptor.
	Members []string `json:"members,omitempty"`
	// Expelled are agents expelled from the acl room: never admitted again
	// by credential renewal, until the creator admits them again.
	Expelled []string `json:"expelled,omitempty"`
	// RecordMsgs and RecordBytes count the record (10,000 / 8 MB).
	RecordMsgs  int64 `json:"record_msgs"`
	RecordBytes int64 `json:"record_bytes"`
	// DriveBytes counts the room's drive: the bytes of its files and
	// DriveEntryOverhead for each entry (file or link); DriveFiles counts
	// its entries (at most Limits.DriveFiles).
	DriveBytes int64 `json:"drive_bytes"`
	DriveFiles int   `json:"drive_files"`
	// ClosedAt is set when reclaim or idle expiry starts removing the
	// room, and Why says which ("reclaimed" or "expired"): from then on
	// Access refuses it and the record takes nothing more, and whichever
	// of reclaim or expiry runs next finishes the removal.
	ClosedAt *time.Time `json:"closed_at,omitempty"`
	Why      string     `json:"why,omitempty"`
}

// IsMember reports whether agent may act in the room as a member: the
// creator always; in an acl room an admitted agent; in other grades anyone
// holding the descriptor (which Access has verified).
func (r *Room) IsMember(agent string) bool {
	if agent == r.Creator {
		return true
	}
	if r.Privacy == GradeACL {
		return slices.Contains(r.Members, agent)
	}
	return true
}

// Keys of the bucket.
func RoomKey(roomID string) string             { return "room." + roomID }
func MemberKey(agent, roomID string) string    { return "member." + agent + "." + roomID }
func CursorKey(roomID, agent string) string    { return "cursor." + roomID + "." + agent }
func DriveKey(roomID, digestHex string) string { return "drive." + roomID + "." + digestHex }
func NoteKey(roomID, digestHex, agent string) string {
	return "note." + roomID + "." + digestHex + "." + agent
}
func CredKey(roomID, agent string) string   { return "cred." + roomID + "." + agent }
func QuotaKey(operator string) string       { return "quota." + QuotaToken(operator) }
func BoardKey(roomID, itemID string) string { return "board." + roomID + "." + itemID }

// QuotaToken is an operator (an email address) as one key token: KV keys
// allow [-/_=.a-zA-Z0-9], and '@' is not among them, so the address is
// spelled in base64url.
func QuotaToken(operator string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(operator))
}

// ErrNotMember is the refusal of a call by an agent that is not a member of
// the room it names.
func errNotMember(roomID string) error {
	return errs.Newf(errs.Forbidden, "you are not a member of room %s", roomID)
}

// Access is the check every call naming a room makes: the descriptor
// verifies, the room is durable and provisioned here (NOT_FOUND otherwise,
// or once reclaimed or expired), the stored descriptor is the one the call
// carries, and from is a member. It returns the descriptor and the room's
// current record. It records from as a holder of a capability or sealed
// room (holders.go) every time: a worker uses a Gate, which does so once.
func Access(ctx context.Context, kv jetstream.KeyValue, rawDescriptor json.RawMessage, from string) (*Descriptor, *Room, error) {
	return NewGate(kv, nil, nil).Access(ctx, rawDescriptor, from)
}

// access is Access; closed admits a room being removed (ClosedAt set),
// which only reclaim asks for, to finish an interrupted removal.
func access(ctx context.Context, kv jetstream.KeyValue, rawDescriptor json.RawMessage, from string, closed bool) (*Descriptor, *Room, error) {
	d, err := ParseDescriptor(rawDescriptor)
	if err != nil {
		return nil, nil, err
	}
	if !d.Durable() {
		return nil, nil, errs.Newf(errs.InputInvalid, "room %s is ephemeral: the mesh keeps no record, drive or board for it", d.RoomID)
	}
	r, found, err := bus.GetJSON[Room](ctx, kv, RoomKey(d.RoomID))
	if err != nil {
		return nil, nil, fmt.Errorf("rooms: read room %s: %w", d.RoomID, err)
	}
	if !found || (r.ClosedAt != nil && !closed) {
		return nil, nil, errs.Newf(errs.NotFound, "room %s is not provisioned on this mesh (or was reclaimed or expired)", d.RoomID)
	}
	if !sameDescriptor(r.Descriptor, d.Raw) {
		return nil, nil, errs.Newf(errs.IdentityMismatch, "the descriptor is not the one room %s was provisioned with", d.RoomID)
	}
	if !r.IsMember(from) {
		return nil, nil, errNotMember(d.RoomID)
	}
	return d, &r, nil
}

// sameDescriptor reports whether two descriptors are the same object: their
// canonical JSON (protocol.Canonical) is equal, whatever the order of their
// members or their spacing. Comparing anything less (the signature and the
// creator) would let a descriptor carrying those of another pass as it.
func sameDescriptor(stored, got json.RawMessage) bool {
	a, err := canonicalObject(stored)
	if err != nil {
		return false
	}
	b, err := canonicalObject(got)
	return err == nil && bytes.Equal(a, b)
}

// canonicalObject is the canonical JSON of a JSON object.
func canonicalObject(raw json.RawMessage) ([]byte, error) {
	var obj map[string]any
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, err
	}
	if obj == nil {
		return nil, errors.New("not an object")
	}
	return protocol.Canonical(obj)
}

// Quota is an operator's use of the durable rooms, key quota.<operator>:
// updated by compare-and-set, so a limit refuses exactly at its edge
// whatever copy answers (provision counts rooms, attach counts bytes;
// reclaim and expiry give both back).
type Quota struct {
	Rooms      int   `json:"rooms"`
	DriveBytes int64 `json:"drive_bytes"`
	// RoomIDs are the rooms counted (Rooms is their number): provision
	// adds its room once and removal takes it out once, so either may be
	// repeated after a crash without counting twice.
	RoomIDs []string `json:"room_ids,omitempty"`
	// CountedAt is when each of RoomIDs was counted: the sweep gives back
	// a count whose room was never created once it is this old, however
	// recently the quota was written for other rooms.
	CountedAt map[string]time.Time `json:"counted_at,omitempty"`
}
