// Package sow is the engagement document, Agent SoW (agentsow.com,
// digested in spec/agent-sow-facts.md; conformance fixtures sow-*.json):
// the owner-signed statement of work two agents' owners agree to, every
// clause of it graded by what a runtime can honestly do about a breach.
//
// Grades are a closed set: enforced (a violation is refused mechanically),
// evidence (a signed, exportable record exists and a dispute is read from
// it) and recorded (a promise no runtime can check). A runtime that cannot
// enforce a clause it receives graded enforced must refuse the engagement
// rather than downgrade it (Unenforceable), and a renderer shows the grade
// wherever it shows the clause.
//
// This package is the document and its arithmetic: parsing and validating
// every clause family (parties, scope, price, volume, change control,
// termination, disputes, confidentiality, reporting, liability, service
// floors, subcontracting, qualifications), the signed bytes and owner
// signatures, the id, the rating of time-and-materials usage against the
// cap with the operator fee inside it, settlement checks, the formation
// gates (directed offers, qualifications) and the comparisons a mandate or
// a subcontract chain runs. Formation, amendment and termination as
// records and routes live with the engagement service that uses it.
//
// Members this version does not know are refused, in the document and in
// every clause: a signed term nobody reads is a term nobody enforces. The
// one exception is confidentiality.processed_in, which the fixtures carry
// before the specification models it and which is read only by the
// comparisons, as declared structure.
package sow

import (
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/jsonv"
)

// Grade is a clause's place on the enforcement gradient.
type Grade string

// The three grades.
const (
	Enforced Grade = "enforced"
	Evidence Grade = "evidence"
	Recorded Grade = "recorded"
)

// Grades lists the closed set, strongest first.
func Grades() []Grade { return []Grade{Enforced, Evidence, Recorded} }

// Valid reports whether g is one of the three grades.
func (g Grade) Valid() bool { return g == Enforced || g == Evidence || g == Recorded }

// rank orders the grades: recorded < evidence < enforced.
func (g Grade) rank() int {
	switch g {
	case Enforced:
		return 2
	case Evidence:
		return 1
	}
	return 0
}

// invalid is a shape refusal of an engagement document or one of its parts.
func invalid(format string, args ...any) *errs.Error {
	return errs.Newf(errs.InvalidEnvelope, "engagement document: "+format, args...)
}

// readGrade reads a clause's required grade from the closed set.
func readGrade(m map[string]any, what string) (Grade, error) {
	g, _ := m["grade"].(string)
	if !Grade(g).Valid() {
		return "", invalid("%s carries a grade: enforced, evidence or recorded (§4.2)", what)
	}
	return Grade(g), nil
}

// flatGrade reads a grade the specification fixes for a clause: anything
// else overstates or understates what ships, and is refused with why.
func flatGrade(m map[string]any, want Grade, why string) error {
	if g, _ := m["grade"].(string); Grade(g) != want {
		return invalid("%s", why)
	}
	return nil
}

// object reads v as a clause object, or refuses naming what it must be.
func object(v any, format string, args ...any) (map[string]any, error) {
	m, ok := jsonv.Object(v)
	if !ok {
		return nil, invalid(format, args...)
	}
	return m, nil
}

// unknown refuses a member outside known.
func unknown(m map[string]any, what string, known ...string) error {
	if k, bad := jsonv.Unknown(m, known...); bad {
		return invalid("%s has unknown member %q; a term this runtime does not read is a term nobody enforces", what, k)
	}
	return nil
}

// optText reads an optional non-blank string of at most max UTF-16 units.
func optText(m map[string]any, member string, max int, what string) (string, error) {
	raw, present := m[member]
	if !present {
		return "", nil
	}
	s, ok := jsonv.Text(raw, max)
	if !ok {
		return "", invalid("%s", what)
	}
	return s, nil
}

// proseList reads an optional list of 1..maxEntries non-blank sentences of
// at most maxChars: an empty list is refused as a second spelling of
// omission.
func proseList(m map[string]any, member string, maxEntries, maxChars int, what string) ([]string, error) {
	raw, present := m[member]
	if !present {
		return nil, nil
	}
	list, ok := jsonv.Array(raw)
	switch {
	case !ok:
		return nil, invalid("%s is a list of sentences, even with one entry", what)
	case len(list) == 0:
		return nil, invalid("an empty %s list declares nothing, which omitting the member already means; two spellings of one state is how implementations come to disagree", what)
	case len(list) > maxEntries:
		return nil, invalid("%s states at most %d entries", what, maxEntries)
	}
	out := make([]string, 0, len(list))
	for _, x := range list {
		s, ok := jsonv.Text(x, maxChars)
		if !ok {
			return nil, invalid("each %s entry is a sentence a person reads, not blank, up to %d characters", what, maxChars)
		}
		out = append(out, s)
	}
	return out, nil
}
