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
	err := s.st.RunTx(ctx, func(tx store.Tx) error {
		now = s.now() // inside the transaction: see recordRevocations
		var a Agent
		known, err := getOptional(tx, CollAgents, agentID, &a)
		if err != nil {
			return err
		}
		var hs hosts
		if _, err := getOptional(tx, CollHosts, agentID, &hs); err != nil {
			return err
		}
		revoke = hs.Keys
		if known {
			a.Enabled = false
			if err := tx.Set(CollAgents, agentID, a); err != nil {
				return err
			}
		}
		if err := recordRevocations(tx, revoke, now); err != nil {
			return err
		}
		return tx.Set(CollTombstones, agentID, Tombstone{AgentID: agentID, AccountID: a.AccountID, Reason: reason, At: ms(now)})
	})
	if err != nil {
		return txErr(err)
	}
	s.log.Info("agent retired", "agent", agentID, "reason", reason, "credentials_revoked", len(revoke))
	return s.revoke(ctx, revoke, now)
}

// DisableAccount disables an account: its sessions stop working, no
// credential is issued for its agents, and every credential of its agents
// and apps is revoked at the broker.
func (s *Service) DisableAccount(ctx context.Context, accountID, reason string) error {
	var now time.Time
	var revoke []string
	err := s.st.RunTx(ctx, func(tx store.Tx) error {
		now = s.now() // inside the transaction: see recordRevocations
		revoke = nil
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
	return s.revoke(ctx, revoke, now)
}

// recordRevocations writes each key's revocation instant, truncated to the
// second because that is the broker's granularity. Callers read at inside
// their transaction: a mint serialised before it signed its JWT inside its
// own transaction, earlier, so the broker (which refuses iat <= the
// revocation) refuses that JWT whatever order concurrent transactions were
// queued in; a time read before RunTx could be earlier than a mint that
// commits first.
func recordRevocations(tx store.Tx, keys []string, at time.Time) error {
	at = at.Truncate(time.Second)
	for _, k := range keys {
		if err := tx.Set(CollRevocations, k, revocation{Key: k, At: ms(at)}); err != nil {
			return err
		}
	}
	return nil
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

// RevocationPruner is a Revoker that can also forget revocations older
// than an instant (devenv.Mesh, creds.Revoker).
type RevocationPruner interface {
	PruneRevocations(ctx context.Context, before time.Time) (int, error)
}

// revocationMargin is kept beyond the longest credential lifetime before a
// revocation is forgotten: clock skew between the minting instances and
// the brokers, and guest credentials (24 h) minted by another service.
const revocationMargin = 24 * time.Hour

// Sweep is the credential service's scheduled job: it deletes expired
// rate-limit counters and forgets revocations that protect nothing any
// more, and reports how many documents and entries it removed.
func (s *Service) Sweep(ctx context.Context) (int, error) {
	n, err := s.SweepLimits(ctx)
	if err != nil {
		return n, err
	}
	m, err := s.SweepRevocations(ctx)
	return n + m, err
}

// SweepRevocations forgets every revocation older than the longest
// credential lifetime (plus a margin): every JWT it covered has expired,
// so the broker would refuse it anyway. The account JWT's list only grows
// otherwise, and every server receives the whole JWT on each change. With
// NoExpiry, node credentials never lapse and nothing is forgotten. The
// broker is pruned first, then the store; a crash between the two leaves
// documents that a restart re-applies harmlessly and the next sweep
// removes.
func (s *Service) SweepRevocations(ctx context.Context) (int, error) {
	pruner, ok := s.cfg.Revoker.(RevocationPruner)
	if s.cfg.NoExpiry || !ok {
		return 0, nil
	}
	before := s.now().Add(-s.cfg.CredentialTTL - revocationMargin).Truncate(time.Second)
	if _, err := pruner.PruneRevocations(ctx, before); err != nil {
		return 0, errs.Wrap(errs.DependencyFailed, "the broker's revocation list could not be pruned", err)
	}
	var revs []revocation
	if err := store.List(ctx, s.st, CollRevocations, store.Query{}, &revs); err != nil {
		return 0, txErr(err)
	}
	n := 0
	for _, r := range revs {
		if r.At >= before.UnixMilli() {
			continue
		}
		deleted := false
		err := s.st.RunTx(ctx, func(tx store.Tx) error {
			// A newer revocation of the same key may have been recorded
			// since the listing; it stays.
			var cur revocation
			if err := tx.Get(CollRevocations, r.Key, &cur); err != nil {
				return err
			}
			deleted = cur.At < before.UnixMilli()
			if !deleted {
				return nil
			}
			return tx.Delete(CollRevocations, r.Key)
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
