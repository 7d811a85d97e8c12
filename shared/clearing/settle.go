package clearing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/nats-io/nats.go/jetstream"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/jsonv"
	"agentmesh.dev/mesh/shared/metering"
	"agentmesh.dev/mesh/shared/protocol"
)

// A settlement moves credits between balances that are separate keys of
// one KV bucket, which has no transaction over two keys. So a settlement
// is a record with steps (set.<seller>.<request id>, created once, from
// the admission ticket of that request: the create is what makes it
// happen once, whichever copy and however many copies of the respond), and
// every step is a compare-and-set that leaves a marker
// naming the settlement in the key it changes (the period aggregate, each
// balance). A step run twice (a copy that crashed between the balance and
// the record, a sweep resuming it, two copies racing) finds its marker and
// reads the outcome from it instead of applying it again. Markers are
// cleared by the sweep once the settlement has been settled for
// MarkerKeep, far longer than any one step may take (a run re-reads the
// record from the stream's leader before every step and stops when it
// moved on, and a step is bounded by runTimeout), so no copy still running
// a step can miss one; the record is deleted after Keep, far longer than
// a respond copy stays fresh, and the ticket it was made from is consumed
// before, so no copy of its respond can create it again.
//
//	new ──aggregate──▶ rated ──buyer──▶ charged ──seller, platform──▶ credited ──ledger──▶ settled
//	  └──unratable (a quantity or price beyond 2^53−1)──▶ failed
//
// A grant is a settlement that starts at charged: it only credits.

// Key prefixes of commerce.Bucket beyond the ones the seams name (a prefix
// costs no stream).
const (
	// AggregatePrefix + <consumer owner>.<seller>.<sku digest>.<period>
	// is the consumer owner's rated usage of one SKU's terms in one UTC
	// period (aggregate).
	AggregatePrefix = "agg."
	// LedgerPrefix + <owner>.<13-digit unix ms>-<role>-<settlement key>
	// is one row of an owner's credit history (Entry).
	LedgerPrefix = "led."
)

// PlatformOwner is the owner of the platform's own balance
// (bal.platform), which keeps the markup of the resale path.
const PlatformOwner = "platform"

// Settlement states, in order.
const (
	StateNew      = "new"      // recorded; the usage not yet in the period aggregate
	StateRated    = "rated"    // in the aggregate; the increment and its split known
	StateCharged  = "charged"  // taken from the buyer's balance, at most what it held
	StateCredited = "credited" // paid to the seller's owner and the platform
	StateSettled  = "settled"  // the ledger rows written
	// StateFailed is final too: the sale could not be rated (a quantity or
	// a charge beyond the exactly representable range); nothing moved and
	// it is never retried. Its Reason says why.
	StateFailed = "failed"
)

// final reports whether a settlement in state has nothing left to do.
func final(state string) bool { return state == StateSettled || state == StateFailed }

// Settlement kinds.
const (
	KindSale  = "sale"
	KindGrant = "grant"
)

// Marker keep times (see the package comment at the top of this file).
const (
	// runTimeout bounds one run of a settlement's steps.
	runTimeout = 30 * time.Second
	// MarkerKeep is how long after settling the markers stay.
	MarkerKeep = 2 * time.Minute
)

// Settlement is the value under commerce.SettlementPrefix + Key.
type Settlement struct {
	Key   string `json:"key"`
	Kind  string `json:"kind"`
	State string `json:"state"`
	// RequestID is the answered request's id (sale); RespondID the
	// terminal answer's.
	RequestID string `json:"request_id,omitempty"`
	RespondID string `json:"respond_id,omitempty"`
	Seller    string `json:"seller,omitempty"`
	Requester string `json:"requester,omitempty"`
	Offering  string `json:"offering,omitempty"`
	// ConsumerOwner pays; SellerOwner receives (a grant's grantee).
	ConsumerOwner string `json:"consumer_owner,omitempty"`
	SellerOwner   string `json:"seller_owner,omitempty"`
	SKU           string `json:"sku,omitempty"`
	SKUDigest     string `json:"sku_digest,omitempty"`
	// Price is the SKU's price as published, rated at the first step.
	Price json.RawMessage `json:"price,omitempty"`
	// Period is the UTC period key (commerce.PeriodKey) of At.
	Period string `json:"period,omitempty"`
	// Usage is what the request consumed: the observed requests meter (1)
	// and the declared meters of the respond's receipt.
	Usage     map[string]int64 `json:"usage,omitempty"`
	Resale    bool             `json:"resale,omitempty"`
	MarkupPct int              `json:"markup_pct"`
	// Agreement is the covering agreement's key, from the ticket.
	Agreement string `json:"agreement,omitempty"`
	// CeilingMicro is the request's budget cost ceiling, from the ticket:
	// Retail is clamped to it (upstream: the budget ceiling clamps the
	// charge) and Clamped is what it cut.
	CeilingMicro *int64 `json:"ceiling_micro,omitempty"`
	Clamped      int64  `json:"clamped_micro,omitempty"`
	Split
	// Charged is what the buyer's balance paid, Unpaid the rest of Retail.
	Charged    int64 `json:"charged_micro"`
	Unpaid     int64 `json:"unpaid_micro"`
	ToSeller   int64 `json:"to_seller_micro"`
	ToPlatform int64 `json:"to_platform_micro"`
	// DebtPaid is what the credited owner's unpaid remainder took of
	// ToSeller (commerce.Balance.Unpaid) before the rest reached its
	// credits.
	DebtPaid int64  `json:"debt_paid_micro,omitempty"`
	Reason   string `json:"reason,omitempty"`
	// At is when the request was admitted (the ticket's admitted_at, the
	// agreements service's clock): the usage is aggregated in its period.
	At             string `json:"at"`
	CreatedAt      string `json:"created_at"`
	UpdatedAt      string `json:"updated_at"`
	SettledAt      string `json:"settled_at,omitempty"`
	MarkersCleared bool   `json:"markers_cleared,omitempty"`
}

// balance is the value under commerce.BalancePrefix + owner: the seams'
// commerce.Balance (which the agreements service reads), and the markers
// of the settlements that moved it lately.
type balance struct {
	commerce.Balance
	Pending map[string]int64 `json:"pending,omitempty"`
}

// aggregate is the value under an AggregatePrefix key.
type aggregate struct {
	Meter     string           `json:"meter"`
	Quantity  int64            `json:"quantity"`
	Rated     int64            `json:"rated_micro"`
	Pending   map[string]int64 `json:"pending,omitempty"`
	UpdatedAt string           `json:"updated_at"`
}

// Entry is one row of an owner's credit history (mesh.credits.history).
type Entry struct {
	At   string `json:"at"`
	Kind string `json:"kind"` // purchase, sale, markup or grant
	// AmountMicro is signed: negative leaves the balance.
	AmountMicro  int64  `json:"amount_micro"`
	Currency     string `json:"currency"`
	UnpaidMicro  int64  `json:"unpaid_micro,omitempty"`
	DebtPaid     int64  `json:"debt_paid_micro,omitempty"`
	RequestID    string `json:"request_id,omitempty"`
	Offering     string `json:"offering,omitempty"`
	SKU          string `json:"sku,omitempty"`
	Counterparty string `json:"counterparty,omitempty"`
	Reason       string `json:"reason,omitempty"`
	Settlement   string `json:"settlement"`

	cursor string // the row's key tail, a history page's cursor
}

// Ledger row kinds.
const (
	EntryPurchase = "purchase"
	EntrySale     = "sale"
	EntryMarkup   = "markup"
	EntryGrant    = "grant"
)

// KeyToken is commerce.KeyToken: id as a KV key token.
func KeyToken(id string) string { return commerce.KeyToken(id) }

// SettlementKey is the key of the settlement of seller's answer to
// request id (commerce.SettlementKey).
func SettlementKey(seller, id string) string { return commerce.SettlementKey(seller, id) }

// saleKey is Settlement.Key of seller's answer to request id: the
// settlement key without its prefix.
func saleKey(seller, id string) string {
	return strings.TrimPrefix(commerce.SettlementKey(seller, id), commerce.SettlementPrefix)
}

// GrantKey is the settlement key of a grant made by envelope id.
func GrantKey(id string) string { return "grant-" + KeyToken(id) }

func balanceKey(owner string) string { return commerce.BalancePrefix + owner }

func aggregateKey(s *Settlement) string {
	return AggregatePrefix + s.ConsumerOwner + "." + s.Seller + "." + s.SKUDigest + "." + s.Period
}

// ledgerKey is one ledger row's key: its tail after the owner is one
// token (a settlement key's dot becomes a dash), a history cursor.
func ledgerKey(owner string, at time.Time, role, key string) string {
	return fmt.Sprintf("%s%s.%013d-%s-%s", LedgerPrefix, owner, at.UnixMilli(), role, strings.ReplaceAll(key, ".", "-"))
}

// Marker roles: each key a settlement changes holds its marker under
// <settlement key>/<role>, so a buyer who is also the seller's owner has
// two distinct markers on one balance.
const (
	roleAggregate = "agg"
	roleDebit     = "debit"
	roleCredit    = "credit"
	roleMarkup    = "markup"
)

func marker(s *Settlement, role string) string { return s.Key + "/" + role }

// errCrash stops a run after a step (tests: a copy that dies there).
var errCrash = errors.New("clearing: stopped after a step (test)")

// errGone: the settlement record is no longer there.
var errGone = errors.New("clearing: the settlement record is gone")

// engine runs settlements on the commerce bucket.
type engine struct {
	kv jetstream.KeyValue
	// nc, when set, reads records from the stream's leader
	// (bus.LeaderGet); tests without it read them directly.
	nc  *nats.Conn
	now func() time.Time
	log *slog.Logger
	// crash, when set (tests), is asked after each step whether the copy
	// dies there.
	crash func(s *Settlement) bool
}

// run takes s through its remaining steps to settled. last reports
// whether this call made the last step (of copies running one settlement
// at once, one does).
//
// s is only where to start: before every step the record is read again
// from the stream's leader, and the step run is the stored state's, so a
// snapshot listed long ago (a sweep behind slow runs) never repeats a step
// whose marker may be gone.
func (e *engine) run(ctx context.Context, s *Settlement) (out *Settlement, last bool, err error) {
	key := s.Key
	for {
		cur, found, err := e.load(ctx, key)
		if err != nil {
			return s, false, fmt.Errorf("settlement %s: %w", key, err)
		}
		if !found {
			return s, false, fmt.Errorf("settlement %s: %w", key, errGone)
		}
		s = cur
		if final(s.State) {
			return s, last, nil
		}
		var next *Settlement
		var changed bool
		switch s.State {
		case StateNew:
			next, changed, err = e.rate(ctx, s)
			last = changed && next.State == StateFailed
		case StateRated:
			next, _, err = e.charge(ctx, s)
		case StateCharged:
			next, _, err = e.credit(ctx, s)
		case StateCredited:
			next, changed, err = e.record(ctx, s)
			last = changed
		default:
			return s, false, fmt.Errorf("settlement %s: unknown state %q", s.Key, s.State)
		}
		if err != nil {
			return s, false, fmt.Errorf("settlement %s: %w", s.Key, err)
		}
		s = next
		if e.crash != nil && e.crash(s) {
			return s, false, errCrash
		}
	}
}

// load reads the settlement under key (its tail after the prefix).
func (e *engine) load(ctx context.Context, key string) (*Settlement, bool, error) {
	var b []byte
	var found bool
	var err error
	if e.nc != nil {
		b, found, err = bus.LeaderGet(ctx, e.nc, commerce.Bucket, commerce.SettlementPrefix+key)
	} else {
		var en jetstream.KeyValueEntry
		en, err = e.kv.Get(ctx, commerce.SettlementPrefix+key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, false, nil
		}
		if err == nil {
			b, found = en.Value(), true
		}
	}
	if err != nil || !found {
		return nil, false, err
	}
	var s Settlement
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, false, fmt.Errorf("decode: %w", err)
	}
	return &s, true, nil
}

// errUnratable marks a rating that will never succeed: the settlement
// fails, final, instead of being retried by every sweep.
var errUnratable = errors.New("unratable")

// advance moves the record from s's state to next, applying edit, unless
// another copy moved it already: the stored record is returned either way,
// and changed says which.
func (e *engine) advance(ctx context.Context, s *Settlement, next string, edit func(*Settlement)) (*Settlement, bool, error) {
	from, now := s.State, protocol.FormatTime(e.now())
	out, changed, err := bus.CAS(ctx, e.kv, commerce.SettlementPrefix+s.Key, func(cur *Settlement, exists bool) (*Settlement, error) {
		if !exists {
			return nil, errGone
		}
		if cur.State != from {
			return nil, bus.ErrNoChange
		}
		n := *cur
		if edit != nil {
			edit(&n)
		}
		n.State, n.UpdatedAt = next, now
		if final(next) {
			n.SettledAt = now
		}
		return &n, nil
	})
	if err != nil {
		return nil, false, err
	}
	return out, changed, nil
}

// rate adds the usage to the consumer owner's period aggregate and rates
// the increment: the period's new total rated, minus what the period was
// rated at before. Included allowances, packages and tiers are thereby
// applied over the whole period, not per request.
func (e *engine) rate(ctx context.Context, s *Settlement) (*Settlement, bool, error) {
	next, changed, err := e.rateOnce(ctx, s)
	if errors.Is(err, errUnratable) {
		reason := err.Error()
		if e.log != nil {
			e.log.Warn("settlement failed: the sale cannot be rated", "key", s.Key, "err", err)
		}
		return e.advance(ctx, s, StateFailed, func(n *Settlement) { n.Reason = reason })
	}
	return next, changed, err
}

func (e *engine) rateOnce(ctx context.Context, s *Settlement) (*Settlement, bool, error) {
	v, err := protocol.ParseJSON(s.Price)
	if err != nil {
		return nil, false, fmt.Errorf("price: %w: %w", errUnratable, err)
	}
	price, err := commerce.PriceFromValue(v)
	if err != nil {
		return nil, false, fmt.Errorf("price: %w: %w", errUnratable, err)
	}
	meter, m := price.RatedMeter(), marker(s, roleAggregate)
	q := s.Usage[meter]
	var incr int64
	now := protocol.FormatTime(e.now())
	_, _, err = bus.CAS(ctx, e.kv, aggregateKey(s), func(cur *aggregate, exists bool) (*aggregate, error) {
		a := aggregate{Meter: meter}
		if exists {
			a = *cur
			a.Pending = maps.Clone(cur.Pending)
		}
		if v, done := a.Pending[m]; done {
			incr = v
			return nil, bus.ErrNoChange
		}
		total := a.Quantity + q
		if q < 0 || total > jsonv.MaxSafeInteger || total < a.Quantity {
			return nil, fmt.Errorf("%w: aggregate %s: quantity out of range", errUnratable, meter)
		}
		rated, err := commerce.Rate(price, []metering.Event{{Meter: meter, Quantity: total}}, commerce.RateOptions{Agreed: true})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", errUnratable, err)
		}
		incr = max(0, rated-a.Rated)
		a.Quantity, a.Rated, a.UpdatedAt = total, max(a.Rated, rated), now
		if a.Pending == nil {
			a.Pending = map[string]int64{}
		}
		a.Pending[m] = incr
		return &a, nil
	})
	if err != nil {
		return nil, false, err
	}
	split, err := SplitOf(incr, s.MarkupPct, s.Resale)
	if err != nil {
		// The aggregate holds the usage; the settlement fails with nothing
		// moved (the aggregate's marker is cleared with the others).
		return nil, false, fmt.Errorf("%w: %w", errUnratable, err)
	}
	var clamped int64
	split, clamped = clampSplit(split, s.CeilingMicro)
	return e.advance(ctx, s, StateRated, func(n *Settlement) { n.Split, n.Clamped = split, clamped })
}

// clampSplit clamps a split's retail to the request's budget ceiling
// (nil: none): the seller's owner is paid first, up to the rate, and the
// platform's markup takes the rest. clamped is what the ceiling cut.
func clampSplit(sp Split, ceiling *int64) (Split, int64) {
	if ceiling == nil || sp.Retail <= max(*ceiling, 0) {
		return sp, 0
	}
	c := max(*ceiling, 0)
	clamped := sp.Retail - c
	sp.Retail = c
	sp.Rate = min(sp.Rate, c)
	sp.Markup = c - sp.Rate
	return sp, clamped
}

// charge takes the retail price from the buyer's balance, or what it
// holds when that is less: a balance never goes below zero, and the rest
// is recorded as unpaid, on the settlement and on the balance
// (commerce.Balance.Unpaid), where it makes admission refuse the owner
// until credits paid in have paid it off. Admission checks the balance
// against one unit's retail price, so a metered sale that declares more
// usage than the balance holds, or requests racing for the last credits,
// end here. The marker is written even when nothing is taken, so that two
// copies cannot record two different amounts.
func (e *engine) charge(ctx context.Context, s *Settlement) (*Settlement, bool, error) {
	var charged int64
	if s.Retail > 0 {
		m, now := marker(s, roleDebit), e.now()
		_, _, err := bus.CAS(ctx, e.kv, balanceKey(s.ConsumerOwner), func(cur *balance, exists bool) (*balance, error) {
			var b balance
			if exists {
				b = *cur
				b.Pending = maps.Clone(cur.Pending)
			}
			if v, done := b.Pending[m]; done {
				charged = v
				return nil, bus.ErrNoChange
			}
			charged = min(s.Retail, max(b.Credits, 0))
			b.Credits -= charged
			if unpaid := s.Retail - charged; unpaid > 0 {
				b.Unpaid = min(jsonv.MaxSafeInteger, b.Unpaid+unpaid)
			}
			b.UpdatedAt = now
			if b.Pending == nil {
				b.Pending = map[string]int64{}
			}
			b.Pending[m] = charged
			return &b, nil
		})
		if err != nil {
			return nil, false, err
		}
	}
	toSeller, toPlatform, unpaid := s.Apportion(charged)
	return e.advance(ctx, s, StateCharged, func(n *Settlement) {
		n.Charged, n.ToSeller, n.ToPlatform, n.Unpaid = charged, toSeller, toPlatform, unpaid
	})
}

// credit pays the seller's owner (a grant's grantee) and the platform
// their parts.
func (e *engine) credit(ctx context.Context, s *Settlement) (*Settlement, bool, error) {
	var debt int64
	for _, c := range []struct {
		owner, role string
		amount      int64
	}{{s.SellerOwner, roleCredit, s.ToSeller}, {PlatformOwner, roleMarkup, s.ToPlatform}} {
		if c.amount <= 0 {
			continue
		}
		paid, err := e.add(ctx, c.owner, marker(s, c.role), c.amount)
		if err != nil {
			return nil, false, err
		}
		if c.role == roleCredit {
			debt = paid
		}
	}
	return e.advance(ctx, s, StateCredited, func(n *Settlement) { n.DebtPaid = debt })
}

// debtMarker is the marker beside m recording what the credit under m
// paid of the owner's unpaid remainder.
func debtMarker(m string) string { return m + "/debt" }

// add credits amount to owner's balance once under marker m. The owner's
// unpaid remainder (Balance.Unpaid) is paid off first: debtPaid is what
// it took, and the rest reaches the credits.
func (e *engine) add(ctx context.Context, owner, m string, amount int64) (debtPaid int64, err error) {
	now := e.now()
	_, _, err = bus.CAS(ctx, e.kv, balanceKey(owner), func(cur *balance, exists bool) (*balance, error) {
		var b balance
		if exists {
			b = *cur
			b.Pending = maps.Clone(cur.Pending)
		}
		if _, done := b.Pending[m]; done {
			debtPaid = b.Pending[debtMarker(m)]
			return nil, bus.ErrNoChange
		}
		debtPaid = min(max(b.Unpaid, 0), amount)
		if b.Credits > jsonv.MaxSafeInteger-(amount-debtPaid) {
			return nil, fmt.Errorf("balance %s: credits out of range", owner)
		}
		b.Unpaid -= debtPaid
		b.Credits += amount - debtPaid
		b.UpdatedAt = now
		if b.Pending == nil {
			b.Pending = map[string]int64{}
		}
		b.Pending[m] = amount
		if debtPaid > 0 {
			b.Pending[debtMarker(m)] = debtPaid
		}
		return &b, nil
	})
	return debtPaid, err
}

// record writes the settlement's ledger rows (each created once) and
// marks it settled.
func (e *engine) record(ctx context.Context, s *Settlement) (*Settlement, bool, error) {
	at, err := protocol.ParseTime(s.CreatedAt)
	if err != nil {
		at = e.now()
	}
	base := Entry{At: s.CreatedAt, Currency: commerce.Credits, RequestID: s.RequestID, Offering: s.Offering, SKU: s.SKU,
		Reason: s.Reason, Settlement: s.Key}
	type row struct {
		owner, role string
		e           Entry
	}
	var rows []row
	switch s.Kind {
	case KindGrant:
		g := base
		g.Kind, g.AmountMicro, g.DebtPaid = EntryGrant, s.ToSeller, s.DebtPaid
		rows = append(rows, row{s.SellerOwner, "g", g})
	default:
		// A sale that moved nothing and owes nothing writes no row: a
		// history is not filled with zero rows.
		if s.Charged != 0 || s.Unpaid != 0 {
			b := base
			b.Kind, b.AmountMicro, b.UnpaidMicro, b.Counterparty = EntryPurchase, -s.Charged, s.Unpaid, s.Seller
			rows = append(rows, row{s.ConsumerOwner, "b", b})
		}
		if s.ToSeller > 0 {
			se := base
			se.Kind, se.AmountMicro, se.DebtPaid, se.Counterparty = EntrySale, s.ToSeller, s.DebtPaid, s.Requester
			rows = append(rows, row{s.SellerOwner, "s", se})
		}
		if s.ToPlatform > 0 {
			p := base
			p.Kind, p.AmountMicro, p.Counterparty = EntryMarkup, s.ToPlatform, s.Seller
			rows = append(rows, row{PlatformOwner, "p", p})
		}
	}
	for _, r := range rows {
		b, err := json.Marshal(r.e)
		if err != nil {
			return nil, false, err
		}
		if _, err := e.kv.Create(ctx, ledgerKey(r.owner, at, r.role, s.Key), b); err != nil && !bus.IsConflict(err) {
			return nil, false, fmt.Errorf("ledger: %w", err)
		}
	}
	return e.advance(ctx, s, StateSettled, nil)
}

// clearMarkers removes the markers of a settled settlement from the keys
// it changed, then records that it did.
func (e *engine) clearMarkers(ctx context.Context, s *Settlement) error {
	type mk struct{ key, m string }
	var list []mk
	if s.Kind == KindSale {
		list = append(list, mk{aggregateKey(s), marker(s, roleAggregate)})
		if s.Retail > 0 {
			list = append(list, mk{balanceKey(s.ConsumerOwner), marker(s, roleDebit)})
		}
	}
	if s.ToSeller > 0 {
		list = append(list, mk{balanceKey(s.SellerOwner), marker(s, roleCredit)})
	}
	if s.ToPlatform > 0 {
		list = append(list, mk{balanceKey(PlatformOwner), marker(s, roleMarkup)})
	}
	for _, x := range list {
		_, _, err := bus.CASBytes(ctx, e.kv, x.key, func(cur []byte, exists bool) ([]byte, error) {
			if !exists {
				return nil, bus.ErrNoChange
			}
			var v map[string]json.RawMessage
			if err := json.Unmarshal(cur, &v); err != nil {
				return nil, err
			}
			var pending map[string]int64
			if raw, ok := v["pending"]; ok {
				if err := json.Unmarshal(raw, &pending); err != nil {
					return nil, err
				}
			}
			_, ok := pending[x.m]
			_, okDebt := pending[debtMarker(x.m)]
			if !ok && !okDebt {
				return nil, bus.ErrNoChange
			}
			delete(pending, x.m)
			delete(pending, debtMarker(x.m))
			if len(pending) == 0 {
				delete(v, "pending")
			} else {
				raw, err := json.Marshal(pending)
				if err != nil {
					return nil, err
				}
				v["pending"] = raw
			}
			return json.Marshal(v)
		})
		if err != nil {
			return fmt.Errorf("clear marker of %s on %s: %w", s.Key, x.key, err)
		}
	}
	_, _, err := bus.CAS(ctx, e.kv, commerce.SettlementPrefix+s.Key, func(cur *Settlement, exists bool) (*Settlement, error) {
		if !exists || cur.MarkersCleared {
			return nil, bus.ErrNoChange
		}
		n := *cur
		n.MarkersCleared = true
		return &n, nil
	})
	return err
}
