package feeds

import (
	"encoding/json"
	"testing"
)

// FuzzParseHistoryQuery: whatever a caller sends, the history query is
// refused or within bounds, never a panic.
func FuzzParseHistoryQuery(f *testing.F) {
	for _, s := range []string{`{}`, `{"since":0}`, `{"since":12,"limit":5}`, `{"since":"2026-01-02T03:04:05.678Z"}`,
		`{"limit":1e9}`, `{"since":-1}`, `{"since":1e300}`, `{"limit":null,"since":null}`, `{"since":[1]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var q map[string]any
		if json.Unmarshal(data, &q) != nil {
			return
		}
		hq, ok, err := parseHistoryQuery(q)
		if err != nil || !ok {
			return
		}
		if hq.limit < 1 || hq.limit > MaxHistoryLimit {
			t.Fatalf("limit %d out of bounds for %s", hq.limit, data)
		}
		if hq.after > 1<<53 {
			t.Fatalf("since %d out of bounds for %s", hq.after, data)
		}
	})
}
