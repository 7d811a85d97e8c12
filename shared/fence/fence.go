// Package fence enforces the limits of the credentials nobody vouches for
// that a user JWT cannot express (docs/security.md). The broker itself
// enforces what the JWT carries: the largest message and the number of
// subscriptions per connection (creds.ConnLimits). The fence adds, for the
// credentials of a fence class (creds.ClassGuest, creds.ClassUnowned):
//
//   - connections per credential key: the broker reports every connection
//     in its account's connect events, with the JWT's tags; a key holding
//     more than its class allows has its newest connection closed;
//   - message and byte rates per connection: every Window the fence reads
//     each limited connection's counters from the broker and closes one
//     that published more than its class allows, then closes the key's
//     connections as they come for Cooldown.
//
// It runs on a system-account connection (connect events and the kick are
// system subjects). Copies may run side by side: each sees every event,
// and closing a connection twice is harmless.
package fence

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"agentmesh.dev/mesh/shared/creds"
)

// Defaults of Config.
const (
	DefaultWindow   = 5 * time.Second
	DefaultCooldown = time.Minute
)

// Config is what the fence needs.
type Config struct {
	// Sys is a connection to the system account.
	Sys *nats.Conn
	// Account is the mesh account's public key.
	Account string
	// Classes are the limits per class (creds.DefaultClassLimits when nil).
	Classes map[string]creds.ClassLimits
	// Window is how often rates are read (DefaultWindow); Cooldown how long
	// a key whose connection was closed for its rate may not connect.
	Window, Cooldown time.Duration
	Log              *slog.Logger
	Now              func() time.Time
}

// Fence is a running fence.
type Fence struct {
	cfg  Config
	log  *slog.Logger
	subs []*nats.Subscription

	mu      sync.Mutex
	conns   map[connKey]*conn
	byKey   map[string]map[connKey]bool
	cooling map[string]time.Time // key → until when its connections are closed
	kicked  map[string]int       // reason → count, for Stats

	cancel context.CancelFunc
	done   sync.WaitGroup
}

// connKey names one connection: the broker's id and the client id there.
type connKey struct {
	server string
	cid    uint64
}

// conn is one limited connection and its last counters.
type conn struct {
	key, class  string
	at          time.Time // when msgs and bytes were read
	msgs, bytes int64
	kickedFor   bool // closed for its rate already
}

// The parts of the broker's events and answers the fence reads.
type (
	eventServer struct {
		ID string `json:"id"`
	}
	eventClient struct {
		ID      uint64   `json:"id"`
		Account string   `json:"acc"`
		User    string   `json:"user"`
		Tags    []string `json:"tags"`
		Kind    string   `json:"kind"`
	}
	connectEvent struct {
		Server eventServer `json:"server"`
		Client eventClient `json:"client"`
	}
	connzAnswer struct {
		Data *struct {
			Conns []struct {
				CID      uint64 `json:"cid"`
				InMsgs   int64  `json:"in_msgs"`
				InBytes  int64  `json:"in_bytes"`
				Username string `json:"authorized_user"`
			} `json:"connections"`
		} `json:"data"`
		Error *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
)

// Start subscribes to the account's connect and disconnect events, picks
// up the limited connections already open, and reads rates every Window
// until Stop.
func Start(ctx context.Context, cfg Config) (*Fence, error) {
	if cfg.Sys == nil || cfg.Account == "" {
		return nil, errors.New("fence: a system connection and the mesh account are required")
	}
	if cfg.Classes == nil {
		cfg.Classes = creds.DefaultClassLimits()
	}
	if cfg.Window <= 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.Cooldown <= 0 {
		cfg.Cooldown = DefaultCooldown
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	f := &Fence{cfg: cfg, log: cfg.Log.With("component", "fence"), conns: map[connKey]*conn{},
		byKey: map[string]map[connKey]bool{}, cooling: map[string]time.Time{}, kicked: map[string]int{}}
	for subj, h := range map[string]nats.MsgHandler{
		"$SYS.ACCOUNT." + cfg.Account + ".CONNECT":    f.onConnect,
		"$SYS.ACCOUNT." + cfg.Account + ".DISCONNECT": f.onDisconnect,
	} {
		sub, err := cfg.Sys.Subscribe(subj, h)
		if err != nil {
			f.unsubscribe()
			return nil, fmt.Errorf("fence: subscribe %s: %w", subj, err)
		}
		f.subs = append(f.subs, sub)
	}
	if err := cfg.Sys.Flush(); err != nil {
		f.unsubscribe()
		return nil, fmt.Errorf("fence: %w", err)
	}
	// The fence lives until Stop, not as long as the start-up's ctx. It
	// picks up the connections already open in the background: the
	// listing waits a second for every broker of a cluster to answer.
	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	f.cancel = cancel
	f.done.Add(1)
	go func() {
		if err := f.adopt(lctx); err != nil && lctx.Err() == nil {
			f.log.Warn("limited connections already open are not watched until they reconnect", "err", err)
		}
		f.loop(lctx)
	}()
	return f, nil
}

// Stop ends the fence. Safe to call twice.
func (f *Fence) Stop() {
	if f.cancel != nil {
		f.cancel()
	}
	f.done.Wait()
	f.unsubscribe()
}

func (f *Fence) unsubscribe() {
	for _, s := range f.subs {
		_ = s.Unsubscribe()
	}
	f.subs = nil
}

// Stats is what the fence has closed, by reason ("connections", "rate",
// "cooling"), and how many limited connections it watches.
type Stats struct {
	Watched int
	Kicked  map[string]int
}

// Stats reports the fence's counters.
func (f *Fence) Stats() Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := make(map[string]int, len(f.kicked))
	for r, n := range f.kicked {
		k[r] = n
	}
	return Stats{Watched: len(f.conns), Kicked: k}
}

func (f *Fence) onConnect(m *nats.Msg) {
	var ev connectEvent
	if err := json.Unmarshal(m.Data, &ev); err != nil {
		f.log.Warn("unreadable connect event", "err", err)
		return
	}
	f.track(ev.Server.ID, ev.Client)
}

// track starts watching a connection of a fence class, and closes it at
// once when its key is cooling off or holds more connections than its
// class allows.
func (f *Fence) track(server string, c eventClient) {
	class := creds.ClassOfTags(c.Tags)
	lim, ok := f.cfg.Classes[class]
	if class == "" || !ok || c.User == "" {
		return
	}
	id := connKey{server, c.ID}
	now := f.cfg.Now()
	f.mu.Lock()
	if _, seen := f.conns[id]; seen {
		f.mu.Unlock()
		return
	}
	f.conns[id] = &conn{key: c.User, class: class, at: now}
	if f.byKey[c.User] == nil {
		f.byKey[c.User] = map[connKey]bool{}
	}
	f.byKey[c.User][id] = true
	reason := ""
	switch until, cooling := f.cooling[c.User]; {
	case cooling && now.Before(until):
		reason = "cooling"
	case lim.Conns > 0 && len(f.byKey[c.User]) > lim.Conns:
		reason = "connections"
	}
	if reason != "" {
		f.kicked[reason]++
	}
	f.mu.Unlock()
	if reason != "" {
		f.log.Info("closing a limited connection", "reason", reason, "class", class, "key", c.User, "limit", lim.Conns)
		_ = f.kick(id) // logged when it fails; the connection then stays until its rate or a later connect is judged
	}
}

func (f *Fence) onDisconnect(m *nats.Msg) {
	var ev connectEvent
	if err := json.Unmarshal(m.Data, &ev); err != nil {
		return
	}
	f.forget(connKey{ev.Server.ID, ev.Client.ID})
}

// kick asks the broker that holds the connection to close it.
func (f *Fence) kick(id connKey) error {
	body, _ := json.Marshal(map[string]uint64{"cid": id.cid})
	if _, err := f.cfg.Sys.Request("$SYS.REQ.SERVER."+id.server+".KICK", body, 2*time.Second); err != nil {
		f.log.Warn("kick", "server", id.server, "cid", id.cid, "err", err)
		return err
	}
	return nil
}

func (f *Fence) loop(ctx context.Context) {
	defer f.done.Done()
	t := time.NewTicker(f.cfg.Window)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f.poll(ctx)
		}
	}
}

// pollers bounds the counter reads of one poll in flight at once.
const pollers = 16

// poll reads every limited connection's counters and closes those over
// their class's rates; their keys cool off. Connections the broker no
// longer lists (a disconnect event that never came) are forgotten.
func (f *Fence) poll(ctx context.Context) {
	f.mu.Lock()
	ids := make([]connKey, 0, len(f.conns))
	for id := range f.conns {
		ids = append(ids, id)
	}
	now := f.cfg.Now()
	for k, until := range f.cooling {
		if now.After(until) {
			delete(f.cooling, k)
		}
	}
	f.mu.Unlock()
	work := make(chan connKey)
	var wg sync.WaitGroup
	for range min(pollers, len(ids)) {
		wg.Go(func() {
			for id := range work {
				switch msgs, bytes, st := f.counters(id); st {
				case found:
					f.judge(id, msgs, bytes)
				case gone:
					f.forget(id)
				}
			}
		})
	}
	for _, id := range ids {
		if ctx.Err() != nil {
			break
		}
		work <- id
	}
	close(work)
	wg.Wait()
}

// What a counter read found.
const (
	unknown = iota // the broker did not answer: try again next window
	found
	gone // the broker answered without the connection
)

// counters reads one connection's published messages and bytes.
func (f *Fence) counters(id connKey) (msgs, bytes int64, st int) {
	body, _ := json.Marshal(map[string]any{"cid": id.cid, "acc": f.cfg.Account})
	m, err := f.cfg.Sys.Request("$SYS.REQ.SERVER."+id.server+".CONNZ", body, 2*time.Second)
	if err != nil {
		return 0, 0, unknown
	}
	var a connzAnswer
	if err := json.Unmarshal(m.Data, &a); err != nil || a.Error != nil || a.Data == nil {
		return 0, 0, unknown
	}
	for _, c := range a.Data.Conns {
		if c.CID == id.cid {
			return c.InMsgs, c.InBytes, found
		}
	}
	return 0, 0, gone
}

// forget stops watching a connection.
func (f *Fence) forget(id connKey) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.conns[id]
	if !ok {
		return
	}
	delete(f.conns, id)
	delete(f.byKey[c.key], id)
	if len(f.byKey[c.key]) == 0 {
		delete(f.byKey, c.key)
	}
}

// judge compares a connection's counters with the last ones read.
func (f *Fence) judge(id connKey, msgs, bytes int64) {
	now := f.cfg.Now()
	f.mu.Lock()
	c, ok := f.conns[id]
	if !ok {
		f.mu.Unlock()
		return
	}
	lim := f.cfg.Classes[c.class]
	secs := now.Sub(c.at).Seconds()
	over := ""
	if secs > 0 && !c.kickedFor {
		switch {
		case lim.MsgsPerSec > 0 && float64(msgs-c.msgs)/secs > float64(lim.MsgsPerSec):
			over = fmt.Sprintf("%.0f messages/s over %d", float64(msgs-c.msgs)/secs, lim.MsgsPerSec)
		case lim.BytesPerSec > 0 && float64(bytes-c.bytes)/secs > float64(lim.BytesPerSec):
			over = fmt.Sprintf("%.0f bytes/s over %d", float64(bytes-c.bytes)/secs, lim.BytesPerSec)
		}
	}
	c.at, c.msgs, c.bytes = now, msgs, bytes
	if over != "" {
		f.cooling[c.key] = now.Add(f.cfg.Cooldown)
		f.kicked["rate"]++
	}
	key, class := c.key, c.class
	f.mu.Unlock()
	if over == "" {
		return
	}
	f.log.Info("closing a limited connection", "reason", "rate", "class", class, "key", key, "rate", over, "cooldown", f.cfg.Cooldown)
	if f.kick(id) == nil {
		f.mu.Lock()
		if c, ok := f.conns[id]; ok {
			c.kickedFor = true // judged again only if the close did not happen
		}
		f.mu.Unlock()
	}
}

// adopt starts watching the limited connections already open (a fence
// that restarts, or starts after the broker): one listing of the account's
// connections per broker that answers.
func (f *Fence) adopt(ctx context.Context) error {
	body, _ := json.Marshal(map[string]any{"acc": f.cfg.Account, "auth": true, "limit": 1 << 16})
	inbox := f.cfg.Sys.NewRespInbox()
	sub, err := f.cfg.Sys.SubscribeSync(inbox)
	if err != nil {
		return err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := f.cfg.Sys.PublishRequest("$SYS.REQ.SERVER.PING.CONNZ", inbox, body); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	for {
		m, err := sub.NextMsgWithContext(wctx)
		if err != nil {
			return nil // every broker that answers in a second has answered
		}
		var a struct {
			Server eventServer `json:"server"`
			Data   *struct {
				Conns []struct {
					CID  uint64   `json:"cid"`
					User string   `json:"authorized_user"`
					Tags []string `json:"tags"`
				} `json:"connections"`
			} `json:"data"`
		}
		if json.Unmarshal(m.Data, &a) != nil || a.Data == nil {
			continue
		}
		for _, c := range a.Data.Conns {
			f.track(a.Server.ID, eventClient{ID: c.CID, User: c.User, Tags: c.Tags})
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}
