// Package metering is the shape of usage (upstream spec §13.5, §19.2;
// conformance fixture metering.json): meter events, the (meter,
// envelope_id) fold that makes redelivery harmless, and the usage receipt a
// responder attaches to its respond as payload.usage.
//
// Two classes of meter exist and the class is a trust statement. Observed
// meters are counted by the platform from traffic it carried (a closed set:
// requests, responses, events, bytes_in, bytes_out, tasks_completed,
// task_ms). Declared meters are the responder's own claims (tokens_out,
// tool_calls, ...) carried in a receipt the envelope signature already
// covers: the signature proves who claimed the quantity, not that it is
// true. A declared meter may never use an observed name, or a claim would
// be laundered as an observation.
//
// Quantities are non-negative integers in the meter's own unit; a meter that
// needs fractions has the wrong unit. What a quantity costs is rating, in
// package commerce.
package metering

import (
	"regexp"
	"slices"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/jsonv"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// Meter classes.
const (
	Observed = "observed"
	Declared = "declared"
)

// The observed meters: the closed set a metering deployment must be able to
// produce from the traffic it carries.
const (
	Requests       = "requests"
	Responses      = "responses"
	Events         = "events"
	BytesIn        = "bytes_in"
	BytesOut       = "bytes_out"
	TasksCompleted = "tasks_completed"
	TaskMS         = "task_ms"
)

var observed = []string{Requests, Responses, Events, BytesIn, BytesOut, TasksCompleted, TaskMS}

// ObservedMeters returns the observed set, in the order the specification
// lists it.
func ObservedMeters() []string { return slices.Clone(observed) }

// IsObserved reports whether name is an observed meter.
func IsObserved(name string) bool { return slices.Contains(observed, name) }

// NamePattern is the grammar of every meter name.
const NamePattern = `^[a-z0-9_]{1,64}$`

var nameRE = regexp.MustCompile(NamePattern)

// ValidName reports whether name is a well-formed meter name.
func ValidName(name string) bool { return nameRE.MatchString(name) }

func invalid(format string, args ...any) *errs.Error {
	return errs.Newf(errs.InvalidEnvelope, "meter event: "+format, args...)
}

// Event is one meter event: quantity units of meter, attributed to both
// sides (provider is the responding agent, consumer the requester), derived
// from the envelope envelope_id. (Meter, EnvelopeID) is its idempotency key.
// A refusal is recorded as a requests event of quantity 0 carrying the
// refusal code: a record, never a charge.
type Event struct {
	Meter       string `json:"meter"`
	Class       string `json:"class"`
	Quantity    int64  `json:"quantity"`
	Refused     bool   `json:"refused,omitempty"`
	RefusalCode string `json:"refusal_code,omitempty"`
	Provider    string `json:"provider"`
	Consumer    string `json:"consumer"`
	Offering    string `json:"offering,omitempty"`
	TaskID      string `json:"task_id,omitempty"`
	EnvelopeID  string `json:"envelope_id"`
	TS          string `json:"ts"`
}

var eventMembers = []string{"meter", "class", "quantity", "refused", "refusal_code", "provider", "consumer",
	"offering", "task_id", "envelope_id", "ts"}

// ParseEvent shape-checks one event given as JSON text.
func ParseEvent(data []byte) (Event, error) {
	v, err := protocol.ParseJSON(data)
	if err != nil {
		return Event{}, errs.Wrap(errs.InvalidEnvelope, "meter event is not valid JSON", err)
	}
	return EventFromValue(v)
}

// EventFromValue shape-checks a decoded event. It refuses, as
// INVALID_ENVELOPE: a member this version does not know; a meter name
// outside [a-z0-9_]{1,64}; a class other than observed or declared; an
// observed event on a meter outside the observed set, or a declared one on
// a name inside it; a quantity that is not a non-negative integer; a
// refusal with a quantity other than 0 or without its refusal_code, or a
// refusal_code on an event that is not a refusal; provider or consumer
// missing or not an agent key; an empty envelope_id (the idempotency key);
// and a ts that is not an RFC 3339 instant.
func EventFromValue(v any) (Event, error) {
	m, ok := jsonv.Object(v)
	if !ok {
		return Event{}, invalid("must be a JSON object")
	}
	if k, bad := jsonv.Unknown(m, eventMembers...); bad {
		return Event{}, invalid("unknown member %q", k)
	}
	var e Event
	e.Meter, _ = m["meter"].(string)
	if !ValidName(e.Meter) {
		return Event{}, invalid("meter must match %s", NamePattern)
	}
	switch e.Class, _ = m["class"].(string); e.Class {
	case Observed:
		if !IsObserved(e.Meter) {
			return Event{}, invalid("%q is not an observed meter; the platform observes only %v", e.Meter, observed)
		}
	case Declared:
		if IsObserved(e.Meter) {
			return Event{}, invalid("declared meter %q collides with an observed meter: the class is a trust statement, and a collision launders a claim as an observation", e.Meter)
		}
	default:
		return Event{}, invalid("class must be %q or %q", Observed, Declared)
	}
	if e.Quantity, ok = jsonv.NonNegInt(m["quantity"]); !ok {
		return Event{}, invalid("quantity must be a non-negative integer in the meter's unit")
	}
	if rv, present := m["refused"]; present {
		if rv != true {
			return Event{}, invalid("refused, when present, is the literal true")
		}
		e.Refused = true
	}
	if rc, present := m["refusal_code"]; present {
		s, ok := rc.(string)
		if !ok || s == "" || !e.Refused {
			return Event{}, invalid("refusal_code is a non-empty error code, carried only by a refusal event")
		}
		e.RefusalCode = s
	}
	if e.Refused && (e.Quantity != 0 || e.RefusalCode == "") {
		return Event{}, invalid("a refusal event carries quantity 0 and its refusal_code: it is a record, never a charge")
	}
	for _, f := range []struct {
		name string
		dst  *string
	}{{"provider", &e.Provider}, {"consumer", &e.Consumer}} {
		s, _ := m[f.name].(string)
		if !keys.IsUserPublicKey(s) {
			return Event{}, invalid("%s must be an agent public key: an event is attributed to both sides", f.name)
		}
		*f.dst = s
	}
	for _, f := range []struct {
		name string
		dst  *string
	}{{"offering", &e.Offering}, {"task_id", &e.TaskID}} {
		if raw, present := m[f.name]; present {
			s, ok := raw.(string)
			if !ok || s == "" {
				return Event{}, invalid("%s, when present, is a non-empty string", f.name)
			}
			*f.dst = s
		}
	}
	if e.EnvelopeID, _ = m["envelope_id"].(string); e.EnvelopeID == "" {
		return Event{}, invalid("envelope_id is required: it is the idempotency key, and an event without one cannot be deduplicated")
	}
	e.TS, _ = m["ts"].(string)
	if _, err := protocol.ParseTime(e.TS); err != nil {
		return Event{}, invalid("ts must be an RFC 3339 instant")
	}
	return e, nil
}

// Key is an event's idempotency key.
type Key struct{ Meter, EnvelopeID string }

// Key returns the event's idempotency key.
func (e Event) Key() Key { return Key{e.Meter, e.EnvelopeID} }

// Ledger folds a stream of events into per-meter totals, counting each
// (meter, envelope_id) once: a redelivered event is the same fact, and when
// two events share a key the first one wins (the same rule as equal budget
// revisions). The same envelope under two meters is two facts.
type Ledger struct {
	seen   map[Key]struct{}
	totals map[string]int64
}

// NewLedger returns an empty ledger.
func NewLedger() *Ledger {
	return &Ledger{seen: map[Key]struct{}{}, totals: map[string]int64{}}
}

// Add counts e unless its key was seen; it reports whether e was counted.
func (l *Ledger) Add(e Event) bool {
	k := e.Key()
	if _, dup := l.seen[k]; dup {
		return false
	}
	l.seen[k] = struct{}{}
	l.totals[e.Meter] += e.Quantity
	return true
}

// Totals returns a copy of the per-meter totals.
func (l *Ledger) Totals() map[string]int64 {
	out := make(map[string]int64, len(l.totals))
	for k, v := range l.totals {
		out[k] = v
	}
	return out
}

// Fold is a one-shot Ledger over events.
func Fold(events []Event) map[string]int64 {
	l := NewLedger()
	for _, e := range events {
		l.Add(e)
	}
	return l.Totals()
}

// RefusalEvent is the record of a request refused at admission (for
// example AGREEMENT_REQUIRED): an observed requests event of quantity 0
// carrying the refusal code, so refusals rate to zero but stay on record.
func RefusalEvent(provider, consumer, offering, envelopeID, ts, code string) Event {
	return Event{Meter: Requests, Class: Observed, Refused: true, RefusalCode: code, Provider: provider,
		Consumer: consumer, Offering: offering, EnvelopeID: envelopeID, TS: ts}
}
