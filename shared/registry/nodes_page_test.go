package registry_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"agentmesh.dev/mesh/shared/bus/bustest"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/registry"
)

// nodePages lists the nodes page by page from q, following next.
func (f *fixture) nodePages(q map[string]any) []map[string]any {
	f.t.Helper()
	var out []map[string]any
	for {
		p, err := f.call(bustest.Agent(f.t), protocol.SubjNodesList, protocol.TypeDiscover, q)
		if err != nil {
			f.t.Fatal(err)
		}
		out = append(out, p)
		next, ok := p["next"].(string)
		if p["next"] == nil {
			return out
		}
		if !ok || len(out) > 1000 {
			f.t.Fatalf("next %v after %d pages", p["next"], len(out))
		}
		q = map[string]any{"limit": q["limit"], "after": next}
	}
}

// hostNodes stores n registrations, each on its own node (as the registry
// stores them), the node's device host padded to hostBytes; it returns the
// node keys, sorted.
func (f *fixture) hostNodes(n, hostBytes int) []string {
	f.t.Helper()
	var nodes []string
	for range n {
		a, node := bustest.Agent(f.t).Public(), bustest.Node(f.t).Public()
		f.putJSON(registry.Bucket, a, map[string]any{"id": a, "visibility": "public",
			"node": map[string]any{"id": node, "device": map[string]any{"host": strings.Repeat("h", hostBytes)}}})
		nodes = append(nodes, node)
	}
	slices.Sort(nodes)
	return nodes
}

// Paging through the nodes returns each exactly once, in key order.
func TestNodesListPaging(t *testing.T) {
	f := setup(t, registry.Config{})
	want := f.hostNodes(17, 4)
	for _, limit := range []float64{1, 4, 17, 500} {
		var got []string
		pages := f.nodePages(map[string]any{"limit": limit})
		for i, p := range pages {
			if p["total"] != float64(len(want)) {
				t.Fatalf("limit %v page %d: total %v", limit, i, p["total"])
			}
			nodes := p["nodes"].([]any)
			if len(nodes) > int(limit) || i < len(pages)-1 && len(nodes) != int(limit) {
				t.Fatalf("limit %v page %d holds %d nodes", limit, i, len(nodes))
			}
			for _, x := range nodes {
				got = append(got, x.(map[string]any)["node"].(string))
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("limit %v: paged\n%v\nwant\n%v", limit, got, want)
		}
	}
	// No payload is the first page of DefaultNodesLimit nodes.
	if p := f.nodePages(nil); len(p) != 1 || len(p[0]["nodes"].([]any)) != len(want) {
		t.Fatalf("default paging: %v", p)
	}
}

// Large node entries split pages by size before the count.
func TestNodesListPageBytes(t *testing.T) {
	f := setup(t, registry.Config{})
	want := f.hostNodes(8, 140<<10)
	var got []string
	pages := f.nodePages(map[string]any{"limit": 100.0})
	for i, p := range pages {
		b, _ := json.Marshal(p["nodes"])
		if len(b) > 512<<10 {
			t.Fatalf("page %d: %d bytes of nodes", i, len(b))
		}
		for _, x := range p["nodes"].([]any) {
			got = append(got, x.(map[string]any)["node"].(string))
		}
	}
	if len(pages) != 3 || !slices.Equal(got, want) {
		t.Fatalf("%d pages (want 3: 3, 3, 2), nodes\n%v\nwant\n%v", len(pages), got, want)
	}
}

func TestNodesListPageRefusesBadInput(t *testing.T) {
	f := setup(t, registry.Config{})
	f.hostNodes(2, 4)
	for _, q := range []any{
		map[string]any{"limit": 0.0}, map[string]any{"limit": -3.0}, map[string]any{"limit": 1.5}, map[string]any{"limit": "5"},
		map[string]any{"after": 7.0}, map[string]any{"after": ""}, map[string]any{"after": "not a cursor!"}, "a string",
	} {
		if _, err := f.call(bustest.Agent(t), protocol.SubjNodesList, protocol.TypeDiscover, q); errs.CodeOf(err) != errs.InvalidQuery {
			t.Fatalf("query %v: %v", q, err)
		}
	}
	// A limit past the maximum is capped, not refused.
	if _, err := f.call(bustest.Agent(t), protocol.SubjNodesList, protocol.TypeDiscover, map[string]any{"limit": 1e6}); err != nil {
		t.Fatal(err)
	}
}
