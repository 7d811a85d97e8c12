package board_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"agentmesh.dev/mesh/shared/board"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/rooms"
	"agentmesh.dev/mesh/shared/testclock"
)

// fixture is a broker with three copies of the board worker sharing a test
// clock, a client connection (every call and every event subscription of
// the test goes through it, so an event a copy publishes before answering
// is queued on its subscription before the answer arrives) and the rooms'
// bucket, where the test provisions rooms by writing their records.
type fixture struct {
	t      *testing.T
	b      *bustest.Bus
	clock  *testclock.Clock
	client *nats.Conn
	kv     jetstream.KeyValue
}

func setup(t *testing.T, cfg board.Config) *fixture {
	t.Helper()
	b := bustest.Start(t)
	f := &fixture{t: t, b: b, clock: &testclock.Clock{}, client: bustest.Client(t, b)}
	for range 3 {
		w, err := board.Start(t.Context(), bustest.Env(t, b, "board", f.clock.Now), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Stop() })
	}
	js, err := jetstream.New(f.client)
	if err != nil {
		t.Fatal(err)
	}
	if f.kv, err = js.KeyValue(t.Context(), rooms.Bucket); err != nil {
		t.Fatal(err)
	}
	return f
}

// room is a provisioned room: its descriptor and its events.
type room struct {
	id         string
	descriptor json.RawMessage
	events     *nats.Subscription
}

// room provisions a room created by creator: a signed descriptor, and for a
// durable room its record in mesh_rooms (the rooms worker's provision, as
// far as the board sees it). members are an acl room's admitted agents.
func (f *fixture) room(creator *keys.Agent, privacy string, durable bool, members ...*keys.Agent) *room {
	f.t.Helper()
	var raw [18]byte
	_, _ = rand.Read(raw[:])
	id := base64.RawURLEncoding.EncodeToString(raw[:])
	record := rooms.RecordEphemeral
	if durable {
		record = rooms.DurableRecord(id)
	}
	desc := map[string]any{"rooms": rooms.DescriptorVersion, "room_id": id, "name": "crew", "channels": []any{"main", "side"},
		"record": record, "privacy": privacy, "creator": creator.Public(), "created_at": protocol.FormatTime(time.Now())}
	sig, err := protocol.SignRoomDescriptor(desc, creator)
	if err != nil {
		f.t.Fatal(err)
	}
	desc["sig"] = sig
	d, err := json.Marshal(desc)
	if err != nil {
		f.t.Fatal(err)
	}
	if durable {
		rec := rooms.Room{ID: id, Name: "crew", Privacy: privacy, Channels: []string{"main", "side"}, Creator: creator.Public(),
			Descriptor: d, CreatedAt: time.Now(), LastActive: time.Now()}
		if privacy == rooms.GradeACL {
			rec.Members = []string{creator.Public()}
			for _, m := range members {
				rec.Members = append(rec.Members, m.Public())
			}
		}
		b, _ := json.Marshal(rec)
		if _, err := f.kv.Put(f.t.Context(), rooms.RoomKey(id), b); err != nil {
			f.t.Fatal(err)
		}
	}
	subject := protocol.RoomEventSubject(id, "*")
	if privacy == rooms.GradeACL {
		subject = protocol.ACLRoomSubject(id, "*")
	}
	sub, err := f.client.SubscribeSync(subject)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := f.client.Flush(); err != nil {
		f.t.Fatal(err)
	}
	return &room{id: id, descriptor: d, events: sub}
}

// call sends verb to the board as agent, with the room's descriptor added
// to payload, and returns the answer's payload. The request is stamped with
// the test clock, which the workers check its freshness against.
func (f *fixture) call(r *room, agent keys.Signer, verb string, payload map[string]any) (map[string]any, error) {
	f.t.Helper()
	p := map[string]any{"descriptor": r.descriptor}
	for k, v := range payload {
		p[k] = v
	}
	rep, err := f.send(agent, protocol.BoardVerbSubject(verb), protocol.TypeRequest, p)
	if err != nil {
		return nil, err
	}
	var out map[string]any
	if err := json.Unmarshal(rep.Payload, &out); err != nil {
		f.t.Fatal(err)
	}
	return out, nil
}

// send is bus.Call with the envelope's ts read from the test clock. It is
// safe to call from several goroutines.
func (f *fixture) send(agent keys.Signer, subject string, typ protocol.Type, payload any) (*protocol.Envelope, error) {
	req, err := protocol.New(typ, agent.Public(), payload)
	if err != nil {
		return nil, err
	}
	req.TS = protocol.FormatTime(f.clock.Now())
	if err := req.Sign(agent); err != nil {
		return nil, err
	}
	data, err := req.Marshal()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	msg, err := f.client.RequestWithContext(ctx, subject, data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", subject, err)
	}
	rep, err := protocol.Decode(msg.Data)
	switch {
	case err != nil:
		return nil, err
	case rep.InReplyTo != req.ID:
		return nil, fmt.Errorf("%s: an answer to another request", subject)
	case rep.From != f.b.ServicesKey().Public():
		return nil, fmt.Errorf("%s: answered by %s, not the services key", subject, rep.From)
	}
	if e := bus.ErrorOf(rep); e != nil {
		return rep, e
	}
	return rep, nil
}

// item is an answered item, typed.
func item(t *testing.T, rep map[string]any) board.Item {
	t.Helper()
	b, _ := json.Marshal(rep["item"])
	var it board.Item
	if err := json.Unmarshal(b, &it); err != nil || it.ItemID == "" {
		t.Fatalf("answer %v carries no item (%v)", rep, err)
	}
	return it
}

// must is call that must succeed, returning the item.
func (f *fixture) must(r *room, agent keys.Signer, verb string, payload map[string]any) board.Item {
	f.t.Helper()
	rep, err := f.call(r, agent, verb, payload)
	if err != nil {
		f.t.Fatalf("%s: %v", verb, err)
	}
	return item(f.t, rep)
}

func (f *fixture) post(r *room, agent keys.Signer, title string) board.Item {
	f.t.Helper()
	return f.must(r, agent, board.VerbPost, map[string]any{"title": title})
}

// event is one board event as received.
type event struct {
	env *protocol.Envelope
	board.Event
}

// events takes the events queued on the room's subscription: every event
// published before the last answer the client received (see fixture).
func (f *fixture) events(r *room) []event {
	f.t.Helper()
	n, _, err := r.events.Pending()
	if err != nil {
		f.t.Fatal(err)
	}
	var out []event
	for range n {
		msg, err := r.events.NextMsg(time.Second)
		if err != nil {
			f.t.Fatal(err)
		}
		env, err := protocol.Decode(msg.Data)
		if err != nil {
			f.t.Fatalf("event does not verify: %v", err)
		}
		if env.Type != protocol.TypeEmit || env.From != f.b.ServicesKey().Public() || env.ContextID != r.id {
			f.t.Fatalf("event %s from %s, context %q", env.Type, env.From, env.ContextID)
		}
		if !strings.HasSuffix(msg.Subject, ".main") {
			f.t.Fatalf("event on %s, not the room's first channel", msg.Subject)
		}
		var ev board.Event
		if err := json.Unmarshal(env.Payload, &ev); err != nil || ev.Item == nil {
			f.t.Fatalf("event payload %s: %v", env.Payload, err)
		}
		out = append(out, event{env: env, Event: ev})
	}
	return out
}

func wantCode(t *testing.T, err error, code errs.Code, substr string) *errs.Error {
	t.Helper()
	var e *errs.Error
	if !errors.As(err, &e) || e.Code != code || !strings.Contains(e.Message, substr) {
		t.Fatalf("error %v, want %s containing %q", err, code, substr)
	}
	return e
}

const minute = int64(time.Minute / time.Millisecond)

// The state machine of spec §3.5, every verb against every state of an
// item and every caller: the poster, the item's (last) claimer and another
// member. Each row starts from a fresh item and checks the answer, the
// item as listed afterwards, and the board events (one for a transition,
// none for a refusal or a repeat).
func TestStateMachine(t *testing.T) {
	f := setup(t, board.Config{})
	creator, poster, claimer, other := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)
	r := f.room(creator, rooms.GradeCapability, true)
	who := map[string]*keys.Agent{"poster": poster, "claimer": claimer, "other": other}

	// Each state is reached from a fresh item by the steps of its setup.
	setups := map[string]func() board.Item{
		// open: claimed once by the claimer and abandoned, so the claimer
		// is an ex-claimer with no rights left.
		"open": func() board.Item {
			it := f.post(r, poster, "open item")
			f.must(r, claimer, board.VerbClaim, map[string]any{"item_id": it.ItemID})
			return f.must(r, claimer, board.VerbAbandon, map[string]any{"item_id": it.ItemID})
		},
		"claimed": func() board.Item {
			it := f.post(r, poster, "claimed item")
			return f.must(r, claimer, board.VerbClaim, map[string]any{"item_id": it.ItemID})
		},
		"lapsed": func() board.Item {
			it := f.post(r, poster, "lapsed item")
			f.must(r, claimer, board.VerbClaim, map[string]any{"item_id": it.ItemID, "lease_ms": minute})
			f.clock.Advance(time.Minute)
			return it
		},
		"done": func() board.Item {
			it := f.post(r, poster, "done item")
			f.must(r, claimer, board.VerbClaim, map[string]any{"item_id": it.ItemID})
			return f.must(r, claimer, board.VerbComplete, map[string]any{"item_id": it.ItemID, "note": "shipped"})
		},
		"withdrawn": func() board.Item {
			it := f.post(r, poster, "withdrawn item")
			return f.must(r, poster, board.VerbWithdraw, map[string]any{"item_id": it.ItemID})
		},
	}
	type want struct {
		code  errs.Code // refused with this code; "" for success
		state string    // the state answered ("" with a code)
		event string    // the event published (transition) or ""
	}
	ok := func(state, event string) want { return want{state: state, event: event} }
	same := func(state string) want { return want{state: state} } // answered as it is
	no := func(c errs.Code) want { return want{code: c} }
	const (
		taken    = errs.BoardItemTaken
		mismatch = errs.IdentityMismatch
		notFound = errs.NotFound
	)
	table := map[string]map[string]map[string]want{ // verb → state → caller
		board.VerbClaim: {
			"open":      {"poster": ok("claimed", board.EventClaimed), "claimer": ok("claimed", board.EventClaimed), "other": ok("claimed", board.EventClaimed)},
			"claimed":   {"poster": no(taken), "claimer": same("claimed"), "other": no(taken)},
			"lapsed":    {"poster": ok("claimed", board.EventClaimed), "claimer": ok("claimed", board.EventClaimed), "other": ok("claimed", board.EventClaimed)},
			"done":      {"poster": no(taken), "claimer": no(taken), "other": no(taken)},
			"withdrawn": {"poster": no(notFound), "claimer": no(notFound), "other": no(notFound)},
		},
		board.VerbComplete: {
			"open":      {"poster": no(mismatch), "claimer": no(mismatch), "other": no(mismatch)},
			"claimed":   {"poster": no(mismatch), "claimer": ok("done", board.EventDone), "other": no(mismatch)},
			"lapsed":    {"poster": no(mismatch), "claimer": ok("done", board.EventDone), "other": no(mismatch)},
			"done":      {"poster": no(mismatch), "claimer": same("done"), "other": no(mismatch)},
			"withdrawn": {"poster": no(notFound), "claimer": no(notFound), "other": no(notFound)},
		},
		board.VerbAbandon: {
			"open":      {"poster": no(mismatch), "claimer": no(mismatch), "other": no(mismatch)},
			"claimed":   {"poster": no(mismatch), "claimer": ok("open", board.EventAbandoned), "other": no(mismatch)},
			"lapsed":    {"poster": no(mismatch), "claimer": ok("open", board.EventAbandoned), "other": no(mismatch)},
			"done":      {"poster": no(errs.InputInvalid), "claimer": no(errs.InputInvalid), "other": no(errs.InputInvalid)},
			"withdrawn": {"poster": no(notFound), "claimer": no(notFound), "other": no(notFound)},
		},
		board.VerbWithdraw: {
			"open":      {"poster": ok("withdrawn", board.EventWithdrawn), "claimer": no(mismatch), "other": no(mismatch)},
			"claimed":   {"poster": no(taken), "claimer": no(mismatch), "other": no(mismatch)},
			"lapsed":    {"poster": ok("withdrawn", board.EventWithdrawn), "claimer": no(mismatch), "other": no(mismatch)},
			"done":      {"poster": no(taken), "claimer": no(mismatch), "other": no(mismatch)},
			"withdrawn": {"poster": no(notFound), "claimer": no(notFound), "other": no(notFound)},
		},
	}
	rows := 0
	for _, verb := range []string{board.VerbClaim, board.VerbComplete, board.VerbAbandon, board.VerbWithdraw} {
		for _, state := range []string{"open", "claimed", "lapsed", "done", "withdrawn"} {
			for _, caller := range []string{"poster", "claimer", "other"} {
				w := table[verb][state][caller]
				t.Run(verb+"/"+state+"/"+caller, func(t *testing.T) {
					f.t = t
					rows++
					before := setups[state]()
					f.events(r) // the setup's own events
					rep, err := f.call(r, who[caller], verb, map[string]any{"item_id": before.ItemID})
					evs := f.events(r)
					if w.code != "" {
						wantCode(t, err, w.code, before.ItemID)
						if len(evs) != 0 {
							t.Fatalf("a refused %s published %d events", verb, len(evs))
						}
						return
					}
					if err != nil {
						t.Fatalf("%s: %v", verb, err)
					}
					got := item(t, rep)
					if got.State != w.state || got.ItemID != before.ItemID || got.PostedBy != poster.Public() || got.LeaseLapsed {
						t.Fatalf("answered %+v, want state %s", got, w.state)
					}
					switch {
					case w.event == "" && len(evs) != 0:
						t.Fatalf("a repeat %s published %+v", verb, evs[0].Event)
					case w.event != "" && (len(evs) != 1 || evs[0].Type != w.event || evs[0].Item.State != w.state || evs[0].Item.ItemID != got.ItemID):
						t.Fatalf("events %+v, want one %s", evs, w.event)
					}
					checkTransition(t, verb, state, who[caller].Public(), claimer.Public(), before, got)
					// The board lists what was answered (a withdrawn item not at all).
					listed := f.listed(r, claimer)[got.ItemID]
					if (w.state == board.StateWithdrawn) != (listed == nil) || (listed != nil && listed.State != got.State) {
						t.Fatalf("listed as %+v after %s", listed, verb)
					}
				})
			}
		}
	}
	f.t = t
	if rows != 4*5*3 {
		t.Fatalf("%d rows run", rows)
	}
}

// checkTransition checks what a transition by caller recorded on the item;
// claimer is who held the claim before.
func checkTransition(t *testing.T, verb, state, caller, claimer string, before, got board.Item) {
	t.Helper()
	last := func() board.Claim {
		if len(got.Claims) == 0 {
			t.Fatalf("no claim history on %+v", got)
		}
		return got.Claims[len(got.Claims)-1]
	}
	switch verb {
	case board.VerbClaim:
		if got.ClaimedBy != caller || !isUUIDv7(got.TaskID) || got.LeaseExpiresAt == "" {
			t.Fatalf("claim recorded %+v", got)
		}
		if state == "lapsed" && (last().Outcome != board.OutcomeExpired || last().By != claimer) {
			t.Fatalf("the lapsed claim went to the history as %+v", last())
		}
		if state == "claimed" && got.TaskID != before.TaskID {
			t.Fatal("a repeated claim minted another task id")
		}
	case board.VerbComplete:
		if got.DoneAt == "" || got.ClaimedBy != caller || last().Outcome != board.OutcomeDone {
			t.Fatalf("complete recorded %+v", got)
		}
	case board.VerbAbandon:
		if got.ClaimedBy != "" || got.TaskID != "" || last().Outcome != board.OutcomeAbandoned || last().By != caller {
			t.Fatalf("abandon recorded %+v", got)
		}
	case board.VerbWithdraw:
		if got.ClaimedBy != "" || (state == "lapsed" && (last().Outcome != board.OutcomeExpired || last().By != claimer)) {
			t.Fatalf("withdraw recorded %+v", got)
		}
	}
}

// list is the whole board as one member lists it.
func (f *fixture) list(r *room, agent keys.Signer, payload map[string]any) (items []board.Item, counts [3]int, next string) {
	f.t.Helper()
	rep, err := f.call(r, agent, board.VerbList, payload)
	if err != nil {
		f.t.Fatalf("list: %v", err)
	}
	b, _ := json.Marshal(rep["items"])
	if err := json.Unmarshal(b, &items); err != nil || items == nil {
		f.t.Fatalf("list answer %v (%v)", rep, err)
	}
	for i, k := range []string{"open", "claimed", "done"} {
		n, ok := rep[k].(float64)
		if !ok {
			f.t.Fatalf("list answer has no %s count: %v", k, rep)
		}
		counts[i] = int(n)
	}
	next, _ = rep["next_after"].(string)
	return items, counts, next
}

func (f *fixture) listed(r *room, agent keys.Signer) map[string]*board.Item {
	items, _, _ := f.list(r, agent, nil)
	m := map[string]*board.Item{}
	for i := range items {
		m[items[i].ItemID] = &items[i]
	}
	return m
}

// The Must-show race: three copies of the worker, twenty members claim one
// item at once. Exactly one wins and gets the task id; the nineteen others
// get BOARD_ITEM_TAKEN naming the same holder and the same lease end; the
// room sees exactly one board.claimed.
func TestClaimRace(t *testing.T) {
	f := setup(t, board.Config{})
	creator := bustest.Agent(t)
	r := f.room(creator, rooms.GradeCapability, true)
	it := f.post(r, creator, "one item, twenty takers")
	if evs := f.events(r); len(evs) != 1 || evs[0].Type != board.EventPosted {
		t.Fatalf("post events %+v", evs)
	}

	const members = 20
	type result struct {
		agent string
		rep   map[string]any
		err   error
	}
	results := make(chan result, members)
	start := make(chan struct{})
	for range members {
		a := bustest.Agent(t)
		go func() {
			<-start
			rep, err := f.send(a, protocol.BoardVerbSubject(board.VerbClaim), protocol.TypeRequest,
				map[string]any{"descriptor": r.descriptor, "item_id": it.ItemID})
			var out map[string]any
			if err == nil {
				_ = json.Unmarshal(rep.Payload, &out)
			}
			results <- result{a.Public(), out, err}
		}()
	}
	close(start)
	var winners []board.Item
	var losers []*errs.Error
	for range members {
		res := <-results
		var e *errs.Error
		switch {
		case res.err == nil:
			w := item(t, res.rep)
			if w.ClaimedBy != res.agent {
				t.Fatalf("%s won a claim recorded for %s", res.agent, w.ClaimedBy)
			}
			winners = append(winners, w)
		case errors.As(res.err, &e) && e.Code == errs.BoardItemTaken:
			losers = append(losers, e)
		default:
			t.Fatalf("claim: %v", res.err)
		}
	}
	if len(winners) != 1 || len(losers) != members-1 {
		t.Fatalf("%d winners, %d BOARD_ITEM_TAKEN", len(winners), len(losers))
	}
	f.claimsServed(members)
	win := winners[0]
	if win.State != board.StateClaimed || !isUUIDv7(win.TaskID) || win.LeaseExpiresAt == "" {
		t.Fatalf("winner's item %+v", win)
	}
	for _, e := range losers {
		if e.Details["claimed_by"] != win.ClaimedBy || e.Details["lease_expires_at"] != win.LeaseExpiresAt ||
			e.Details["item_id"] != it.ItemID || !strings.Contains(e.Message, win.ClaimedBy) || !strings.Contains(e.Message, win.LeaseExpiresAt) {
			t.Fatalf("loser told %q %v; the holder is %s until %s", e.Message, e.Details, win.ClaimedBy, win.LeaseExpiresAt)
		}
	}

	// Every answer came on the client connection after its copy published
	// whatever it published: the events are queued already.
	evs := f.events(r)
	if len(evs) != 1 || evs[0].Type != board.EventClaimed || evs[0].Item.ClaimedBy != win.ClaimedBy || evs[0].Item.TaskID != win.TaskID {
		t.Fatalf("events after the race %+v, want one board.claimed for the winner", evs)
	}
	// And nothing comes later either: a quiet while, then the next
	// operation's event is the next event.
	if msg, err := r.events.NextMsg(300 * time.Millisecond); !errors.Is(err, nats.ErrTimeout) {
		t.Fatalf("a second event after the race: %v %v", msg, err)
	}
	f.must(r, creator, board.VerbPost, map[string]any{"title": "marker"})
	if evs := f.events(r); len(evs) != 1 || evs[0].Type != board.EventPosted || evs[0].Item.Title != "marker" {
		t.Fatalf("events after the race and a post %+v", evs)
	}
	listed := f.listed(r, creator)[it.ItemID]
	if listed == nil || listed.ClaimedBy != win.ClaimedBy || listed.TaskID != win.TaskID {
		t.Fatalf("listed %+v", listed)
	}
}

// claimsServed checks that the claims were served by more than one copy,
// so that the race was between copies and not within one (the queue group
// spreads requests at random: all twenty on one copy of three is a chance
// of 3^-19).
func (f *fixture) claimsServed(n int) {
	f.t.Helper()
	inbox := nats.NewInbox()
	sub, err := f.client.SubscribeSync(inbox)
	if err != nil {
		f.t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := f.client.PublishRequest("$SRV.STATS.mesh-"+board.Name, inbox, nil); err != nil {
		f.t.Fatal(err)
	}
	total, copies := 0, 0
	for range 3 {
		msg, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			f.t.Fatalf("stats of the copies: %v", err)
		}
		var st micro.Stats
		if err := json.Unmarshal(msg.Data, &st); err != nil {
			f.t.Fatal(err)
		}
		for _, ep := range st.Endpoints {
			if ep.Name == board.VerbClaim && ep.NumRequests > 0 {
				total += ep.NumRequests
				copies++
			}
		}
	}
	if total != n || copies < 2 {
		f.t.Fatalf("%d claims served by %d copies", total, copies)
	}
}

func isUUIDv7(s string) bool {
	return len(s) == 36 && s[14] == '7' && strings.Count(s, "-") == 4
}

// Lease expiry is derived on read from the clock: a claim lists as claimed
// until its lease ends, then as open with lease_lapsed; the lapsed claimer
// may still complete until someone else claims, and the re-claim puts the
// lapsed claim in the history as expired.
func TestLeaseExpiryOnRead(t *testing.T) {
	f := setup(t, board.Config{Limits: board.Limits{LeaseMax: 2 * time.Hour}})
	creator, a, b := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)
	r := f.room(creator, rooms.GradeSealed, true)

	// Leases: the poster's lease_ms is clamped to the operator's maximum;
	// none named is the default (1 h); the claimer may ask for another.
	long := f.must(r, creator, board.VerbPost, map[string]any{"title": "long", "lease_ms": int64(10 * 24 * time.Hour / time.Millisecond)})
	if long.LeaseMS != int64(2*time.Hour/time.Millisecond) {
		t.Fatalf("a 10-day lease posted as %d ms", long.LeaseMS)
	}
	it := f.post(r, creator, "short")
	if it.LeaseMS != int64(time.Hour/time.Millisecond) || it.State != board.StateOpen {
		t.Fatalf("posted %+v", it)
	}
	c := f.must(r, a, board.VerbClaim, map[string]any{"item_id": long.ItemID, "lease_ms": int64(48 * time.Hour / time.Millisecond)})
	if lease(t, c) != 2*time.Hour {
		t.Fatalf("a 48 h claim got a lease of %s", lease(t, c))
	}
	c = f.must(r, a, board.VerbClaim, map[string]any{"item_id": it.ItemID, "lease_ms": 10 * minute})
	if lease(t, c) != 10*time.Minute {
		t.Fatalf("a 10 min claim got a lease of %s", lease(t, c))
	}

	f.clock.Advance(9 * time.Minute)
	if got := f.listed(r, b)[it.ItemID]; got.State != board.StateClaimed || got.LeaseLapsed {
		t.Fatalf("before its lease ends: %+v", got)
	}
	_, err := f.call(r, b, board.VerbClaim, map[string]any{"item_id": it.ItemID})
	wantCode(t, err, errs.BoardItemTaken, a.Public())

	f.clock.Advance(time.Minute)
	items, counts, _ := f.list(r, b, nil)
	if counts != [3]int{1, 1, 0} || len(items) != 2 {
		t.Fatalf("counts %v of %d items once the lease lapsed", counts, len(items))
	}
	got := items[1]
	if got.ItemID != it.ItemID || got.State != board.StateOpen || !got.LeaseLapsed || got.ClaimedBy != a.Public() {
		t.Fatalf("lapsed claim listed as %+v", got)
	}
	f.events(r)

	// b takes it over; a's lapsed claim is history.
	c2 := f.must(r, b, board.VerbClaim, map[string]any{"item_id": it.ItemID})
	if c2.ClaimedBy != b.Public() || c2.TaskID == c.TaskID || c2.LeaseLapsed || len(c2.Claims) != 1 ||
		c2.Claims[0] != (board.Claim{By: a.Public(), At: c.LeaseExpiresAt, Outcome: board.OutcomeExpired}) {
		t.Fatalf("re-claim %+v", c2)
	}
	_, err = f.call(r, a, board.VerbComplete, map[string]any{"item_id": it.ItemID})
	wantCode(t, err, errs.IdentityMismatch, b.Public())
	done := f.must(r, b, board.VerbComplete, map[string]any{"item_id": it.ItemID, "note": "all green", "artifacts": []string{"sha256:" + strings.Repeat("ab", 32)}})
	if done.State != board.StateDone || done.ResultNote != "all green" || len(done.Artifacts) != 1 || len(done.Claims) != 2 || done.Claims[1].Outcome != board.OutcomeDone {
		t.Fatalf("done %+v", done)
	}
	if evs := f.events(r); len(evs) != 2 || evs[0].Type != board.EventClaimed || evs[1].Type != board.EventDone {
		t.Fatalf("events %+v", evs)
	}
}

func lease(t *testing.T, it board.Item) time.Duration {
	t.Helper()
	a, err1 := protocol.ParseTime(it.ClaimedAt)
	b, err2 := protocol.ParseTime(it.LeaseExpiresAt)
	if err1 != nil || err2 != nil {
		t.Fatalf("claim times of %+v", it)
	}
	return b.Sub(a)
}

// Who may call: any holder of a capability room's descriptor; in an acl
// room only admitted members, whose events ride the acl namespace; never
// an ephemeral room, one not provisioned, or with a descriptor that is not
// the one provisioned.
func TestAccess(t *testing.T) {
	f := setup(t, board.Config{})
	creator, member, stranger := bustest.Agent(t), bustest.Agent(t), bustest.Agent(t)

	acl := f.room(creator, rooms.GradeACL, true, member)
	it := f.post(acl, member, "members only")
	if evs := f.events(acl); len(evs) != 1 || evs[0].Type != board.EventPosted {
		t.Fatalf("acl room events %+v", evs)
	}
	for _, verb := range []string{board.VerbPost, board.VerbList, board.VerbClaim, board.VerbComplete, board.VerbAbandon, board.VerbWithdraw} {
		_, err := f.call(acl, stranger, verb, map[string]any{"item_id": it.ItemID, "title": "sneak"})
		wantCode(t, err, errs.Forbidden, "not a member")
	}
	if evs := f.events(acl); len(evs) != 0 {
		t.Fatalf("refusals published %+v", evs)
	}
	if len(f.listed(acl, creator)) != 1 {
		t.Fatal("a refused post reached the board")
	}

	eph := f.room(creator, rooms.GradeCapability, false)
	_, err := f.call(eph, creator, board.VerbPost, map[string]any{"title": "t"})
	wantCode(t, err, errs.InputInvalid, "ephemeral")
	_, err = f.call(eph, creator, board.VerbList, nil)
	wantCode(t, err, errs.InputInvalid, "ephemeral")

	// A durable descriptor never provisioned (or reclaimed).
	unprovisioned := f.room(creator, rooms.GradeCapability, true)
	if err := f.kv.Delete(t.Context(), rooms.RoomKey(unprovisioned.id)); err != nil {
		t.Fatal(err)
	}
	_, err = f.call(unprovisioned, creator, board.VerbList, nil)
	wantCode(t, err, errs.NotFound, "not provisioned")

	// Another validly signed descriptor for a provisioned room's id.
	other := f.room(creator, rooms.GradeCapability, true)
	forged := *other
	var desc map[string]any
	_ = json.Unmarshal(acl.descriptor, &desc)
	desc["room_id"], desc["record"], desc["privacy"] = other.id, rooms.DurableRecord(other.id), rooms.GradeCapability
	delete(desc, "sig")
	desc["sig"], _ = protocol.SignRoomDescriptor(desc, creator)
	forged.descriptor, _ = json.Marshal(desc)
	_, err = f.call(&forged, creator, board.VerbList, nil)
	wantCode(t, err, errs.IdentityMismatch, "not the one")

	// The token form of the descriptor is as good as the object.
	token := &room{id: acl.id, descriptor: json.RawMessage(fmt.Sprintf("%q", base64.RawURLEncoding.EncodeToString(acl.descriptor)))}
	if items, _, _ := f.list(token, member, nil); len(items) != 1 {
		t.Fatalf("listed %d items with the token form", len(items))
	}
}

// Every member is checked before it is used: INPUT_INVALID with a message
// saying what is wrong.
func TestValidation(t *testing.T) {
	f := setup(t, board.Config{})
	creator := bustest.Agent(t)
	r := f.room(creator, rooms.GradeCapability, true)
	it := f.post(r, creator, "target")

	for name, c := range map[string]struct {
		verb    string
		payload map[string]any
		want    string
	}{
		"no title":          {board.VerbPost, map[string]any{}, "title is required"},
		"blank title":       {board.VerbPost, map[string]any{"title": "  \t"}, "title is required"},
		"long title":        {board.VerbPost, map[string]any{"title": strings.Repeat("é", 201)}, "at most 200"},
		"two-line title":    {board.VerbPost, map[string]any{"title": "a\nb"}, "one line"},
		"title not text":    {board.VerbPost, map[string]any{"title": 7}, "title must be a string"},
		"long detail":       {board.VerbPost, map[string]any{"title": "t", "detail": strings.Repeat("x", 4001)}, "at most 4000"},
		"bad offering":      {board.VerbPost, map[string]any{"title": "t", "offering": "a.b"}, "offering must be"},
		"short lease":       {board.VerbPost, map[string]any{"title": "t", "lease_ms": 59999}, "at least 60000"},
		"negative lease":    {board.VerbPost, map[string]any{"title": "t", "lease_ms": -1}, "at least 60000"},
		"fractional lease":  {board.VerbClaim, map[string]any{"item_id": it.ItemID, "lease_ms": 60000.5}, "whole number"},
		"lease as text":     {board.VerbClaim, map[string]any{"item_id": it.ItemID, "lease_ms": "1h"}, "whole number"},
		"no item":           {board.VerbClaim, map[string]any{}, "item_id is required"},
		"bad item":          {board.VerbAbandon, map[string]any{"item_id": "board.x.>"}, "not an item id"},
		"item not text":     {board.VerbWithdraw, map[string]any{"item_id": 5}, "item_id must be a string"},
		"long note":         {board.VerbComplete, map[string]any{"item_id": it.ItemID, "note": strings.Repeat("n", 4001)}, "at most 4000"},
		"too many refs":     {board.VerbComplete, map[string]any{"item_id": it.ItemID, "artifacts": make([]string, 33)}, "at most 32"},
		"empty ref":         {board.VerbComplete, map[string]any{"item_id": it.ItemID, "artifacts": []string{""}}, "artifacts[0]"},
		"refs not list":     {board.VerbComplete, map[string]any{"item_id": it.ItemID, "artifacts": "ref"}, "artifacts must be a list"},
		"bad after":         {board.VerbList, map[string]any{"after": "zz"}, "not an item id"},
		"no descriptor":     {board.VerbList, map[string]any{"descriptor": nil}, "descriptor is required"},
		"broken descriptor": {board.VerbList, map[string]any{"descriptor": "!!"}, "descriptor"},
	} {
		t.Run(name, func(t *testing.T) {
			f.t = t
			_, err := f.call(r, creator, c.verb, c.payload)
			wantCode(t, err, errs.InputInvalid, c.want)
		})
	}
	f.t = t
	// At the limits, accepted.
	ok := f.must(r, creator, board.VerbPost, map[string]any{"title": strings.Repeat("é", 200), "detail": strings.Repeat("ü", 4000), "offering": "summarize_v2"})
	if ok.Offering != "summarize_v2" || len([]rune(ok.Detail)) != 4000 {
		t.Fatalf("posted %+v", ok)
	}
	if _, err := f.call(r, creator, board.VerbList, map[string]any{"after": it.ItemID}); err != nil {
		t.Fatal(err)
	}
	// A payload that is not an object; an envelope that is not a request.
	_, err := f.send(creator, protocol.BoardVerbSubject(board.VerbList), protocol.TypeRequest, []any{1})
	wantCode(t, err, errs.InputInvalid, "must be an object")
	_, err = f.send(creator, protocol.BoardVerbSubject(board.VerbPost), protocol.TypeEmit, map[string]any{"descriptor": r.descriptor, "title": "t"})
	wantCode(t, err, errs.InvalidEnvelope, "request envelope")
}

// Listing is oldest first, counts the whole board, and pages: an answer
// stops at its byte budget and names where the next one starts.
func TestListOrderAndPages(t *testing.T) {
	f := setup(t, board.Config{})
	creator, a := bustest.Agent(t), bustest.Agent(t)
	r := f.room(creator, rooms.GradeCapability, true)
	var posted []string
	for i := range 7 {
		posted = append(posted, f.post(r, creator, fmt.Sprintf("item %d", i)).ItemID)
	}
	f.must(r, a, board.VerbClaim, map[string]any{"item_id": posted[1]})
	f.must(r, a, board.VerbClaim, map[string]any{"item_id": posted[2]})
	f.must(r, a, board.VerbComplete, map[string]any{"item_id": posted[2]})
	f.must(r, creator, board.VerbWithdraw, map[string]any{"item_id": posted[6]})
	// Updated items are written later but still list in posting order.
	items, counts, next := f.list(r, a, nil)
	if counts != [3]int{4, 1, 1} || next != "" || len(items) != 6 {
		t.Fatalf("counts %v, next %q, %d items", counts, next, len(items))
	}
	for i, it := range items {
		if it.ItemID != posted[i] || it.Title != fmt.Sprintf("item %d", i) {
			t.Fatalf("item %d is %s %q", i, it.ItemID, it.Title)
		}
	}

	// Pages of about two items each.
	b, _ := json.Marshal(items[0])
	defer board.SetListPageBytes(2*len(b) + 8)()
	var all []string
	after := ""
	for pages := 0; ; pages++ {
		if pages > 6 {
			t.Fatal("paging does not end")
		}
		var p map[string]any
		if after != "" {
			p = map[string]any{"after": after}
		}
		page, counts, next := f.list(r, a, p)
		if counts != [3]int{4, 1, 1} || len(page) == 0 || len(page) > 2 {
			t.Fatalf("page %d: counts %v, %d items", pages, counts, len(page))
		}
		for _, it := range page {
			all = append(all, it.ItemID)
		}
		if next == "" {
			break
		}
		if next != page[len(page)-1].ItemID {
			t.Fatalf("next_after %s is not the page's last item", next)
		}
		after = next
	}
	if strings.Join(all, ",") != strings.Join(posted[:6], ",") {
		t.Fatalf("pages gave %v, want %v", all, posted[:6])
	}
}

// The caps: open and claimed items per room, all items per room; done
// items leave the board after their retention and the next post removes
// them.
func TestLimits(t *testing.T) {
	f := setup(t, board.Config{Limits: board.Limits{OpenItems: 3, Items: 5, DoneRetention: 24 * time.Hour}})
	creator := bustest.Agent(t)
	r := f.room(creator, rooms.GradeCapability, true)
	other := f.room(creator, rooms.GradeCapability, true)
	var ids []string
	for i := range 3 {
		ids = append(ids, f.post(r, creator, fmt.Sprint(i)).ItemID)
	}
	_, err := f.call(r, creator, board.VerbPost, map[string]any{"title": "fourth"})
	e := wantCode(t, err, errs.QuotaExceeded, "3 open or claimed")
	if e.Details["limit"] != "board_open_items" {
		t.Fatalf("details %v", e.Details)
	}
	f.post(other, creator, "another room has its own board")
	// A claimed item still counts; a done one does not.
	f.must(r, creator, board.VerbClaim, map[string]any{"item_id": ids[0]})
	_, err = f.call(r, creator, board.VerbPost, map[string]any{"title": "fourth"})
	wantCode(t, err, errs.QuotaExceeded, "open or claimed")
	f.must(r, creator, board.VerbComplete, map[string]any{"item_id": ids[0]})
	ids = append(ids, f.post(r, creator, "fourth").ItemID)
	f.must(r, creator, board.VerbClaim, map[string]any{"item_id": ids[1]})
	f.must(r, creator, board.VerbComplete, map[string]any{"item_id": ids[1]})
	ids = append(ids, f.post(r, creator, "fifth").ItemID)
	f.must(r, creator, board.VerbClaim, map[string]any{"item_id": ids[2]})
	f.must(r, creator, board.VerbComplete, map[string]any{"item_id": ids[2]})
	_, err = f.call(r, creator, board.VerbPost, map[string]any{"title": "sixth"})
	e = wantCode(t, err, errs.QuotaExceeded, "keeps 5 items")
	if e.Details["limit"] != "board_items" {
		t.Fatalf("details %v", e.Details)
	}

	// A day after they were done, the done items are gone from the list
	// and from the verbs, and the next post removes them.
	f.clock.Advance(23 * time.Hour)
	if _, counts, _ := f.list(r, creator, nil); counts != [3]int{2, 0, 3} {
		t.Fatalf("counts %v before a day", counts)
	}
	f.clock.Advance(time.Hour)
	if _, counts, _ := f.list(r, creator, nil); counts != [3]int{2, 0, 0} {
		t.Fatalf("counts %v a day after", counts)
	}
	_, err = f.call(r, creator, board.VerbComplete, map[string]any{"item_id": ids[0]})
	wantCode(t, err, errs.NotFound, ids[0])
	f.post(r, creator, "sixth")
	for _, id := range ids[:3] {
		if _, err := f.kv.Get(t.Context(), rooms.BoardKey(r.id, id)); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Fatalf("done item %s still stored: %v", id, err)
		}
	}
}

// The board and the rooms worker bind mesh_rooms with one configuration,
// whichever starts first.
func TestBucketSharedWithRooms(t *testing.T) {
	for _, boardFirst := range []bool{true, false} {
		t.Run(fmt.Sprint("board first ", boardFirst), func(t *testing.T) {
			b := bustest.Start(t)
			startBoard := func() {
				w, err := board.Start(t.Context(), bustest.Env(t, b, "board", nil), board.Config{})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = w.Stop() })
			}
			startRooms := func() {
				w, err := rooms.Start(t.Context(), bustest.Env(t, b, "rooms", nil), rooms.Config{})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = w.Stop() })
			}
			if boardFirst {
				startBoard()
				startRooms()
			} else {
				startRooms()
				startBoard()
			}
			js, err := jetstream.New(bustest.Client(t, b))
			if err != nil {
				t.Fatal(err)
			}
			s, err := js.Stream(t.Context(), "KV_"+rooms.Bucket)
			if err != nil {
				t.Fatal(err)
			}
			want := rooms.BucketConfig(0)
			if cfg := s.CachedInfo().Config; cfg.Description != want.Description || cfg.Replicas != want.Replicas {
				t.Fatalf("bucket %q ×%d, want %q ×%d", cfg.Description, cfg.Replicas, want.Description, want.Replicas)
			}
		})
	}
}
