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
}

// Worker is one running copy of the agreements service.
type Worker struct {
	svc     *bus.Service
	kv      jetstream.KeyValue
	console func() string

	stopOnce sync.Once
	stopErr  error
}

// Start runs one copy in env: binds the commerce bucket (created here if
// no other writer made it) and serves the three agreement verbs and
// mesh.commerce.admit.
func Start(ctx context.Context, env bus.Env, cfg Config) (*Worker, error) {
	svc, err := bus.NewServiceIn(env, Name, "agreements to paid SKUs, and admission at the seller's node: mesh.agreements.file, list, revoke; mesh.commerce.admit")
	if err != nil {
		return nil, err
	}
	w := &Worker{svc: svc, console: cfg.Console}
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
	return w, nil
}

// Stop ends the copy; safe to call more than once.
func (w *Worker) Stop() error {
	w.stopOnce.Do(func() { w.stopErr = w.svc.Stop() })
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

// revoke records an owner-signed revocation: the agreement stops covering
// from the moment the service takes it (revoked_at on the record is this
// clock's, never the signed time, so a revocation cannot reach back into
// usage already rated). A revocation signed before the agreement on file
// was agreed is refused: it is an old revocation replayed.
func (w *Worker) revoke(ctx context.Context, r *bus.Request) (any, error) {
	rv, err := ParseRevocation(r.Env.Payload)
	if err != nil {
		return nil, err
	}
	if err := rv.Verify(); err != nil {
		return nil, err
	}
	now := w.now()
	if rv.Time().After(now.Add(futureSkew)) {
		return nil, errs.Newf(errs.InvalidRequest, "revoked_at %s is in the future; a revocation takes effect when it is filed", rv.RevokedAt)
	}
	key := commerce.AgreementKey(rv.SellerAgent, rv.ConsumerOwner, rv.SKU)
	stored, _, err := bus.CAS(ctx, w.kv, key, func(cur *commerce.AgreementRecord, exists bool) (*commerce.AgreementRecord, error) {
		if !exists {
			return nil, errs.Newf(errs.NotFound, "owner %s holds no agreement to %s of agent %s", rv.ConsumerOwner, rv.SKU, rv.SellerAgent)
		}
		if cur.RevokedAt != nil {
			return nil, bus.ErrNoChange
		}
		if a, err := commerce.ParseAgreement(cur.Agreement); err == nil {
			if agreed, _ := protocol.ParseTime(a.AgreedAt); !agreed.Before(rv.Time()) {
				return nil, errs.Newf(errs.Conflict, "the agreement on file was agreed at %s, after this revocation was signed (%s); sign a new revocation", a.AgreedAt, rv.RevokedAt)
			}
		}
		next := *cur
		next.RevokedAt = &now
		return &next, nil
	})
	if err != nil {
		return nil, err
	}
	return map[string]any{"status": "revoked", "agreement": w.view(*stored, "", false, now)}, nil
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
// bus's 1 MB message limit; a longer list says truncated.
const listPageBytes = 512 << 10

// list answers {agreements: [Entry], truncated?}: a seller's agreements
// (seller_agent = the verified sender, the default), an owner's (its
// consumer_owner must be the registered owner of the sender), or, for the
// services key, any.
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
	var recs []commerce.AgreementRecord
	if err := w.scan(ctx, commerce.AgreementKey(seller, owner, "*"), func(_ string, v []byte) {
		var rec commerce.AgreementRecord
		if err := json.Unmarshal(v, &rec); err == nil {
			recs = append(recs, rec)
		}
	}); err != nil {
		return nil, err
	}
	now := w.now()
	current := map[string]map[string]string{} // seller -> sku -> digest (nil map: unreadable)
	out := []Entry{}
	size, truncated := 0, false
	for _, rec := range recs {
		a, err := commerce.ParseAgreement(rec.Agreement)
		if err != nil {
			continue
		}
		digests, seen := current[a.SellerAgent]
		if !seen {
			digests = w.digests(ctx, a.SellerAgent)
			current[a.SellerAgent] = digests
		}
		e := w.view(rec, digests[a.SKU], digests != nil, now)
		b, _ := json.Marshal(e)
		if size += len(b); size > listPageBytes {
			truncated = true
			break
		}
		out = append(out, e)
	}
	res := map[string]any{"agreements": out}
	if truncated {
		res["truncated"] = true
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

// scan calls f with every live key and value matching filter.
func (w *Worker) scan(ctx context.Context, filter string, f func(key string, v []byte)) error {
	watch, err := w.kv.Watch(ctx, filter, jetstream.IgnoreDeletes())
	if err != nil {
		return fmt.Errorf("%s: list %s: %w", Name, filter, err)
	}
	defer func() { _ = watch.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: list %s: %w", Name, filter, ctx.Err())
		case e, ok := <-watch.Updates():
			if !ok {
				return errors.New(Name + ": list: the watch closed")
			}
			if e == nil {
				return nil
			}
			f(e.Key(), e.Value())
		}
	}
}

func skuByID(skus []commerce.SKU, id string) (commerce.SKU, bool) {
	for _, s := range skus {
		if s.ID == id {
			return s, true
		}
	}
	return commerce.SKU{}, false
}
