package rooms

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// StoreFile is the file, in the adapter's state directory, where the rooms
// an agent holds are remembered. A capability room's descriptor is its
// membership, so the file is written 0600 like the rest of the state.
const StoreFile = "rooms.json"

// MaxHeld bounds the rooms one agent remembers: anyone may send an invite,
// and a flood of them must not grow the state directory without end.
const MaxHeld = 1000

// maxNoteLen bounds an invite's note as it is kept (upstream: 280).
const maxNoteLen = 280

// Roles of a held room.
const (
	RoleCreator = "creator"
	RoleMember  = "member"
)

// Held is one room the agent holds.
type Held struct {
	RoomID  string `json:"room_id"`
	Name    string `json:"name,omitempty"`
	Privacy string `json:"privacy"`
	Durable bool   `json:"durable"`
	// Role is creator (this agent made it) or member (invited, or added
	// from a token).
	Role string `json:"role"`
	// Descriptor is the signed descriptor exactly as received.
	Descriptor json.RawMessage `json:"descriptor"`
	// InvitedBy is the verified signer of the invite; Note the inviter's
	// words (sender text: show it fenced).
	InvitedBy string `json:"invited_by,omitempty"`
	Note      string `json:"note,omitempty"`
	// Joined is set once this agent posted its join message.
	Joined  bool   `json:"joined,omitempty"`
	AddedAt string `json:"added_at"`
}

// Room parses the held descriptor again (it verifies every time).
func (h Held) Room() (Room, error) { return ParseRoom(h.Descriptor) }

// Store is the rooms file. It is safe for concurrent use in one process;
// every change rewrites the whole file atomically.
type Store struct {
	path string
	now  func() time.Time
	mu   sync.Mutex
}

// OpenStore opens (without reading yet) the rooms file at path.
func OpenStore(path string, now func() time.Time) *Store {
	if now == nil {
		now = time.Now
	}
	return &Store{path: path, now: now}
}

type storeFile struct {
	Rooms []Held `json:"rooms"`
	// Invites are the invites sent and not answered yet: an answer that
	// comes later (the invitee's adapter took the invite from its mailbox)
	// is recognised by them, at most MaxPendingInvites, newest kept.
	Invites []SentInvite `json:"invites,omitempty"`
}

// SentInvite is an invite sent and not answered yet.
type SentInvite struct {
	ID     string `json:"id"` // the request's envelope id
	To     string `json:"to"`
	RoomID string `json:"room_id"`
	At     string `json:"at"`
}

// MaxPendingInvites bounds the unanswered invites remembered.
const MaxPendingInvites = 1000

// NoteInvite remembers an invite before it is sent.
func (s *Store) NoteInvite(inv SentInvite) error {
	return s.update(func(f *storeFile) error {
		f.Invites = append(f.Invites, inv)
		if n := len(f.Invites); n > MaxPendingInvites {
			f.Invites = f.Invites[n-MaxPendingInvites:]
		}
		return nil
	})
}

// TakeInvite forgets the invite with request id, answered by from, and
// returns it; ok is false when no such invite to from is pending.
func (s *Store) TakeInvite(id, from string) (inv SentInvite, ok bool, err error) {
	err = s.update(func(f *storeFile) error {
		i := slices.IndexFunc(f.Invites, func(x SentInvite) bool { return x.ID == id && x.To == from })
		if i < 0 {
			return errUnchanged
		}
		inv, ok = f.Invites[i], true
		f.Invites = slices.Delete(f.Invites, i, i+1)
		return nil
	})
	if errors.Is(err, errUnchanged) {
		err = nil
	}
	return inv, ok, err
}

// errUnchanged ends an update that changes nothing, without a write.
var errUnchanged = errors.New("unchanged")

// List returns the held rooms, oldest first.
func (s *Store) List() ([]Held, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, err := s.read()
	return f.Rooms, err
}

// Get finds a held room by its id, its name (when one held room has it),
// or its token or descriptor (which is then remembered, as a member).
func (s *Store) Get(ref string) (Held, error) {
	ref = strings.TrimSpace(ref)
	if ref == "" {
		return Held{}, errs.New(errs.InputInvalid, "name a room: its id, its name, or its token")
	}
	s.mu.Lock()
	f, err := s.read()
	s.mu.Unlock()
	if err != nil {
		return Held{}, err
	}
	if i := slices.IndexFunc(f.Rooms, func(h Held) bool { return h.RoomID == ref }); i >= 0 {
		return f.Rooms[i], nil
	}
	var named []Held
	for _, h := range f.Rooms {
		if h.Name != "" && strings.EqualFold(h.Name, ref) {
			named = append(named, h)
		}
	}
	switch len(named) {
	case 1:
		return named[0], nil
	case 0:
	default:
		return Held{}, errs.Newf(errs.InputInvalid, "%d rooms are named %q; name the room by its id (see `mesh-adapter room list`)", len(named), ref)
	}
	if !strings.HasPrefix(ref, "{") && !looksLikeToken(ref) {
		return Held{}, errs.Newf(errs.NotFound, "no room %q here: `mesh-adapter room list` shows the rooms this agent holds", ref)
	}
	r, perr := ParseRoom([]byte(ref))
	if perr != nil {
		return Held{}, errs.Newf(errs.NotFound, "no room %q here, and it is not a room token either (%s)", short(ref), errs.As(perr).Message)
	}
	return s.Add(r, RoleMember, "", "")
}

// looksLikeToken tells a pasted token (base64url of a JSON object starts
// "ey", and is long) from a mistyped room id or name.
func looksLikeToken(s string) bool { return strings.HasPrefix(s, "ey") && len(s) > 64 }

func short(s string) string {
	if len(s) > 24 {
		return s[:24] + "…"
	}
	return s
}

// Add remembers r, or returns it as already held. A room already held keeps
// its role (an invite to one's own room does not make one a mere member).
func (s *Store) Add(r Room, role, invitedBy, note string) (Held, error) {
	var out Held
	err := s.update(func(f *storeFile) error {
		if i := slices.IndexFunc(f.Rooms, func(h Held) bool { return h.RoomID == r.RoomID }); i >= 0 {
			out = f.Rooms[i]
			if !sameSig(out.Descriptor, r.Raw) {
				return errs.Newf(errs.IdentityMismatch, "room %s is already held with another descriptor; the one offered is not the room this agent knows", r.RoomID)
			}
			return nil
		}
		if len(f.Rooms) >= MaxHeld {
			return errs.Newf(errs.QuotaExceeded, "this agent already holds %d rooms; forget some with `mesh-adapter room forget`", MaxHeld)
		}
		if r := []rune(note); len(r) > maxNoteLen {
			note = string(r[:maxNoteLen])
		}
		out = Held{RoomID: r.RoomID, Name: r.Name, Privacy: r.Privacy, Durable: r.Durable(), Role: role,
			Descriptor: append(json.RawMessage(nil), r.Raw...), InvitedBy: invitedBy, Note: note,
			AddedAt: protocol.FormatTime(s.now())}
		f.Rooms = append(f.Rooms, out)
		return nil
	})
	return out, err
}

// MarkJoined records that the join message was posted.
func (s *Store) MarkJoined(roomID string) error {
	return s.update(func(f *storeFile) error {
		if i := slices.IndexFunc(f.Rooms, func(h Held) bool { return h.RoomID == roomID }); i >= 0 {
			f.Rooms[i].Joined = true
		}
		return nil
	})
}

// Forget drops a held room (nothing is sent; the room is not left).
func (s *Store) Forget(roomID string) (bool, error) {
	found := false
	err := s.update(func(f *storeFile) error {
		n := len(f.Rooms)
		f.Rooms = slices.DeleteFunc(f.Rooms, func(h Held) bool { return h.RoomID == roomID })
		found = len(f.Rooms) != n
		return nil
	})
	return found, err
}

func (s *Store) update(change func(*storeFile) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	f, err := s.read()
	if err != nil {
		return err
	}
	if err := change(&f); err != nil {
		return err
	}
	// Compact: an indented file would re-indent every descriptor too, and
	// a descriptor is kept as the bytes received.
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	return keys.WriteSecretFile(s.path, append(b, '\n'))
}

func (s *Store) read() (storeFile, error) {
	f := storeFile{Rooms: []Held{}}
	fh, err := os.Open(s.path)
	if errors.Is(err, os.ErrNotExist) {
		return f, nil
	}
	if err != nil {
		return f, err
	}
	defer fh.Close()
	fi, err := fh.Stat()
	if err != nil {
		return f, fmt.Errorf("%s: %w", s.path, err)
	}
	if perm := fi.Mode().Perm(); runtime.GOOS != "windows" && perm&0o077 != 0 {
		return f, fmt.Errorf("%s has mode %04o; it holds room descriptors and must be readable by its owner only (chmod 600 %s)", s.path, perm, s.path)
	}
	if err := json.NewDecoder(fh).Decode(&f); err != nil {
		return f, fmt.Errorf("%s is damaged: %w", s.path, err)
	}
	if f.Rooms == nil {
		f.Rooms = []Held{}
	}
	return f, nil
}

// sameSig compares two descriptors by creator and signature, as the rooms
// service does: both verified, equal signatures mean the same content.
func sameSig(a, b json.RawMessage) bool {
	var x, y struct {
		Creator string `json:"creator"`
		Sig     string `json:"sig"`
	}
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return x.Sig != "" && x.Sig == y.Sig && x.Creator == y.Creator
}
