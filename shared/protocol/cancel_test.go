package protocol

import (
	"reflect"
	"slices"
	"testing"

	"agentmesh.dev/mesh/shared/errs"
)

const cancelTaskID = "0198c001-0000-7000-8000-00000000cafe"

func TestParseCancelInput(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   any
		want CancelInput
		err  string // "" = valid
	}{
		{"reason and note", map[string]any{"task_id": cancelTaskID, "reason": "user_requested", "note": "operator clicked stop"},
			CancelInput{cancelTaskID, CancelUserRequested, "operator clicked stop"}, ""},
		{"reason only", map[string]any{"task_id": cancelTaskID, "reason": "superseded"},
			CancelInput{TaskID: cancelTaskID, Reason: CancelSuperseded}, ""},
		{"empty note", map[string]any{"task_id": cancelTaskID, "reason": "policy", "note": ""},
			CancelInput{TaskID: cancelTaskID, Reason: CancelPolicy}, ""},
		{"unknown members ignored", map[string]any{"task_id": cancelTaskID, "reason": "policy", "unmet_need": "credential:X"},
			CancelInput{TaskID: cancelTaskID, Reason: CancelPolicy}, ""},

		{"unknown reason", map[string]any{"task_id": cancelTaskID, "reason": "bored"}, CancelInput{}, `reason "bored" is not one of`},
		{"missing reason", map[string]any{"task_id": cancelTaskID}, CancelInput{}, "reason is required"},
		{"null reason", map[string]any{"task_id": cancelTaskID, "reason": nil}, CancelInput{}, "reason is required"},
		{"wrong-case reason", map[string]any{"task_id": cancelTaskID, "reason": "User_Requested"}, CancelInput{}, "is not one of"},
		{"numeric reason", map[string]any{"task_id": cancelTaskID, "reason": 1.0}, CancelInput{}, "reason 1 is not one of"},
		{"padded reason", map[string]any{"task_id": cancelTaskID, "reason": " policy"}, CancelInput{}, "is not one of"},
		{"non-string note", map[string]any{"task_id": cancelTaskID, "reason": "policy", "note": 42.0}, CancelInput{}, "note must be a string"},
		{"null note", map[string]any{"task_id": cancelTaskID, "reason": "policy", "note": nil}, CancelInput{}, "note must be a string"},
		{"missing task_id", map[string]any{"reason": "policy"}, CancelInput{}, "task_id is required"},
		{"empty task_id", map[string]any{"task_id": "", "reason": "policy"}, CancelInput{}, "task_id is required"},
		{"numeric task_id", map[string]any{"task_id": 7.0, "reason": "policy"}, CancelInput{}, "task_id is required"},
		{"not an object", []any{cancelTaskID, "policy"}, CancelInput{}, "input must be an object"},
		{"null input", nil, CancelInput{}, "input must be an object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseCancelInput(tc.in)
			if tc.err != "" {
				requireCode(t, err, errs.InvalidEnvelope, tc.err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			if err := got.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
		})
	}
	if err := (CancelInput{TaskID: "t"}).Validate(); errs.CodeOf(err) != errs.InvalidEnvelope {
		t.Fatalf("Validate of a reasonless cancel: %v", err)
	}
}

func TestCancelReasonsClosed(t *testing.T) {
	want := []string{"user_requested", "superseded", "deadline_exceeded", "budget_exhausted", "upstream_cancelled", "policy"}
	if !slices.Equal(CancelReasons, want) {
		t.Fatalf("CancelReasons = %v", CancelReasons)
	}
	for _, r := range want {
		if !IsCancelReason(r) {
			t.Errorf("%s refused", r)
		}
	}
	for _, r := range []string{"", "bored", "POLICY", "needs_not_furnished", "canceled"} {
		if IsCancelReason(r) {
			t.Errorf("%q accepted", r)
		}
	}
}

func TestCancelPayloadBytes(t *testing.T) {
	withNote := CancelInput{TaskID: cancelTaskID, Reason: CancelUserRequested, Note: "operator clicked stop"}
	noNote := CancelInput{TaskID: cancelTaskID, Reason: CancelSuperseded}
	for _, tc := range []struct {
		name    string
		payload map[string]any
		want    string
	}{
		{"skill with note", CancelRequestPayloadSkill(withNote),
			`{"input":{"note":"operator clicked stop","reason":"user_requested","task_id":"` + cancelTaskID + `"},"skill":"task.cancel"}`},
		{"skill without note", CancelRequestPayloadSkill(noNote),
			`{"input":{"reason":"superseded","task_id":"` + cancelTaskID + `"},"skill":"task.cancel"}`},
		{"offering", CancelRequestPayload(noNote),
			`{"input":{"reason":"superseded","task_id":"` + cancelTaskID + `"},"offering":"task.cancel"}`},
		{"update with note", CanceledUpdatePayload(CancelBudgetExhausted, "not worth raising the ceiling"),
			`{"note":"not worth raising the ceiling","reason":"budget_exhausted","status":"canceled"}`},
		{"update without note", CanceledUpdatePayload(CancelDeadlineExceeded, ""),
			`{"reason":"deadline_exceeded","status":"canceled"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Canonical(tc.payload)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Fatalf("got  %s\nwant %s", got, tc.want)
			}
			if OfferingOf(tc.payload) != OfferingTaskCancel && tc.payload["status"] == nil {
				t.Fatalf("offering %q", OfferingOf(tc.payload))
			}
		})
	}
}

func TestOfferingOf(t *testing.T) {
	for _, tc := range []struct {
		payload map[string]any
		want    string
	}{
		{map[string]any{"offering": "task.cancel"}, "task.cancel"},
		{map[string]any{"skill": "task.cancel"}, "task.cancel"},
		{map[string]any{"offering": "chat", "skill": "task.cancel"}, "chat"},
		{map[string]any{"offering": "", "skill": "chat"}, "chat"},
		{map[string]any{"offering": 7.0, "skill": "chat"}, "chat"},
		{map[string]any{"skill": nil}, ""},
		{map[string]any{}, ""},
		{nil, ""},
	} {
		if got := OfferingOf(tc.payload); got != tc.want {
			t.Errorf("OfferingOf(%v) = %q, want %q", tc.payload, got, tc.want)
		}
	}
}

func TestPropagatedCancel(t *testing.T) {
	for _, tc := range []struct {
		orig CancelInput
		note string
	}{
		{CancelInput{TaskID: "a", Reason: CancelUserRequested}, "user_requested"},
		{CancelInput{TaskID: "a", Reason: CancelDeadlineExceeded, Note: "overdue since 16:00Z"}, "deadline_exceeded: overdue since 16:00Z"},
		{CancelInput{TaskID: "a", Reason: CancelUpstreamCancelled, Note: "user_requested"}, "upstream_cancelled: user_requested"},
	} {
		got := PropagatedCancel(tc.orig)
		if got != (CancelInput{Reason: CancelUpstreamCancelled, Note: tc.note}) {
			t.Errorf("PropagatedCancel(%+v) = %+v", tc.orig, got)
		}
	}
	// Two hops nest, and the reason stays upstream_cancelled at every hop.
	hop2 := PropagatedCancel(PropagatedCancel(CancelInput{Reason: CancelPolicy, Note: "tenancy"}))
	if hop2.Reason != CancelUpstreamCancelled || hop2.Note != "upstream_cancelled: policy: tenancy" {
		t.Fatalf("%+v", hop2)
	}
}

// A cancel request survives the whole wire path: payload, signature,
// decode, handler input, parse.
func TestCancelEnvelopeRoundTrip(t *testing.T) {
	k := newTestKey(t)
	in := CancelInput{TaskID: cancelTaskID, Reason: CancelSuperseded, Note: "re-planned; a broader query replaces this one"}
	for _, payload := range []map[string]any{CancelRequestPayload(in), CancelRequestPayloadSkill(in)} {
		e, err := New(TypeRequest, k.Public(), payload)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Sign(k); err != nil {
			t.Fatal(err)
		}
		wire, err := e.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		got, err := Decode(wire)
		if err != nil {
			t.Fatal(err)
		}
		v, _ := got.PayloadValue()
		if OfferingOf(v.(map[string]any)) != OfferingTaskCancel {
			t.Fatalf("offering lost: %s", got.Payload)
		}
		input, err := HandlerInput(got)
		if err != nil {
			t.Fatal(err)
		}
		back, err := ParseCancelInput(input)
		if err != nil || back != in {
			t.Fatalf("got %+v, %v", back, err)
		}
	}
}

var allStates = []string{StateSubmitted, StateWorking, StateInputRequired, StateAuthRequired,
	StateCompleted, StateFailed, StateCanceled, StateRejected, StateExhausted}

func TestTaskStates(t *testing.T) {
	for _, tc := range []struct {
		state      string
		terminal   bool
		cancelable bool
		cancelCode errs.Code
	}{
		{StateSubmitted, false, true, ""},
		{StateWorking, false, true, ""},
		{StateInputRequired, false, true, ""},
		{StateAuthRequired, false, true, ""},
		{StateCompleted, true, false, errs.TaskNotCancelable},
		{StateFailed, true, false, errs.TaskNotCancelable},
		{StateCanceled, true, false, errs.TaskNotCancelable},
		{StateRejected, true, false, errs.TaskNotCancelable},
		{StateExhausted, true, false, errs.TaskNotCancelable},
		{"accepted", false, false, errs.TaskInvalidTransition},
		{"", false, false, errs.TaskInvalidTransition},
		{"Working", false, false, errs.TaskInvalidTransition},
	} {
		t.Run(tc.state, func(t *testing.T) {
			if Terminal(tc.state) != tc.terminal || Cancelable(tc.state) != tc.cancelable {
				t.Fatalf("terminal %v cancelable %v", Terminal(tc.state), Cancelable(tc.state))
			}
			err := CancelTask(tc.state)
			if tc.cancelCode == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			requireCode(t, err, tc.cancelCode, "")
		})
	}
}

func TestLegalTransition(t *testing.T) {
	legal := map[string][]string{
		"":                 {StateSubmitted},
		StateSubmitted:     {StateWorking, StateCanceled, StateRejected, StateExhausted},
		StateWorking:       {StateCompleted, StateFailed, StateInputRequired, StateAuthRequired, StateCanceled, StateExhausted},
		StateInputRequired: {StateWorking, StateCanceled, StateExhausted},
		StateAuthRequired:  {StateWorking, StateCanceled, StateExhausted},
	}
	// The whole matrix, including every terminal and unknown state as from.
	froms := append([]string{"", "accepted"}, allStates...)
	tos := append([]string{"", "accepted"}, allStates...)
	for _, from := range froms {
		for _, to := range tos {
			want := slices.Contains(legal[from], to)
			if got := LegalTransition(from, to); got != want {
				t.Errorf("LegalTransition(%q, %q) = %v, want %v", from, to, got, want)
			}
			err := CheckTransition(from, to)
			if want != (err == nil) {
				t.Errorf("CheckTransition(%q, %q) = %v", from, to, err)
			}
			if err != nil && errs.CodeOf(err) != errs.TaskInvalidTransition {
				t.Errorf("CheckTransition(%q, %q) code %s", from, to, errs.CodeOf(err))
			}
		}
	}
	// Cancelable is exactly "may move to canceled".
	for _, s := range allStates {
		if Cancelable(s) != LegalTransition(s, StateCanceled) {
			t.Errorf("%s: Cancelable disagrees with the transition table", s)
		}
	}
}

// FuzzParseCancelInput: no input panics; refusals are INVALID_ENVELOPE; an
// accepted input survives the request payload and parses back unchanged.
func FuzzParseCancelInput(f *testing.F) {
	for _, s := range []string{
		`{"task_id":"` + cancelTaskID + `","reason":"user_requested","note":"operator clicked stop"}`,
		`{"task_id":"` + cancelTaskID + `","reason":"superseded"}`,
		`{"task_id":"` + cancelTaskID + `","reason":"bored"}`,
		`{"task_id":"` + cancelTaskID + `","reason":null}`,
		`{"task_id":"` + cancelTaskID + `","reason":"policy","note":42}`,
		`{"reason":"policy"}`,
		`{"task_id":"x","reason":"policy","note":""}`,
		`[]`,
		`null`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := ParseJSON(data)
		if err != nil {
			return
		}
		in, err := ParseCancelInput(v)
		if err != nil {
			if errs.CodeOf(err) != errs.InvalidEnvelope {
				t.Fatalf("refusal without INVALID_ENVELOPE: %v", err)
			}
			return
		}
		wire, err := Canonical(CancelRequestPayload(in))
		if err != nil {
			t.Fatalf("payload does not canonicalise: %v", err)
		}
		pv, err := ParseJSON(wire)
		if err != nil {
			t.Fatal(err)
		}
		back, err := ParseCancelInput(pv.(map[string]any)["input"])
		if err != nil {
			t.Fatalf("re-parse refused: %v\n%s", err, wire)
		}
		if !reflect.DeepEqual(in, back) {
			t.Fatalf("round trip: %+v != %+v", in, back)
		}
		if p := PropagatedCancel(in); !IsCancelReason(p.Reason) {
			t.Fatalf("propagated reason %q", p.Reason)
		}
	})
}
