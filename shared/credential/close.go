package credential

import (
	"context"
	"slices"
	"time"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/store"
)

// What account closure (shared/closure) asks of this service. Each call
// is idempotent: a closure that was cut off midway runs it again.

// ReasonAccountClosed is the reason a closed account's agents are
// tombstoned with; a node whose renewal is refused reads it.
const ReasonAccountClosed = "its account was closed by its owner"

// Closed is what CloseAccount did.
type Closed struct {
	// Agents are every agent the account ever bound, sorted.
	Agents []string
	// Revoked is how many credential keys were revoked at the broker
	// (those that carried the agents, and the apps').
	Revoked int
}

// CloseAccount takes everything the account's credentials reach away at
// once: the account is marked disabled (no credential is issued for its
// agents again), each of its agents is tombstoned with
// ReasonAccountClosed, its apps are marked revoked, and every credential
// key that carried one of its agents, and every app key, is revoked at the
// broker, which closes their live connections. The keys are the agents'
// host records (the last maxHostKeys of each) and every unexpired mint
// record of the account or carrying one of its agents, so no credential
// minted for it stays live however many were minted. It is DisableAccount plus
// the tombstones, and safe to run again.
func (s *Service) CloseAccount(ctx context.Context, accountID string) (Closed, error) {
	var now time.Time
	var out Closed
	var revoke []string
	err := s.st.RunTx(ctx, func(tx store.Tx) error {
		now = s.now() // inside the transaction: see recordRevocations
		out, revoke = Closed{}, nil
		var acct account.Account
		acctKnown, err := getOptional(tx, account.CollAccounts, accountID, &acct)
		if err != nil {
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
			out.Agents = append(out.Agents, a.ID)
		}
		var apps []App
		if err := tx.Query(CollApps, store.Where("account_id", accountID), &apps); err != nil {
			return err
		}
		for _, ap := range apps {
			revoke = append(revoke, ap.Key)
		}
		live, err := liveMintKeys(tx, accountID, out.Agents, now)
		if err != nil {
			return err
		}
		revoke = append(revoke, live...)
		slices.Sort(revoke)
		revoke = slices.Compact(revoke)
		if err := recordRevocations(tx, revoke, now); err != nil {
			return err
		}
		// Writes.
		for _, a := range agents {
			if a.Enabled {
				a.Enabled = false
				if err := tx.Set(CollAgents, a.ID, a); err != nil {
					return err
				}
			}
			if err := tx.Set(CollTombstones, a.ID, Tombstone{AgentID: a.ID, AccountID: accountID, Reason: ReasonAccountClosed, At: ms(now)}); err != nil {
				return err
			}
		}
		for _, ap := range apps {
			if ap.RevokedAt == 0 {
				if err := tx.Update(CollApps, ap.ID, map[string]any{"revoked_at": ms(now)}); err != nil {
					return err
				}
			}
		}
		if acctKnown && !acct.Disabled {
			return tx.Update(account.CollAccounts, accountID, map[string]any{"disabled": true, "disabled_reason": "closed by its owner", "disabled_at": ms(now)})
		}
		return nil
	})
	if err != nil {
		return Closed{}, txErr(err)
	}
	slices.Sort(out.Agents)
	out.Revoked = len(revoke)
	s.log.Info("account closing: credentials revoked", "account", accountID, "agents", len(out.Agents), "credentials_revoked", len(revoke))
	return out, s.revoke(ctx, revoke, now)
}

// liveMintKeys are the keys of the unexpired mints (no expiry, or one after
// now) recorded for the account, or carrying one of its agents: node and
// job credentials can be minted for agents no account owned yet, and their
// records then name no account.
func liveMintKeys(tx store.Tx, accountID string, agents []string, now time.Time) ([]string, error) {
	var mints []Mint
	if err := tx.Query(CollMints, store.Where("account_id", accountID), &mints); err != nil {
		return nil, err
	}
	for _, kind := range []string{"node", "job"} {
		var more []Mint
		if err := tx.Query(CollMints, store.Where("kind", kind), &more); err != nil {
			return nil, err
		}
		for _, m := range more {
			if m.AccountID == "" && slices.ContainsFunc(m.Agents, func(a string) bool { return slices.Contains(agents, a) }) {
				mints = append(mints, m)
			}
		}
	}
	var out []string
	for _, m := range mints {
		if m.Key != "" && (m.ExpiresAt == 0 || m.ExpiresAt > ms(now)) {
			out = append(out, m.Key)
		}
	}
	return out, nil
}

// PurgeAccount deletes the credential records of a closed account: its
// agents, the host records of those agents (which credential keys carried
// them), its apps and the record of every credential minted for it. Two
// kinds of record stay, because they protect: the revocations of its
// credential keys (until the credentials expire, the broker's list is
// kept in line with them) and the tombstones of agents (so the keys stay
// refused until someone proves one under a live account), from which the
// account's id is removed. It reports how many documents it deleted.
func (s *Service) PurgeAccount(ctx context.Context, accountID string, agents []string) (int, error) {
	n := 0
	for _, c := range []struct{ coll, id string }{{CollMints, "id"}, {CollApps, "id"}, {CollAgents, "id"}} {
		m, err := store.DeleteWhere(ctx, s.st, c.coll, store.Where("account_id", accountID), store.Member(c.id))
		n += m
		if err != nil {
			return n, txErr(err)
		}
	}
	for chunk := range slices.Chunk(agents, store.DeleteBatch/2) {
		err := s.st.RunTx(ctx, func(tx store.Tx) error {
			tombs := make([]*Tombstone, len(chunk))
			for i, id := range chunk {
				var t Tombstone
				found, err := getOptional(tx, CollTombstones, id, &t)
				if err != nil {
					return err
				}
				if found && t.AccountID == accountID {
					tombs[i] = &t
				}
			}
			for i, id := range chunk {
				if err := tx.Delete(CollHosts, id); err != nil {
					return err
				}
				if t := tombs[i]; t != nil {
					t.AccountID = ""
					if err := tx.Set(CollTombstones, id, *t); err != nil {
						return err
					}
				}
			}
			return nil
		})
		if err != nil {
			return n, txErr(err)
		}
	}
	return n, nil
}
