package cloudlog

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestLinesCloudLoggingReads(t *testing.T) {
	var buf bytes.Buffer
	log := New(&buf, slog.LevelDebug, "proj-1").With("component", "http")
	h := Trace(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		log.WarnContext(r.Context(), "slow store", "ms", 12)
		log.DebugContext(r.Context(), "detail")
	}))
	req := httptest.NewRequest("GET", "/v1/health", nil)
	req.Header.Set("X-Cloud-Trace-Context", "105445aa7843bc8bf206b12000100000/1;o=1")
	h.ServeHTTP(httptest.NewRecorder(), req)
	log.Error("no request")

	var lines []map[string]any
	for _, l := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
		var m map[string]any
		if err := json.Unmarshal(l, &m); err != nil {
			t.Fatalf("%s: %v", l, err)
		}
		lines = append(lines, m)
	}
	if len(lines) != 3 {
		t.Fatalf("%d lines: %s", len(lines), buf.String())
	}
	want := []map[string]any{
		{"severity": "WARNING", "message": "slow store", "component": "http", "ms": float64(12),
			fieldTrace: "projects/proj-1/traces/105445aa7843bc8bf206b12000100000", fieldSpan: "0000000000000001", fieldSampled: true},
		{"severity": "DEBUG", "message": "detail", fieldTrace: "projects/proj-1/traces/105445aa7843bc8bf206b12000100000"},
		{"severity": "ERROR", "message": "no request", fieldTrace: nil},
	}
	for i, w := range want {
		for k, v := range w {
			if lines[i][k] != v {
				t.Errorf("line %d: %s = %v, want %v (%v)", i, k, lines[i][k], v, lines[i])
			}
		}
		if _, ok := lines[i]["level"]; ok {
			t.Errorf("line %d keeps level: %v", i, lines[i])
		}
		if _, ok := lines[i]["msg"]; ok {
			t.Errorf("line %d keeps msg: %v", i, lines[i])
		}
	}
}

func TestParseTraceContext(t *testing.T) {
	for _, c := range []struct {
		in, id, span string
		sampled, ok  bool
	}{
		{"105445aa7843bc8bf206b12000100000/1;o=1", "105445aa7843bc8bf206b12000100000", "1", true, true},
		{"105445aa7843bc8bf206b12000100000/123;o=0", "105445aa7843bc8bf206b12000100000", "123", false, true},
		{"105445aa7843bc8bf206b12000100000", "105445aa7843bc8bf206b12000100000", "", false, true},
		{"", "", "", false, false},
		{"xyz/1", "", "", false, false},
		{"105445aa7843bc8bf206b12000100000/1\"}", "", "", false, false},
		{"105445aa7843bc8bf206b1200010000g/1", "", "", false, false},
	} {
		id, span, sampled, ok := ParseTraceContext(c.in)
		if id != c.id || span != c.span || sampled != c.sampled || ok != c.ok {
			t.Errorf("%q: %q %q %v %v", c.in, id, span, sampled, ok)
		}
	}
}

func FuzzParseTraceContext(f *testing.F) {
	f.Add("105445aa7843bc8bf206b12000100000/1;o=1")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		id, span, _, ok := ParseTraceContext(s)
		if ok && (len(id) != 32 || !isHex(id) || (span != "" && !isDigits(span))) {
			t.Fatalf("accepted %q as %q/%q", s, id, span)
		}
	})
}
