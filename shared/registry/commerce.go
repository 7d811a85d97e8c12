package registry

import (
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// The commerce members of a manifest (issue 18, docs/commerce.md "SKUs in
// the manifest and the owner of an agent").
const (
	// MemberOwner is the owner key the registry records: the attested
	// owner, else the hosting node (node.id).
	MemberOwner = "owner"
	// MemberOwnerAttestation is the owner's vouch-shaped statement
	// {node: <owner key>, agent, issued_at, expires_at, sig}, signed by
	// the owner key under the vouch tag.
	MemberOwnerAttestation = "owner_attestation"
	// MemberSKUs is the manifest's array of SKUs (commerce.SKUsFromValue).
	MemberSKUs = "skus"
)

// OwnerOf is the owner of the agent a registry record describes: its
// owner member, or the hosting node's key for a record written before the
// registry recorded owners.
func OwnerOf(rec map[string]any) string {
	r := record(rec)
	if o := r.str(MemberOwner); o != "" {
		return o
	}
	return r.nodeID()
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

func (r record) owner() string { return OwnerOf(r) }

// parseOwner decides the owner the registry records for agent id hosted on
// nodeID. With owner_attestation, it is the key that signed it, and only
// after the attestation verifies at now (a bad or expired one refuses the
// manifest); an owner member, when sent too, must name that same key.
// Without one, the owner is the hosting node whatever owner the sender
// wrote: an unattested claim of ownership is rewritten, not believed.
func parseOwner(m map[string]any, id, nodeID string, now time.Time) (string, error) {
	av, present := m[MemberOwnerAttestation]
	if !present || av == nil {
		return nodeID, nil
	}
	v, err := protocol.VouchFromValue(av)
	if err != nil {
		return "", invalid("owner_attestation must be {node: <owner key>, agent, issued_at, expires_at, sig}: %s",
			strings.TrimPrefix(errs.As(err).Message, "vouch: "))
	}
	if v.Agent != id {
		return "", invalid("owner_attestation is for agent %s, not for this manifest's id", v.Agent)
	}
	if claimed, present := m[MemberOwner]; present && claimed != nil && claimed != v.Node {
		return "", invalid("owner must be %s, the key that signed owner_attestation", v.Node)
	}
	if expires, err := protocol.ParseTime(v.ExpiresAt); err == nil && now.After(expires) {
		return "", invalid("owner_attestation expired at %s; the owner must sign a new one", protocol.FormatTime(expires))
	}
	if err := v.Verify(now); err != nil {
		if errs.CodeOf(err) == errs.IdentityMismatch {
			return "", invalid("owner_attestation is not signed by its owner key %s", v.Node)
		}
		return "", invalid("owner_attestation: %s", strings.TrimPrefix(errs.As(err).Message, "vouch "))
	}
	return v.Node, nil
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
