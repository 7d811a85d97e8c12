// Package httpx is the HTTP hygiene every route shares: JSON bodies with
// size limits and (where the spec says "exactly these members") unknown
// members refused, errors rendered once with the protocol's codes, a per-IP
// rate limit answering 429 with retry_after_ms, and the route type from
// which the local mux and the Cloud Function entry points are built.
package httpx

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strings"

	"agentmesh.dev/mesh/shared/errs"
)

// MaxBody is the default cap on a request body. Control-plane bodies are
// small; anything larger is a mistake or an attack.
const MaxBody = 64 << 10

// DecodeOptions tune Decode.
type DecodeOptions struct {
	// Strict refuses members the destination type does not declare.
	Strict bool
	// MaxBytes overrides MaxBody.
	MaxBytes int64
	// AllowEmpty accepts an empty body as {} (for routes whose body is optional).
	AllowEmpty bool
}

// Decode reads a JSON body into dst with the spec's hygiene: content type
// application/json, a size cap, exactly one JSON value, and in strict mode no
// unknown members. Every refusal is an INVALID_REQUEST (or PAYLOAD_TOO_LARGE)
// with a message a caller can act on.
func Decode(w http.ResponseWriter, r *http.Request, dst any, opt DecodeOptions) error {
	limit := opt.MaxBytes
	if limit <= 0 {
		limit = MaxBody
	}
	if r.Body == nil {
		if opt.AllowEmpty {
			return nil
		}
		return errs.New(errs.InvalidRequest, "request body is required (JSON)")
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return errs.Newf(errs.PayloadTooLarge, "request body is larger than %d bytes", limit)
		}
		return errs.Wrap(errs.InvalidRequest, "request body could not be read", err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		if opt.AllowEmpty {
			return nil
		}
		return errs.New(errs.InvalidRequest, "request body is required (JSON)")
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			return errs.Newf(errs.InvalidRequest, "content-type must be application/json, not %q", ct)
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if opt.Strict {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(dst); err != nil {
		return errs.Wrap(errs.InvalidRequest, describeJSONError(err), err)
	}
	if dec.More() {
		return errs.New(errs.InvalidRequest, "request body must be a single JSON object")
	}
	return nil
}

// describeJSONError turns decoder errors into sentences without echoing
// request content beyond a member name.
func describeJSONError(err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("request body is not valid JSON (at byte %d)", se.Offset)
	case errors.As(err, &te):
		if te.Field != "" {
			return fmt.Sprintf("member %q must be %s", te.Field, jsonKind(te.Type.Kind().String()))
		}
		return "request body must be a JSON object"
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return "unknown member " + strings.TrimPrefix(err.Error(), "json: unknown field ") + " (this route accepts exactly its documented members)"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "request body is truncated JSON"
	}
	return "request body is not valid JSON"
}

func jsonKind(k string) string {
	switch k {
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "slice", "array":
		return "an array"
	case "map", "struct":
		return "an object"
	}
	return "a number"
}

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
// so every error is rendered (and an internal one logged) exactly once.
type HandlerFunc func(w http.ResponseWriter, r *http.Request) error

// Handle adapts a HandlerFunc to http.Handler, rendering errors with the
// protocol's codes.
func Handle(log *slog.Logger, fn HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := fn(w, r); err != nil {
			errs.WriteHTTP(w, log, err)
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
