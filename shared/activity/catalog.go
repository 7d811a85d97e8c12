package activity

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// The catalog (spec §4.3 mesh.catalog.list) is a persistent directory, not
// a view over the registry: one record per agent under
// CatalogPrefix+<agent id> in the worker's own bucket (UsageBucket, so the
// catalog costs no stream of its own: DESIGN §5's budget). Every copy
// follows mesh_registry with a KV watch and applies each revision by
// compare-and-set:
//
//   - a public, non-sandbox registration makes or refreshes the entry
//     (available);
//   - a deregistration, a reaping, or a registration that is no longer
//     public (or is sandbox) marks it unavailable and keeps it;
//   - a sandbox, unlisted or private registration never makes one.
//
// Each record carries the registry revision it last applied, and an older
// one is never applied over it, so copies that see the same changes at
// different moments (a watch's replay at start included) agree. An entry
// goes only when its agent (mesh.catalog.remove) or the operator (meshd
// admin catalog remove, mesh.internal.catalog.admin) removes it; the record
// then stays as a tombstone, so replaying the registration it came from
// does not bring it back. The tombstone says who removed the entry: an
// agent's own removal is undone by a registration made after it; an
// operator's stays until the operator lifts it (meshd admin catalog
// restore), since an agent the operator took off must not list itself
// again by deregistering and registering. The operator sets official (meshd admin catalog official); while unset, the
// configured list (Config.Official, MESH_CATALOG_OFFICIAL) decides.
const CatalogPrefix = "catalog."

// Offering is one offering of a catalog entry.
type Offering struct {
	ID          string `json:"id"`
	Name        string `json:"name"`
	Description string `json:"description"`
}

// Entry is one entry of a mesh.catalog.list answer.
type Entry struct {
	AgentID    string     `json:"agent_id"`
	Name       string     `json:"name"`
	Offerings  []Offering `json:"offerings"`
	Provider   string     `json:"provider,omitempty"`
	Official   bool       `json:"official"`
	Categories []string   `json:"categories"`
	// Available is false once the agent deregistered, was reaped, or
	// registered again as not public; the entry stays.
	Available        bool   `json:"available"`
	ListedAt         string `json:"listed_at"`
	UpdatedAt        string `json:"updated_at"`
	UnavailableSince string `json:"unavailable_since,omitempty"`
}

// catalogRecord is the value under CatalogPrefix+<agent id>.
type catalogRecord struct {
	Entry
	// OfficialSet is the operator's word; nil leaves official to
	// Config.Official.
	OfficialSet *bool `json:"official_set,omitempty"`
	// RegistryRev is the mesh_registry revision last applied.
	RegistryRev uint64 `json:"registry_rev"`
	// RemovedAt marks a tombstone: removed by its agent or the operator.
	RemovedAt string `json:"removed_at,omitempty"`
	// RemovedBy is who removed it: RemovedByAgent or RemovedByOperator.
	// A tombstone without one (written before it was recorded) counts as
	// the operator's: the stricter reading.
	RemovedBy string `json:"removed_by,omitempty"`
}

// Who removed a catalog entry (catalogRecord.RemovedBy).
const (
	RemovedByAgent    = "agent"
	RemovedByOperator = "operator"
)

func (r *catalogRecord) removed() bool { return r.RemovedAt != "" }

// byOperator reports whether the tombstone is the operator's: only the
// operator lifts it.
func (r *catalogRecord) byOperator() bool {
	return r.removed() && r.RemovedBy != RemovedByAgent
}

// CatalogOfficial reports whether raw, the value under CatalogPrefix+<agent>
// in UsageBucket, marks its agent official: the operator's word when given,
// else configured (the agent is in Config.Official); a removed entry is
// official to nobody. The clearing reads it to tell the resale path
// (shared/clearing), where the platform is the seller of record.
func CatalogOfficial(raw []byte, configured bool) (bool, error) {
	var r catalogRecord
	if err := json.Unmarshal(raw, &r); err != nil {
		return false, fmt.Errorf("catalog record: %w", err)
	}
	if r.removed() {
		return false, nil
	}
	if r.OfficialSet != nil {
		return *r.OfficialSet, nil
	}
	return configured, nil
}

// catalogRetry is how long a copy waits before binding the registry again
// (it does not exist yet) or watching it again (the watch ended).
const catalogRetry = 2 * time.Second

// catalogLoop follows mesh_registry into the catalog until ctx ends.
func (w *Worker) catalogLoop(ctx context.Context) {
	defer close(w.catDone)
	for {
		kv, err := w.registry.Get(ctx)
		if kv != nil {
			err = w.follow(ctx, kv)
		}
		if err != nil && ctx.Err() == nil {
			w.svc.Log.Warn("catalog: following the registry", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(catalogRetry):
		}
	}
}

// follow applies every registry revision the watch delivers: first the
// latest of every key (deletions included), then each change.
func (w *Worker) follow(ctx context.Context, kv jetstream.KeyValue) error {
	watch, err := kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watch %s: %w", RegistryBucket, err)
	}
	defer func() { _ = watch.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-watch.Updates():
			if !ok {
				return fmt.Errorf("watch %s: closed", RegistryBucket)
			}
			if e == nil {
				continue // caught up with the bucket as it was
			}
			actx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := w.applyRegistry(actx, e)
			cancel()
			if err != nil && ctx.Err() == nil {
				w.svc.Log.Warn("catalog: applying a registration", "agent", e.Key(), "revision", e.Revision(), "err", err)
			}
		}
	}
}

// applyRegistry applies one registry revision to the agent's entry.
func (w *Worker) applyRegistry(ctx context.Context, e jetstream.KeyValueEntry) error {
	agent := e.Key()
	if !keys.IsUserPublicKey(agent) {
		return nil
	}
	rev := e.Revision()
	var listed *Entry
	var registeredAt string
	if e.Operation() == jetstream.KeyValuePut {
		if en, at, ok := entryOf(agent, e.Value()); ok {
			listed, registeredAt = &en, at
		}
	}
	now := protocol.FormatTime(w.svc.Now())
	_, _, err := bus.CAS(ctx, w.usage, CatalogPrefix+agent, func(cur *catalogRecord, exists bool) (*catalogRecord, error) {
		if exists && cur.RegistryRev >= rev {
			return nil, bus.ErrNoChange // this revision or a later one is in
		}
		switch {
		case !exists && listed == nil:
			return nil, bus.ErrNoChange // sandbox, unlisted or private: never listed
		case !exists, exists && cur.removed() && !cur.byOperator() && listed != nil && laterThan(registeredAt, cur.RemovedAt):
			// New, or registered anew after its agent removed it.
			next := catalogRecord{Entry: *listed, RegistryRev: rev}
			next.Available, next.ListedAt, next.UpdatedAt = true, now, now
			return &next, nil
		case cur.removed():
			next := *cur
			next.RegistryRev = rev
			return &next, nil
		case listed == nil:
			next := *cur
			next.RegistryRev = rev
			if next.Available {
				next.Available, next.UnavailableSince, next.UpdatedAt = false, now, now
			}
			return &next, nil
		}
		next := *cur
		listedAt := cur.ListedAt
		next.Entry = *listed
		next.ListedAt, next.UpdatedAt, next.Available, next.RegistryRev = listedAt, now, true, rev
		return &next, nil
	})
	return err
}

// laterThan reports whether a is after b; an unparseable a is not.
func laterThan(a, b string) bool {
	ta, err := protocol.ParseTime(a)
	if err != nil {
		return false
	}
	tb, err := protocol.ParseTime(b)
	return err != nil || ta.After(tb)
}

// entryOf makes a catalog entry of a registry record, or reports that the
// record is not listed: not public, sandbox, or not an agent record. It
// also returns the registration's registered_at.
func entryOf(key string, v []byte) (Entry, string, bool) {
	var m map[string]any
	if json.Unmarshal(v, &m) != nil {
		return Entry{}, "", false
	}
	id := stringOf(m["id"])
	if id != key || !keys.IsUserPublicKey(id) {
		return Entry{}, "", false
	}
	if stringOf(m["visibility"]) != "public" || m["sandbox"] == true || stringOf(m["trust_tier"]) == "sandbox" {
		return Entry{}, "", false
	}
	e := Entry{AgentID: id, Name: stringOf(m["name"]), Offerings: []Offering{}, Categories: []string{}}
	if list, ok := m["offerings"].([]any); ok {
		for _, o := range list {
			om, ok := o.(map[string]any)
			if !ok {
				continue
			}
			e.Offerings = append(e.Offerings, Offering{ID: stringOf(om["id"]), Name: stringOf(om["name"]), Description: stringOf(om["description"])})
		}
	}
	if tags, ok := m["tags"].([]any); ok {
		for _, t := range tags {
			if s, ok := t.(string); ok && s != "" {
				e.Categories = append(e.Categories, s)
			}
		}
	}
	e.Provider = providerOf(m)
	return e, stringOf(m["registered_at"]), true
}

// providerOf reads the manifest's provider: a string, or an object's name,
// at the top level or under meta.
func providerOf(m map[string]any) string {
	for _, v := range []any{m["provider"], mapOf(m["meta"])["provider"]} {
		switch p := v.(type) {
		case string:
			if p != "" {
				return p
			}
		case map[string]any:
			if s := stringOf(p["name"]); s != "" {
				return s
			}
		}
	}
	return ""
}

func mapOf(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

// view is the entry of a record as listed: official decided.
func (w *Worker) view(r catalogRecord) Entry {
	e := r.Entry
	e.Official = w.official[e.AgentID]
	if r.OfficialSet != nil {
		e.Official = *r.OfficialSet
	}
	if e.Offerings == nil {
		e.Offerings = []Offering{}
	}
	if e.Categories == nil {
		e.Categories = []string{}
	}
	return e
}

// ---------------------------------------------------------------------------
// mesh.catalog.list

// Catalog paging: a page holds at most limit entries and at most
// catalogPageBytes of their JSON, so a catalog of thousands of long
// manifests never answers past the transport's maximum payload (1 MiB).
const (
	DefaultCatalogLimit = 100
	MaxCatalogLimit     = 500
	catalogPageBytes    = 512 << 10
)

// listCatalog answers {official?, categories?, available?, limit?, after?}
// with {entries, total, next}: a page of the catalog (none before the first
// public registration), sorted by name then id. official and available
// filter on those flags; categories keeps entries carrying any of the given
// tags (case-insensitive). total counts every entry the filters keep; next
// is the cursor to pass as after for the following page, null on the last.
func (w *Worker) listCatalog(ctx context.Context, r *bus.Request) (any, error) {
	q := r.Object()
	wantOfficial, err := boolFilter(q, "official")
	if err != nil {
		return nil, err
	}
	wantAvailable, err := boolFilter(q, "available")
	if err != nil {
		return nil, err
	}
	var cats []string
	switch v := q["categories"].(type) {
	case nil:
	case []any:
		for _, c := range v {
			s, ok := c.(string)
			if !ok {
				return nil, errs.New(errs.InvalidQuery, "categories must be a list of strings")
			}
			cats = append(cats, strings.ToLower(s))
		}
	default:
		return nil, errs.New(errs.InvalidQuery, "categories must be a list of strings")
	}
	limit, after, err := catalogPage(q)
	if err != nil {
		return nil, err
	}
	recs, err := w.catalogRecords(ctx)
	if err != nil {
		return nil, errs.OrUnavailable(err, "the catalog could not be read; try again")
	}
	entries := []Entry{}
	for _, rec := range recs {
		e := w.view(rec)
		if wantOfficial != nil && e.Official != *wantOfficial || wantAvailable != nil && e.Available != *wantAvailable {
			continue
		}
		if len(cats) > 0 && !slices.ContainsFunc(e.Categories, func(c string) bool { return slices.Contains(cats, strings.ToLower(c)) }) {
			continue
		}
		entries = append(entries, e)
	}
	slices.SortFunc(entries, compareEntries)
	page, next, err := pageEntries(entries, after, limit)
	if err != nil {
		return nil, err
	}
	return map[string]any{"entries": page, "total": len(entries), "next": next}, nil
}

// compareEntries orders the catalog: by name, then id.
func compareEntries(a, b Entry) int {
	if c := strings.Compare(a.Name, b.Name); c != 0 {
		return c
	}
	return strings.Compare(a.AgentID, b.AgentID)
}

// catalogPage reads limit (default DefaultCatalogLimit, capped at
// MaxCatalogLimit) and after (a cursor this service gave) from q.
func catalogPage(q map[string]any) (int, *Entry, error) {
	limit := DefaultCatalogLimit
	switch v := q["limit"].(type) {
	case nil:
	case float64:
		if v < 1 || v != float64(int64(v)) {
			return 0, nil, errs.Newf(errs.InvalidQuery, "limit must be a positive integer (at most %d)", MaxCatalogLimit)
		}
		limit = int(min(v, MaxCatalogLimit))
	default:
		return 0, nil, errs.Newf(errs.InvalidQuery, "limit must be a positive integer (at most %d)", MaxCatalogLimit)
	}
	switch v := q["after"].(type) {
	case nil:
		return limit, nil, nil
	case string:
		if after, ok := decodeCursor(v); ok {
			return limit, &after, nil
		}
	}
	return 0, nil, errs.New(errs.InvalidQuery, "after is not a cursor this service gave: pass back next as it came")
}

// A cursor is the name and id of the last entry of a page, NUL-separated
// and base64url-encoded: opaque to callers, and a key in the listing's
// order however the catalog changes between pages.
func encodeCursor(e Entry) string {
	return base64.RawURLEncoding.EncodeToString([]byte(e.Name + "\x00" + e.AgentID))
}

func decodeCursor(s string) (Entry, bool) {
	if s == "" || len(s) > 4096 {
		return Entry{}, false
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return Entry{}, false
	}
	i := bytes.LastIndexByte(b, 0)
	if i < 0 || i == len(b)-1 {
		return Entry{}, false
	}
	return Entry{Name: string(b[:i]), AgentID: string(b[i+1:])}, true
}

// pageEntries is the page of sorted entries after the cursor: at most
// limit entries and at most catalogPageBytes of their JSON (always one,
// however long, so paging moves on), and the cursor of its last entry when
// more follow (nil on the last page).
func pageEntries(entries []Entry, after *Entry, limit int) ([]Entry, *string, error) {
	start := 0
	if after != nil {
		start, _ = slices.BinarySearchFunc(entries, *after, compareEntries)
		if start < len(entries) && compareEntries(entries[start], *after) == 0 {
			start++
		}
	}
	page := []Entry{}
	size := 0
	for _, e := range entries[start:] {
		b, err := json.Marshal(e)
		if err != nil {
			return nil, nil, fmt.Errorf("activity: catalog page: %w", err)
		}
		if len(page) == limit || len(page) > 0 && size+len(b)+1 > catalogPageBytes {
			next := encodeCursor(page[len(page)-1])
			return page, &next, nil
		}
		size += len(b) + 1
		page = append(page, e)
	}
	return page, nil, nil
}

func boolFilter(q map[string]any, name string) (*bool, error) {
	switch v := q[name].(type) {
	case nil:
		return nil, nil
	case bool:
		return &v, nil
	}
	return nil, errs.Newf(errs.InvalidQuery, "%s must be a boolean", name)
}

// catalogRecords reads every live catalog record: in one request for the
// last value of every catalog key (jetstreamext.GetLastMsgsFor, a direct
// get of the bucket's stream), or, past what the broker answers in one
// request (1,024 subjects), through a watch of the catalog's keys.
func (w *Worker) catalogRecords(ctx context.Context) ([]catalogRecord, error) {
	subject := "$KV." + UsageBucket + "." + CatalogPrefix + ">"
	msgs, err := jetstreamext.GetLastMsgsFor(ctx, w.svc.JS, "KV_"+UsageBucket, []string{subject})
	if err != nil {
		return w.catalogByWatch(ctx)
	}
	var out []catalogRecord
	for m, err := range msgs {
		if errors.Is(err, jetstreamext.ErrNoMessages) {
			return nil, nil
		}
		if err != nil {
			// The broker answers "too many results" past 1,024 keys.
			return w.catalogByWatch(ctx)
		}
		if m.Header.Get("KV-Operation") != "" {
			continue // deleted or purged
		}
		if rec, ok := decodeRecord(m.Data); ok {
			out = append(out, rec)
		}
	}
	return out, nil
}

// catalogByWatch reads the catalog's keys with a watch: one pass over them
// all, for a catalog larger than one direct get answers.
func (w *Worker) catalogByWatch(ctx context.Context) ([]catalogRecord, error) {
	watch, err := w.usage.Watch(ctx, CatalogPrefix+">", jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("kv %s: watch: %w", UsageBucket, err)
	}
	defer func() { _ = watch.Stop() }()
	var out []catalogRecord
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-watch.Updates():
			if !ok {
				return nil, fmt.Errorf("kv %s: watch closed", UsageBucket)
			}
			if e == nil {
				return out, nil
			}
			if rec, ok := decodeRecord(e.Value()); ok {
				out = append(out, rec)
			}
		}
	}
}

// decodeRecord decodes a live (not removed) catalog record.
func decodeRecord(b []byte) (catalogRecord, bool) {
	var rec catalogRecord
	if json.Unmarshal(b, &rec) != nil || rec.removed() || !keys.IsUserPublicKey(rec.AgentID) {
		return catalogRecord{}, false
	}
	return rec, true
}

// ---------------------------------------------------------------------------
// mesh.catalog.remove and mesh.internal.catalog.admin

var errNotInCatalog = errors.New("not in the catalog")

// removeOwn serves mesh.catalog.remove: {agent_id}, signed by that agent,
// removes its entry → {status:"removed", agent_id, removed}; removed is
// false when there was none (removing twice is quiet).
func (w *Worker) removeOwn(ctx context.Context, r *bus.Request) (any, error) {
	agent, ok := r.Object()["agent_id"].(string)
	if !ok || !keys.IsUserPublicKey(agent) {
		return nil, errs.New(errs.InvalidRequest, "catalog remove takes {agent_id}, the agent's public key")
	}
	if agent != r.Env.From {
		return nil, errs.New(errs.IdentityMismatch, "only the agent itself may remove its catalog entry: sign with the agent key (the operator uses meshd admin catalog remove)")
	}
	removed, err := w.remove(ctx, agent, RemovedByAgent)
	if err != nil {
		return nil, err
	}
	return map[string]any{"status": "removed", "agent_id": agent, "removed": removed}, nil
}

// admin serves mesh.internal.catalog.admin for the operator (the services
// key only): {agent_id, official: bool} sets official and answers {entry};
// {agent_id, remove: true} removes the entry and answers {agent_id,
// removed}; {agent_id, restore: true} lifts an operator's removal and
// answers {agent_id, restored, listed}.
func (w *Worker) admin(ctx context.Context, r *bus.Request) (any, error) {
	if err := w.svc.RequireServices(r); err != nil {
		return nil, err
	}
	q := r.Object()
	agent, ok := q["agent_id"].(string)
	if !ok || !keys.IsUserPublicKey(agent) {
		return nil, errs.New(errs.InvalidRequest, "give the agent's public key (U…, 56 characters)")
	}
	if q["remove"] == true {
		removed, err := w.remove(ctx, agent, RemovedByOperator)
		if err != nil {
			return nil, err
		}
		return map[string]any{"agent_id": agent, "removed": removed}, nil
	}
	if q["restore"] == true {
		return w.restore(ctx, agent)
	}
	on, ok := q["official"].(bool)
	if !ok {
		return nil, errs.New(errs.InvalidRequest, "say official: true or false, remove: true or restore: true")
	}
	now := protocol.FormatTime(w.svc.Now())
	rec, _, err := bus.CAS(ctx, w.usage, CatalogPrefix+agent, func(cur *catalogRecord, exists bool) (*catalogRecord, error) {
		if !exists || cur.removed() {
			return nil, errNotInCatalog
		}
		if cur.OfficialSet != nil && *cur.OfficialSet == on {
			return nil, bus.ErrNoChange
		}
		next := *cur
		next.OfficialSet, next.UpdatedAt = &on, now
		return &next, nil
	})
	if errors.Is(err, errNotInCatalog) {
		return nil, errs.Newf(errs.NotFound, "agent %s is not in the catalog: it has never registered publicly, or it was removed", agent)
	}
	if err != nil {
		return nil, errs.OrUnavailable(err, "the catalog could not be written; try again")
	}
	return map[string]any{"entry": w.view(*rec)}, nil
}

// remove makes agent's entry a tombstone; it reports whether there was an
// entry to remove. An agent with no entry gets a tombstone too: the catalog
// follows the registry asynchronously, so a registration it has not applied
// yet (one made before the removal) must not list the agent afterwards.
// Account closure removes entries right after it removes registrations.
// by is who removes it: an operator's removal over an agent's own makes
// the tombstone the operator's; an agent's never weakens the operator's.
func (w *Worker) remove(ctx context.Context, agent, by string) (bool, error) {
	now := protocol.FormatTime(w.svc.Now())
	listed := false
	_, _, err := bus.CAS(ctx, w.usage, CatalogPrefix+agent, func(cur *catalogRecord, exists bool) (*catalogRecord, error) {
		listed = false
		if exists && cur.removed() {
			if by != RemovedByOperator || cur.byOperator() {
				return nil, bus.ErrNoChange
			}
			next := *cur
			next.RemovedBy = RemovedByOperator
			return &next, nil
		}
		var rev uint64
		if exists {
			listed, rev = true, cur.RegistryRev
		}
		return &catalogRecord{Entry: Entry{AgentID: agent}, RegistryRev: rev, RemovedAt: now, RemovedBy: by}, nil
	})
	if err != nil {
		return false, errs.OrUnavailable(err, "the catalog could not be written; try again")
	}
	return listed, nil
}

// restore lifts the operator's removal of agent: its current registration,
// when public, is listed again at once; otherwise the tombstone becomes as
// an agent's own, so its next registration lists it. restored is false when
// no operator's removal was in place (restoring twice is quiet).
func (w *Worker) restore(ctx context.Context, agent string) (any, error) {
	var (
		listed      *Entry
		registryRev uint64
	)
	kv, err := w.registry.Get(ctx)
	if err != nil {
		return nil, errs.OrUnavailable(err, "the registry could not be read; try again")
	}
	if kv != nil {
		e, err := kv.Get(ctx, agent)
		switch {
		case err == nil:
			registryRev = e.Revision()
			if en, _, ok := entryOf(agent, e.Value()); ok {
				listed = &en
			}
		case !errors.Is(err, jetstream.ErrKeyNotFound):
			return nil, errs.OrUnavailable(err, "the registry could not be read; try again")
		}
	}
	now := protocol.FormatTime(w.svc.Now())
	restored := false
	rec, _, err := bus.CAS(ctx, w.usage, CatalogPrefix+agent, func(cur *catalogRecord, exists bool) (*catalogRecord, error) {
		restored = false
		if !exists || !cur.byOperator() {
			return nil, bus.ErrNoChange
		}
		restored = true
		next := *cur
		next.RemovedBy = RemovedByAgent
		if listed != nil && registryRev >= cur.RegistryRev {
			next = catalogRecord{Entry: *listed, RegistryRev: registryRev}
			next.Available, next.ListedAt, next.UpdatedAt = true, now, now
		}
		return &next, nil
	})
	if err != nil {
		return nil, errs.OrUnavailable(err, "the catalog could not be written; try again")
	}
	return map[string]any{"agent_id": agent, "restored": restored, "listed": rec != nil && !rec.removed()}, nil
}
