package errs

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"strconv"
)

// HTTPBody is the JSON body of every refused control-plane or registrar
// request. `ok:false` and `error` (the human text) are what the registrar's
// clients read (spec §4.1); `code`, `retryable` and `details` are what a
// program branches on.
type HTTPBody struct {
	OK           bool           `json:"ok"`
	Error        string         `json:"error"`
	Code         Code           `json:"code"`
	Details      map[string]any `json:"details,omitempty"`
	Retryable    bool           `json:"retryable"`
	RetryAfterMS int64          `json:"retry_after_ms,omitempty"`
}

// Body renders e as its HTTP body.
func (e *Error) Body() HTTPBody {
	return HTTPBody{
		OK:           false,
		Error:        e.Message,
		Code:         e.Code,
		Details:      e.Details,
		Retryable:    e.Retryable,
		RetryAfterMS: e.RetryAfterMS,
	}
}

// WriteHTTP renders err on w. Non-protocol errors are logged here, once, with
// their cause, and answered as a generic INTERNAL_ERROR: the handler does not
// log them again.
func WriteHTTP(w http.ResponseWriter, log *slog.Logger, err error) {
	e := As(err)
	if e.Code == InternalError && log != nil {
		log.Error("internal error", "err", err)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	if e.RetryAfterMS > 0 {
		// Retry-After is whole seconds; round up so a client never comes back early.
		h.Set("Retry-After", strconv.FormatInt((e.RetryAfterMS+999)/1000, 10))
	}
	w.WriteHeader(e.HTTPStatus())
	_ = json.NewEncoder(w).Encode(e.Body())
}

// Respond statuses an error can ride on. A refusal or failure is terminal
// ("failed"); the budget-exhausted pause is the one non-terminal carrier
// (upstream-notes §4.1).
const (
	StatusFailed        = "failed"
	StatusInputRequired = "input_required"
)

// BusPayload is the payload of a respond envelope that carries e: the error
// object sits beside payload.status (spec §7.1). BUDGET_EXHAUSTED rides a
// non-terminal input_required respond; everything else is failed.
func (e *Error) BusPayload() map[string]any {
	status := StatusFailed
	if e.Code == BudgetExhausted {
		status = StatusInputRequired
	}
	return map[string]any{"status": status, "error": e.Wire()}
}

// Wire is the error object as it travels on the bus, with absent members
// omitted (never null) as canonical JSON requires.
func (e *Error) Wire() map[string]any {
	m := map[string]any{
		"code":      string(e.Code),
		"message":   e.Message,
		"retryable": e.Retryable,
	}
	if len(e.Details) > 0 {
		m["details"] = e.Details
	}
	if e.RetryAfterMS > 0 {
		m["retry_after_ms"] = e.RetryAfterMS
	}
	return m
}

// FromWire rebuilds an Error from a decoded wire error object. Fields of the
// wrong type are ignored rather than trusted; a missing code becomes
// INTERNAL_ERROR so a caller always has something to branch on.
func FromWire(v any) *Error {
	m, _ := v.(map[string]any)
	code, _ := m["code"].(string)
	if code == "" {
		code = string(InternalError)
	}
	msg, _ := m["message"].(string)
	e := &Error{Code: Code(code), Message: msg}
	if r, ok := m["retryable"].(bool); ok {
		e.Retryable = r
	} else {
		e.Retryable = e.Code.Retryable()
	}
	if d, ok := m["details"].(map[string]any); ok {
		e.Details = d
	}
	if ms, ok := m["retry_after_ms"].(float64); ok && ms > 0 {
		e.RetryAfterMS = int64(ms)
	}
	return e
}
