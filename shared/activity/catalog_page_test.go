package activity_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"agentmesh.dev/mesh/shared/activity"
	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

type catalogPage struct {
	Entries []activity.Entry `json:"entries"`
	Total   int              `json:"total"`
	Next    *string          `json:"next"`
}

// pages lists q page by page, following next, and returns every page.
func (h *harness) pages(q map[string]any) []catalogPage {
	h.t.Helper()
	var out []catalogPage
	for {
		var p catalogPage
		if err := h.call(protocol.SubjCatalogList, q, &p); err != nil {
			h.t.Fatal(err)
		}
		out = append(out, p)
		if p.Next == nil {
			return out
		}
		if len(out) > 1000 {
			h.t.Fatal("paging never ended")
		}
		q = copyQuery(q)
		q["after"] = *p.Next
	}
}

func copyQuery(q map[string]any) map[string]any {
	c := map[string]any{}
	for k, v := range q {
		c[k] = v
	}
	return c
}

// Paging through the catalog returns every entry exactly once, in the
// listing's order (name, then id; names repeat), with the filters applied
// across pages.
func TestCatalogPaging(t *testing.T) {
	h := start(t)
	const n = 23
	for i := range n {
		tags := []any{"odd"}
		if i%2 == 0 {
			tags = []any{"even"}
		}
		h.register(bustest.Agent(t).Public(), map[string]any{"name": fmt.Sprintf("agent-%02d", i%7), "visibility": "public", "offerings": offerings, "tags": tags})
	}
	all := h.waitCatalog(map[string]any{"limit": float64(activity.MaxCatalogLimit)}, "every agent", func(c catalog) bool { return c.Total == n })
	if len(all.Entries) != n {
		t.Fatalf("one page of %d holds %d entries", activity.MaxCatalogLimit, len(all.Entries))
	}
	for _, tc := range []struct {
		q    map[string]any
		want func(activity.Entry) bool
	}{
		{map[string]any{"limit": 5.0}, func(activity.Entry) bool { return true }},
		{map[string]any{"limit": 1.0}, func(activity.Entry) bool { return true }},
		{map[string]any{"limit": 4.0, "categories": []any{"EVEN"}}, func(e activity.Entry) bool { return e.Categories[0] == "even" }},
		{map[string]any{"limit": 3.0, "available": true, "official": false}, func(activity.Entry) bool { return true }},
	} {
		var want []string
		for _, e := range all.Entries {
			if tc.want(e) {
				want = append(want, e.AgentID)
			}
		}
		var got []string
		pages := h.pages(tc.q)
		for i, p := range pages {
			if p.Total != len(want) {
				t.Fatalf("%v page %d: total %d, want %d", tc.q, i, p.Total, len(want))
			}
			if lim := int(tc.q["limit"].(float64)); len(p.Entries) > lim || i < len(pages)-1 && len(p.Entries) != lim {
				t.Fatalf("%v page %d holds %d entries", tc.q, i, len(p.Entries))
			}
			for _, e := range p.Entries {
				got = append(got, e.AgentID)
			}
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Fatalf("%v: paged\n%v\nwant\n%v", tc.q, got, want)
		}
	}
	// The default page is DefaultCatalogLimit entries; this catalog fits.
	if p := h.pages(map[string]any{}); len(p) != 1 || len(p[0].Entries) != n {
		t.Fatalf("default paging: %d pages", len(p))
	}
}

// Long entries split pages by size before the count: no page's entries
// pass the page budget (512 KiB), so none nears the transport's 1 MiB.
func TestCatalogPageBytes(t *testing.T) {
	h := start(t)
	const n = 8
	long := strings.Repeat("x", 140<<10)
	for i := range n {
		h.register(bustest.Agent(t).Public(), map[string]any{"name": fmt.Sprintf("big-%d", i), "visibility": "public",
			"offerings": []any{map[string]any{"id": "o", "name": "O", "description": long}}})
	}
	h.waitCatalog(map[string]any{"limit": 1.0}, "every agent", func(c catalog) bool { return c.Total == n })
	pages := h.pages(map[string]any{"limit": 100.0})
	seen := map[string]bool{}
	for i, p := range pages {
		b, _ := json.Marshal(p.Entries)
		if len(b) > 512<<10 {
			t.Fatalf("page %d: %d bytes of entries", i, len(b))
		}
		for _, e := range p.Entries {
			if seen[e.AgentID] {
				t.Fatalf("%s listed twice", e.AgentID)
			}
			seen[e.AgentID] = true
		}
	}
	if len(pages) != 3 || len(seen) != n {
		t.Fatalf("%d pages, %d entries; want 3 pages (3, 3, 2) of %d", len(pages), len(seen), n)
	}
}

func TestCatalogPageRefusesBadInput(t *testing.T) {
	h := start(t)
	for _, q := range []map[string]any{
		{"limit": 0.0}, {"limit": -1.0}, {"limit": 2.5}, {"limit": "10"},
		{"after": 5.0}, {"after": ""}, {"after": "not a cursor!"}, {"after": "bm8tbnVs"}, // "no-nul"
	} {
		err := h.call(protocol.SubjCatalogList, q, &catalogPage{})
		if errs.CodeOf(err) != errs.InvalidQuery {
			t.Fatalf("query %v: %v", q, err)
		}
	}
	// A limit past the maximum is capped, not refused.
	if err := h.call(protocol.SubjCatalogList, map[string]any{"limit": 10000.0}, &catalogPage{}); err != nil {
		t.Fatal(err)
	}
}
