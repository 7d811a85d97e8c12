package registry

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// Discovery limits.
const (
	DefaultDiscoverLimit = 50
	MaxDiscoverLimit     = 500
)

var availabilityFilters = map[string]bool{AvailOnline: true, AvailOffline: true, "busy": true, "degraded": true}

// query is a parsed discover payload; every filter set is AND-combined.
type query struct {
	capabilities      []string
	offering          string
	tags              []string
	node              string
	owner             string
	availability      string
	trustTier         string
	availabilityClass string
	reachability      string
	limit             int
}

func badQuery(format string, args ...any) error {
	return errs.Newf(errs.InvalidQuery, format, args...)
}

// parseQuery reads the discover filters. Members it does not know are
// ignored (upstream names more filters than the specification).
func parseQuery(payload any) (query, error) {
	q := query{limit: DefaultDiscoverLimit}
	if payload == nil {
		return q, nil
	}
	m, ok := payload.(map[string]any)
	if !ok {
		return q, badQuery("the discover payload must be an object of filters")
	}
	present := func(k string) (any, bool) {
		v, ok := m[k]
		return v, ok && v != nil
	}
	str := func(k string, dst *string) error {
		v, ok := present(k)
		if !ok {
			return nil
		}
		s, isStr := v.(string)
		if !isStr || s == "" {
			return badQuery("%s must be a non-empty string", k)
		}
		*dst = s
		return nil
	}
	list := func(k string, dst *[]string) error {
		v, ok := present(k)
		if !ok {
			return nil
		}
		l, ok := stringList(v)
		if !ok {
			return badQuery("%s must be an array of at most %d non-empty strings", k, maxListItems)
		}
		*dst = l
		return nil
	}
	for _, f := range []error{
		list("capabilities", &q.capabilities),
		list("tags", &q.tags),
		str("offering_id", &q.offering),
		str("node", &q.node),
		str("owner", &q.owner),
		str("availability", &q.availability),
		str("trust_tier", &q.trustTier),
		str("availability_class", &q.availabilityClass),
		str("reachability", &q.reachability),
	} {
		if f != nil {
			return q, f
		}
	}
	if q.offering == "" {
		if err := str("skill_id", &q.offering); err != nil {
			return q, err
		}
	}
	if q.node != "" && !keys.IsUserPublicKey(q.node) {
		return q, badQuery("node must be a node public key")
	}
	if q.owner != "" && !keys.IsUserPublicKey(q.owner) {
		return q, badQuery("owner must be an owner public key")
	}
	if q.availability != "" && !availabilityFilters[q.availability] {
		return q, badQuery("availability must be one of %v", sortedKeys(availabilityFilters))
	}
	if v, ok := present("limit"); ok {
		n, isNum := v.(float64)
		if !isNum || n < 1 || n != float64(int64(n)) {
			return q, badQuery("limit must be a positive integer")
		}
		q.limit = int(min(n, MaxDiscoverLimit))
	}
	return q, nil
}

// matches reports whether rec passes every filter but availability.
func (q query) matches(rec record, now time.Time) bool {
	if q.node != "" && rec.nodeID() != q.node {
		return false
	}
	if q.owner != "" && rec.owner(now) != q.owner {
		return false
	}
	if q.trustTier != "" && rec.profile("trust_tier") != q.trustTier {
		return false
	}
	if q.availabilityClass != "" && rec.profile("availability_class") != q.availabilityClass {
		return false
	}
	if q.reachability != "" && rec.profile("reachability") != q.reachability {
		return false
	}
	if q.offering != "" && !slices.Contains(rec.offeringIDs(), q.offering) {
		return false
	}
	if len(q.capabilities) > 0 {
		have := rec.capabilitySet()
		for _, c := range q.capabilities {
			if !have[c] {
				return false
			}
		}
	}
	if len(q.tags) > 0 {
		have := rec.tagSet()
		for _, t := range q.tags {
			if !have[t] {
				return false
			}
		}
	}
	return true
}

// matchesAvailability: "online" is any live node (busy and degraded
// included), "offline" any other; "busy" and "degraded" are the node's own
// report.
func (q query) matchesAvailability(s nodeState) bool {
	switch q.availability {
	case "":
		return true
	case AvailOnline:
		return s.live()
	case AvailOffline:
		return !s.live()
	default:
		return s.live() && s.availability() == q.availability
	}
}

// discover serves mesh.registry.discover: public registrations only,
// ordered by name then id, each stamped with its node's live availability.
func (w *Worker) discover(ctx context.Context, r *bus.Request) (any, error) {
	if err := wantType(r, protocol.TypeDiscover); err != nil {
		return nil, err
	}
	q, err := parseQuery(r.Payload)
	if err != nil {
		return nil, err
	}
	recs, err := w.records(ctx)
	if err != nil {
		return nil, errs.OrUnavailable(err, "the registry could not be read; try again")
	}
	p := newPresence(w)
	now := w.now()
	var hits []map[string]any
	for _, rec := range recs {
		if rec.visibility() != VisibilityPublic || !q.matches(rec, now) {
			continue
		}
		st, err := p.node(ctx, rec.nodeID())
		if err != nil {
			return nil, errs.OrUnavailable(err, "presence could not be read; try again")
		}
		if !q.matchesAvailability(st) {
			continue
		}
		hits = append(hits, rec.stamped(st.availability()))
	}
	slices.SortFunc(hits, func(a, b map[string]any) int {
		return cmp.Or(cmp.Compare(record(a).str("name"), record(b).str("name")), cmp.Compare(record(a).id(), record(b).id()))
	})
	total := len(hits)
	agents := hits[:min(total, q.limit)]
	if agents == nil {
		agents = []map[string]any{}
	}
	return map[string]any{"agents": agents, "total": total}, nil
}

// nodeEntry is one entry of mesh.registry.nodes.list (spec §4.3: trust
// tier, role, uptime class, device fields, live status, hosted-agent
// count).
type nodeEntry struct {
	Node         string   `json:"node"`
	Agents       []string `json:"agents"`
	HostedAgents int      `json:"hosted_agents"`
	// The node profile its registrations declare.
	TrustTier         string            `json:"trust_tier,omitempty"`
	Role              string            `json:"role,omitempty"`
	AvailabilityClass string            `json:"availability_class,omitempty"` // the uptime class
	Reachability      string            `json:"reachability,omitempty"`
	Capacity          any               `json:"capacity,omitempty"`
	Device            map[string]string `json:"device,omitempty"`
	// Live status, from presence.
	Live         bool        `json:"live"`
	Availability string      `json:"availability"`
	LastSeen     string      `json:"last_seen,omitempty"`
	Heartbeat    *beatReport `json:"heartbeat,omitempty"`
}

// Node listing paging: a page holds at most limit nodes and at most
// nodesPageBytes of their JSON, so thousands of nodes hosting many public
// agents never answer past the transport's maximum payload (1 MiB).
const (
	DefaultNodesLimit = 100
	MaxNodesLimit     = 500
	nodesPageBytes    = 512 << 10
)

// nodesList serves mesh.registry.nodes.list {limit?, after?} with {nodes,
// total, next}: a page of the nodes hosting a registration, sorted by node
// key, each with its hosted-agent count (all registrations), the ids of
// its public agents, the node profile its registrations declare, and its
// presence. total counts every node; next is the cursor to pass as after
// for the following page, null on the last. A node's agents may declare
// different profiles (each registration carries its own copy): each member
// is taken from the most recently updated registration that declares it,
// and the trust tier is sandbox when any registration is.
func (w *Worker) nodesList(ctx context.Context, r *bus.Request) (any, error) {
	if err := wantType(r, protocol.TypeDiscover); err != nil {
		return nil, err
	}
	limit, after, err := nodesPage(r.Payload)
	if err != nil {
		return nil, err
	}
	recs, err := w.records(ctx)
	if err != nil {
		return nil, errs.OrUnavailable(err, "the registry could not be read; try again")
	}
	// Newest registration first, so cmp.Or keeps the newest declaration.
	slices.SortStableFunc(recs, func(a, b record) int {
		return cmp.Or(cmp.Compare(b.str("updated_at"), a.str("updated_at")), cmp.Compare(a.id(), b.id()))
	})
	byNode := map[string]*nodeEntry{}
	for _, rec := range recs {
		id := rec.nodeID()
		e := byNode[id]
		if e == nil {
			e = &nodeEntry{Node: id, Agents: []string{}}
			byNode[id] = e
		}
		e.HostedAgents++
		if rec.visibility() == VisibilityPublic {
			e.Agents = append(e.Agents, rec.id())
		}
		if rec.sandbox() {
			e.TrustTier = TierSandbox
		} else if e.TrustTier == "" {
			e.TrustTier = rec.profile("trust_tier")
		}
		e.Role = cmp.Or(e.Role, rec.profile("role"))
		e.AvailabilityClass = cmp.Or(e.AvailabilityClass, rec.profile("availability_class"))
		e.Reachability = cmp.Or(e.Reachability, rec.profile("reachability"))
		if e.Capacity == nil {
			e.Capacity = rec.capacity()
		}
		if e.Device == nil {
			e.Device = rec.device()
		}
	}
	ids := slices.Sorted(maps.Keys(byNode))
	// Presence is read for the page's nodes only.
	p := newPresence(w)
	nodes := []*nodeEntry{}
	var next *string
	size := 0
	for _, id := range ids[sortedAfter(ids, after):] {
		if len(nodes) == limit {
			next = nodeCursor(nodes[len(nodes)-1].Node)
			break
		}
		e := byNode[id]
		st, err := p.node(ctx, e.Node)
		if err != nil {
			return nil, errs.OrUnavailable(err, "presence could not be read; try again")
		}
		e.Live, e.Availability, e.LastSeen = st.live(), st.availability(), st.entry.LastSeen
		if b := st.entry.beatReport; !b.empty() {
			e.Heartbeat = &b
		}
		slices.Sort(e.Agents)
		b, err := json.Marshal(e)
		if err != nil {
			return nil, fmt.Errorf("registry: nodes page: %w", err)
		}
		// Always one node, however long, so paging moves on.
		if len(nodes) > 0 && size+len(b)+1 > nodesPageBytes {
			next = nodeCursor(nodes[len(nodes)-1].Node)
			break
		}
		size += len(b) + 1
		nodes = append(nodes, e)
	}
	return map[string]any{"nodes": nodes, "total": len(ids), "next": next}, nil
}

// nodesPage reads limit (default DefaultNodesLimit, capped at
// MaxNodesLimit) and after (a cursor this service gave) from the payload.
func nodesPage(payload any) (int, string, error) {
	if payload == nil {
		return DefaultNodesLimit, "", nil
	}
	m, ok := payload.(map[string]any)
	if !ok {
		return 0, "", badQuery("the nodes list payload must be an object of {limit, after}")
	}
	limit := DefaultNodesLimit
	switch v := m["limit"].(type) {
	case nil:
	case float64:
		if v < 1 || v != float64(int64(v)) {
			return 0, "", badQuery("limit must be a positive integer (at most %d)", MaxNodesLimit)
		}
		limit = int(min(v, MaxNodesLimit))
	default:
		return 0, "", badQuery("limit must be a positive integer (at most %d)", MaxNodesLimit)
	}
	switch v := m["after"].(type) {
	case nil:
		return limit, "", nil
	case string:
		if b, err := base64.RawURLEncoding.DecodeString(v); err == nil && len(b) > 0 && len(v) <= 512 {
			return limit, string(b), nil
		}
	}
	return 0, "", badQuery("after is not a cursor this service gave: pass back next as it came")
}

// nodeCursor is the cursor after a node: its key, base64url-encoded, so
// callers treat it as opaque.
func nodeCursor(node string) *string {
	s := base64.RawURLEncoding.EncodeToString([]byte(node))
	return &s
}

// sortedAfter is the index of the first of the sorted ids past after ("":
// the first).
func sortedAfter(ids []string, after string) int {
	if after == "" {
		return 0
	}
	i, found := slices.BinarySearch(ids, after)
	if found {
		i++
	}
	return i
}

// records reads every registration in one pass over the bucket.
func (w *Worker) records(ctx context.Context) ([]record, error) {
	var out []record
	err := bus.EachValue(ctx, w.kv, func(key string, v []byte) {
		var rec record
		if err := json.Unmarshal(v, &rec); err != nil || rec.id() == "" {
			w.log.Warn("undecodable registration", "key", key, "err", err)
			return
		}
		out = append(out, rec)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
