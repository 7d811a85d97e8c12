package rooms

import (
	"context"
	"time"

	"agentmesh.dev/mesh/shared/errs"
)

// Command is one rooms or board verb as the adapter's command line asks
// for it, through the running adapter's control socket or a short-lived
// connection (Do runs it either way).
type Command struct {
	// Verb is create, invite, join, say, read, attach, fetch, note, notes,
	// dossier, status, expel, leave, or board.post, board.list, board.claim,
	// board.complete, board.abandon, board.withdraw.
	Verb string `json:"verb"`
	// Room names the room: id, name or token.
	Room string `json:"room,omitempty"`

	// create
	Name      string   `json:"name,omitempty"`
	Privacy   string   `json:"privacy,omitempty"`
	Ephemeral bool     `json:"ephemeral,omitempty"`
	Channels  []string `json:"channels,omitempty"`
	// invite, expel: the agent id (a handle is resolved before Do).
	To string `json:"to,omitempty"`
	// Text is the say body, the invite note, the note's reason or the
	// completion note.
	Text      string `json:"text,omitempty"`
	Channel   string `json:"channel,omitempty"`
	InReplyTo string `json:"in_reply_to,omitempty"`
	// read
	FromSeq uint64 `json:"from_seq,omitempty"`
	Limit   int    `json:"limit,omitempty"`
	// attach
	FileName  string `json:"file_name,omitempty"`
	Data      []byte `json:"data,omitempty"`
	MediaType string `json:"media_type,omitempty"`
	Version   string `json:"version,omitempty"`
	Role      string `json:"role,omitempty"`
	Origin    string `json:"origin,omitempty"`
	// fetch
	Ref string `json:"ref,omitempty"`
	// note, notes; Verdict is an expel's severity too.
	Digest  string `json:"digest,omitempty"`
	Verdict string `json:"verdict,omitempty"`
	// board
	Title     string   `json:"title,omitempty"`
	Detail    string   `json:"detail,omitempty"`
	Offering  string   `json:"offering,omitempty"`
	LeaseMS   int64    `json:"lease_ms,omitempty"`
	ItemID    string   `json:"item_id,omitempty"`
	Artifacts []string `json:"artifacts,omitempty"`
}

// Do runs one command and returns its result (the type depends on the
// verb: Held, Invited, Said, Page, Attached, File, Noted, []Note,
// Dossier, Item, Board, or the status object).
func (c *Client) Do(ctx context.Context, cmd Command) (any, error) {
	lease := time.Duration(cmd.LeaseMS) * time.Millisecond
	switch cmd.Verb {
	case "create":
		return c.Create(ctx, NewRoom{Name: cmd.Name, Privacy: cmd.Privacy, Ephemeral: cmd.Ephemeral, Channels: cmd.Channels})
	case "invite":
		return c.Invite(ctx, cmd.Room, cmd.To, cmd.Text)
	case "join":
		return c.Join(ctx, cmd.Room)
	case "say":
		return c.Say(ctx, cmd.Room, cmd.Channel, cmd.Text, cmd.InReplyTo)
	case "read":
		return c.Replay(ctx, cmd.Room, cmd.FromSeq, cmd.Limit)
	case "attach":
		return c.Attach(ctx, cmd.Room, Attach{Name: cmd.FileName, Data: cmd.Data, MediaType: cmd.MediaType, Version: cmd.Version, Role: cmd.Role, Origin: cmd.Origin})
	case "fetch":
		return c.Fetch(ctx, cmd.Room, cmd.Ref)
	case "note":
		return c.Note(ctx, cmd.Room, cmd.Digest, cmd.Verdict, cmd.Text, nil)
	case "notes":
		return c.Notes(ctx, cmd.Room, cmd.Digest)
	case "dossier":
		return c.Dossier(ctx, cmd.Room)
	case "status":
		return c.Status(ctx, cmd.Room)
	case "expel":
		return c.Expel(ctx, cmd.Room, cmd.To, cmd.Verdict, cmd.Text)
	case "leave":
		return map[string]any{"left": cmd.Room}, c.Leave(ctx, cmd.Room)
	case "board.post":
		return c.Post(ctx, cmd.Room, NewItem{Title: cmd.Title, Detail: cmd.Detail, Offering: cmd.Offering, Lease: lease})
	case "board.list":
		return c.List(ctx, cmd.Room)
	case "board.claim":
		return c.ClaimItem(ctx, cmd.Room, cmd.ItemID, lease)
	case "board.complete":
		return c.Complete(ctx, cmd.Room, cmd.ItemID, cmd.Text, cmd.Artifacts)
	case "board.abandon":
		return c.Abandon(ctx, cmd.Room, cmd.ItemID)
	case "board.withdraw":
		return c.Withdraw(ctx, cmd.Room, cmd.ItemID)
	}
	return nil, errs.Newf(errs.InputInvalid, "unknown rooms command %q", cmd.Verb)
}
