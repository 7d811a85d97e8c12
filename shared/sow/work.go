package sow

import (
	"regexp"

	"agentmesh.dev/mesh/shared/jsonv"
	"agentmesh.dev/mesh/shared/protocol"
)

// Scope is the work covered (§5.2): the provider's offering ids, matched on
// id, never on the prose examples, which guide people and dispute readers.
type Scope struct {
	Offerings  []string
	InScope    []string
	OutOfScope []string
	Grade      Grade
}

// ScopeFromValue shape-checks the scope clause.
func ScopeFromValue(v any) (Scope, error) {
	m, err := object(v, "scope is an object {offerings, examples?, grade} (§5.2)")
	if err != nil {
		return Scope{}, err
	}
	if err := unknown(m, "scope", "offerings", "examples", "grade"); err != nil {
		return Scope{}, err
	}
	var s Scope
	offerings, ok := jsonv.Strings(m["offerings"])
	if !ok || len(offerings) == 0 {
		return Scope{}, invalid("scope.offerings is a non-empty list of offering ids: requests are matched on offering (§5.2)")
	}
	for i, o := range offerings {
		if o == "" || jsonv.UTF16Len(o) > 128 || jsonv.Blank(o) {
			return Scope{}, invalid("scope.offerings names offering ids, not blank, at most 128 characters (§5.2)")
		}
		for _, prev := range offerings[:i] {
			if prev == o {
				return Scope{}, invalid("scope.offerings names %q twice (§5.2)", o)
			}
		}
	}
	s.Offerings = offerings
	if raw, present := m["examples"]; present {
		ex, err := object(raw, "scope.examples is an object {in_scope?, out_of_scope?} (§5.2)")
		if err != nil {
			return Scope{}, err
		}
		if err := unknown(ex, "scope.examples", "in_scope", "out_of_scope"); err != nil {
			return Scope{}, err
		}
		for _, f := range []struct {
			name string
			dst  *[]string
		}{{"in_scope", &s.InScope}, {"out_of_scope", &s.OutOfScope}} {
			if raw, present := ex[f.name]; present {
				list, ok := jsonv.Strings(raw)
				if !ok {
					return Scope{}, invalid("scope.examples.%s is a list of example requests (§5.2)", f.name)
				}
				*f.dst = list
			}
		}
	}
	if s.Grade, err = readGrade(m, "scope"); err != nil {
		return Scope{}, err
	}
	return s, nil
}

// Input timing (§5.3).
const (
	WhenPerTask  = "per_task"
	WhenStanding = "standing"
)

// Input is one thing the client furnishes: a per-task or standing input of
// a media type, or a standing shared resource the provider may only read
// (and must not copy, crawl or retain beyond the task).
type Input struct {
	Name      string
	MediaType string
	Shared    bool
	When      string
}

var mediaTypeRE = regexp.MustCompile(`^[a-z0-9][a-z0-9!#$&^_.+-]*/[a-z0-9][a-z0-9!#$&^_.+-]*$`)

// InputsFromValue shape-checks the inputs list (§5.3). A missing per-task
// input moves a task to input_required with a problem report; it neither
// fails nor is attempted silently.
func InputsFromValue(v any) ([]Input, error) {
	list, ok := jsonv.Array(v)
	if !ok {
		return nil, invalid("inputs is a list of what the client furnishes (§5.3)")
	}
	out := make([]Input, 0, len(list))
	for _, item := range list {
		m, err := object(item, "each input is an object (§5.3)")
		if err != nil {
			return nil, err
		}
		var in Input
		if in.Name, ok = jsonv.Text(m["name"], 120); !ok {
			return nil, invalid("each input has a name (§5.3)")
		}
		if kind, present := m["kind"]; present {
			if err := unknown(m, "a shared resource input", "name", "kind", "access", "when"); err != nil {
				return nil, err
			}
			if kind != "shared_resource" || m["access"] != "read" || m["when"] != WhenStanding {
				return nil, invalid("a shared resource input is {name, kind: shared_resource, access: read, when: standing} (§5.3)")
			}
			in.Shared, in.When = true, WhenStanding
		} else {
			if err := unknown(m, "an input", "name", "media_type", "when"); err != nil {
				return nil, err
			}
			if in.MediaType, _ = m["media_type"].(string); !mediaTypeRE.MatchString(in.MediaType) {
				return nil, invalid("input %q names its media type (§5.3)", in.Name)
			}
			if in.When, _ = m["when"].(string); in.When != WhenPerTask && in.When != WhenStanding {
				return nil, invalid("input %q is furnished per_task or standing (§5.3)", in.Name)
			}
		}
		for _, prev := range out {
			if prev.Name == in.Name {
				return nil, invalid("two inputs are named %q (§5.3)", in.Name)
			}
		}
		out = append(out, in)
	}
	return out, nil
}

// Deliverables (§5.4): form is machine-judged (a completion missing a named
// per-task artifact in its declared media type is a failed task), quality
// is not; interim due dates are evidence.
type Deliverables struct {
	PerTask []Deliverable
	Interim []Deliverable
	Grade   Grade
}

// Deliverable is one named artifact.
type Deliverable struct {
	Name      string
	MediaType string
	// Due or DueByDay (monthly recurrence) for an interim deliverable.
	Due      string
	DueByDay int64
	// Rights (§5.4.1, recorded) and Acceptance (§5.4.2, evidence) are
	// stated per deliverable; absent rights grant nothing.
	Rights     *Rights
	Acceptance *Acceptance
}

// Rights in a delivered artifact.
type Rights struct {
	Exclusivity                        string
	Modify, Redistribute, SelfOperable *bool
}

// Acceptance names the test before the work starts.
type Acceptance struct {
	TestSetDigest           string
	TestSetRef              string
	Withheld                bool
	Measure                 string
	MinFraction             float64
	DeemedAcceptedAfterDays int64
}

var testDigestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// DeliverablesFromValue shape-checks the deliverables clause.
func DeliverablesFromValue(v any) (Deliverables, error) {
	m, err := object(v, "deliverables is an object {per_task?, interim?, grade} (§5.4)")
	if err != nil {
		return Deliverables{}, err
	}
	if err := unknown(m, "deliverables", "per_task", "interim", "grade"); err != nil {
		return Deliverables{}, err
	}
	var d Deliverables
	for _, f := range []struct {
		name    string
		interim bool
		dst     *[]Deliverable
	}{{"per_task", false, &d.PerTask}, {"interim", true, &d.Interim}} {
		raw, present := m[f.name]
		if !present {
			continue
		}
		list, ok := jsonv.Array(raw)
		if !ok {
			return Deliverables{}, invalid("deliverables.%s is a list (§5.4)", f.name)
		}
		for _, item := range list {
			dl, err := deliverable(item, f.interim)
			if err != nil {
				return Deliverables{}, err
			}
			*f.dst = append(*f.dst, dl)
		}
	}
	if d.Grade, err = readGrade(m, "deliverables"); err != nil {
		return Deliverables{}, err
	}
	return d, nil
}

func deliverable(v any, interim bool) (Deliverable, error) {
	m, err := object(v, "each deliverable is an object {name, media_type, ...} (§5.4)")
	if err != nil {
		return Deliverable{}, err
	}
	known := []string{"name", "media_type", "rights", "acceptance"}
	if interim {
		known = append(known, "due", "recurrence")
	}
	if err := unknown(m, "a deliverable", known...); err != nil {
		return Deliverable{}, err
	}
	var d Deliverable
	var ok bool
	if d.Name, ok = jsonv.Text(m["name"], 120); !ok {
		return Deliverable{}, invalid("each deliverable has a name (§5.4)")
	}
	if d.MediaType, _ = m["media_type"].(string); !mediaTypeRE.MatchString(d.MediaType) {
		return Deliverable{}, invalid("deliverable %q names its media type: form is machine-judged (§5.4)", d.Name)
	}
	if interim {
		due, hasDue := m["due"]
		rec, hasRec := m["recurrence"]
		switch {
		case hasDue == hasRec:
			return Deliverable{}, invalid("interim deliverable %q carries either a due instant or a recurrence (§5.4)", d.Name)
		case hasDue:
			d.Due, _ = due.(string)
			if _, err := protocol.ParseTime(d.Due); err != nil {
				return Deliverable{}, invalid("interim deliverable %q: due is an RFC 3339 instant (§5.4)", d.Name)
			}
		default:
			r, err := object(rec, "a recurrence is an object {every: month, due_by_day} (§5.4)")
			if err != nil {
				return Deliverable{}, err
			}
			if err := unknown(r, "a recurrence", "every", "due_by_day"); err != nil {
				return Deliverable{}, err
			}
			d.DueByDay, ok = jsonv.PosInt(r["due_by_day"])
			if r["every"] != "month" || !ok || d.DueByDay > 28 {
				return Deliverable{}, invalid("a recurrence is every month, due by a day from 1 to 28 (every month has it) (§5.4)")
			}
		}
	}
	if raw, present := m["rights"]; present {
		if d.Rights, err = rights(raw); err != nil {
			return Deliverable{}, err
		}
	}
	if raw, present := m["acceptance"]; present {
		if d.Acceptance, err = acceptance(raw); err != nil {
			return Deliverable{}, err
		}
	}
	return d, nil
}

func rights(v any) (*Rights, error) {
	m, err := object(v, "rights is an object (§5.4.1)")
	if err != nil {
		return nil, err
	}
	if err := unknown(m, "rights", "exclusivity", "modify", "redistribute", "self_operable", "grade"); err != nil {
		return nil, err
	}
	r := &Rights{}
	if raw, present := m["exclusivity"]; present {
		switch r.Exclusivity, _ = raw.(string); r.Exclusivity {
		case "non_exclusive", "exclusive", "work_for_hire":
		default:
			return nil, invalid("rights.exclusivity is non_exclusive, exclusive or work_for_hire (§5.4.1)")
		}
	}
	for _, f := range []struct {
		name string
		dst  **bool
	}{{"modify", &r.Modify}, {"redistribute", &r.Redistribute}, {"self_operable", &r.SelfOperable}} {
		if raw, present := m[f.name]; present {
			b, ok := raw.(bool)
			if !ok {
				return nil, invalid("rights.%s is a boolean (§5.4.1)", f.name)
			}
			*f.dst = &b
		}
	}
	if err := flatGrade(m, Recorded, "rights are graded recorded: no runtime can stop a provider reselling something (§5.4.1)"); err != nil {
		return nil, err
	}
	return r, nil
}

func acceptance(v any) (*Acceptance, error) {
	m, err := object(v, "acceptance is an object (§5.4.2)")
	if err != nil {
		return nil, err
	}
	if err := unknown(m, "acceptance", "test_set", "measure", "threshold", "deemed_accepted_after_days", "grade"); err != nil {
		return nil, err
	}
	a := &Acceptance{}
	ts, err := object(m["test_set"], "acceptance.test_set is an object {digest, ref?, withheld?} (§5.4.2)")
	if err != nil {
		return nil, err
	}
	if err := unknown(ts, "acceptance.test_set", "digest", "ref", "withheld"); err != nil {
		return nil, err
	}
	if a.TestSetDigest, _ = ts["digest"].(string); !testDigestRE.MatchString(a.TestSetDigest) {
		return nil, invalid("the test set is committed by digest, sha256:<64 lowercase hex> (§5.4.2)")
	}
	if raw, present := ts["withheld"]; present {
		var ok bool
		if a.Withheld, ok = raw.(bool); !ok {
			return nil, invalid("test_set.withheld is a boolean (§5.4.2)")
		}
	}
	if a.TestSetRef, err = optText(ts, "ref", 512, "test_set.ref is a non-blank reference (§5.4.2)"); err != nil {
		return nil, err
	}
	if a.TestSetRef == "" && !a.Withheld {
		return nil, invalid("a test set that is not withheld carries its ref (§5.4.2)")
	}
	var ok bool
	if a.Measure, ok = jsonv.Text(m["measure"], 300); !ok {
		return nil, invalid("acceptance.measure says what is measured, in words (§5.4.2)")
	}
	th, err := object(m["threshold"], "acceptance.threshold is an object {min_fraction} (§5.4.2)")
	if err != nil {
		return nil, err
	}
	if err := unknown(th, "acceptance.threshold", "min_fraction"); err != nil {
		return nil, err
	}
	if a.MinFraction, ok = th["min_fraction"].(float64); !ok || a.MinFraction <= 0 || a.MinFraction > 1 {
		return nil, invalid("threshold.min_fraction is a fraction above 0 and at most 1 (§5.4.2)")
	}
	if raw, present := m["deemed_accepted_after_days"]; present {
		if a.DeemedAcceptedAfterDays, ok = jsonv.PosInt(raw); !ok {
			return nil, invalid("deemed_accepted_after_days is a positive whole number of days; absent, silence is not acceptance (§5.4.2)")
		}
	}
	if err := flatGrade(m, Evidence, "acceptance is graded evidence: running the test is somebody's claim unless a trusted third party runs it (§5.4.2)"); err != nil {
		return nil, err
	}
	return a, nil
}

// Volume limits the client's traffic under the engagement (§5.6),
// replacing the provider's per-stranger limits; excess is refused with a
// retry time, never held.
type Volume struct {
	PerHour, PerDay int64
	Grade           Grade
}

// VolumeFromValue shape-checks the volume clause: one or both windows,
// positive whole counts.
func VolumeFromValue(v any) (Volume, error) {
	m, err := object(v, "volume is an object {per_hour?, per_day?, grade} (§5.6)")
	if err != nil {
		return Volume{}, err
	}
	if err := unknown(m, "volume", "per_hour", "per_day", "grade"); err != nil {
		return Volume{}, err
	}
	var vol Volume
	for _, f := range []struct {
		name string
		dst  *int64
	}{{"per_hour", &vol.PerHour}, {"per_day", &vol.PerDay}} {
		if raw, present := m[f.name]; present {
			var ok bool
			if *f.dst, ok = jsonv.PosInt(raw); !ok {
				return Volume{}, invalid("volume.%s is a positive whole number of requests (§5.6)", f.name)
			}
		}
	}
	if vol.PerHour == 0 && vol.PerDay == 0 {
		return Volume{}, invalid("a volume clause states per_hour, per_day or both: one stating neither bounds nothing (§5.6)")
	}
	if vol.Grade, err = readGrade(m, "volume"); err != nil {
		return Volume{}, err
	}
	return vol, nil
}

// Termination is the termination clause (§5.9): notice for convenience;
// for cause it ends at once.
type Termination struct {
	ConvenienceNoticeHours int64
	Grade                  Grade
}

// TerminationFromValue shape-checks the termination clause.
func TerminationFromValue(v any) (Termination, error) {
	m, err := object(v, "termination is an object {convenience_notice_hours, grade} (§5.9)")
	if err != nil {
		return Termination{}, err
	}
	if err := unknown(m, "termination", "convenience_notice_hours", "grade"); err != nil {
		return Termination{}, err
	}
	var t Termination
	var ok bool
	if t.ConvenienceNoticeHours, ok = jsonv.NonNegInt(m["convenience_notice_hours"]); !ok {
		return Termination{}, invalid("convenience_notice_hours is a non-negative whole number of hours (§5.9)")
	}
	if t.Grade, err = readGrade(m, "termination"); err != nil {
		return Termination{}, err
	}
	return t, nil
}
