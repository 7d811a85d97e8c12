package registrar

import (
	"context"
	"slices"
	"time"

	"agentmesh.dev/mesh/shared/account"
	"agentmesh.dev/mesh/shared/secret"
	"agentmesh.dev/mesh/shared/store"
)

// SweepBatch is how many documents one sweep transaction deletes at most
// (Firestore allows 500 writes in a transaction).
const SweepBatch = 100

// SweepInterval is how often the expired documents are deleted: a
// scheduled row (Cloud Scheduler in the cloud, a ticker in meshd).
const SweepInterval = 10 * time.Minute

// sweepDoc is what the sweep reads of any registrar document: its own id,
// its deadline and, for an address's codes, what both were derived from
// before documents carried them.
type sweepDoc struct {
	ID        string        `json:"id"`
	ExpiresAt int64         `json:"expires_at"`
	Email     string        `json:"email"`
	Codes     []secret.Code `json:"codes"`
}

// deadline is when d no longer matters: its expires_at, or for codes
// written before they carried one, the latest of its codes'.
func (d sweepDoc) deadline() int64 {
	if d.ExpiresAt != 0 {
		return d.ExpiresAt
	}
	var last int64
	for _, c := range d.Codes {
		last = max(last, c.ExpiresAt)
	}
	return last
}

// sweptCollections are the registrar's collections of documents that
// expire: email codes, sessions, pairing codes and rate-limit counters.
var sweptCollections = []string{CollCodes, CollSessions, CollPairing, CollRateLimits}

// Sweep deletes the registrar's expired documents: the email codes of an
// address once its last code lapsed, sessions past their 8 hours, pairing
// codes past their 10 minutes and rate-limit counters two windows after
// their last count. Presented codes and sessions are deleted when they are
// presented; Sweep removes those nobody presents again, which would
// otherwise pile up (anyone can ask for codes and pairing attempts).
//
// The store's queries are equality only, so each collection is listed
// whole and its expired documents deleted in transactions of SweepBatch,
// each document read again and deleted only if it is still expired (a
// code mailed meanwhile extends its address's document). Documents carry
// their own id for this; the few written before they did (other than
// email codes, whose id is derived from the address) are left alone.
//
// meshd runs it every ten minutes. It returns how many documents it
// deleted.
func (s *Service) Sweep(ctx context.Context) (int, error) {
	total := 0
	for _, coll := range sweptCollections {
		n, err := s.sweep(ctx, coll)
		total += n
		if err != nil {
			return total, txErr(err)
		}
	}
	n, err := s.moveOperatorNames(ctx)
	return total + n, txErr(err)
}

// moveOperatorNames moves the operator names this registrar kept itself
// (CollOperators) to the addresses' accounts, where they live now
// (account.SetOperatorName: an account's own name stays), deleting each
// record. Claim moves an address's record when it claims; this moves the
// rest, so that the console and minting see them too.
func (s *Service) moveOperatorNames(ctx context.Context) (int, error) {
	var recs []legacyOperator
	if err := store.List(ctx, s.st, CollOperators, store.Query{}, &recs); err != nil {
		return 0, err
	}
	moved := 0
	for _, r := range recs {
		if r.Email == "" {
			continue // every record carries its address, which is its id
		}
		err := s.st.RunTx(ctx, func(tx store.Tx) error {
			var cur legacyOperator
			found, err := getOptional(tx, CollOperators, r.Email, &cur)
			if err != nil || !found {
				return err
			}
			acct, err := account.AccountOfEmail(tx, r.Email)
			if err != nil {
				return err
			}
			if _, err := account.SetOperatorName(tx, r.Email, acct, cur.Name, s.now()); err != nil {
				return err
			}
			return tx.Delete(CollOperators, r.Email)
		})
		if err != nil {
			return moved, err
		}
		moved++
	}
	return moved, nil
}

// sweep deletes the expired documents of coll.
func (s *Service) sweep(ctx context.Context, coll string) (int, error) {
	now := s.now().UnixMilli()
	var docs []sweepDoc
	if err := store.List(ctx, s.st, coll, store.Query{}, &docs); err != nil {
		return 0, err
	}
	var ids []string
	for _, d := range docs {
		if id := docID(coll, d); id != "" && d.deadline() != 0 && now >= d.deadline() {
			ids = append(ids, id)
		}
	}
	deleted := 0
	for batch := range slices.Chunk(ids, SweepBatch) {
		n := 0
		err := s.st.RunTx(ctx, func(tx store.Tx) error {
			n = 0
			var gone []string
			for _, id := range batch {
				var d sweepDoc
				found, err := getOptional(tx, coll, id, &d)
				if err != nil {
					return err
				}
				if found && d.deadline() != 0 && now >= d.deadline() {
					gone = append(gone, id)
				}
			}
			for _, id := range gone {
				if err := tx.Delete(coll, id); err != nil {
					return err
				}
			}
			n = len(gone)
			return nil
		})
		if err != nil {
			return deleted, err
		}
		deleted += n
	}
	return deleted, nil
}

// docID is the id of a listed document: the one it carries, or for an
// address's codes, the one derived from the address.
func docID(coll string, d sweepDoc) string {
	switch {
	case d.ID != "":
		return d.ID
	case coll == CollCodes && d.Email != "":
		return codesID(d.Email)
	}
	return ""
}
