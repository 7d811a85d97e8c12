package allowance

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"agentmesh.dev/mesh/shared/protocol"
)

// Receipt is what `allowance show` reports: the stored document, whether it
// is enforced as written, and where each ceiling stands.
type Receipt struct {
	// Present is false when there is no allowance file: no allowance,
	// every invocation admitted.
	Present bool
	// Verified is true when the document is enforced as written: it parsed,
	// its signature verifies, it governs this agent and the owner signed it.
	Verified bool
	// Reason says why a present document fails closed ("" when Verified).
	Reason string
	// Document is the stored document as parsed, signed or not; zero when
	// the file could not be read or parsed.
	Document protocol.Allowance
	// Day is the UTC day key day ceilings are reported for.
	Day string
	// Ceilings lists the document's ceilings in document order.
	Ceilings []CeilingStatus
	// LedgerError is set when the spend ledger cannot be read; every
	// ceiling then counts as exhausted.
	LedgerError string
}

// CeilingStatus is one ceiling with the spend accounted to it.
type CeilingStatus struct {
	protocol.Ceiling
	// Key is the ledger key the ceiling is charged against now: the day key
	// for a day ceiling, the task_id or context_id of a narrowed ceiling.
	// It is "" for a ceiling that applies to each task (or context)
	// separately; such a ceiling has no single spend to report.
	Key string
	// SpentMicro is the spend accounted to Key in the document's currency.
	SpentMicro int64
	// RemainingMicro is what admission may still use: 0 for every ceiling
	// when the document fails closed or the ledger cannot be read.
	RemainingMicro int64
}

// Show reports the stored allowance at now. Nothing here is an error to
// return: a missing, unreadable or unverifiable file and an unreadable
// ledger are all states the receipt describes, the same ones Admit acts on.
func (s *Store) Show(now time.Time) Receipt {
	p, present, readErr := s.load()
	r := Receipt{Present: present, Day: protocol.DayKey(now)}
	if !present {
		return r
	}
	doc, verified := p.Document()
	r.Document, r.Verified = doc, verified && readErr == nil
	r.Reason = failReason(p, readErr)
	l, err := readLedger(s.ledgerPath())
	if err != nil {
		r.LedgerError = err.Error()
	}
	for _, c := range doc.Ceilings {
		r.Ceilings = append(r.Ceilings, r.status(c, l))
	}
	return r
}

// status places one ceiling: its key for today, its spend (l nil when the
// ledger is unreadable) and its remainder.
func (r Receipt) status(c protocol.Ceiling, l *ledger) CeilingStatus {
	st := CeilingStatus{Ceiling: c, Key: chargeKey(c, r.Day)}
	if l != nil && st.Key != "" {
		st.SpentMicro = l.lookup(r.Document.CostModel.Currency).SpentMicro(c.Scope, st.Key)
	}
	if r.Verified && l != nil {
		st.RemainingMicro = protocol.CeilingSpend{Ceiling: c, SpentMicro: st.SpentMicro}.Remaining()
	}
	return st
}

// chargeKey is the ledger key c is charged against on day, as
// Policy.Admit chooses it: "" when that depends on the task or context of
// the work being admitted.
func chargeKey(c protocol.Ceiling, day string) string {
	switch c.Scope {
	case protocol.ScopeTask:
		return c.TaskID
	case protocol.ScopeContext:
		return c.ContextID
	case protocol.ScopeDay:
		return day
	}
	return ""
}

// Text renders the receipt for people, one ceiling a line. Money is shown
// with protocol.FormatMicro, never through a float.
func (r Receipt) Text() string {
	var b strings.Builder
	if !r.Present {
		b.WriteString("allowance: none; every invocation is admitted\n")
		b.WriteString("set one with: allowance set <amount> --per-1k-tokens <price>\n")
		return b.String()
	}
	if r.Verified {
		b.WriteString("allowance: verified\n")
	} else {
		fmt.Fprintf(&b, "allowance: FAILS CLOSED: %s\n", r.Reason)
		b.WriteString("every ceiling counts as exhausted until `allowance set` signs a new document\n")
	}
	if r.LedgerError != "" {
		fmt.Fprintf(&b, "spend ledger: UNREADABLE: %s\nevery ceiling counts as exhausted until the ledger is repaired\n", r.LedgerError)
	}
	if r.Document.V == 0 {
		return b.String() // nothing parsed to describe
	}
	if !r.Verified {
		b.WriteString("stored document (untrusted, shown for diagnosis only):\n")
	}
	d := r.Document
	fmt.Fprintf(&b, "agent: %s\nowner: %s\nupdated: %s\n", d.Agent, d.OwnerKey, d.UpdatedAt)
	fmt.Fprintf(&b, "price: %s %s per 1,000 tokens\n", protocol.FormatMicro(d.CostModel.Per1kTokensMicro), d.CostModel.Currency)
	fmt.Fprintf(&b, "on exhausted: %s\n", exhaustedText(d.OnExhausted))
	fmt.Fprintf(&b, "ceilings (UTC day %s):\n", r.Day)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  scope\tapplies to\tceiling\tspent\tremaining")
	for _, c := range r.Ceilings {
		spent := "-"
		if c.Key != "" {
			spent = money(c.SpentMicro, d.CostModel.Currency)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", c.Scope, appliesTo(c), money(c.AmountMicro, d.CostModel.Currency),
			spent, money(c.RemainingMicro, d.CostModel.Currency))
	}
	_ = tw.Flush() // writes to a strings.Builder cannot fail
	return b.String()
}

func money(micro int64, currency string) string {
	return protocol.Money{AmountMicro: micro, Currency: currency}.String()
}

func exhaustedText(mode string) string {
	switch mode {
	case protocol.OnExhaustedAskOwner:
		return "ask-owner (work that does not fit is held for the owner)"
	case protocol.OnExhaustedRefuse:
		return "refuse (BUDGET_INSUFFICIENT at admission)"
	}
	return mode
}

// appliesTo says in words what work a ceiling covers.
func appliesTo(c CeilingStatus) string {
	var s string
	switch {
	case c.Scope == protocol.ScopeTask && c.TaskID != "":
		s = "task " + c.TaskID
	case c.Scope == protocol.ScopeTask:
		s = "each task"
	case c.Scope == protocol.ScopeContext && c.ContextID != "":
		s = "context " + c.ContextID
	case c.Scope == protocol.ScopeContext:
		s = "each context"
	default:
		s = "day " + c.Key
	}
	if c.Scope != protocol.ScopeContext && c.ContextID != "" {
		s += " in context " + c.ContextID
	}
	if c.Scope != protocol.ScopeTask && c.TaskID != "" {
		s += " in task " + c.TaskID
	}
	return s
}
