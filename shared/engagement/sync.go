package engagement

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/sow"
	"agentmesh.dev/mesh/shared/store"
)

// maxMirrorAttempts bounds Mirror's rounds when other writers keep changing
// the same keys; past it the mirror job tries again.
const maxMirrorAttempts = 5

// mirrorAfter mirrors a change just recorded and returns the record as it
// then stands. A failure to mirror is not the caller's: the change is
// recorded, the record stays MirrorPending and the mirror job
// (SyncPending) writes it.
func (s *Service) mirrorAfter(ctx context.Context, rec *Record) (*Record, error) {
	if err := s.Mirror(ctx, rec.ID); err != nil {
		s.log.Warn("engagement terms not mirrored; the mirror job retries", "record", rec.ID, "err", err)
		return rec, nil
	}
	var now Record
	if err := store.Get(ctx, s.cfg.Store, CollRecords, rec.ID, &now); err != nil {
		return rec, nil
	}
	return &now, nil
}

// Mirror writes the terms of record id onto the bus under every offering
// in scope whose index entry names this record, and removes those of
// offerings an amendment took out of scope; it keeps this record's entry
// in the seller and client's scope list (commerce.EngagementScopeKey).
// Each write is a compare-and-set against the revision read before the
// store was read, so a write from an older read of the store never
// replaces one from a newer read; and an offering the index gives to
// another engagement (a renewal formed after this one ended) is never
// written, so an ended engagement's terms never replace its successor's.
// It then clears MirrorPending unless the record changed meanwhile.
func (s *Service) Mirror(ctx context.Context, id string) error {
	if s.cfg.Terms == nil {
		return nil
	}
	for attempt := 1; ; attempt++ {
		if attempt > maxMirrorAttempts {
			return fmt.Errorf("engagement %s: the terms kept changing under %d rounds", id, maxMirrorAttempts)
		}
		var first Record
		if err := store.Get(ctx, s.cfg.Store, CollRecords, id, &first); err != nil {
			return err
		}
		if !first.Formed() {
			return nil
		}
		names := slices.Concat(first.Offerings, first.Retired)
		vals, revs := map[string][]byte{}, map[string]uint64{}
		for _, o := range names {
			v, rev, err := s.cfg.Terms.Get(ctx, commerce.EngagementKey(first.Seller, first.Client, o))
			if err != nil {
				return err
			}
			vals[o], revs[o] = v, rev
		}
		scopeKey := commerce.EngagementScopeKey(first.Seller, first.Client)
		scopeVal, scopeRev, err := s.cfg.Terms.Get(ctx, scopeKey)
		if err != nil {
			return err
		}
		var rec Record
		owned := map[string]bool{}
		err = s.cfg.Store.RunTx(ctx, func(tx store.Tx) error {
			rec = Record{}
			clear(owned)
			if err := tx.Get(CollRecords, id, &rec); err != nil {
				return err
			}
			for _, o := range rec.Offerings {
				var e indexEntry
				switch err := tx.Get(CollIndex, IndexID(rec.Client, rec.Seller, o), &e); {
				case err == nil:
					owned[o] = e.Record == id
				case !errors.Is(err, store.ErrNotFound):
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		if !slices.Equal(slices.Concat(rec.Offerings, rec.Retired), names) {
			continue // the scope moved between the reads
		}
		t, err := rec.terms()
		if err != nil {
			return fmt.Errorf("engagement %s: %w", id, err)
		}
		val, err := json.Marshal(t)
		if err != nil {
			return err
		}
		conflict := false
		for _, o := range rec.Offerings {
			if !owned[o] || bytes.Equal(vals[o], val) {
				continue // another engagement's key now, or already written
			}
			var cur commerce.EngagementTerms
			if vals[o] != nil && json.Unmarshal(vals[o], &cur) == nil && cur.SowID == rec.SowID && cur.Version > t.Version {
				continue // a newer version of this engagement is there
			}
			switch err := s.cfg.Terms.Put(ctx, commerce.EngagementKey(rec.Seller, rec.Client, o), val, revs[o]); {
			case errors.Is(err, ErrConflict):
				conflict = true
			case err != nil:
				return err
			}
		}
		for _, o := range rec.Retired {
			if slices.Contains(rec.Offerings, o) || vals[o] == nil {
				continue
			}
			var cur commerce.EngagementTerms
			if json.Unmarshal(vals[o], &cur) == nil && cur.SowID != rec.SowID {
				continue // another engagement's terms now
			}
			switch err := s.cfg.Terms.Delete(ctx, commerce.EngagementKey(rec.Seller, rec.Client, o), revs[o]); {
			case errors.Is(err, ErrConflict):
				conflict = true
			case err != nil:
				return err
			}
		}
		switch err := s.mirrorScope(ctx, scopeKey, scopeVal, scopeRev, &rec, t); {
		case errors.Is(err, ErrConflict):
			conflict = true
		case err != nil:
			return err
		}
		if conflict {
			continue
		}
		return s.cfg.Store.RunTx(ctx, func(tx store.Tx) error {
			var now Record
			if err := tx.Get(CollRecords, id, &now); err != nil {
				return err
			}
			if now.Seq != rec.Seq || !now.MirrorPending {
				return nil
			}
			return tx.Update(CollRecords, id, map[string]any{"mirror_pending": false})
		})
	}
}

// mirrorScope keeps rec's entry in the seller and client's scope list
// (read as cur at rev): present while rec grades scope enforced and has
// not ended, absent otherwise. Entries of other engagements that can no
// longer come into force are dropped on the way.
func (s *Service) mirrorScope(ctx context.Context, key string, cur []byte, rev uint64, rec *Record, t *commerce.EngagementTerms) error {
	now := s.now()
	var list []commerce.EngagementTerms
	if cur != nil {
		if err := json.Unmarshal(cur, &list); err != nil {
			list = nil // unreadable: rewritten from this record
		}
	}
	next := slices.DeleteFunc(slices.Clone(list), func(e commerce.EngagementTerms) bool {
		return e.SowID == rec.SowID || over(e, now)
	})
	if d, err := sow.Parse(rec.Document); err == nil && d.Scope.Grade == sow.Enforced && !over(*t, now) {
		next = append(next, *t)
	}
	if len(next) == 0 {
		if cur == nil {
			return nil
		}
		return s.cfg.Terms.Delete(ctx, key, rev)
	}
	val, err := json.Marshal(next)
	if err != nil {
		return err
	}
	if bytes.Equal(val, cur) {
		return nil
	}
	return s.cfg.Terms.Put(ctx, key, val, rev)
}

// over reports whether terms can no longer be in force: lapsed or
// terminated to effect (not merely not yet started).
func over(t commerce.EngagementTerms, now time.Time) bool {
	return t.Exhausted || (t.EndsAt != nil && !now.Before(*t.EndsAt)) || (t.EffectiveUntil != nil && !now.Before(*t.EffectiveUntil))
}

// MirrorBatch bounds one SyncPending run.
const MirrorBatch = 100

// SyncPending mirrors the records whose terms have not reached the bus
// (the scheduled job). It reports how many it mirrored.
func (s *Service) SyncPending(ctx context.Context) (int, error) {
	if s.cfg.Terms == nil {
		return 0, nil
	}
	var pending []Record
	if err := store.List(ctx, s.cfg.Store, CollRecords, store.Query{Where: []store.Eq{{Field: "mirror_pending", Value: true}}, Limit: MirrorBatch}, &pending); err != nil {
		return 0, err
	}
	n := 0
	var errList []error
	for _, r := range pending {
		if err := s.Mirror(ctx, r.ID); err != nil {
			errList = append(errList, err)
			continue
		}
		n++
	}
	return n, errors.Join(errList...)
}
