// Package errs holds the protocol's error codes in one table, the one error
// type every layer passes around, and its two renderings: HTTP and the bus.
//
// Errors travel as {code, message, details?, retryable, retry_after_ms?}
// (spec §7, upstream-notes §3.7). A code's retryable default and HTTP status
// come from the table, so a handler only names the code.
package errs

import (
	"errors"
	"fmt"
	"net/http"
)

// Code is a protocol error code such as "INVALID_ENVELOPE".
type Code string

// Every code the service speaks. Spec §7 codes first, then the upstream
// codes of upstream-notes §3.7 that the mesh answers with or must recognise.
const (
	// Transport.
	TransportTimeout          Code = "TRANSPORT_TIMEOUT"
	TransportNoResponders     Code = "TRANSPORT_NO_RESPONDERS"
	TransportPermissionDenied Code = "TRANSPORT_PERMISSION_DENIED"

	// Protocol.
	InvalidEnvelope  Code = "INVALID_ENVELOPE"
	InvalidVersion   Code = "INVALID_VERSION"
	IdentityMismatch Code = "IDENTITY_MISMATCH"
	InvalidManifest  Code = "INVALID_MANIFEST"
	InvalidQuery     Code = "INVALID_QUERY"

	// Tasks.
	TaskNotFound          Code = "TASK_NOT_FOUND"
	TaskInvalidTransition Code = "TASK_INVALID_TRANSITION"
	TaskNotCancelable     Code = "TASK_NOT_CANCELABLE"
	TaskExpired           Code = "TASK_EXPIRED"

	// Agents.
	AgentUnavailable        Code = "AGENT_UNAVAILABLE"
	AgentOverloaded         Code = "AGENT_OVERLOADED"
	SkillNotFound           Code = "SKILL_NOT_FOUND"
	OfferingNotFound        Code = "OFFERING_NOT_FOUND"
	InputInvalid            Code = "INPUT_INVALID"
	InputNotUnderstood      Code = "INPUT_NOT_UNDERSTOOD"
	ContentTypeNotSupported Code = "CONTENT_TYPE_NOT_SUPPORTED"
	Unauthorized            Code = "UNAUTHORIZED"
	Forbidden               Code = "FORBIDDEN"
	SealingRequired         Code = "SEALING_REQUIRED"
	NotNamed                Code = "NOT_NAMED"

	// Budget and money.
	BudgetInsufficient Code = "BUDGET_INSUFFICIENT"
	DeadlineUnmeetable Code = "DEADLINE_UNMEETABLE"
	BudgetExhausted    Code = "BUDGET_EXHAUSTED"
	DeadlineExceeded   Code = "DEADLINE_EXCEEDED"
	AgreementRequired  Code = "AGREEMENT_REQUIRED"
	InsufficientFunds  Code = "INSUFFICIENT_FUNDS"

	// Processing.
	InternalError    Code = "INTERNAL_ERROR"
	DependencyFailed Code = "DEPENDENCY_FAILED"
	ContextTooLarge  Code = "CONTEXT_TOO_LARGE"
	RateLimited      Code = "RATE_LIMITED"
	NotFound         Code = "NOT_FOUND"
	Conflict         Code = "CONFLICT"
	QuotaExceeded    Code = "QUOTA_EXCEEDED"
	PayloadTooLarge  Code = "PAYLOAD_TOO_LARGE"
	StreamClosed     Code = "STREAM_CLOSED"
	ArtifactGone     Code = "ARTIFACT_GONE"
	BoardItemTaken   Code = "BOARD_ITEM_TAKEN"
	NotImplemented   Code = "NOT_IMPLEMENTED"
	Unavailable      Code = "UNAVAILABLE"
	InvalidRequest   Code = "INVALID_REQUEST"

	// Registrar.
	// OperatorRequired: a handle's first claim for an address must name
	// the operator (spec §2.1); the adapter asks for it and claims again.
	OperatorRequired Code = "OPERATOR_REQUIRED"

	// Local-only codes an SDK surfaces to its caller; never sent on the wire.
	RequestQueued Code = "REQUEST_QUEUED"
)

// Spec describes one code: whether a caller may retry by default, and the
// HTTP status it maps to when a control-plane route answers with it.
type Spec struct {
	Retryable bool
	Status    int
}

// table is the single source of truth for every code. Retryable defaults
// follow upstream-notes §3.7: the six transient codes retry, all others do
// not.
var table = map[Code]Spec{
	TransportTimeout:          {true, http.StatusGatewayTimeout},
	TransportNoResponders:     {false, http.StatusServiceUnavailable},
	TransportPermissionDenied: {false, http.StatusForbidden},

	InvalidEnvelope:  {false, http.StatusBadRequest},
	InvalidVersion:   {false, http.StatusBadRequest},
	IdentityMismatch: {false, http.StatusUnauthorized},
	InvalidManifest:  {false, http.StatusBadRequest},
	InvalidQuery:     {false, http.StatusBadRequest},

	TaskNotFound:          {false, http.StatusNotFound},
	TaskInvalidTransition: {false, http.StatusConflict},
	TaskNotCancelable:     {false, http.StatusConflict},
	TaskExpired:           {false, http.StatusGone},

	AgentUnavailable:        {true, http.StatusServiceUnavailable},
	AgentOverloaded:         {true, http.StatusServiceUnavailable},
	SkillNotFound:           {false, http.StatusNotFound},
	OfferingNotFound:        {false, http.StatusNotFound},
	InputInvalid:            {false, http.StatusBadRequest},
	InputNotUnderstood:      {false, http.StatusBadRequest},
	ContentTypeNotSupported: {false, http.StatusUnsupportedMediaType},
	Unauthorized:            {false, http.StatusUnauthorized},
	Forbidden:               {false, http.StatusForbidden},
	SealingRequired:         {false, http.StatusBadRequest},
	NotNamed:                {false, http.StatusForbidden},

	BudgetInsufficient: {false, http.StatusPaymentRequired},
	DeadlineUnmeetable: {false, http.StatusUnprocessableEntity},
	BudgetExhausted:    {false, http.StatusPaymentRequired},
	DeadlineExceeded:   {false, http.StatusUnprocessableEntity},
	AgreementRequired:  {false, http.StatusPaymentRequired},
	InsufficientFunds:  {false, http.StatusPaymentRequired},

	InternalError:    {true, http.StatusInternalServerError},
	DependencyFailed: {true, http.StatusBadGateway},
	ContextTooLarge:  {false, http.StatusRequestEntityTooLarge},
	RateLimited:      {true, http.StatusTooManyRequests},
	NotFound:         {false, http.StatusNotFound},
	Conflict:         {false, http.StatusConflict},
	QuotaExceeded:    {false, http.StatusForbidden},
	PayloadTooLarge:  {false, http.StatusRequestEntityTooLarge},
	StreamClosed:     {false, http.StatusGone},
	ArtifactGone:     {false, http.StatusGone},
	BoardItemTaken:   {false, http.StatusConflict},
	NotImplemented:   {false, http.StatusNotImplemented},
	Unavailable:      {true, http.StatusServiceUnavailable},
	InvalidRequest:   {false, http.StatusBadRequest},

	OperatorRequired: {false, http.StatusBadRequest},

	RequestQueued: {false, http.StatusAccepted},
}

// Lookup returns the table entry for a code and whether the code is known.
func Lookup(c Code) (Spec, bool) {
	s, ok := table[c]
	return s, ok
}

// Codes lists every known code (for tests and documentation).
func Codes() []Code {
	out := make([]Code, 0, len(table))
	for c := range table {
		out = append(out, c)
	}
	return out
}

// Retryable reports a code's default. Unknown codes are not retryable:
// retrying something we do not understand is how storms start.
func (c Code) Retryable() bool { return table[c].Retryable }

// HTTPStatus is the status a control-plane route answers with for c.
// Unknown codes map to 500 because they mean our own table is incomplete.
func (c Code) HTTPStatus() int {
	if s, ok := table[c]; ok {
		return s.Status
	}
	return http.StatusInternalServerError
}

// Error is the one error type of the protocol. Its JSON form is the wire
// error object.
type Error struct {
	Code         Code           `json:"code"`
	Message      string         `json:"message"`
	Details      map[string]any `json:"details,omitempty"`
	Retryable    bool           `json:"retryable"`
	RetryAfterMS int64          `json:"retry_after_ms,omitempty"`
	// Status overrides the table's HTTP status where the spec pins a
	// different one for a specific refusal (for example a 401 stale
	// timestamp on the node-credential door). Never serialised.
	Status int `json:"-"`
	// cause is the underlying error, kept for logs and errors.Is; it is
	// never rendered to a caller.
	cause error
}

// New builds an error with the table's retryable default.
func New(c Code, msg string) *Error {
	return &Error{Code: c, Message: msg, Retryable: c.Retryable()}
}

// Newf is New with a formatted message.
func Newf(c Code, format string, args ...any) *Error {
	return New(c, fmt.Sprintf(format, args...))
}

// Wrap builds an error that keeps cause for logs and errors.Is, while the
// rendered message stays msg (a cause may hold internal detail).
func Wrap(c Code, msg string, cause error) *Error {
	e := New(c, msg)
	e.cause = cause
	return e
}

// WithDetails returns e with details set (e is modified and returned so
// construction reads as one expression).
func (e *Error) WithDetails(d map[string]any) *Error {
	e.Details = d
	return e
}

// WithDetail adds one detail.
func (e *Error) WithDetail(k string, v any) *Error {
	if e.Details == nil {
		e.Details = map[string]any{}
	}
	e.Details[k] = v
	return e
}

// WithStatus overrides the HTTP status for this one refusal.
func (e *Error) WithStatus(s int) *Error {
	e.Status = s
	return e
}

// WithRetryAfter marks the error retryable after d milliseconds.
func (e *Error) WithRetryAfter(ms int64) *Error {
	e.RetryAfterMS = ms
	e.Retryable = true
	return e
}

func (e *Error) Error() string {
	if e.cause != nil {
		return fmt.Sprintf("%s: %s: %v", e.Code, e.Message, e.cause)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

// Unwrap exposes the cause to errors.Is / errors.As.
func (e *Error) Unwrap() error { return e.cause }

// HTTPStatus is the status this error is rendered with.
func (e *Error) HTTPStatus() int {
	if e.Status != 0 {
		return e.Status
	}
	return e.Code.HTTPStatus()
}

// Is makes errors.Is(err, errs.New(code, "")) match on code alone.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// As extracts an *Error from err. A dependency's refusal of the caller's
// input (InputError) becomes INVALID_REQUEST; any other non-protocol error
// becomes INTERNAL_ERROR with a generic message: internal text never
// reaches a caller.
func As(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		if e.HTTPStatus() >= 500 {
			// However a service wrapped it, a dependency that refused the
			// caller's input is not an outage: the caller must change the
			// request, not retry it.
			if in := FromInput(err); in != nil {
				return in
			}
		}
		return e
	}
	if e := FromInput(err); e != nil {
		return e
	}
	return Wrap(InternalError, "internal error", err)
}

// InputError is implemented by a dependency's error that the caller's
// input caused rather than the dependency's health: an id no store can
// hold (store.IDError) is one. InputError is the refusal in words the
// caller can act on.
type InputError interface {
	error
	InputError() string
}

// FromInput returns the INVALID_REQUEST for an InputError in err's chain
// (keeping err as the cause), or nil when there is none.
func FromInput(err error) *Error {
	var ie InputError
	if !errors.As(err, &ie) {
		return nil
	}
	return Wrap(InvalidRequest, ie.InputError(), err)
}

// CodeOf returns err's protocol code, or "" when err carries none.
func CodeOf(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// OrUnavailable is how a service reports a failed dependency (its store, a
// cloud API): a protocol error passes through as is, the dependency's
// refusal of the caller's input (InputError) is INVALID_REQUEST, and
// anything else becomes a retryable UNAVAILABLE with msg, keeping the
// cause for the log.
func OrUnavailable(err error, msg string) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	if e := FromInput(err); e != nil {
		return e
	}
	return Wrap(Unavailable, msg, err)
}
