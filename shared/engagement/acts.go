package engagement

import (
	"context"
	"errors"
	"slices"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/sow"
	"agentmesh.dev/mesh/shared/store"
)

// actRecord reads the formed engagement a signed act names and checks the
// act's offering is in its scope and its date near the clock.
func (s *Service) actRecord(ctx context.Context, a *Act, now time.Time) (*Record, error) {
	r, err := s.formedRecord(ctx, RecordID(a.Client, a.Seller, a.SowID), a.SowID)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(r.Offerings, a.Offering) && !slices.Contains(r.Retired, a.Offering) {
		return nil, errs.Newf(errs.InvalidRequest, "offering %q is not in this engagement's scope", a.Offering)
	}
	return r, skew(a.At, now)
}

// sameAct reports whether the signed act kept as raw carries sig: the same
// signed object, however it was spaced when sent again.
func sameAct(raw []byte, sig string) bool {
	v, err := protocol.ParseJSON(raw)
	if err != nil {
		return false
	}
	m, _ := v.(map[string]any)
	return m != nil && m["sig"] == sig
}

// Terminate records a signed termination notice (§5.9) by either seat's
// owner, for the governing version. For cause, it ends the engagement at
// once and its reason is on the public record; for convenience, the
// notice clock starts and the engagement stays in force until
// convenience_notice_hours have passed. A for-cause notice may follow a
// convenience notice still running; anything else after a termination is
// refused. The mirrored terms carry when it takes effect.
func (s *Service) Terminate(ctx context.Context, raw []byte) (*Record, error) {
	t, err := ParseTermination(raw)
	if err != nil {
		return nil, err
	}
	now := s.now()
	r, err := s.actRecord(ctx, &t.Act, now)
	if err != nil {
		return nil, err
	}
	if ex := r.Termination; ex != nil && sameAct(ex.Notice, t.Sig) {
		return s.mirrorAfter(ctx, r) // the same signed notice again
	}
	role := r.seatOf(t.By)
	if role == "" {
		return nil, errs.New(errs.Forbidden, "only the owner of either seat terminates an engagement, and the notice is signed by neither (§5.9)")
	}
	if t.Version != r.Version {
		return nil, errs.Newf(errs.Conflict, "the notice names version %d; the governing version is %d", t.Version, r.Version).WithDetail("version", r.Version)
	}
	d, err := sow.Parse(r.Document)
	if err != nil {
		return nil, errs.Wrap(errs.InternalError, "the governing document no longer reads", err)
	}
	if d.Phase(now) == sow.StateLapsed {
		return nil, errs.Newf(errs.Conflict, "this engagement lapsed at %s; there is nothing left to terminate", d.EndsAt)
	}
	effective := now
	if !t.ForCause {
		effective = now.Add(time.Duration(min(d.Termination.ConvenienceNoticeHours, MaxNoticeHours)) * time.Hour)
	}
	entry := &TerminationEntry{Notice: raw, Role: role, By: t.By, ForCause: t.ForCause, Reason: t.Reason, SignedAt: stamp(t.At),
		RecordedAt: stamp(now), EffectiveAt: stamp(effective)}
	rec, err := s.update(ctx, r.ID, func(tx store.Tx, rec *Record) error {
		if ex := rec.Termination; ex != nil {
			if sameAct(ex.Notice, t.Sig) {
				return errSame
			}
			if !t.ForCause || ex.ForCause || !now.Before(parseStamp(ex.EffectiveAt)) {
				return errs.Newf(errs.Conflict, "this engagement is already terminated, effective %s", ex.EffectiveAt).WithDetail("effective_at", ex.EffectiveAt)
			}
		}
		if rec.Version != t.Version {
			return errs.New(errs.Conflict, "the engagement changed while this was recorded; read it and sign the notice again")
		}
		rec.Termination, rec.MirrorPending = entry, true
		if rec.Open != nil {
			// A terminated engagement takes no amendments: its open
			// proposal closes with the notice.
			if err := closeOpen(tx, rec, now, "the engagement was terminated; a terminated engagement takes no amendments (§5.9)"); err != nil {
				return err
			}
		}
		return appendEvent(tx, rec, Event{Kind: EventTerminated, At: stamp(now), Version: t.Version, Role: role, Key: t.By, Reason: t.Reason, Signed: raw})
	})
	if err != nil {
		return nil, err
	}
	return s.mirrorAfter(ctx, rec)
}

// AddReview appends a signed review by the client seat's owner, the
// buyer (§15): append-only (a changed mind is a second review), stored
// once per signature (the same signed review twice is one review).
// duplicate reports that it was already stored.
func (s *Service) AddReview(ctx context.Context, raw []byte) (rev *StoredReview, duplicate bool, err error) {
	rv, err := ParseReview(raw)
	if err != nil {
		return nil, false, err
	}
	now := s.now()
	r, err := s.actRecord(ctx, &rv.Act, now)
	if r == nil {
		return nil, false, err
	}
	id := r.ID + "." + rv.Digest()
	var got StoredReview
	switch gerr := store.Get(ctx, s.cfg.Store, CollReviews, id, &got); {
	case gerr == nil:
		// The same signed review again: its date was checked when it was
		// first stored.
		return &got, true, nil
	case !errors.Is(gerr, store.ErrNotFound):
		return nil, false, storeErr(gerr)
	case err != nil:
		return nil, false, err
	}
	if rv.By != r.ClientOwner {
		return nil, false, errs.New(errs.Forbidden, "a review is signed by the buyer: the owner of the engagement's client seat; this one is not (§15)")
	}
	st := &StoredReview{Record: r.ID, Digest: rv.Digest(), Review: raw, Verdict: rv.Verdict, Reason: rv.Reason, TaskID: rv.TaskID,
		SignedAt: stamp(rv.At), StoredAt: stamp(now)}
	err = s.cfg.Store.RunTx(ctx, func(tx store.Tx) error {
		got = StoredReview{}
		switch err := tx.Get(CollReviews, id, &got); {
		case err == nil:
			*st, duplicate = got, true
			return nil
		case !errors.Is(err, store.ErrNotFound):
			return err
		}
		var rec Record
		if err := tx.Get(CollRecords, r.ID, &rec); err != nil {
			return err
		}
		if rec.ReviewCount >= MaxReviews {
			return errs.Newf(errs.QuotaExceeded, "this engagement holds %d reviews, the most one record keeps", MaxReviews)
		}
		duplicate = false
		n := rec.ReviewCount + 1
		st.Seq = n
		if err := tx.Create(CollReviews, id, st); err != nil {
			return err
		}
		if err := tx.Create(CollReviewOrder, reviewOrderID(r.ID, n), reviewOrder{Digest: st.Digest}); err != nil {
			return err
		}
		return tx.Update(CollRecords, r.ID, map[string]any{"review_count": n})
	})
	if err != nil {
		return nil, false, storeErr(err)
	}
	return st, duplicate, nil
}
