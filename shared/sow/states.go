package sow

import "slices"

// Document states (§7.1).
const (
	StateTemplate          = "template"
	StateStandingProposal  = "standing_proposal"
	StateAgreed            = "agreed"
	StateActive            = "active"
	StateAmendmentProposed = "amendment_proposed"
	StateAmended           = "amended"
	StateExhausted         = "exhausted"
	StateLapsed            = "lapsed"
	StateTerminated        = "terminated"
)

// States lists every document state.
func States() []string {
	return []string{StateTemplate, StateStandingProposal, StateAgreed, StateActive, StateAmendmentProposed,
		StateAmended, StateExhausted, StateLapsed, StateTerminated}
}

// EndStates are the three ways an engagement ends. Identical at the gate:
// the counterparty reverts to general admission.
func EndStates() []string { return []string{StateExhausted, StateLapsed, StateTerminated} }

// IsEnd reports whether state ends the engagement.
func IsEnd(state string) bool { return slices.Contains(EndStates(), state) }

// AdmitsWork reports whether runtimes apply the engagement in state: only
// active.
func AdmitsWork(state string) bool { return state == StateActive }

// Scored reports whether an engagement ending in state is scored: an
// exhausted (the cap ran out, not a failure) or terminated one is recorded
// unscored.
func Scored(state string) bool { return state != StateExhausted && state != StateTerminated }
