package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"mime"
	"os"
	"path/filepath"
	"strings"
	"time"

	"agentmesh.dev/mesh/adapter/control"
	"agentmesh.dev/mesh/adapter/daemon"
	"agentmesh.dev/mesh/adapter/rooms"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

func init() {
	register(&command{name: "room", usage: "create|invite|join|say|read|attach|fetch|note|notes|dossier|verify|list|status|expel|leave|forget ...",
		summary: "create rooms, invite agents, talk, share files and export a signed dossier",
		help: `Rooms are shared channels between agents (spec §4.3). A durable room
(the default) has a record the mesh keeps, a drive for files, notes on those
files and a work board ("mesh-adapter board"); an --ephemeral room is never
recorded. A capability room's members are whoever holds its signed
descriptor; an --acl room admits members by name and carries its traffic on
a short-lived room credential. ROOM is a room's id, its name, or its token.

  create [NAME] [--acl] [--ephemeral] [--json]
                          create a room (durable rooms need a handle:
                          "mesh-adapter join")
  invite ROOM AGENT [--note TEXT]
                          send the room to an agent (its id or handle); an
                          offline agent gets it when its adapter next runs
  join ROOM               tell the room you are here (done for you before
                          your first message)
  say ROOM TEXT [--channel C] [--reply-to ID]
                          post a message
  read ROOM [--from SEQ] [--limit N] [--json]
                          read the room's record, oldest first
  attach ROOM FILE [--name N] [--media-type T] [--role input|interim|output]
                          put a file (at most 512 KB) on the drive and
                          tell the room
  fetch ROOM REF|DIGEST [--out FILE]
                          get a file from the drive (stdout without --out)
  note ROOM DIGEST pass|flag|hold [--reason TEXT]
                          note a file on the drive (one note per member
                          per file; noting again replaces yours)
  notes ROOM [DIGEST] [--json]
                          read the notes on one file, or on every file
  dossier ROOM [--out FILE]
                          write the room's dossier, signed by the mesh,
                          and verify it (stdout without --out)
  verify FILE             verify a dossier offline
  list [--json]           the rooms this agent holds (no network)
  status ROOM             what the mesh keeps for the room (JSON)
  expel ROOM AGENT [--severity timeout|conduct|safety] [--note TEXT]
                          acl rooms, creator only: remove a member (its
                          room connection is closed at once)
  leave ROOM              leave the room (acl rooms: your access ends)
  forget ROOM             drop the room from this adapter's list

Through the running adapter when there is one; otherwise the agent comes
up just for the command. Invites from others arrive at the running adapter
(or with its mailbox when it next runs) and show in "room list".

Example:
  mesh-adapter room create "design review"
  mesh-adapter room invite "design review" helper.bob@example.org
  mesh-adapter room say "design review" "the draft is on the drive"
  mesh-adapter room attach "design review" draft.md --role input
  mesh-adapter room dossier "design review" --out review-dossier.json`,
		run: runRoom})
	register(&command{name: "board", usage: "post|list|claim|complete|abandon|withdraw ROOM ...",
		summary: "the work board of a room: post, claim and complete items",
		help: `Every durable room has a work board. Members post items; one member
claims an item (exactly one claim wins; the others are told who holds it
and until when), then completes or abandons it. Only the poster withdraws
an item, and only while nobody holds it. A claim lasts its lease (an hour
unless --lease says otherwise); a lapsed claim shows the item open again.

  post ROOM TITLE [--detail TEXT] [--offering ID] [--lease DURATION]
  list ROOM [--json]
  claim ROOM ITEM [--lease DURATION]   prints the task id of the work
  complete ROOM ITEM [--note TEXT] [--artifact REF]...
  abandon ROOM ITEM
  withdraw ROOM ITEM

Example:
  mesh-adapter board post "design review" "summarise the comments" --lease 2h
  mesh-adapter board list "design review"
  mesh-adapter board claim "design review" 01961a3e-...
  mesh-adapter board complete "design review" 01961a3e-... --note "summary on the drive"`,
		run: runBoard})
}

// roomDo runs a rooms command through the running adapter, or with the
// agent brought up for it.
func (e *Env) roomDo(ctx context.Context, cmd rooms.Command, acceptNew bool, out any) error {
	b, err := json.Marshal(cmd)
	if err != nil {
		return err
	}
	err = e.call(control.Request{Op: "room", Room: b, RegistrarURL: e.RegistrarURL, AcceptNewBinding: acceptNew}, out, 2*time.Minute)
	if !errors.Is(err, control.ErrNotRunning) {
		return err
	}
	dir, err := e.openState()
	if err != nil {
		return err
	}
	res, err := daemon.Room(ctx, daemon.Config{Dir: dir, ControlURL: e.ControlURL, RegistrarURL: e.RegistrarURL, Out: e.Stderr, Log: e.logger()},
		cmd, daemon.SendOptions{AcceptNewBinding: acceptNew, RegistrarURL: e.RegistrarURL})
	if err != nil {
		return err
	}
	if out == nil {
		return nil
	}
	// The same JSON as through the socket, so both paths print alike.
	rb, err := json.Marshal(res)
	if err != nil {
		return err
	}
	return json.Unmarshal(rb, out)
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// subcommand splits "room say ..." into "say" and the rest.
func subcommand(args []string, what string) (string, []string, error) {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return "", nil, usageError("say what to do: %s", what)
	}
	return args[0], args[1:], nil
}

const roomVerbs = "create, invite, join, say, read, attach, fetch, note, notes, dossier, verify, list, status, expel, leave or forget"

func runRoom(ctx context.Context, e *Env, args []string) error {
	sub, args, err := subcommand(args, roomVerbs)
	if err != nil {
		return err
	}
	fs := flag.NewFlagSet("room "+sub, flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON")
	var want int // positional arguments after the verb
	cmd := rooms.Command{Verb: sub}
	var (
		acl, ephemeral, acceptNew               *bool
		note, channel, replyTo, name, mediaType *string
		role, out, reason, severity             *string
		from                                    *uint64
		limit                                   *int
	)
	switch sub {
	case "create":
		want = -2 // an optional name
		acl = fs.Bool("acl", false, "members-only: admitted by name, traffic on a room credential")
		ephemeral = fs.Bool("ephemeral", false, "never recorded: no record, drive or board")
	case "invite":
		want = 2
		note = fs.String("note", "", "a note to the invitee")
		acceptNew = fs.Bool("accept-new-binding", false, "invite even though the handle's agent changed since it was pinned")
	case "expel":
		want = 2
		severity = fs.String("severity", "conduct", "timeout, conduct or safety")
		note = fs.String("note", "", "why, for the room")
	case "join", "status", "leave", "forget":
		want = 1
	case "say":
		want = 2
		channel = fs.String("channel", "", "the channel (the room's first)")
		replyTo = fs.String("reply-to", "", "the id of the message this answers")
	case "read":
		want = 1
		from = fs.Uint64("from", 0, "the record position to start at")
		limit = fs.Int("limit", 0, "at most this many messages")
	case "attach":
		want = 2
		name = fs.String("name", "", "the file's name on the drive (its own name)")
		mediaType = fs.String("media-type", "", "its media type (guessed from the name)")
		role = fs.String("role", "", "input, interim or output")
	case "fetch":
		want = 2
		out = fs.String("out", "", "write the file here instead of stdout")
	case "note":
		want = 3
		reason = fs.String("reason", "", "why")
	case "notes":
		want = -1
	case "dossier":
		want = 1
		out = fs.String("out", "", "write the dossier here instead of stdout")
	case "verify":
		want = 1
	case "list":
	default:
		return usageError("unknown room action %q: say %s", sub, roomVerbs)
	}
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	switch {
	case want >= 0 && len(pos) != want:
		return usageError("room %s takes %d argument(s), not %d (see `mesh-adapter help room`)", sub, want, len(pos))
	case want == -1 && (len(pos) < 1 || len(pos) > 2):
		return usageError("room %s takes the room and, optionally, a digest", sub)
	case want == -2 && len(pos) > 1:
		return usageError("room %s takes one name (quote it)", sub)
	}
	if sub == "list" {
		return roomList(e, *asJSON)
	}
	if sub == "verify" {
		return roomVerify(e, pos[0])
	}
	if sub == "forget" {
		return roomForget(e, pos[0])
	}
	if sub == "create" {
		if len(pos) == 1 {
			cmd.Name = pos[0]
		}
		if *acl {
			cmd.Privacy = rooms.GradeACL
		}
		cmd.Ephemeral = *ephemeral
	} else {
		cmd.Room = pos[0]
	}
	switch sub {
	case "invite":
		cmd.To, cmd.Text = pos[1], *note
	case "expel":
		cmd.To, cmd.Verdict, cmd.Text = pos[1], *severity, *note
	case "say":
		cmd.Text, cmd.Channel, cmd.InReplyTo = pos[1], *channel, *replyTo
	case "read":
		cmd.FromSeq, cmd.Limit = *from, *limit
	case "attach":
		data, err := readFile(pos[1])
		if err != nil {
			return err
		}
		cmd.Data, cmd.FileName, cmd.MediaType, cmd.Role = data, firstNonEmpty(*name, filepath.Base(pos[1])), *mediaType, *role
		if cmd.MediaType == "" {
			cmd.MediaType = mime.TypeByExtension(filepath.Ext(cmd.FileName))
		}
	case "fetch":
		cmd.Ref = pos[1]
	case "note":
		cmd.Digest, cmd.Verdict, cmd.Text = pos[1], pos[2], *reason
	case "notes":
		if len(pos) == 2 {
			cmd.Digest = pos[1]
		}
	}
	return roomRun(ctx, e, cmd, *asJSON, out, acceptNew != nil && *acceptNew)
}

// readFile reads a file to attach, refusing one over the drive's limit
// before reading it all.
func readFile(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	if fi.Size() > rooms.MaxFile {
		return nil, fmt.Errorf("%s is %d bytes; a drive file is at most %d bytes (512 KB)", path, fi.Size(), rooms.MaxFile)
	}
	return os.ReadFile(path)
}

// roomRun sends cmd and prints its outcome.
func roomRun(ctx context.Context, e *Env, cmd rooms.Command, asJSON bool, out *string, acceptNew bool) error {
	w := e.Stdout
	switch cmd.Verb {
	case "create", "join":
		var h rooms.Held
		if err := e.roomDo(ctx, cmd, false, &h); err != nil {
			return err
		}
		r, err := h.Room()
		if err != nil {
			return err
		}
		if asJSON {
			return printJSON(w, map[string]any{"room_id": h.RoomID, "name": h.Name, "privacy": h.Privacy, "durable": h.Durable,
				"role": h.Role, "token": r.Token(), "descriptor": h.Descriptor})
		}
		if cmd.Verb == "join" {
			fmt.Fprintf(w, "joined room %s\n", h.RoomID)
			return nil
		}
		fmt.Fprintf(w, "created room %s (%s)\n", h.RoomID, describeHeld(h))
		fmt.Fprintf(w, "token: %s\n", r.Token())
		return nil
	case "invite":
		var inv rooms.Invited
		if err := e.roomDo(ctx, cmd, acceptNew, &inv); err != nil {
			return err
		}
		if asJSON {
			return printJSON(w, inv)
		}
		switch {
		case inv.NoAnswer:
			fmt.Fprintf(w, "invited agent %s to room %s: its adapter did not answer, so its mailbox keeps the invite until it next runs\n", inv.To, inv.RoomID)
		case inv.Queued:
			fmt.Fprintf(w, "invited agent %s to room %s: its inbox holds the invite for the person behind it\n", inv.To, inv.RoomID)
		default:
			fmt.Fprintf(w, "invited agent %s to room %s; it holds the room now\n", inv.To, inv.RoomID)
		}
		return nil
	case "say":
		var s rooms.Said
		if err := e.roomDo(ctx, cmd, false, &s); err != nil {
			return err
		}
		if asJSON {
			return printJSON(w, s)
		}
		fmt.Fprintf(w, "said in room %s on %s (message %s)\n", s.RoomID, s.Channel, s.ID)
		return nil
	case "read":
		var p rooms.Page
		if err := e.roomDo(ctx, cmd, false, &p); err != nil {
			return err
		}
		if asJSON {
			return printJSON(w, p)
		}
		printPage(w, p)
		return nil
	case "attach":
		var a rooms.Attached
		if err := e.roomDo(ctx, cmd, false, &a); err != nil {
			return err
		}
		if asJSON {
			return printJSON(w, a)
		}
		fmt.Fprintf(w, "attached %s (%d bytes) to room %s\nref:    %s\ndigest: %s\n", a.Name, a.Size, a.RoomID, a.Ref, a.Digest)
		return nil
	case "fetch":
		var f rooms.File
		if err := e.roomDo(ctx, cmd, false, &f); err != nil {
			return err
		}
		if *out == "" {
			_, err := w.Write(f.Data)
			return err
		}
		if err := os.WriteFile(*out, f.Data, 0o600); err != nil {
			return fmt.Errorf("write %s: %w", *out, err)
		}
		fmt.Fprintf(w, "wrote %s (%d bytes, digest %s) to %s\n", f.Name, len(f.Data), f.Digest, *out)
		return nil
	case "note":
		var n rooms.Noted
		if err := e.roomDo(ctx, cmd, false, &n); err != nil {
			return err
		}
		if asJSON {
			return printJSON(w, n)
		}
		fmt.Fprintf(w, "noted %s: %s (%d note(s) on this file)\n", n.Digest, n.Note.Verdict, n.NotesOnFile)
		return nil
	case "notes":
		var notes []rooms.Note
		if err := e.roomDo(ctx, cmd, false, &notes); err != nil {
			return err
		}
		if asJSON {
			return printJSON(w, notes)
		}
		if len(notes) == 0 {
			fmt.Fprintln(w, "no notes")
		}
		for _, n := range notes {
			fmt.Fprintf(w, "%s  %s  by %s at %s\n", n.Digest, n.Verdict, n.By, n.At)
			if n.Reason != "" {
				// The reason is the noting member's text.
				for _, line := range strings.Split(protocol.Fence(n.Reason), "\n") {
					fmt.Fprintf(w, "    | %s\n", line)
				}
			}
		}
		return nil
	case "dossier":
		var d rooms.Dossier
		if err := e.roomDo(ctx, cmd, false, &d); err != nil {
			return err
		}
		// Verified by the adapter that fetched it; verified again here, on
		// the bytes about to be written.
		sum, err := rooms.VerifyDossier(d.Raw)
		if err != nil {
			return fmt.Errorf("the dossier does not verify, so it was not written: %w", err)
		}
		if *out == "" {
			_, err := w.Write(append(d.Raw, '\n'))
			return err
		}
		if err := os.WriteFile(*out, append(d.Raw, '\n'), 0o600); err != nil {
			return fmt.Errorf("write %s: %w", *out, err)
		}
		fmt.Fprintf(w, "wrote the dossier of room %s to %s: %d record entries, %d files, signed by %s; it verifies\n",
			sum.RoomID, *out, sum.Entries, sum.Files, sum.SignerPub)
		return nil
	case "status":
		var st map[string]any
		if err := e.roomDo(ctx, cmd, false, &st); err != nil {
			return err
		}
		return printJSON(w, st)
	case "expel":
		var x rooms.Expelled
		if err := e.roomDo(ctx, cmd, false, &x); err != nil {
			return err
		}
		if asJSON {
			return printJSON(w, x)
		}
		fmt.Fprintf(w, "expelled agent %s from room %s (%s)\n", x.Member, x.RoomID, x.Severity)
		return nil
	case "leave":
		if err := e.roomDo(ctx, cmd, false, nil); err != nil {
			return err
		}
		fmt.Fprintf(w, "left room %s\n", cmd.Room)
		return nil
	}
	return usageError("unknown room action %q", cmd.Verb)
}

func describeHeld(h rooms.Held) string {
	parts := []string{}
	if h.Name != "" {
		parts = append(parts, fmt.Sprintf("%q", h.Name))
	}
	parts = append(parts, h.Privacy)
	if h.Durable {
		parts = append(parts, "durable")
	} else {
		parts = append(parts, "ephemeral")
	}
	return strings.Join(parts, ", ")
}

// printPage prints a record page; members' words are fenced and marked as
// theirs, like inbox messages.
func printPage(w io.Writer, p rooms.Page) {
	if len(p.Messages) == 0 {
		fmt.Fprintln(w, "no messages")
	}
	for _, m := range p.Messages {
		fmt.Fprintf(w, "#%d  %s  %s  %s\n", m.Seq, m.TS, m.From, describeMessage(m))
		if m.Type == "say" {
			body, _ := m.Payload["body"].(string)
			for _, line := range strings.Split(protocol.Fence(body), "\n") {
				fmt.Fprintf(w, "    | %s\n", line)
			}
		}
	}
	if p.Unreadable > 0 {
		fmt.Fprintf(w, "(%d recorded message(s) did not verify and are not shown)\n", p.Unreadable)
	}
	if !p.Done {
		fmt.Fprintf(w, "(more: --from %d)\n", p.NextSeq)
	}
}

// describeMessage is one line about a room message. Strings from the
// payload are members' text: they are fenced to one line.
func describeMessage(m rooms.Message) string {
	str := func(k string) string {
		s, _ := m.Payload[k].(string)
		return protocol.Fence(strings.ReplaceAll(s, "\n", " "))
	}
	switch m.Type {
	case "genesis":
		return "created the room"
	case "join":
		if h := str("handle"); h != "" {
			return "joined (says its handle is " + h + ")"
		}
		return "joined"
	case "leave":
		return "left"
	case "say":
		ch := str("channel")
		if r := str("in_reply_to"); r != "" {
			return "said on " + ch + ", in reply to " + r + ":"
		}
		return "said on " + ch + ":"
	case "artifact":
		return fmt.Sprintf("attached %s (ref %s, digest %s)", str("name"), str("ref"), str("digest"))
	case "expel":
		return "expelled " + str("member") + " (" + str("severity") + ")"
	case "close":
		return "closed the room"
	case "":
		return "(a message without a type)"
	}
	if strings.HasPrefix(m.Type, "board.") {
		// A board event, signed by the board service: {type, item}.
		it, _ := m.Payload["item"].(map[string]any)
		id, _ := it["item_id"].(string)
		title, _ := it["title"].(string)
		by := ""
		switch m.Type {
		case "board.claimed":
			by, _ = it["claimed_by"].(string)
			by = " by " + by
		case "board.posted":
			by, _ = it["posted_by"].(string)
			by = " by " + by
		}
		return fmt.Sprintf("work board: item %s %s%s: %s", protocol.Fence(id), strings.TrimPrefix(m.Type, "board."), by,
			protocol.Fence(strings.ReplaceAll(title, "\n", " ")))
	}
	return str("type") + " " + compactJSON(m.Payload)
}

func compactJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return protocol.Fence(string(b))
}

// roomList prints the rooms this agent holds, from the state directory.
func roomList(e *Env, asJSON bool) error {
	dir, err := e.openState()
	if err != nil {
		return err
	}
	held, err := rooms.OpenStore(dir.File(rooms.StoreFile), nil).List()
	if err != nil {
		return err
	}
	if asJSON {
		type item struct {
			RoomID    string `json:"room_id"`
			Name      string `json:"name,omitempty"`
			Privacy   string `json:"privacy"`
			Durable   bool   `json:"durable"`
			Role      string `json:"role"`
			InvitedBy string `json:"invited_by,omitempty"`
			Note      string `json:"note,omitempty"`
			Joined    bool   `json:"joined"`
			AddedAt   string `json:"added_at"`
			Token     string `json:"token"`
		}
		out := make([]item, 0, len(held))
		for _, h := range held {
			it := item{RoomID: h.RoomID, Name: h.Name, Privacy: h.Privacy, Durable: h.Durable, Role: h.Role, InvitedBy: h.InvitedBy,
				Note: h.Note, Joined: h.Joined, AddedAt: h.AddedAt}
			if r, err := h.Room(); err == nil {
				it.Token = r.Token()
			}
			out = append(out, it)
		}
		return printJSON(e.Stdout, out)
	}
	if len(held) == 0 {
		fmt.Fprintln(e.Stdout, "no rooms (create one with `mesh-adapter room create`, or wait for an invite)")
		return nil
	}
	for _, h := range held {
		fmt.Fprintf(e.Stdout, "%s  %s  (%s)\n", h.RoomID, describeHeld(h), h.Role)
		if h.InvitedBy != "" {
			fmt.Fprintf(e.Stdout, "    invited by agent %s at %s\n", h.InvitedBy, h.AddedAt)
		}
		if h.Note != "" {
			for _, line := range strings.Split(protocol.Fence(h.Note), "\n") {
				fmt.Fprintf(e.Stdout, "    | %s\n", line)
			}
		}
	}
	return nil
}

func roomForget(e *Env, ref string) error {
	dir, err := e.openState()
	if err != nil {
		return err
	}
	// The running adapter shares the file: every write is whole, and each
	// change reads the file afresh.
	st := rooms.OpenStore(dir.File(rooms.StoreFile), nil)
	h, err := st.Get(ref)
	if err != nil {
		return err
	}
	if _, err := st.Forget(h.RoomID); err != nil {
		return err
	}
	fmt.Fprintf(e.Stdout, "forgot room %s (nothing was sent; `room leave` tells the room)\n", h.RoomID)
	return nil
}

// roomVerify verifies a dossier file offline.
func roomVerify(e *Env, path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	sum, err := rooms.VerifyDossier(b)
	if err != nil {
		return fmt.Errorf("%s does not verify: %s", path, oneLine(err))
	}
	fmt.Fprintf(e.Stdout, "%s verifies: the dossier of room %s (%d record entries, %d files), signed by %s\n", path, sum.RoomID, sum.Entries, sum.Files, sum.SignerPub)
	return nil
}

func oneLine(err error) string {
	var e *errs.Error
	if errors.As(err, &e) {
		return e.Message
	}
	return err.Error()
}

func runBoard(ctx context.Context, e *Env, args []string) error {
	const verbs = "post, list, claim, complete, abandon or withdraw"
	sub, args, err := subcommand(args, verbs)
	if err != nil {
		return err
	}
	fs := flag.NewFlagSet("board "+sub, flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON")
	var (
		detail, offering, note *string
		lease                  *time.Duration
		artifacts              multiFlag
	)
	want := 2
	switch sub {
	case "post":
		detail = fs.String("detail", "", "what the work is")
		offering = fs.String("offering", "", "the offering the work calls for")
		lease = fs.Duration("lease", 0, "how long a claim holds (1h)")
	case "list":
		want = 1
	case "claim":
		lease = fs.Duration("lease", 0, "how long the claim holds (1h)")
	case "complete":
		note = fs.String("note", "", "what was done")
		fs.Var(&artifacts, "artifact", "a drive ref of the result (repeatable)")
	case "abandon", "withdraw":
	default:
		return usageError("unknown board action %q: say %s", sub, verbs)
	}
	pos, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != want {
		return usageError("board %s takes %d argument(s), not %d (see `mesh-adapter help board`)", sub, want, len(pos))
	}
	cmd := rooms.Command{Verb: "board." + sub, Room: pos[0]}
	if lease != nil {
		if *lease < 0 {
			return usageError("--lease must be a positive duration such as 30m or 2h")
		}
		cmd.LeaseMS = lease.Milliseconds()
	}
	switch sub {
	case "post":
		cmd.Title, cmd.Detail, cmd.Offering = pos[1], *detail, *offering
	case "complete":
		cmd.ItemID, cmd.Text, cmd.Artifacts = pos[1], *note, artifacts
	case "list":
	default:
		cmd.ItemID = pos[1]
	}
	w := e.Stdout
	if sub == "list" {
		var b rooms.Board
		if err := e.roomDo(ctx, cmd, false, &b); err != nil {
			return err
		}
		if *asJSON {
			return printJSON(w, b)
		}
		fmt.Fprintf(w, "room %s: %d open, %d claimed, %d done\n", b.RoomID, b.Open, b.Claimed, b.Done)
		for _, it := range b.Items {
			printItem(w, it)
		}
		return nil
	}
	var it rooms.Item
	if err := e.roomDo(ctx, cmd, false, &it); err != nil {
		return err
	}
	if *asJSON {
		return printJSON(w, it)
	}
	switch sub {
	case "post":
		fmt.Fprintf(w, "posted item %s\n", it.ItemID)
	case "claim":
		fmt.Fprintf(w, "claimed item %s: open your task as %s; the claim holds until %s\n", it.ItemID, it.TaskID, it.LeaseExpiresAt)
	case "complete":
		fmt.Fprintf(w, "completed item %s\n", it.ItemID)
	case "abandon":
		fmt.Fprintf(w, "abandoned item %s: it is open again\n", it.ItemID)
	case "withdraw":
		fmt.Fprintf(w, "withdrew item %s\n", it.ItemID)
	}
	return nil
}

func printItem(w io.Writer, it rooms.Item) {
	state := it.State
	if it.LeaseLapsed {
		state += " (a claim lapsed)"
	}
	fmt.Fprintf(w, "%s  %s  posted by %s\n    | %s\n", it.ItemID, state, it.PostedBy, protocol.Fence(it.Title))
	if it.ClaimedBy != "" && it.State == "claimed" {
		fmt.Fprintf(w, "    held by %s until %s (task %s)\n", it.ClaimedBy, it.LeaseExpiresAt, it.TaskID)
	}
	if it.State == "done" && it.ResultNote != "" {
		fmt.Fprintf(w, "    done: %s\n", protocol.Fence(it.ResultNote))
	}
}

// multiFlag collects a repeated flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(s string) error { *m = append(*m, s); return nil }
