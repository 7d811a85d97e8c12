package activity_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"agentmesh.dev/mesh/shared/activity"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

type catalog struct {
	Entries []activity.Entry `json:"entries"`
	Total   int              `json:"total"`
}

func (h *harness) catalog(q map[string]any) catalog {
	h.t.Helper()
	var c catalog
	if err := h.call(protocol.SubjCatalogList, q, &c); err != nil {
		h.t.Fatal(err)
	}
	return c
}

// waitCatalog lists q until ok holds: the copies apply registry changes as
// their watches deliver them. A condition that never holds fails the test.
func (h *harness) waitCatalog(q map[string]any, what string, ok func(catalog) bool) catalog {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c := h.catalog(q)
		if ok(c) {
			return c
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("the catalog never showed %s: %+v", what, c)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// register writes a registry record as the registry worker does.
func (h *harness) register(id string, rec map[string]any) {
	h.t.Helper()
	rec["id"] = id
	if _, ok := rec["registered_at"]; !ok {
		rec["registered_at"] = protocol.FormatTime(time.Now())
	}
	b, _ := json.Marshal(rec)
	if _, err := h.reg.Put(h.t.Context(), id, b); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) deregister(id string) {
	h.t.Helper()
	if err := h.reg.Delete(h.t.Context(), id); err != nil {
		h.t.Fatal(err)
	}
}

// asServices calls subject signed by the services key, as the operator's
// commands do.
func (h *harness) asServices(subject string, q map[string]any) (map[string]any, error) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(h.t.Context(), 5*time.Second)
	defer cancel()
	rep, err := bus.Call(ctx, h.nc, h.m.ServicesKey(), subject, protocol.TypeRequest, "", q)
	if err != nil {
		return nil, err
	}
	var out map[string]any
	return out, rep.DecodePayload(&out)
}

// callAs calls subject signed by key.
func (h *harness) callAs(key *keys.Agent, subject string, q map[string]any, out any) error {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(h.t.Context(), 5*time.Second)
	defer cancel()
	rep, err := bus.Call(ctx, h.nc, key, subject, protocol.TypeRequest, "", q)
	if err != nil {
		return err
	}
	return rep.DecodePayload(out)
}

// restart stops every copy and starts as many again: each replays the
// registry from its start.
func (h *harness) restart() {
	h.t.Helper()
	n := len(h.workers)
	for _, w := range h.workers {
		if err := w.Stop(); err != nil {
			h.t.Fatal(err)
		}
	}
	h.workers = nil
	for i := range n {
		w, err := activity.Start(h.t.Context(), bustest.Env(h.t, h.m, fmt.Sprintf("activity-again-%d", i), nil), h.cfg)
		if err != nil {
			h.t.Fatal(err)
		}
		h.t.Cleanup(func() { _ = w.Stop() })
		h.workers = append(h.workers, w)
	}
}

func byID(c catalog, id string) (activity.Entry, bool) {
	i := slices.IndexFunc(c.Entries, func(e activity.Entry) bool { return e.AgentID == id })
	if i < 0 {
		return activity.Entry{}, false
	}
	return c.Entries[i], true
}

var offerings = []any{map[string]any{"id": "chat", "name": "Chat", "description": "talk", "tags": []any{"x"}}}

// The catalog lists public, non-sandbox registrations only, with the
// official flag from the configuration and categories from the tags.
func TestCatalog(t *testing.T) {
	pub, off, sandbox, unlisted := bustest.Agent(t).Public(), bustest.Agent(t).Public(), bustest.Agent(t).Public(), bustest.Agent(t).Public()
	h := start(t, off)
	h.register(sandbox, map[string]any{"name": "Guest", "visibility": "public", "sandbox": true, "trust_tier": "sandbox", "offerings": offerings})
	h.register(unlisted, map[string]any{"name": "Hidden", "visibility": "unlisted", "offerings": offerings})
	h.register(pub, map[string]any{"name": "Beta", "visibility": "public", "sandbox": false, "offerings": offerings, "tags": []any{"Finance", "search"}, "meta": map[string]any{"provider": "Acme"}})
	h.register(off, map[string]any{"name": "Alpha", "visibility": "public", "offerings": offerings, "tags": []any{"search"}})

	all := h.waitCatalog(map[string]any{}, "both public agents", func(c catalog) bool { return c.Total == 2 })
	if len(all.Entries) != 2 || all.Entries[0].AgentID != off || all.Entries[1].AgentID != pub {
		t.Fatalf("catalog %+v", all)
	}
	alpha, beta := all.Entries[0], all.Entries[1]
	if !alpha.Official || beta.Official || beta.Provider != "Acme" || alpha.Provider != "" || !alpha.Available || alpha.ListedAt == "" {
		t.Fatalf("flags: %+v %+v", alpha, beta)
	}
	if len(beta.Offerings) != 1 || beta.Offerings[0] != (activity.Offering{ID: "chat", Name: "Chat", Description: "talk"}) {
		t.Fatalf("offerings %+v", beta.Offerings)
	}
	if len(beta.Categories) != 2 || beta.Categories[0] != "Finance" {
		t.Fatalf("categories %+v", beta.Categories)
	}
	if c := h.catalog(map[string]any{"official": true}); c.Total != 1 || c.Entries[0].AgentID != off {
		t.Fatalf("official: %+v", c)
	}
	if c := h.catalog(map[string]any{"official": false}); c.Total != 1 || c.Entries[0].AgentID != pub {
		t.Fatalf("not official: %+v", c)
	}
	if c := h.catalog(map[string]any{"categories": []any{"finance"}}); c.Total != 1 || c.Entries[0].AgentID != pub {
		t.Fatalf("finance: %+v", c)
	}
	if c := h.catalog(map[string]any{"categories": []any{"search", "nothing"}}); c.Total != 2 {
		t.Fatalf("search: %+v", c)
	}
	if c := h.catalog(map[string]any{"official": true, "categories": []any{"finance"}}); c.Total != 0 || c.Entries == nil {
		t.Fatalf("official finance: %+v", c)
	}
	for _, q := range []map[string]any{{"official": "yes"}, {"categories": "search"}, {"categories": []any{1}}, {"available": 1}} {
		if err := h.call(protocol.SubjCatalogList, q, &catalog{}); errs.CodeOf(err) != errs.InvalidQuery {
			t.Fatalf("query %v: %v", q, err)
		}
	}
	// Sandbox and unlisted registrations never entered, not even as
	// unavailable entries.
	if c := h.catalog(map[string]any{"available": false}); c.Total != 0 {
		t.Fatalf("unavailable entries: %+v", c)
	}
}

// An entry outlives its registration: deregistered, it stays, marked
// unavailable, and comes back available when the agent registers again; a
// registration that turns sandbox or unlisted marks it unavailable too.
// Only its own agent or the operator removes it; the operator sets
// official, over the configured list.
func TestCatalogIsPersistent(t *testing.T) {
	agent := bustest.Agent(t)
	a, listedOff := agent.Public(), bustest.Agent(t).Public()
	other := bustest.Agent(t)
	h := start(t, listedOff)
	h.register(a, map[string]any{"name": "Keeper", "visibility": "public", "offerings": offerings, "tags": []any{"tools"}})
	h.register(listedOff, map[string]any{"name": "Listed", "visibility": "public", "offerings": offerings})
	first := h.waitCatalog(map[string]any{}, "two entries", func(c catalog) bool { return c.Total == 2 })
	keeper, _ := byID(first, a)

	h.deregister(a)
	c := h.waitCatalog(map[string]any{}, "the deregistered agent unavailable", func(c catalog) bool {
		e, ok := byID(c, a)
		return ok && !e.Available
	})
	gone, _ := byID(c, a)
	if gone.Name != "Keeper" || gone.UnavailableSince == "" || gone.ListedAt != keeper.ListedAt || len(gone.Categories) != 1 {
		t.Fatalf("after deregistration: %+v", gone)
	}
	if u := h.catalog(map[string]any{"available": false}); u.Total != 1 || u.Entries[0].AgentID != a {
		t.Fatalf("available:false %+v", u)
	}
	if u := h.catalog(map[string]any{"available": true}); u.Total != 1 || u.Entries[0].AgentID != listedOff {
		t.Fatalf("available:true %+v", u)
	}

	h.register(a, map[string]any{"name": "Keeper 2", "visibility": "public", "offerings": offerings})
	back := h.waitCatalog(map[string]any{}, "the agent back", func(c catalog) bool {
		e, ok := byID(c, a)
		return ok && e.Available && e.Name == "Keeper 2"
	})
	if e, _ := byID(back, a); e.UnavailableSince != "" || e.ListedAt != keeper.ListedAt {
		t.Fatalf("back: %+v", e)
	}
	h.register(a, map[string]any{"name": "Keeper 2", "visibility": "public", "sandbox": true, "trust_tier": "sandbox", "offerings": offerings})
	h.waitCatalog(map[string]any{}, "a sandboxed registration unavailable", func(c catalog) bool {
		e, ok := byID(c, a)
		return ok && !e.Available
	})

	// The operator sets official, over the configured list.
	out, err := h.asServices(protocol.SubjCatalogAdmin, map[string]any{"agent_id": a, "official": true})
	if err != nil || out["entry"].(map[string]any)["official"] != true {
		t.Fatalf("official on: %v %v", out, err)
	}
	if _, err := h.asServices(protocol.SubjCatalogAdmin, map[string]any{"agent_id": listedOff, "official": false}); err != nil {
		t.Fatal(err)
	}
	if o := h.catalog(map[string]any{"official": true}); o.Total != 1 || o.Entries[0].AgentID != a {
		t.Fatalf("official after the operator: %+v", o)
	}
	if _, err := h.asServices(protocol.SubjCatalogAdmin, map[string]any{"agent_id": other.Public(), "official": true}); errs.CodeOf(err) != errs.NotFound {
		t.Fatalf("official for an agent not in the catalog: %v", err)
	}
	// Only the services key reaches the operator's subject.
	if err := h.callAs(other, protocol.SubjCatalogAdmin, map[string]any{"agent_id": a, "official": false}, &map[string]any{}); errs.CodeOf(err) != errs.Forbidden {
		t.Fatalf("an agent on the operator's subject: %v", err)
	}

	// Only the agent itself removes its entry; removing twice is quiet.
	if err := h.call(protocol.SubjCatalogRemove, map[string]any{"agent_id": a}, &map[string]any{}); errs.CodeOf(err) != errs.IdentityMismatch {
		t.Fatalf("another key removing the entry: %v", err)
	}
	var removed map[string]any
	if err := h.callAs(agent, protocol.SubjCatalogRemove, map[string]any{"agent_id": a}, &removed); err != nil || removed["removed"] != true {
		t.Fatalf("the agent removing its entry: %v %v", removed, err)
	}
	if err := h.callAs(agent, protocol.SubjCatalogRemove, map[string]any{"agent_id": a}, &removed); err != nil || removed["removed"] != false {
		t.Fatalf("removing again: %v %v", removed, err)
	}
	if _, ok := byID(h.catalog(map[string]any{}), a); ok {
		t.Fatal("a removed entry is listed")
	}
	// A restart replays the registry: the removed entry stays removed until
	// the agent registers anew.
	h.restart()
	h.register(listedOff, map[string]any{"name": "Listed again", "visibility": "public", "offerings": offerings})
	h.waitCatalog(map[string]any{}, "the other entry renamed", func(c catalog) bool {
		e, ok := byID(c, listedOff)
		return ok && e.Name == "Listed again"
	})
	if _, ok := byID(h.catalog(map[string]any{}), a); ok {
		t.Fatal("a removed entry came back on a replay")
	}
	h.register(a, map[string]any{"name": "Keeper 3", "visibility": "public", "offerings": offerings,
		"registered_at": protocol.FormatTime(time.Now().Add(time.Second))})
	again := h.waitCatalog(map[string]any{}, "a new registration after the removal", func(c catalog) bool {
		_, ok := byID(c, a)
		return ok
	})
	if e, _ := byID(again, a); !e.Available || e.Official || e.Name != "Keeper 3" {
		t.Fatalf("registered anew: %+v", e)
	}
	// The operator removes any entry.
	if out, err := h.asServices(protocol.SubjCatalogAdmin, map[string]any{"agent_id": listedOff, "remove": true}); err != nil || out["removed"] != true {
		t.Fatalf("the operator's removal: %v %v", out, err)
	}
	if _, ok := byID(h.catalog(map[string]any{}), listedOff); ok {
		t.Fatal("the operator's removal is listed")
	}
}

// The operator removes an agent the catalog has not listed yet (account
// closure removes right after the registration; the catalog follows the
// registry asynchronously): a registration made before the removal that
// the catalog applies only afterwards does not list the agent; one made
// after it does.
func TestCatalogRemovalBeforeTheRegistrationIsApplied(t *testing.T) {
	h := start(t)
	a := bustest.Agent(t).Public()
	before := protocol.FormatTime(time.Now().Add(-time.Second))
	out, err := h.asServices(protocol.SubjCatalogAdmin, map[string]any{"agent_id": a, "remove": true})
	if err != nil || out["removed"] != false {
		t.Fatalf("removing an agent not listed: %v %v", out, err)
	}
	h.register(a, map[string]any{"name": "Closed", "visibility": "public", "registered_at": before})
	marker := bustest.Agent(t).Public()
	h.register(marker, map[string]any{"name": "Marker", "visibility": "public"})
	c := h.waitCatalog(map[string]any{}, "the registration written after the late one", func(c catalog) bool {
		_, ok := byID(c, marker)
		return ok
	})
	if e, ok := byID(c, a); ok {
		t.Fatalf("a registration older than the removal is listed: %+v", e)
	}
	// The operator's removal stays past a later registration, until the
	// operator lifts it.
	h.register(a, map[string]any{"name": "Back", "visibility": "public", "registered_at": protocol.FormatTime(time.Now().Add(time.Second))})
	h.sync(marker, "Marker 2")
	if e, ok := byID(h.catalog(map[string]any{}), a); ok {
		t.Fatalf("a registration after the operator's removal is listed: %+v", e)
	}
	if out, err := h.asServices(protocol.SubjCatalogAdmin, map[string]any{"agent_id": a, "restore": true}); err != nil || out["restored"] != true || out["listed"] != true {
		t.Fatalf("the operator lifting the removal: %v %v", out, err)
	}
	h.waitCatalog(map[string]any{}, "the registration after the restore", func(c catalog) bool {
		e, ok := byID(c, a)
		return ok && e.Name == "Back" && e.Available
	})
}

// sync registers marker under a new name and waits for the catalog to
// show it: every registry change written before it is applied by then.
func (h *harness) sync(marker, name string) {
	h.t.Helper()
	h.register(marker, map[string]any{"name": name, "visibility": "public"})
	h.waitCatalog(map[string]any{}, name, func(c catalog) bool {
		e, ok := byID(c, marker)
		return ok && e.Name == name
	})
}

// An operator's removal sticks: the agent deregistering and registering
// again (a fresh registered_at) does not list it, nor does its own removal
// weaken it, until the operator restores it. An agent's own removal is
// undone by its later registration, and the operator removing over it
// makes it stick.
func TestCatalogOperatorRemovalSticks(t *testing.T) {
	h := start(t)
	agent := bustest.Agent(t)
	a, marker := agent.Public(), bustest.Agent(t).Public()
	later := func() string { return protocol.FormatTime(time.Now().Add(time.Second)) }
	h.register(a, map[string]any{"name": "Spam", "visibility": "public"})
	h.waitCatalog(map[string]any{}, "the agent listed", func(c catalog) bool { _, ok := byID(c, a); return ok })

	if out, err := h.asServices(protocol.SubjCatalogAdmin, map[string]any{"agent_id": a, "remove": true}); err != nil || out["removed"] != true {
		t.Fatalf("the operator's removal: %v %v", out, err)
	}
	var own map[string]any
	if err := h.callAs(agent, protocol.SubjCatalogRemove, map[string]any{"agent_id": a}, &own); err != nil || own["removed"] != false {
		t.Fatalf("the agent removing over the operator: %v %v", own, err)
	}
	h.deregister(a)
	h.register(a, map[string]any{"name": "Spam again", "visibility": "public", "registered_at": later()})
	h.sync(marker, "Marker 1")
	if e, ok := byID(h.catalog(map[string]any{}), a); ok {
		t.Fatalf("re-registering undid the operator's removal: %+v", e)
	}
	h.restart()
	h.sync(marker, "Marker 2")
	if e, ok := byID(h.catalog(map[string]any{}), a); ok {
		t.Fatalf("a replay undid the operator's removal: %+v", e)
	}

	// Lifted with the agent deregistered: its next registration lists it.
	h.deregister(a)
	h.sync(marker, "Marker 3")
	if out, err := h.asServices(protocol.SubjCatalogAdmin, map[string]any{"agent_id": a, "restore": true}); err != nil || out["restored"] != true || out["listed"] != false {
		t.Fatalf("restore with no registration: %v %v", out, err)
	}
	if out, err := h.asServices(protocol.SubjCatalogAdmin, map[string]any{"agent_id": a, "restore": true}); err != nil || out["restored"] != false {
		t.Fatalf("restoring twice: %v %v", out, err)
	}
	h.register(a, map[string]any{"name": "Welcome back", "visibility": "public", "registered_at": later()})
	h.waitCatalog(map[string]any{}, "the registration after the restore", func(c catalog) bool {
		e, ok := byID(c, a)
		return ok && e.Name == "Welcome back"
	})

	// The agent's own removal: undone by its later registration.
	if err := h.callAs(agent, protocol.SubjCatalogRemove, map[string]any{"agent_id": a}, &own); err != nil || own["removed"] != true {
		t.Fatalf("the agent's own removal: %v %v", own, err)
	}
	h.deregister(a)
	h.register(a, map[string]any{"name": "Mine again", "visibility": "public", "registered_at": later()})
	h.waitCatalog(map[string]any{}, "the agent's registration after its own removal", func(c catalog) bool {
		e, ok := byID(c, a)
		return ok && e.Name == "Mine again"
	})

	// The operator over the agent's own removal: the operator's sticks.
	if err := h.callAs(agent, protocol.SubjCatalogRemove, map[string]any{"agent_id": a}, &own); err != nil || own["removed"] != true {
		t.Fatalf("the agent's own removal: %v %v", own, err)
	}
	if _, err := h.asServices(protocol.SubjCatalogAdmin, map[string]any{"agent_id": a, "remove": true}); err != nil {
		t.Fatal(err)
	}
	h.deregister(a)
	h.register(a, map[string]any{"name": "Sneaking back", "visibility": "public", "registered_at": later()})
	h.sync(marker, "Marker 4")
	if e, ok := byID(h.catalog(map[string]any{}), a); ok {
		t.Fatalf("the operator's removal over the agent's was undone: %+v", e)
	}
}

// Past what one direct get answers (1,024 keys), the catalog is read
// through a watch, and nothing is lost.
func TestCatalogLargerThanOneBatch(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 1,100 registrations")
	}
	h := start(t)
	const n = 1100
	ids := map[string]bool{}
	for range n {
		k, err := keys.Generate[keys.AgentRole]()
		if err != nil {
			t.Fatal(err)
		}
		ids[k.Public()] = true
		h.register(k.Public(), map[string]any{"name": "bulk", "visibility": "public", "offerings": offerings})
	}
	h.waitCatalog(map[string]any{}, fmt.Sprintf("%d entries", n), func(c catalog) bool { return c.Total == n })
	for _, p := range h.pages(map[string]any{"limit": float64(activity.MaxCatalogLimit)}) {
		for _, e := range p.Entries {
			delete(ids, e.AgentID)
		}
	}
	if len(ids) != 0 {
		t.Fatalf("%d agents missing", len(ids))
	}
	// The one-request read does refuse this many: the listing above took
	// the watch.
	msgs, err := jetstreamext.GetLastMsgsFor(t.Context(), h.js, "KV_"+activity.UsageBucket,
		[]string{"$KV." + activity.UsageBucket + "." + activity.CatalogPrefix + ">"})
	refused := err != nil
	if err == nil {
		for _, err := range msgs {
			refused = refused || err != nil
		}
	}
	if !refused {
		t.Error("one direct get answered 1,100 keys: the fallback was not exercised")
	}
}

// The catalog keys live in the usage bucket, whose stream allows direct
// gets (what the one-request listing needs), and the usage listing skips
// them.
func TestCatalogSharesTheUsageBucket(t *testing.T) {
	h := start(t)
	a := bustest.Agent(t).Public()
	h.register(a, map[string]any{"name": "One", "visibility": "public", "offerings": offerings})
	h.waitCatalog(map[string]any{}, "the entry", func(c catalog) bool { return c.Total == 1 })
	st, err := h.js.Stream(t.Context(), "KV_"+activity.UsageBucket)
	if err != nil {
		t.Fatal(err)
	}
	if !st.CachedInfo().Config.AllowDirect {
		t.Error("the usage bucket's stream does not allow direct gets")
	}
	if u := h.usage(map[string]any{}); len(u) != 0 {
		t.Fatalf("usage lists catalog keys: %+v", u)
	}
	var kv jetstream.KeyValue
	if kv, err = h.js.KeyValue(t.Context(), activity.UsageBucket); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(t.Context(), activity.CatalogPrefix+a); err != nil {
		t.Fatalf("catalog key: %v", err)
	}
}
