package engagement

import (
	"cmp"
	"context"
	"slices"
	"time"

	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/sow"
	"agentmesh.dev/mesh/shared/store"
)

// MaxListed bounds one listing (ListForAgents): the records it returns,
// and the agents it asks about. The console lists an account's
// engagements with it; an account party to more sees the newest.
const MaxListed = 200

// Summary is one engagement as a listing shows it: its parties, the
// offerings its record is reachable under, and its state now.
type Summary struct {
	SowID     string
	Version   int64
	Client    string
	Seller    string
	Offerings []string
	// State is the §7.1 state now, as the public record names it
	// (formation_requested while the instance awaits the provider's
	// signature, active, amended, terminated, …).
	State   string
	InForce bool
	// InNotice: terminated for convenience, the notice still running.
	InNotice bool
	StartsAt time.Time
	EndsAt   *time.Time
}

// ListForAgents lists the engagements in which any of agents is the
// client or the seller, formed or awaiting the provider's instance
// signature, newest first, at most MaxListed (and only the first
// MaxListed agents are asked about). It reads with equality queries alone
// (client == agent, seller == agent), which Firestore answers from its
// single-field indexes, and settles nothing: the state is computed at the
// time of reading as the public record would show it.
func (s *Service) ListForAgents(ctx context.Context, agents []string) ([]Summary, error) {
	var asked []string
	for _, a := range agents {
		if keys.IsUserPublicKey(a) && !slices.Contains(asked, a) && len(asked) < MaxListed {
			asked = append(asked, a)
		}
	}
	if len(asked) == 0 {
		return nil, nil
	}
	var recs []Record
	err := s.cfg.Store.RunTx(ctx, func(tx store.Tx) error {
		recs = nil
		seen := map[string]bool{}
		for _, a := range asked {
			for _, field := range []string{"client", "seller"} {
				var found []Record
				q := store.Where(field, a)
				q.Limit = MaxListed
				if err := tx.Query(CollRecords, q, &found); err != nil {
					return err
				}
				for _, r := range found {
					if !seen[r.ID] {
						seen[r.ID] = true
						recs = append(recs, r)
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, storeErr(err)
	}
	slices.SortFunc(recs, func(a, b Record) int {
		return cmp.Or(cmp.Compare(b.RequestedAt, a.RequestedAt), cmp.Compare(a.ID, b.ID))
	})
	now := s.now()
	out := make([]Summary, 0, min(len(recs), MaxListed))
	for _, r := range recs {
		if len(out) == MaxListed {
			break
		}
		shown := r.Document
		if !r.Formed() {
			shown = r.Requested
		}
		d, err := sow.Parse(shown)
		if err != nil {
			// A record that no longer reads is the public record's to
			// report (it answers an internal error); the listing skips it.
			s.log.Error("engagement: a stored document does not read", "record", r.ID, "err", err)
			continue
		}
		sum := Summary{SowID: r.SowID, Version: r.Version, Client: r.Client, Seller: r.Seller,
			Offerings: slices.Clone(r.Offerings), StartsAt: parseStamp(d.StartsAt)}
		sum.State, sum.InForce = r.state(d, now)
		if d.EndsAt != "" {
			end := parseStamp(d.EndsAt)
			sum.EndsAt = &end
		}
		if t := r.Termination; t != nil && now.Before(parseStamp(t.EffectiveAt)) {
			sum.InNotice = true
		}
		out = append(out, sum)
	}
	return out, nil
}
