package protocol

import (
	"slices"

	"agentmesh.dev/mesh/shared/errs"
)

// Cancel (upstream-notes §3.5) travels twice: as a request to the
// performer's inbox, {offering:"task.cancel", input:{task_id, reason,
// note?}}, and as the canceled task update on mesh.task.{id}.update,
// {status:"canceled", reason, note?}. The reason is a closed enum of exact,
// case-sensitive bytes; the note is optional free text, omitted (never null)
// when absent.

// OfferingTaskCancel is the reserved offering (formerly skill) a cancel
// request names.
const OfferingTaskCancel = "task.cancel"

// The cancel reasons.
const (
	CancelUserRequested     = "user_requested"
	CancelSuperseded        = "superseded"
	CancelDeadlineExceeded  = "deadline_exceeded"
	CancelBudgetExhausted   = "budget_exhausted"
	CancelUpstreamCancelled = "upstream_cancelled"
	CancelPolicy            = "policy"
)

// CancelReasons lists the six reasons in specification order. It is for
// display and documentation; validation does not consult it, so changing it
// cannot widen what is accepted.
var CancelReasons = []string{
	CancelUserRequested, CancelSuperseded, CancelDeadlineExceeded,
	CancelBudgetExhausted, CancelUpstreamCancelled, CancelPolicy,
}

// IsCancelReason reports whether s is exactly one of the six reasons.
func IsCancelReason(s string) bool {
	switch s {
	case CancelUserRequested, CancelSuperseded, CancelDeadlineExceeded,
		CancelBudgetExhausted, CancelUpstreamCancelled, CancelPolicy:
		return true
	}
	return false
}

// CancelInput is the input of a task.cancel request.
type CancelInput struct {
	TaskID string `json:"task_id"`
	Reason string `json:"reason"`
	Note   string `json:"note,omitempty"`
}

func cancelErr(msg string) *errs.Error {
	return errs.New(errs.InvalidEnvelope, "cancel: "+msg)
}

// ParseCancelInput validates the decoded input of a task.cancel request. A
// missing or empty task_id, a reason that is missing, null, not a string or
// not exactly one of the six (no case folding), and a note that is present
// but not a string (null included) are refused as INVALID_ENVELOPE, before
// any task state is touched. Members it does not know are ignored: newer
// senders may add optional context.
func ParseCancelInput(v any) (CancelInput, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return CancelInput{}, cancelErr("input must be an object {task_id, reason, note?}")
	}
	var in CancelInput
	if in.TaskID, ok = m["task_id"].(string); !ok || in.TaskID == "" {
		return CancelInput{}, cancelErr("task_id is required, as a non-empty string")
	}
	rv, present := m["reason"]
	if !present || rv == nil {
		return CancelInput{}, cancelErr("reason is required (one of user_requested, superseded, deadline_exceeded, budget_exhausted, upstream_cancelled, policy)")
	}
	if in.Reason, ok = rv.(string); !ok || !IsCancelReason(in.Reason) {
		return CancelInput{}, cancelErr("reason " + describeValue(rv) + " is not one of user_requested, superseded, deadline_exceeded, budget_exhausted, upstream_cancelled, policy")
	}
	if nv, present := m["note"]; present {
		if in.Note, ok = nv.(string); !ok {
			return CancelInput{}, cancelErr("note must be a string when present")
		}
	}
	return in, nil
}

// Validate checks a CancelInput built in Go before it is sent, by the rules
// ParseCancelInput applies on receipt.
func (in CancelInput) Validate() error {
	_, err := ParseCancelInput(in.value())
	return err
}

// value is the input as a generic object, note omitted when empty.
func (in CancelInput) value() map[string]any {
	m := map[string]any{"task_id": in.TaskID, "reason": in.Reason}
	if in.Note != "" {
		m["note"] = in.Note
	}
	return m
}

// CancelRequestPayload is the payload of the task.cancel request in the
// current protocol: {"offering":"task.cancel","input":{...}}.
func CancelRequestPayload(in CancelInput) map[string]any {
	return map[string]any{"offering": OfferingTaskCancel, "input": in.value()}
}

// CancelRequestPayloadSkill is the same payload under the older member name
// "skill", as the 0.2 fixtures and older peers spell it.
func CancelRequestPayloadSkill(in CancelInput) map[string]any {
	return map[string]any{"skill": OfferingTaskCancel, "input": in.value()}
}

// OfferingOf names the offering a request payload asks for: "offering"
// when it is a non-empty string, else "skill" (the pre-rename spelling,
// still read), else "".
func OfferingOf(payload map[string]any) string {
	if s, ok := payload["offering"].(string); ok && s != "" {
		return s
	}
	if s, ok := payload["skill"].(string); ok {
		return s
	}
	return ""
}

// CanceledUpdatePayload is the payload of the canceled task update:
// {"status":"canceled","reason":...,"note"?}.
func CanceledUpdatePayload(reason, note string) map[string]any {
	m := map[string]any{"status": StateCanceled, "reason": reason}
	if note != "" {
		m["note"] = note
	}
	return m
}

// PropagatedCancel is the cancel an agent forwards to each still-live
// delegate when its own task is canceled: reason upstream_cancelled, note
// the original reason, or "<reason>: <note>" when the original had a note.
// Chains nest ("upstream_cancelled: user_requested"). TaskID is left empty:
// each delegate's task has its own id, which the caller sets.
func PropagatedCancel(orig CancelInput) CancelInput {
	note := orig.Reason
	if orig.Note != "" {
		note += ": " + orig.Note
	}
	return CancelInput{Reason: CancelUpstreamCancelled, Note: note}
}

// Task states (upstream-notes §3.4). "accepted" is not one of them.
const (
	StateSubmitted     = "submitted"
	StateWorking       = "working"
	StateInputRequired = "input_required"
	StateAuthRequired  = "auth_required"
	StateCompleted     = "completed"
	StateFailed        = "failed"
	StateCanceled      = "canceled"
	StateRejected      = "rejected"
	// StateExhausted is the newer terminal state for work stopped by its
	// budget; it is reachable from every non-terminal state and is not a
	// failure.
	StateExhausted = "exhausted"
)

// transitions is the legal-transition table; "" is a task not yet created.
// Exhausted is added in LegalTransition, since it is reachable from every
// non-terminal state.
var transitions = map[string][]string{
	"":                 {StateSubmitted},
	StateSubmitted:     {StateWorking, StateCanceled, StateRejected},
	StateWorking:       {StateCompleted, StateFailed, StateInputRequired, StateAuthRequired, StateCanceled},
	StateInputRequired: {StateWorking, StateCanceled},
	StateAuthRequired:  {StateWorking, StateCanceled},
}

// Terminal reports whether state is final: completed, failed, canceled,
// rejected or exhausted.
func Terminal(state string) bool {
	switch state {
	case StateCompleted, StateFailed, StateCanceled, StateRejected, StateExhausted:
		return true
	}
	return false
}

// IsFailure reports whether a task that ended in state failed. Only failed
// does: exhausted (its budget or cap ran out), canceled and rejected are
// ends, not failures, and a runtime must not record them as failed.
func IsFailure(state string) bool { return state == StateFailed }

// Cancelable reports whether a task in state may be canceled: submitted,
// working, input_required or auth_required. The paused states are
// cancelable on purpose, so a requester can stop at a budget pause and keep
// the partial artifacts.
func Cancelable(state string) bool {
	switch state {
	case StateSubmitted, StateWorking, StateInputRequired, StateAuthRequired:
		return true
	}
	return false
}

// LegalTransition reports whether a task may move from one state to
// another; from "" means a new task, which may only be submitted. Terminal
// states go nowhere, and a state does not transition to itself.
func LegalTransition(from, to string) bool {
	if to == StateExhausted {
		return from != "" && Cancelable(from)
	}
	return slices.Contains(transitions[from], to)
}

// CheckTransition is LegalTransition as a refusal: TASK_INVALID_TRANSITION.
func CheckTransition(from, to string) error {
	if LegalTransition(from, to) {
		return nil
	}
	if from == "" {
		return errs.Newf(errs.TaskInvalidTransition, "a new task starts as submitted, not %q", to)
	}
	return errs.Newf(errs.TaskInvalidTransition, "task cannot move from %s to %q", from, to)
}

// CancelTask checks that a task in state may be canceled: nil for the four
// cancelable states, TASK_NOT_CANCELABLE for a terminal one, and
// TASK_INVALID_TRANSITION for a state this version does not know (which is
// neither provably live nor provably finished).
func CancelTask(state string) error {
	switch {
	case Cancelable(state):
		return nil
	case Terminal(state):
		return errs.Newf(errs.TaskNotCancelable, "task is already %s", state)
	}
	return errs.Newf(errs.TaskInvalidTransition, "task state %q is not a known state", state)
}
