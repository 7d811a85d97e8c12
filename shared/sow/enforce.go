package sow

// Clause paths name the graded parts of a document for Enforced and
// Unenforceable: the top-level clause, "confidentiality.transport" and
// "confidentiality.retention" for the split clause, "parties.offered_to",
// and "qualifications.<id>" for one condition.
const (
	PathParties        = "parties"
	PathOfferedTo      = "parties.offered_to"
	PathScope          = "scope"
	PathInputs         = "inputs"
	PathDeliverables   = "deliverables"
	PathPrice          = "price"
	PathVolume         = "volume"
	PathChangeControl  = "change_control"
	PathTermination    = "termination"
	PathTransport      = "confidentiality.transport"
	PathRetention      = "confidentiality.retention"
	PathQualifications = "qualifications."
)

// Enforced lists the parts of d graded enforced, in document order: the
// refusals a runtime that accepts d promises to make mechanically. Inputs
// carry no grade of their own and are enforced by definition (§5.3).
func (d *Document) Enforced() []string {
	var out []string
	add := func(path string, g Grade) {
		if g == Enforced {
			out = append(out, path)
		}
	}
	add(PathParties, d.Parties.Grade)
	if d.Parties.OfferedTo != nil {
		add(PathOfferedTo, d.Parties.OfferedTo.Grade)
	}
	add(PathScope, d.Scope.Grade)
	if len(d.Inputs) > 0 {
		out = append(out, PathInputs)
	}
	if d.Deliverables != nil {
		add(PathDeliverables, d.Deliverables.Grade)
	}
	add(PathPrice, d.Price.Grade)
	if d.Volume != nil {
		add(PathVolume, d.Volume.Grade)
	}
	add(PathChangeControl, d.ChangeControl.Grade)
	add(PathTermination, d.Termination.Grade)
	if c := d.Confidentiality; c != nil {
		if c.Sealed != nil {
			out = append(out, PathTransport)
		}
		if c.RetentionDays > 0 {
			out = append(out, PathRetention)
		}
	}
	for _, q := range d.Qualifications {
		add(PathQualifications+q.ID, q.Grade)
	}
	return out
}

// Unenforceable lists the parts of d graded enforced that this runtime
// cannot enforce, as enforces reports. A runtime receiving a document with
// any must refuse the engagement; it must never downgrade the grade (§3
// rule 3).
func (d *Document) Unenforceable(enforces func(path string) bool) []string {
	var out []string
	for _, p := range d.Enforced() {
		if !enforces(p) {
			out = append(out, p)
		}
	}
	return out
}
