package engagement

import (
	"fmt"
	"strings"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/sow"
)

// What this runtime enforces (docs/engagements.md, "What is enforced"):
// a clause graded enforced that it cannot enforce makes it refuse the
// engagement (Agent SoW §3 rule 3), never downgrade the grade. Why each
// answer is what it is:
//
//   - parties: every envelope on the bus is verified against its signer's
//     key, and the terms are mirrored under the two agents' keys, so
//     traffic from another key is not this engagement's.
//   - parties.offered_to: this service authored nothing, but it checks the
//     named counterparty at formation and spends the offer.
//   - scope: the terms are mirrored per offering in scope; a request for
//     another offering finds no terms.
//   - inputs, deliverables: no runtime here checks inputs at intake or the
//     form of artifacts at completion. Not enforced.
//   - price: nothing rates an engagement or checks a ceiling at admission
//     (the clearing rates SKUs under agreements). Only no_charge, whose
//     enforcement is that nothing is rated, drawn or settled, holds here.
//   - volume: the seller's node asks admission (mesh.commerce.admit),
//     which counts the volume, only when its manifest publishes a SKU; so
//     only when the provider agent is registered with at least one SKU.
//   - change_control: this service keeps the versions, the one open
//     proposal, the countersigns, denials, withdrawals and lapses; but it
//     has no person-grade ceremony (§6.1), so only when both formation and
//     amendment are approved by the agent authority (the key signature).
//   - termination: this service records it and the mirror carries when it
//     takes effect, which admission reads.
//   - confidentiality.transport: nothing here refuses unsealed traffic for
//     an engagement; only a clause that promises no sealing (sealed false)
//     holds.
//   - confidentiality.retention: no runtime here deletes content on a
//     clock. Not enforced.
//   - qualifications.<id>: the checkable kinds are tested at formation
//     (the registry, the store).

// Runtime is what the enforcement decision depends on beyond the document.
type Runtime struct {
	// ProviderSKUs: the provider agent is registered with at least one SKU,
	// so its node asks admission, which enforces volume.
	ProviderSKUs bool
}

// whyNot says why this runtime does not enforce path in d, "" when it does.
func (rt Runtime) whyNot(d *sow.Document, path string) string {
	switch {
	case path == sow.PathParties, path == sow.PathOfferedTo, path == sow.PathScope, path == sow.PathTermination:
		return ""
	case path == sow.PathInputs:
		return "no runtime here checks per-task inputs at intake"
	case path == sow.PathDeliverables:
		return "no runtime here checks the form of artifacts at completion"
	case path == sow.PathPrice:
		if d.Price.Arrangement == sow.NoCharge {
			return ""
		}
		return "nothing here rates an engagement's price or checks its ceiling or cap at admission; grade it evidence or recorded"
	case path == sow.PathVolume:
		if rt.ProviderSKUs {
			return ""
		}
		return "the provider's node counts volume at admission only when its agent publishes at least one SKU, and this one publishes none"
	case path == sow.PathChangeControl:
		if d.ChangeControl.FormationAuthority == sow.AuthorityAgent && d.ChangeControl.AmendmentAuthority == sow.AuthorityAgent {
			return ""
		}
		return fmt.Sprintf("this service has no person-grade approval ceremony, so it enforces change control only with approval {formation: agent, amendment: agent} (this document asks formation: %s, amendment: %s)",
			d.ChangeControl.FormationAuthority, d.ChangeControl.AmendmentAuthority)
	case path == sow.PathTransport:
		if c := d.Confidentiality; c != nil && c.Sealed != nil && !*c.Sealed {
			return ""
		}
		return "nothing here refuses unsealed traffic under an engagement"
	case path == sow.PathRetention:
		return "no runtime here deletes content on a retention clock"
	case strings.HasPrefix(path, sow.PathQualifications):
		id := strings.TrimPrefix(path, sow.PathQualifications)
		for _, q := range d.Qualifications {
			if q.ID == id && sow.Checkable(q.Kind) {
				return ""
			}
		}
		return "a condition this runtime cannot check"
	}
	return "this runtime does not know the clause"
}

// Enforces reports whether this runtime enforces path of d.
func (rt Runtime) Enforces(d *sow.Document) func(path string) bool {
	return func(path string) bool { return rt.whyNot(d, path) == "" }
}

// Refusal is nil when this runtime enforces every clause d grades
// enforced, else a FORBIDDEN refusal naming each clause it cannot and why,
// with details.unenforceable listing them.
func (rt Runtime) Refusal(d *sow.Document) *errs.Error {
	bad := d.Unenforceable(rt.Enforces(d))
	if len(bad) == 0 {
		return nil
	}
	parts := make([]string, 0, len(bad))
	for _, p := range bad {
		parts = append(parts, p+" ("+rt.whyNot(d, p)+")")
	}
	return errs.Newf(errs.Forbidden, "this runtime cannot enforce what the document grades enforced: %s. It refuses the engagement rather than downgrade a grade (Agent SoW §3 rule 3); grade those clauses evidence or recorded, or remove them",
		strings.Join(parts, "; ")).WithDetail("unenforceable", bad)
}
