package rooms

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
	srooms "agentmesh.dev/mesh/shared/rooms"
)

func TestNewDescriptor(t *testing.T) {
	creator := bustest.Agent(t)
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		spec    NewRoom
		record  func(id string) string
		privacy string
		code    errs.Code
	}{
		{"durable capability by default", NewRoom{Name: "design review"}, srooms.DurableRecord, GradeCapability, ""},
		{"ephemeral", NewRoom{Ephemeral: true}, func(string) string { return srooms.RecordEphemeral }, GradeCapability, ""},
		{"acl", NewRoom{Privacy: GradeACL}, srooms.DurableRecord, GradeACL, ""},
		{"acl is never ephemeral", NewRoom{Privacy: GradeACL, Ephemeral: true}, nil, "", errs.InputInvalid},
		{"sealed is not managed here", NewRoom{Privacy: GradeSealed}, nil, "", errs.InputInvalid},
		{"unknown grade", NewRoom{Privacy: "open"}, nil, "", errs.InputInvalid},
		{"a channel is one token", NewRoom{Channels: []string{"main", "a.b"}}, nil, "", errs.InputInvalid},
		{"name too long", NewRoom{Name: strings.Repeat("x", maxNameLen+1)}, nil, "", errs.InputInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := NewDescriptor(creator, tc.spec, now)
			if tc.code != "" {
				if errs.CodeOf(err) != tc.code {
					t.Fatalf("err %v, want %s", err, tc.code)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			id, err := base64.RawURLEncoding.DecodeString(r.RoomID)
			if err != nil || len(id) != roomIDBytes || len(r.RoomID) != 24 {
				t.Fatalf("room id %q: %d bytes, %v", r.RoomID, len(id), err)
			}
			if r.Record != tc.record(r.RoomID) || r.Privacy != tc.privacy || r.Creator != creator.Public() ||
				r.CreatedAt != protocol.FormatTime(now) || r.Name != tc.spec.Name {
				t.Fatalf("descriptor %+v", r.Descriptor)
			}
			var obj map[string]any
			if err := json.Unmarshal(r.Raw, &obj); err != nil {
				t.Fatal(err)
			}
			if p, ok := obj["policy"].(map[string]any); !ok || len(p) != 0 || obj["rooms"] != "v1" {
				t.Fatalf("descriptor object %v", obj)
			}
			if err := protocol.VerifyRoomDescriptor(obj); err != nil {
				t.Fatalf("the descriptor does not verify: %v", err)
			}
			// The token form reads back as the same room, bare or quoted.
			for _, in := range []string{r.Token(), `"` + r.Token() + `"`, string(r.Raw)} {
				back, err := ParseRoom([]byte(in))
				if err != nil || back.RoomID != r.RoomID || string(back.Raw) != string(r.Raw) {
					t.Fatalf("ParseRoom(%.30s…): %v", in, err)
				}
			}
		})
	}
}

func TestParseRoomRefusesATamperedDescriptor(t *testing.T) {
	r, err := NewDescriptor(bustest.Agent(t), NewRoom{Name: "a"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	_ = json.Unmarshal(r.Raw, &obj)
	obj["name"] = "b"
	b, _ := json.Marshal(obj)
	if _, err := ParseRoom(b); errs.CodeOf(err) != errs.IdentityMismatch {
		t.Fatalf("tampered descriptor: %v", err)
	}
	// Signed by someone other than the creator it names.
	obj["name"] = "a"
	obj["creator"] = bustest.Agent(t).Public()
	b, _ = json.Marshal(obj)
	if _, err := ParseRoom(b); err == nil {
		t.Fatal("a descriptor naming another creator verified")
	}
	for _, junk := range []string{"", "null", "[]", "eyJub3QiOiJhIHJvb20ifQ", "{}"} {
		if _, err := ParseRoom([]byte(junk)); err == nil {
			t.Errorf("ParseRoom(%q) succeeded", junk)
		}
	}
}

func FuzzParseRoom(f *testing.F) {
	r, err := NewDescriptor(bustest.Agent(f), NewRoom{Name: "fuzz"}, time.Now())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(r.Raw))
	f.Add(r.Token())
	f.Add(`"` + r.Token() + `"`)
	f.Add(`{"rooms":"v1"}`)
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseRoom([]byte(s))
		if err != nil {
			return
		}
		// Whatever parses verifies, and reads back the same.
		if err := protocol.VerifyRoomDescriptor(json.RawMessage(got.Raw)); err != nil {
			t.Fatalf("parsed a descriptor that does not verify: %v", err)
		}
		if again, err := ParseRoom([]byte(got.Token())); err != nil || again.RoomID != got.RoomID {
			t.Fatalf("the token of a parsed room does not parse: %v", err)
		}
	})
}
