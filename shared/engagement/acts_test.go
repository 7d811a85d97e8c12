package engagement_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"agentmesh.dev/mesh/shared/engagement"
	"agentmesh.dev/mesh/shared/errs"
)

// The signed acts' decoders: every member checked, the signature over the
// tag and the canonical JSON without sig, by the key in by.
func TestActDecoders(t *testing.T) {
	owner, other := newKey(t), newKey(t)
	base := func() map[string]any {
		return map[string]any{"v": 1, "client": newKey(t).Public(), "seller": newKey(t).Public(), "offering": "summarize",
			"sow_id": "sow_abc", "at": epoch.Format(time.RFC3339)}
	}
	signed := func(tag string, m map[string]any, after func(m map[string]any)) []byte {
		if err := engagement.SignAct(tag, m, owner); err != nil {
			t.Fatal(err)
		}
		if after != nil {
			after(m)
		}
		b, _ := json.Marshal(m)
		return b
	}
	parse := map[string]func([]byte) error{
		engagement.TagTerminate:       func(b []byte) error { _, err := engagement.ParseTermination(b); return err },
		engagement.TagReview:          func(b []byte) error { _, err := engagement.ParseReview(b); return err },
		engagement.TagAmendment:       func(b []byte) error { _, err := engagement.ParseResolution(b); return err },
		engagement.TagRequestWithdraw: func(b []byte) error { _, err := engagement.ParseRequestWithdrawal(b); return err },
	}
	valid := map[string]map[string]any{
		engagement.TagTerminate:       {"version": 1, "for_cause": false},
		engagement.TagReview:          {"verdict": "accepted"},
		engagement.TagAmendment:       {"version": 2, "act": "withdraw", "proposal_sha256": "0000000000000000000000000000000000000000000000000000000000000000"},
		engagement.TagRequestWithdraw: {"request_sha256": "0000000000000000000000000000000000000000000000000000000000000000"},
	}
	for _, tc := range []struct {
		name   string
		tag    string
		set    map[string]any
		after  func(m map[string]any)
		tagged string // signed under another tag
		code   errs.Code
	}{
		{name: "terminate valid", tag: engagement.TagTerminate},
		{name: "terminate for cause with reason", tag: engagement.TagTerminate, set: map[string]any{"for_cause": true, "reason": "Late."}},
		{name: "terminate for cause, no reason", tag: engagement.TagTerminate, set: map[string]any{"for_cause": true}, code: errs.InvalidRequest},
		{name: "terminate for cause, blank reason", tag: engagement.TagTerminate, set: map[string]any{"for_cause": true, "reason": "  "}, code: errs.InvalidRequest},
		{name: "terminate for_cause missing", tag: engagement.TagTerminate, set: map[string]any{"for_cause": nil}, code: errs.InvalidRequest},
		{name: "terminate for_cause not bool", tag: engagement.TagTerminate, set: map[string]any{"for_cause": "yes"}, code: errs.InvalidRequest},
		{name: "for_cause flipped after signing", tag: engagement.TagTerminate, set: map[string]any{"for_cause": true, "reason": "x"},
			after: func(m map[string]any) { m["for_cause"] = false }, code: errs.IdentityMismatch},
		{name: "signed under the review tag", tag: engagement.TagTerminate, tagged: engagement.TagReview, code: errs.IdentityMismatch},
		{name: "by replaced after signing", tag: engagement.TagTerminate, after: func(m map[string]any) { m["by"] = other.Public() }, code: errs.IdentityMismatch},
		{name: "unknown member", tag: engagement.TagTerminate, set: map[string]any{"extra": 1}, code: errs.InvalidRequest},
		{name: "v 2", tag: engagement.TagTerminate, set: map[string]any{"v": 2}, code: errs.InvalidRequest},
		{name: "no at", tag: engagement.TagTerminate, set: map[string]any{"at": nil}, code: errs.InvalidRequest},
		{name: "client not a key", tag: engagement.TagTerminate, set: map[string]any{"client": "alice"}, code: errs.InvalidRequest},
		{name: "no sig", tag: engagement.TagTerminate, after: func(m map[string]any) { delete(m, "sig") }, code: errs.InvalidRequest},
		{name: "review rejected with reason", tag: engagement.TagReview, set: map[string]any{"verdict": "rejected", "reason": "Wrong totals."}},
		{name: "review rejected, no reason", tag: engagement.TagReview, set: map[string]any{"verdict": "rejected"}, code: errs.InvalidRequest},
		{name: "review verdict invented", tag: engagement.TagReview, set: map[string]any{"verdict": "meh"}, code: errs.InvalidRequest},
		{name: "review task id", tag: engagement.TagReview, set: map[string]any{"task_id": "t-1"}},
		{name: "review blank task id", tag: engagement.TagReview, set: map[string]any{"task_id": ""}, code: errs.InvalidRequest},
		{name: "deny with reason", tag: engagement.TagAmendment, set: map[string]any{"act": "deny", "reason": "No."}},
		{name: "deny, no reason", tag: engagement.TagAmendment, set: map[string]any{"act": "deny"}, code: errs.InvalidRequest},
		{name: "approve is not an act", tag: engagement.TagAmendment, set: map[string]any{"act": "approve"}, code: errs.InvalidRequest},
		{name: "resolution of version 1", tag: engagement.TagAmendment, set: map[string]any{"version": 1}, code: errs.InvalidRequest},
		{name: "resolution bound to no proposal", tag: engagement.TagAmendment, set: map[string]any{"proposal_sha256": nil}, code: errs.InvalidRequest},
		{name: "resolution digest not hex", tag: engagement.TagAmendment, set: map[string]any{"proposal_sha256": "zz"}, code: errs.InvalidRequest},
		{name: "resolution digest in capitals", tag: engagement.TagAmendment, set: map[string]any{"proposal_sha256": strings.Repeat("A", 64)}, code: errs.InvalidRequest},
		{name: "request withdrawal", tag: engagement.TagRequestWithdraw},
		{name: "request withdrawal bound to nothing", tag: engagement.TagRequestWithdraw, set: map[string]any{"request_sha256": nil}, code: errs.InvalidRequest},
		{name: "request withdrawal under the amendment tag", tag: engagement.TagRequestWithdraw, tagged: engagement.TagAmendment, code: errs.IdentityMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := base()
			for k, v := range valid[tc.tag] {
				m[k] = v
			}
			for k, v := range tc.set {
				if v == nil {
					delete(m, k)
				} else {
					m[k] = v
				}
			}
			tag := tc.tag
			if tc.tagged != "" {
				tag = tc.tagged
			}
			err := parse[tc.tag](signed(tag, m, tc.after))
			if tc.code == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			refused(t, err, tc.code, tc.name)
		})
	}
	// The proposal withdrawal names the proposal only.
	withdrawal := func(set map[string]any, tag string) error {
		m := map[string]any{"v": 1, "provider": newKey(t).Public(), "sow_id": "sow_abc", "at": epoch.Format(time.RFC3339)}
		for k, v := range set {
			m[k] = v
		}
		_, err := engagement.ParseProposalWithdrawal(signed(tag, m, nil))
		return err
	}
	if err := withdrawal(nil, engagement.TagWithdraw); err != nil {
		t.Fatalf("a withdrawal: %v", err)
	}
	refused(t, withdrawal(nil, engagement.TagTerminate), errs.IdentityMismatch, "a withdrawal signed under another tag")
	refused(t, withdrawal(map[string]any{"client": newKey(t).Public()}, engagement.TagWithdraw), errs.InvalidRequest, "a withdrawal with a client")
	refused(t, withdrawal(map[string]any{"provider": "x"}, engagement.TagWithdraw), errs.InvalidRequest, "a withdrawal without a provider key")
	if _, err := engagement.ParseReview(make([]byte, engagement.MaxActBytes+1)); errs.CodeOf(err) != errs.PayloadTooLarge {
		t.Fatalf("an oversized act: %v", err)
	}
}
