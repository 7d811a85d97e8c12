package engagement

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/sow"
	"agentmesh.dev/mesh/shared/store"
)

// settle records what the clock has decided since the record was last
// written: an open amendment past its review window lapses (§5.8), and the
// lapse is recorded at the instant the window closed. It is run before
// every act and every read, so a lapse is derived from the clock and then
// kept.
func (s *Service) settle(ctx context.Context, id string) error {
	now := s.now()
	return s.cfg.Store.RunTx(ctx, func(tx store.Tx) error {
		var r Record
		if err := tx.Get(CollRecords, id, &r); err != nil {
			return err
		}
		if r.Open == nil {
			return nil
		}
		at, why := parseStamp(r.Open.LapsesAt), "no answer within the review window; the current version continues (§5.8)"
		if end, ok := r.endsAt(); ok && end.Before(at) {
			at, why = end, whyEnded
		}
		if now.Before(at) {
			return nil
		}
		if err := closeOpen(tx, &r, at, why); err != nil {
			return err
		}
		r.UpdatedAt = stamp(now)
		return tx.Set(CollRecords, id, &r)
	})
}

// whyEnded is the reason recorded when a proposal closes because the
// engagement ended first.
const whyEnded = "the engagement ended before the proposal was answered; an amendment is approved only while the engagement is in force"

// closeOpen closes the open proposal at at (a lapse), recording why.
func closeOpen(tx store.Tx, r *Record, at time.Time, why string) error {
	open := r.Open
	r.Open = nil
	return appendEvent(tx, r, Event{Kind: EventLapsed, At: stamp(at), Version: open.Version, Role: open.Role, Key: open.Key, Reason: why})
}

// endsAt is when a formed record stops admitting work: the earlier of its
// ends_at and a recorded termination's effect.
func (r *Record) endsAt() (time.Time, bool) {
	var end time.Time
	if d, err := sow.Parse(r.Document); err == nil && d.EndsAt != "" {
		end = parseStamp(d.EndsAt)
	}
	if t := r.Termination; t != nil {
		if eff := parseStamp(t.EffectiveAt); end.IsZero() || eff.Before(end) {
			end = eff
		}
	}
	return end, !end.IsZero()
}

// notInForce refuses an approval on an engagement that no longer admits
// work: terminated (a recorded notice ends its amendments), lapsed, or
// exhausted.
func notInForce(r *Record, now time.Time) error {
	switch {
	case r.Termination != nil:
		return errs.Newf(errs.Conflict, "this engagement is terminated (effective %s); it takes no amendments, and its open proposal is closed", r.Termination.EffectiveAt)
	case r.ended(now):
		return errs.New(errs.Conflict, "this engagement has ended; an amendment is approved only while it is in force, and renewal after the end is a new engagement (§5.7)")
	}
	return nil
}

// formedRecord reads a formed engagement that has not ended.
func (s *Service) formedRecord(ctx context.Context, id, sowID string) (*Record, error) {
	if err := s.settle(ctx, id); errors.Is(err, store.ErrNotFound) {
		return nil, errs.Newf(errs.NotFound, "no engagement under %s between these agents is on record", sowID)
	} else if err != nil {
		return nil, storeErr(err)
	}
	var r Record
	if err := store.Get(ctx, s.cfg.Store, CollRecords, id, &r); err != nil {
		return nil, storeErr(err)
	}
	if !r.Formed() {
		return nil, errs.Newf(errs.Conflict, "the engagement under %s is not formed yet: it awaits the provider's instance signature", sowID)
	}
	return &r, nil
}

// seatOf is the role whose owner key is key, "" for neither.
func (r *Record) seatOf(key string) string {
	switch key {
	case r.SellerOwner:
		return sow.RoleProvider
	case r.ClientOwner:
		return sow.RoleClient
	}
	return ""
}

func (r *Record) ownerOf(role string) string {
	if role == sow.RoleProvider {
		return r.SellerOwner
	}
	return r.ClientOwner
}

func other(role string) string {
	if role == sow.RoleProvider {
		return sow.RoleClient
	}
	return sow.RoleProvider
}

// clause is the canonical JSON of a member of a decoded document.
func clause(d *sow.Document, member string) []byte {
	b, _ := protocol.Canonical(d.Value[member])
	return b
}

// Propose files an amendment (§5.8): a full replacement at the governing
// version + 1, the parties and starts_at unchanged, signed by one seat's
// owner. It has no force until the other seat countersigns the exact
// bytes (Approve); at most one is open at a time; unanswered, it lapses
// after the governing document's review_window_days.
func (s *Service) Propose(ctx context.Context, raw []byte) (*Record, error) {
	d, err := parse(raw)
	if err != nil {
		return nil, err
	}
	if d.Parties.Client == nil || len(d.Signatures) != 1 {
		return nil, errs.New(errs.InvalidRequest, "an amendment is the full replacement document with one signature, the proposer's (§5.8)")
	}
	client, seller := d.Parties.Client.Agent, d.Parties.Provider.Agent
	r, err := s.formedRecord(ctx, RecordID(client, seller, d.ID), d.ID)
	if err != nil {
		return nil, err
	}
	now := s.now()
	if r.Termination != nil {
		return nil, errs.New(errs.Conflict, "this engagement is terminated; it takes no amendments")
	}
	if r.ended(now) {
		return nil, errs.New(errs.Conflict, "this engagement has ended; renewal after the end is a new engagement")
	}
	cur, err := sow.Parse(r.Document)
	if err != nil {
		return nil, errs.Wrap(errs.InternalError, "the governing document no longer reads", err)
	}
	switch {
	case d.Version <= r.Version:
		return nil, errs.Newf(errs.Conflict, "version %d is not above the highest countersigned version, %d; a lower or equal version is refused (§10)", d.Version, r.Version).
			WithDetail("version", r.Version)
	case d.Version != r.Version+1:
		return nil, errs.Newf(errs.InvalidRequest, "an amendment is at the governing version + 1, %d (§5.8)", r.Version+1)
	case !bytes.Equal(clause(d, "parties"), clause(cur, "parties")) || d.StartsAt != cur.StartsAt:
		return nil, errs.New(errs.InvalidRequest, "an amendment keeps the parties and the original starts_at; everything else may change (§5.8)")
	}
	if r.Open != nil {
		return nil, errs.Newf(errs.Conflict, "version %d is already proposed and open until %s; at most one proposal is open: the other side approves or denies it, or the proposer withdraws it first (§5.8)", r.Open.Version, r.Open.LapsesAt).
			WithDetail("open_version", r.Open.Version)
	}
	sig := d.Signatures[0]
	if r.ownerOf(sig.Role) != sig.Key {
		return nil, errs.Newf(errs.Forbidden, "the %s signature is not by the %s seat's owner who signed the engagement (%s)", sig.Role, sig.Role, r.ownerOf(sig.Role))
	}
	pinfo, err := s.ownerOf(ctx, seller, "provider")
	if err != nil {
		return nil, err
	}
	if err := publishes(pinfo, d); err != nil {
		return nil, err
	}
	if e := (Runtime{ProviderSKUs: pinfo.SKUs}).gates(d); e != nil {
		return nil, e
	}
	open := &Amendment{Version: d.Version, Document: raw, Role: sig.Role, Key: sig.Key, ProposedAt: stamp(now), LapsesAt: stamp(now.Add(reviewWindow(cur)))}
	return s.update(ctx, r.ID, func(tx store.Tx, rec *Record) error {
		if rec.Open != nil || rec.Version != r.Version || rec.Termination != nil {
			return errs.New(errs.Conflict, "the engagement changed while this was proposed; read it and propose again")
		}
		if rec.Proposals >= MaxProposals {
			return errs.Newf(errs.QuotaExceeded, "this engagement has taken %d amendment proposals, the most one record keeps; a new engagement is formed to go on", MaxProposals)
		}
		rec.Proposals++
		rec.Open = open
		return appendEvent(tx, rec, Event{Kind: EventProposed, At: stamp(now), Version: d.Version, Role: sig.Role, Key: sig.Key, Signed: raw})
	})
}

// update runs change on record id in a transaction and writes it.
func (s *Service) update(ctx context.Context, id string, change func(tx store.Tx, r *Record) error) (*Record, error) {
	var rec Record
	err := s.cfg.Store.RunTx(ctx, func(tx store.Tx) error {
		rec = Record{}
		if err := tx.Get(CollRecords, id, &rec); err != nil {
			return err
		}
		if err := change(tx, &rec); err != nil {
			return err
		}
		rec.UpdatedAt = stamp(s.now())
		return tx.Set(CollRecords, id, &rec)
	})
	if errors.Is(err, errSame) {
		return &rec, nil
	}
	if err != nil {
		return nil, storeErr(err)
	}
	return &rec, nil
}

// Approve is the counterparty's countersign of the open proposal's exact
// bytes (§5.8): the new version governs from now, the old one stays on
// record, and the terms are mirrored again.
func (s *Service) Approve(ctx context.Context, raw []byte) (*Record, error) {
	d, err := parse(raw)
	if err != nil {
		return nil, err
	}
	if !d.Agreed() {
		return nil, errs.New(errs.InvalidRequest, "an approval is the proposed document with both seats' signatures over the same bytes (§5.8)")
	}
	client, seller := d.Parties.Client.Agent, d.Parties.Provider.Agent
	r, err := s.formedRecord(ctx, RecordID(client, seller, d.ID), d.ID)
	if err != nil {
		return nil, err
	}
	if r.Version >= d.Version && r.Open == nil {
		if d.Version == r.Version && bytes.Equal(raw, r.Document) {
			return r, nil // the same approval again
		}
		return nil, errs.Newf(errs.Conflict, "version %d is not above the highest countersigned version, %d (§10)", d.Version, r.Version)
	}
	if r.Open == nil || r.Open.Version != d.Version {
		return nil, errs.Newf(errs.Conflict, "no proposal at version %d is open; a lapsed, denied or withdrawn proposal cannot be approved (§5.8)", d.Version)
	}
	prop, err := sow.Parse(r.Open.Document)
	if err != nil {
		return nil, errs.Wrap(errs.InternalError, "the open proposal no longer reads", err)
	}
	a, _ := sow.SignedBytes(prop.Value)
	b, _ := sow.SignedBytes(d.Value)
	if !bytes.Equal(a, b) {
		return nil, errs.New(errs.InvalidRequest, "the countersign covers different bytes than the proposal; approval countersigns the exact bytes proposed, and there is no partial approval (§5.8)")
	}
	counter := other(r.Open.Role)
	csig, _ := d.Signature(counter)
	psig, _ := d.Signature(r.Open.Role)
	if psig.Key != r.Open.Key || csig.Key != r.ownerOf(counter) {
		return nil, errs.Newf(errs.Forbidden, "the approval is countersigned by the %s seat's owner (%s) over the proposer's signature", counter, r.ownerOf(counter))
	}
	now := s.now()
	if err := notInForce(r, now); err != nil {
		return nil, err
	}
	// What this runtime enforces is judged now, not when it was proposed:
	// the provider may have dropped its SKUs since.
	pinfo, err := s.ownerOf(ctx, seller, "provider")
	if err != nil {
		return nil, err
	}
	if e := (Runtime{ProviderSKUs: pinfo.SKUs}).gates(d); e != nil {
		return nil, e
	}
	rec, err := s.update(ctx, r.ID, func(tx store.Tx, rec *Record) error {
		if err := notInForce(rec, now); err != nil {
			return err
		}
		if rec.Open == nil || rec.Open.Version != d.Version || !bytes.Equal(rec.Open.Document, r.Open.Document) {
			return errs.New(errs.Conflict, "the proposal changed while this was approved; read the engagement again")
		}
		if !now.Before(parseStamp(rec.Open.LapsesAt)) {
			return errs.Newf(errs.Conflict, "the proposal lapsed at %s, unanswered within the review window (§5.8)", rec.Open.LapsesAt)
		}
		claim, err := claimIndex(tx, rec.Client, rec.Seller, rec.ID, d.Scope.Offerings, now, true)
		if err != nil {
			return err
		}
		for _, o := range claim {
			if err := tx.Set(CollIndex, IndexID(rec.Client, rec.Seller, o), indexEntry{Record: rec.ID}); err != nil {
				return err
			}
		}
		for _, o := range rec.Offerings {
			if !slices.Contains(d.Scope.Offerings, o) && !slices.Contains(rec.Retired, o) {
				rec.Retired = append(rec.Retired, o)
			}
		}
		rec.Retired = slices.DeleteFunc(rec.Retired, func(o string) bool { return slices.Contains(d.Scope.Offerings, o) })
		rec.Offerings = slices.Clone(d.Scope.Offerings)
		rec.Document, rec.Version, rec.Open, rec.MirrorPending = raw, d.Version, nil, true
		return appendEvent(tx, rec, Event{Kind: EventApproved, At: stamp(now), Version: d.Version, Role: counter, Key: csig.Key, Signed: raw})
	})
	if err != nil {
		return nil, err
	}
	return s.mirrorAfter(ctx, rec)
}

// Resolve records a signed denial (by the counterparty, with its reason)
// or withdrawal (by the proposer) of the open proposal (§5.8). The
// current version continues.
func (s *Service) Resolve(ctx context.Context, raw []byte) (*Record, error) {
	act, err := ParseResolution(raw)
	if err != nil {
		return nil, err
	}
	r, err := s.formedRecord(ctx, RecordID(act.Client, act.Seller, act.SowID), act.SowID)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(r.Offerings, act.Offering) {
		return nil, errs.Newf(errs.InvalidRequest, "offering %q is not in this engagement's scope", act.Offering)
	}
	now := s.now()
	if err := skew(act.At, now); err != nil {
		return nil, err
	}
	if r.Open == nil || r.Open.Version != act.Version {
		return nil, errs.Newf(errs.Conflict, "no proposal at version %d is open", act.Version)
	}
	if err := answers(r, act); err != nil {
		return nil, err
	}
	kind, role := EventDenied, other(r.Open.Role)
	if act.Kind == ActWithdraw {
		kind, role = EventWithdrawn, r.Open.Role
	}
	if act.By != r.ownerOf(role) {
		what := "the counterparty's owner denies a proposal"
		if act.Kind == ActWithdraw {
			what = "only the proposer withdraws its proposal"
		}
		return nil, errs.Newf(errs.Forbidden, "%s: the %s seat's owner is %s (§5.8)", what, role, r.ownerOf(role))
	}
	return s.update(ctx, r.ID, func(tx store.Tx, rec *Record) error {
		if rec.Open == nil || rec.Open.Version != act.Version {
			return errs.New(errs.Conflict, "the proposal changed while this was recorded; read the engagement again")
		}
		if err := answers(rec, act); err != nil {
			return err
		}
		rec.Open, rec.Resolved = nil, append(rec.Resolved, act.Digest())
		return appendEvent(tx, rec, Event{Kind: kind, At: stamp(now), Version: act.Version, Role: role, Key: act.By, Reason: act.Reason, Signed: raw})
	})
}

// skew refuses a signed act dated too far from the service's clock.
func skew(at, now time.Time) error {
	if d := at.Sub(now); d > MaxSkew || d < -MaxSkew {
		return errs.Newf(errs.InvalidRequest, "the act is dated %s, more than %s from this service's clock (%s); sign it again now", stamp(at), MaxSkew, stamp(now))
	}
	return nil
}

// answers refuses a resolution that is not about r's open proposal: bound
// to other bytes (a denial of an earlier proposal at the same version,
// replayed from the public record), or already recorded once.
func answers(r *Record, act *Resolution) error {
	if act.ProposalSHA256 != digest(r.Open.Document) {
		return errs.Newf(errs.Conflict, "this %s answers another proposal: proposal_sha256 is not the SHA-256 of the open proposal's bytes; sign one for the open proposal", act.Kind).
			WithDetail("proposal_sha256", digest(r.Open.Document))
	}
	if slices.Contains(r.Resolved, act.Digest()) {
		return errs.Newf(errs.Conflict, "this signed %s was already recorded; an act answers once", act.Kind)
	}
	return nil
}
