// Package agreements is the agreements service (DESIGN §11,
// docs/commerce.md "Agreements and admission on the seller's node"): it
// keeps the agreements consumers' owners sign to sellers' SKUs, and
// answers the seller node's question at admission, before the accept:
// may this requester have this offering?
//
//	mesh.agreements.file     an owner-signed agreement (the payload, as signed)
//	mesh.agreements.list     {consumer_owner?, seller_agent?}
//	mesh.agreements.revoke   an owner-signed revocation
//	mesh.commerce.admit      {requester, offering, request_id, budget?}
//
// State lives in the commerce bucket (commerce.Bucket): agreements under
// commerce.AgreementKey, volume counters under vol.<seller>.<client>.…,
// both written by compare-and-set so any number of copies agree. The
// decision reads live state only, from the streams' leaders: the seller's
// registered SKUs (their current digests), the requester's owner from the
// registry, the agreement, the owner's credit balance (written by the
// clearing service) and the engagement terms (mirrored by the control
// plane's engagement service).
package agreements

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
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// Name is the worker's name (micro service mesh-agreements, queue group
// bus.QueueGroup(Name)).
const Name = "agreements"

// VerbAdmit is the endpoint name of protocol.SubjCommerceAdmit.
const VerbAdmit = "admit"

// Config configures the worker.
type Config struct {
	// Replicas of the commerce bucket (0: 1).
	Replicas int
	// MarkupPct is the platform markup of the resale path in whole percent,
	// 0 to commerce.MaxMarkupPct (CREDITS_PLATFORM_MARKUP_PCT, the value the
	// clearing is given): price_credits and the funds check quote the
	// retail price. Official are the agent ids the catalog marks official
	// unless the operator said otherwise (the clearing's and the activity
	// worker's list).
	MarkupPct int
	Official  []string
	// ConsoleURL is the base URL of the deployment's console (meshd's
	// console_url, the cloud's MESH_CONSOLE_URL): the approval URL of a
	// SKU billed by provider "internal" is <ConsoleURL>/agreements/approve
	// ?sku=<id> (commerce.ApprovalURL). A trailing slash is dropped. Empty,
	// the approval URL is the bare path: the refusal still names what to
	// approve.
	ConsoleURL string
	// Console, when set, is asked for the console's base URL instead of
	// ConsoleURL at each refusal: meshd knows its console only once its
	// HTTP listener is up, after the workers start.
	Console func() string
	// SweepEvery is how often this copy sweeps the volume counters of
	// ended windows (0: DefaultSweepEvery).
	SweepEvery time.Duration
	// MaxPerOwner bounds the agreements one owner keeps on file (0:
	// DefaultMaxPerOwner); a filing past it is QUOTA_EXCEEDED.
	MaxPerOwner int
}

// DefaultMaxPerOwner is the agreements one owner may keep on file: one per
// (seller, SKU), replaced by a newer filing, so this many distinct SKUs.
const DefaultMaxPerOwner = 1000

// Worker is one running copy of the agreements service.
type Worker struct {
	svc         *bus.Service
	kv          jetstream.KeyValue
	console     func() string
	maxPerOwner int
	// markup and official price the resale path (Config.MarkupPct,
	// Config.Official).
	markup   int
	official map[string]bool

	cancel   context.CancelFunc
	done     sync.WaitGroup
	stopOnce sync.Once
	stopErr  error
}

// Start runs one copy in env: binds the commerce bucket (created here if
// no other writer made it), serves the three agreement verbs and
// mesh.commerce.admit, and sweeps the volume counters every
// cfg.SweepEvery until ctx ends or Stop.
func Start(ctx context.Context, env bus.Env, cfg Config) (*Worker, error) {
	svc, err := bus.NewServiceIn(env, Name, "agreements to paid SKUs, and admission at the seller's node: mesh.agreements.file, list, revoke; mesh.commerce.admit")
	if err != nil {
		return nil, err
	}
	if err := commerce.CheckMarkup(cfg.MarkupPct); err != nil {
		_ = svc.Stop()
		return nil, fmt.Errorf("%s: %w", Name, err)
	}
	w := &Worker{svc: svc, console: cfg.Console, maxPerOwner: cfg.MaxPerOwner, cancel: func() {},
		markup: cfg.MarkupPct, official: map[string]bool{}}
	for _, id := range cfg.Official {
		w.official[id] = true
	}
	if w.maxPerOwner <= 0 {
		w.maxPerOwner = DefaultMaxPerOwner
	}
	if cfg.SweepEvery <= 0 {
		cfg.SweepEvery = DefaultSweepEvery
	}
	if w.console == nil {
		url := cfg.ConsoleURL
		w.console = func() string { return url }
	}
	fail := func(err error) (*Worker, error) {
		_ = w.Stop()
		return nil, err
	}
	if w.kv, err = bus.Bucket(ctx, svc.JS, commerce.BucketConfig(cfg.Replicas)); err != nil {
		return fail(err)
	}
	handlers := map[string]func(context.Context, *bus.Request) (any, error){
		"file": w.file, "list": w.list, "revoke": w.revoke,
	}
	for _, verb := range protocol.AgreementVerbs {
		h, ok := handlers[verb]
		if !ok {
			return fail(fmt.Errorf("%s: no handler for verb %s", Name, verb))
		}
		if err := svc.Endpoint(verb, protocol.AgreementVerbSubject(verb), requestOnly(h)); err != nil {
			return fail(fmt.Errorf("%s: endpoint %s: %w", Name, verb, err))
		}
	}
	if err := svc.Endpoint(VerbAdmit, protocol.SubjCommerceAdmit, requestOnly(w.admit)); err != nil {
		return fail(fmt.Errorf("%s: endpoint %s: %w", Name, VerbAdmit, err))
	}
	if err := env.NC.Flush(); err != nil {
		return fail(fmt.Errorf("%s: flush: %w", Name, err))
	}
	loopCtx, cancel := context.WithCancel(ctx)
	w.cancel = cancel
	w.done.Add(1)
	go w.sweepLoop(loopCtx, cfg.SweepEvery)
	return w, nil
}

// Stop ends the copy and its sweeper; safe to call more than once.
func (w *Worker) Stop() error {
	w.stopOnce.Do(func() {
		w.cancel()
		w.done.Wait()
		w.stopErr = w.svc.Stop()
	})
	return w.stopErr
}

func requestOnly(h bus.Handler) bus.Handler {
	return func(ctx context.Context, r *bus.Request) (any, error) {
		if r.Env.Type != protocol.TypeRequest {
			return nil, errs.Newf(errs.InvalidEnvelope, "%s takes a request envelope, not %s", r.Subject, r.Env.Type)
		}
		return h(ctx, r)
	}
}

// now is the worker's clock, to the millisecond the protocol's times carry.
func (w *Worker) now() time.Time { return w.svc.Now().UTC().Truncate(time.Millisecond) }

// approvalURL is where a person approves s.
func (w *Worker) approvalURL(s commerce.SKU) string {
	return commerce.ApprovalURL(strings.TrimSuffix(w.console(), "/"), s)
}

// futureSkew is how far ahead of this clock a signed agreed_at or
// revoked_at may be (the protocol's skew tolerance).
const futureSkew = protocol.DeadlineSkew

// file keeps an owner-signed agreement under its key, after checking it
// verifies, its seller is registered and publishes the SKU, and it binds
// the SKU's current digest. A filing never undoes a revocation or replaces
// a later agreement: re-filing a copy of a revoked (or superseded)
// agreement, which anyone who saw it could do, is refused.
func (w *Worker) file(ctx context.Context, r *bus.Request) (any, error) {
	if len(r.Env.Payload) > maxPayload {
		return nil, errs.Newf(errs.InvalidRequest, "the agreement is larger than %d bytes", maxPayload)
	}
	a, err := commerce.ParseAgreement(r.Env.Payload)
	if err != nil {
		return nil, err
	}
	if err := a.Verify(); err != nil {
		return nil, err
	}
	now := w.now()
	agreed, _ := protocol.ParseTime(a.AgreedAt)
	if agreed.After(now.Add(futureSkew)) {
		return nil, errs.Newf(errs.InvalidRequest, "the agreement's agreed_at %s is in the future; sign it again with the current time", a.AgreedAt)
	}
	if a.ExpiresAt != "" {
		if exp, _ := protocol.ParseTime(a.ExpiresAt); !now.Before(exp) {
			return nil, errs.Newf(errs.InvalidRequest, "the agreement expired at %s; sign a new one", a.ExpiresAt)
		}
	}
	if err := w.mayFile(ctx, r.Env.From, a.ConsumerOwner); err != nil {
		return nil, err
	}
	skus, err := w.sellerSKUs(ctx, a.SellerAgent)
	if err != nil {
		return nil, err
	}
	s, ok := skuByID(skus, a.SKU)
	if !ok {
		return nil, errs.Newf(errs.NotFound, "agent %s publishes no SKU %q (list its SKUs and agree to one of them)", a.SellerAgent, a.SKU).
			WithDetails(map[string]any{"seller_agent": a.SellerAgent, "sku": a.SKU})
	}
	if a.SKUDigest != s.Digest() {
		return nil, errs.Newf(errs.Conflict, "the agreement binds digest %s of %s, but its current terms are digest %s: the seller re-priced; review the terms and sign an agreement to %s",
			a.SKUDigest, a.SKU, s.Digest(), s.Digest()).WithDetails(map[string]any{"sku": a.SKU, "sku_digest": s.Digest()})
	}
	rec := commerce.AgreementRecord{Agreement: json.RawMessage(r.Env.Payload), FiledAt: now}
	key := commerce.AgreementKey(a.SellerAgent, a.ConsumerOwner, a.SKU)
	if err := w.underQuota(ctx, a.ConsumerOwner, key); err != nil {
		return nil, err
	}
	stored, _, err := bus.CAS(ctx, w.kv, key, func(cur *commerce.AgreementRecord, exists bool) (*commerce.AgreementRecord, error) {
		if !exists {
			return &rec, nil
		}
		prev, err := commerce.ParseAgreement(cur.Agreement)
		if err != nil {
			return &rec, nil // an unreadable record is replaced by a verified one
		}
		prevAt, _ := protocol.ParseTime(prev.AgreedAt)
		switch {
		case cur.RevokedAt != nil && (prev.Sig == a.Sig || !agreed.After(prevAt) || !agreed.After(*cur.RevokedAt)):
			// The revoked agreement itself, or one no later than it or
			// than the revocation: a copy replayed, not a new approval.
			return nil, errs.Newf(errs.Conflict, "the agreement to %s on file was revoked at %s; sign a new agreement (agreed after that)", a.SKU, protocol.FormatTime(*cur.RevokedAt))
		case agreed.Before(prevAt):
			return nil, errs.Newf(errs.Conflict, "a later agreement to %s (agreed at %s) is on file; an earlier one does not replace it", a.SKU, prev.AgreedAt)
		case cur.RevokedAt == nil && prev.Sig == a.Sig:
			return nil, bus.ErrNoChange // this very agreement, filed again
		}
		return &rec, nil
	})
	if err != nil {
		return nil, err
	}
	return map[string]any{"status": "filed", "agreement": w.view(*stored, s.Digest(), true, now)}, nil
}

// revokeSkew is how far ahead of this clock a signed revoked_at may be: a
// revocation is signed just before it is filed, so a few seconds of clock
// difference, no more.
const revokeSkew = 5 * time.Second

// revokeAttempts bounds the compare-and-set rounds of one revocation.
const revokeAttempts = 8

// revoke records an owner-signed revocation: the agreement stops covering
// from the moment the service takes it (revoked_at on the record is this
// clock's, never the signed time, so a revocation cannot reach back into
// usage already rated). The revocation names the agreement it withdraws by
// its agreed_at: one naming another agreement (an old revocation replayed
// against a later agreement) is refused, and so is one signed before the
// agreement on file was agreed or dated more than revokeSkew ahead.
//
// The record is read from the stream's leader and written with its
// revision, so the answer is about the agreement on file now, never a
// replica's older copy (a follower may not yet have a newer agreement).
func (w *Worker) revoke(ctx context.Context, r *bus.Request) (any, error) {
	rv, err := ParseRevocation(r.Env.Payload)
	if err != nil {
		return nil, err
	}
	if err := rv.Verify(); err != nil {
		return nil, err
	}
	now := w.now()
	if rv.Time().After(now.Add(revokeSkew)) {
		return nil, errs.Newf(errs.InvalidRequest, "revoked_at %s is in the future; a revocation takes effect when it is filed: sign it with the current time", rv.RevokedAt)
	}
	named, _ := protocol.ParseTime(rv.AgreedAt)
	key := commerce.AgreementKey(rv.SellerAgent, rv.ConsumerOwner, rv.SKU)
	for attempt := 1; ; attempt++ {
		b, rev, found, err := bus.LeaderGetRev(ctx, w.svc.NC, commerce.Bucket, key)
		if err != nil {
			return nil, errs.Wrap(errs.Unavailable, "the agreement could not be read just now; retry", err)
		}
		if !found {
			return nil, errs.Newf(errs.NotFound, "owner %s holds no agreement to %s of agent %s", rv.ConsumerOwner, rv.SKU, rv.SellerAgent)
		}
		var cur commerce.AgreementRecord
		if err := json.Unmarshal(b, &cur); err != nil {
			return nil, errs.Wrap(errs.Unavailable, "the agreement on file could not be read; retry later", err)
		}
		a, err := commerce.ParseAgreement(cur.Agreement)
		if err != nil {
			return nil, errs.Wrap(errs.Unavailable, "the agreement on file could not be read; retry later", err)
		}
		agreed, _ := protocol.ParseTime(a.AgreedAt)
		switch {
		case !agreed.Equal(named):
			return nil, errs.Newf(errs.Conflict, "the agreement on file was agreed at %s, not at %s as this revocation names: sign a revocation of the agreement on file",
				a.AgreedAt, rv.AgreedAt).WithDetails(map[string]any{"agreed_at": a.AgreedAt})
		case !agreed.Before(rv.Time()):
			return nil, errs.Newf(errs.Conflict, "the agreement on file was agreed at %s, after this revocation was signed (%s); sign a new revocation", a.AgreedAt, rv.RevokedAt)
		case cur.RevokedAt != nil:
			// The agreement it names, already revoked (by this very
			// revocation, say, sent again).
			return map[string]any{"status": "revoked", "agreement": w.view(cur, "", false, now)}, nil
		}
		next := cur
		next.RevokedAt = &now
		nb, err := json.Marshal(next)
		if err != nil {
			return nil, err
		}
		_, err = w.kv.Update(ctx, key, nb, rev)
		switch {
		case err == nil:
			return map[string]any{"status": "revoked", "agreement": w.view(next, "", false, now)}, nil
		case bus.IsConflict(err) && attempt < revokeAttempts:
			continue // written since the read: judge the record on file now
		case bus.IsConflict(err):
			return nil, errs.Wrap(errs.Unavailable, "the agreement kept changing while it was revoked; retry", err)
		}
		return nil, errs.Wrap(errs.Unavailable, "the revocation could not be recorded just now; retry", err)
	}
}

// Entry is one agreement as list, file and revoke answer it.
type Entry struct {
	SellerAgent   string          `json:"seller_agent"`
	ConsumerOwner string          `json:"consumer_owner"`
	SKU           string          `json:"sku"`
	SKUDigest     string          `json:"sku_digest"`
	AgreedAt      string          `json:"agreed_at"`
	ExpiresAt     string          `json:"expires_at,omitempty"`
	FiledAt       string          `json:"filed_at"`
	RevokedAt     string          `json:"revoked_at,omitempty"`
	State         string          `json:"state"`
	CurrentDigest string          `json:"current_digest,omitempty"`
	Agreement     json.RawMessage `json:"agreement"`
}

// States of a listed agreement, in the order they are judged.
const (
	StateRevoked = "revoked" // revoked: no future authority
	StateExpired = "expired" // past expires_at
	StateStale   = "stale"   // its digest is no longer the SKU's current one (or the SKU is gone)
	StateActive  = "active"  // covers the SKU's current terms
	StateUnknown = "unknown" // the seller's current terms could not be read
)

// view is a stored record as answered; current is the SKU's current digest
// ("" when gone), known whether it was read.
func (w *Worker) view(rec commerce.AgreementRecord, current string, known bool, now time.Time) Entry {
	e := Entry{FiledAt: protocol.FormatTime(rec.FiledAt), Agreement: rec.Agreement, CurrentDigest: current}
	a, err := commerce.ParseAgreement(rec.Agreement)
	if err == nil {
		e.SellerAgent, e.ConsumerOwner, e.SKU, e.SKUDigest, e.AgreedAt, e.ExpiresAt = a.SellerAgent, a.ConsumerOwner, a.SKU, a.SKUDigest, a.AgreedAt, a.ExpiresAt
	}
	exp, expErr := protocol.ParseTime(a.ExpiresAt)
	switch {
	case rec.RevokedAt != nil:
		e.RevokedAt, e.State = protocol.FormatTime(*rec.RevokedAt), StateRevoked
	case a.ExpiresAt != "" && (expErr != nil || !now.Before(exp)):
		e.State = StateExpired
	case !known:
		e.State = StateUnknown
	case current == "" || current != a.SKUDigest:
		e.State = StateStale
	default:
		e.State = StateActive
	}
	return e
}

// listPageBytes bounds the agreements of one list answer, well inside the
// bus's 1 MB message limit; a page cut short by it says next like one cut
// by its limit.
const listPageBytes = 512 << 10

// list answers {agreements: [Entry], next?}: a seller's agreements
// (seller_agent = the verified sender, the default), an owner's (its
// consumer_owner must be the registered owner of the sender), or, for the
// services key, any. The answer is a page in key order of at most limit
// agreements after the cursor after; next, present when more follow, is
// the cursor of the page after. Only the keys are scanned (no values), and
// only the page's records and its sellers' registrations are read.
func (w *Worker) list(ctx context.Context, r *bus.Request) (any, error) {
	q, err := DecodeList(r.Env.Payload)
	if err != nil {
		return nil, err
	}
	from := r.Env.From
	if from != w.svc.Key.Public() {
		if q.SellerAgent == "" && q.ConsumerOwner == "" {
			q.SellerAgent = from
		}
		if q.SellerAgent != from {
			if q.ConsumerOwner == "" {
				return nil, errs.Newf(errs.Forbidden, "an agent lists the agreements made to itself (seller_agent = its own key) or its owner's (consumer_owner = its registered owner)")
			}
			owner, err := w.ownerOf(ctx, from)
			if err != nil {
				return nil, err
			}
			if owner != q.ConsumerOwner {
				return nil, errs.Newf(errs.Forbidden, "consumer_owner %s is not the registered owner of agent %s", q.ConsumerOwner, from)
			}
		}
	}
	seller, owner := q.SellerAgent, q.ConsumerOwner
	if seller == "" {
		seller = "*"
	}
	if owner == "" {
		owner = "*"
	}
	limit := q.Limit
	if limit == 0 {
		limit = DefaultListLimit
	}
	// The limit+1 smallest keys after the cursor: the page, and whether
	// another follows.
	page := make([]string, 0, limit+1)
	if err := w.keys(ctx, commerce.AgreementKey(seller, owner, "*"), func(k string) bool {
		if k <= q.After {
			return true
		}
		i, dup := slices.BinarySearch(page, k)
		switch {
		case dup:
		case len(page) <= limit:
			page = slices.Insert(page, i, k)
		case i < len(page):
			page = slices.Insert(page[:len(page)-1], i, k)
		}
		return true
	}); err != nil {
		return nil, errs.OrUnavailable(err, "the agreements could not be listed just now; retry")
	}
	more := len(page) > limit
	if more {
		page = page[:limit]
	}
	now := w.now()
	current := map[string]map[string]string{} // seller -> sku -> digest (nil map: unreadable)
	out := []Entry{}
	size, last := 0, ""
	for _, k := range page {
		e, err := w.kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			last = k
			continue
		}
		if err != nil {
			return nil, errs.Wrap(errs.Unavailable, "the agreements could not be read just now; retry", err)
		}
		var rec commerce.AgreementRecord
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			last = k
			continue
		}
		a, err := commerce.ParseAgreement(rec.Agreement)
		if err != nil {
			last = k
			continue
		}
		digests, seen := current[a.SellerAgent]
		if !seen {
			digests = w.digests(ctx, a.SellerAgent)
			current[a.SellerAgent] = digests
		}
		v := w.view(rec, digests[a.SKU], digests != nil, now)
		b, _ := json.Marshal(v)
		if size += len(b); size > listPageBytes && len(out) > 0 {
			more = true
			break
		}
		out = append(out, v)
		last = k
	}
	res := map[string]any{"agreements": out}
	if more {
		res["next"] = last
	}
	return res, nil
}

// digests maps the seller's SKU ids to their current digests: empty for a
// seller not registered (its agreements are stale), nil when its record
// cannot be read.
func (w *Worker) digests(ctx context.Context, seller string) map[string]string {
	skus, err := w.sellerSKUs(ctx, seller)
	if err != nil && errs.CodeOf(err) != errs.NotFound {
		return nil
	}
	m := map[string]string{}
	for _, s := range skus {
		m[s.ID] = s.Digest()
	}
	return m
}

// keys calls f with every live key matching filter, reading no values,
// until f answers false.
func (w *Worker) keys(ctx context.Context, filter string, f func(key string) bool) error {
	watch, err := w.kv.Watch(ctx, filter, jetstream.IgnoreDeletes(), jetstream.MetaOnly())
	if err != nil {
		return fmt.Errorf("%s: keys %s: %w", Name, filter, err)
	}
	defer func() { _ = watch.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: keys %s: %w", Name, filter, ctx.Err())
		case e, ok := <-watch.Updates():
			if !ok {
				return errors.New(Name + ": keys: the watch closed")
			}
			if e == nil || !f(e.Key()) {
				return nil
			}
		}
	}
}

// mayFile refuses a filing unless its sender is the services key, or a
// registered agent outside the sandbox whose registered owner is the
// agreement's consumer_owner: an owner's agreements are filed by the
// owner's own agents. (The owner's signature inside is the authority; this
// bounds who can make the service keep records at all.)
func (w *Worker) mayFile(ctx context.Context, from, owner string) error {
	if from == w.svc.Key.Public() {
		return nil
	}
	rec, found, err := w.record(ctx, from)
	if err != nil {
		return errs.Wrap(errs.Unavailable, "the filer's registration could not be read just now; retry", err)
	}
	if !found {
		return errs.Newf(errs.Forbidden, "agent %s is not registered: an agreement is filed by a registered agent of its consumer_owner", from)
	}
	if rec.Sandbox() {
		return errs.Newf(errs.Forbidden, "agent %s is a sandbox (guest) registration: it files no agreements", from)
	}
	registered, err := w.ownerOf(ctx, from)
	if err != nil {
		return err
	}
	if registered != owner {
		return errs.Newf(errs.Forbidden, "consumer_owner %s is not the registered owner of agent %s: an owner's agreements are filed by its own agents", owner, from)
	}
	return nil
}

// underQuota refuses with QUOTA_EXCEEDED a new agreement (key not yet on
// file) of an owner who already keeps maxPerOwner.
func (w *Worker) underQuota(ctx context.Context, owner, key string) error {
	n, replaces := 0, false
	if err := w.keys(ctx, commerce.AgreementKey("*", owner, "*"), func(k string) bool {
		if k == key {
			replaces = true
			return false
		}
		n++
		return true
	}); err != nil {
		return errs.OrUnavailable(err, "the owner's agreements could not be counted just now; retry")
	}
	if !replaces && n >= w.maxPerOwner {
		return errs.Newf(errs.QuotaExceeded, "owner %s keeps %d agreements, the most this mesh keeps for one owner; revoke one (or agree again to a SKU already agreed to) first", owner, n).
			WithDetails(map[string]any{"limit": w.maxPerOwner})
	}
	return nil
}

func skuByID(skus []commerce.SKU, id string) (commerce.SKU, bool) {
	for _, s := range skus {
		if s.ID == id {
			return s, true
		}
	}
	return commerce.SKU{}, false
}
