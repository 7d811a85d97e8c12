package sow

import (
	"fmt"
	"slices"
	"strings"

	"agentmesh.dev/mesh/shared/jsonv"
)

// Subcontracting postures (§5.15): none (the provider performs the work
// itself), disclosed (every delegate named before its work begins),
// approved (and each countersigned by the client).
const (
	SubcontractNone      = "none"
	SubcontractDisclosed = "disclosed"
	SubcontractApproved  = "approved"
)

// SubcontractingPostures lists the closed set.
func SubcontractingPostures() []string {
	return []string{SubcontractNone, SubcontractDisclosed, SubcontractApproved}
}

// SubcontractingGrade: the named chain and the on-mesh engagement records
// are checkable and exportable (evidence); off-mesh delegation is beyond
// the mesh's sight (not enforced).
const SubcontractingGrade = Evidence

// Backstops of the subcontracting clause.
const (
	MaxSubcontractors          = 16
	maxSubAgent                = 64
	maxSubHandle               = 120
	maxSubRole                 = 64
	MaxSubcontractorScope      = 300
	MaxSubcontractorEngagement = 128
)

// Subcontractor is one named delegate: a party on the mesh (agent key,
// handle or published role; the vocabulary offers nothing else, because a
// disclosure nobody can look up is decoration), the scope delegated, and
// optionally the engagement the delegation runs under (the pin).
type Subcontractor struct {
	Agent, Handle, Role string
	Scope               string
	Engagement          string
}

// Name is how a delegate is named in a sentence: handle, else agent, else
// role.
func (s Subcontractor) Name() string {
	for _, n := range []string{s.Handle, s.Agent, s.Role} {
		if n != "" {
			return n
		}
	}
	return "a delegate"
}

// Subcontracting is the clause.
type Subcontracting struct {
	Posture        string
	Subcontractors []Subcontractor
}

// SubcontractingFromValue shape-checks the clause: the posture from the
// closed three, grade evidence, subcontractors refused under none (a none
// clause naming delegates contradicts itself) and otherwise optional, an
// empty list refused as omission's second spelling, at most 16 entries,
// each naming at least one of agent (<=64), handle (<=120), role (<=64),
// all non-blank, with a non-blank scope (<=300) and an optional non-blank
// engagement (<=128), no agent or handle named twice.
func SubcontractingFromValue(v any) (Subcontracting, error) {
	m, err := object(v, "the subcontracting clause is an object carrying posture and grade, not a bare posture (§5.15)")
	if err != nil {
		return Subcontracting{}, err
	}
	if err := unknown(m, "the subcontracting clause", "posture", "subcontractors", "grade"); err != nil {
		return Subcontracting{}, err
	}
	var s Subcontracting
	if s.Posture, _ = m["posture"].(string); !slices.Contains(SubcontractingPostures(), s.Posture) {
		return Subcontracting{}, invalid("the subcontracting posture is none, disclosed or approved: exactly one, from a closed set (§5.15)")
	}
	if err := flatGrade(m, SubcontractingGrade, "the subcontracting clause is graded evidence: the named chain and the on-mesh records are exportable, and off-mesh delegation is beyond the mesh's sight (§5.15, §4.2)"); err != nil {
		return Subcontracting{}, err
	}
	raw, present := m["subcontractors"]
	if !present {
		return s, nil
	}
	if s.Posture == SubcontractNone {
		return Subcontracting{}, invalid("a none clause naming delegates contradicts itself (§5.15)")
	}
	list, ok := jsonv.Array(raw)
	switch {
	case !ok:
		return Subcontracting{}, invalid("subcontractors is a list, even with one entry (§5.15)")
	case len(list) == 0:
		return Subcontracting{}, invalid("an empty subcontractors list declares nothing, which omitting the member already means (§5.15)")
	case len(list) > MaxSubcontractors:
		return Subcontracting{}, invalid("the clause names at most %d subcontractors (§5.15)", MaxSubcontractors)
	}
	for _, item := range list {
		e, err := object(item, "each subcontractor is an object naming who and the scope delegated (§5.15)")
		if err != nil {
			return Subcontracting{}, err
		}
		if err := unknown(e, "a subcontractor", "agent", "handle", "role", "scope", "engagement"); err != nil {
			return Subcontracting{}, err
		}
		var sc Subcontractor
		for _, f := range []struct {
			name string
			max  int
			dst  *string
		}{{"agent", maxSubAgent, &sc.Agent}, {"handle", maxSubHandle, &sc.Handle}, {"role", maxSubRole, &sc.Role}, {"engagement", MaxSubcontractorEngagement, &sc.Engagement}} {
			if *f.dst, err = optText(e, f.name, f.max, fmt.Sprintf("a subcontractor's %s, when present, is not blank and at most %d characters (§5.15)", f.name, f.max)); err != nil {
				return Subcontracting{}, err
			}
		}
		if sc.Agent == "" && sc.Handle == "" && sc.Role == "" {
			return Subcontracting{}, invalid("a subcontractor entry names a party on the mesh, an agent, a handle or a role; a disclosure nobody can look up is decoration (§5.15)")
		}
		if sc.Scope, ok = jsonv.Text(e["scope"], MaxSubcontractorScope); !ok {
			return Subcontracting{}, invalid("a subcontractor's scope is required, not blank, at most %d characters: who without what discloses nothing (§5.15)", MaxSubcontractorScope)
		}
		for _, prev := range s.Subcontractors {
			if (sc.Agent != "" && prev.Agent == sc.Agent) || (sc.Handle != "" && prev.Handle == sc.Handle) {
				return Subcontracting{}, invalid("two entries name the same delegate; state the whole delegated scope on one entry (§5.15)")
			}
		}
		s.Subcontractors = append(s.Subcontractors, sc)
	}
	return s, nil
}

// ConformanceOptions qualify a flow-down comparison.
type ConformanceOptions struct {
	// PrimeCapRemaining is what remains of the cap above; only the platform
	// holding the money knows it, so nil means no cap check.
	PrimeCapRemaining *int64
	// RequirePins makes every delegate the prime names without an
	// engagement a violation: the policy of a runtime offering a solution
	// whose parts' terms it must hold, not a property of the vocabulary.
	RequirePins bool
}

// Conformance is §5.15's chain rule: does sub (the delegate's engagement
// document, decoded; nil when it states nothing) narrow every checkable
// term of prime (decoded)? Each term is checked only where the prime
// states it, reading declared structure (whether a clause validates is a
// question for validation). One pinned sentence per violation, in order:
// unpinned delegates (with RequirePins), promises in vocabulary order,
// retention, each stray jurisdiction in the sub's order, reporting, the
// cap. Empty means the chain narrows correctly, terms met exactly included.
func Conformance(prime, sub any, o ConformanceOptions) []string {
	out := []string{}
	if o.RequirePins {
		if sc, err := SubcontractingFromValue(member(prime, "subcontracting")); err == nil {
			for _, e := range sc.Subcontractors {
				if e.Engagement == "" {
					out = append(out, fmt.Sprintf("%s is named as a delegate with no engagement pinned to it; terms that are not pinned can change after this is signed, and a party cannot promise terms it does not hold (§5.15)", e.Name()))
				}
			}
		}
	}
	pc, _ := jsonv.Object(member(prime, "confidentiality"))
	sc, _ := jsonv.Object(member(sub, "confidentiality"))
	subMakes := statedPromises(sc)
	for _, p := range statedPromises(pc) {
		if !slices.Contains(subMakes, p) {
			out = append(out, fmt.Sprintf("the prime promises %s and this subcontract does not; a delegate may not be freer with the content than the party that took it (§5.15)", p))
		}
	}
	if pd := statedRetention(pc); pd > 0 {
		switch sd := statedRetention(sc); {
		case sd == 0:
			out = append(out, fmt.Sprintf("the prime caps retention at %d days and this subcontract states no retention ceiling; an unstated ceiling narrows nothing, and terms only narrow going down (§5.15)", pd))
		case sd > pd:
			out = append(out, fmt.Sprintf("the prime caps retention at %d days and this subcontract keeps content up to %d days; a delegate may retain no longer than the party that took the content (§5.15)", pd, sd))
		}
	}
	if primeIn, stated := statedJurisdictions(pc); stated {
		list := strings.Join(primeIn, ", ")
		subIn, stated := statedJurisdictions(sc)
		if !stated {
			out = append(out, fmt.Sprintf("the prime confines processing to %s and this subcontract states no jurisdictions; an unstated jurisdiction may be any jurisdiction, and terms only narrow going down (§5.15)", list))
		}
		for _, j := range subIn {
			if !slices.Contains(primeIn, j) {
				out = append(out, fmt.Sprintf("the prime confines processing to %s and this subcontract processes in %s; a delegate may touch no jurisdiction the party above it did not (§5.15)", list, j))
			}
		}
	}
	if pl := statedLevel(prime); pl != "" {
		switch sl := statedLevel(sub); {
		case sl == "" && !Meets(DefaultLevel, pl):
			out = append(out, fmt.Sprintf("the prime owes %s reporting and this subcontract declares none, which offers records_only; a delegate's reporting must be sufficient for the link above to meet its own (§5.15)", pl))
		case sl != "" && !Meets(sl, pl):
			out = append(out, fmt.Sprintf("the prime owes %s reporting and this subcontract offers %s; a delegate's reporting must be sufficient for the link above to meet its own (§5.15)", pl, sl))
		}
	}
	if o.PrimeCapRemaining != nil {
		remaining := max(0, *o.PrimeCapRemaining)
		if subCap := statedCap(sub); subCap > remaining {
			out = append(out, fmt.Sprintf("the subcontract's cap of %d is larger than what remains of the cap above it (%d); at every link the cap fits inside the remainder of the cap above (§5.15)", subCap, remaining))
		}
	}
	return out
}

// member reads one member of a decoded document, nil when doc is not an
// object or lacks it.
func member(doc any, name string) any {
	m, _ := jsonv.Object(doc)
	return m[name]
}

func statedPromises(clause map[string]any) []string {
	p, _ := jsonv.Object(clause["promises"])
	var out []string
	for _, name := range Promises() {
		if p[name] == true {
			out = append(out, name)
		}
	}
	return out
}

func statedRetention(clause map[string]any) int64 {
	r, _ := jsonv.Object(clause["retention"])
	n, _ := jsonv.PosInt(r["max_days"])
	return n
}

func statedLevel(doc any) string {
	r, _ := jsonv.Object(member(doc, "reporting"))
	if l, _ := r["level"].(string); LevelRank(l) >= 0 {
		return l
	}
	return ""
}

func statedCap(doc any) int64 {
	p, _ := jsonv.Object(member(doc, "price"))
	if p["arrangement"] != TimeAndMaterials {
		return 0
	}
	c, _ := jsonv.Object(p["cap"])
	n, _ := jsonv.PosInt(c["amount"])
	return n
}
