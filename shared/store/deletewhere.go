package store

import (
	"context"
	"fmt"
)

// DeleteBatch is how many documents one DeleteWhere transaction deletes:
// well under Firestore's 500 writes per commit.
const DeleteBatch = 200

// DeleteWhere deletes every document of coll matching q.Where, at most
// DeleteBatch per transaction, and reports how many it deleted. The store
// does not return document ids, so idOf reads each one's id from the
// document (documents that are queried for deletion carry it); a document
// whose id cannot be read stops it with ErrInvalid rather than loop.
// Running it again after an interruption is safe: what is gone is not
// found again. q's order and limit are ignored.
func DeleteWhere(ctx context.Context, s Store, coll string, q Query, idOf func(doc map[string]any) string) (int, error) {
	q = Query{Where: q.Where, Limit: DeleteBatch}
	n := 0
	for {
		var got int
		err := s.RunTx(ctx, func(tx Tx) error {
			got = 0
			var docs []map[string]any
			if err := tx.Query(coll, q, &docs); err != nil {
				return err
			}
			ids := make([]string, 0, len(docs))
			for _, d := range docs {
				id := idOf(d)
				if id == "" {
					return fmt.Errorf("%w: a document of %s has no id to delete it by", ErrInvalid, coll)
				}
				ids = append(ids, id)
			}
			for _, id := range ids {
				if err := tx.Delete(coll, id); err != nil {
					return err
				}
			}
			got = len(ids)
			return nil
		})
		if err != nil {
			return n, err
		}
		n += got
		if got < DeleteBatch {
			return n, nil
		}
	}
}

// Member is the idOf of DeleteWhere for documents that hold their id in a
// top-level string member.
func Member(name string) func(map[string]any) string {
	return func(d map[string]any) string {
		s, _ := d[name].(string)
		return s
	}
}
