// Package accountview answers the account routes that need the bus: an
// account's agents with their live status, its invocation timeline, and its
// catalog subscriptions. It reads the control-plane store for what the
// account owns and asks the bus workers (presence, activity, catalog) what
// they know, signing its calls with the services key.
package accountview

import (
	"context"
	"errors"
	"slices"
	"sort"
	"time"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/credential"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/store"
)

// CollSubscriptions holds an account's catalog subscriptions, one document
// per account: {account_id, agents:[{agent_id, added_at}]}.
const CollSubscriptions = "catalog_subscriptions"

// Service answers the views.
type Service struct {
	Store       store.Store
	Credentials *credential.Service
	Bus         *bus.Caller
	Now         func() time.Time
}

const busTimeout = 5 * time.Second

func (s *Service) call(ctx context.Context, subject string, payload any) (map[string]any, error) {
	if s.Bus == nil {
		return nil, errs.New(errs.NotImplemented, "this instance has no bus connection")
	}
	ctx, cancel := context.WithTimeout(ctx, busTimeout)
	defer cancel()
	out, err := s.Bus.Call(ctx, subject, protocol.TypeDiscover, payload)
	if err != nil {
		return nil, errs.OrUnavailable(err, "the mesh did not answer; retry shortly")
	}
	return out, nil
}

// AgentStatus is one of an account's agents with its live status.
type AgentStatus struct {
	AgentID      string `json:"agent_id"`
	Label        string `json:"label"`
	Handle       string `json:"handle,omitempty"`
	CreatedAt    string `json:"created_at"`
	Live         bool   `json:"live"`
	Availability string `json:"availability"`
	Node         string `json:"node,omitempty"`
	LastSeen     string `json:"last_seen,omitempty"`
}

// Agents lists the account's enabled agents, each stamped with its node's
// presence (one presence call for all of them). The presence worker lists
// an agent only under the node its registration names, whatever other
// nodes claim in their beats, so an agent is live on at most one node.
func (s *Service) Agents(ctx context.Context, accountID string) ([]AgentStatus, error) {
	ags, err := s.Credentials.Agents(ctx, accountID)
	if err != nil {
		return nil, err
	}
	pres, err := s.call(ctx, protocol.SubjPresenceGet, map[string]any{})
	if err != nil {
		return nil, err
	}
	type seen struct{ node, availability, lastSeen string }
	live := map[string]seen{}
	for _, n := range asList(pres["nodes"]) {
		nm, _ := n.(map[string]any)
		if on, _ := nm["online"].(bool); !on {
			continue
		}
		for _, a := range asList(nm["agents"]) {
			id, _ := a.(string)
			av, _ := nm["availability"].(string)
			ls, _ := nm["last_seen"].(string)
			node, _ := nm["node"].(string)
			live[id] = seen{node, av, ls}
		}
	}
	out := make([]AgentStatus, 0, len(ags))
	for _, a := range ags {
		if !a.Enabled {
			continue
		}
		st := AgentStatus{AgentID: a.ID, Label: a.Label, Handle: a.Handle, CreatedAt: protocol.FormatTime(time.UnixMilli(a.CreatedAt)), Availability: "offline"}
		if p, ok := live[a.ID]; ok {
			st.Live, st.Availability, st.Node, st.LastSeen = true, p.availability, p.node, p.lastSeen
			if st.Availability == "" {
				st.Availability = "online"
			}
		}
		out = append(out, st)
	}
	return out, nil
}

// Activity is the invocation timeline of the account's agents, newest
// first: what each sent and received (metadata only, never content).
func (s *Service) Activity(ctx context.Context, accountID string, limit int) ([]map[string]any, error) {
	if limit <= 0 || limit > 500 {
		limit = 100
	}
	ags, err := s.Credentials.Agents(ctx, accountID)
	if err != nil {
		return nil, err
	}
	var items []map[string]any
	seen := map[string]bool{}
	for _, a := range ags {
		for _, dir := range []string{"from", "to"} {
			out, err := s.call(ctx, protocol.SubjActivityList, map[string]any{dir: a.ID, "limit": limit})
			if err != nil {
				return nil, err
			}
			for _, it := range asList(out["items"]) {
				m, _ := it.(map[string]any)
				key, _ := m["kind"].(string)
				from, _ := m["from"].(string)
				id, _ := m["id"].(string)
				if m == nil || seen[key+from+id] {
					continue
				}
				seen[key+from+id] = true
				items = append(items, m)
			}
		}
	}
	sort.SliceStable(items, func(i, j int) bool {
		ti, _ := items[i]["ts"].(string)
		tj, _ := items[j]["ts"].(string)
		return ti > tj
	})
	return items[:min(limit, len(items))], nil
}

// AgentUsage is one of an account's agents (or apps) with its counters
// (mesh.usage.list): zero, with no times, for one never seen.
type AgentUsage struct {
	AgentID     string `json:"agent_id"`
	Label       string `json:"label"`
	Kind        string `json:"kind"` // "agent" or "app"
	MessagesIn  int64  `json:"messages_in"`
	MessagesOut int64  `json:"messages_out"`
	Errors      int64  `json:"errors"`
	FirstSeen   string `json:"first_seen,omitempty"`
	LastActive  string `json:"last_active,omitempty"`
}

// Usage lists the counters of every agent and app the account holds, in
// the order they were made, from one mesh.usage.list for all of them.
func (s *Service) Usage(ctx context.Context, accountID string) ([]AgentUsage, error) {
	ags, err := s.Credentials.Agents(ctx, accountID)
	if err != nil {
		return nil, err
	}
	apps, err := s.Credentials.ListApps(ctx, accountID)
	if err != nil {
		return nil, err
	}
	out := make([]AgentUsage, 0, len(ags)+len(apps))
	for _, a := range ags {
		out = append(out, AgentUsage{AgentID: a.ID, Label: a.Label, Kind: "agent"})
	}
	for _, a := range apps {
		out = append(out, AgentUsage{AgentID: a.Key, Label: a.Name, Kind: "app"})
	}
	if len(out) == 0 {
		return out, nil
	}
	ids := make([]any, len(out))
	for i, u := range out {
		ids[i] = u.AgentID
	}
	res, err := s.call(ctx, protocol.SubjUsageList, map[string]any{"agents": ids})
	if err != nil {
		return nil, err
	}
	counters := map[string]map[string]any{}
	for _, c := range asList(res["agents"]) {
		if m, ok := c.(map[string]any); ok {
			id, _ := m["agent"].(string)
			counters[id] = m
		}
	}
	for i := range out {
		c := counters[out[i].AgentID]
		if c == nil {
			continue
		}
		n := func(k string) int64 { f, _ := c[k].(float64); return int64(f) }
		out[i].MessagesIn, out[i].MessagesOut, out[i].Errors = n("messages_in"), n("messages_out"), n("errors")
		out[i].FirstSeen, _ = c["first_seen"].(string)
		out[i].LastActive, _ = c["last_active"].(string)
	}
	return out, nil
}

// Subscription is one catalog entry an account follows.
type Subscription struct {
	AgentID string `json:"agent_id"`
	AddedAt int64  `json:"added_at"`
}

type subscriptions struct {
	AccountID string         `json:"account_id"`
	Agents    []Subscription `json:"agents"`
}

// Subscriptions lists the account's catalog subscriptions, each with its
// current catalog entry (null when the agent left the catalog).
func (s *Service) Subscriptions(ctx context.Context, accountID string) ([]map[string]any, error) {
	var subs subscriptions
	if err := store.Get(ctx, s.Store, CollSubscriptions, accountID, &subs); err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, errs.OrUnavailable(err, "the account store is unavailable; retry shortly")
	}
	if len(subs.Agents) == 0 {
		return []map[string]any{}, nil
	}
	entries := map[string]any{}
	err := eachCatalogEntry(ctx, s.call, func(m map[string]any) bool {
		if id, _ := m["agent_id"].(string); id != "" {
			entries[id] = m
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	out := make([]map[string]any, 0, len(subs.Agents))
	for _, sub := range subs.Agents {
		out = append(out, map[string]any{"agent_id": sub.AgentID, "added_at": protocol.FormatTime(time.UnixMilli(sub.AddedAt)), "entry": entries[sub.AgentID]})
	}
	return out, nil
}

// Subscribe adds a catalog agent to the account's subscriptions; the agent
// must be in the catalog now.
func (s *Service) Subscribe(ctx context.Context, accountID, agentID string) error {
	if err := credential.CheckAgentID(agentID, "agent_id"); err != nil {
		return err
	}
	listed := false
	err := eachCatalogEntry(ctx, s.call, func(m map[string]any) bool {
		listed = m["agent_id"] == agentID
		return !listed
	})
	if err != nil {
		return err
	}
	if !listed {
		return errs.New(errs.NotFound, "that agent is not in the catalog")
	}
	now := s.now()
	return errs.OrUnavailable(s.Store.RunTx(ctx, func(tx store.Tx) error {
		var subs subscriptions
		if err := tx.Get(CollSubscriptions, accountID, &subs); err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		if slices.ContainsFunc(subs.Agents, func(s Subscription) bool { return s.AgentID == agentID }) {
			return nil
		}
		subs.AccountID = accountID
		subs.Agents = append(subs.Agents, Subscription{AgentID: agentID, AddedAt: now.UnixMilli()})
		return tx.Set(CollSubscriptions, accountID, subs)
	}), "the account store is unavailable; retry shortly")
}

// Unsubscribe removes one; removing what is not there is quiet, but an
// agent id that cannot be one is refused as Subscribe refuses it.
func (s *Service) Unsubscribe(ctx context.Context, accountID, agentID string) error {
	if err := credential.CheckAgentID(agentID, "agent_id"); err != nil {
		return err
	}
	return errs.OrUnavailable(s.Store.RunTx(ctx, func(tx store.Tx) error {
		var subs subscriptions
		if err := tx.Get(CollSubscriptions, accountID, &subs); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return nil
			}
			return err
		}
		subs.Agents = slices.DeleteFunc(subs.Agents, func(s Subscription) bool { return s.AgentID == agentID })
		return tx.Set(CollSubscriptions, accountID, subs)
	}), "the account store is unavailable; retry shortly")
}

func (s *Service) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// catalogPageLimit is the page size asked of mesh.catalog.list: its
// maximum, so a large catalog takes few calls.
const catalogPageLimit = 500

// maxCatalogPages bounds the pages read, against a listing whose cursor
// never ends.
const maxCatalogPages = 10_000

// eachCatalogEntry calls fn with every catalog entry, page by page
// (mesh.catalog.list answers a page and the cursor of the next), until fn
// returns false or the last page.
func eachCatalogEntry(ctx context.Context, call func(context.Context, string, any) (map[string]any, error), fn func(map[string]any) bool) error {
	q := map[string]any{"limit": catalogPageLimit}
	for range maxCatalogPages {
		cat, err := call(ctx, protocol.SubjCatalogList, q)
		if err != nil {
			return err
		}
		for _, e := range asList(cat["entries"]) {
			m, _ := e.(map[string]any)
			if m != nil && !fn(m) {
				return nil
			}
		}
		next, _ := cat["next"].(string)
		if next == "" {
			return nil
		}
		q = map[string]any{"limit": catalogPageLimit, "after": next}
	}
	return errs.New(errs.Unavailable, "the catalog listing did not end; retry shortly")
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}
