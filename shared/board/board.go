// Package board is the work board of durable rooms (spec §2.8, §3.5, §4.3
// "Work board", §6; upstream-notes §8): members post items, one member
// claims an item under a lease and completes or abandons it, the poster may
// withdraw it while nobody holds it.
//
// Items are keys board.<room_id>.<item_id> of the rooms' bucket mesh_rooms
// (package rooms), item ids UUIDv7 so that key order is age order. Every
// state change is one compare-and-set on the item's key, so however many
// copies of the worker run, a contested claim has exactly one winner, and
// only the copy whose write won publishes the board event. Lease expiry is
// never written: it is derived on read from the clock.
package board

import (
	"slices"
	"time"

	"agentmesh.dev/mesh/shared/ratelimit"
	"agentmesh.dev/mesh/shared/rooms"
)

// Name is the worker's name (micro service mesh-board, queue group
// bus.QueueGroup(Name)).
const Name = "board"

// States of an item. A claim whose lease has lapsed is stored as claimed
// and shown as open with lease_lapsed (Item.LeaseLapsed). An item is only
// ever withdrawn in the answer to withdraw and in its event: withdrawing
// removes the key.
const (
	StateOpen      = "open"
	StateClaimed   = "claimed"
	StateDone      = "done"
	StateWithdrawn = "withdrawn"
)

// Outcomes of a claim in an item's history.
const (
	OutcomeExpired   = "expired"   // its lease lapsed and another claim took the item
	OutcomeAbandoned = "abandoned" // its claimer gave it back
	OutcomeDone      = "done"      // its claimer completed the item
)

// Event types of the board events (spec §6), published on the room's own
// traffic as the payload type of a signed emit (Event).
const (
	EventPosted    = "board.posted"
	EventClaimed   = "board.claimed"
	EventDone      = "board.done"
	EventAbandoned = "board.abandoned"
	EventWithdrawn = "board.withdrawn"
)

// Item is one work-board item, as stored and as answered (upstream-notes
// §8). Times are the protocol's form (protocol.FormatTime).
type Item struct {
	ItemID   string `json:"item_id"`
	RoomID   string `json:"room_id"`
	Title    string `json:"title"`
	Detail   string `json:"detail,omitempty"`
	Offering string `json:"offering,omitempty"`
	PostedBy string `json:"posted_by"`
	PostedAt string `json:"posted_at"`
	// LeaseMS is the lease a claim gets unless the claimer asks for
	// another: the poster's lease_ms, or the default.
	LeaseMS int64  `json:"lease_ms"`
	State   string `json:"state"`
	// The current claim, or the claim that completed the item. A lapsed
	// claim keeps them (its claimer may still complete while nobody
	// re-claims) and is shown with LeaseLapsed.
	ClaimedBy      string `json:"claimed_by,omitempty"`
	ClaimedAt      string `json:"claimed_at,omitempty"`
	LeaseExpiresAt string `json:"lease_expires_at,omitempty"`
	TaskID         string `json:"task_id,omitempty"`
	DoneAt         string `json:"done_at,omitempty"`
	ResultNote     string `json:"result_note,omitempty"`
	// Artifacts are the artifact refs the claimer completed with.
	Artifacts []string `json:"artifacts,omitempty"`
	// Claims is the history of ended claims, oldest first (the newest
	// MaxClaimHistory).
	Claims []Claim `json:"claims,omitempty"`
	// LeaseLapsed is set on read, never stored: the item is claimed but
	// its lease has ended, so it shows as open and may be claimed again.
	LeaseLapsed bool `json:"lease_lapsed,omitempty"`
}

// Claim is one ended claim in an item's history. At is when it ended: the
// lease's end for an expired claim, the abandon or the completion
// otherwise.
type Claim struct {
	By      string `json:"by"`
	At      string `json:"at"`
	Outcome string `json:"outcome"`
}

// MaxClaimHistory bounds an item's claim history; the oldest entries go.
const MaxClaimHistory = 20

// clone is a copy of it that shares no slice with it.
func (it *Item) clone() *Item {
	c := *it
	c.Artifacts = slices.Clone(it.Artifacts)
	c.Claims = slices.Clone(it.Claims)
	return &c
}

// addClaim appends one ended claim to the history, dropping the oldest past
// MaxClaimHistory.
func (it *Item) addClaim(c Claim) {
	it.Claims = append(it.Claims, c)
	if n := len(it.Claims); n > MaxClaimHistory {
		it.Claims = slices.Clone(it.Claims[n-MaxClaimHistory:])
	}
}

// clearClaim forgets the current claim.
func (it *Item) clearClaim() {
	it.ClaimedBy, it.ClaimedAt, it.LeaseExpiresAt, it.TaskID = "", "", "", ""
}

// Event is the payload of a board event: an emit by the services key, with
// context_id the room's id, on the room's first channel
// (protocol.RoomEventSubject, or protocol.ACLRoomSubject in an acl room).
// Item is the item as the operation left it (state withdrawn for a
// withdraw).
type Event struct {
	Type string `json:"type"`
	Item *Item  `json:"item"`
}

// Limits of the board. The zero value of a member takes its default.
type Limits struct {
	// LeaseDefault is a claim's lease when neither the poster nor the
	// claimer names one: 1 hour.
	LeaseDefault time.Duration
	// LeaseMax clamps every lease asked for: 24 hours. A lease asked
	// longer is granted this long, not refused.
	LeaseMax time.Duration
	// OpenItems bounds the open and claimed items of one room's board:
	// 500. A post past it is QUOTA_EXCEEDED.
	OpenItems int
	// Items bounds every item one room's board keeps, done ones included:
	// 2,000.
	Items int
	// DoneRetention is how long a done item stays on the board: 7 days.
	// After it the item is no longer listed or answered, and the next post
	// in its room removes it.
	DoneRetention time.Duration
}

// Default limits.
const (
	DefaultLeaseDefault  = time.Hour
	DefaultLeaseMax      = 24 * time.Hour
	DefaultOpenItems     = 500
	DefaultItems         = 2000
	DefaultDoneRetention = 7 * 24 * time.Hour
)

// MinLease is the shortest lease a poster or claimer may ask for.
const MinLease = time.Minute

// Text limits of a post and a completion, in characters (runes).
const (
	MaxTitle     = 200
	MaxDetail    = 4000
	MaxNote      = 4000
	MaxArtifacts = 32  // refs on one completion
	MaxRef       = 512 // bytes of one artifact ref
)

// DefaultLimits are the limits of the reference deployment.
var DefaultLimits = Limits{LeaseDefault: DefaultLeaseDefault, LeaseMax: DefaultLeaseMax,
	OpenItems: DefaultOpenItems, Items: DefaultItems, DoneRetention: DefaultDoneRetention}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits
	if l.LeaseMax > 0 {
		d.LeaseMax = max(l.LeaseMax, MinLease)
	}
	if l.LeaseDefault > 0 {
		d.LeaseDefault = max(l.LeaseDefault, MinLease)
	}
	d.LeaseDefault = min(d.LeaseDefault, d.LeaseMax)
	if l.OpenItems > 0 {
		d.OpenItems = l.OpenItems
	}
	if l.Items > 0 {
		d.Items = l.Items
	}
	if l.DoneRetention > 0 {
		d.DoneRetention = l.DoneRetention
	}
	return d
}

// Knobs are the board's operator settings, as flags and MESH_* variables of
// board-worker.
func (l *Limits) Knobs() []ratelimit.Knob {
	return []ratelimit.Knob{
		ratelimit.DurationKnob("limit-board-lease-max", "longest lease a board claim gets; a longer one asked for is clamped to it", MinLease, &l.LeaseMax),
		ratelimit.DurationKnob("limit-board-lease-default", "lease of a board claim when neither poster nor claimer names one (at most the maximum)", MinLease, &l.LeaseDefault),
		ratelimit.CountKnob("limit-board-open-items", "open and claimed items one room's board holds; past it a post is refused", 1, &l.OpenItems),
		ratelimit.CountKnob("limit-board-items", "items one room's board keeps, done ones included; past it a post is refused", 1, &l.Items),
		ratelimit.DurationKnob("limit-board-done-retention", "how long a done item stays on its board", time.Hour, &l.DoneRetention),
	}
}

// Config configures the board worker.
type Config struct {
	// Replicas of the mesh_rooms bucket (bus.Replicas: 0 is 1), which the
	// board shares with the rooms worker (rooms.BucketConfig).
	Replicas int
	Limits   Limits
}

// key is an item's key in the rooms' bucket.
func key(roomID, itemID string) string { return rooms.BoardKey(roomID, itemID) }
