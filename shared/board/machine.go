package board

import (
	"time"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// The state machine of spec §3.5, as pure steps on the stored item: each
// takes the item as read (never nil) and the caller, and returns the item
// to store (nil to remove it) and the item to answer and announce, or
// bus.ErrNoChange to answer the item as it is, or a refusal. The worker
// runs each inside one compare-and-set on the item's key.

// lapsed reports whether it is a claim whose lease has ended at now.
func lapsed(it *Item, now time.Time) bool {
	if it.State != StateClaimed {
		return false
	}
	end, err := protocol.ParseTime(it.LeaseExpiresAt)
	return err != nil || !now.Before(end)
}

// view is the item as answered at now: a lapsed claim shows as open with
// lease_lapsed.
func view(it *Item, now time.Time) *Item {
	v := *it
	if lapsed(it, now) {
		v.State, v.LeaseLapsed = StateOpen, true
	}
	return &v
}

// gone reports whether a stored item is past its retention: a done item
// older than retention is neither listed nor answered.
func gone(it *Item, now time.Time, retention time.Duration) bool {
	if it.State != StateDone {
		return false
	}
	at, err := protocol.ParseTime(it.DoneAt)
	return err == nil && now.Sub(at) >= retention
}

// claim takes the item for from under a lease of lease, minting taskID.
// An open item or a lapsed claim is taken (the lapsed claim goes to the
// history as expired); the live claimer claiming again gets the item as it
// is; anyone else is BOARD_ITEM_TAKEN naming the holder and the lease end.
func claim(cur *Item, from string, now time.Time, lease time.Duration, taskID string) (*Item, error) {
	switch {
	case cur.State == StateDone:
		return nil, takenDone(cur)
	case cur.State == StateClaimed && !lapsed(cur, now) && cur.ClaimedBy == from:
		return nil, bus.ErrNoChange
	case cur.State == StateClaimed && !lapsed(cur, now):
		return nil, taken(cur, "list the board and pick another item")
	}
	next := cur.clone()
	if cur.State == StateClaimed {
		next.addClaim(Claim{By: cur.ClaimedBy, At: cur.LeaseExpiresAt, Outcome: OutcomeExpired})
	}
	next.State = StateClaimed
	next.ClaimedBy, next.ClaimedAt = from, protocol.FormatTime(now)
	next.LeaseExpiresAt = protocol.FormatTime(now.Add(lease))
	next.TaskID = taskID
	return next, nil
}

// complete ends the caller's claim as done, live or lapsed (a lapsed claim
// nobody took over may still complete). The claimer completing again gets
// the item as it is.
func complete(cur *Item, from string, now time.Time, note string, artifacts []string) (*Item, error) {
	switch {
	case cur.State == StateDone && cur.ClaimedBy == from:
		return nil, bus.ErrNoChange
	case cur.State != StateClaimed || cur.ClaimedBy != from:
		return nil, notHolder(cur, now, "complete")
	}
	next := cur.clone()
	next.State = StateDone
	next.DoneAt = protocol.FormatTime(now)
	next.LeaseExpiresAt = ""
	next.ResultNote, next.Artifacts = note, artifacts
	next.addClaim(Claim{By: from, At: next.DoneAt, Outcome: OutcomeDone})
	return next, nil
}

// abandon gives the caller's claim back: the item is open again.
func abandon(cur *Item, from string, now time.Time) (*Item, error) {
	switch {
	case cur.State == StateDone:
		return nil, errs.Newf(errs.InputInvalid, "item %s is done; only a claimed item can be abandoned", cur.ItemID).
			WithDetails(map[string]any{"item_id": cur.ItemID, "state": StateDone})
	case cur.State != StateClaimed || cur.ClaimedBy != from:
		return nil, notHolder(cur, now, "abandon")
	}
	next := cur.clone()
	next.addClaim(Claim{By: from, At: protocol.FormatTime(now), Outcome: OutcomeAbandoned})
	next.State = StateOpen
	next.clearClaim()
	return next, nil
}

// withdraw is the poster taking back an item nobody holds: it returns the
// item as withdrawn, which the worker answers while removing the key. A
// live claim is never pulled (BOARD_ITEM_TAKEN); a lapsed one is no claim
// and goes to the history as expired.
func withdraw(cur *Item, from string, now time.Time) (*Item, error) {
	switch {
	case cur.PostedBy != from:
		return nil, errs.Newf(errs.IdentityMismatch, "item %s was posted by %s; only its poster may withdraw it", cur.ItemID, cur.PostedBy).
			WithDetails(map[string]any{"item_id": cur.ItemID, "posted_by": cur.PostedBy})
	case cur.State == StateDone:
		return nil, takenDone(cur)
	case cur.State == StateClaimed && !lapsed(cur, now):
		return nil, taken(cur, "a claimed item is withdrawn only once its claim is abandoned or lapses")
	}
	next := cur.clone()
	if cur.State == StateClaimed {
		next.addClaim(Claim{By: cur.ClaimedBy, At: cur.LeaseExpiresAt, Outcome: OutcomeExpired})
		next.clearClaim()
	}
	next.State = StateWithdrawn
	return next, nil
}

// taken is BOARD_ITEM_TAKEN for an item under a live claim, naming the
// holder and the lease's end, then what to do.
func taken(cur *Item, todo string) *errs.Error {
	return errs.Newf(errs.BoardItemTaken, "item %s is claimed by %s until %s; %s", cur.ItemID, cur.ClaimedBy, cur.LeaseExpiresAt, todo).
		WithDetails(map[string]any{"item_id": cur.ItemID, "state": StateClaimed, "claimed_by": cur.ClaimedBy,
			"lease_expires_at": cur.LeaseExpiresAt})
}

// takenDone is BOARD_ITEM_TAKEN for an item already done.
func takenDone(cur *Item) *errs.Error {
	return errs.Newf(errs.BoardItemTaken, "item %s was done by %s at %s; list the board and pick another item", cur.ItemID, cur.ClaimedBy, cur.DoneAt).
		WithDetails(map[string]any{"item_id": cur.ItemID, "state": StateDone, "claimed_by": cur.ClaimedBy, "done_at": cur.DoneAt})
}

// notHolder is IDENTITY_MISMATCH for a verb only the item's claimer may
// use, called by someone who does not hold its claim.
func notHolder(cur *Item, now time.Time, verb string) *errs.Error {
	d := map[string]any{"item_id": cur.ItemID, "state": view(cur, now).State}
	if cur.ClaimedBy != "" {
		d["claimed_by"] = cur.ClaimedBy
	}
	var e *errs.Error
	switch cur.State {
	case StateClaimed:
		e = errs.Newf(errs.IdentityMismatch, "item %s is claimed by %s, not by you; only its claimer may %s it", cur.ItemID, cur.ClaimedBy, verb)
	case StateDone:
		e = errs.Newf(errs.IdentityMismatch, "item %s was done by %s, not by you", cur.ItemID, cur.ClaimedBy)
	default:
		e = errs.Newf(errs.IdentityMismatch, "item %s is not claimed; claim it before you %s it", cur.ItemID, verb)
	}
	return e.WithDetails(d)
}
