package sow

import (
	"regexp"

	"agentmesh.dev/mesh/shared/jsonv"
	"agentmesh.dev/mesh/shared/protocol"
)

// Backstops of the liability clause.
const (
	MaxLiabilityProseEntries = 10
	MaxLiabilityProseChars   = 300
)

// LiabilityGrade is the liability clause's grade, flatly: no runtime
// enforces a liability cap, measures damages or holds anyone harmless;
// courts do, reading the signed document. A runtime gates nothing on it.
const LiabilityGrade = Recorded

// Liability bounds what each party can lose to the other (§5.13), in
// exactly one form: a whole multiple of fees, or an amount in a currency.
type Liability struct {
	MultipleOfFees int64
	Amount         int64
	Currency       string
	CarveOuts      []string
	ByProvider     []string
	ByClient       []string
}

// LiabilityFromValue shape-checks the clause: the cap required and in
// exactly one form (a positive whole multiple_of_fees, or a positive
// integer amount with a three-letter uppercase currency); carve_outs and
// each indemnification list 1-10 non-blank sentences of at most 300
// characters (an empty list, or an indemnification naming neither party,
// is a second spelling of omission); the grade recorded.
func LiabilityFromValue(v any) (Liability, error) {
	m, err := object(v, "the liability clause is an object carrying cap and grade (§5.13)")
	if err != nil {
		return Liability{}, err
	}
	if err := unknown(m, "the liability clause", "cap", "carve_outs", "indemnification", "grade"); err != nil {
		return Liability{}, err
	}
	var l Liability
	c, err := object(m["cap"], "the cap is required: a liability clause exists to bound each party's exposure (§5.13)")
	if err != nil {
		return Liability{}, err
	}
	if err := unknown(c, "the cap", "multiple_of_fees", "amount", "currency"); err != nil {
		return Liability{}, err
	}
	_, asMultiple := c["multiple_of_fees"]
	_, hasAmount := c["amount"]
	_, hasCurrency := c["currency"]
	asAmount := hasAmount || hasCurrency
	switch {
	case asMultiple && asAmount:
		return Liability{}, invalid("the cap is stated in exactly one form, a multiple of fees or an amount with its currency, never both (§5.13)")
	case !asMultiple && !asAmount:
		return Liability{}, invalid("the cap is stated in exactly one form, multiple_of_fees or amount with currency; a cap naming neither bounds nothing (§5.13)")
	case asMultiple:
		var ok bool
		if l.MultipleOfFees, ok = jsonv.PosInt(c["multiple_of_fees"]); !ok {
			return Liability{}, invalid("multiple_of_fees is a positive whole number (§5.13)")
		}
	default:
		var ok bool
		if l.Amount, ok = jsonv.PosInt(c["amount"]); !ok {
			return Liability{}, invalid("cap.amount is a positive integer in the smallest unit of its currency (§5.13)")
		}
		if _, ok := c["currency"]; !ok {
			return Liability{}, invalid("cap.amount comes with its currency: an absolute figure without one is a number, not an amount (§5.13)")
		}
		if l.Currency, _ = c["currency"].(string); !protocol.IsCurrency(l.Currency) {
			return Liability{}, invalid("cap.currency is a three-letter uppercase code (§5.13)")
		}
	}
	if l.CarveOuts, err = proseList(m, "carve_outs", MaxLiabilityProseEntries, MaxLiabilityProseChars, "carve_outs"); err != nil {
		return Liability{}, err
	}
	if raw, present := m["indemnification"]; present {
		ind, err := object(raw, "indemnification is an object {by_provider?, by_client?} (§5.13)")
		if err != nil {
			return Liability{}, err
		}
		if err := unknown(ind, "indemnification", "by_provider", "by_client"); err != nil {
			return Liability{}, err
		}
		if len(ind) == 0 {
			return Liability{}, invalid("an indemnification naming neither party's statements declares nothing, which omitting it already means (§5.13)")
		}
		if l.ByProvider, err = proseList(ind, "by_provider", MaxLiabilityProseEntries, MaxLiabilityProseChars, "indemnification.by_provider"); err != nil {
			return Liability{}, err
		}
		if l.ByClient, err = proseList(ind, "by_client", MaxLiabilityProseEntries, MaxLiabilityProseChars, "indemnification.by_client"); err != nil {
			return Liability{}, err
		}
	}
	if err := flatGrade(m, LiabilityGrade, "the liability clause is graded recorded: no runtime enforces a liability cap or measures damages, courts do, and nothing machine-made is evidence of more than what was agreed (§5.13, §4.2)"); err != nil {
		return Liability{}, err
	}
	return l, nil
}

// Service floors (§5.14).
const (
	MaxFloors               = 10
	RemedyTerminateForCause = "terminate_for_cause"
	// ServiceFloorsGrade: a miss is read from timestamps both parties hold
	// (evidence), and nothing pauses a slow task (not enforced).
	ServiceFloorsGrade = Evidence
)

// Remedies lists the closed remedy set; it grows only with the spec.
func Remedies() []string { return []string{RemedyTerminateForCause} }

// idRE is the qualification-id shape shared by floors: 1-40 lowercase
// letters, digits and dashes.
var idRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,39}$`)

// Floor bounds each task, request arrival to terminal response.
type Floor struct {
	ID             string
	EachTaskWithin string
	WithinMS       int64
}

// ServiceFloors is the clause: floors, and the stated consequence of
// Misses misses inside Within.
type ServiceFloors struct {
	Floors   []Floor
	Misses   int64
	Within   string
	WithinMS int64
	Remedy   string
}

// ServiceFloorsFromValue shape-checks the clause: 1-10 floors with
// distinct ids of the qualification-id shape and each_task_within in the
// one duration grammar (DurationMillis); breach required {misses positive
// whole, within a duration, remedy terminate_for_cause}; grade evidence.
func ServiceFloorsFromValue(v any) (ServiceFloors, error) {
	m, err := object(v, "the service floors clause is an object carrying floors, breach and grade (§5.14)")
	if err != nil {
		return ServiceFloors{}, err
	}
	if err := unknown(m, "the service floors clause", "floors", "breach", "grade"); err != nil {
		return ServiceFloors{}, err
	}
	var s ServiceFloors
	list, ok := jsonv.Array(m["floors"])
	if !ok || len(list) == 0 {
		return ServiceFloors{}, invalid("floors is a non-empty list: a clause naming no floor bounds nothing (§5.14)")
	}
	if len(list) > MaxFloors {
		return ServiceFloors{}, invalid("the clause states at most %d floors (§5.14)", MaxFloors)
	}
	for _, item := range list {
		f, err := object(item, "each floor is an object {id, each_task_within} (§5.14)")
		if err != nil {
			return ServiceFloors{}, err
		}
		if err := unknown(f, "a floor", "id", "each_task_within"); err != nil {
			return ServiceFloors{}, err
		}
		var fl Floor
		if fl.ID, _ = f["id"].(string); !idRE.MatchString(fl.ID) {
			return ServiceFloors{}, invalid("a floor's id is 1-40 lowercase letters, digits and dashes: it is what a recorded miss names (§5.14)")
		}
		for _, prev := range s.Floors {
			if prev.ID == fl.ID {
				return ServiceFloors{}, invalid("two floors share the id %q, and a recorded miss has to name one of them (§5.14)", fl.ID)
			}
		}
		bound, ok := f["each_task_within"].(string)
		if !ok {
			return ServiceFloors{}, invalid("each_task_within is a duration string (§5.14)")
		}
		if fl.WithinMS, err = DurationMillis(bound); err != nil {
			return ServiceFloors{}, err
		}
		fl.EachTaskWithin = bound
		s.Floors = append(s.Floors, fl)
	}
	b, err := object(m["breach"], "breach (misses, within, remedy) is required: a floor without a stated consequence is decoration (§5.14)")
	if err != nil {
		return ServiceFloors{}, err
	}
	if err := unknown(b, "breach", "misses", "within", "remedy"); err != nil {
		return ServiceFloors{}, err
	}
	if s.Misses, ok = jsonv.PosInt(b["misses"]); !ok {
		return ServiceFloors{}, invalid("breach.misses is a positive whole number (§5.14)")
	}
	if s.Within, ok = b["within"].(string); !ok {
		return ServiceFloors{}, invalid("breach.within is a duration string (§5.14)")
	}
	if s.WithinMS, err = DurationMillis(s.Within); err != nil {
		return ServiceFloors{}, err
	}
	if s.Remedy, _ = b["remedy"].(string); s.Remedy != RemedyTerminateForCause {
		return ServiceFloors{}, invalid("the remedy set is closed with one member, terminate_for_cause; a remedy invented here would promise an enforcement no runtime performs (§5.14)")
	}
	if err := flatGrade(m, ServiceFloorsGrade, "the service floors clause is graded evidence: misses are read from timestamps both records hold, and nothing here pauses a slow task or makes a fast one (§5.14, §4.2)"); err != nil {
		return ServiceFloors{}, err
	}
	return s, nil
}
