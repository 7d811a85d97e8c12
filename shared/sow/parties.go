package sow

import (
	"regexp"
	"slices"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/jsonv"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// Agent Mandate references (§6.2).
var (
	organizationRE = regexp.MustCompile(`^org_[A-Za-z0-9_-]{1,64}$`)
	mandateRE      = regexp.MustCompile(`^mnd_[A-Za-z0-9_-]{1,64}$`)
)

// Bounds of the labels a party carries (backstops, not policy).
const (
	maxHandle = 120
	maxOwner  = 120
)

// Party is a seat (§5.1): the agent that works (matched on its key, the
// transport identity), the owner who signs, and labels for people.
// Organization is the §6.2 Agent Mandate reference, additive.
type Party struct {
	Agent        string
	Handle       string
	Owner        string
	Organization string
}

var partyMembers = []string{"agent", "handle", "owner", "organization"}

// PartyFromValue shape-checks a seat: agent an agent public key, owner
// named (owners sign, agents work: a seat with no owner binds nobody),
// handle a non-blank label, organization an org_ reference.
func PartyFromValue(v any) (Party, error) {
	m, err := object(v, "a party is an object {agent, owner, handle?, organization?} (§5.1)")
	if err != nil {
		return Party{}, err
	}
	if err := unknown(m, "a party", partyMembers...); err != nil {
		return Party{}, err
	}
	return partyFrom(m)
}

func partyFrom(m map[string]any) (Party, error) {
	var p Party
	if p.Agent, _ = m["agent"].(string); !keys.IsUserPublicKey(p.Agent) {
		return Party{}, invalid("a party names its agent's public key: formation and traffic are matched on the key (§5.1)")
	}
	var ok bool
	if p.Owner, ok = jsonv.Text(m["owner"], maxOwner); !ok {
		return Party{}, invalid("a party names its owner: owners sign, agents work, and a seat with no owner binds nobody (§5.1, §6)")
	}
	var err error
	if p.Handle, err = optText(m, "handle", maxHandle, "a party's handle is a non-blank label of at most 120 characters"); err != nil {
		return Party{}, err
	}
	if raw, present := m["organization"]; present {
		if p.Organization, _ = raw.(string); !organizationRE.MatchString(p.Organization) {
			return Party{}, invalid("organization is an Agent Mandate organization reference, org_... (§6.2)")
		}
	}
	return p, nil
}

// OfferedTo is the one party a directed standing proposal names (§12.1.1):
// beside the seats, inside the signed bytes, with its own lapse and grade.
type OfferedTo struct {
	Party
	// ExpiresAt is the lapse; "" when the offer states none, and then no
	// runtime can tell when it lapses, so formation is refused.
	ExpiresAt string
	// Grade is the clause's own grade; "" when not stated.
	Grade Grade
}

// OfferedToFromValue shape-checks the §12.1.1 clause: exactly one party,
// named directly (a list, even of one, is an access control list rather
// than an offer, and two named parties countersigning the same bytes is a
// race formation has no rule for), validated as a seat, with expires_at an
// RFC 3339 instant and grade from the closed set when present.
func OfferedToFromValue(v any) (OfferedTo, error) {
	if list, isList := jsonv.Array(v); isList {
		if len(list) == 1 {
			return OfferedTo{}, invalid("offered_to names its one party directly, not as a list of one (§12.1.1)")
		}
		return OfferedTo{}, invalid("offered_to names exactly one party: a list of permitted signers is an access control list rather than an offer (§12.1.1)")
	}
	m, err := object(v, "offered_to is a party object (§12.1.1)")
	if err != nil {
		return OfferedTo{}, err
	}
	if err := unknown(m, "offered_to", slices.Concat(partyMembers, []string{"expires_at", "grade"})...); err != nil {
		return OfferedTo{}, err
	}
	var o OfferedTo
	if o.Party, err = partyFrom(m); err != nil {
		return OfferedTo{}, err
	}
	if raw, present := m["expires_at"]; present {
		o.ExpiresAt, _ = raw.(string)
		if _, err := protocol.ParseTime(o.ExpiresAt); err != nil {
			return OfferedTo{}, invalid("offered_to.expires_at must be an RFC 3339 instant: two runtimes have to agree on the moment the offer ends (§12.1.1)")
		}
	}
	if raw, present := m["grade"]; present {
		g, _ := raw.(string)
		if !Grade(g).Valid() {
			return OfferedTo{}, invalid("offered_to carries its own grade: enforced, evidence or recorded (§4.2)")
		}
		o.Grade = Grade(g)
	}
	return o, nil
}

// Refusal is the §12.1.1 formation gate for a completed instance whose
// client seat names clientAgent, at now: nil when the offer is open to that
// agent, else a FORBIDDEN refusal naming the restriction. An offer stating
// no expiry is refused (a runtime that cannot tell when a directed offer
// lapses refuses rather than reading it as unbounded); the lapse instant
// itself is closed; the match is on the agent key, never the handle.
func (o OfferedTo) Refusal(clientAgent string, now time.Time) *errs.Error {
	who := o.Handle
	if who == "" {
		who = o.Owner
	}
	if o.ExpiresAt == "" {
		return restriction("this offer names one counterparty and states no expiry, so nothing in it says when it ends; formation is refused rather than reading the offer as unbounded (§12.1.1)")
	}
	exp, err := protocol.ParseTime(o.ExpiresAt)
	if err != nil || !now.Before(exp) {
		return restriction("this offer was made to one named party and lapsed at " + o.ExpiresAt + "; a lapsed offer stays readable, but nothing forms under it (§12.1.1)")
	}
	if clientAgent != o.Agent {
		return restriction("this offer names " + who + " as the one party entitled to countersign it, and the client seat names a different agent key; only the named party may form under a directed standing proposal (§12.1.1)")
	}
	return nil
}

func restriction(msg string) *errs.Error {
	return errs.New(errs.Forbidden, msg).WithDetail("restriction", "offered_to")
}

// DirectedRefusal is OfferedTo.Refusal over an undecoded clause (nil: the
// document offers to the market, and nothing stands in the way). A clause
// that does not read is refused, never read as absent: that is how an
// access list nobody meant to write becomes an offer to the market.
func DirectedRefusal(offeredTo any, clientAgent string, now time.Time) *errs.Error {
	if offeredTo == nil {
		return nil
	}
	o, err := OfferedToFromValue(offeredTo)
	if err != nil {
		return restriction("this document names a counterparty in a shape that cannot be read, so who may form under it cannot be established: " + errs.As(err).Message)
	}
	return o.Refusal(clientAgent, now)
}

// Parties is the parties clause: the provider seat, the client seat (nil
// until formation fills it), the optional directed-offer clause, and the
// clause's grade.
type Parties struct {
	Provider  Party
	Client    *Party
	OfferedTo *OfferedTo
	Grade     Grade
}

// PartiesFromValue shape-checks the parties clause.
func PartiesFromValue(v any) (Parties, error) {
	m, err := object(v, "parties is an object {provider, client, offered_to?, grade} (§5.1)")
	if err != nil {
		return Parties{}, err
	}
	if err := unknown(m, "parties", "provider", "client", "offered_to", "grade"); err != nil {
		return Parties{}, err
	}
	var p Parties
	if p.Provider, err = PartyFromValue(m["provider"]); err != nil {
		return Parties{}, err
	}
	raw, present := m["client"]
	if !present {
		return Parties{}, invalid("parties.client is required: a seat, or null until formation fills it (§5.1)")
	}
	if raw != nil {
		c, err := PartyFromValue(raw)
		if err != nil {
			return Parties{}, err
		}
		p.Client = &c
	}
	if raw, present := m["offered_to"]; present && raw != nil {
		o, err := OfferedToFromValue(raw)
		if err != nil {
			return Parties{}, err
		}
		p.OfferedTo = &o
	}
	if p.Grade, err = readGrade(m, "parties"); err != nil {
		return Parties{}, err
	}
	return p, nil
}

// Directed reports whether a parties clause (decoded) names its
// counterparty. A directed proposal yields no public listing and its scope
// examples are never indexed, lapsed or not: directedness is a fact about
// the offer, read without interpreting prose.
func Directed(parties any) bool {
	m, ok := jsonv.Object(parties)
	return ok && m["offered_to"] != nil
}

// ListingAllowed reports whether a public listing may be derived from a
// standing proposal with this parties clause: never from a directed one.
func ListingAllowed(parties any) bool { return !Directed(parties) }
