package httpx

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/errs"
)

func TestLimiter(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := NewLimiter(3, time.Minute, func() time.Time { return now })
	for i := range 3 {
		if ok, _ := l.Allow("a"); !ok {
			t.Fatalf("request %d refused", i)
		}
	}
	ok, after := l.Allow("a")
	if ok || after <= 0 || after > time.Minute {
		t.Fatalf("4th: ok=%v after=%v", ok, after)
	}
	if ok, _ := l.Allow("b"); !ok {
		t.Error("keys are independent")
	}
	// Half way through the next window the previous one still counts half.
	now = now.Add(90 * time.Second)
	for i, want := range []bool{true, true, false} { // 1.5, 2.5, then 3.5 of 3
		if ok, _ := l.Allow("a"); ok != want {
			t.Errorf("half-way request %d: ok=%v, want %v", i, ok, want)
		}
	}
	now = now.Add(2 * time.Minute)
	if ok, _ := l.Allow("a"); !ok {
		t.Error("after two idle windows the key is fresh")
	}
}

func TestPerIPAnswers429(t *testing.T) {
	l := NewLimiter(1, time.Minute, nil)
	h := PerIP(l, 0, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) }))
	do := func(remote, xff string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = remote
		if xff != "" {
			r.Header.Set("X-Forwarded-For", xff)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec
	}
	if do("10.0.0.1:1", "").Code != 204 {
		t.Fatal("first request")
	}
	rec := do("10.0.0.1:2", "1.2.3.4")
	var body errs.HTTPBody
	_ = json.Unmarshal(rec.Body.Bytes(), &body)
	if rec.Code != 429 || body.Code != errs.RateLimited || body.RetryAfterMS <= 0 || rec.Header().Get("Retry-After") == "" {
		t.Errorf("second request: %d %+v", rec.Code, body)
	}
	// Without trusted hops a forged X-Forwarded-For does not dodge the limit,
	if do("10.0.0.1:3", "9.9.9.9").Code != 429 {
		t.Error("X-Forwarded-For must be ignored without trusted proxies")
	}
	// and with one trusted hop the client is the address that proxy appended.
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "10.0.0.9:1"
	r.Header.Set("X-Forwarded-For", "6.6.6.6, 1.2.3.4")
	if got := ClientIP(r, 1); got != "1.2.3.4" {
		t.Errorf("ClientIP = %s", got)
	}
}

func TestLimitKey(t *testing.T) {
	for in, want := range map[string]string{
		"192.0.2.7":        "192.0.2.7",
		" 192.0.2.7 ":      "192.0.2.7",
		"::ffff:192.0.2.7": "192.0.2.7",
		"2001:db8:1:2::1":  "2001:db8:1:2::/64",
		"2001:0DB8:0001:0002:ffff:ffff:ffff:ffff": "2001:db8:1:2::/64",
		"fe80::1%eth0":      "fe80::/64",
		"2001:db8:1:3::1":   "2001:db8:1:3::/64",
		"2001:db8:1:2::/64": "2001:db8:1:2::/64", // idempotent
		"::1":               "::/64",
		"not-an-ip":         "not-an-ip",
		"@":                 "@",
	} {
		if got := LimitKey(in); got != want {
			t.Errorf("LimitKey(%q) = %q, want %q", in, got, want)
		}
		if got := LimitKey(LimitKey(in)); got != LimitKey(in) {
			t.Errorf("LimitKey is not idempotent on %q: %q", in, got)
		}
	}
}

// One IPv6 /64 is one client for the per-IP limit: walking its addresses
// does not get around it, and another /64 has its own count.
func TestPerIPKeysIPv6On64(t *testing.T) {
	l := NewLimiter(2, time.Minute, nil)
	h := PerIP(l, 0, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) }))
	do := func(remote string) int {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = remote
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec.Code
	}
	for i, remote := range []string{"[2001:db8:1:2::1]:1", "[2001:db8:1:2::2]:1"} {
		if got := do(remote); got != 204 {
			t.Fatalf("request %d: %d", i, got)
		}
	}
	if got := do("[2001:db8:1:2:ffff::9]:1"); got != 429 {
		t.Fatalf("a third address of the same /64: %d, want 429", got)
	}
	if got := do("[2001:db8:1:3::1]:1"); got != 204 {
		t.Fatalf("another /64: %d", got)
	}
	// An IPv4 client counts the same whether it arrives as IPv4 or as an
	// IPv4-mapped IPv6 address.
	for _, remote := range []string{"192.0.2.1:1", "[::ffff:192.0.2.1]:2"} {
		if got := do(remote); got != 204 {
			t.Fatalf("%s: %d", remote, got)
		}
	}
	if got := do("192.0.2.1:3"); got != 429 {
		t.Fatalf("the mapped address must share the IPv4 count: %d", got)
	}
}

func TestRoutes(t *testing.T) {
	rt := Route{EntryPoint: "AccountApps", Method: http.MethodPost, Path: "/v1/accounts/{id}/apps"}
	h := SingleRoute(rt, nil, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte(r.PathValue("id"))) }))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/accounts/acct_1/apps", nil))
	if rec.Body.String() != "acct_1" {
		t.Errorf("path value %q", rec.Body.String())
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/accounts/acct_1/apps", nil))
	if rec.Code != 405 {
		t.Errorf("wrong method: %d", rec.Code)
	}
	if FunctionName("NodeCredential") != "node-credential" || BearerToken(&http.Request{Header: http.Header{"Authorization": {"Bearer abc"}}}) != "abc" {
		t.Error("helpers")
	}
}

func TestWriteJSONExactKeepsRawBytes(t *testing.T) {
	raw := json.RawMessage(`{"a":"x & y <z> \u2028"}`)
	raw = json.RawMessage(strings.Replace(string(raw), `\u2028`, "\u2028", 1))
	rec := httptest.NewRecorder()
	WriteJSONExact(rec, 200, map[string]any{"v": raw, "s": "<&>"})
	want := `{"s":"<&>","v":` + string(raw) + "}\n"
	if rec.Body.String() != want || rec.Header().Get("X-Content-Type-Options") != "nosniff" {
		t.Fatalf("got %q, want %q (%v)", rec.Body.String(), want, rec.Header())
	}
	rec = httptest.NewRecorder()
	WriteJSON(rec, 200, map[string]any{"s": "<&>"})
	if rec.Body.String() != `{"s":"\u003c\u0026\u003e"}`+"\n" {
		t.Fatalf("WriteJSON keeps escaping: %q", rec.Body.String())
	}
}

func TestNetworkKey(t *testing.T) {
	for in, want := range map[string]string{
		"192.0.2.7":          "192.0.2.0/24",
		"192.0.2.255":        "192.0.2.0/24",
		"::ffff:192.0.2.7":   "192.0.2.0/24",
		"192.0.3.1":          "192.0.3.0/24",
		"192.0.2.0/24":       "192.0.2.0/24", // idempotent
		"2001:db8:1:2::1":    "2001:db8:1::/48",
		"2001:db8:1:2::/64":  "2001:db8:1::/48", // from a LimitKey
		"2001:db8:1:ffff::9": "2001:db8:1::/48",
		"2001:db8:2::1":      "2001:db8:2::/48",
		"2001:db8:1::/48":    "2001:db8:1::/48",
		"fe80::1%eth0":       "fe80::/48",
		"10.0.0.0/8":         "10.0.0.0/8", // not a key NetworkKey makes: unchanged
		"not-an-ip":          "not-an-ip",
		"":                   "",
	} {
		if got := NetworkKey(in); got != want {
			t.Errorf("NetworkKey(%q) = %q, want %q", in, got, want)
		}
		if got := NetworkKey(NetworkKey(in)); got != NetworkKey(in) {
			t.Errorf("NetworkKey is not idempotent on %q: %q", in, got)
		}
	}
}
