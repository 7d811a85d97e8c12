package registry

import (
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// The commerce members of a manifest (issue 18, docs/commerce.md "SKUs in
// the manifest and the owner of an agent").
const (
	// MemberOwner is the owner key the registry records: the attested
	// owner, else the hosting node (node.id); "" when the agent has none
	// (a sandbox registration, or an agent that would be its own owner).
	MemberOwner = "owner"
	// MemberOwnerExpiresAt is when the recorded owner stops being the
	// agent's owner: the owner attestation's expires_at, or the node
	// vouch's when that comes first (the node's own ownership ends with
	// its vouch).
	MemberOwnerExpiresAt = "owner_expires_at"
	// MemberOwnerAttestation is the owner's vouch-shaped statement
	// {node: <owner key>, agent, issued_at, expires_at, sig}, signed by
	// the owner key under its own tag, protocol.TagOwner.
	MemberOwnerAttestation = "owner_attestation"
	// MemberSKUs is the manifest's array of SKUs (commerce.SKUsFromValue).
	MemberSKUs = "skus"
)

// OwnerOf is the owner of the agent a registry record describes, at now,
// and the only way to read it: every reader (admission, agreements,
// engagement seats, the console, the adapter) asks here, so the rules
// below hold everywhere. "" means the agent has no owner: no agreement
// covers its requests, it has no credits and no listing rights.
//
//   - A sandbox (guest) record has no owner: its key is nobody's once
//     its lease ends.
//   - The owner is the record's owner member; a record written before the
//     registry recorded owners has none and is read as its node's.
//   - An agent key is never its own owner (a self-hosted agent with no
//     attestation, node.id == id, or an attestation naming the agent).
//   - The owner lasts until owner_expires_at and not an instant longer:
//     once the attestation has expired the answer is "", never the node.
//     A record with an owner other than its node but no owner_expires_at
//     was not written by this registry and is not believed; a node owner
//     without one lasts while the node's vouch does.
func OwnerOf(rec map[string]any, now time.Time) string {
	r := record(rec)
	if r.sandbox() {
		return ""
	}
	owner := r.nodeID()
	v, present := r[MemberOwner]
	if present {
		owner, _ = v.(string)
	}
	if !keys.IsUserPublicKey(owner) || owner == r.id() {
		return ""
	}
	until, ok := r.time(MemberOwnerExpiresAt)
	if _, stamped := r[MemberOwnerExpiresAt]; !stamped {
		if owner != r.nodeID() {
			return ""
		}
		until, ok = r.time("vouch_expires_at")
		if _, vouched := r["vouch_expires_at"]; !vouched {
			ok, until = true, now
		}
	}
	if !ok || now.After(until) {
		return ""
	}
	return owner
}

// SKUsOf reads the SKUs of a registry record (none when it publishes none).
// The registry validated them at register, so an error means the record
// was not written by this registry.
func SKUsOf(rec map[string]any) ([]commerce.SKU, error) {
	v, present := rec[MemberSKUs]
	if !present || v == nil {
		return nil, nil
	}
	return commerce.SKUsFromValue(v)
}

func (r record) owner(now time.Time) string { return OwnerOf(r, now) }

// parseOwner decides the owner the registry records for agent id hosted on
// nodeID, and until when: vouchExpires bounds both, since a record lives
// no longer than its node's vouch. With owner_attestation, the owner is
// the key that signed it (under protocol.TagOwner, never the vouch's tag),
// and only after the attestation verifies at now (a bad or expired one
// refuses the manifest), until the sooner of its expiry and the vouch's;
// an owner member, when sent too, must name that same key. Without one,
// the owner is the hosting node whatever owner the sender wrote: an
// unattested claim of ownership is rewritten, not believed. An agent key
// is never an owner: when the owner would be id itself (a self-hosted
// agent, or an attestation it signed for itself) there is none ("").
func parseOwner(m map[string]any, id, nodeID string, vouchExpires, now time.Time) (string, time.Time, error) {
	owner, until := nodeID, vouchExpires
	if av, present := m[MemberOwnerAttestation]; present && av != nil {
		v, err := protocol.OwnerAttestationFromValue(av)
		if err != nil {
			return "", time.Time{}, invalid("owner_attestation must be {node: <owner key>, agent, issued_at, expires_at, sig}: %s",
				strings.TrimPrefix(errs.As(err).Message, "owner attestation: "))
		}
		if v.Agent != id {
			return "", time.Time{}, invalid("owner_attestation is for agent %s, not for this manifest's id", v.Agent)
		}
		if claimed, present := m[MemberOwner]; present && claimed != nil && claimed != v.Owner() {
			return "", time.Time{}, invalid("owner must be %s, the key that signed owner_attestation", v.Owner())
		}
		expires, err := protocol.ParseTime(v.ExpiresAt)
		if err == nil && now.After(expires) {
			return "", time.Time{}, invalid("owner_attestation expired at %s; the owner must sign a new one", protocol.FormatTime(expires))
		}
		if err := v.Verify(now); err != nil {
			if errs.CodeOf(err) == errs.IdentityMismatch {
				return "", time.Time{}, invalid("owner_attestation is not signed by its owner key %s under %s", v.Owner(), protocol.TagOwner)
			}
			return "", time.Time{}, invalid("owner_attestation: %s", strings.TrimPrefix(errs.As(err).Message, "owner attestation "))
		}
		owner = v.Owner()
		if expires.Before(until) {
			until = expires
		}
	}
	if owner == id {
		return "", time.Time{}, nil
	}
	return owner, until, nil
}

// parseSKUs checks the manifest's skus with commerce.SKUsFromValue (its
// refusal, INVALID_MANIFEST, is passed on as it is) and that every
// offering a SKU names is one of the manifest's offerings: a price for an
// offering nobody can call is a mistake, not a storefront.
func parseSKUs(m map[string]any, rec record) ([]commerce.SKU, error) {
	v, present := m[MemberSKUs]
	if !present || v == nil {
		return nil, nil
	}
	if a, ok := v.([]any); ok && len(a) > maxListItems {
		return nil, invalid("skus holds %d SKUs; at most %d are allowed", len(a), maxListItems)
	}
	skus, err := commerce.SKUsFromValue(v)
	if err != nil {
		return nil, err
	}
	offered := map[string]bool{}
	for _, o := range rec.offeringIDs() {
		offered[o] = true
	}
	for _, s := range skus {
		for _, o := range s.Covers.Offerings {
			if !offered[o] {
				return nil, invalid("SKU %s covers offering %q, which is not one of this manifest's offerings", s.ID, o)
			}
		}
	}
	return skus, nil
}

// paidSKU is the first SKU that charges anything, "" when all are free.
func (m *manifest) paidSKU() string {
	for _, s := range m.skus {
		if s.Price.Paid() {
			return s.ID
		}
	}
	return ""
}
