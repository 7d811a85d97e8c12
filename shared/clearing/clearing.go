// Package clearing is the mesh's own clearing (spec §8, DESIGN §11;
// docs/commerce.md "Metering, rating, credits and the markup"): the worker
// that meters every answered request to a paid internal SKU priced in
// credits (XCR), rates it over the consumer owner's period aggregate, and
// settles it by moving credits between owners' balances, once. It also
// holds the balances: credits come in by the operator's grant
// (mesh.internal.credits.grant) and are read by their owners
// (mesh.credits.balance, mesh.credits.history). Credits are spent inside
// the mesh only: there is no withdrawal, payout or settlement to money.
//
// The worker taps the agents' outbox copies as the activity worker does
// (shared/activity), in its own queue group, so every copy is seen by one
// copy of the clearing. The terminal answer's copy carries the runtime's
// audit headers (protocol.HdrAudit*), which name the offering asked for;
// the rest is live state read at settlement: the seller's registered SKUs,
// the requester's owner, the agreement, the catalog's word on whether the
// seller is official (the resale path).
package clearing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/activity"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/metering"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/registry"
)

// Name is the worker's name: micro service mesh-clearing, queue group
// bus.QueueGroup(Name) for the endpoints and the tap.
const Name = "clearing"

// RegistryBucket is the registry's bucket: the sellers' SKUs and every
// agent's owner are read from its records.
const RegistryBucket = "mesh_registry"

// DefaultMarkupPct is the platform markup of the resale path
// (CREDITS_PLATFORM_MARKUP_PCT's default, spec §8).
const DefaultMarkupPct = 10

// Defaults of Config.
const (
	DefaultSweepEvery = 30 * time.Second
	DefaultGrace      = 10 * time.Second
	DefaultKeep       = time.Hour
	// MinKeep bounds Keep from below: a settlement must outlive every
	// fresh copy of its respond (10 minutes old, 5 ahead).
	MinKeep          = 20 * time.Minute
	DefaultSettlers  = 4
	DefaultQueue     = 1024
	tapPendingMsgs   = 65_536
	tapPendingBytes  = 32 << 20
	maxCandidateSize = 1 << 20
)

// Config configures the worker.
type Config struct {
	// MarkupPct is the platform markup on the resale path, in whole
	// percent. Unlike most fields, 0 is 0 (no markup), not the default:
	// meshd and the workers table pass CREDITS_PLATFORM_MARKUP_PCT, the
	// same value /v1/capabilities reports.
	MarkupPct int
	// Official are the agent ids the catalog marks official unless the
	// operator said otherwise (activity.Config.Official; the workers
	// table gives the activity worker's list when this one is empty).
	Official []string
	// Replicas of the commerce bucket (bus.Replicas).
	Replicas int
	// SweepEvery is how often a copy resumes unsettled settlements and
	// clears old ones (DefaultSweepEvery); Grace is how long a settlement
	// may stand unfinished before the sweep takes it over (DefaultGrace);
	// Keep how long a settled one is kept (DefaultKeep, at least MinKeep).
	SweepEvery, Grace, Keep time.Duration
	// Settlers is how many settlements a copy runs at once
	// (DefaultSettlers); Queue how many answers wait for them
	// (DefaultQueue) before the tap waits.
	Settlers, Queue int
}

// Stats counts what one copy did.
type Stats struct {
	Settled    uint64 // settlements this copy took to settled
	Duplicates uint64 // answers whose settlement existed already
	NotCharged uint64 // answers to paid SKUs not charged: no agreement, no owner
	Failed     uint64 // settlements left for the sweep after an error
	Resumed    uint64 // unfinished settlements the sweep finished
}

// Worker is one running copy.
type Worker struct {
	svc      *bus.Service
	cfg      Config
	eng      *engine
	kv       jetstream.KeyValue
	registry bus.LazyBucket
	usage    bus.LazyBucket
	sellers  sellerCache
	official map[string]bool
	sub      *nats.Subscription
	queue    chan candidate
	done     chan struct{}
	wg       sync.WaitGroup
	once     sync.Once

	settled, duplicates, notCharged, failed, resumed atomic.Uint64
}

// candidate is a tapped terminal answer that may be a sale.
type candidate struct {
	data     []byte
	env      *protocol.Envelope
	offering string
}

// Start runs one copy in env.
func Start(ctx context.Context, env bus.Env, cfg Config) (*Worker, error) {
	svc, err := bus.NewServiceIn(env, Name, "credits: metering, rating and settlement of paid internal SKUs; balances and grants")
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Worker, error) {
		_ = svc.Stop()
		return nil, err
	}
	kv, err := bus.Bucket(ctx, svc.JS, commerce.BucketConfig(cfg.Replicas))
	if err != nil {
		return fail(err)
	}
	if cfg.SweepEvery <= 0 {
		cfg.SweepEvery = DefaultSweepEvery
	}
	if cfg.Grace <= 0 {
		cfg.Grace = DefaultGrace
	}
	if cfg.Keep <= 0 {
		cfg.Keep = DefaultKeep
	}
	cfg.Keep = max(cfg.Keep, MinKeep)
	if cfg.Settlers <= 0 {
		cfg.Settlers = DefaultSettlers
	}
	if cfg.Queue <= 0 {
		cfg.Queue = DefaultQueue
	}
	if cfg.MarkupPct < 0 {
		return fail(fmt.Errorf("%s: the markup is a whole percentage, not %d", Name, cfg.MarkupPct))
	}
	w := &Worker{svc: svc, cfg: cfg, kv: kv, official: map[string]bool{},
		eng:      &engine{kv: kv, now: svc.Now, log: svc.Log},
		registry: bus.LazyBucket{JS: svc.JS, Bucket: RegistryBucket},
		usage:    bus.LazyBucket{JS: svc.JS, Bucket: activity.UsageBucket},
		queue:    make(chan candidate, cfg.Queue), done: make(chan struct{})}
	for _, id := range cfg.Official {
		w.official[id] = true
	}
	for _, ep := range []struct {
		name, subject string
		h             bus.Handler
	}{
		{"grant", protocol.SubjCreditsGrant, w.grant},
		{"balance", protocol.CreditVerbSubject("balance"), w.balance},
		{"history", protocol.CreditVerbSubject("history"), w.history},
	} {
		if err := svc.Endpoint(ep.name, ep.subject, ep.h); err != nil {
			return fail(fmt.Errorf("%s: endpoint %s: %w", Name, ep.subject, err))
		}
	}
	for range cfg.Settlers {
		w.wg.Add(1)
		go w.settler()
	}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		sctx, cancel := context.WithCancel(context.Background())
		go func() { <-w.done; cancel() }()
		bus.Every(sctx, cfg.SweepEvery, w.sweep)
	}()
	sub, err := env.NC.QueueSubscribe(protocol.OutboxSubject("*"), bus.QueueGroup(Name), w.tap)
	if err == nil {
		err = sub.SetPendingLimits(tapPendingMsgs, tapPendingBytes)
	}
	if err == nil {
		err = env.NC.Flush()
	}
	w.sub = sub
	if err != nil {
		_ = w.Stop()
		return nil, fmt.Errorf("%s: tap: %w", Name, err)
	}
	return w, nil
}

// Stop ends the copy: no more taps or answers; settlements being run are
// finished (or left for the sweep of another copy).
func (w *Worker) Stop() error {
	var err error
	w.once.Do(func() {
		if w.sub != nil {
			_ = w.sub.Unsubscribe()
		}
		close(w.done)
		w.wg.Wait()
		err = w.svc.Stop()
	})
	return err
}

// Stats reports this copy's counters.
func (w *Worker) Stats() Stats {
	return Stats{Settled: w.settled.Load(), Duplicates: w.duplicates.Load(), NotCharged: w.notCharged.Load(),
		Failed: w.failed.Load(), Resumed: w.resumed.Load()}
}

// tap takes the outbox copies: only the terminal, completed answer of a
// request, whose copy names the offering asked for, can be a sale. The
// checks here are the cheap ones; the rest runs on the settlers.
func (w *Worker) tap(msg *nats.Msg) {
	c, ok := candidateOf(msg.Subject, msg.Data, msg.Header, w.svc.Now())
	if !ok {
		return
	}
	select {
	case w.queue <- c:
	case <-w.done:
	}
}

// candidateOf is the candidate of one outbox copy, if it may be a sale.
func candidateOf(subject string, data []byte, hdr nats.Header, now time.Time) (candidate, bool) {
	if hdr == nil || hdr.Get(protocol.HdrAuditInput) == "" || len(data) > maxCandidateSize {
		return candidate{}, false
	}
	offering := hdr.Get(protocol.HdrAuditOffering)
	rest, ok := strings.CutPrefix(subject, "mesh.agent.")
	agent, ok2 := strings.CutSuffix(rest, ".outbox")
	if offering == "" || !ok || !ok2 || !keys.IsUserPublicKey(agent) {
		return candidate{}, false
	}
	// The answer is a respond, or, to a protocol 0.3 requester answered
	// late (a held request answered from the inbox), a request naming the
	// original in in_reply_to (adapter/node heldAnswer): the audit headers
	// mark both as the answer that ends the request.
	env, err := protocol.DecodeBrokerAttributed(data)
	if err != nil || env.From != agent || (env.Type != protocol.TypeRespond && env.Type != protocol.TypeRequest) || env.InReplyTo == "" ||
		!keys.IsUserPublicKey(env.To) || protocol.ResponseStatus(env) != "completed" {
		return candidate{}, false
	}
	if protocol.CheckFreshness(env.TS, now, protocol.SourceLive) != nil {
		return candidate{}, false
	}
	return candidate{data: data, env: env, offering: offering}, true
}

// settler runs the queued sales. At stop it first runs what is queued:
// an answer taken from the tap and not yet recorded as a settlement is
// known to this copy only.
func (w *Worker) settler() {
	defer w.wg.Done()
	for {
		select {
		case <-w.done:
			for {
				select {
				case c := <-w.queue:
					w.settleOne(c)
				default:
					return
				}
			}
		case c := <-w.queue:
			w.settleOne(c)
		}
	}
}

func (w *Worker) settleOne(c candidate) {
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	if err := w.settle(ctx, c); err != nil {
		w.failed.Add(1)
		w.svc.Log.Warn("settlement left for the sweep", "request", c.env.InReplyTo, "seller", c.env.From, "err", err)
	}
}

// sale is what settle learnt about a candidate before recording it.
type sale struct {
	sku           commerce.SKU
	sellerOwner   string
	consumerOwner string
}

// settle meters, rates and settles one candidate, or resumes its
// settlement when one exists.
func (w *Worker) settle(ctx context.Context, c candidate) error {
	env := c.env
	sel, err := w.sellers.get(ctx, env.From, w.svc.Now(), w.seller)
	if err != nil || sel.owner == "" && sel.skus == nil {
		return err
	}
	skus := sel.skus
	s, ok := commerce.For(skus, c.offering)
	if !ok || !s.Price.Paid() || s.Provider.ID != commerce.ProviderInternal || s.Price.Currency != commerce.Credits {
		return nil // free, or billed elsewhere
	}
	key := KeyToken(env.InReplyTo)
	if done, err := w.resume(ctx, key); done || err != nil {
		return err
	}
	// A sale moves credits: the signature is checked here, once the
	// answer is known to be one, not on every copy the tap sees.
	if _, err := protocol.Decode(c.data); err != nil {
		return nil
	}
	at := requestTime(env)
	sellerOwner := sel.owner
	requester, err := w.record(ctx, env.To)
	if err != nil {
		return err
	}
	// The requester's owner when it asked (registry.OwnerOf at the
	// request's time, as the agreement is judged): admission refused it
	// if it had none then.
	consumerOwner := registry.OwnerOf(requester, at)
	if sellerOwner == "" || consumerOwner == "" {
		w.notCharged.Add(1)
		w.svc.Log.Info("paid answer not charged: an owner is unknown", "request", env.InReplyTo, "seller", env.From, "requester", env.To)
		return nil
	}
	agreed, err := w.agreed(ctx, env.From, consumerOwner, s, at)
	if err != nil {
		return err
	}
	if !agreed {
		// Admission should have refused it; rating is the second wall, and
		// an answer without an agreement rates to zero (commerce.Rate).
		w.notCharged.Add(1)
		w.svc.Log.Info("paid answer not charged: no covering agreement", "request", env.InReplyTo, "seller", env.From, "owner", consumerOwner, "sku", s.ID)
		return nil
	}
	resale, err := w.isOfficial(ctx, env.From)
	if err != nil {
		return err
	}
	usage := map[string]int64{metering.Requests: 1}
	if env.Type == protocol.TypeRespond { // a late answer as a request carries no receipt
		r, err := metering.ReceiptFrom(env)
		if err != nil {
			w.svc.Log.Info("usage receipt ignored", "request", env.InReplyTo, "seller", env.From, "err", err)
		}
		for _, u := range r.Usage {
			usage[u.Meter] = u.Quantity
		}
	}
	price, err := json.Marshal(s.Value()["price"])
	if err != nil {
		return err
	}
	period := s.Price.Period
	if period == "" && s.Price.Included != nil {
		period = s.Price.Included.Period
	}
	now := protocol.FormatTime(w.svc.Now())
	rec := &Settlement{Key: key, Kind: KindSale, State: StateNew, RequestID: env.InReplyTo, RespondID: env.ID,
		Seller: env.From, Requester: env.To, Offering: c.offering, ConsumerOwner: consumerOwner, SellerOwner: sellerOwner,
		SKU: s.ID, SKUDigest: s.Digest(), Price: price, Period: commerce.PeriodKey(period, at), Usage: usage,
		Resale: resale, MarkupPct: w.cfg.MarkupPct, At: protocol.FormatTime(at), CreatedAt: now, UpdatedAt: now}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if _, err := w.kv.Create(ctx, commerce.SettlementPrefix+key, b); err != nil {
		if bus.IsConflict(err) {
			_, err = w.resume(ctx, key) // another copy recorded it first
		}
		return err
	}
	_, last, err := w.eng.run(ctx, rec)
	if last {
		w.settled.Add(1)
	}
	return err
}

// resume finishes the settlement under key when there is one; done
// reports whether there was.
func (w *Worker) resume(ctx context.Context, key string) (done bool, err error) {
	s, found, err := bus.GetJSON[Settlement](ctx, w.kv, commerce.SettlementPrefix+key)
	if err != nil || !found {
		return false, err
	}
	w.duplicates.Add(1)
	if s.State == StateSettled {
		return true, nil
	}
	_, last, err := w.eng.run(ctx, &s)
	if last {
		w.settled.Add(1)
	}
	return true, err
}

// requestTime is when the request was made, which the answer does not
// say: the time inside this mesh's request ids (UUIDv7) when it is there
// and plausible (not after the answer, at most the mailbox's 7 days
// before it), else the answer's own time.
func requestTime(env *protocol.Envelope) time.Time {
	answered, err := protocol.ParseTime(env.TS)
	if err != nil {
		return time.Now()
	}
	if t, ok := uuidV7Time(env.InReplyTo); ok && !t.After(answered) && answered.Sub(t) <= 7*24*time.Hour {
		return t
	}
	return answered
}

// uuidV7Time is the millisecond time of a UUIDv7 in text form.
func uuidV7Time(id string) (time.Time, bool) {
	if len(id) != 36 || id[14] != '7' || id[8] != '-' || id[13] != '-' {
		return time.Time{}, false
	}
	var ms int64
	for _, r := range id[:8] + id[9:13] {
		var d int64
		switch {
		case r >= '0' && r <= '9':
			d = int64(r - '0')
		case r >= 'a' && r <= 'f':
			d = int64(r-'a') + 10
		case r >= 'A' && r <= 'F':
			d = int64(r-'A') + 10
		default:
			return time.Time{}, false
		}
		ms = ms<<4 | d
	}
	return time.UnixMilli(ms).UTC(), true
}

// record is an agent's registry record (nil when it is not registered).
func (w *Worker) record(ctx context.Context, agent string) (map[string]any, error) {
	kv, err := w.registry.Get(ctx)
	if err != nil || kv == nil {
		return nil, err
	}
	e, err := kv.Get(ctx, agent)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("registry %s: %w", agent, err)
	}
	v, err := protocol.ParseJSON(e.Value())
	if err != nil {
		return nil, fmt.Errorf("registry %s: %w", agent, err)
	}
	m, _ := v.(map[string]any)
	return m, nil
}

// skusOf is the SKUs of a registry record (none when it publishes none).
func skusOf(rec map[string]any) ([]commerce.SKU, error) {
	raw, ok := rec["skus"]
	if !ok || raw == nil {
		return nil, nil
	}
	return commerce.SKUsFromValue(raw)
}

// agreed reports whether owner held, at at, an agreement that verifies and
// covers seller's SKU s at its current digest and was not yet revoked.
func (w *Worker) agreed(ctx context.Context, seller, owner string, s commerce.SKU, at time.Time) (bool, error) {
	rec, found, err := bus.GetJSON[commerce.AgreementRecord](ctx, w.kv, commerce.AgreementKey(seller, owner, s.ID))
	if err != nil && !found {
		return false, err
	}
	if !found || err != nil {
		return false, nil
	}
	if rec.RevokedAt != nil && !at.Before(*rec.RevokedAt) {
		return false, nil
	}
	a, err := commerce.ParseAgreement(rec.Agreement)
	if err != nil || a.Verify() != nil {
		return false, nil
	}
	return a.Covers(owner, seller, s.ID, s.Digest(), at), nil
}

// isOfficial reports whether the catalog marks agent official: the resale
// path, where the platform is the seller of record.
func (w *Worker) isOfficial(ctx context.Context, agent string) (bool, error) {
	kv, err := w.usage.Get(ctx)
	if err != nil || kv == nil {
		return false, err
	}
	e, err := kv.Get(ctx, activity.CatalogPrefix+agent)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("catalog %s: %w", agent, err)
	}
	return activity.CatalogOfficial(e.Value(), w.official[agent])
}

// sweep finishes settlements left unfinished (a copy that died, a step
// that failed), clears the markers of settled ones after MarkerKeep and
// deletes them after Keep. Every copy sweeps; every step is idempotent.
func (w *Worker) sweep(ctx context.Context) {
	now := w.svc.Now()
	var list []Settlement
	watch, err := w.kv.Watch(ctx, commerce.SettlementPrefix+">", jetstream.IgnoreDeletes())
	if err != nil {
		w.svc.Log.Warn("sweep", "err", err)
		return
	}
	func() {
		defer func() { _ = watch.Stop() }()
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-watch.Updates():
				if !ok || e == nil {
					return
				}
				var s Settlement
				if json.Unmarshal(e.Value(), &s) == nil {
					list = append(list, s)
				}
			}
		}
	}()
	for i := range list {
		s := &list[i]
		updated, _ := protocol.ParseTime(s.UpdatedAt)
		settled, _ := protocol.ParseTime(s.SettledAt)
		switch {
		case s.State != StateSettled && now.Sub(updated) >= w.cfg.Grace:
			rctx, cancel := context.WithTimeout(ctx, runTimeout)
			_, last, err := w.eng.run(rctx, s)
			cancel()
			if err != nil {
				w.svc.Log.Warn("sweep: settlement still unfinished", "key", s.Key, "err", err)
				continue
			}
			if last {
				w.resumed.Add(1)
			}
		case s.State == StateSettled && !s.MarkersCleared && now.Sub(settled) >= MarkerKeep:
			if err := w.eng.clearMarkers(ctx, s); err != nil {
				w.svc.Log.Warn("sweep", "err", err)
			}
		case s.State == StateSettled && s.MarkersCleared && now.Sub(settled) >= w.cfg.Keep:
			_, _, err := bus.CAS(ctx, w.kv, commerce.SettlementPrefix+s.Key, func(cur *Settlement, exists bool) (*Settlement, error) {
				if !exists || cur.State != StateSettled || !cur.MarkersCleared {
					return nil, bus.ErrNoChange
				}
				return nil, nil
			})
			if err != nil {
				w.svc.Log.Warn("sweep", "err", err)
			}
		}
	}
}

// seller is what the clearing needs of an answering agent's registration:
// its SKUs and its owner (registry.OwnerOf when read; none of either when
// it is not registered).
type seller struct {
	skus  []commerce.SKU
	owner string
	at    time.Time
}

// seller reads agent's registration.
func (w *Worker) seller(ctx context.Context, agent string) (seller, error) {
	rec, err := w.record(ctx, agent)
	if err != nil || rec == nil {
		return seller{}, err
	}
	skus, err := skusOf(rec)
	if err != nil {
		// The registry checks SKUs at register; one it kept that does not
		// read here sells nothing here.
		w.svc.Log.Debug("seller's SKUs unreadable", "seller", agent, "err", err)
		skus = nil
	}
	if skus == nil {
		skus = []commerce.SKU{}
	}
	return seller{skus: skus, owner: registry.OwnerOf(rec, w.svc.Now())}, nil
}

// Every answered request of every agent is looked at, most of them free:
// a seller's registration is kept for sellerTTL, so a busy agent costs the
// clearing one registry read per sellerTTL, not one per answer. An answer
// within it is rated on the terms of up to sellerTTL ago, which are the
// terms the request was admitted under.
const (
	sellerTTL      = 2 * time.Second
	maxSellerCache = 16_384
)

// sellerCache keeps sellers' registrations for sellerTTL.
type sellerCache struct {
	mu sync.Mutex
	m  map[string]seller
}

func (c *sellerCache) get(ctx context.Context, agent string, now time.Time, load func(context.Context, string) (seller, error)) (seller, error) {
	c.mu.Lock()
	s, ok := c.m[agent]
	c.mu.Unlock()
	if ok && now.Sub(s.at) < sellerTTL && !now.Before(s.at) {
		return s, nil
	}
	s, err := load(ctx, agent)
	if err != nil {
		return seller{}, err
	}
	s.at = now
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxSellerCache {
		c.m = map[string]seller{}
	}
	c.m[agent] = s
	return s, nil
}
