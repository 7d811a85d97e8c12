package sow

import (
	"slices"

	"agentmesh.dev/mesh/shared/jsonv"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// Approval authorities (§6.1): who may bind formation or an amendment.
const (
	AuthorityAgent           = "agent"             // the key signature alone
	AuthorityPerson          = "person"            // plus a person-grade ceremony
	AuthorityAgentThenPerson = "agent_then_person" // the agent signs, a person confirms
)

// Authorities lists the closed set.
func Authorities() []string {
	return []string{AuthorityAgent, AuthorityPerson, AuthorityAgentThenPerson}
}

// Defaults when change_control states no approval authority.
const (
	DefaultFormationAuthority = AuthorityAgent
	DefaultAmendmentAuthority = AuthorityPerson
)

// Acts an approval binds.
const (
	ActFormation = "formation"
	ActAmendment = "amendment"
)

// Approval is an approval record: which act, under which authority, by
// which key, when, and (§6.2) the mandate the approving person acted under.
type Approval struct {
	Act        string `json:"act"`
	Authority  string `json:"authority"`
	Key        string `json:"key"`
	ApprovedAt string `json:"approved_at"`
	Mandate    string `json:"mandate,omitempty"`
}

// ApprovalFromValue shape-checks an approval record. A mandate is an mnd_
// reference and is refused on an agent-authority approval: a mandate names
// what the approving person acted under, and an agent approval has no
// person to hold one.
func ApprovalFromValue(v any) (Approval, error) {
	m, err := object(v, "an approval record is an object {act, authority, key, approved_at, mandate?} (§6.1)")
	if err != nil {
		return Approval{}, err
	}
	if err := unknown(m, "an approval record", "act", "authority", "key", "approved_at", "mandate"); err != nil {
		return Approval{}, err
	}
	var a Approval
	if a.Act, _ = m["act"].(string); a.Act != ActFormation && a.Act != ActAmendment {
		return Approval{}, invalid("an approval's act is formation or amendment (§6.1)")
	}
	if a.Authority, _ = m["authority"].(string); !slices.Contains(Authorities(), a.Authority) {
		return Approval{}, invalid("authority is agent, person or agent_then_person, and no more (§6.1)")
	}
	if a.Key, _ = m["key"].(string); !keys.IsUserPublicKey(a.Key) {
		return Approval{}, invalid("an approval names the approving owner's key (§6.1)")
	}
	a.ApprovedAt, _ = m["approved_at"].(string)
	if _, err := protocol.ParseTime(a.ApprovedAt); err != nil {
		return Approval{}, invalid("approved_at must be an RFC 3339 instant")
	}
	if raw, present := m["mandate"]; present {
		if a.Mandate, _ = raw.(string); !mandateRE.MatchString(a.Mandate) {
			return Approval{}, invalid("mandate is an Agent Mandate reference, mnd_... (§6.2)")
		}
		if a.Authority == AuthorityAgent {
			return Approval{}, invalid("a mandate names what the approving person acted under, and an agent-authority approval has no person to hold one (§6.2)")
		}
	}
	return a, nil
}

// MandateVerified reports whether an approval may be presented as
// mandate-verified: only where the deployment performs the Agent Mandate
// checks and the approval cites a mandate. The honest default is false, and
// it is never a legal opinion either way.
func MandateVerified(a Approval, checksPerformed bool) bool {
	return checksPerformed && a.Mandate != ""
}

// ChangeControl is the amendment clause (§5.8): the review window after
// which an unanswered proposal lapses, the approval authorities (defaults
// applied), approval records, and the grade.
type ChangeControl struct {
	ReviewWindowDays   int64
	FormationAuthority string
	AmendmentAuthority string
	Approvals          []Approval
	Grade              Grade
}

// ChangeControlFromValue shape-checks the clause.
func ChangeControlFromValue(v any) (ChangeControl, error) {
	m, err := object(v, "change_control is an object {review_window_days, approval?, approvals?, grade} (§5.8)")
	if err != nil {
		return ChangeControl{}, err
	}
	if err := unknown(m, "change_control", "review_window_days", "approval", "approvals", "grade"); err != nil {
		return ChangeControl{}, err
	}
	c := ChangeControl{FormationAuthority: DefaultFormationAuthority, AmendmentAuthority: DefaultAmendmentAuthority}
	var ok bool
	if c.ReviewWindowDays, ok = jsonv.PosInt(m["review_window_days"]); !ok {
		return ChangeControl{}, invalid("review_window_days is a positive whole number of days: an unanswered amendment lapses after it (§5.8)")
	}
	if raw, present := m["approval"]; present {
		a, err := object(raw, "approval is an object {formation?, amendment?} of authorities (§6.1)")
		if err != nil {
			return ChangeControl{}, err
		}
		if err := unknown(a, "approval", ActFormation, ActAmendment); err != nil {
			return ChangeControl{}, err
		}
		for _, f := range []struct {
			name string
			dst  *string
		}{{ActFormation, &c.FormationAuthority}, {ActAmendment, &c.AmendmentAuthority}} {
			if raw, present := a[f.name]; present {
				if *f.dst, _ = raw.(string); !slices.Contains(Authorities(), *f.dst) {
					return ChangeControl{}, invalid("approval.%s is agent, person or agent_then_person (§6.1)", f.name)
				}
			}
		}
	}
	if raw, present := m["approvals"]; present {
		list, ok := jsonv.Array(raw)
		if !ok {
			return ChangeControl{}, invalid("approvals is a list of approval records (§6.1)")
		}
		for _, item := range list {
			a, err := ApprovalFromValue(item)
			if err != nil {
				return ChangeControl{}, err
			}
			c.Approvals = append(c.Approvals, a)
		}
	}
	if c.Grade, err = readGrade(m, "change_control"); err != nil {
		return ChangeControl{}, err
	}
	return c, nil
}
