package credential

import (
	"context"
	"errors"
	"slices"
	"time"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/store"
)

// RetireAgent tombstones an agent with a reason and revokes at the broker
// every credential key that carried it, so a connected node is cut off at
// once and its renewal is refused with 403 and this reason.
func (s *Service) RetireAgent(ctx context.Context, agentID, reason string) error {
	if err := CheckAgentID(agentID, "agent id"); err != nil {
		return err
	}
	if reason == "" {
		return bad("a reason is required; it is shown to the node when its renewal is refused")
	}
	var now time.Time
	var revoke []string
	var owner string
	err := s.st.RunTx(ctx, func(tx store.Tx) error {
		now = s.now() // inside the transaction: see recordRevocations
		var a Agent
		known, err := getOptional(tx, CollAgents, agentID, &a)
		if err != nil {
			return err
		}
		owner = a.AccountID
		var hs hosts
		if _, err := getOptional(tx, CollHosts, agentID, &hs); err != nil {
			return err
		}
		revoke = hs.Keys
		if err := recordRevocations(tx, revoke, now); err != nil {
			return err
		}
		if known {
			a.Enabled = false
			if err := tx.Set(CollAgents, agentID, a); err != nil {
				return err
			}
		}
		return tx.Set(CollTombstones, agentID, Tombstone{AgentID: agentID, AccountID: a.AccountID, Reason: reason, At: ms(now)})
	})
	if err != nil {
		return txErr(err)
	}
	s.log.Info("agent retired", "agent", agentID, "reason", reason, "credentials_revoked", len(revoke))
	s.mirrorAccount(ctx, owner)
	err = s.revoke(ctx, revoke, now)
	s.keepRevocation(ctx, owner, []string{agentID}, revoke, reason, now)
	return err
}

// DisableAccount disables an account: its sessions stop working, no
// credential is issued for its agents, and every credential of its agents
// and apps is revoked at the broker.
func (s *Service) DisableAccount(ctx context.Context, accountID, reason string) error {
	var now time.Time
	var revoke, agentIDs []string
	err := s.st.RunTx(ctx, func(tx store.Tx) error {
		now = s.now() // inside the transaction: see recordRevocations
		revoke, agentIDs = nil, nil
		var acct account.Account
		if err := tx.Get(account.CollAccounts, accountID, &acct); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return errs.Newf(errs.NotFound, "no account %s", accountID)
			}
			return err
		}
		var agents []Agent
		if err := tx.Query(CollAgents, store.Where("account_id", accountID), &agents); err != nil {
			return err
		}
		for _, a := range agents {
			agentIDs = append(agentIDs, a.ID)
			var hs hosts
			if _, err := getOptional(tx, CollHosts, a.ID, &hs); err != nil {
				return err
			}
			revoke = append(revoke, hs.Keys...)
		}
		var apps []App
		if err := tx.Query(CollApps, store.Where("account_id", accountID), &apps); err != nil {
			return err
		}
		for _, ap := range apps {
			revoke = append(revoke, ap.Key)
		}
		slices.Sort(revoke)
		revoke = slices.Compact(revoke)
		if err := recordRevocations(tx, revoke, now); err != nil {
			return err
		}
		return tx.Update(account.CollAccounts, accountID, map[string]any{"disabled": true, "disabled_reason": reason, "disabled_at": ms(now)})
	})
	if err != nil {
		return txErr(err)
	}
	s.log.Info("account disabled", "account", accountID, "credentials_revoked", len(revoke))
	s.mirrorAccount(ctx, accountID)
	err = s.revoke(ctx, revoke, now)
	s.keepRevocation(ctx, accountID, agentIDs, revoke, reason, now)
	return err
}

// recordRevocations writes each key's revocation instant, truncated to the
// second because that is the broker's granularity. Callers read at inside
// their transaction: a mint serialised before it signed its JWT inside its
// own transaction, earlier, so the broker (which refuses iat <= the
// revocation) refuses that JWT whatever order concurrent transactions were
// queued in; a time read before RunTx could be earlier than a mint that
// commits first. Each record says until when it protects something: the
// latest expiry of the key's credentials it covers, from their mint
// records (none without expiry, and at least one known). It reads before
// it writes, as a transaction must: call it before the caller's own
// writes.
func recordRevocations(tx store.Tx, keys []string, at time.Time) error {
	at = at.Truncate(time.Second)
	untils := make([]int64, len(keys))
	for i, k := range keys {
		var mints []Mint
		if err := tx.Query(CollMints, store.Query{Where: []store.Eq{{Field: "key", Value: k}}}, &mints); err != nil {
			return err
		}
		var until int64
		for _, m := range mints {
			if m.IssuedAt >= ms(at.Add(time.Second)) {
				continue // issued after the revocation's second: not covered
			}
			if m.ExpiresAt == 0 {
				until = 0
				break
			}
			until = max(until, m.ExpiresAt)
		}
		untils[i] = until
	}
	for i, k := range keys {
		if err := tx.Set(CollRevocations, k, revocation{Key: k, At: ms(at), Until: untils[i]}); err != nil {
			return err
		}
	}
	return nil
}

// RecordRevocations records, in its own transaction, revocations made by
// another service (guest leases) whose credentials all expire by until:
// the broker's list is kept in line with these records (Sweep), and the
// records are forgotten once until has passed.
func RecordRevocations(ctx context.Context, st store.Store, keys []string, at, until time.Time) error {
	at = at.Truncate(time.Second)
	return st.RunTx(ctx, func(tx store.Tx) error {
		for _, k := range keys {
			var cur revocation
			err := tx.Get(CollRevocations, k, &cur)
			switch {
			case err == nil && (cur.At > ms(at) || cur.Until == 0):
				continue // a later or unbounded revocation stands
			case err != nil && !errors.Is(err, store.ErrNotFound):
				return err
			}
			if err := tx.Set(CollRevocations, k, revocation{Key: k, At: ms(at), Until: ms(until)}); err != nil {
				return err
			}
		}
		return nil
	})
}

func (s *Service) revoke(ctx context.Context, keys []string, at time.Time) error {
	if len(keys) == 0 || s.cfg.Revoker == nil {
		return nil
	}
	if err := s.cfg.Revoker.Revoke(ctx, keys, at.Truncate(time.Second)); err != nil {
		// The store already refuses renewal; the broker push can be retried
		// by running the command again (it is idempotent).
		return errs.Wrap(errs.DependencyFailed, "recorded, but the broker could not be told to revoke yet; run it again", err)
	}
	return nil
}

// RevocationSyncer is a Revoker that can also bring the broker's list in
// line with the store's records (devenv.Mesh, creds.Revoker): keys of keep
// revoked at least up to their instants, keys of forget deleted unless
// revoked later.
type RevocationSyncer interface {
	SyncRevocations(ctx context.Context, keep, forget map[string]time.Time) (added, forgotten int, err error)
}

// revocationMargin is kept after a revocation's last credential expires
// before it is forgotten: clock skew between the minting instances and the
// brokers.
const revocationMargin = time.Hour

// Sweep is the credential service's scheduled job: it deletes expired
// rate-limit counters, keeps the broker's revocation list in line with the
// store (SyncRevocations) and the bus's app records too (ResyncApps), and
// reports how many counters, records and entries it removed, restored or
// corrected.
func (s *Service) Sweep(ctx context.Context) (int, error) {
	n, err := s.SweepLimits(ctx)
	if err != nil {
		return n, err
	}
	m, err := s.SyncRevocations(ctx)
	a, aerr := s.ResyncApps(ctx)
	return n + m + a, errors.Join(err, aerr)
}

// SyncRevocations makes the broker's revocation list match the store's
// records, the one source of truth for revocations the control plane made:
//   - a recorded revocation missing at the broker is pushed again (one lost
//     to two instances updating the account JWT at once, or to a NATS
//     configuration regenerated with a fresh preload);
//   - a revocation whose credentials have all expired (its Until, plus a
//     margin, has passed) is forgotten at the broker, then in the store:
//     the list would otherwise only grow, and every server receives the
//     whole JWT on each change.
//
// A revocation without a bound (Until 0: it covers a credential without
// expiry, or ones the store does not know) is never forgotten, whatever
// the current NoExpiry setting; nor is one the store does not hold (made
// by hand). A crash between the broker and the store leaves records that
// the next sweep (or a restart) reconciles.
func (s *Service) SyncRevocations(ctx context.Context) (int, error) {
	syncer, ok := s.cfg.Revoker.(RevocationSyncer)
	if !ok {
		return 0, nil
	}
	var revs []revocation
	if err := store.List(ctx, s.st, CollRevocations, store.Query{}, &revs); err != nil {
		return 0, txErr(err)
	}
	cutoff := ms(s.now().Add(-revocationMargin))
	keep, forget := map[string]time.Time{}, map[string]time.Time{}
	for _, r := range revs {
		if r.Until != 0 && r.Until < cutoff {
			forget[r.Key] = time.UnixMilli(r.At)
		} else {
			keep[r.Key] = time.UnixMilli(r.At)
		}
	}
	if len(keep)+len(forget) == 0 {
		return 0, nil
	}
	added, _, err := syncer.SyncRevocations(ctx, keep, forget)
	if err != nil {
		return 0, errs.Wrap(errs.DependencyFailed, "the broker's revocation list could not be brought in line with the store", err)
	}
	if added > 0 {
		s.log.Warn("revocations missing at the broker were pushed again", "count", added)
	}
	n := added
	for k, at := range forget {
		deleted := false
		err := s.st.RunTx(ctx, func(tx store.Tx) error {
			// A newer revocation of the same key may have been recorded
			// since the listing; it stays.
			var cur revocation
			if err := tx.Get(CollRevocations, k, &cur); err != nil {
				return err
			}
			deleted = cur.At == ms(at) && cur.Until != 0 && cur.Until < cutoff
			if !deleted {
				return nil
			}
			return tx.Delete(CollRevocations, k)
		})
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return n, txErr(err)
		}
		if err == nil && deleted {
			n++
		}
	}
	return n, nil
}
