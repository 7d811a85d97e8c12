package sow

import (
	"fmt"
	"slices"
	"strings"

	"agentmesh.dev/mesh/shared/jsonv"
)

// The promise vocabulary (§5.11): closed, and spelled only by presence as
// the literal true. A promise left out is a promise not made.
const (
	NoTraining          = "no_training"
	NoThirdPartySharing = "no_third_party_sharing"
	NoHumanReading      = "no_human_reading"
)

// Promises lists the vocabulary in its declared order.
func Promises() []string { return []string{NoTraining, NoThirdPartySharing, NoHumanReading} }

// Backstops of the confidentiality clause.
const (
	MaxProcessors       = 16
	MaxProcessorService = 120
	MaxProcessorDomain  = 120
	MaxProcessorPurpose = 300
)

// Confidentiality is the canonical split clause (§5.11): sub-clauses graded
// separately and never merged. Sealed transport and retention are
// runtime-checkable (enforced); what a party does inside its own walls is
// checkable by nobody (promises, recorded).
type Confidentiality struct {
	// Sealed is the transport sub-clause; nil when not stated.
	Sealed *bool
	// RetentionDays is the retention ceiling; 0 when not stated.
	RetentionDays int64
	// Processors are the services content passes through. Stated with an
	// empty list means content goes nowhere; ProcessorsStated false means
	// the clause says nothing about processors.
	Processors       []Processor
	ProcessorsStated bool
	// Made lists the promises made, in vocabulary order.
	Made []string
	// PromisesStated reports whether the promises sub-clause is present.
	PromisesStated bool
}

// Processor is one service content passes through so the work can happen;
// no_third_party_sharing quantifies over everything except these.
type Processor struct {
	Service string `json:"service"`
	Domain  string `json:"domain,omitempty"`
	Purpose string `json:"purpose,omitempty"`
}

// ConfidentialityFromValue shape-checks the clause: transport {sealed bool,
// grade enforced}; retention {max_days positive whole days, grade
// enforced}; processors a list (empty is a statement) of at most 16
// {service (required, non-blank, <=120), domain? (<=120), purpose? (<=300)}
// with no service and domain pair twice; promises {no_training?,
// no_third_party_sharing?, no_human_reading?: the literal true, grade
// recorded} (false is spelled by omission). processed_in is carried for
// the comparisons and not modelled here, as upstream does not yet.
func ConfidentialityFromValue(v any) (Confidentiality, error) {
	m, err := object(v, "the confidentiality clause is an object of separately graded sub-clauses, not a word (§5.11)")
	if err != nil {
		return Confidentiality{}, err
	}
	if err := unknown(m, "the confidentiality clause", "transport", "retention", "processors", "promises", "processed_in"); err != nil {
		return Confidentiality{}, err
	}
	var c Confidentiality
	if raw, present := m["transport"]; present {
		t, err := object(raw, "transport is an object {sealed, grade} (§5.11)")
		if err != nil {
			return Confidentiality{}, err
		}
		if err := unknown(t, "transport", "sealed", "grade"); err != nil {
			return Confidentiality{}, err
		}
		sealed, ok := t["sealed"].(bool)
		if !ok {
			return Confidentiality{}, invalid("transport.sealed is a boolean: the channel is sealed or it is not (§5.11)")
		}
		if err := flatGrade(t, Enforced, "transport is graded enforced: whether the channel is sealed is runtime-checkable, and less understates what ships (§5.11)"); err != nil {
			return Confidentiality{}, err
		}
		c.Sealed = &sealed
	}
	if raw, present := m["retention"]; present {
		r, err := object(raw, "retention is an object {max_days, grade} (§5.11)")
		if err != nil {
			return Confidentiality{}, err
		}
		if err := unknown(r, "retention", "max_days", "grade"); err != nil {
			return Confidentiality{}, err
		}
		var ok bool
		if c.RetentionDays, ok = jsonv.PosInt(r["max_days"]); !ok {
			return Confidentiality{}, invalid("retention.max_days is a positive whole number of days (§5.11)")
		}
		if err := flatGrade(r, Enforced, "retention is graded enforced: a retention window is runtime-checkable, and less understates what ships (§5.11)"); err != nil {
			return Confidentiality{}, err
		}
	}
	if raw, present := m["processors"]; present {
		if c.Processors, err = processors(raw); err != nil {
			return Confidentiality{}, err
		}
		c.ProcessorsStated = true
	}
	if raw, present := m["promises"]; present {
		p, err := object(raw, "promises is an object of the promises made, each the literal true, and its grade (§5.11)")
		if err != nil {
			return Confidentiality{}, err
		}
		if err := unknown(p, "promises", append(Promises(), "grade")...); err != nil {
			return Confidentiality{}, err
		}
		for _, name := range Promises() {
			switch p[name] {
			case nil:
				if _, present := p[name]; present {
					return Confidentiality{}, invalid("%s is the literal true or absent (§5.11)", name)
				}
			case true:
				c.Made = append(c.Made, name)
			default:
				return Confidentiality{}, invalid("%s is the literal true or absent: false is not a value, it is spelled by omission, because a promise left out is a promise not made (§5.11)", name)
			}
		}
		if err := flatGrade(p, Recorded, "promises are graded recorded: what a party does inside its own walls is checkable by nobody, and they must never be presented as enforced (§5.11)"); err != nil {
			return Confidentiality{}, err
		}
		c.PromisesStated = true
	}
	return c, nil
}

func processors(raw any) ([]Processor, error) {
	list, ok := jsonv.Array(raw)
	if !ok {
		return nil, invalid("processors is a list of the services content passes through, even with one entry (§5.11)")
	}
	if len(list) > MaxProcessors {
		return nil, invalid("the clause names at most %d processors (§5.11)", MaxProcessors)
	}
	out := make([]Processor, 0, len(list))
	for _, item := range list {
		m, err := object(item, "each processor is an object {service, domain?, purpose?} (§5.11)")
		if err != nil {
			return nil, err
		}
		if err := unknown(m, "a processor", "service", "domain", "purpose"); err != nil {
			return nil, err
		}
		var p Processor
		if p.Service, ok = jsonv.Text(m["service"], MaxProcessorService); !ok {
			return nil, invalid("a processor's service is required, not blank, at most %d characters: the client is owed the name so it can read that service's terms (§5.11)", MaxProcessorService)
		}
		if p.Domain, err = optText(m, "domain", MaxProcessorDomain, fmt.Sprintf("a processor's domain is not blank and at most %d characters (§5.11)", MaxProcessorDomain)); err != nil {
			return nil, err
		}
		if p.Purpose, err = optText(m, "purpose", MaxProcessorPurpose, fmt.Sprintf("a processor's purpose is not blank and at most %d characters (§5.11)", MaxProcessorPurpose)); err != nil {
			return nil, err
		}
		if slices.ContainsFunc(out, func(q Processor) bool { return q.Service == p.Service && q.Domain == p.Domain }) {
			return nil, invalid("the same service and domain twice states nothing new; a reader cannot tell a mistake from a second service (§5.11)")
		}
		out = append(out, p)
	}
	return out, nil
}

// Requirement is what a client requires of a counterparty's
// confidentiality: promises that must be made, a retention ceiling, and
// the jurisdictions processing is confined to. Empty asks nothing.
type Requirement struct {
	Promises         []string
	RetentionMaxDays *int64
	ProcessedIn      []string
}

// RequirementFromValue reads a requirement {promises?, retention_max_days?,
// processed_in?}.
func RequirementFromValue(v any) (Requirement, error) {
	m, err := object(v, "a confidentiality requirement is an object")
	if err != nil {
		return Requirement{}, err
	}
	if err := unknown(m, "a confidentiality requirement", "promises", "retention_max_days", "processed_in"); err != nil {
		return Requirement{}, err
	}
	var r Requirement
	if raw, present := m["promises"]; present {
		ps, ok := jsonv.Strings(raw)
		if !ok {
			return Requirement{}, invalid("required promises are a list of promise names")
		}
		for _, p := range ps {
			if !slices.Contains(Promises(), p) {
				return Requirement{}, invalid("%q is not a promise of the vocabulary (§5.11)", p)
			}
		}
		r.Promises = ps
	}
	if raw, present := m["retention_max_days"]; present {
		n, ok := jsonv.PosInt(raw)
		if !ok {
			return Requirement{}, invalid("retention_max_days is a positive whole number of days")
		}
		r.RetentionMaxDays = &n
	}
	if raw, present := m["processed_in"]; present {
		if r.ProcessedIn, err = jurisdictions(raw); err != nil {
			return Requirement{}, err
		}
	}
	return r, nil
}

func jurisdictions(raw any) ([]string, error) {
	js, ok := jsonv.Strings(raw)
	if !ok || slices.ContainsFunc(js, jsonv.Blank) {
		return nil, invalid("processed_in is a list of jurisdiction names")
	}
	return js, nil
}

// statedJurisdictions reads processed_in as declared structure: a list of
// non-blank strings, or nothing stated (nil, false).
func statedJurisdictions(clause map[string]any) ([]string, bool) {
	js, err := jurisdictions(clause["processed_in"])
	return js, err == nil
}

// ConfidentialityShortfall is the deterministic comparison behind §5.11's
// pre-admission shadow: "" when doc (decoded) meets req, else the sentence.
// In order: an absent or null clause, then an unreadable one, then the
// first required promise not made (in the requirement's order), then
// retention (a ceiling met exactly is met), then the first declared
// jurisdiction outside the allowed set (in the document's order). An empty
// requirement is met by anything; silence on the document's side is never
// read charitably.
func ConfidentialityShortfall(req Requirement, doc any) string {
	if len(req.Promises) == 0 && req.RetentionMaxDays == nil && len(req.ProcessedIn) == 0 {
		return ""
	}
	m, _ := jsonv.Object(doc)
	raw := m["confidentiality"]
	if raw == nil {
		return "the requirement states confidentiality terms and this document declares none; silence is not an answer, and it is counted as not meeting rather than read charitably (§5.11)"
	}
	c, err := ConfidentialityFromValue(raw)
	if err != nil {
		return "the requirement states confidentiality terms and this document's confidentiality clause is in a shape that cannot be read, so what it promises cannot be established; it is counted as not meeting rather than passed unread (§5.11)"
	}
	for _, p := range req.Promises {
		if !slices.Contains(c.Made, p) {
			return fmt.Sprintf("the requirement includes the promise %s and this document does not make it; a promise left out is a promise not made (§5.11)", p)
		}
	}
	if req.RetentionMaxDays != nil {
		n := *req.RetentionMaxDays
		switch {
		case c.RetentionDays == 0:
			return fmt.Sprintf("the requirement caps retention at %d days and this document states no retention ceiling; an unstated ceiling does not meet a stated one (§5.11)", n)
		case c.RetentionDays > n:
			return fmt.Sprintf("the requirement caps retention at %d days and this document keeps content up to %d days; the test is a ceiling, and it is not met (§5.11)", n, c.RetentionDays)
		}
	}
	if len(req.ProcessedIn) > 0 {
		list := strings.Join(req.ProcessedIn, ", ")
		declared, stated := statedJurisdictions(raw.(map[string]any))
		if !stated {
			return fmt.Sprintf("the requirement confines processing to %s and this document states no jurisdictions; an unstated jurisdiction may be any jurisdiction, and it is counted as not meeting rather than read charitably (§5.11)", list)
		}
		for _, j := range declared {
			if !slices.Contains(req.ProcessedIn, j) {
				return fmt.Sprintf("the requirement confines processing to %s and this document processes in %s; a party may touch no jurisdiction the requirement allowed (§5.11)", list, j)
			}
		}
	}
	return ""
}
