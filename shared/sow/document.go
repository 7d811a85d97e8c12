package sow

import (
	"regexp"
	"slices"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/jsonv"
	"agentmesh.dev/mesh/shared/protocol"
)

// DocumentVersion is the sow member of every document this code reads.
const DocumentVersion = "v1"

// MaxDocumentBytes bounds an engagement document as received.
const MaxDocumentBytes = 256 << 10

var (
	idShapeRE   = regexp.MustCompile(`^sow_[0-9a-z]{1,60}$`)
	sha256HexLC = regexp.MustCompile(`^[0-9a-f]{64}$`)
)

// Language names the standard contract language the document renders with
// (§4.3): a renderer that does not know the version says so and shows the
// signed fields verbatim.
type Language struct {
	ID      string
	Version int64
	SHA256  string
}

// Document is an engagement document as received: its exact bytes, its
// decoded value (what signatures cover) and every clause, validated.
// Optional clauses are nil when absent; absence states nothing, and no
// reader invents a default for it (reporting excepted: absent offers the
// mechanical record, DefaultLevel).
type Document struct {
	Raw   []byte
	Value map[string]any

	ID         string
	Version    int64
	StartsAt   string // "" while null (a template or standing proposal)
	EndsAt     string // "" while null
	TermMonths int64
	Language   *Language

	Parties         Parties
	Scope           Scope
	Inputs          []Input
	Deliverables    *Deliverables
	Price           Price
	Volume          *Volume
	ChangeControl   ChangeControl
	Termination     Termination
	Disputes        *Disputes
	Confidentiality *Confidentiality
	Reporting       *Reporting
	Qualifications  Qualifications
	Liability       *Liability
	ServiceFloors   *ServiceFloors
	Subcontracting  *Subcontracting
	Signatures      []Signature
}

var documentMembers = []string{"sow", "id", "version", "starts_at", "ends_at", "term_months", "language",
	"parties", "scope", "inputs", "deliverables", "price", "volume", "change_control", "termination",
	"disputes", "confidentiality", "reporting", "qualifications", "liability", "service_floors",
	"subcontracting", "signatures"}

// Parse reads an engagement document from the exact bytes received, which
// it keeps: signed documents are stored as received, never re-encoded.
func Parse(data []byte) (*Document, error) {
	if len(data) > MaxDocumentBytes {
		return nil, invalid("the document is %d bytes; at most %d", len(data), MaxDocumentBytes)
	}
	v, err := protocol.ParseJSON(data)
	if err != nil {
		return nil, errs.Wrap(errs.InvalidEnvelope, "engagement document is not valid JSON", err)
	}
	d, err := FromValue(v)
	if err != nil {
		return nil, err
	}
	d.Raw = data
	return d, nil
}

// FromValue validates a decoded document: every member known, every clause
// by its family's rules, and the rules that cross clauses: a filled client
// seat comes with its term (starts_at and ends_at), ends_at after
// starts_at, a fixed fee priced only for offerings in scope, a reservation
// window that does not outlast the term, and at most one signature per
// role. It does not verify signatures (VerifySignatures) and never
// re-derives the id (§4.1.1: the signature, which covers it, is the
// commitment).
func FromValue(v any) (*Document, error) {
	m, err := object(v, "an engagement document is a JSON object (§4)")
	if err != nil {
		return nil, err
	}
	if err := unknown(m, "the document", documentMembers...); err != nil {
		return nil, err
	}
	d := &Document{Value: m}
	if m["sow"] != DocumentVersion {
		return nil, invalid("sow must be %q", DocumentVersion)
	}
	if d.ID, _ = m["id"].(string); !idShapeRE.MatchString(d.ID) {
		return nil, invalid("id is the minted identifier sow_<lowercase base32> (§4.1)")
	}
	var ok bool
	if d.Version, ok = jsonv.PosInt(m["version"]); !ok {
		return nil, invalid("version is a whole number from 1, one higher with each amendment (§4.1)")
	}
	for _, f := range []struct {
		name string
		dst  *string
	}{{"starts_at", &d.StartsAt}, {"ends_at", &d.EndsAt}} {
		raw, present := m[f.name]
		if !present {
			return nil, invalid("%s is required: an RFC 3339 instant, or null on a template (§5.7)", f.name)
		}
		if raw == nil {
			continue
		}
		*f.dst, _ = raw.(string)
		if _, err := protocol.ParseTime(*f.dst); err != nil {
			return nil, invalid("%s is an RFC 3339 instant or null (§5.7)", f.name)
		}
	}
	if raw, present := m["term_months"]; present {
		if d.TermMonths, ok = jsonv.PosInt(raw); !ok {
			return nil, invalid("term_months is a positive whole number of months")
		}
	}
	if raw, present := m["language"]; present {
		if d.Language, err = language(raw); err != nil {
			return nil, err
		}
	}
	if d.Parties, err = PartiesFromValue(m["parties"]); err != nil {
		return nil, err
	}
	if d.Scope, err = ScopeFromValue(m["scope"]); err != nil {
		return nil, err
	}
	if raw, present := m["price"]; !present {
		return nil, invalid("every engagement declares its price clause with exactly one arrangement (§5.5)")
	} else if d.Price, err = PriceFromValue(raw); err != nil {
		return nil, err
	}
	if d.ChangeControl, err = ChangeControlFromValue(m["change_control"]); err != nil {
		return nil, err
	}
	if d.Termination, err = TerminationFromValue(m["termination"]); err != nil {
		return nil, err
	}
	if err := d.optionalClauses(m); err != nil {
		return nil, err
	}
	if err := d.crossChecks(); err != nil {
		return nil, err
	}
	return d, nil
}

func language(v any) (*Language, error) {
	m, err := object(v, "language is an object {id, version, sha256} (§4.3)")
	if err != nil {
		return nil, err
	}
	if err := unknown(m, "language", "id", "version", "sha256"); err != nil {
		return nil, err
	}
	l := &Language{}
	var ok bool
	if l.ID, ok = jsonv.Text(m["id"], 120); !ok {
		return nil, invalid("language.id names the standard language (§4.3)")
	}
	if l.Version, ok = jsonv.PosInt(m["version"]); !ok {
		return nil, invalid("language.version is a whole number (§4.3)")
	}
	if l.SHA256, _ = m["sha256"].(string); !sha256HexLC.MatchString(l.SHA256) {
		return nil, invalid("language.sha256 is 64 lowercase hex characters (§4.3)")
	}
	return l, nil
}

// optionalClauses reads the clauses a document may omit.
func (d *Document) optionalClauses(m map[string]any) error {
	var err error
	if raw, ok := m["inputs"]; ok {
		if d.Inputs, err = InputsFromValue(raw); err != nil {
			return err
		}
	}
	for _, c := range []struct {
		name string
		read func(any) error
	}{
		{"deliverables", func(v any) error { x, err := DeliverablesFromValue(v); d.Deliverables = &x; return err }},
		{"volume", func(v any) error { x, err := VolumeFromValue(v); d.Volume = &x; return err }},
		{"disputes", func(v any) error { x, err := DisputesFromValue(v); d.Disputes = &x; return err }},
		{"confidentiality", func(v any) error { x, err := ConfidentialityFromValue(v); d.Confidentiality = &x; return err }},
		{"reporting", func(v any) error { x, err := ReportingFromValue(v); d.Reporting = &x; return err }},
		{"qualifications", func(v any) error { x, err := QualificationsFromValue(v); d.Qualifications = x; return err }},
		{"liability", func(v any) error { x, err := LiabilityFromValue(v); d.Liability = &x; return err }},
		{"service_floors", func(v any) error { x, err := ServiceFloorsFromValue(v); d.ServiceFloors = &x; return err }},
		{"subcontracting", func(v any) error { x, err := SubcontractingFromValue(v); d.Subcontracting = &x; return err }},
	} {
		if raw, ok := m[c.name]; ok {
			if err := c.read(raw); err != nil {
				return err
			}
		}
	}
	if raw, ok := m["signatures"]; ok {
		list, ok := jsonv.Array(raw)
		if !ok {
			return invalid("signatures is a list of owner signatures (§6)")
		}
		for _, item := range list {
			s, err := signatureFromValue(item)
			if err != nil {
				return err
			}
			if slices.ContainsFunc(d.Signatures, func(p Signature) bool { return p.Role == s.Role }) {
				return invalid("two %s signatures: each seat signs once over the bytes it agrees to (§6)", s.Role)
			}
			d.Signatures = append(d.Signatures, s)
		}
	}
	return nil
}

func (d *Document) crossChecks() error {
	if d.Parties.Client != nil && (d.StartsAt == "" || d.EndsAt == "") {
		return invalid("a document whose client seat is filled states its term: starts_at and ends_at (§5.7, §12.1)")
	}
	if d.StartsAt != "" && d.EndsAt != "" {
		start, _ := protocol.ParseTime(d.StartsAt)
		end, _ := protocol.ParseTime(d.EndsAt)
		if !end.After(start) {
			return invalid("ends_at must be after starts_at (§5.7)")
		}
		if d.Price.Arrangement == TimeAndMaterials {
			if within, err := ReservationWithinTerm(d.Price.ReservationDays, d.StartsAt, d.EndsAt); err != nil || !within {
				return invalid("the reservation window of %d days extends past ends_at; it must not (§5.5.4)", d.Price.ReservationDays)
			}
		}
	}
	for _, r := range d.Price.Rates {
		if !slices.Contains(d.Scope.Offerings, r.Offering) {
			return invalid("the price names offering %q, which the scope does not list (§5.2, §5.5.1)", r.Offering)
		}
	}
	return nil
}

// VerifySignatures checks every signature the document carries against its
// signed bytes; IDENTITY_MISMATCH on the first that fails.
func (d *Document) VerifySignatures() error {
	for _, s := range d.Signatures {
		if err := VerifySignature(d.Value, s); err != nil {
			return err
		}
	}
	return nil
}

// Signature returns the document's signature for role.
func (d *Document) Signature(role string) (Signature, bool) {
	i := slices.IndexFunc(d.Signatures, func(s Signature) bool { return s.Role == role })
	if i < 0 {
		return Signature{}, false
	}
	return d.Signatures[i], true
}

// Agreed reports whether both seats have signed these exact bytes and both
// signatures verify (§6): one signature, from anyone, has no force.
func (d *Document) Agreed() bool {
	_, p := d.Signature(RoleProvider)
	_, c := d.Signature(RoleClient)
	return p && c && d.Parties.Client != nil && d.VerifySignatures() == nil
}

// Phase is the state a document's own bytes and the clock give it at now
// (§7.1): template (not agreed and not a standing proposal),
// standing_proposal (the provider's verified signature, client seat
// blank), agreed (before starts_at), active, or lapsed (at or after
// ends_at). Amendment, exhaustion and termination are records beside the
// document, not facts in it, so the engagement record decides those.
func (d *Document) Phase(now time.Time) string {
	if !d.Agreed() {
		if s, ok := d.Signature(RoleProvider); ok && d.Parties.Client == nil && VerifySignature(d.Value, s) == nil {
			return StateStandingProposal
		}
		return StateTemplate
	}
	start, _ := protocol.ParseTime(d.StartsAt)
	end, _ := protocol.ParseTime(d.EndsAt)
	switch {
	case now.Before(start):
		return StateAgreed
	case now.Before(end):
		return StateActive
	}
	return StateLapsed
}
