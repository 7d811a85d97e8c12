package errs

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
)

// Every code the specification (§7) and the upstream notes (§3.7) name is in
// the one table, with the upstream retryable defaults.
func TestTableCoversSpec(t *testing.T) {
	spec := []Code{
		OfferingNotFound, NotFound, InvalidEnvelope, TaskNotCancelable, BudgetInsufficient,
		DeadlineUnmeetable, ContextTooLarge, ContentTypeNotSupported, BoardItemTaken, AgreementRequired,
		TransportTimeout, TransportNoResponders, TransportPermissionDenied, InvalidVersion, IdentityMismatch,
		InvalidManifest, InvalidQuery, TaskNotFound, TaskInvalidTransition, TaskExpired, AgentUnavailable,
		AgentOverloaded, SkillNotFound, InputInvalid, Unauthorized, BudgetExhausted, DeadlineExceeded,
		InternalError, DependencyFailed, RateLimited, InputNotUnderstood, SealingRequired, InsufficientFunds,
		StreamClosed, QuotaExceeded, PayloadTooLarge, ArtifactGone, NotNamed, RequestQueued,
	}
	retryable := map[Code]bool{TransportTimeout: true, AgentUnavailable: true, AgentOverloaded: true,
		InternalError: true, DependencyFailed: true, RateLimited: true}
	for _, c := range spec {
		s, ok := Lookup(c)
		if !ok {
			t.Errorf("%s is missing from the table", c)
			continue
		}
		if s.Status < 200 || s.Status > 599 {
			t.Errorf("%s has HTTP status %d", c, s.Status)
		}
		if s.Retryable != retryable[c] {
			t.Errorf("%s retryable = %v, upstream default is %v", c, s.Retryable, retryable[c])
		}
	}
	if len(Codes()) < len(spec) {
		t.Errorf("table has %d codes", len(Codes()))
	}
	if Code("NO_SUCH").HTTPStatus() != 500 || Code("NO_SUCH").Retryable() {
		t.Error("an unknown code must be a non-retryable 500")
	}
}

func TestHTTPRendering(t *testing.T) {
	for _, c := range []struct {
		err    error
		status int
		code   Code
		msg    string
	}{
		{New(ContextTooLarge, "too big").WithDetail("limit", 5), 413, ContextTooLarge, "too big"},
		{New(RateLimited, "slow down").WithRetryAfter(1500), 429, RateLimited, "slow down"},
		{New(IdentityMismatch, "stale timestamp").WithStatus(401), 401, IdentityMismatch, "stale timestamp"},
		{fmt.Errorf("wrapped: %w", New(NotFound, "no agent")), 404, NotFound, "no agent"},
		{errors.New("disk on fire at /var/x"), 500, InternalError, "internal error"},
	} {
		rec := httptest.NewRecorder()
		WriteHTTP(rec, nil, c.err)
		var body HTTPBody
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatal(err)
		}
		if rec.Code != c.status || body.Code != c.code || body.Error != c.msg || body.OK {
			t.Errorf("%v: %d %+v", c.err, rec.Code, body)
		}
		if rec.Header().Get("Content-Type") != "application/json" {
			t.Error("content type")
		}
		if c.code == RateLimited && (rec.Header().Get("Retry-After") != "2" || body.RetryAfterMS != 1500 || !body.Retryable) {
			t.Errorf("429: Retry-After %q, body %+v", rec.Header().Get("Retry-After"), body)
		}
	}
	// Internal detail never reaches the caller.
	rec := httptest.NewRecorder()
	WriteHTTP(rec, nil, errors.New("secret path /etc/x"))
	if got := rec.Body.String(); strings.Contains(got, "secret") {
		t.Errorf("internal error leaked: %s", got)
	}
}

func TestBusRendering(t *testing.T) {
	e := New(BudgetInsufficient, "price").WithDetail("estimate", map[string]any{"amount_micro": 5, "currency": "USD"})
	p := e.BusPayload()
	if p["status"] != StatusFailed {
		t.Errorf("status %v", p["status"])
	}
	if New(BudgetExhausted, "pause").BusPayload()["status"] != StatusInputRequired {
		t.Error("BUDGET_EXHAUSTED rides input_required")
	}
	// Round trip through JSON as a receiver sees it.
	b, _ := json.Marshal(e.Wire())
	var v any
	_ = json.Unmarshal(b, &v)
	back := FromWire(v)
	if back.Code != e.Code || back.Message != e.Message || back.Retryable || back.Details["estimate"] == nil {
		t.Errorf("round trip: %+v", back)
	}
	if _, has := e.Wire()["retry_after_ms"]; has {
		t.Error("absent members must be omitted, not zero")
	}
	if FromWire("garbage").Code != InternalError {
		t.Error("a malformed error object must still have a code")
	}
	if !errors.Is(fmt.Errorf("x: %w", e), New(BudgetInsufficient, "")) || CodeOf(e) != BudgetInsufficient || CodeOf(errors.New("x")) != "" {
		t.Error("errors.Is / CodeOf")
	}
}

// badID stands for a dependency's refusal of the caller's input (the
// store's *IDError).
type badID struct{}

func (badID) Error() string      { return "store: invalid argument: document id contains '/'" }
func (badID) InputError() string { return "an id in this request cannot exist: it contains '/'" }

// A dependency's refusal of the caller's input is a 400 INVALID_REQUEST,
// never a retryable 503 or a 500, however the service wrapped it; anything
// else from a dependency stays an outage.
func TestInputErrorIsBadInput(t *testing.T) {
	in := fmt.Errorf("get apps: %w", badID{})
	for name, err := range map[string]error{
		"bare":          in,
		"OrUnavailable": OrUnavailable(in, "the store is unavailable; retry shortly"),
		"Wrap 503":      Wrap(Unavailable, "the store is unavailable; retry shortly", in),
		"Wrap 500":      fmt.Errorf("x: %w", Wrap(InternalError, "internal error", in)),
		"FromInput":     FromInput(in),
	} {
		e := As(err)
		if e.Code != InvalidRequest || e.HTTPStatus() != 400 || e.Retryable || e.Message != (badID{}).InputError() {
			t.Errorf("%s: %+v", name, e)
		}
		if !errors.Is(e, badID{}) && !errors.As(e, new(badID)) {
			t.Errorf("%s: the cause is lost", name)
		}
	}
	if FromInput(errors.New("disk full")) != nil {
		t.Error("a plain error is not the caller's input")
	}
	if e := As(OrUnavailable(errors.New("disk full"), "down")); e.Code != Unavailable || !e.Retryable {
		t.Errorf("outage: %+v", e)
	}
	// A protocol refusal that is not an outage is kept as it is.
	if e := As(fmt.Errorf("x: %w", Wrap(NotFound, "no app", in))); e.Code != NotFound {
		t.Errorf("4xx wrapper: %+v", e)
	}
}
