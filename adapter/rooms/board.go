package rooms

import (
	"context"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/board"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// Item is a work-board item (upstream-notes §8): the board service's own
// type, so the client reads exactly what the service answers.
type Item = board.Item

// Claim is one past claim of an item (outcome expired, abandoned or done).
type Claim = board.Claim

// Board is a room's board as listed: oldest first, with counts.
type Board struct {
	RoomID  string `json:"room_id"`
	Items   []Item `json:"items"`
	Open    int    `json:"open"`
	Claimed int    `json:"claimed"`
	Done    int    `json:"done"`
}

// NewItem is what Post posts.
type NewItem struct {
	Title    string
	Detail   string
	Offering string
	// Lease is how long a claim holds (the board's default, an hour, when
	// zero; the operator may clamp it).
	Lease time.Duration
}

// maxTitle bounds a title here, before anything is sent.
const maxTitle = 200

// Post posts an open item on the room's board.
func (c *Client) Post(ctx context.Context, ref string, it NewItem) (Item, error) {
	title := strings.TrimSpace(it.Title)
	switch {
	case title == "":
		return Item{}, errs.New(errs.InputInvalid, "an item needs a title")
	case len([]rune(title)) > maxTitle:
		return Item{}, errs.Newf(errs.InputInvalid, "an item's title is at most %d characters; put the rest in --detail", maxTitle)
	case it.Lease < 0:
		return Item{}, errs.New(errs.InputInvalid, "a lease is a positive duration")
	}
	extra := map[string]any{"title": title}
	if it.Detail != "" {
		extra["detail"] = it.Detail
	}
	if it.Offering != "" {
		extra["offering"] = it.Offering
	}
	if it.Lease > 0 {
		extra["lease_ms"] = it.Lease.Milliseconds()
	}
	return c.boardItem(ctx, ref, "post", extra)
}

// maxListPages bounds the pages one List reads (each is at most 512 KiB
// of items).
const maxListPages = 16

// List lists the room's board: lease expiry applied, oldest first, every
// page of it (the board names the last item of a page in next_after).
func (c *Client) List(ctx context.Context, ref string) (Board, error) {
	_, r, err := c.room(ref)
	if err != nil {
		return Board{}, err
	}
	if err := durable(r, "board"); err != nil {
		return Board{}, err
	}
	out := Board{RoomID: r.RoomID, Items: []Item{}}
	after := ""
	for range maxListPages {
		var page struct {
			Board
			NextAfter string `json:"next_after"`
		}
		var extra map[string]any
		if after != "" {
			extra = map[string]any{"after": after}
		}
		if err := c.roomCall(ctx, protocol.BoardVerbSubject("list"), r, extra, &page); err != nil {
			return Board{}, err
		}
		out.Items = append(out.Items, page.Items...)
		out.Open, out.Claimed, out.Done = page.Open, page.Claimed, page.Done
		if page.NextAfter == "" || page.NextAfter == after {
			break
		}
		after = page.NextAfter
	}
	return out, nil
}

// ClaimItem claims an open item: exactly one claimer wins and gets the
// task_id to open its Task under; a loser gets BOARD_ITEM_TAKEN naming the
// holder and the lease end.
func (c *Client) ClaimItem(ctx context.Context, ref, itemID string, lease time.Duration) (Item, error) {
	extra := map[string]any{"item_id": itemID}
	if lease > 0 {
		extra["lease_ms"] = lease.Milliseconds()
	}
	return c.boardItem(ctx, ref, "claim", extra)
}

// Complete ends the item this agent holds: done, with an optional note and
// drive refs.
func (c *Client) Complete(ctx context.Context, ref, itemID, note string, artifacts []string) (Item, error) {
	extra := map[string]any{"item_id": itemID}
	if note != "" {
		extra["note"] = note
	}
	if len(artifacts) > 0 {
		extra["artifacts"] = artifacts
	}
	return c.boardItem(ctx, ref, "complete", extra)
}

// Abandon gives back the item this agent holds (it is open again).
func (c *Client) Abandon(ctx context.Context, ref, itemID string) (Item, error) {
	return c.boardItem(ctx, ref, "abandon", map[string]any{"item_id": itemID})
}

// Withdraw removes an unclaimed item this agent posted.
func (c *Client) Withdraw(ctx context.Context, ref, itemID string) (Item, error) {
	return c.boardItem(ctx, ref, "withdraw", map[string]any{"item_id": itemID})
}

func (c *Client) boardItem(ctx context.Context, ref, verb string, extra map[string]any) (Item, error) {
	if id, ok := extra["item_id"].(string); ok && strings.TrimSpace(id) == "" {
		return Item{}, errs.New(errs.InputInvalid, "name the item: its item_id, as `board list` shows it")
	}
	_, r, err := c.room(ref)
	if err != nil {
		return Item{}, err
	}
	if err := durable(r, "board"); err != nil {
		return Item{}, err
	}
	var out struct {
		Item Item `json:"item"`
	}
	if err := c.roomCall(ctx, protocol.BoardVerbSubject(verb), r, extra, &out); err != nil {
		return Item{}, err
	}
	return out.Item, nil
}
