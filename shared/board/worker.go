package board

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/ratelimit"
	"agentmesh.dev/mesh/shared/rooms"
)

// Worker is one running copy of the board worker.
type Worker struct {
	svc    *bus.Service
	kv     jetstream.KeyValue
	limits Limits
	// gate admits calls (rooms.Access) and records the holders of
	// capability and sealed rooms, whose messages the record then takes.
	gate *rooms.Gate

	stopOnce sync.Once
	stopErr  error
}

// Start runs one copy of the board worker in env: binds the rooms' bucket
// (created here if the rooms worker has not yet) and serves the six verbs
// of protocol.BoardVerbs.
func Start(ctx context.Context, env bus.Env, cfg Config) (*Worker, error) {
	svc, err := bus.NewServiceIn(env, Name, "work board of durable rooms: post, list, claim, complete, abandon, withdraw")
	if err != nil {
		return nil, err
	}
	w := &Worker{svc: svc, limits: cfg.Limits.withDefaults()}
	fail := func(err error) (*Worker, error) {
		_ = w.Stop()
		return nil, err
	}
	if w.kv, err = bus.Bucket(ctx, svc.JS, rooms.BucketConfig(cfg.Replicas)); err != nil {
		return fail(err)
	}
	w.gate = rooms.NewGate(w.kv, svc.NC, svc.Now)
	for verb, h := range map[string]func(context.Context, *call) (any, error){
		VerbPost: w.post, VerbList: w.list, VerbClaim: w.claim,
		VerbComplete: w.complete, VerbAbandon: w.abandon, VerbWithdraw: w.withdraw,
	} {
		if err := svc.Endpoint(verb, protocol.BoardVerbSubject(verb), w.handler(verb, h)); err != nil {
			return fail(fmt.Errorf("%s: endpoint %s: %w", Name, verb, err))
		}
	}
	if err := env.NC.Flush(); err != nil {
		return fail(fmt.Errorf("%s: flush: %w", Name, err))
	}
	return w, nil
}

// Stop ends the copy; safe to call more than once.
func (w *Worker) Stop() error {
	w.stopOnce.Do(func() { w.stopErr = w.svc.Stop() })
	return w.stopErr
}

// now is the worker's clock, to the millisecond the protocol's times carry.
func (w *Worker) now() time.Time { return w.svc.Now().UTC().Truncate(time.Millisecond) }

// call is one verified, admitted call: the caller, its payload and the room
// it names, as stored (its grade and channels are the stored room's, never
// those of the call's copy of the descriptor).
type call struct {
	from string
	req  *request
	room *rooms.Room
}

// handler decodes and checks a call to verb, then admits it to the room
// (rooms.Access: the descriptor verifies, the room is durable and
// provisioned, the caller is a member; a holder of a capability or sealed
// room's descriptor is recorded as one) before h runs.
func (w *Worker) handler(verb string, h func(context.Context, *call) (any, error)) bus.Handler {
	return func(ctx context.Context, r *bus.Request) (any, error) {
		if r.Env.Type != protocol.TypeRequest && (verb != VerbList || r.Env.Type != protocol.TypeDiscover) {
			return nil, errs.Newf(errs.InvalidEnvelope, "%s takes a request envelope, not %s", r.Subject, r.Env.Type)
		}
		req, err := decodeRequest(verb, r.Env.Payload)
		if err != nil {
			return nil, err
		}
		_, room, err := w.gate.Access(ctx, req.Descriptor, r.Env.From)
		if err != nil {
			return nil, err
		}
		return h(ctx, &call{from: r.Env.From, req: req, room: room})
	}
}

// lease is the lease of a claim or post that asked for ms (0: none),
// clamped to the operator's maximum; def when none was asked for.
func (w *Worker) lease(ms int64, def time.Duration) time.Duration {
	if ms == 0 {
		return min(def, w.limits.LeaseMax)
	}
	if ms >= w.limits.LeaseMax.Milliseconds() {
		return w.limits.LeaseMax
	}
	return time.Duration(ms) * time.Millisecond
}

// post puts a new open item on the room's board.
func (w *Worker) post(ctx context.Context, c *call) (any, error) {
	room := c.room.ID
	now := w.now()
	stored, err := w.scan(ctx, room)
	if err != nil {
		return nil, err
	}
	live, all := 0, 0
	for _, e := range stored {
		if gone(e.item, now, w.limits.DoneRetention) {
			w.prune(ctx, room, e)
			continue
		}
		if all++; e.item.State != StateDone {
			live++
		}
	}
	// Several posts at once may each see room for one more: the caps are
	// exact for one poster at a time, and over by at most the posts that
	// raced.
	switch {
	case live >= w.limits.OpenItems:
		return nil, errs.Newf(errs.QuotaExceeded, "the board of room %s has %d open or claimed items, its limit; complete or withdraw some first", room, live).
			WithDetails(map[string]any{"limit": "board_open_items", "max": w.limits.OpenItems})
	case all >= w.limits.Items:
		return nil, errs.Newf(errs.QuotaExceeded, "the board of room %s keeps %d items, its limit; done items leave it %s after they are done", room, all, ratelimit.FormatWindow(w.limits.DoneRetention)).
			WithDetails(map[string]any{"limit": "board_items", "max": w.limits.Items})
	}
	item := &Item{ItemID: protocol.NewID(), RoomID: room, Title: c.req.Title, Detail: c.req.Detail, Offering: c.req.Offering,
		PostedBy: c.from, PostedAt: protocol.FormatTime(now), LeaseMS: w.lease(c.req.LeaseMS, w.limits.LeaseDefault).Milliseconds(),
		State: StateOpen}
	_, _, err = bus.CAS(ctx, w.kv, key(room, item.ItemID), func(_ *Item, exists bool) (*Item, error) {
		if exists {
			return nil, fmt.Errorf("%s: item id %s already taken", Name, item.ItemID)
		}
		return item, nil
	})
	if err != nil {
		return nil, err
	}
	w.emit(c.room, EventPosted, item)
	return map[string]any{"item": item}, nil
}

// prune removes a done item past its retention, unless it changed since it
// was read; a failure leaves it for the next post.
func (w *Worker) prune(ctx context.Context, room string, e entry) {
	err := w.kv.Delete(ctx, key(room, e.item.ItemID), jetstream.LastRevision(e.rev))
	if err != nil && !bus.IsConflict(err) {
		w.svc.Log.Warn("prune a done item", "room", room, "item", e.item.ItemID, "err", err)
	}
}

func (w *Worker) claim(ctx context.Context, c *call) (any, error) {
	return w.step(ctx, c, EventClaimed, func(cur *Item, now time.Time) (*Item, error) {
		return claim(cur, c.from, now, w.lease(c.req.LeaseMS, time.Duration(cur.LeaseMS)*time.Millisecond), protocol.NewID())
	})
}

func (w *Worker) complete(ctx context.Context, c *call) (any, error) {
	return w.step(ctx, c, EventDone, func(cur *Item, now time.Time) (*Item, error) {
		return complete(cur, c.from, now, c.req.Note, c.req.Artifacts)
	})
}

func (w *Worker) abandon(ctx context.Context, c *call) (any, error) {
	return w.step(ctx, c, EventAbandoned, func(cur *Item, now time.Time) (*Item, error) {
		return abandon(cur, c.from, now)
	})
}

func (w *Worker) withdraw(ctx context.Context, c *call) (any, error) {
	return w.step(ctx, c, EventWithdrawn, func(cur *Item, now time.Time) (*Item, error) {
		return withdraw(cur, c.from, now)
	})
}

// step runs one transition of the item the call names as one
// compare-and-set, answers {item} as the transition left it (at now) and,
// when this copy's write made it, announces it as event. An item in state
// withdrawn is removed rather than stored.
func (w *Worker) step(ctx context.Context, c *call, event string, f func(cur *Item, now time.Time) (*Item, error)) (any, error) {
	room, id := c.room.ID, c.req.ItemID
	var shown *Item
	var now time.Time
	_, changed, err := bus.CAS(ctx, w.kv, key(room, id), func(cur *Item, exists bool) (*Item, error) {
		now = w.now()
		if !exists || gone(cur, now, w.limits.DoneRetention) {
			return nil, errs.Newf(errs.NotFound, "item %s is not on the board of room %s (withdrawn, long done, or never posted); list the board", id, room).
				WithDetail("item_id", id)
		}
		next, err := f(cur, now)
		switch {
		case errors.Is(err, bus.ErrNoChange):
			shown = cur
			return nil, err
		case err != nil:
			return nil, err
		}
		if shown = next; next.State == StateWithdrawn {
			return nil, nil // remove the key
		}
		return next, nil
	})
	if err != nil {
		return nil, err
	}
	shown = view(shown, now)
	if changed {
		w.emit(c.room, event, shown)
	}
	return map[string]any{"item": shown}, nil
}

// list answers {items, open, claimed, done} with lease expiry applied,
// oldest first. An answer stops before ListPageBytes of items and names the
// last item it carries in next_after; listing again with after set to it
// continues. The counts are always the whole board's.
func (w *Worker) list(ctx context.Context, c *call) (any, error) {
	stored, err := w.scan(ctx, c.room.ID)
	if err != nil {
		return nil, err
	}
	now := w.now()
	items := []*Item{}
	counts := map[string]int{}
	size := 0
	full := false
	next := ""
	for _, e := range stored {
		if gone(e.item, now, w.limits.DoneRetention) {
			continue
		}
		v := view(e.item, now)
		counts[v.State]++
		if full || v.ItemID <= c.req.After {
			continue
		}
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		if size += len(b) + 1; size > listPageBytes && len(items) > 0 {
			full, next = true, items[len(items)-1].ItemID
			continue
		}
		items = append(items, v)
	}
	out := map[string]any{"items": items, "open": counts[StateOpen], "claimed": counts[StateClaimed], "done": counts[StateDone]}
	if next != "" {
		out["next_after"] = next
	}
	return out, nil
}

// ListPageBytes bounds the items of one list answer (JSON bytes), well
// inside the bus's 1 MB message limit.
const ListPageBytes = 512 << 10

// listPageBytes is ListPageBytes, which a test lowers.
var listPageBytes = ListPageBytes

// entry is one stored item and its revision.
type entry struct {
	item *Item
	rev  uint64
}

// scan reads every item of a room's board in one pass over its keys (one
// prefix listing), oldest first: item ids are UUIDv7, so key order is age
// order, and the watch delivers keys in the order they were last written.
func (w *Worker) scan(ctx context.Context, room string) ([]entry, error) {
	watch, err := w.kv.Watch(ctx, key(room, "*"), jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("%s: list the board of %s: %w", Name, room, err)
	}
	defer func() { _ = watch.Stop() }()
	var out []entry
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%s: list the board of %s: %w", Name, room, ctx.Err())
		case e, ok := <-watch.Updates():
			if !ok {
				return nil, fmt.Errorf("%s: list the board of %s: the watch closed", Name, room)
			}
			if e == nil {
				slices.SortFunc(out, func(a, b entry) int { return strings.Compare(a.item.ItemID, b.item.ItemID) })
				return out, nil
			}
			var it Item
			if err := json.Unmarshal(e.Value(), &it); err != nil || it.ItemID == "" {
				w.svc.Log.Warn("a board item that does not decode is skipped", "key", e.Key(), "err", err)
				continue
			}
			out = append(out, entry{item: &it, rev: e.Revision()})
		}
	}
}

// emit announces a board event on the room's own traffic: a signed emit by
// the services key, context_id the room, on the stored room's first channel
// (the acl namespace for an acl room). A failure is logged: the board is
// the source of truth, the event a notice.
func (w *Worker) emit(room *rooms.Room, typ string, item *Item) {
	if len(room.Channels) == 0 {
		w.svc.Log.Warn("board event not published: the room has no channel", "room", room.ID, "event", typ)
		return
	}
	subject := protocol.RoomEventSubject(room.ID, room.Channels[0])
	if room.Privacy == rooms.GradeACL {
		subject = protocol.ACLRoomSubject(room.ID, room.Channels[0])
	}
	err := func() error {
		e, err := protocol.New(protocol.TypeEmit, w.svc.Key.Public(), Event{Type: typ, Item: item})
		if err != nil {
			return err
		}
		e.ContextID = room.ID
		if err := e.Sign(w.svc.Key); err != nil {
			return err
		}
		b, err := e.Marshal()
		if err != nil {
			return err
		}
		return w.svc.NC.Publish(subject, b)
	}()
	if err != nil {
		w.svc.Log.Warn("board event not published", "room", room.ID, "event", typ, "item", item.ItemID, "err", err)
	}
}
