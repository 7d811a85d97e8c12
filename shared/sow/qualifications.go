package sow

import (
	"fmt"
	"slices"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/jsonv"
)

// Qualification kinds (§12.1): a closed vocabulary, closed for the
// gradient's sake. Three are facts a runtime holds about a counterparty;
// asserted is the honest name for everything it cannot check. There is no
// probe kind: a runtime holding no probe records would have to invent one.
const (
	KindAsserted          = "asserted"
	KindMeshRegistration  = "mesh_registration"
	KindPlatformAccount   = "platform_account"
	KindPublishesOffering = "publishes_offering"
)

// QualificationKinds lists the vocabulary.
func QualificationKinds() []string {
	return []string{KindAsserted, KindMeshRegistration, KindPlatformAccount, KindPublishesOffering}
}

// Checkable reports whether a runtime tests kind against a fact it holds.
func Checkable(kind string) bool {
	return kind == KindMeshRegistration || kind == KindPlatformAccount || kind == KindPublishesOffering
}

// GradeCeiling is the highest grade kind can honestly carry: enforced for
// a checkable kind, evidence for an assertion (the record proves the party
// said it, not that it is true).
func GradeCeiling(kind string) Grade {
	if Checkable(kind) {
		return Enforced
	}
	return Evidence
}

// Backstops of the qualifications clause.
const (
	MaxQualifications     = 10
	maxQualificationText  = 300
	maxQualificationOffer = 60
)

// Qualification is one condition a counterparty must meet for its
// countersign to be accepted, stated in words and singly graded.
type Qualification struct {
	ID        string
	Kind      string
	Statement string
	Grade     Grade
	Offering  string // publishes_offering only
}

// QualificationFromValue shape-checks one condition: an id of the shape
// refusals name (1-40 lowercase letters, digits, dashes), a kind from the
// vocabulary, a statement of at most 300 characters, a grade within the
// kind's ceiling (an assertion graded enforced is the false enforcement
// claim), and an offering exactly when the kind is publishes_offering.
func QualificationFromValue(v any) (Qualification, error) {
	m, err := object(v, "a qualification is an object {id, kind, statement, grade, offering?} (§12.1)")
	if err != nil {
		return Qualification{}, err
	}
	if err := unknown(m, "a qualification", "id", "kind", "statement", "grade", "offering"); err != nil {
		return Qualification{}, err
	}
	var q Qualification
	if q.ID, _ = m["id"].(string); !idRE.MatchString(q.ID) {
		return Qualification{}, invalid("a qualification's id is 1-40 lowercase letters, digits and dashes: it is what a refusal names (§12.1)")
	}
	if q.Kind, _ = m["kind"].(string); !slices.Contains(QualificationKinds(), q.Kind) {
		return Qualification{}, invalid("a qualification's kind is one of %v: a condition written as a kind is graded by what the kind can be tested against (§12.1)", QualificationKinds())
	}
	var ok bool
	if q.Statement, ok = jsonv.Text(m["statement"], maxQualificationText); !ok {
		return Qualification{}, invalid("a qualification states its condition in words a person reads, at most %d characters (§12.1)", maxQualificationText)
	}
	if q.Grade, err = readGrade(m, "a qualification"); err != nil {
		return Qualification{}, err
	}
	if q.Grade.rank() > GradeCeiling(q.Kind).rank() {
		return Qualification{}, invalid("a condition the counterparty asserts about itself, which no runtime can check, is never graded enforced: the record is evidence it was asserted, not proof it is true (§12.1 rule 4)")
	}
	raw, present := m["offering"]
	switch {
	case q.Kind == KindPublishesOffering:
		if q.Offering, ok = jsonv.Text(raw, maxQualificationOffer); !ok {
			return Qualification{}, invalid("a publishes_offering qualification names the offering the counterparty must publish (§12.1)")
		}
	case present:
		return Qualification{}, invalid("only a publishes_offering qualification carries an offering: a field the check never reads is a term the buyer reads and the runtime ignores (§12.1)")
	}
	return q, nil
}

// Qualifications is the clause: an ordered list of conditions with
// distinct ids.
type Qualifications []Qualification

// QualificationsFromValue shape-checks the clause: a list (its order is
// inside the signed bytes) of at most 10 conditions with distinct ids.
func QualificationsFromValue(v any) (Qualifications, error) {
	list, ok := jsonv.Array(v)
	if !ok {
		return nil, invalid("qualifications is a list of conditions (§12.1)")
	}
	if len(list) > MaxQualifications {
		return nil, invalid("a standing proposal states at most %d qualifications (§12.1)", MaxQualifications)
	}
	out := make(Qualifications, 0, len(list))
	for _, item := range list {
		q, err := QualificationFromValue(item)
		if err != nil {
			return nil, err
		}
		if slices.ContainsFunc(out, func(p Qualification) bool { return p.ID == q.ID }) {
			return nil, invalid("two qualifications share the id %q, and a refusal has to name one of them (§12.1)", q.ID)
		}
		out = append(out, q)
	}
	return out, nil
}

// RequiredAssertions are the ids a countersign must assert, in the order it
// must list them: sorted, so every client accepting the same offer signs
// the same bytes.
func (qs Qualifications) RequiredAssertions() []string {
	var ids []string
	for _, q := range qs {
		if q.Kind == KindAsserted {
			ids = append(ids, q.ID)
		}
	}
	slices.Sort(ids)
	return ids
}

// Facts are what a runtime established about the countersigning agent. A
// nil field was not established, which is not the same as false: an
// unchecked condition refuses, never passes.
type Facts struct {
	Subject    string
	Registered *bool
	Offerings  []string // nil: not established
	Account    *bool
}

func unmetQualification(q Qualification, format string, args ...any) *errs.Error {
	return errs.Newf(errs.Forbidden, format, args...).WithDetail("qualification", q.ID)
}

// Refusal is the §12.1 formation gate: nil when clientAgent meets every
// stated condition and the countersign asserts exactly the assertions the
// offer asks for (listed once each, sorted), else a FORBIDDEN refusal naming
// the unmet condition. facts nil means the runtime gathered nothing.
func (qs Qualifications) Refusal(clientAgent string, asserted []string, facts *Facts) *errs.Error {
	if len(qs) == 0 {
		return nil
	}
	for i, id := range asserted {
		if i > 0 && asserted[i-1] >= id {
			return errs.New(errs.Forbidden, "the asserted conditions are listed once each, in sorted order, because the list rides inside the bytes both parties sign (§12.1)")
		}
		j := slices.IndexFunc(qs, func(q Qualification) bool { return q.ID == id })
		if j < 0 {
			return errs.Newf(errs.Forbidden, "this offer states no condition called %q, and a countersign asserts only the conditions the offer states (§12.1)", id)
		}
		if qs[j].Kind != KindAsserted {
			return unmetQualification(qs[j], "%q is a condition this runtime checks rather than one you state, so a countersign does not assert it (§12.1)", id)
		}
	}
	for _, q := range qs {
		if q.Kind == KindAsserted && !slices.Contains(asserted, q.ID) {
			return unmetQualification(q, "this offer requires the countersigning party to state that it meets %q: %s The countersign carries no such statement (§12.1)", q.ID, q.Statement)
		}
	}
	checkable := slices.ContainsFunc(qs, func(q Qualification) bool { return Checkable(q.Kind) })
	if !checkable {
		return nil
	}
	if facts == nil {
		return errs.New(errs.Forbidden, "this offer states conditions on who may countersign it and none was checked; an unchecked condition refuses formation rather than passing it (§12.1)")
	}
	if facts.Subject != clientAgent {
		return errs.New(errs.Forbidden, "the conditions were checked against a different agent than the one in the client seat, so nothing is established about the countersigning agent (§12.1)")
	}
	for _, q := range qs {
		unchecked := unmetQualification(q, "this offer states the condition %q: %s It could not be checked just now, and an unchecked condition refuses formation (§12.1)", q.ID, q.Statement)
		unmet := func(because string) *errs.Error {
			return unmetQualification(q, "this offer states a condition the countersigning party does not meet, %q: %s %s (§12.1)", q.ID, q.Statement, because)
		}
		switch q.Kind {
		case KindMeshRegistration:
			switch {
			case facts.Registered == nil:
				return unchecked
			case !*facts.Registered:
				return unmet("That agent holds no current registration on this mesh.")
			}
		case KindPublishesOffering:
			switch {
			case facts.Offerings == nil:
				return unchecked
			case !slices.Contains(facts.Offerings, q.Offering):
				return unmet(fmt.Sprintf("That agent's manifest does not publish %q.", q.Offering))
			}
		case KindPlatformAccount:
			switch {
			case facts.Account == nil:
				return unchecked
			case !*facts.Account:
				return unmet("That agent is not attached to an account on this platform.")
			}
		}
	}
	return nil
}

// QualificationRefusal is Qualifications.Refusal over an undecoded clause
// (nil: the offer states no conditions). A clause that cannot be read is a
// condition that cannot be tested, and is refused, never waived.
func QualificationRefusal(clause any, clientAgent string, asserted []string, facts *Facts) *errs.Error {
	if clause == nil {
		return nil
	}
	qs, err := QualificationsFromValue(clause)
	if err != nil {
		return errs.New(errs.Forbidden, "this offer states conditions in a shape that cannot be read, so whether you meet them cannot be established: "+errs.As(err).Message)
	}
	return qs.Refusal(clientAgent, asserted, facts)
}
