// Package httpx is the HTTP hygiene every route shares: strict JSON bodies
// (application/json, exact member names, no duplicates, valid UTF-8, a size
// cap and a read deadline, and where the spec says "exactly these members"
// unknown members refused), errors rendered and logged once with the
// protocol's codes (the mux's own 404 and 405 included), a per-IP rate
// limit answering 429 with retry_after_ms, and the route type from which
// the local mux and the Cloud Function entry points are built.
package httpx

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
)

// WriteJSON writes v as JSON with status.
func WriteJSON(w http.ResponseWriter, status int, v any) { writeJSON(w, status, v, true) }

// WriteJSONExact is WriteJSON without the encoder's HTML escaping: `<`, `>`,
// `&`, U+2028 and U+2029 in strings, and every json.RawMessage member, go
// out exactly as they are. A member that holds signed bytes (the
// registrar's card) is then sent byte for byte, as a verifier that checks
// the raw bytes needs. The answer is marked nosniff, so no browser takes it
// for HTML.
func WriteJSONExact(w http.ResponseWriter, status int, v any) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	writeJSON(w, status, v, false)
}

func writeJSON(w http.ResponseWriter, status int, v any, escapeHTML bool) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if h.Get("Cache-Control") == "" {
		h.Set("Cache-Control", "no-store")
	}
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(escapeHTML)
	_ = enc.Encode(v)
}

// HandlerFunc is a handler that returns its error instead of rendering it,
// so every error is rendered (and logged) exactly once.
type HandlerFunc func(w http.ResponseWriter, r *http.Request) error

// Handle adapts a HandlerFunc to http.Handler, rendering and logging its
// error with Fail.
func Handle(log *slog.Logger, fn HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := fn(w, r); err != nil {
			Fail(w, r, log, err)
		}
	})
}

// BearerToken returns the token of an "Authorization: Bearer <token>"
// header, or "".
func BearerToken(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}
