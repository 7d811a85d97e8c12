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
//   - scope: while an engagement grading scope enforced is in force, the
//     seller's node refuses its client's request naming an offering not in
//     scope (§5.2): the service mirrors the scopes under
//     commerce.EngagementScopeKey and admission (mesh.commerce.admit)
//     refuses. The node asks admission only when its manifest publishes a
//     SKU, so only when the provider agent publishes at least one.
//   - inputs, deliverables: no runtime here checks inputs at intake or the
//     form of artifacts at completion. Not enforced.
//   - price: nothing rates an engagement or checks a ceiling at admission
//     (the clearing rates SKUs under agreements). Not even no_charge: the
//     node may still charge a paid SKU on the same offering, since SKUs and
//     engagements are independent (issue 18 decision 4). Not enforced.
//   - volume: the seller's node asks admission (mesh.commerce.admit),
//     which counts the volume, only when its manifest publishes a SKU; so
//     only when the provider agent is registered with at least one SKU.
//   - change_control: this service keeps the versions, the one open
//     proposal, the countersigns, denials, withdrawals and lapses; but it
//     has no person-grade ceremony (§6.1), so only when both formation and
//     amendment are approved by the agent authority (the key signature).
//   - termination: for cause, §5.9 cancels in-flight tasks with a recorded
//     reason, and nothing here cancels them (nor reaches a bureau, spec
//     §3.7). Not enforced; the notice is still recorded and mirrored
//     whatever the grade.
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
	case path == sow.PathParties, path == sow.PathOfferedTo:
		return ""
	case path == sow.PathScope:
		if rt.ProviderSKUs {
			return ""
		}
		return "the provider's node refuses out-of-scope requests at admission only when its agent publishes at least one SKU, and this one publishes none"
	case path == sow.PathTermination:
		return "for cause, in-flight tasks are to be canceled with a recorded reason (§5.9), and nothing here cancels them; grade it evidence or recorded"
	case path == sow.PathInputs:
		return "no runtime here checks per-task inputs at intake"
	case path == sow.PathDeliverables:
		return "no runtime here checks the form of artifacts at completion"
	case path == sow.PathPrice:
		return "nothing here rates an engagement's price or checks its ceiling or cap at admission, and even under no_charge the provider's node may charge a SKU on the offering; grade it evidence or recorded"
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

// Bounds of the clauses the service computes instants from: beyond them a
// time.Duration overflows (or a date runs off the calendar), so a
// document naming more is refused rather than read wrong.
const (
	MaxNoticeHours      = 10 * 366 * 24 // ten years
	MaxReviewWindowDays = 10 * 366
	MaxTermMonths       = 10 * 12
)

// boundsRefusal refuses a document whose clock clauses exceed the bounds.
func boundsRefusal(d *sow.Document) *errs.Error {
	switch {
	case d.Termination.ConvenienceNoticeHours > MaxNoticeHours:
		return errs.Newf(errs.InvalidRequest, "termination.convenience_notice_hours is %d; this service keeps notices of at most %d hours (ten years)", d.Termination.ConvenienceNoticeHours, MaxNoticeHours)
	case d.ChangeControl.ReviewWindowDays > MaxReviewWindowDays:
		return errs.Newf(errs.InvalidRequest, "change_control.review_window_days is %d; this service keeps review windows of at most %d days (ten years)", d.ChangeControl.ReviewWindowDays, MaxReviewWindowDays)
	case d.TermMonths > MaxTermMonths:
		return errs.Newf(errs.InvalidRequest, "term_months is %d; this service keeps terms of at most %d months (ten years)", d.TermMonths, MaxTermMonths)
	}
	return nil
}

// gates is every check of a document against this runtime: the clock
// bounds, then the enforced set.
func (rt Runtime) gates(d *sow.Document) *errs.Error {
	if e := boundsRefusal(d); e != nil {
		return e
	}
	return rt.Refusal(d)
}
