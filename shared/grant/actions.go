package grant

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/store"
)

// Action is one line of the actions log: one call the service made in a
// customer's project (spec §4.7), whatever its outcome. The project and
// the service account are those of the grant the call was made for.
type Action struct {
	ID             string `json:"id"` // UUIDv7
	AccountID      string `json:"account_id"`
	Provider       string `json:"provider"`
	ProjectID      string `json:"project_id"`
	ServiceAccount string `json:"service_account"`
	At             int64  `json:"at"` // Unix ms, when the call began
	// Call is the API method ("iamcredentials.GenerateAccessToken",
	// "resourcemanager.GetProject", "secretmanager.CreateSecret",
	// "secretmanager.AddSecretVersion", "run.UpdateWorkerPool").
	Call string `json:"call"`
	// Resource is the name the call was about.
	Resource   string `json:"resource"`
	DurationMS int64  `json:"duration_ms"`
	// Outcome is "ok", or the gRPC code's name (PERMISSION_DENIED, ...).
	Outcome string `json:"outcome"`
	// Error is Google's message when the call failed (never a token or a
	// secret: neither is ever part of a request's resource or an answer's
	// message).
	Error string `json:"error,omitempty"`
	// Trigger is what made the call: create, verify, recheck or deploy.
	Trigger string `json:"trigger"`
}

// ActionView is a line as the route answers it.
type ActionView struct {
	At             string `json:"at"`
	Provider       string `json:"provider"`
	ProjectID      string `json:"project_id"`
	ServiceAccount string `json:"service_account"`
	Call           string `json:"call"`
	Resource       string `json:"resource"`
	DurationMS     int64  `json:"duration_ms"`
	Outcome        string `json:"outcome"`
	Error          string `json:"error,omitempty"`
	Trigger        string `json:"trigger"`
}

// Limits of the actions list.
const (
	DefaultActionsLimit = 100
	MaxActionsLimit     = 500
)

// Actions lists the account's actions log, newest first: of every
// provider, or of one. limit 0 is DefaultActionsLimit; more than
// MaxActionsLimit is refused.
func (s *Service) Actions(ctx context.Context, accountID, provider string, limit int) ([]ActionView, error) {
	switch {
	case limit < 0 || limit > MaxActionsLimit:
		return nil, errs.Newf(errs.InvalidRequest, "limit must be from 1 to %d", MaxActionsLimit)
	case limit == 0:
		limit = DefaultActionsLimit
	}
	q := store.Query{Where: []store.Eq{{Field: "account_id", Value: accountID}}, OrderBy: "at", Desc: true, Limit: limit}
	if provider != "" {
		if err := CheckProvider(provider); err != nil {
			return nil, err
		}
		q.Where = append(q.Where, store.Eq{Field: "provider", Value: provider})
	}
	var as []Action
	if err := store.List(ctx, s.st, CollActions, q, &as); err != nil {
		return nil, txErr(err)
	}
	out := make([]ActionView, 0, len(as))
	for _, a := range as {
		out = append(out, ActionView{At: protocol.FormatTime(time.UnixMilli(a.At)), Provider: a.Provider, ProjectID: a.ProjectID,
			ServiceAccount: a.ServiceAccount, Call: a.Call, Resource: a.Resource, DurationMS: a.DurationMS, Outcome: a.Outcome,
			Error: a.Error, Trigger: a.Trigger})
	}
	return out, nil
}

// call makes one call in a customer's project under its own deadline and
// writes its line of the actions log. The line is written whatever the
// outcome; if the store cannot take it, that is logged (the call was made
// and cannot be unmade by failing now).
func (s *Service) call(ctx context.Context, g Grant, trigger, method, resource string, fn func(ctx context.Context) error) error {
	at := s.now()
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, s.timeout)
	err := fn(cctx)
	cancel()
	a := Action{ID: protocol.NewID(), AccountID: g.AccountID, Provider: g.Provider, ProjectID: g.ProjectID, ServiceAccount: g.ServiceAccount,
		At: at.UnixMilli(), Call: method, Resource: resource, DurationMS: time.Since(start).Milliseconds(), Outcome: "ok", Trigger: trigger}
	if err != nil {
		c, msg := codeOf(err)
		a.Outcome, a.Error = codeName(c), clip(msg, 300)
		if writes[method] && uncertainCode(c) {
			a.Error += " (outcome uncertain: the write may have happened; a deploy keeps its agent key)"
		}
	}
	// The line is written even when the caller's context is done: the call
	// was made.
	wctx, wcancel := context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
	defer wcancel()
	if werr := s.st.RunTx(wctx, func(tx store.Tx) error { return tx.Create(CollActions, a.ID, a) }); werr != nil {
		s.log.Error("a call in a customer's project is missing from the actions log", "account", g.AccountID, "call", method,
			"resource", resource, "outcome", a.Outcome, "err", werr)
	}
	return err
}

// writes are the calls whose failure may hide a write that happened, said
// so in their line.
var writes = map[string]bool{"run.UpdateWorkerPool": true}

// codeName is a gRPC code as Google's JSON errors spell it
// (PERMISSION_DENIED).
func codeName(c codes.Code) string {
	if n, ok := codeNames[c]; ok {
		return n
	}
	return "UNKNOWN"
}

var codeNames = map[codes.Code]string{
	codes.OK: "OK", codes.Canceled: "CANCELLED", codes.Unknown: "UNKNOWN", codes.InvalidArgument: "INVALID_ARGUMENT",
	codes.DeadlineExceeded: "DEADLINE_EXCEEDED", codes.NotFound: "NOT_FOUND", codes.AlreadyExists: "ALREADY_EXISTS",
	codes.PermissionDenied: "PERMISSION_DENIED", codes.ResourceExhausted: "RESOURCE_EXHAUSTED",
	codes.FailedPrecondition: "FAILED_PRECONDITION", codes.Aborted: "ABORTED", codes.OutOfRange: "OUT_OF_RANGE",
	codes.Unimplemented: "UNIMPLEMENTED", codes.Internal: "INTERNAL", codes.Unavailable: "UNAVAILABLE",
	codes.DataLoss: "DATA_LOSS", codes.Unauthenticated: "UNAUTHENTICATED",
}
