package rooms

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/adapter/node"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

func newStore(t *testing.T) *Store {
	t.Helper()
	return OpenStore(filepath.Join(t.TempDir(), StoreFile), nil)
}

func newRoom(t testing.TB, creator *keys.Agent, spec NewRoom) Room {
	t.Helper()
	r, err := NewDescriptor(creator, spec, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestStoreRemembersRooms(t *testing.T) {
	s := newStore(t)
	creator := bustest.Agent(t)
	a := newRoom(t, creator, NewRoom{Name: "Design review"})
	b := newRoom(t, creator, NewRoom{Name: "ops"})
	c := newRoom(t, creator, NewRoom{Name: "ops"})
	for _, r := range []Room{a, b, c} {
		if _, err := s.Add(r, RoleCreator, "", ""); err != nil {
			t.Fatal(err)
		}
	}
	fi, err := os.Stat(s.path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("rooms file: %v %v", fi, err)
	}
	// By id, by name (any case), not by an ambiguous name.
	if h, err := s.Get(a.RoomID); err != nil || h.Name != "Design review" || h.Role != RoleCreator || string(h.Descriptor) != string(a.Raw) {
		t.Fatalf("by id: %+v %v", h, err)
	}
	if h, err := s.Get("design REVIEW"); err != nil || h.RoomID != a.RoomID {
		t.Fatalf("by name: %+v %v", h, err)
	}
	if _, err := s.Get("ops"); errs.CodeOf(err) != errs.InputInvalid || !strings.Contains(err.Error(), "2 rooms are named") {
		t.Fatalf("ambiguous name: %v", err)
	}
	if _, err := s.Get("nothing-here"); errs.CodeOf(err) != errs.NotFound {
		t.Fatalf("unknown room: %v", err)
	}
	// A token not held yet is remembered, as a member.
	d := newRoom(t, bustest.Agent(t), NewRoom{Name: "theirs"})
	if h, err := s.Get(d.Token()); err != nil || h.RoomID != d.RoomID || h.Role != RoleMember {
		t.Fatalf("by token: %+v %v", h, err)
	}
	// Adding a held room again keeps its role; another descriptor under
	// the same id is refused.
	if h, err := s.Add(a, RoleMember, "x", ""); err != nil || h.Role != RoleCreator {
		t.Fatalf("add again: %+v %v", h, err)
	}
	var obj map[string]any
	_ = json.Unmarshal(d.Raw, &obj)
	obj["room_id"] = a.RoomID
	delete(obj, "sig")
	obj["record"] = "mesh:rooms:" + a.RoomID
	k := bustest.Agent(t)
	obj["creator"] = k.Public()
	sig, err := protocol.SignRoomDescriptor(obj, k)
	if err != nil {
		t.Fatal(err)
	}
	obj["sig"] = sig
	raw, _ := json.Marshal(obj)
	other, err := ParseRoom(raw)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Add(other, RoleMember, "", ""); errs.CodeOf(err) != errs.IdentityMismatch {
		t.Fatalf("another descriptor under a held id: %v", err)
	}
	if err := s.MarkJoined(a.RoomID); err != nil {
		t.Fatal(err)
	}
	if found, err := s.Forget(b.RoomID); err != nil || !found {
		t.Fatalf("forget: %v %v", found, err)
	}
	list, err := s.List()
	if err != nil || len(list) != 3 || list[0].RoomID != a.RoomID || !list[0].Joined {
		t.Fatalf("list: %+v %v", list, err)
	}
	// The file is private: one others may read is refused.
	if err := os.Chmod(s.path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.List(); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("a readable rooms file: %v", err)
	}
}

func TestStoreIsBounded(t *testing.T) {
	s := newStore(t)
	creator := bustest.Agent(t)
	// Fill the file directly: MaxHeld signatures would be slow for no gain.
	f := storeFile{}
	for i := range MaxHeld {
		f.Rooms = append(f.Rooms, Held{RoomID: "r" + string(rune('a'+i%26)) + strings.Repeat("x", i%7) + string(rune('0'+i%10)), Privacy: GradeCapability})
	}
	b, _ := json.Marshal(f)
	if err := os.WriteFile(s.path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Add(newRoom(t, creator, NewRoom{}), RoleMember, "", ""); errs.CodeOf(err) != errs.QuotaExceeded {
		t.Fatalf("one room over the bound: %v", err)
	}
}

// invite builds a rooms.invite request from inviter.
func invite(t testing.TB, inviter *keys.Agent, contextID string, input any) *node.Call {
	t.Helper()
	e, err := protocol.New(protocol.TypeRequest, inviter.Public(), map[string]any{"offering": InviteOffering, "input": input})
	if err != nil {
		t.Fatal(err)
	}
	e.ContextID = contextID
	if err := e.Sign(inviter); err != nil {
		t.Fatal(err)
	}
	return &node.Call{Env: e}
}

func TestAcceptInvite(t *testing.T) {
	inviter := bustest.Agent(t)
	r := newRoom(t, inviter, NewRoom{Name: "review"})
	other := newRoom(t, inviter, NewRoom{Name: "other"})
	sealedNote := strings.Repeat("n", maxNoteLen+10)
	good := map[string]any{"rooms": "v1", "descriptor": json.RawMessage(r.Raw), "token": r.Token(), "sealed_key": nil, "note": sealedNote}
	with := func(k string, v any) map[string]any {
		m := map[string]any{}
		for kk, vv := range good {
			m[kk] = vv
		}
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	for _, tc := range []struct {
		name    string
		ctxID   string
		input   any
		wantErr string
	}{
		{"descriptor and token", r.RoomID, good, ""},
		{"the token alone", r.RoomID, with("descriptor", nil), ""},
		{"no context id", "", good, ""},
		{"another room's context", other.RoomID, good, "context_id"},
		{"a token of another room", r.RoomID, with("token", other.Token()), "token is not the descriptor"},
		{"neither", r.RoomID, map[string]any{"rooms": "v1"}, "neither a descriptor nor a token"},
		{"another version", r.RoomID, with("rooms", "v2"), `"v2"`},
		{"not an object", r.RoomID, "join my room", "rooms.invite shape"},
		{"a forged descriptor", r.RoomID, with("descriptor", json.RawMessage(strings.Replace(string(r.Raw), `"review"`, `"REVIEW"`, 1))), "does not verify"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			out, err := s.AcceptInvite(context.Background(), invite(t, inviter, tc.ctxID, tc.input))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				if list, _ := s.List(); len(list) != 0 {
					t.Fatalf("a refused invite was kept: %+v", list)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if m := out.(map[string]any); m["accepted"] != true || m["room_id"] != r.RoomID {
				t.Fatalf("answer %v", out)
			}
			h, err := s.Get(r.RoomID)
			if err != nil || h.Role != RoleMember || h.InvitedBy != inviter.Public() || len([]rune(h.Note)) != maxNoteLen {
				t.Fatalf("held %+v %v", h, err)
			}
		})
	}
	// A sealed room cannot be held here.
	k := bustest.Agent(t)
	obj := map[string]any{"rooms": "v1", "room_id": "sealedroom", "channels": []string{"main"}, "record": "ephemeral", "policy": map[string]any{},
		"privacy": GradeSealed, "key_fingerprint": "x", "creator": k.Public(), "created_at": protocol.FormatTime(time.Now())}
	sig, err := protocol.SignRoomDescriptor(obj, k)
	if err != nil {
		t.Fatal(err)
	}
	obj["sig"] = sig
	if _, err := newStore(t).AcceptInvite(context.Background(), invite(t, k, "", map[string]any{"rooms": "v1", "descriptor": obj})); err == nil ||
		!strings.Contains(err.Error(), "sealed") {
		t.Fatalf("sealed invite: %v", err)
	}
}

func FuzzParseInvite(f *testing.F) {
	r := newRoom(f, bustest.Agent(f), NewRoom{Name: "fuzz"})
	good, _ := json.Marshal(map[string]any{"rooms": "v1", "descriptor": json.RawMessage(r.Raw), "token": r.Token(), "sealed_key": nil, "note": "hi"})
	f.Add(string(good), r.RoomID)
	f.Add(`{"rooms":"v1","token":"`+r.Token()+`"}`, "")
	f.Add(`{"rooms":"v1","descriptor":null,"token":""}`, "x")
	f.Fuzz(func(t *testing.T, input, ctxID string) {
		got, _, err := ParseInvite([]byte(input), ctxID)
		if err != nil {
			return
		}
		if ctxID != "" && got.RoomID != ctxID {
			t.Fatalf("an invite for room %s under context %s was accepted", got.RoomID, ctxID)
		}
		if err := protocol.VerifyRoomDescriptor(json.RawMessage(got.Raw)); err != nil {
			t.Fatalf("an invite whose descriptor does not verify was accepted: %v", err)
		}
	})
}
