package engagement_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/engagement"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/sow"
)

// The registry record's owner is registry.OwnerOf's at now: the attested
// owner until its attestation expires and then none (never the node
// instead), none for a guest or an agent that is its own node, the node's
// key for records from before owners were recorded; offerings are read
// from offerings and skills; any SKU counts.
func TestInfoFromRecord(t *testing.T) {
	agent, owner, node := newKey(t).Public(), newKey(t).Public(), newKey(t).Public()
	now := time.Date(2026, 7, 27, 15, 0, 0, 0, time.UTC)
	until := protocol.FormatTime(now.Add(time.Hour))
	for _, tc := range []struct {
		name string
		rec  map[string]any
		want engagement.AgentInfo
	}{
		{"attested owner", map[string]any{"id": agent, "owner": owner, "owner_expires_at": until, "node": map[string]any{"id": node}},
			engagement.AgentInfo{Registered: true, Owner: owner}},
		{"attestation expired", map[string]any{"id": agent, "owner": owner, "owner_expires_at": protocol.FormatTime(now.Add(-time.Second)), "node": map[string]any{"id": node}},
			engagement.AgentInfo{Registered: true}},
		{"guest", map[string]any{"id": agent, "owner": "", "sandbox": true, "node": map[string]any{"id": agent}},
			engagement.AgentInfo{Registered: true}},
		{"its own node, from before owners", map[string]any{"id": agent, "node": map[string]any{"id": agent}},
			engagement.AgentInfo{Registered: true}},
		{"node fallback", map[string]any{"id": agent, "node": map[string]any{"id": node}},
			engagement.AgentInfo{Registered: true, Owner: node}},
		{"an owner that is no key", map[string]any{"id": agent, "owner": "alice", "owner_expires_at": until, "node": map[string]any{"id": node}},
			engagement.AgentInfo{Registered: true}},
		{"offerings, skills and a SKU", map[string]any{"id": agent, "node": map[string]any{"id": node},
			"offerings": []any{map[string]any{"id": "a"}, "junk"}, "skills": []any{map[string]any{"id": "b"}},
			"skus": []any{map[string]any{"sku": "x"}}},
			engagement.AgentInfo{Registered: true, Owner: node, Offerings: []string{"a", "b"}, SKUs: true}},
		{"an empty SKU list", map[string]any{"id": agent, "node": map[string]any{"id": node}, "skus": []any{}},
			engagement.AgentInfo{Registered: true, Owner: node}},
	} {
		got := engagement.InfoFromRecord(tc.rec, now)
		if got.Registered != tc.want.Registered || got.Owner != tc.want.Owner || got.SKUs != tc.want.SKUs || !slices.Equal(got.Offerings, tc.want.Offerings) {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// A registered agent with no owner (review 18 #1, #2) has nobody to sign
// for its seat: its countersign is refused, saying so.
func TestSeatOfAnAgentWithNoOwner(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	tmpl := w.template()
	if _, err := w.svc.FileProposal(ctx, w.sign(clone(t, tmpl), sow.RoleProvider, w.pOwner)); err != nil {
		t.Fatal(err)
	}
	w.dir.set(w.client.Public(), engagement.AgentInfo{Offerings: []string{"buy"}})
	_, err := w.svc.Countersign(ctx, w.sign(w.instance(tmpl), sow.RoleClient, w.cOwner), nil)
	refused(t, err, errs.Forbidden, "client with no owner")
	if !strings.Contains(errs.As(err).Message, "has no owner") {
		t.Fatalf("refusal %q does not say the agent has no owner", errs.As(err).Message)
	}
}
