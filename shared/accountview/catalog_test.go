package accountview

import (
	"context"
	"fmt"
	"testing"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// fakeCatalog answers mesh.catalog.list from n entries, pages of two, with
// a cursor that is the index of the page's last entry.
func fakeCatalog(n int, calls *[]map[string]any) func(context.Context, string, any) (map[string]any, error) {
	return func(_ context.Context, subject string, payload any) (map[string]any, error) {
		q := payload.(map[string]any)
		*calls = append(*calls, q)
		if subject != protocol.SubjCatalogList || q["limit"] != catalogPageLimit {
			return nil, fmt.Errorf("call %s %v", subject, q)
		}
		start := 0
		if a, ok := q["after"].(string); ok {
			if _, err := fmt.Sscan(a, &start); err != nil {
				return nil, errs.New(errs.InvalidQuery, "bad cursor")
			}
			start++
		}
		entries := []any{}
		for i := start; i < min(start+2, n); i++ {
			entries = append(entries, map[string]any{"agent_id": fmt.Sprintf("U%d", i)})
		}
		var next any
		if start+2 < n {
			next = fmt.Sprint(start + 1)
		}
		return map[string]any{"entries": entries, "total": float64(n), "next": next}, nil
	}
}

// The catalog is read across every page, and a stop ends the reading.
func TestEachCatalogEntryFollowsNext(t *testing.T) {
	for _, tc := range []struct {
		n, stopAt, wantSeen, wantCalls int
	}{
		{0, -1, 0, 1}, {1, -1, 1, 1}, {2, -1, 2, 1}, {5, -1, 5, 3}, {6, -1, 6, 3}, {6, 2, 3, 2},
	} {
		var calls []map[string]any
		seen := 0
		err := eachCatalogEntry(context.Background(), fakeCatalog(tc.n, &calls), func(m map[string]any) bool {
			if m["agent_id"] != fmt.Sprintf("U%d", seen) {
				t.Fatalf("%+v: entry %d is %v", tc, seen, m)
			}
			seen++
			return seen-1 != tc.stopAt
		})
		if err != nil || seen != tc.wantSeen || len(calls) != tc.wantCalls {
			t.Errorf("%+v: seen %d in %d calls, %v", tc, seen, len(calls), err)
		}
	}
}

// A listing whose cursor never ends is given up, not followed forever.
func TestEachCatalogEntryEndlessListing(t *testing.T) {
	calls := 0
	endless := func(context.Context, string, any) (map[string]any, error) {
		calls++
		return map[string]any{"entries": []any{}, "next": "again"}, nil
	}
	err := eachCatalogEntry(context.Background(), endless, func(map[string]any) bool { return true })
	if errs.CodeOf(err) != errs.Unavailable || calls != maxCatalogPages {
		t.Fatalf("%d calls, %v", calls, err)
	}
}
