package rooms

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// ForgeShadowed is the review's forgery of a descriptor (finding 2): a
// descriptor the attacker signs with its own key, carrying the victim's
// creator and sig (and whatever shadow adds) under keys that case-fold onto
// the descriptor's members. Written as one object with the lower-case keys
// first, so a case-insensitive decoder reads the shadows.
func ForgeShadowed(t testing.TB, attacker keys.Signer, victim json.RawMessage, lower, shadow map[string]any) json.RawMessage {
	t.Helper()
	var vm map[string]any
	if err := json.Unmarshal(victim, &vm); err != nil {
		t.Fatal(err)
	}
	upper := map[string]any{"CREATOR": vm["creator"], "SIG": vm["sig"]}
	for k, v := range shadow {
		upper[k] = v
	}
	all := map[string]any{"creator": attacker.Public(), "created_at": protocol.FormatTime(time.Now())}
	for k, v := range lower {
		all[k] = v
	}
	low := map[string]any{}
	for k, v := range all {
		low[k] = v
	}
	for k, v := range upper {
		all[k] = v
	}
	sig, err := protocol.SignRoomDescriptor(all, attacker)
	if err != nil {
		t.Fatal(err)
	}
	low["sig"] = sig
	a, _ := json.Marshal(low)
	b, _ := json.Marshal(upper)
	return append(append(a[:len(a)-1:len(a)-1], ','), b[1:]...)
}

// A capability room's holder re-signs the descriptor under its own key with
// the creator's creator and sig (and privacy acl) as case-folded shadow keys:
// before the fix, Access admitted it and mesh.rooms.credential minted a room
// credential for a capability room. Now the descriptor is refused as read.
func TestForgedDescriptorRefused(t *testing.T) {
	m := startACL(t, 1, Limits{}, true)
	creator, stranger := bustest.Agent(t), bustest.Agent(t)
	desc, id := m.room(creator, GradeCapability)
	forged := ForgeShadowed(t, stranger, desc, map[string]any{"rooms": "v1", "room_id": id, "channels": []any{"main"},
		"record": DurableRecord(id), "privacy": GradeCapability}, map[string]any{"PRIVACY": GradeACL})

	if _, err := ParseDescriptor(forged); errs.CodeOf(err) != errs.InputInvalid {
		t.Fatalf("ParseDescriptor of the forgery: %v, want INPUT_INVALID", err)
	}
	if _, _, err := Access(t.Context(), m.kv, forged, stranger.Public()); err == nil {
		t.Fatal("Access admitted a descriptor the creator never signed")
	}
	token := base64.RawURLEncoding.EncodeToString(forged)
	for _, d := range []any{json.RawMessage(forged), token} {
		out, err := m.call(nil, stranger, "credential", map[string]any{"descriptor": d})
		if err == nil || out["jwt"] != nil {
			t.Fatalf("credential for a forged descriptor: %v %v", out, err)
		}
	}
	// The genuine descriptor of a capability room is refused by the acl
	// verbs on the stored grade.
	m.refused(nil, creator, "credential", map[string]any{"descriptor": desc}, errs.InputInvalid, "capability room")
}

// ParseDescriptor refuses any key that case-folds onto a descriptor member
// without being spelled as it is (whatever the decoder would make of it),
// and a descriptor longer than MaxDescriptorBytes; it takes members it does
// not know.
func TestParseDescriptorExactMembers(t *testing.T) {
	creator := bustest.Agent(t)
	sign := func(edit func(map[string]any)) json.RawMessage {
		d := map[string]any{"rooms": "v1", "room_id": "r1", "channels": []any{"main"}, "record": DurableRecord("r1"),
			"privacy": GradeCapability, "creator": creator.Public(), "created_at": protocol.FormatTime(time.Now()),
			"policy": map[string]any{}}
		edit(d)
		sig, err := protocol.SignRoomDescriptor(d, creator)
		if err != nil {
			t.Fatal(err)
		}
		d["sig"] = sig
		b, _ := json.Marshal(d)
		return b
	}
	for _, tc := range []struct {
		name string
		edit func(map[string]any)
		code errs.Code
	}{
		{"plain", func(map[string]any) {}, ""},
		{"an unknown member", func(d map[string]any) { d["x_extension"] = "fine" }, ""},
		{"a playbook", func(d map[string]any) { d["playbook"] = map[string]any{"facilitator": creator.Public()} }, ""},
		{"Privacy", func(d map[string]any) { d["Privacy"] = GradeACL }, errs.InputInvalid},
		{"ROOM_ID", func(d map[string]any) { d["ROOM_ID"] = "r2" }, errs.InputInvalid},
		{"Channels", func(d map[string]any) { d["Channels"] = []any{"evil"} }, errs.InputInvalid},
		{"Sig", func(d map[string]any) { d["Sig"] = "x" }, errs.InputInvalid},
		{"long s (U+017F) folds onto sig", func(d map[string]any) { d["\u017fig"] = "x" }, errs.InputInvalid},
		{"Kelvin sign folds onto key_fingerprint", func(d map[string]any) { d["\u212aey_fingerprint"] = "x" }, errs.InputInvalid},
		{"PLAYBOOK", func(d map[string]any) { d["PLAYBOOK"] = map[string]any{} }, errs.InputInvalid},
		{"too long", func(d map[string]any) { d["name"] = strings.Repeat("n", MaxDescriptorBytes) }, errs.InputInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw := sign(tc.edit)
			for _, form := range []json.RawMessage{raw, mustMarshal(t, base64.RawURLEncoding.EncodeToString(raw))} {
				_, err := ParseDescriptor(form)
				if errs.CodeOf(err) != tc.code {
					t.Fatalf("%s: %v, want %q", form[:min(len(form), 40)], err, tc.code)
				}
			}
		})
	}
}

func mustMarshal(t *testing.T, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// sameDescriptor is the canonical JSON of the two objects: the same members
// in any order and spacing are the same descriptor, anything else is not.
func TestSameDescriptorCanonical(t *testing.T) {
	a := json.RawMessage(`{"rooms":"v1","sig":"s","creator":"c","channels":["main"]}`)
	for _, tc := range []struct {
		got  string
		same bool
	}{
		{`{ "creator":"c", "channels":[ "main" ], "rooms":"v1", "sig":"s" }`, true},
		{`{"rooms":"v1","sig":"s","creator":"c","channels":["main"],"CHANNELS":["evil"]}`, false},
		{`{"rooms":"v1","sig":"s","creator":"c","channels":["evil"]}`, false},
		{`not json`, false},
	} {
		if got := sameDescriptor(a, json.RawMessage(tc.got)); got != tc.same {
			t.Errorf("sameDescriptor(%s) = %t, want %t", tc.got, got, tc.same)
		}
	}
}

// FuzzParseDescriptor: whatever ParseDescriptor takes is at most
// MaxDescriptorBytes, has no key folding onto a member it is not, verifies,
// and is the same descriptor as itself.
func FuzzParseDescriptor(f *testing.F) {
	creator, attacker := bustest.Agent(f), bustest.Agent(f)
	d := map[string]any{"rooms": "v1", "room_id": "r1", "channels": []any{"main"}, "record": DurableRecord("r1"),
		"privacy": GradeCapability, "creator": creator.Public(), "created_at": "2026-01-01T00:00:00.000Z"}
	sig, err := protocol.SignRoomDescriptor(d, creator)
	if err != nil {
		f.Fatal(err)
	}
	d["sig"] = sig
	genuine, _ := json.Marshal(d)
	f.Add([]byte(genuine))
	token, _ := json.Marshal(base64.RawURLEncoding.EncodeToString(genuine))
	f.Add([]byte(token))
	forged := ForgeShadowed(f, attacker, genuine, map[string]any{"rooms": "v1", "room_id": "r1",
		"channels": []any{"main"}, "record": DurableRecord("r1"), "privacy": GradeCapability}, nil)
	f.Add([]byte(forged))
	f.Add([]byte(`{"rooms":"v1","Rooms":"v2"}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		d, err := ParseDescriptor(raw)
		if err != nil {
			return
		}
		if len(d.Raw) > MaxDescriptorBytes {
			t.Fatalf("took a %d-byte descriptor", len(d.Raw))
		}
		var obj map[string]any
		if err := json.Unmarshal(d.Raw, &obj); err != nil {
			t.Fatal(err)
		}
		for k := range obj {
			for _, m := range descriptorMembers {
				if k != m && strings.EqualFold(k, m) {
					t.Fatalf("took key %q, a spelling of %q", k, m)
				}
			}
		}
		if protocol.VerifyRoomDescriptor(obj) != nil || !sameDescriptor(d.Raw, d.Raw) {
			t.Fatal("took a descriptor that does not verify or is not itself")
		}
		if obj["creator"] != d.Creator || obj["sig"] != d.Sig || obj["room_id"] != d.RoomID || obj["privacy"] != d.Privacy {
			t.Fatalf("typed members %+v are not the object's %v", d, obj)
		}
	})
}
