package sow

import (
	"fmt"
	"math/big"
	"slices"

	"agentmesh.dev/mesh/shared/jsonv"
)

// Reporting levels (§5.12), ordinal: the rank is derived from the level
// string, never declared, and the test is meets or exceeds.
const (
	RecordsOnly = "records_only"
	OnChange    = "on_change"
	CheckIns    = "check_ins"
)

// DefaultLevel is what a document with no reporting clause offers: the
// mechanical record (task states, deliveries, spend) and nothing else.
const DefaultLevel = RecordsOnly

// ReportingGrade is the reporting clause's grade, flatly: whether a report
// arrived is mechanical and both runtimes must record a miss (more than
// recorded); no runtime can make a provider look honestly at its own work
// (less than enforced).
const ReportingGrade = Evidence

// Levels lists the levels in ascending order.
func Levels() []string { return []string{RecordsOnly, OnChange, CheckIns} }

// LevelRank is the level's rank, -1 for a string that is not a level.
func LevelRank(level string) int { return slices.Index(Levels(), level) }

// Meets reports whether offered meets or exceeds required.
func Meets(offered, required string) bool {
	o, r := LevelRank(offered), LevelRank(required)
	return o >= 0 && r >= 0 && o >= r
}

// Backstops of the reporting clause.
const (
	MaxAdditions     = 10
	MaxAdditionChars = 300
	msPerDay         = 86_400_000
)

// Reporting is the reporting clause.
type Reporting struct {
	Level     string
	Every     string // check_ins only
	EveryMS   int64
	Additions []string
}

// ReportingFromValue shape-checks the clause: the level from the closed
// three (no default inside a declared clause), the grade evidence, every
// required at check_ins (without a calendar a missed report cannot be
// detected) and refused below it, and additions 1-10 non-blank sentences
// of at most 300 characters.
func ReportingFromValue(v any) (Reporting, error) {
	m, err := object(v, "the reporting clause is an object carrying level and grade, not a bare level (§5.12)")
	if err != nil {
		return Reporting{}, err
	}
	if err := unknown(m, "the reporting clause", "level", "every", "additions", "grade"); err != nil {
		return Reporting{}, err
	}
	var r Reporting
	if r.Level, _ = m["level"].(string); LevelRank(r.Level) < 0 {
		return Reporting{}, invalid("the reporting level is records_only, on_change or check_ins; the rank is derived, never declared (§5.12)")
	}
	if err := flatGrade(m, ReportingGrade, "the reporting clause is graded evidence, flatly: not enforced (no runtime can make a provider look honestly at its own work) and not recorded (detecting the report that did not arrive is a must) (§5.12, §4.2)"); err != nil {
		return Reporting{}, err
	}
	raw, present := m["every"]
	switch {
	case r.Level == CheckIns && !present:
		return Reporting{}, invalid("check_ins is the level with a calendar: without every, a missed report is undetectable (§5.12)")
	case r.Level != CheckIns && present:
		return Reporting{}, invalid("only check_ins carries every: on_change has no calendar and records_only owes nothing beyond the mechanical record (§5.12)")
	case present:
		s, ok := raw.(string)
		if !ok {
			return Reporting{}, invalid("every is an ISO 8601 duration string (§5.12)")
		}
		if r.EveryMS, err = DurationMillis(s); err != nil {
			return Reporting{}, err
		}
		r.Every = s
	}
	if r.Additions, err = proseList(m, "additions", MaxAdditions, MaxAdditionChars, "additions"); err != nil {
		return Reporting{}, err
	}
	return r, nil
}

// DurationMillis reads the one duration grammar of the system (§5.12,
// reused by §5.14): an ISO 8601 duration of fixed-length spans only, weeks
// (standing alone) or days then a T and hours, minutes, seconds in that
// order, whole units of at most six digits each, uppercase, not zero.
// Months and years are refused by name: a calendar month is not a fixed
// span of time.
func DurationMillis(s string) (int64, error) {
	bad := func() (int64, error) {
		return 0, invalid("%q is not a duration in whole weeks, days, hours, minutes or seconds such as P1W, P3D or PT12H (§5.12)", s)
	}
	if len(s) < 2 || s[0] != 'P' {
		return bad()
	}
	var total int64
	inTime, weeks, seen, timeSeen := false, false, false, false
	last := 0 // 1 D, 2 H, 3 M, 4 S: components come in ISO order
	for i := 1; i < len(s); {
		if s[i] == 'T' {
			if inTime || weeks {
				return bad()
			}
			inTime = true
			i++
			continue
		}
		j := i
		for j < len(s) && s[j] >= '0' && s[j] <= '9' {
			j++
		}
		if j == i || j-i > 6 || j >= len(s) {
			return bad()
		}
		var n int64
		for _, c := range s[i:j] {
			n = n*10 + int64(c-'0')
		}
		unit := s[j]
		switch {
		case !inTime && unit == 'W':
			if seen {
				return 0, invalid("an ISO 8601 week term stands alone: state the cadence in weeks, or in days and time (§5.12)")
			}
			weeks = true
			total += n * 7 * msPerDay
		case !inTime && unit == 'D':
			if weeks || last > 0 {
				return bad()
			}
			last = 1
			total += n * msPerDay
		case !inTime && (unit == 'M' || unit == 'Y'):
			return 0, invalid("a calendar month or year is not a fixed span of time, so a duration stated in one is not computed the same way twice; use weeks, days or hours (§5.12)")
		case inTime && (unit == 'H' || unit == 'M' || unit == 'S'):
			order, ms := 2, int64(3_600_000)
			switch unit {
			case 'M':
				order, ms = 3, 60_000
			case 'S':
				order, ms = 4, 1000
			}
			if order <= last {
				return bad()
			}
			last = order
			total += n * ms
			timeSeen = true
		default:
			return bad()
		}
		seen = true
		i = j + 1
	}
	if !seen || (inTime && !timeSeen) {
		return bad()
	}
	if total == 0 {
		return 0, invalid("a duration of zero is no duration at all (§5.12)")
	}
	return total, nil
}

// ReportingShortfall is the advisory comparison a mandate shows (§5.12):
// "" when doc (a decoded document) offers at least required, else the
// sentence both implementations produce. Three facts get three sentences:
// declared lower, declared nothing, declared something unreadable. A
// requirement of records_only is the floor every document meets, even one
// whose clause is malformed: validity is a question for validation, not
// for this comparison.
func ReportingShortfall(required string, doc any) string {
	if required == DefaultLevel {
		return ""
	}
	m, _ := jsonv.Object(doc)
	raw := m["reporting"]
	if raw == nil {
		return fmt.Sprintf("the required reporting level is %s and this document declares no reporting clause, which offers records_only, the mechanical record only; the test is meets or exceeds, and it does not meet (§5.12)", required)
	}
	r, err := ReportingFromValue(raw)
	if err != nil {
		return fmt.Sprintf("the required reporting level is %s and this document's reporting clause is in a shape that cannot be read, so what it offers cannot be established; it is counted as not meeting rather than passed unread (§5.12)", required)
	}
	if Meets(r.Level, required) {
		return ""
	}
	return fmt.Sprintf("the required reporting level is %s and this document offers %s; the test is meets or exceeds, and it does not meet (§5.12)", required, r.Level)
}

// CadenceWarns is §5.12's "cadence follows the money": true when a
// check-in interval is not shorter than the time in which the remaining cap
// could be spent at spendPerDay, that is every * spend >= cap * day, in
// exact wide integers. A runtime may warn on it and must never refuse over
// it; with no calendar, no cap left or no burn there is nothing to derive.
func CadenceWarns(r Reporting, capRemaining, spendPerDay int64) bool {
	if r.Level != CheckIns || r.EveryMS <= 0 || capRemaining <= 0 || spendPerDay <= 0 {
		return false
	}
	lhs := new(big.Int).Mul(big.NewInt(r.EveryMS), big.NewInt(spendPerDay))
	rhs := new(big.Int).Mul(big.NewInt(capRemaining), big.NewInt(msPerDay))
	return lhs.Cmp(rhs) >= 0
}

// CadenceWarning is the advisory sentence for CadenceWarns, "" when it does
// not warn.
func CadenceWarning(r Reporting, capRemaining, spendPerDay int64) string {
	if !CadenceWarns(r, capRemaining, spendPerDay) {
		return ""
	}
	return fmt.Sprintf("at %d per day, the remaining cap of %d can be spent within one reporting interval of %s; the money can be gone before the next check-in arrives (§5.12: cadence follows the money); this is a warning, never a refusal",
		spendPerDay, capRemaining, r.Every)
}
