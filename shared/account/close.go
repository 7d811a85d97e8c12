package account

import (
	"context"
	"errors"

	"agentmesh.dev/mesh/shared/store"
)

// What account closure (shared/closure) asks of this service. Each call
// is idempotent: a closure that was cut off midway runs it again.

// KeyCounts are what an account holds that closure revokes or purges.
type KeyCounts struct {
	UnusedAgentKeys int
	APITokens       int // not revoked
	Passkeys        int
	Sessions        int // not revoked, not expired
}

// Counts counts what the account holds, for the closure preview.
func (s *Service) Counts(ctx context.Context, accountID string) (KeyCounts, error) {
	var c KeyCounts
	now := s.now()
	err := s.st.RunTx(ctx, func(tx store.Tx) error {
		c = KeyCounts{}
		var ks []AgentKey
		if err := tx.Query(CollAgentKeys, store.Where("account_id", accountID), &ks); err != nil {
			return err
		}
		for _, k := range ks {
			if k.Usable(now) {
				c.UnusedAgentKeys++
			}
		}
		var ts []APIToken
		if err := tx.Query(CollAPITokens, store.Where("account_id", accountID), &ts); err != nil {
			return err
		}
		for _, t := range ts {
			if t.RevokedAt == 0 {
				c.APITokens++
			}
		}
		var ss []Session
		if err := tx.Query(CollSessions, store.Where("account_id", accountID), &ss); err != nil {
			return err
		}
		for _, se := range ss {
			if !se.Revoked && now.UnixMilli() < se.ExpiresAt {
				c.Sessions++
			}
		}
		var set passkeySet
		if err := tx.Get(CollPasskeys, accountID, &set); err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		c.Passkeys = len(set.Credentials)
		return nil
	})
	return c, txErr(err)
}

// RevokeKeys revokes every unused agent key (am_) and every API token
// (amt_) of the account, and reports how many it revoked now.
func (s *Service) RevokeKeys(ctx context.Context, accountID string) (int, error) {
	n := 0
	err := s.st.RunTx(ctx, func(tx store.Tx) error {
		n = 0
		now := ms(s.now())
		var ks []AgentKey
		if err := tx.Query(CollAgentKeys, store.Where("account_id", accountID), &ks); err != nil {
			return err
		}
		var ts []APIToken
		if err := tx.Query(CollAPITokens, store.Where("account_id", accountID), &ts); err != nil {
			return err
		}
		for _, k := range ks {
			if k.ClaimedAt == 0 && k.RevokedAt == 0 {
				if err := tx.Update(CollAgentKeys, k.Hash, map[string]any{"revoked_at": now}); err != nil {
					return err
				}
				n++
			}
		}
		for _, t := range ts {
			if t.RevokedAt == 0 {
				if err := tx.Update(CollAPITokens, t.Hash, map[string]any{"revoked_at": now}); err != nil {
					return err
				}
				n++
			}
		}
		return nil
	})
	return n, txErr(err)
}

// EndSessions deletes the account's sessions and passkey ceremonies and
// the sign-in code pending for its address, and reports how many
// documents it deleted.
func (s *Service) EndSessions(ctx context.Context, accountID, email string) (int, error) {
	n := 0
	for _, coll := range []string{CollSessions, CollCeremonies} {
		m, err := store.DeleteWhere(ctx, s.st, coll, store.Where("account_id", accountID), store.Member("id"))
		n += m
		if err != nil {
			return n, txErr(err)
		}
	}
	if email != "" {
		err := s.st.RunTx(ctx, func(tx store.Tx) error { return tx.Delete(CollCodes, codeID(email)) })
		if err != nil {
			return n, txErr(err)
		}
	}
	return n, nil
}

// PurgeAccount deletes the account's records: its agent keys, API tokens,
// passkeys and connect requests, its address's index entry (when it still
// names this account, so the address may sign up afresh) and last the
// account itself. It reports how many keys, tokens and requests it
// deleted.
func (s *Service) PurgeAccount(ctx context.Context, accountID, email string) (int, error) {
	n := 0
	for _, c := range []struct{ coll, id string }{{CollAgentKeys, "hash"}, {CollAPITokens, "hash"}, {CollConnects, "id"}} {
		m, err := store.DeleteWhere(ctx, s.st, c.coll, store.Where("account_id", accountID), store.Member(c.id))
		n += m
		if err != nil {
			return n, txErr(err)
		}
	}
	err := s.st.RunTx(ctx, func(tx store.Tx) error {
		if email != "" {
			var idx emailIndex
			switch err := tx.Get(CollEmails, email, &idx); {
			case err == nil && idx.AccountID == accountID:
				if err := tx.Delete(CollEmails, email); err != nil {
					return err
				}
			case err != nil && !errors.Is(err, store.ErrNotFound):
				return err
			}
		}
		if err := tx.Delete(CollPasskeys, accountID); err != nil {
			return err
		}
		return tx.Delete(CollAccounts, accountID)
	})
	return n, txErr(err)
}
