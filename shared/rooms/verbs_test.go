package rooms_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/rooms"
)

// Every verb naming a room passes Access: a descriptor that does not
// verify, an ephemeral or unknown room, another descriptor with the room's
// id, and (acl) a non-member are refused.
func TestVerbsAccess(t *testing.T) {
	h := start(t, rooms.Config{}, 1)
	ana := h.agent("ana@example.org")
	outsider := bustest.Agent(t)
	aclID, aclD := h.provision(ana, rooms.GradeACL)
	unknown := descriptor(t, ana, newRoomID(), rooms.GradeCapability, nil)
	ephemeral := descriptor(t, ana, newRoomID(), rooms.GradeCapability, func(m map[string]any) { m["record"] = "ephemeral" })
	other := descriptor(t, ana, aclID, rooms.GradeACL, func(m map[string]any) { m["name"] = "other" })
	for _, verb := range []string{"replay", "status", "cursor", "dossier", "reclaim"} {
		t.Run(verb, func(t *testing.T) {
			h.refused(ana, verb, map[string]any{}, errs.InputInvalid)
			h.refused(ana, verb, map[string]any{"descriptor": unknown}, errs.NotFound)
			h.refused(ana, verb, map[string]any{"descriptor": ephemeral}, errs.InputInvalid)
			h.refused(ana, verb, map[string]any{"descriptor": other}, errs.IdentityMismatch)
			h.refused(outsider, verb, map[string]any{"descriptor": aclD}, errs.Forbidden)
		})
	}
	// mine and usage name no room: a descriptor is optional, and checked
	// when given.
	h.must(ana, "mine", map[string]any{})
	h.refused(outsider, "mine", map[string]any{"descriptor": aclD}, errs.Forbidden)
	h.refused(outsider, "usage", map[string]any{}, errs.NotNamed)
}

// Replay pages through the record: seqs increase, next_seq continues,
// done ends it; limit defaults to 100 and is capped at 1,000.
func TestReplay(t *testing.T) {
	h := start(t, rooms.Config{}, 2)
	ana := h.agent("ana@example.org")
	id, d := h.provision(ana, rooms.GradeCapability)
	empty := h.must(ana, "replay", map[string]any{"descriptor": d})
	if len(empty["messages"].([]any)) != 0 || empty["done"] != true || empty["next_seq"] != float64(1) {
		t.Fatalf("empty record: %v", empty)
	}
	const n = 25
	for i := range n {
		h.say(ana, id, fmt.Sprint("message ", i))
	}
	// Another room's traffic interleaves in the stream.
	otherID, _ := h.provision(ana, rooms.GradeCapability)
	h.say(ana, otherID, "elsewhere")
	var texts []string
	from, pages := 1.0, 0
	for {
		out := h.must(ana, "replay", map[string]any{"descriptor": d, "from_seq": from, "limit": 10})
		pages++
		msgs := out["messages"].([]any)
		for _, m := range msgs {
			m := m.(map[string]any)
			if m["seq"].(float64) < from {
				t.Fatalf("seq %v before from_seq %v", m["seq"], from)
			}
			env := m["envelope"].(map[string]any)
			if env["context_id"] != id {
				t.Fatalf("another room's message: %v", env)
			}
			texts = append(texts, env["payload"].(map[string]any)["body"].(string))
		}
		if out["done"] == true {
			break
		}
		if len(msgs) != 10 {
			t.Fatalf("page of %d, not done", len(msgs))
		}
		from = out["next_seq"].(float64)
	}
	if pages != 3 || len(texts) != n || texts[0] != "message 0" || texts[n-1] != fmt.Sprint("message ", n-1) {
		t.Fatalf("%d pages, %d messages: %v", pages, len(texts), texts)
	}
	if all := h.must(ana, "replay", map[string]any{"descriptor": d}); len(all["messages"].([]any)) != n || all["done"] != true {
		t.Fatalf("default limit: %v", all)
	}
	if big := h.must(ana, "replay", map[string]any{"descriptor": d, "limit": 5000}); len(big["messages"].([]any)) != n {
		t.Fatalf("limit 5000: %v", big)
	}
	h.refused(ana, "replay", map[string]any{"descriptor": d, "limit": 0}, errs.InputInvalid)
	h.refused(ana, "replay", map[string]any{"descriptor": d, "from_seq": 0}, errs.InputInvalid)
	h.refused(ana, "replay", map[string]any{"descriptor": d, "from_seq": "one"}, errs.InvalidEnvelope)
}

// A page never passes what one answer carries: messages of 300 KB come
// three to a page, and a page always has at least one.
func TestReplayPageBytes(t *testing.T) {
	h := start(t, rooms.Config{}, 1)
	ana := h.agent("ana@example.org")
	id, d := h.provision(ana, rooms.GradeCapability)
	for i := range 5 {
		h.say(ana, id, fmt.Sprintf("%d %0300000d", i, 0))
	}
	out := h.must(ana, "replay", map[string]any{"descriptor": d})
	if n := len(out["messages"].([]any)); n != 3 || out["done"] != false {
		t.Fatalf("first page: %d messages, done %v", n, out["done"])
	}
	if got := h.replayAll(ana, d); len(got) != 5 {
		t.Fatalf("%d messages", len(got))
	}
}

// status, cursor and mine.
func TestStatusCursorMine(t *testing.T) {
	h := start(t, rooms.Config{}, 2)
	ana := h.agent("ana@example.org")
	bob := h.agent("bob@example.org")
	holder := bustest.Agent(t)
	capID, capD := h.provision(ana, rooms.GradeCapability)
	aclID, aclD := h.provision(ana, rooms.GradeACL)
	bobID, _ := h.provision(bob, rooms.GradeCapability)
	for i := range 3 {
		h.say(ana, capID, fmt.Sprint("hello ", i))
	}

	// cursor: read, move on, refuse to move back.
	if c := h.must(ana, "cursor", map[string]any{"descriptor": capD}); c["seq"] != float64(0) || c["at"] != nil {
		t.Fatalf("fresh cursor %v", c)
	}
	if c := h.must(ana, "cursor", map[string]any{"descriptor": capD, "seq": 5}); c["seq"] != float64(5) || c["advanced"] != true {
		t.Fatalf("advance %v", c)
	}
	if c := h.must(ana, "cursor", map[string]any{"descriptor": capD, "seq": 3}); c["seq"] != float64(5) || c["advanced"] != false {
		t.Fatalf("back %v", c)
	}
	if c := h.must(ana, "cursor", map[string]any{"descriptor": capD}); c["seq"] != float64(5) || c["at"] == nil {
		t.Fatalf("read %v", c)
	}
	h.must(holder, "cursor", map[string]any{"descriptor": capD, "seq": 7})
	h.refused(ana, "cursor", map[string]any{"descriptor": capD, "seq": -1}, errs.InputInvalid)

	st := h.must(ana, "status", map[string]any{"descriptor": capD})
	rec := st["record"].(map[string]any)
	if st["room_id"] != capID || st["privacy"] != rooms.GradeCapability || st["creator"] != ana.Public() || st["members"] != nil ||
		rec["msgs"] != float64(3) || rec["max_msgs"] != float64(10_000) || rec["max_bytes"] != float64(8<<20) || rec["last_seq"] == nil ||
		st["cursor_high_water"] != float64(7) || st["cursor"].(map[string]any)["seq"] != float64(5) {
		t.Fatalf("status %v", st)
	}
	if drive, ok := st["drive"].(map[string]any); !ok || drive["artifacts"] == nil {
		t.Fatalf("status drive %v", st["drive"])
	}
	if st := h.must(ana, "status", map[string]any{"descriptor": aclD}); st["record"].(map[string]any)["last_seq"] != nil {
		t.Fatalf("empty record's last_seq %v", st)
	}

	// mine: the rooms created, and the acl rooms admitted to; never a
	// capability room merely held.
	mine := func(who keys.Signer) map[string]map[string]any {
		out := map[string]map[string]any{}
		for _, r := range h.must(who, "mine", map[string]any{})["rooms"].([]any) {
			r := r.(map[string]any)
			out[r["room_id"].(string)] = r
		}
		return out
	}
	am := mine(ana)
	if len(am) != 2 || am[capID]["role"] != "creator" || am[aclID]["privacy"] != rooms.GradeACL || am[capID]["last_seq"] == nil ||
		am[capID]["cursor"].(map[string]any)["seq"] != float64(5) || am[aclID]["last_seq"] != nil || am[capID]["descriptor"] == nil {
		t.Fatalf("ana's rooms %v", am)
	}
	if _, err := rooms.ParseDescriptor(mustJSON(t, am[capID]["descriptor"])); err != nil {
		t.Fatalf("mine's descriptor does not verify: %v", err)
	}
	if hm := mine(holder); len(hm) != 0 {
		t.Fatalf("a holder's rooms %v", hm)
	}
	// bob is admitted to ana's acl room, as the acl verb does it.
	if _, _, err := bus.CAS(t.Context(), h.kv, rooms.RoomKey(aclID), func(r *rooms.Room, _ bool) (*rooms.Room, error) {
		r.Members = append(r.Members, bob.Public())
		return r, nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.kv.Put(t.Context(), rooms.MemberKey(bob.Public(), aclID), mustJSON(t, rooms.MemberEntry{Role: rooms.RoleMember, At: protocol.FormatTime(time.Now())})); err != nil {
		t.Fatal(err)
	}
	bm := mine(bob)
	if len(bm) != 2 || bm[aclID]["role"] != "member" || bm[bobID]["role"] != "creator" {
		t.Fatalf("bob's rooms %v", bm)
	}
	st = h.must(bob, "status", map[string]any{"descriptor": aclD})
	if m := st["members"].([]any); len(m) != 2 {
		t.Fatalf("acl members %v", m)
	}
}

// mine pages (review finding 12): an agent admitted to many rooms, whose
// creators may sign descriptors of up to 16 KiB, gets them a page at a time
// (limit, 100 by default and 500 at most, and 512 KiB), next naming where
// the next page starts (after); the pages are the whole list, oldest first.
func TestMinePaged(t *testing.T) {
	h := start(t, rooms.Config{Limits: rooms.Limits{RoomsPerOperator: 20}}, 2)
	ana := h.agent("ana@example.org")
	bob := h.agent("bob@example.org")
	const n = 12
	var ids []string
	for i := range n {
		id := newRoomID()
		d := descriptor(t, ana, id, rooms.GradeACL, func(m map[string]any) {
			m["playbook"] = map[string]any{"note": strings.Repeat("x", 12_000)} // a long descriptor
			m["name"] = fmt.Sprint("room ", i)
		})
		h.must(ana, "provision", map[string]any{"descriptor": d})
		if _, _, err := bus.CAS(t.Context(), h.kv, rooms.RoomKey(id), func(r *rooms.Room, _ bool) (*rooms.Room, error) {
			r.Members = append(r.Members, bob.Public())
			return r, nil
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := h.kv.Put(t.Context(), rooms.MemberKey(bob.Public(), id), mustJSON(t, rooms.MemberEntry{Role: rooms.RoleMember, At: protocol.FormatTime(time.Now())})); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	pages := func(p map[string]any) (sizes []int, got []string) {
		after := ""
		for {
			q := map[string]any{}
			for k, v := range p {
				q[k] = v
			}
			if after != "" {
				q["after"] = after
			}
			out := h.must(bob, "mine", q)
			page := out["rooms"].([]any)
			for _, r := range page {
				got = append(got, r.(map[string]any)["room_id"].(string))
			}
			sizes = append(sizes, len(page))
			next, _ := out["next"].(string)
			if next == "" {
				return sizes, got
			}
			after = next
		}
	}
	want := strings.Join(ids, ",")
	if sizes, got := pages(map[string]any{"limit": 5}); fmt.Sprint(sizes) != "[5 5 2]" || strings.Join(got, ",") != want {
		t.Fatalf("pages of 5: %v %v", sizes, got)
	}
	if sizes, got := pages(map[string]any{}); fmt.Sprint(sizes) != "[12]" || strings.Join(got, ",") != want {
		t.Fatalf("the default page: %v %v", sizes, got)
	}
	restore := rooms.SetPageBytes(50_000)
	sizes, got := pages(map[string]any{"limit": 5000})
	restore()
	if len(sizes) < 3 || strings.Join(got, ",") != want {
		t.Fatalf("pages within 50,000 bytes: %v %v", sizes, got)
	}
	h.refused(bob, "mine", map[string]any{"limit": 0}, errs.InputInvalid)
	h.refused(bob, "mine", map[string]any{"after": strings.Repeat("a", 600)}, errs.InputInvalid)
}
