package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/adapter/rooms"
)

// joinAs claims <name>.<email> by the registrar's mailed code and binds
// the agent in state to it (`join`, the code typed on stdin).
func (w *mailWorld) joinAs(state, email, name, operator string) string {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(w.t.Context(), 60*time.Second)
	defer cancel()
	join := exec.CommandContext(ctx, binary, "--state-dir", state, "--control-url", w.m.URLs().Control, "--registrar-url", w.m.URLs().Registrar,
		"join", "--email", email, "--name", name, "--operator", operator)
	join.Env = append(os.Environ(), "MESH_ADAPTER_HOME=", "MESH_CONTROL_URL=", "MESH_REGISTRAR_URL=")
	stdin, err := join.StdinPipe()
	if err != nil {
		w.t.Fatal(err)
	}
	var out lockedBuffer
	join.Stdout, join.Stderr = &out, &out
	if err := join.Start(); err != nil {
		w.t.Fatal(err)
	}
	waitFor(w.t, &out, "Code: ")
	io.WriteString(stdin, w.handleCode(email)+"\n")
	stdin.Close()
	if err := join.Wait(); err != nil {
		w.t.Fatalf("join %s: %v\n%s", email, err, out.String())
	}
	return name + "." + email
}

// jsonOut runs the adapter and decodes its --json output.
func (w *world) jsonOut(state string, dst any, args ...string) {
	w.t.Helper()
	out := w.must(state, args...)
	if err := json.Unmarshal([]byte(out), dst); err != nil {
		w.t.Fatalf("mesh-adapter %v: not JSON: %v\n%s", args, err, out)
	}
}

// until reruns a read until it says what is awaited (the record is written
// by the ingest, after the message).
func until(t *testing.T, what string, read func() (string, bool)) string {
	t.Helper()
	var last string
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		s, ok := read()
		if ok {
			return s
		}
		last = s
	}
	t.Fatalf("never saw %s; last:\n%s", what, last)
	return ""
}

// The Must-show of issue 16: two people's agents, each bound to a handle of
// its own person, share a durable room through the built adapter — create,
// invite (to an adapter that is not running: its mailbox keeps the
// invite), say, attach a file, note it, post and claim a board item — and
// export a dossier that verifies offline and fails once a byte changes.
func TestRoomsBetweenTwoPeople(t *testing.T) {
	w := newMailWorld(t)
	reg := w.m.URLs().Registrar
	bobAcct, _, err := w.m.Control().Accounts.CreateAccount(t.Context(), "bob@example.org")
	if err != nil {
		t.Fatal(err)
	}
	bobKey, err := w.m.Control().Accounts.AdminMintAgentKey(t.Context(), bobAcct.ID, "reviewer")
	if err != nil {
		t.Fatal(err)
	}
	a, b := w.state("ra"), w.state("rb")
	p, idA := w.start(a, "--registrar-url", reg, "up", w.agentKey("helper"))
	p.stop()
	p, idB := w.start(b, "--registrar-url", reg, "up", bobKey.Token)
	p.stop()
	anaHandle := w.joinAs(a, "ana@example.org", "helper", "Ana Lopez")
	bobHandle := w.joinAs(b, "bob@example.org", "reviewer", "Bob Stone")

	// Ana's adapter runs; Bob's does not yet.
	pa, _ := w.start(a, "start", "--inbox", "--name", "helper")

	var created struct {
		RoomID  string `json:"room_id"`
		Token   string `json:"token"`
		Privacy string `json:"privacy"`
		Durable bool   `json:"durable"`
	}
	w.jsonOut(a, &created, "room", "create", "design review", "--json")
	if created.RoomID == "" || !created.Durable || created.Privacy != "capability" {
		t.Fatalf("created %+v", created)
	}
	room := created.RoomID
	out := w.must(a, "--registrar-url", reg, "room", "invite", "design review", bobHandle, "--note", "please review the draft")
	if !strings.Contains(out, "invited agent "+idB) || !strings.Contains(out, "until it next runs") {
		t.Fatalf("invite to an adapter that is not running: %s", out)
	}

	// Bob's adapter starts, drains its mailbox and holds the room; its
	// answer reaches Ana's adapter late, and is known for what it is.
	pb, _ := w.start(b, "start", "--inbox", "--name", "reviewer")
	until(t, "the invite in Bob's room list", func() (string, bool) {
		out, _, _ := w.run(b, "room", "list")
		return out, strings.Contains(out, room) && strings.Contains(out, "invited by agent "+idA) && strings.Contains(out, "please review the draft")
	})
	if !pb.printed("room invite: agent "+idA+" invited this agent to room "+room) || !pa.printed("room invite: agent "+idB+" took the invite to room "+room) {
		t.Fatalf("the adapters' lines about the invite:\nAna:\n%s\nBob:\n%s", pa.output(), pb.output())
	}
	if out := w.must(a, "inbox", "--all"); !strings.Contains(out, "no messages") {
		t.Fatalf("the invite's late answer went to Ana's inbox:\n%s", out)
	}

	w.must(b, "room", "say", room, "hello from Bob")
	w.must(a, "room", "say", "design review", "welcome, Bob")

	// Ana attaches the draft as the room's output; Bob fetches it by digest.
	draft := []byte("# Design\n\nThe plan, in one page.\n")
	draftPath := filepath.Join(t.TempDir(), "draft.md")
	if err := os.WriteFile(draftPath, draft, 0o600); err != nil {
		t.Fatal(err)
	}
	var att rooms.Attached
	w.jsonOut(a, &att, "room", "attach", "design review", draftPath, "--role", "output", "--json")
	if att.Digest == "" || att.Ref == "" || att.Size != int64(len(draft)) || att.Name != "draft.md" {
		t.Fatalf("attached %+v", att)
	}
	got := filepath.Join(t.TempDir(), "fetched.md")
	w.must(b, "room", "fetch", room, att.Digest, "--out", got)
	if b, err := os.ReadFile(got); err != nil || !bytes.Equal(b, draft) {
		t.Fatalf("fetched %q %v", b, err)
	}

	// Bob notes it; Ana reads the note, whose author is Bob's signature.
	w.must(b, "room", "note", room, att.Digest, "pass", "--reason", "reads well")
	var notes []rooms.Note
	w.jsonOut(a, &notes, "room", "notes", "design review", "--json")
	if len(notes) != 1 || notes[0].By != idB || notes[0].Verdict != "pass" || notes[0].Digest != att.Digest {
		t.Fatalf("notes %+v", notes)
	}

	// The work board: Ana posts, Bob claims, Ana's claim loses, Bob completes.
	var item rooms.Item
	w.jsonOut(a, &item, "board", "post", "design review", "summarise the review", "--detail", "one paragraph", "--json")
	if item.ItemID == "" || item.State != "open" || item.PostedBy != idA {
		t.Fatalf("posted %+v", item)
	}
	var claimed rooms.Item
	w.jsonOut(b, &claimed, "board", "claim", room, item.ItemID, "--json")
	if claimed.State != "claimed" || claimed.ClaimedBy != idB || claimed.TaskID == "" {
		t.Fatalf("claimed %+v", claimed)
	}
	_, errOut, status := w.run(a, "board", "claim", "design review", item.ItemID)
	if status != 1 || !strings.Contains(errOut, "BOARD_ITEM_TAKEN") || !strings.Contains(errOut, idB) {
		t.Fatalf("a second claim: exit %d\n%s", status, errOut)
	}
	w.must(b, "board", "complete", room, item.ItemID, "--note", "summary posted", "--artifact", att.Ref)
	var board rooms.Board
	w.jsonOut(a, &board, "board", "list", "design review", "--json")
	if board.Done != 1 || len(board.Items) != 1 || board.Items[0].State != "done" || board.Items[0].ResultNote != "summary posted" {
		t.Fatalf("board %+v", board)
	}

	// The record, as the ingest wrote it: both people's words, the file,
	// the board's events.
	record := until(t, "the whole record", func() (string, bool) {
		out, _, _ := w.run(a, "room", "read", "design review")
		return out, strings.Contains(out, "hello from Bob") && strings.Contains(out, "welcome, Bob") &&
			strings.Contains(out, "attached draft.md") && strings.Contains(out, "item "+item.ItemID+" done")
	})
	for _, want := range []string{idA + "  created the room", idB + "  joined (says its handle is " + bobHandle + ")", "claimed by " + idB} {
		if !strings.Contains(record, want) {
			t.Errorf("the record lacks %q:\n%s", want, record)
		}
	}
	_ = anaHandle

	// The dossier, written through Ana's running adapter and verified.
	dossier := filepath.Join(t.TempDir(), "dossier.json")
	out = w.must(a, "room", "dossier", "design review", "--out", dossier)
	if !strings.Contains(out, "it verifies") || !strings.Contains(out, w.m.ServicesKey().Public()) {
		t.Fatalf("room dossier: %s", out)
	}
	raw, err := os.ReadFile(dossier)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := rooms.VerifyDossier(raw)
	if err != nil || sum.RoomID != room || sum.Files != 1 || sum.Entries < 6 || sum.SignerPub != w.m.ServicesKey().Public() {
		t.Fatalf("the dossier offline: %+v %v", sum, err)
	}
	for _, want := range []string{"hello from Bob", "welcome, Bob", att.Digest} {
		if !bytes.Contains(raw, []byte(want)) {
			t.Errorf("the dossier lacks %q", want)
		}
	}
	// Offline, with no adapter or mesh: `room verify` in an empty state.
	if out := w.must(w.state("offline"), "room", "verify", dossier); !strings.Contains(out, "verifies") {
		t.Fatalf("room verify: %s", out)
	}
	// One byte changed anywhere in what is signed: it no longer verifies.
	i := bytes.Index(raw, []byte("hello from Bob"))
	tampered := bytes.Clone(raw)
	tampered[i] = 'j'
	bad := filepath.Join(t.TempDir(), "tampered.json")
	if err := os.WriteFile(bad, tampered, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := rooms.VerifyDossier(tampered); err == nil {
		t.Fatal("a changed dossier verifies")
	}
	if _, errOut, status := w.run(w.state("offline"), "room", "verify", bad); status != 1 || !strings.Contains(errOut, "does not verify") {
		t.Fatalf("room verify of a changed dossier: exit %d %s", status, errOut)
	}

	// The acl grade: Ana admits and invites Bob (live now), Bob talks on a
	// room credential, Ana expels him and his room connection ends.
	var closed struct {
		RoomID  string `json:"room_id"`
		Privacy string `json:"privacy"`
	}
	w.jsonOut(a, &closed, "room", "create", "closed", "--acl", "--json")
	if closed.Privacy != "acl" {
		t.Fatalf("acl room %+v", closed)
	}
	if out := w.must(a, "room", "invite", "closed", idB); !strings.Contains(out, "it holds the room now") {
		t.Fatalf("acl invite: %s", out)
	}
	w.must(b, "room", "say", closed.RoomID, "members only")
	until(t, "Bob's words in the acl room's record", func() (string, bool) {
		out, _, _ := w.run(a, "room", "read", "closed")
		return out, strings.Contains(out, "members only") && strings.Contains(out, idB+"  joined")
	})
	if out := w.must(a, "room", "expel", "closed", idB, "--severity", "timeout"); !strings.Contains(out, "expelled agent "+idB) {
		t.Fatalf("expel: %s", out)
	}
	if !pb.printed("warning: acl room " + closed.RoomID) {
		t.Fatalf("Bob's adapter did not say its acl room ended:\n%s", pb.output())
	}
	if _, errOut, status := w.run(b, "room", "say", closed.RoomID, "still here?"); status != 1 || !strings.Contains(errOut, "FORBIDDEN") {
		t.Fatalf("say after expel: exit %d %s", status, errOut)
	}
}
