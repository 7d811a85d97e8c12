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
// a sale is only an answer to a request the agreements service admitted,
// which left an admission ticket (commerce.Ticket) naming who pays, on
// which terms, at what time and on which path (resale or not).
package clearing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/metering"
	"agentmesh.dev/mesh/shared/protocol"
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
	MinKeep = 20 * time.Minute
	// DefaultTicketKeep outlives the mailbox's 7 days: a request held
	// there can still be answered, and charged, when it is taken.
	DefaultTicketKeep = 8 * 24 * time.Hour
	// DefaultLedgerKeep keeps a year of history and a month more.
	DefaultLedgerKeep     = 396 * 24 * time.Hour
	DefaultRetentionEvery = time.Hour
	DefaultSettlers       = 4
	DefaultQueue          = 1024
	tapPendingMsgs        = 65_536
	tapPendingBytes       = 32 << 20
	maxCandidateSize      = 1 << 20
)

// Config configures the worker.
type Config struct {
	// MarkupPct is the platform markup on the resale path, in whole
	// percent, 0 to commerce.MaxMarkupPct (checked at start). Unlike most
	// fields, 0 is 0 (no markup), not the default: meshd and the workers
	// table pass CREDITS_PLATFORM_MARKUP_PCT, the same value
	// /v1/capabilities reports and admission quotes. A sale is charged on
	// the path and markup its admission ticket records (the agreements
	// worker decides whether the seller is official, and quotes the retail
	// price, at admission).
	MarkupPct int
	// Replicas of the commerce bucket (bus.Replicas).
	Replicas int
	// SweepEvery is how often a copy resumes unsettled settlements and
	// clears old ones (DefaultSweepEvery); Grace is how long a settlement
	// may stand unfinished before the sweep takes it over (DefaultGrace);
	// Keep how long a settled one is kept (DefaultKeep, at least MinKeep).
	SweepEvery, Grace, Keep time.Duration
	// TicketKeep is how long an admission ticket waits for its answer
	// (DefaultTicketKeep); LedgerKeep how long a credit history row is kept
	// (DefaultLedgerKeep); RetentionEvery how often a copy drops the rows
	// and period aggregates past their retention (DefaultRetentionEvery).
	TicketKeep, LedgerKeep, RetentionEvery time.Duration
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
	Failed     uint64 // attempts that ended in an error (retried, or left for the sweep)
	Lost       uint64 // paid answers not settled after every attempt (logged as errors)
	Resumed    uint64 // unfinished settlements the sweep finished
}

// Worker is one running copy.
type Worker struct {
	svc      *bus.Service
	cfg      Config
	eng      *engine
	kv       jetstream.KeyValue
	registry bus.LazyBucket
	sellers  sellerCache
	sub      *nats.Subscription
	queue    chan candidate
	done     chan struct{}
	wg       sync.WaitGroup
	once     sync.Once

	retained time.Time // the last retention sweep (the sweep's goroutine only)

	settled, duplicates, notCharged, failed, lost, resumed atomic.Uint64
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
	if err := commerce.CheckMarkup(cfg.MarkupPct); err != nil {
		return fail(fmt.Errorf("%s: %w", Name, err))
	}
	if cfg.TicketKeep <= 0 {
		cfg.TicketKeep = DefaultTicketKeep
	}
	if cfg.LedgerKeep <= 0 {
		cfg.LedgerKeep = DefaultLedgerKeep
	}
	if cfg.RetentionEvery <= 0 {
		cfg.RetentionEvery = DefaultRetentionEvery
	}
	w := &Worker{svc: svc, cfg: cfg, kv: kv,
		eng:      &engine{kv: kv, nc: svc.NC, now: svc.Now, log: svc.Log},
		registry: bus.LazyBucket{JS: svc.JS, Bucket: RegistryBucket},
		queue:    make(chan candidate, cfg.Queue), done: make(chan struct{})}
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
		Failed: w.failed.Load(), Lost: w.lost.Load(), Resumed: w.resumed.Load()}
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

// settleOne settles one candidate. An error before the settlement record
// exists leaves nothing for the sweep to find (the tap is core NATS: the
// copy is not delivered again), so the whole candidate is tried again,
// settleAttempts times with a doubling pause: every step is idempotent
// (the record is created once). When every attempt failed the sale is
// lost; that is logged as an error and counted (Stats.Lost), never
// silent.
func (w *Worker) settleOne(c candidate) {
	pause := retryPause
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
		recorded, err := w.settle(ctx, c)
		cancel()
		if err == nil {
			return
		}
		w.failed.Add(1)
		if recorded {
			w.svc.Log.Warn("settlement left for the sweep", "request", c.env.InReplyTo, "seller", c.env.From, "err", err)
			return
		}
		if attempt == settleAttempts {
			w.lost.Add(1)
			w.svc.Log.Error("a paid answer could not be settled: its charge is lost", "request", c.env.InReplyTo, "seller", c.env.From, "attempts", attempt, "err", err)
			return
		}
		select {
		case <-time.After(pause):
		case <-w.done:
			// Stopping: one last attempt, then the copy is gone.
			pause = 0
		}
		pause *= 2
	}
}

// settleAttempts and retryPause bound settleOne's retries (about 15 s).
var (
	settleAttempts = 5
	retryPause     = time.Second
)

// settle meters, rates and settles one candidate, or resumes its
// settlement when one exists. recorded reports whether the settlement
// record exists (an error after it is the sweep's to finish).
//
// Only an admitted request is a sale: the agreements service wrote a
// ticket for it (commerce.Ticket) when it admitted it, and the answer must
// match it: signed by the ticket's seller, to the ticket's requester, for
// the ticket's offering. Everything else that decides the charge is the
// ticket's: who pays, the SKU and the digest it is rated on, the time, the
// path (resale and markup) and the budget ceiling. The answer brings only
// the usage it declares.
func (w *Worker) settle(ctx context.Context, c candidate) (recorded bool, err error) {
	env := c.env
	sel, err := w.sellers.get(ctx, env.From, w.svc.Now(), w.seller)
	if err != nil || !sel.sells {
		return false, err // sells nothing in credits: not a sale
	}
	key := saleKey(env.From, env.InReplyTo)
	if done, err := w.resume(ctx, key); done || err != nil {
		return done, err
	}
	// A sale moves credits: the signature is checked here, once the
	// answer is known to be one, not on every copy the tap sees.
	if _, err := protocol.Decode(c.data); err != nil {
		return false, nil
	}
	tkey := commerce.TicketKey(env.From, env.InReplyTo)
	b, found, err := bus.LeaderGet(ctx, w.svc.NC, commerce.Bucket, tkey)
	if err != nil {
		return false, fmt.Errorf("ticket %s: %w", tkey, err)
	}
	var t commerce.Ticket
	if found {
		if err := json.Unmarshal(b, &t); err != nil {
			found = false
		}
	}
	if !found {
		// Consumed by another copy since the first look: its settlement
		// stands for it.
		if done, err := w.resume(ctx, key); done || err != nil {
			return done, err
		}
	}
	if !found || t.Seller != env.From || t.Requester != env.To || t.Offering != c.offering || t.RequestID != env.InReplyTo {
		w.notCharged.Add(1)
		w.svc.Log.Info("paid answer not charged: no admission ticket matches it", "request", env.InReplyTo, "seller", env.From, "requester", env.To, "offering", c.offering)
		return false, nil
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
	var period string
	if v, err := protocol.ParseJSON(t.Price); err == nil {
		if p, err := commerce.PriceFromValue(v); err == nil {
			period = p.Period
			if period == "" && p.Included != nil {
				period = p.Included.Period
			}
		}
	}
	now := protocol.FormatTime(w.svc.Now())
	rec := &Settlement{Key: key, Kind: KindSale, State: StateNew, RequestID: env.InReplyTo, RespondID: env.ID,
		Seller: env.From, Requester: env.To, Offering: t.Offering, ConsumerOwner: t.ConsumerOwner, SellerOwner: t.SellerOwner,
		SKU: t.SKU, SKUDigest: t.SKUDigest, Price: t.Price, Period: commerce.PeriodKey(period, t.AdmittedAt), Usage: usage,
		Resale: t.Resale, MarkupPct: t.MarkupPct, Agreement: t.Agreement, CeilingMicro: t.CeilingMicro,
		At: protocol.FormatTime(t.AdmittedAt), CreatedAt: now, UpdatedAt: now}
	rb, err := json.Marshal(rec)
	if err != nil {
		return false, err
	}
	if _, err := w.kv.Create(ctx, commerce.SettlementPrefix+key, rb); err != nil {
		if bus.IsConflict(err) {
			return w.resume(ctx, key) // another copy recorded it first
		}
		return false, err
	}
	// The ticket is consumed: the record stands for it from here (a second
	// answer finds the record), and the sweep deletes any ticket whose
	// settlement exists before it forgets the settlement.
	if err := w.kv.Delete(ctx, tkey); err != nil {
		w.svc.Log.Warn("ticket not consumed; the sweep will", "ticket", tkey, "err", err)
	}
	_, last, err := w.eng.run(ctx, rec)
	if last {
		w.settled.Add(1)
	}
	return true, err
}

// resume finishes the settlement under key when there is one; done
// reports whether there was.
func (w *Worker) resume(ctx context.Context, key string) (done bool, err error) {
	s, found, err := w.eng.load(ctx, key)
	if err != nil || !found {
		return false, err
	}
	w.duplicates.Add(1)
	if final(s.State) {
		return true, nil
	}
	_, last, err := w.eng.run(ctx, s)
	if last {
		w.settled.Add(1)
	}
	return true, err
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

// sweep finishes settlements left unfinished (a copy that died, a step
// that failed), clears the markers of final ones after MarkerKeep and
// deletes them after Keep (the ticket first, when the settling copy could
// not consume it). Once per RetentionEvery it drops the tickets never
// answered within TicketKeep (and any whose settlement is recorded), and
// the ledger rows and period aggregates past their retention. Every copy sweeps; every step is idempotent. The listing is
// only of keys: each record is read again from the stream's leader before
// anything is done with it, so no step runs on a stale snapshot.
func (w *Worker) sweep(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, sweepTimeout)
	defer cancel()
	keys, err := w.listKeys(ctx, commerce.SettlementPrefix+">")
	if err != nil {
		w.svc.Log.Warn("sweep", "err", err)
		return
	}
	for _, k := range keys {
		if ctx.Err() != nil {
			return
		}
		w.sweepOne(ctx, strings.TrimPrefix(k, commerce.SettlementPrefix))
	}
	if now := w.svc.Now(); now.Sub(w.retained) >= w.cfg.RetentionEvery {
		w.retained = now
		w.sweepTickets(ctx)
		w.sweepRetention(ctx, now)
	}
}

// sweepTimeout bounds one sweep; what it did not reach, the next does.
// listTimeout bounds one listing of keys.
const (
	sweepTimeout = 5 * time.Minute
	listTimeout  = 3 * time.Second
)

func (w *Worker) sweepOne(ctx context.Context, key string) {
	s, found, err := w.eng.load(ctx, key)
	if err != nil || !found {
		return
	}
	now := w.svc.Now()
	updated, _ := protocol.ParseTime(s.UpdatedAt)
	settled, _ := protocol.ParseTime(s.SettledAt)
	switch {
	case !final(s.State) && now.Sub(updated) >= w.cfg.Grace:
		rctx, cancel := context.WithTimeout(ctx, runTimeout)
		_, last, err := w.eng.run(rctx, s)
		cancel()
		if err != nil {
			w.svc.Log.Warn("sweep: settlement still unfinished", "key", s.Key, "err", err)
			return
		}
		if last {
			w.resumed.Add(1)
		}
	case final(s.State) && !s.MarkersCleared && now.Sub(settled) >= MarkerKeep:
		if err := w.eng.clearMarkers(ctx, s); err != nil {
			w.svc.Log.Warn("sweep", "err", err)
		}
	case final(s.State) && s.MarkersCleared && now.Sub(settled) >= w.cfg.Keep:
		// The ticket goes first: with the record gone, a ticket left
		// behind would make a copy of the answer a sale again.
		if s.Kind == KindSale {
			if err := w.kv.Delete(ctx, commerce.TicketKey(s.Seller, s.RequestID)); err != nil {
				w.svc.Log.Warn("sweep", "err", err)
				return
			}
		}
		_, _, err := bus.CAS(ctx, w.kv, commerce.SettlementPrefix+s.Key, func(cur *Settlement, exists bool) (*Settlement, error) {
			if !exists || !final(cur.State) || !cur.MarkersCleared {
				return nil, bus.ErrNoChange
			}
			return nil, nil
		})
		if err != nil {
			w.svc.Log.Warn("sweep", "err", err)
		}
	}
}

// sweepTickets deletes the tickets whose settlement is recorded (consumed,
// when the settling copy could not delete it) and the tickets never
// answered within TicketKeep.
func (w *Worker) sweepTickets(ctx context.Context) {
	keys, err := w.listKeys(ctx, commerce.TicketPrefix+">")
	if err != nil {
		w.svc.Log.Warn("sweep: tickets", "err", err)
		return
	}
	now := w.svc.Now()
	for _, k := range keys {
		if ctx.Err() != nil {
			return
		}
		e, err := w.kv.Get(ctx, k)
		if err != nil {
			continue
		}
		var t commerce.Ticket
		if json.Unmarshal(e.Value(), &t) != nil {
			continue
		}
		_, recorded, err := w.eng.load(ctx, saleKey(t.Seller, t.RequestID))
		if err != nil {
			continue
		}
		if recorded || now.Sub(t.AdmittedAt) >= w.cfg.TicketKeep {
			if err := w.kv.Delete(ctx, k, jetstream.LastRevision(e.Revision())); err != nil && !bus.IsConflict(err) {
				w.svc.Log.Warn("sweep: ticket", "key", k, "err", err)
			}
		}
	}
}

// sweepRetention deletes ledger rows older than LedgerKeep and period
// aggregates whose period ended more than TicketKeep ago (no ticket of
// that period can still be answered, so none can still be rated in it).
func (w *Worker) sweepRetention(ctx context.Context, now time.Time) {
	rows, err := w.listKeys(ctx, LedgerPrefix+">")
	if err != nil {
		w.svc.Log.Warn("sweep: ledger", "err", err)
		return
	}
	for _, k := range rows {
		if at, ok := ledgerTime(k); ok && now.Sub(at) >= w.cfg.LedgerKeep {
			if err := w.kv.Delete(ctx, k); err != nil {
				w.svc.Log.Warn("sweep: ledger", "key", k, "err", err)
			}
		}
	}
	aggs, err := w.listKeys(ctx, AggregatePrefix+">")
	if err != nil {
		w.svc.Log.Warn("sweep: aggregates", "err", err)
		return
	}
	for _, k := range aggs {
		if end, ok := periodEnd(k[strings.LastIndexByte(k, '.')+1:]); ok && now.Sub(end) >= w.cfg.TicketKeep+time.Hour {
			if err := w.kv.Delete(ctx, k); err != nil {
				w.svc.Log.Warn("sweep: aggregate", "key", k, "err", err)
			}
		}
	}
}

// ledgerTime is the time in a ledger row's key (led.<owner>.<ms>-…).
func ledgerTime(key string) (time.Time, bool) {
	tail := key[strings.LastIndexByte(key[:min(len(key), len(LedgerPrefix)+57)], '.')+1:]
	ms, _, ok := strings.Cut(tail, "-")
	if !ok || len(ms) != 13 {
		return time.Time{}, false
	}
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.UnixMilli(n).UTC(), true
}

// periodEnd is the end of a UTC period key (commerce.PeriodKey: a day
// 2006-01-02 or a month 2006-01).
func periodEnd(p string) (time.Time, bool) {
	if t, err := time.Parse(time.DateOnly, p); err == nil {
		return t.AddDate(0, 0, 1), true
	}
	if t, err := time.Parse("2006-01", p); err == nil {
		return t.AddDate(0, 1, 0), true
	}
	return time.Time{}, false
}

// listKeys lists the bucket's keys matching filter, within listTimeout: a
// listing whose consumer the server never answered is abandoned, and the
// next sweep lists again.
func (w *Worker) listKeys(ctx context.Context, filter string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	lister, err := w.kv.ListKeysFiltered(ctx, filter)
	if err != nil {
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			return nil, nil
		}
		return nil, err
	}
	var out []string
	for k := range lister.Keys() {
		out = append(out, k)
	}
	_ = lister.Stop()
	return out, ctx.Err()
}

// seller is what the clearing needs of an answering agent's registration:
// whether it publishes any paid internal SKU in credits. It only spares
// the ticket read for the answers of agents that sell nothing in credits;
// the ticket decides.
type seller struct {
	sells bool
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
	for _, s := range skus {
		if s.Price.Paid() && s.Provider.ID == commerce.ProviderInternal && s.Price.Currency == commerce.Credits {
			return seller{sells: true}, nil
		}
	}
	return seller{}, nil
}

// Every answered request of every agent is looked at, most of them free:
// a seller's registration is kept for sellerTTL, so a busy agent costs the
// clearing one registry read per sellerTTL, not one per answer. (A seller
// that stops selling in credits between admission and its answer is not
// charged for it; the terms of a sale are the ticket's.)
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
