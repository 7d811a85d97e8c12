package engagement_test

import (
	"context"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/engagement"
	"agentmesh.dev/mesh/shared/sow"
)

// ListForAgents lists the engagements an agent is a party to, on either
// seat, each once, with its state now: awaiting the provider's signature,
// active, in notice, terminated.
func TestListForAgents(t *testing.T) {
	ctx := context.Background()
	w := newWorld(t)
	list := func(agents ...string) []engagement.Summary {
		t.Helper()
		out, err := w.svc.ListForAgents(ctx, agents)
		if err != nil {
			t.Fatalf("list: %v", err)
		}
		return out
	}
	if got := list(w.client.Public(), "not a key", ""); len(got) != 0 {
		t.Fatalf("before any engagement: %+v", got)
	}

	// One formed on summarize; one on translate awaiting the provider.
	w.form(w.template())
	tmpl := w.template()
	tmpl["id"] = "sow_test0000000002"
	tmpl["scope"] = map[string]any{"offerings": []any{"translate"}, "grade": "evidence"}
	if _, err := w.svc.FileProposal(ctx, w.sign(clone(t, tmpl), sow.RoleProvider, w.pOwner)); err != nil {
		t.Fatal(err)
	}
	w.clock.Advance(time.Minute)
	if _, err := w.svc.Countersign(ctx, w.sign(w.instance(tmpl), sow.RoleClient, w.cOwner), nil); err != nil {
		t.Fatal(err)
	}

	byID := func(got []engagement.Summary) map[string]engagement.Summary {
		m := map[string]engagement.Summary{}
		for _, s := range got {
			m[s.SowID] = s
		}
		return m
	}
	for _, asked := range [][]string{{w.client.Public()}, {w.provider.Public()}, {w.client.Public(), w.provider.Public(), w.client.Public()}} {
		got := list(asked...)
		if len(got) != 2 || got[0].SowID != "sow_test0000000002" || got[1].SowID != "sow_test0000000001" {
			t.Fatalf("asked %d agents: want both engagements once, newest first; got %+v", len(asked), got)
		}
		m := byID(got)
		formed, pending := m["sow_test0000000001"], m["sow_test0000000002"]
		if formed.State != sow.StateActive || !formed.InForce || formed.Version != 1 || formed.Client != w.client.Public() ||
			formed.Seller != w.provider.Public() || len(formed.Offerings) != 1 || formed.Offerings[0] != "summarize" ||
			!formed.StartsAt.Equal(epoch.Truncate(time.Second)) || formed.EndsAt == nil {
			t.Fatalf("the formed engagement: %+v", formed)
		}
		if pending.State != engagement.StateRequested || pending.InForce || pending.Offerings[0] != "translate" {
			t.Fatalf("the engagement awaiting the provider: %+v", pending)
		}
	}
	if got := list(w.stranger.Public()); len(got) != 0 {
		t.Fatalf("a stranger is party to nothing: %+v", got)
	}

	// Terminated for convenience: in notice, still in force; then ended.
	if _, err := w.svc.Terminate(ctx, w.act(engagement.TagTerminate, w.cOwner, map[string]any{"version": 1, "for_cause": false})); err != nil {
		t.Fatal(err)
	}
	if s := byID(list(w.client.Public()))["sow_test0000000001"]; !s.InNotice || !s.InForce || s.State != sow.StateActive {
		t.Fatalf("in notice: %+v", s)
	}
	w.clock.Advance(24 * time.Hour)
	if s := byID(list(w.client.Public()))["sow_test0000000001"]; s.InNotice || s.InForce || s.State != sow.StateTerminated {
		t.Fatalf("after the notice: %+v", s)
	}
}
