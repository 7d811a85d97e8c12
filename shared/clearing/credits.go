package clearing

import (
	"context"
	"encoding/json"
	"slices"
	"strings"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/jsonv"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/registry"
)

// History paging of mesh.credits.history.
const (
	DefaultHistoryLimit = 50
	MaxHistoryLimit     = 200
	maxReason           = 200
)

// BalanceView is the answer of mesh.credits.balance (and of a grant).
type BalanceView struct {
	Owner     string `json:"owner"`
	Credits   int64  `json:"credits"` // micro-credits
	Currency  string `json:"currency"`
	UpdatedAt string `json:"updated_at,omitempty"`
}

// grant serves mesh.internal.credits.grant (the services key only):
// {owner, credits, reason?} credits owner's balance with credits
// micro-credits, once per request envelope, and answers {owner, credits,
// currency, updated_at} with the balance after it.
func (w *Worker) grant(ctx context.Context, r *bus.Request) (any, error) {
	if err := w.svc.RequireServices(r); err != nil {
		return nil, err
	}
	q := r.Object()
	if k, bad := jsonv.Unknown(q, "owner", "credits", "reason"); bad {
		return nil, errs.Newf(errs.InvalidRequest, "a grant takes {owner, credits, reason}; %q is not one of them", k)
	}
	owner, _ := q["owner"].(string)
	if !keys.IsUserPublicKey(owner) {
		return nil, errs.New(errs.InvalidRequest, "owner must be an owner's public key (U…, 56 characters)")
	}
	amount, ok := jsonv.PosInt(q["credits"])
	if !ok {
		return nil, errs.New(errs.InvalidRequest, "credits must be a positive whole number of micro-credits (1 credit = 1,000,000)")
	}
	reason, ok := jsonv.Text(q["reason"], maxReason)
	if q["reason"] != nil && !ok {
		return nil, errs.Newf(errs.InvalidRequest, "reason, when given, is a text of at most %d characters", maxReason)
	}
	if reason == "" {
		reason = "granted by the operator"
	}
	now := protocol.FormatTime(w.svc.Now())
	key := GrantKey(r.Env.ID)
	rec := &Settlement{Key: key, Kind: KindGrant, State: StateCharged, RequestID: r.Env.ID, SellerOwner: owner,
		ToSeller: amount, Reason: reason, At: now, CreatedAt: now, UpdatedAt: now}
	b, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	if _, err := w.kv.Create(ctx, commerce.SettlementPrefix+key, b); err != nil {
		if !bus.IsConflict(err) {
			return nil, errs.OrUnavailable(err, "the grant could not be recorded; try again")
		}
		if rec, err = w.stored(ctx, key); err != nil {
			return nil, err
		}
	}
	if _, _, err := w.eng.run(ctx, rec); err != nil {
		return nil, errs.OrUnavailable(err, "the grant is recorded but not yet credited; it will be shortly")
	}
	return w.balanceOf(ctx, owner)
}

func (w *Worker) stored(ctx context.Context, key string) (*Settlement, error) {
	s, found, err := bus.GetJSON[Settlement](ctx, w.kv, commerce.SettlementPrefix+key)
	if err != nil || !found {
		return nil, errs.OrUnavailable(err, "the settlement could not be read; try again")
	}
	return &s, nil
}

// balanceOf reads owner's balance (0 when it has none).
func (w *Worker) balanceOf(ctx context.Context, owner string) (BalanceView, error) {
	b, _, err := bus.GetJSON[balance](ctx, w.kv, balanceKey(owner))
	if err != nil {
		return BalanceView{}, errs.OrUnavailable(err, "the balance could not be read; try again")
	}
	v := BalanceView{Owner: owner, Credits: b.Credits, Currency: commerce.Credits}
	if !b.UpdatedAt.IsZero() {
		v.UpdatedAt = protocol.FormatTime(b.UpdatedAt)
	}
	return v, nil
}

// ownerFor decides whose credits a request may read: the services key any
// owner's (it must name one; "platform" is the markup's balance); an agent its registered owner's
// (registry.OwnerOf now; a registered agent with no owner reads none); an
// owner key its own.
func (w *Worker) ownerFor(ctx context.Context, r *bus.Request) (string, error) {
	asked, _ := r.Object()["owner"].(string)
	from := r.Env.From
	services := from == w.svc.Key.Public()
	if _, present := r.Object()["owner"]; present && !keys.IsUserPublicKey(asked) && !(services && asked == PlatformOwner) {
		return "", errs.New(errs.InvalidRequest, "owner, when given, is an owner's public key (U…, 56 characters)")
	}
	if services {
		if asked == "" {
			return "", errs.New(errs.InvalidRequest, "name the owner whose credits to read")
		}
		return asked, nil
	}
	rec, err := w.record(ctx, from)
	if err != nil {
		return "", errs.OrUnavailable(err, "the registry could not be read; try again")
	}
	registered := registry.OwnerOf(rec, w.svc.Now())
	if rec != nil && registered == "" {
		return "", errs.Newf(errs.Forbidden, "agent %s has no owner now (a guest, an agent that is its own node, or one whose owner attestation has expired), so it has no credits to read", from)
	}
	switch {
	case asked == "" && registered != "":
		return registered, nil
	case asked == "" || asked == from:
		return from, nil // an owner key reads its own
	case asked == registered:
		return asked, nil
	}
	return "", errs.Newf(errs.Forbidden, "an agent reads only its own owner's credits; %s is not the owner this agent is registered with", asked)
}

// balance serves mesh.credits.balance: {owner?} → BalanceView.
func (w *Worker) balance(ctx context.Context, r *bus.Request) (any, error) {
	if k, bad := jsonv.Unknown(r.Object(), "owner"); bad {
		return nil, errs.Newf(errs.InvalidQuery, "balance takes {owner?}; %q is not a member", k)
	}
	owner, err := w.ownerFor(ctx, r)
	if err != nil {
		return nil, err
	}
	return w.balanceOf(ctx, owner)
}

// HistoryPage is the answer of mesh.credits.history.
type HistoryPage struct {
	Owner   string  `json:"owner"`
	Entries []Entry `json:"entries"`
	// Next, when set, is the cursor of the next (older) page: pass it as
	// before.
	Next string `json:"next,omitempty"`
}

// history serves mesh.credits.history: {owner?, limit?, before?} → the
// owner's ledger rows (purchases, sales, markups, grants), newest first.
func (w *Worker) history(ctx context.Context, r *bus.Request) (any, error) {
	q := r.Object()
	if k, bad := jsonv.Unknown(q, "owner", "limit", "before"); bad {
		return nil, errs.Newf(errs.InvalidQuery, "history takes {owner?, limit?, before?}; %q is not a member", k)
	}
	limit := int64(DefaultHistoryLimit)
	if v, present := q["limit"]; present {
		n, ok := jsonv.PosInt(v)
		if !ok || n > MaxHistoryLimit {
			return nil, errs.Newf(errs.InvalidQuery, "limit is a whole number from 1 to %d", MaxHistoryLimit)
		}
		limit = n
	}
	before, _ := q["before"].(string)
	if _, present := q["before"]; present && (before == "" || !tokenish(before)) {
		return nil, errs.New(errs.InvalidQuery, "before is the next cursor of an earlier page")
	}
	owner, err := w.ownerFor(ctx, r)
	if err != nil {
		return nil, err
	}
	prefix := LedgerPrefix + owner + "."
	lister, err := w.kv.ListKeysFiltered(ctx, prefix+">")
	if err != nil {
		return nil, errs.OrUnavailable(err, "the history could not be read; try again")
	}
	var names []string
	for k := range lister.Keys() {
		names = append(names, strings.TrimPrefix(k, prefix))
	}
	_ = lister.Stop()
	if err := ctx.Err(); err != nil {
		return nil, errs.OrUnavailable(err, "the history could not be read; try again")
	}
	slices.Sort(names)
	names = slices.Compact(names) // a listing may repeat a key
	slices.Reverse(names)
	page := HistoryPage{Owner: owner, Entries: []Entry{}}
	for _, n := range names {
		if before != "" && n >= before {
			continue
		}
		if int64(len(page.Entries)) == limit {
			page.Next = page.Entries[len(page.Entries)-1].cursor
			break
		}
		e, found, err := bus.GetJSON[Entry](ctx, w.kv, prefix+n)
		if err != nil {
			return nil, errs.OrUnavailable(err, "the history could not be read; try again")
		}
		if found {
			e.cursor = n
			page.Entries = append(page.Entries, e)
		}
	}
	return page, nil
}

// tokenish reports whether s could be a ledger cursor (a key's tail).
func tokenish(s string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return len(s) <= 256
}
