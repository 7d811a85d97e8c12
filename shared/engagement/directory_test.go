package engagement_test

import (
	"slices"
	"testing"

	"agentmesh.dev/mesh/shared/engagement"
)

// The registry record's owner is the attested owner, else the node's key
// (records from before owners were recorded); offerings are read from
// offerings and skills; any SKU counts.
func TestInfoFromRecord(t *testing.T) {
	owner, node := newKey(t).Public(), newKey(t).Public()
	for _, tc := range []struct {
		name string
		rec  map[string]any
		want engagement.AgentInfo
	}{
		{"attested owner", map[string]any{"owner": owner, "node": map[string]any{"id": node}},
			engagement.AgentInfo{Registered: true, Owner: owner}},
		{"node fallback", map[string]any{"node": map[string]any{"id": node}},
			engagement.AgentInfo{Registered: true, Owner: node}},
		{"an owner that is no key", map[string]any{"owner": "alice", "node": map[string]any{"id": node}},
			engagement.AgentInfo{Registered: true, Owner: node}},
		{"offerings, skills and a SKU", map[string]any{"node": map[string]any{"id": node},
			"offerings": []any{map[string]any{"id": "a"}, "junk"}, "skills": []any{map[string]any{"id": "b"}},
			"skus": []any{map[string]any{"sku": "x"}}},
			engagement.AgentInfo{Registered: true, Owner: node, Offerings: []string{"a", "b"}, SKUs: true}},
		{"an empty SKU list", map[string]any{"node": map[string]any{"id": node}, "skus": []any{}},
			engagement.AgentInfo{Registered: true, Owner: node}},
	} {
		got := engagement.InfoFromRecord(tc.rec)
		if got.Registered != tc.want.Registered || got.Owner != tc.want.Owner || got.SKUs != tc.want.SKUs || !slices.Equal(got.Offerings, tc.want.Offerings) {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
