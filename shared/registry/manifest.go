package registry

import (
	"maps"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// Visibility values (upstream §2.2).
const (
	VisibilityPublic   = "public"
	VisibilityUnlisted = "unlisted"
	VisibilityPrivate  = "private"
)

// TierSandbox is the trust tier of guest registrations.
const TierSandbox = "sandbox"

// Bounds on what one manifest may carry.
const (
	maxListItems = 256
	maxStringLen = 4096
)

var (
	availabilityClasses = map[string]bool{"always_on": true, "intermittent": true, "on_demand": true}
	visibilities        = map[string]bool{VisibilityPublic: true, VisibilityUnlisted: true, VisibilityPrivate: true}
	interactions        = map[string]bool{"service": true, "interactive": true}
)

// record is what mesh_registry stores under the agent id: the manifest as
// the agent sent it, plus what the registry adds (sandbox, the clamped
// visibility, registered_at, updated_at, vouch_expires_at, endpoint). It
// is kept as generic JSON so members the registry does not interpret
// survive untouched.
type record map[string]any

func (r record) str(k string) string { s, _ := r[k].(string); return s }

func (r record) id() string { return r.str("id") }

func (r record) sandbox() bool { b, _ := r["sandbox"].(bool); return b }

func (r record) visibility() string {
	if v := r.str("visibility"); v != "" {
		return v
	}
	return VisibilityPublic
}

func (r record) nodeObj() map[string]any { m, _ := r["node"].(map[string]any); return m }

func (r record) nodeID() string { s, _ := r.nodeObj()["id"].(string); return s }

// profile reads a node-profile member (trust_tier, availability_class,
// reachability, role) from the manifest's top level, else from its node
// object, where a node profile may also carry it.
func (r record) profile(k string) string {
	if s := r.str(k); s != "" {
		return s
	}
	s, _ := r.nodeObj()[k].(string)
	return s
}

func (r record) time(k string) (time.Time, bool) {
	t, err := protocol.ParseTime(r.str(k))
	return t, err == nil
}

// stamped is a copy of r carrying the live availability.
func (r record) stamped(availability string) map[string]any {
	out := maps.Clone(map[string]any(r))
	out["availability"] = availability
	return out
}

// manifest is a validated registration.
type manifest struct {
	rec     record
	id      string
	node    string
	vouch   protocol.Vouch
	sandbox bool
	skus    []commerce.SKU
}

func invalid(format string, args ...any) error {
	return errs.Newf(errs.InvalidManifest, format, args...)
}

// parseManifest checks a register payload sent by from at now and builds
// the record to store: shape (INVALID_MANIFEST), id == from
// (IDENTITY_MISMATCH), then the vouch (its signature: IDENTITY_MISMATCH;
// its validity window, expired included: UNAUTHORIZED), then the owner
// attestation and the SKUs (INVALID_MANIFEST, commerce.go). Whether it is
// sandbox is decided after, by the caller (file), and so is whether a
// sandbox may publish its SKUs (sellable).
func parseManifest(payload any, from string, now time.Time) (*manifest, error) {
	m, ok := payload.(map[string]any)
	if !ok {
		return nil, invalid("the register payload must be the manifest object")
	}
	id, ok := m["id"].(string)
	if !ok || !keys.IsUserPublicKey(id) {
		return nil, invalid("id must be the agent's public key (U followed by 55 base32 characters)")
	}
	if id != from {
		return nil, errs.New(errs.IdentityMismatch, "the manifest id is not the key that signed the registration")
	}
	if name, ok := m["name"].(string); !ok || strings.TrimSpace(name) == "" {
		return nil, invalid("name must be a non-empty string")
	} else if len(name) > maxStringLen {
		return nil, invalid("name is longer than %d bytes", maxStringLen)
	}
	for _, k := range []string{"description", "version", "protocol_version", "trust_tier", "encryption_key"} {
		if err := optString(m, k); err != nil {
			return nil, err
		}
	}
	if ep, present := m["endpoint"]; present && ep != nil && ep != protocol.InboxSubject(id) {
		return nil, invalid("endpoint must be %s", protocol.InboxSubject(id))
	}
	if err := optEnum(m, "visibility", visibilities); err != nil {
		return nil, err
	}
	if err := optEnum(m, "availability_class", availabilityClasses); err != nil {
		return nil, err
	}
	if err := optEnum(m, "interaction", interactions); err != nil {
		return nil, err
	}
	for _, k := range []string{"capabilities", "tags"} {
		if err := optStrings(m, k); err != nil {
			return nil, err
		}
	}
	for _, k := range []string{"offerings", "skills"} {
		if err := optOfferings(m, k); err != nil {
			return nil, err
		}
	}
	if err := optLimits(m); err != nil {
		return nil, err
	}
	for _, k := range []string{"public", "meta"} {
		if v, present := m[k]; present && v != nil {
			if _, ok := v.(map[string]any); !ok {
				return nil, invalid("%s must be an object", k)
			}
		}
	}

	node, ok := m["node"].(map[string]any)
	if !ok {
		return nil, invalid("node must be an object {id, attestation}")
	}
	nodeID, ok := node["id"].(string)
	if !ok || !keys.IsUserPublicKey(nodeID) {
		return nil, invalid("node.id must be the node's public key")
	}
	for _, k := range []string{"trust_tier", "availability_class", "role", "reachability"} {
		if err := optString(node, k); err != nil {
			return nil, invalid("node.%s must be a string", k)
		}
	}
	if err := optDevice(node); err != nil {
		return nil, err
	}
	if _, present := node["attestation"]; !present {
		return nil, invalid("node.attestation (the node's vouch) is required")
	}
	v, err := protocol.VouchFromValue(node["attestation"])
	if err != nil {
		return nil, err
	}
	if v.Agent != id {
		return nil, invalid("node.attestation vouches for agent %s, not for this manifest's id", v.Agent)
	}
	if v.Node != nodeID {
		return nil, invalid("node.attestation is signed by node %s, not by node.id", v.Node)
	}
	if err := v.Verify(now); err != nil {
		return nil, err
	}
	expires, _ := protocol.ParseTime(v.ExpiresAt) // Verify parsed it
	owner, ownerUntil, err := parseOwner(m, id, nodeID, expires, now)
	if err != nil {
		return nil, err
	}
	skus, err := parseSKUs(m, record(m))
	if err != nil {
		return nil, err
	}

	rec := record(maps.Clone(m))
	rec[MemberOwner] = owner
	delete(rec, MemberOwnerExpiresAt) // the registry's to say, never the sender's
	if owner != "" {
		rec[MemberOwnerExpiresAt] = protocol.FormatTime(ownerUntil)
	}
	rec["endpoint"] = protocol.InboxSubject(id)
	rec["vouch_expires_at"] = protocol.FormatTime(expires)
	rec["updated_at"] = protocol.FormatTime(now)
	delete(rec, "availability") // a live stamp, never stored
	delete(rec, "registered_at")
	return &manifest{rec: rec, id: id, node: nodeID, vouch: v, skus: skus}, nil
}

// declaresSandbox: the manifest or its node profile says trust_tier
// "sandbox". A sender may always put itself in the sandbox, never take
// itself out.
func (m *manifest) declaresSandbox() bool { return m.rec.profile("trust_tier") == TierSandbox }

// file records the registry's decision on m: a sandbox registration is
// trust_tier "sandbox", and public (or unset) visibility is clamped to
// unlisted; any other defaults to public.
func (m *manifest) file(sandbox bool) {
	vis := m.rec.str("visibility")
	if sandbox {
		m.rec["trust_tier"] = TierSandbox
		if vis == "" || vis == VisibilityPublic {
			vis = VisibilityUnlisted
		}
	} else if vis == "" {
		vis = VisibilityPublic
	}
	m.rec["visibility"] = vis
	m.rec["sandbox"] = sandbox
	m.sandbox = sandbox
	if sandbox {
		// A guest's key is nobody's once its lease ends, and so is every
		// agent it vouches for: a sandbox registration has no owner, so it
		// holds no agreement and no credits, whatever it attested.
		m.rec[MemberOwner] = ""
		delete(m.rec, MemberOwnerExpiresAt)
	}
}

// sellable refuses a sandbox registration that publishes a paid SKU: a
// guest's lease ends and its key is nobody's, so nobody could answer for
// what it charged. Free SKUs state terms only and stay allowed.
func (m *manifest) sellable() error {
	if !m.sandbox {
		return nil
	}
	if id := m.paidSKU(); id != "" {
		return invalid("SKU %s is paid, and a sandbox (guest) registration may not sell: publish it from an account's node, or make it free", id)
	}
	return nil
}

func optString(m map[string]any, k string) error {
	v, present := m[k]
	if !present || v == nil {
		return nil
	}
	s, ok := v.(string)
	if !ok {
		return invalid("%s must be a string", k)
	}
	if len(s) > maxStringLen {
		return invalid("%s is longer than %d bytes", k, maxStringLen)
	}
	return nil
}

func optEnum(m map[string]any, k string, allowed map[string]bool) error {
	v, present := m[k]
	if !present || v == nil {
		return nil
	}
	if s, ok := v.(string); !ok || !allowed[s] {
		return invalid("%s must be one of %s", k, strings.Join(sortedKeys(allowed), ", "))
	}
	return nil
}

func optStrings(m map[string]any, k string) error {
	v, present := m[k]
	if !present || v == nil {
		return nil
	}
	if _, ok := stringList(v); !ok {
		return invalid("%s must be an array of at most %d non-empty strings", k, maxListItems)
	}
	return nil
}

// stringList reads an array of non-empty strings.
func stringList(v any) ([]string, bool) {
	a, ok := v.([]any)
	if !ok || len(a) > maxListItems {
		return nil, false
	}
	out := make([]string, 0, len(a))
	for _, x := range a {
		s, ok := x.(string)
		if !ok || s == "" || len(s) > maxStringLen {
			return nil, false
		}
		out = append(out, s)
	}
	return out, true
}

func optOfferings(m map[string]any, k string) error {
	v, present := m[k]
	if !present || v == nil {
		return nil
	}
	a, ok := v.([]any)
	if !ok || len(a) > maxListItems {
		return invalid("%s must be an array of at most %d objects {id, name, ...}", k, maxListItems)
	}
	for i, x := range a {
		o, ok := x.(map[string]any)
		if !ok {
			return invalid("%s[%d] must be an object {id, name, ...}", k, i)
		}
		if id, ok := o["id"].(string); !ok || id == "" || len(id) > maxStringLen {
			return invalid("%s[%d].id must be a non-empty string", k, i)
		}
		if err := optString(o, "name"); err != nil {
			return invalid("%s[%d].name must be a string", k, i)
		}
		if err := optString(o, "description"); err != nil {
			return invalid("%s[%d].description must be a string", k, i)
		}
		for _, f := range []string{"tags", "input_modes", "output_modes"} {
			if err := optStrings(o, f); err != nil {
				return invalid("%s[%d].%s must be an array of strings", k, i, f)
			}
		}
	}
	return nil
}

// Device fields a node declares in node.device (the strings an adapter's
// check-in carries, upstream-notes §9), at most maxDeviceLen bytes each.
var deviceFields = []string{"kind", "host", "platform"}

const maxDeviceLen = 80

// optDevice checks node.device: absent, or an object whose device fields
// are strings of at most maxDeviceLen bytes. Other members are kept, not
// listed.
func optDevice(node map[string]any) error {
	v, present := node["device"]
	if !present || v == nil {
		return nil
	}
	d, ok := v.(map[string]any)
	if !ok {
		return invalid("node.device must be an object {kind?, host?, platform?}")
	}
	for _, k := range deviceFields {
		if x, present := d[k]; present && x != nil {
			if s, ok := x.(string); !ok || len(s) > maxDeviceLen {
				return invalid("node.device.%s must be a string of at most %d bytes", k, maxDeviceLen)
			}
		}
	}
	return nil
}

// device is the node's declared device fields, nil when it declares none.
func (r record) device() map[string]string {
	d, _ := r.nodeObj()["device"].(map[string]any)
	var out map[string]string
	for _, k := range deviceFields {
		if s, _ := d[k].(string); s != "" {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = s
		}
	}
	return out
}

// capacity is the node profile's capacity as declared (its shape is the
// node's), at the top level else in node; nil when absent.
func (r record) capacity() any {
	if v := r["capacity"]; v != nil {
		return v
	}
	return r.nodeObj()["capacity"]
}

func optLimits(m map[string]any) error {
	v, present := m["limits"]
	if !present || v == nil {
		return nil
	}
	o, ok := v.(map[string]any)
	if !ok {
		return invalid("limits must be an object")
	}
	if x, present := o["max_inbound_chars"]; present && x != nil {
		n, ok := x.(float64)
		if !ok || n < 0 || n != float64(int64(n)) {
			return invalid("limits.max_inbound_chars must be a non-negative integer")
		}
	}
	return nil
}

// offeringIDs are the ids of the manifest's offerings (and of its skills,
// the older name).
func (r record) offeringIDs() []string {
	var ids []string
	for _, k := range []string{"offerings", "skills"} {
		a, _ := r[k].([]any)
		for _, x := range a {
			if o, ok := x.(map[string]any); ok {
				if id, ok := o["id"].(string); ok {
					ids = append(ids, id)
				}
			}
		}
	}
	return ids
}

// tagSet is the manifest's tags together with its offerings' tags.
func (r record) tagSet() map[string]bool {
	set := map[string]bool{}
	add := func(v any) {
		l, _ := stringList(v)
		for _, s := range l {
			set[s] = true
		}
	}
	add(r["tags"])
	for _, k := range []string{"offerings", "skills"} {
		a, _ := r[k].([]any)
		for _, x := range a {
			if o, ok := x.(map[string]any); ok {
				add(o["tags"])
			}
		}
	}
	return set
}

func (r record) capabilitySet() map[string]bool {
	set := map[string]bool{}
	l, _ := stringList(r["capabilities"])
	for _, s := range l {
		set[s] = true
	}
	return set
}
