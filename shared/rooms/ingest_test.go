package rooms_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/rooms"
)

// Three copies of the worker on one broker; several members say at once,
// each message published twice: the record holds every message once, in
// the counters as in the stream.
func TestRecordConcurrentDeduplicated(t *testing.T) {
	h := start(t, rooms.Config{}, 3)
	ana := h.agent("ana@example.org")
	id, d := h.provision(ana, rooms.GradeCapability)
	const members, each = 5, 20
	signers := []keys.Signer{ana}
	for range members - 1 {
		signers = append(signers, bustest.Agent(t)) // holders of the descriptor
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	sent := map[string]int{} // from:id → size
	for _, s := range signers[1:] {
		h.must(s, "cursor", map[string]any{"descriptor": d}) // presents the descriptor
	}
	for _, s := range signers {
		nc := bustest.Client(t, h.bus)
		wg.Go(func() {
			for i := range each {
				b := emit(t, s, id, say(fmt.Sprintf("%s says %d", s.Public()[:8], i)), nil)
				var env struct{ ID, From string }
				_ = json.Unmarshal(b, &env)
				mu.Lock()
				sent[env.From+":"+env.ID] = len(b)
				mu.Unlock()
				for range 2 {
					if err := nc.Publish(protocol.RoomEventSubject(id, "main"), b); err != nil {
						t.Error(err)
					}
				}
			}
		})
	}
	wg.Wait()
	st := h.waitHandled(2 * members * each)
	if st.Recorded != members*each || st.Duplicates != members*each || st.Dropped != 0 {
		t.Fatalf("stats %+v", st)
	}
	got := h.replayAll(ana, d)
	if len(got) != members*each {
		t.Fatalf("the record has %d messages, want %d", len(got), members*each)
	}
	seen := map[string]bool{}
	var bytes int64
	last := 0.0
	for _, m := range got {
		if seq := m["seq"].(float64); seq <= last {
			t.Fatalf("seq %v after %v", seq, last)
		} else {
			last = seq
		}
		env := m["envelope"].(map[string]any)
		key := env["from"].(string) + ":" + env["id"].(string)
		if seen[key] {
			t.Fatalf("%s recorded twice", key)
		}
		seen[key] = true
		size, ok := sent[key]
		if !ok {
			t.Fatalf("%s was never sent", key)
		}
		bytes += int64(size)
	}
	room, _ := h.room(id)
	if room.RecordMsgs != members*each || room.RecordBytes != bytes {
		t.Fatalf("counters %d msgs %d bytes, want %d and %d", room.RecordMsgs, room.RecordBytes, members*each, bytes)
	}
}

// The sender rules of the room messages, and every other reason the
// record drops a message.
func TestRecordSenderRules(t *testing.T) {
	h := start(t, rooms.Config{}, 2)
	ana := h.agent("ana@example.org")
	member, holder, facil := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)
	services := h.bus.ServicesKey()
	capID, capD := h.provision(ana, rooms.GradeCapability)
	aclID, _ := h.provision(ana, rooms.GradeACL)
	// The playbook names a facilitator.
	playID := newRoomID()
	playD := descriptor(t, ana, playID, rooms.GradeCapability, func(m map[string]any) {
		m["playbook"] = map[string]any{"facilitator": facil.Public()}
	})
	h.must(ana, "provision", map[string]any{"descriptor": playD})
	// The holder and the facilitator present the descriptors (any verb);
	// the stranger holds nothing it has shown.
	stranger := bustest.Agent(t)
	h.must(holder, "status", map[string]any{"descriptor": capD})
	h.must(facil, "cursor", map[string]any{"descriptor": playD})
	// admit member to the acl room, as the acl verb does.
	if _, _, err := bus.CAS(t.Context(), h.kv, rooms.RoomKey(aclID), func(r *rooms.Room, _ bool) (*rooms.Room, error) {
		r.Members = append(r.Members, member.Public())
		return r, nil
	}); err != nil {
		t.Fatal(err)
	}
	ephemeral := newRoomID() // never provisioned
	cap, acl := protocol.RoomEventSubject(capID, "main"), protocol.ACLRoomSubject(aclID, "main")
	play := protocol.RoomEventSubject(playID, "main")
	msg := func(typ string, kv ...any) map[string]any {
		m := map[string]any{"type": typ}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	old := func(e *protocol.Envelope) { e.TS = protocol.FormatTime(time.Now().Add(-20 * time.Minute)) }
	for _, tc := range []struct {
		name    string
		subject string
		signer  keys.Signer
		room    string
		payload map[string]any
		edit    func(*protocol.Envelope)
		want    string
	}{
		{"say by the creator", cap, ana, capID, say("hi"), nil, "recorded"},
		{"say by a holder of the descriptor", cap, holder, capID, say("hi"), nil, "recorded"},
		{"say by an agent that never presented the descriptor", cap, stranger, capID, say("hi"), nil, "dropped"},
		{"say by a holder of another room's descriptor", play, holder, playID, say("hi"), nil, "dropped"},
		{"say by an acl member", acl, member, aclID, say("hi"), nil, "recorded"},
		{"say by an acl non-member", acl, holder, aclID, say("hi"), nil, "dropped"},
		{"acl traffic on the open subject", protocol.RoomEventSubject(aclID, "main"), member, aclID, say("hi"), nil, "dropped"},
		{"open traffic on the acl subject", protocol.ACLRoomSubject(capID, "main"), ana, capID, say("hi"), nil, "dropped"},
		{"genesis by the creator", cap, ana, capID, msg("genesis", "descriptor", "x"), nil, "recorded"},
		{"genesis by another", cap, holder, capID, msg("genesis", "descriptor", "x"), nil, "dropped"},
		{"expel by the creator", acl, ana, aclID, msg("expel", "member", member.Public(), "severity", "conduct"), nil, "recorded"},
		{"expel by a member", acl, member, aclID, msg("expel", "member", ana.Public(), "severity", "conduct"), nil, "dropped"},
		{"close by another", cap, holder, capID, msg("close"), nil, "dropped"},
		{"close by the creator", cap, ana, capID, msg("close", "reason", "done"), nil, "recorded"},
		{"join in the first person", cap, holder, capID, msg("join", "member", holder.Public()), nil, "recorded"},
		{"join for someone else", cap, holder, capID, msg("join", "member", member.Public()), nil, "dropped"},
		{"leave for someone else", acl, ana, aclID, msg("leave", "member", member.Public()), nil, "dropped"},
		{"leave in the first person", acl, member, aclID, msg("leave", "member", member.Public()), nil, "recorded"},
		{"phase by the creator (default facilitator)", cap, ana, capID, msg("phase", "pattern", "review"), nil, "recorded"},
		{"phase by another", cap, holder, capID, msg("phase", "pattern", "review"), nil, "dropped"},
		{"phase by the playbook's facilitator", play, facil, playID, msg("phase", "pattern", "review"), nil, "recorded"},
		{"phase by the creator when the playbook names another", play, ana, playID, msg("phase", "pattern", "review"), nil, "dropped"},
		{"board event by the services key", cap, services, capID, msg("board.posted", "item", map[string]any{"item_id": "x"}), nil, "recorded"},
		{"board event by the services key in an acl room", acl, services, aclID, msg("board.claimed", "item", map[string]any{"item_id": "x"}), nil, "recorded"},
		{"genesis by the services key", cap, services, capID, msg("genesis", "descriptor", "x"), nil, "dropped"},
		{"board event by a member", cap, ana, capID, msg("board.claimed", "item", map[string]any{"item_id": "x"}), nil, "dropped"},
		{"channel not in the descriptor", protocol.RoomEventSubject(capID, "other"), ana, capID, say("hi"), nil, "dropped"},
		{"ephemeral (unknown) room", protocol.RoomEventSubject(ephemeral, "main"), ana, ephemeral, say("hi"), nil, "dropped"},
		{"context_id of another room", cap, ana, aclID, say("hi"), nil, "dropped"},
		{"stale", cap, ana, capID, say("hi"), old, "dropped"},
		{"not a room message", cap, ana, capID, map[string]any{"text": "hi"}, nil, "dropped"},
		{"not an emit", cap, ana, capID, say("hi"), func(e *protocol.Envelope) { e.Type = protocol.TypeRequest }, "dropped"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := emit(t, tc.signer, tc.room, tc.payload, tc.edit)
			if got := h.publish(tc.subject, b); got != tc.want {
				t.Fatalf("%s, want %s", got, tc.want)
			}
		})
	}
	t.Run("bad signature", func(t *testing.T) {
		b := emit(t, ana, capID, say("hi"), nil)
		b = []byte(strings.Replace(string(b), `"hi"`, `"ho"`, 1))
		if got := h.publish(cap, b); got != "dropped" {
			t.Fatalf("%s", got)
		}
	})
	t.Run("not json", func(t *testing.T) {
		if got := h.publish(cap, []byte("hello")); got != "dropped" {
			t.Fatalf("%s", got)
		}
	})
}

// The record's message cap is the stream's per-subject limit: the default
// is 10,000 with discard-new per subject, and with the limit lowered the
// message past it is refused at the server, through the ingest and when
// appended directly.
func TestRecordMessageCap(t *testing.T) {
	def := start(t, rooms.Config{}, 1)
	s, err := def.js.Stream(t.Context(), rooms.RecordStream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	if cfg.MaxMsgsPerSubject != 10_000 || !cfg.DiscardNewPerSubject || cfg.Discard != jetstream.DiscardNew || !cfg.AllowDirect ||
		cfg.Duplicates < 10*time.Minute || rooms.DefaultLimits.RecordMsgs != 10_000 {
		t.Fatalf("record stream %+v", cfg)
	}

	h := start(t, rooms.Config{Limits: rooms.Limits{RecordMsgs: 5}}, 2)
	ana := h.agent("ana@example.org")
	id, d := h.provision(ana, rooms.GradeCapability)
	for i := range 5 {
		h.say(ana, id, fmt.Sprint("message ", i))
	}
	if got := h.publish(protocol.RoomEventSubject(id, "main"), emit(t, ana, id, say("one too many"), nil)); got != "dropped" {
		t.Fatalf("the 6th message: %s", got)
	}
	if _, err := h.js.Publish(t.Context(), rooms.RecordSubject(id), []byte(`{}`)); err == nil || !strings.Contains(err.Error(), "maximum messages per subject") {
		t.Fatalf("a direct append past the cap: %v", err)
	}
	if got := h.replayAll(ana, d); len(got) != 5 {
		t.Fatalf("%d recorded", len(got))
	}
	st := h.must(ana, "status", map[string]any{"descriptor": d})
	if rec := st["record"].(map[string]any); rec["msgs"] != float64(5) || rec["max_msgs"] != float64(5) {
		t.Fatalf("status record %v", rec)
	}
}

// The record's byte cap (8 MB by default): a message that would pass it
// is dropped, and the count never passes it.
func TestRecordByteCap(t *testing.T) {
	if rooms.DefaultLimits.RecordBytes != 8<<20 {
		t.Fatalf("default record bytes %d", rooms.DefaultLimits.RecordBytes)
	}
	h := start(t, rooms.Config{Limits: rooms.Limits{RecordBytes: 4000}}, 2)
	ana := h.agent("ana@example.org")
	id, d := h.provision(ana, rooms.GradeCapability)
	var total int64
	recorded := 0
	for i := range 12 {
		b := emit(t, ana, id, say(strings.Repeat("x", 400)+fmt.Sprint(i)), nil)
		switch got := h.publish(protocol.RoomEventSubject(id, "main"), b); {
		case got == "recorded" && total+int64(len(b)) <= 4000:
			total += int64(len(b))
			recorded++
		case got == "dropped" && total+int64(len(b)) > 4000:
		default:
			t.Fatalf("message %d (%d bytes, %d recorded so far): %s", i, len(b), total, got)
		}
	}
	room, _ := h.room(id)
	if recorded == 0 || recorded == 12 || room.RecordBytes != total || room.RecordMsgs != int64(recorded) {
		t.Fatalf("%d recorded (%d bytes); counters %d msgs %d bytes", recorded, total, room.RecordMsgs, room.RecordBytes)
	}
	if got := h.replayAll(ana, d); len(got) != recorded {
		t.Fatalf("%d replayed", len(got))
	}
}

// A member's own leave message takes it out of an acl room even when the
// record refuses the message (full): leaving never depends on there being
// room to say so (review finding 7).
func TestLeaveAppliedWhenRecordFull(t *testing.T) {
	h := start(t, rooms.Config{Limits: rooms.Limits{RecordMsgs: 1}}, 2)
	ana := h.agent("ana@example.org")
	member := bustest.Agent(t)
	id, _ := h.provision(ana, rooms.GradeACL)
	if _, _, err := bus.CAS(t.Context(), h.kv, rooms.RoomKey(id), func(r *rooms.Room, _ bool) (*rooms.Room, error) {
		r.Members = append(r.Members, member.Public())
		return r, nil
	}); err != nil {
		t.Fatal(err)
	}
	subject := protocol.ACLRoomSubject(id, "main")
	if got := h.publish(subject, emit(t, ana, id, say("the only message"), nil)); got != "recorded" {
		t.Fatalf("first message: %s", got)
	}
	leave := map[string]any{"type": "leave", "member": member.Public()}
	if got := h.publish(subject, emit(t, member, id, leave, nil)); got != "dropped" {
		t.Fatalf("the leave in a full record: %s", got)
	}
	if room, _ := h.room(id); len(room.Members) != 1 || room.Members[0] != ana.Public() {
		t.Fatalf("members %v after a leave the record could not take", room.Members)
	}
}

// The record of a capability or sealed room takes messages only from its
// creator, the services key and agents that have presented its descriptor
// to a rooms or board verb (review finding 3): a room's id is visible to
// every node credential on mesh.event.>, and before, anyone could fill its
// record and keep it alive. Three copies: an agent presents to one and its
// message may be recorded by another.
func TestRecordOnlyFromHolders(t *testing.T) {
	h := start(t, rooms.Config{}, 3)
	ana := h.agent("ana@example.org")
	id, d := h.provision(ana, rooms.GradeCapability)
	subject := protocol.RoomEventSubject(id, "main")

	stranger := bustest.Agent(t)
	if got := h.publish(subject, emit(t, stranger, id, say("spam"), nil)); got != "dropped" {
		t.Fatalf("a message from an agent that never presented the descriptor: %s", got)
	}
	join := map[string]any{"type": "join", "member": stranger.Public()}
	if got := h.publish(subject, emit(t, stranger, id, join, nil)); got != "dropped" {
		t.Fatalf("a join from an agent that never presented the descriptor: %s", got)
	}
	h.say(ana, id, "the creator needs no presenting")

	// Each holder presents once, through any verb, then speaks.
	for i, verb := range []string{"cursor", "replay", "status", "notes", "cursor", "mine"} {
		holder := bustest.Agent(t)
		h.must(holder, verb, map[string]any{"descriptor": d})
		h.say(holder, id, fmt.Sprint("holder ", i))
		h.say(holder, id, fmt.Sprint("holder ", i, " again"))
	}
	if got := len(h.replayAll(ana, d)); got != 13 {
		t.Fatalf("the record holds %d messages, want 13", got)
	}
}

// A handle holder who provisions the room_id of someone else's ephemeral
// room records none of that room's traffic: its members never presented
// the squatter's descriptor (review finding 3).
func TestSquattedRoomIDRecordsNothing(t *testing.T) {
	h := start(t, rooms.Config{}, 2)
	owner, member, squatter := bustest.Agent(t), bustest.Agent(t), h.agent("squat@example.org")
	id := newRoomID()
	// The ephemeral room's own descriptor, never provisioned.
	_ = descriptor(t, owner, id, rooms.GradeCapability, func(m map[string]any) { m["record"] = rooms.RecordEphemeral })
	squat := descriptor(t, squatter, id, rooms.GradeCapability, nil)
	h.must(squatter, "provision", map[string]any{"descriptor": squat})
	for _, who := range []keys.Signer{owner, member} {
		if got := h.publish(protocol.RoomEventSubject(id, "main"), emit(t, who, id, say("private"), nil)); got != "dropped" {
			t.Fatalf("the ephemeral room's traffic: %s", got)
		}
	}
	if got := h.replayAll(squatter, squat); len(got) != 0 {
		t.Fatalf("the squatter's record holds %d messages of another room", len(got))
	}
}
