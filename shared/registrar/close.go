package registrar

import (
	"context"
	"slices"
	"strings"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/store"
)

// What account closure (shared/closure) asks of the registrar. Each call
// is idempotent: a closure that was cut off midway runs it again.

// HandlesOf lists the handles an account holds: those it owns and those
// claimed under its address (a handle claimed before the address had an
// account names no account), sorted by handle.
func (s *Service) HandlesOf(ctx context.Context, accountID, email string) ([]account.Handle, error) {
	var out []account.Handle
	err := s.st.RunTx(ctx, func(tx store.Tx) error {
		out = nil
		var owned, mailed []account.Handle
		if err := tx.Query(account.CollHandles, store.Where("account_id", accountID), &owned); err != nil {
			return err
		}
		if email != "" {
			if err := tx.Query(account.CollHandles, store.Where("email", email), &mailed); err != nil {
				return err
			}
		}
		seen := map[string]bool{}
		for _, h := range slices.Concat(owned, mailed) {
			if id := HandleID(h.Handle); !seen[id] {
				seen[id] = true
				out = append(out, h)
			}
		}
		return nil
	})
	slices.SortFunc(out, func(a, b account.Handle) int { return strings.Compare(a.Handle, b.Handle) })
	return out, txErr(err)
}

// ReleaseHandles deletes the handles HandlesOf lists, with the pairing
// codes pending for them: they stop resolving (404) and anyone who proves
// the address may claim them again. It returns the handles it released
// now.
func (s *Service) ReleaseHandles(ctx context.Context, accountID, email string) ([]string, error) {
	hs, err := s.HandlesOf(ctx, accountID, email)
	if err != nil {
		return nil, err
	}
	var released []string
	for chunk := range slices.Chunk(hs, store.DeleteBatch/4) {
		err := s.st.RunTx(ctx, func(tx store.Tx) error {
			var codes []pairing
			for _, h := range chunk {
				var pc []pairing
				if err := tx.Query(CollPairing, store.Where("handle_id", HandleID(h.Handle)), &pc); err != nil {
					return err
				}
				codes = append(codes, pc...)
			}
			for _, pc := range codes {
				if err := tx.Delete(CollPairing, pc.ID); err != nil {
					return err
				}
			}
			for _, h := range chunk {
				if err := tx.Delete(account.CollHandles, HandleID(h.Handle)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return released, txErr(err)
		}
		for _, h := range chunk {
			released = append(released, h.Handle)
		}
	}
	if len(released) > 0 {
		s.log.Info("handles released: account closed", "count", len(released))
	}
	return released, nil
}

// EndSessions deletes the registrar's sessions and pending email codes of
// an address, and the operator name it kept for it before names moved to
// the account, and reports how many sessions it deleted.
func (s *Service) EndSessions(ctx context.Context, email string) (int, error) {
	if email == "" {
		return 0, nil
	}
	n, err := store.DeleteWhere(ctx, s.st, CollSessions, store.Where("email", email), store.Member("id"))
	if err != nil {
		return n, txErr(err)
	}
	err = s.st.RunTx(ctx, func(tx store.Tx) error {
		if err := tx.Delete(CollCodes, codesID(email)); err != nil {
			return err
		}
		return tx.Delete(CollOperators, email)
	})
	return n, txErr(err)
}
