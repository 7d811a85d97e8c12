package protocol

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
)

// Every signed or hashed string of upstream-notes §1.4 other than the
// envelope and the allowance, each with its exact bytes and encoding. Two
// families:
//
//   - tagged JSON objects (vouch, room descriptor, admission roster,
//     agreement, SKU digest): tag + "\n" + canonical JSON minus sig;
//   - plain strings (manifest key claim, PAN pairing, check-in, guest
//     release, node credential) and the PAN card (canonical JSON, no tag).
//
// Verifiers here accept only the tagged forms: the legacy untagged forms
// were a 0.2 transition allowance and this implementation speaks 0.3.
//
// Every Verify* failure is a *errs.Error with code IDENTITY_MISMATCH that
// wraps ErrBadSignature where a signature was actually checked, so callers
// can both render it and test it with errors.Is.

// sigErr wraps a signature failure of one kind of object.
func sigErr(what string, cause error) *errs.Error {
	return errs.Wrap(errs.IdentityMismatch, what+" signature does not verify", cause)
}

// ---------------------------------------------------------------------------
// Vouch (S§4.4): a node's attestation that it hosts an agent.

// MaxVouchLifetime is the longest a vouch may live (spec §2.9: 30 days by
// default). A registration lasts as long as its vouch, so a longer one
// would let a key nobody owns hold a registration that is never reclaimed.
const MaxVouchLifetime = 30 * 24 * time.Hour

// vouchLifetimeSlack absorbs a signer that reads its clock twice for the
// two ends of a 30-day vouch.
const vouchLifetimeSlack = time.Minute

// Vouch is a node→agent attestation, carried in the manifest as
// node.attestation. Timestamps are kept as the strings that were signed.
type Vouch struct {
	Node      string `json:"node"`
	Agent     string `json:"agent"`
	IssuedAt  string `json:"issued_at"`
	ExpiresAt string `json:"expires_at"`
	Sig       string `json:"sig,omitempty"`
}

// vouchKind is one of the two vouch-shaped statements: a node's vouch for
// an agent it hosts, and an owner's attestation that it owns an agent. The
// shape is the same; the tags differ, so a signature made as one never
// verifies as the other (a hosting node's vouch, public in the agent's
// record, must not make that node its owner, and an owner's attestation
// must not make the owner its host).
type vouchKind struct {
	what   string // for messages
	tag    string
	signer string // who signs it, for messages
	renew  string // what the signer must do once it has expired
}

var (
	nodeVouch  = vouchKind{"vouch", TagVouch, "the node must vouch", "the node must re-vouch"}
	ownerVouch = vouchKind{"owner attestation", TagOwner, "the owner must attest", "the owner must sign a new one"}
)

// NewVouch has node attest agent from issued until expires. Times are
// written in the protocol's millisecond UTC form.
func NewVouch(node keys.Signer, agent string, issued, expires time.Time) (Vouch, error) {
	return nodeVouch.new(node, agent, issued, expires)
}

func (k vouchKind) new(signer keys.Signer, agent string, issued, expires time.Time) (Vouch, error) {
	if !keys.IsUserPublicKey(agent) {
		return Vouch{}, fmt.Errorf("%s: agent %q is not a user public key", k.what, agent)
	}
	if !expires.After(issued) {
		return Vouch{}, fmt.Errorf("%s: expires_at must be after issued_at", k.what)
	}
	v := Vouch{Node: signer.Public(), Agent: agent, IssuedAt: FormatTime(issued), ExpiresAt: FormatTime(expires)}
	msg, err := k.signedBytes(v)
	if err != nil {
		return Vouch{}, fmt.Errorf("%s: %w", k.what, err)
	}
	v.Sig = Base64URL.Encode(signer.Sign(msg))
	return v, nil
}

// SignedBytes is TagVouch + "\n" + the canonical vouch without sig.
func (v Vouch) SignedBytes() ([]byte, error) { return nodeVouch.signedBytes(v) }

func (k vouchKind) signedBytes(v Vouch) ([]byte, error) {
	v.Sig = ""
	c, err := Canonical(v)
	if err != nil {
		return nil, err
	}
	return append(append([]byte(k.tag), '\n'), c...), nil
}

// Verify checks the vouch at now: first the node's signature (missing or
// bad: IDENTITY_MISMATCH), then its validity window (UNAUTHORIZED). An
// issued_at up to MaxFutureSkew ahead of now is tolerated, as for envelope
// timestamps, so a node whose clock runs slightly fast can still register;
// expiry has no grace: it is the node's own statement of how long to trust
// it, and at exactly expires_at the vouch is still valid.
func (v Vouch) Verify(now time.Time) error { return nodeVouch.verify(v, now) }

func (k vouchKind) verify(v Vouch, now time.Time) error {
	if v.Sig == "" {
		return errs.Newf(errs.IdentityMismatch, "%s is not signed", k.what)
	}
	msg, err := k.signedBytes(v)
	if err != nil {
		return errs.Wrap(errs.IdentityMismatch, k.what+" cannot be canonicalised for verification", err)
	}
	if err := VerifyString(v.Node, msg, v.Sig, Base64URL); err != nil {
		return sigErr(k.what, err)
	}
	issued, err := ParseTime(v.IssuedAt)
	if err != nil {
		return errs.Newf(errs.Unauthorized, "%s issued_at %q is not an RFC 3339 instant", k.what, v.IssuedAt)
	}
	expires, err := ParseTime(v.ExpiresAt)
	if err != nil {
		return errs.Newf(errs.Unauthorized, "%s expires_at %q is not an RFC 3339 instant", k.what, v.ExpiresAt)
	}
	if !expires.After(issued) {
		return errs.Newf(errs.Unauthorized, "%s expires before it is issued", k.what)
	}
	if expires.Sub(issued) > MaxVouchLifetime+vouchLifetimeSlack {
		return errs.Newf(errs.Unauthorized, "%s lives %s, longer than the %s allowed; %s for at most 30 days",
			k.what, expires.Sub(issued).Round(time.Hour), MaxVouchLifetime, k.signer)
	}
	if issued.Sub(now) > MaxFutureSkew {
		return errs.Newf(errs.Unauthorized, "%s is not valid until %s", k.what, FormatTime(issued))
	}
	if now.After(expires) {
		return errs.Newf(errs.Unauthorized, "%s expired at %s; %s", k.what, FormatTime(expires), k.renew)
	}
	return nil
}

// OwnerAttestation is an owner's statement that it owns an agent, carried
// in the manifest as owner_attestation: the vouch's shape {node: <owner
// key>, agent, issued_at, expires_at, sig}, signed by the owner key under
// its own tag, TagOwner (base64url), never the vouch's.
type OwnerAttestation Vouch

// NewOwnerAttestation has owner attest that it owns agent from issued
// until expires.
func NewOwnerAttestation(owner keys.Signer, agent string, issued, expires time.Time) (OwnerAttestation, error) {
	v, err := ownerVouch.new(owner, agent, issued, expires)
	return OwnerAttestation(v), err
}

// Owner is the owner key: the attestation's node member, its signer.
func (a OwnerAttestation) Owner() string { return a.Node }

// SignedBytes is TagOwner + "\n" + the canonical attestation without sig.
func (a OwnerAttestation) SignedBytes() ([]byte, error) { return ownerVouch.signedBytes(Vouch(a)) }

// Verify checks the attestation at now exactly as Vouch.Verify checks a
// vouch (the same codes, window and 30-day bound), under TagOwner.
func (a OwnerAttestation) Verify(now time.Time) error { return ownerVouch.verify(Vouch(a), now) }

// OwnerAttestationFromValue shape-checks a decoded owner attestation as
// VouchFromValue does a vouch; faults are INVALID_MANIFEST "owner
// attestation: …".
func OwnerAttestationFromValue(v any) (OwnerAttestation, error) {
	out, err := vouchFromValue(v, ownerVouch)
	return OwnerAttestation(out), err
}

var vouchMembers = map[string]bool{"node": true, "agent": true, "issued_at": true, "expires_at": true, "sig": true}

// VouchFromValue shape-checks a decoded vouch. Because a vouch lives in a
// manifest, shape faults are INVALID_MANIFEST: node and agent must be user
// public keys, issued_at and expires_at RFC 3339 strings, sig a string when
// present (a missing sig is Verify's refusal), and no other member, since
// one could not be re-canonicalised from the struct and would only surface
// later as a puzzling signature failure.
func VouchFromValue(v any) (Vouch, error) { return vouchFromValue(v, nodeVouch) }

func vouchFromValue(v any, k vouchKind) (Vouch, error) {
	bad := func(format string, args ...any) (Vouch, error) {
		return Vouch{}, errs.Newf(errs.InvalidManifest, k.what+": "+format, args...)
	}
	m, ok := v.(map[string]any)
	if !ok {
		return bad("must be an object {node, agent, issued_at, expires_at, sig}")
	}
	if k, unknown := unknownMember(m, vouchMembers); unknown {
		return bad("unknown member %q", k)
	}
	var out Vouch
	for _, f := range []struct {
		name string
		dst  *string
		key  bool
	}{{"node", &out.Node, true}, {"agent", &out.Agent, true}, {"issued_at", &out.IssuedAt, false}, {"expires_at", &out.ExpiresAt, false}} {
		s, ok := m[f.name].(string)
		switch {
		case f.key && (!ok || !keys.IsUserPublicKey(s)):
			return bad("%s must be a user public key", f.name)
		case !f.key && !ok:
			return bad("%s must be an RFC 3339 instant string", f.name)
		case !f.key:
			if _, err := ParseTime(s); err != nil {
				return bad("%s %q is not an RFC 3339 instant", f.name, s)
			}
		}
		*f.dst = s
	}
	if sv, present := m["sig"]; present {
		s, ok := sv.(string)
		if !ok {
			return bad("sig must be a string")
		}
		out.Sig = s
	}
	return out, nil
}

// ---------------------------------------------------------------------------
// Manifest key claim (S§8.3): binds an agent id to its X25519 key.

// ManifestKeyClaim returns the claim bytes
//
//	agentmesh-manifest-key-v1 LF issued_at LF id LF encryption_key
//
// Always four components with no trailing LF of their own: an empty
// encryption key (the agent publishes none, which is itself signed) leaves
// the bytes ending with the separator. A component containing a line feed
// is refused, since it would make two different claims share bytes;
// issued_at and id must be non-empty.
func ManifestKeyClaim(issuedAt, id, encryptionKey string) ([]byte, error) {
	for _, c := range []struct{ name, v string }{{"issued_at", issuedAt}, {"id", id}, {"encryption_key", encryptionKey}} {
		if strings.Contains(c.v, "\n") {
			return nil, fmt.Errorf("manifest key claim: %s contains a line feed", c.name)
		}
	}
	if issuedAt == "" || id == "" {
		return nil, fmt.Errorf("manifest key claim: issued_at and id are required")
	}
	b := make([]byte, 0, len(TagManifestKey)+3+len(issuedAt)+len(id)+len(encryptionKey))
	b = append(b, TagManifestKey...)
	for _, c := range []string{issuedAt, id, encryptionKey} {
		b = append(b, '\n')
		b = append(b, c...)
	}
	return b, nil
}

// SignManifestKeyClaim signs the claim for k's own id; the result
// (base64url) is published as trust.signature beside trust.issued_at.
func SignManifestKeyClaim(k keys.Signer, issuedAt, encKey string) (string, error) {
	msg, err := ManifestKeyClaim(issuedAt, k.Public(), encKey)
	if err != nil {
		return "", err
	}
	return Base64URL.Encode(k.Sign(msg)), nil
}

// VerifyManifestKeyClaim checks a claim against the manifest's own id. A
// sender verifies it (and that id is the agent it asked for) before sealing
// to encKey.
func VerifyManifestKeyClaim(issuedAt, id, encKey, sig string) error {
	msg, err := ManifestKeyClaim(issuedAt, id, encKey)
	if err != nil {
		return errs.Wrap(errs.IdentityMismatch, "manifest key claim is malformed", err)
	}
	if err := VerifyString(id, msg, sig, Base64URL); err != nil {
		return sigErr("manifest key claim", err)
	}
	return nil
}

// ---------------------------------------------------------------------------
// PAN pairing (N§4.1): the agent proves it holds its key for a code.

// PairString is "pan-pair-v1:" + CODE + ":" + agent id. The code is
// uppercased, as the registrar compares it.
func PairString(code, agentID string) string {
	return "pan-pair-v1:" + strings.ToUpper(code) + ":" + agentID
}

// SignPair signs the pairing string for k's own id (standard base64).
func SignPair(k keys.Signer, code string) string {
	return Base64Std.Encode(k.Sign([]byte(PairString(code, k.Public()))))
}

// VerifyPair checks a pairing signature by agentID. A registrar must check
// it before spending the code.
func VerifyPair(code, agentID, sig string) error {
	if err := VerifyString(agentID, []byte(PairString(code, agentID)), sig, Base64Std); err != nil {
		return sigErr("pairing", err)
	}
	return nil
}

// ---------------------------------------------------------------------------
// Node credential request (SDK:credential).

// NodeCredString is "mesh-node-cred-v1:<ts>:<node_id>:<ids>", the ids
// sorted (UTF-16 order, JavaScript's default sort; for keys it is byte
// order) and comma-joined. The caller's slice is not reordered.
func NodeCredString(ts int64, nodeID string, agentIDs []string) string {
	ids := slices.Clone(agentIDs)
	slices.SortFunc(ids, CompareUTF16)
	return "mesh-node-cred-v1:" + strconv.FormatInt(ts, 10) + ":" + nodeID + ":" + strings.Join(ids, ",")
}

// NodeAgentString is "mesh-node-agent-v1:<ts>:<node_id>:<agent_id>", which
// each hosted agent signs to consent to the node's request.
func NodeAgentString(ts int64, nodeID, agentID string) string {
	return "mesh-node-agent-v1:" + strconv.FormatInt(ts, 10) + ":" + nodeID + ":" + agentID
}

// checkAgentIDs refuses ids that are not user public keys: one containing
// a comma would make two different lists sign the same bytes.
func checkAgentIDs(ids []string) error {
	for _, id := range ids {
		if !keys.IsUserPublicKey(id) {
			return fmt.Errorf("agent id %q is not a user public key", id)
		}
	}
	return nil
}

// SignNodeCred signs the node credential request with the node's key
// (standard base64).
func SignNodeCred(node keys.Signer, ts int64, agentIDs []string) (string, error) {
	if err := checkAgentIDs(agentIDs); err != nil {
		return "", fmt.Errorf("sign node credential request: %w", err)
	}
	return Base64Std.Encode(node.Sign([]byte(NodeCredString(ts, node.Public(), agentIDs)))), nil
}

// VerifyNodeCred checks node_sig by nodeID over the request.
func VerifyNodeCred(ts int64, nodeID string, agentIDs []string, sig string) error {
	if err := checkAgentIDs(agentIDs); err != nil {
		return errs.Wrap(errs.IdentityMismatch, "node credential request names an invalid agent id", err)
	}
	if err := VerifyString(nodeID, []byte(NodeCredString(ts, nodeID, agentIDs)), sig, Base64Std); err != nil {
		return sigErr("node credential request", err)
	}
	return nil
}

// SignNodeAgent is one agent's consent signature (standard base64).
func SignNodeAgent(agent keys.Signer, ts int64, nodeID string) string {
	return Base64Std.Encode(agent.Sign([]byte(NodeAgentString(ts, nodeID, agent.Public()))))
}

// VerifyNodeAgent checks one agent's consent signature.
func VerifyNodeAgent(ts int64, nodeID, agentID, sig string) error {
	if err := VerifyString(agentID, []byte(NodeAgentString(ts, nodeID, agentID)), sig, Base64Std); err != nil {
		return sigErr("node credential agent", err)
	}
	return nil
}

// ---------------------------------------------------------------------------
// Bootstrap proof (this mesh; docs/control-plane.md).

// BootstrapString is "mesh-bootstrap-v1:<token>:<agent_id>": what the agent
// signs to prove, in POST /v1/bootstrap, that whoever spends the am_ token
// holds the agent's seed. The token is single use, so the proof cannot be
// replayed; it names the agent, so it cannot be moved to another key.
func BootstrapString(token, agentID string) string {
	return "mesh-bootstrap-v1:" + token + ":" + agentID
}

// SignBootstrap signs the bootstrap proof with the agent key (standard
// base64).
func SignBootstrap(agent keys.Signer, token string) string {
	return Base64Std.Encode(agent.Sign([]byte(BootstrapString(token, agent.Public()))))
}

// VerifyBootstrap checks a bootstrap proof by agentID.
func VerifyBootstrap(token, agentID, sig string) error {
	if err := VerifyString(agentID, []byte(BootstrapString(token, agentID)), sig, Base64Std); err != nil {
		return sigErr("bootstrap proof", err)
	}
	return nil
}

// ---------------------------------------------------------------------------
// Guest lease release (F:c08).

// GuestReleaseString is "guest-release-v1:<publicKey>:<ts>".
func GuestReleaseString(publicKey string, ts int64) string {
	return "guest-release-v1:" + publicKey + ":" + strconv.FormatInt(ts, 10)
}

// SignGuestRelease signs the release with the guest's own key (standard
// base64).
func SignGuestRelease(k keys.Signer, ts int64) string {
	return Base64Std.Encode(k.Sign([]byte(GuestReleaseString(k.Public(), ts))))
}

// VerifyGuestRelease checks a release signature by publicKey.
func VerifyGuestRelease(publicKey string, ts int64, sig string) error {
	if err := VerifyString(publicKey, []byte(GuestReleaseString(publicKey, ts)), sig, Base64Std); err != nil {
		return sigErr("guest release", err)
	}
	return nil
}

// GuestHeartbeatString is what a guest lease heartbeat signs, mirroring
// the release string: "guest-heartbeat-v1:<publicKey>:<ts>".
func GuestHeartbeatString(publicKey string, ts int64) string {
	return "guest-heartbeat-v1:" + publicKey + ":" + strconv.FormatInt(ts, 10)
}

// SignGuestHeartbeat signs a lease heartbeat with the guest's own key
// (standard base64).
func SignGuestHeartbeat(k keys.Signer, ts int64) string {
	return Base64Std.Encode(k.Sign([]byte(GuestHeartbeatString(k.Public(), ts))))
}

// ---------------------------------------------------------------------------
// PAN check-in v3 (F:naming, R).

// CheckinV3String is the LF-joined check-in:
//
//	pan-checkin-v3 LF ts LF agent_id LF kind LF host LF platform LF encryption_key
//
// with ts in Unix seconds. Absent profile fields are empty components.
func CheckinV3String(ts int64, agentID, kind, host, platform, encryptionKey string) string {
	return strings.Join([]string{"pan-checkin-v3", strconv.FormatInt(ts, 10), agentID, kind, host, platform, encryptionKey}, "\n")
}

// checkinFieldsOK refuses a component containing a line feed, which would
// let two different check-ins share bytes.
func checkinFieldsOK(fields ...string) error {
	for _, f := range fields {
		if strings.Contains(f, "\n") {
			return fmt.Errorf("check-in field %q contains a line feed", f)
		}
	}
	return nil
}

// SignCheckinV3 signs a check-in for k's own id (standard base64).
func SignCheckinV3(k keys.Signer, ts int64, kind, host, platform, encryptionKey string) (string, error) {
	if err := checkinFieldsOK(kind, host, platform, encryptionKey); err != nil {
		return "", fmt.Errorf("sign check-in: %w", err)
	}
	return Base64Std.Encode(k.Sign([]byte(CheckinV3String(ts, k.Public(), kind, host, platform, encryptionKey)))), nil
}

// VerifyCheckinV3 checks a check-in signature by agentID. The ±300 s
// timestamp window is the registrar's check, not this one.
func VerifyCheckinV3(ts int64, agentID, kind, host, platform, encryptionKey, sig string) error {
	if err := checkinFieldsOK(agentID, kind, host, platform, encryptionKey); err != nil {
		return errs.Wrap(errs.IdentityMismatch, "check-in is malformed", err)
	}
	if err := VerifyString(agentID, []byte(CheckinV3String(ts, agentID, kind, host, platform, encryptionKey)), sig, Base64Std); err != nil {
		return sigErr("check-in", err)
	}
	return nil
}

// ---------------------------------------------------------------------------
// PAN card (N§5.3): canonical JSON of the whole card, no tag.

// CardBytes is the canonical JSON of card (an object: a decoded value, a
// map or a struct). There is no domain tag and nothing is removed: the
// registrar's signature travels beside the card, not in it.
func CardBytes(card any) ([]byte, error) {
	b, err := Canonical(card)
	if err != nil {
		return nil, fmt.Errorf("card: %w", err)
	}
	if len(b) == 0 || b[0] != '{' {
		return nil, fmt.Errorf("card: %w: a card must be a JSON object", ErrNotCanonicalizable)
	}
	return b, nil
}

// SignCard signs a card with the registrar's key (standard base64).
func SignCard(registrar keys.Signer, card any) (string, error) {
	msg, err := CardBytes(card)
	if err != nil {
		return "", err
	}
	return Base64Std.Encode(registrar.Sign(msg)), nil
}

// VerifyCard checks registrar_sig over a card. registrarKey is the pinned
// registrar signing key as a user public key. Expiry and the registrar
// origin check are the resolver's.
func VerifyCard(registrarKey string, card any, sig string) error {
	msg, err := CardBytes(card)
	if err != nil {
		return errs.Wrap(errs.IdentityMismatch, "card cannot be canonicalised for verification", err)
	}
	if err := VerifyString(registrarKey, msg, sig, Base64Std); err != nil {
		return sigErr("card", err)
	}
	return nil
}

// ---------------------------------------------------------------------------
// SKU digest (§19.1).

// SKUDigest is base64url (no padding) of SHA-256(TagSKU + "\n" + JCS(sku)).
// Any change to the SKU moves the digest, which invalidates every agreement
// made against the old one.
func SKUDigest(sku any) (string, error) {
	c, err := Canonical(sku)
	if err != nil {
		return "", fmt.Errorf("sku digest: %w", err)
	}
	if len(c) == 0 || c[0] != '{' {
		return "", fmt.Errorf("sku digest: %w: a SKU must be a JSON object", ErrNotCanonicalizable)
	}
	h := sha256.New()
	h.Write([]byte(TagSKU))
	h.Write([]byte{'\n'})
	h.Write(c)
	return base64.RawURLEncoding.EncodeToString(h.Sum(nil)), nil
}

// ---------------------------------------------------------------------------
// Self-describing tagged objects: the signer's key is a member of the
// object itself, so verification needs nothing but the object.

// selfSigned describes one kind of object whose signer is named inside it.
type selfSigned struct {
	what   string // for messages
	tag    string
	member string // the member naming the signer
	enc    SigEncoding
}

var (
	rosterKind     = selfSigned{"admission roster", TagAdmissionRoster, "owner_key", Base64Std}
	descriptorKind = selfSigned{"room descriptor", TagRoomDescriptor, "creator", Base64URL}
	agreementKind  = selfSigned{"agreement", TagAgreement, "consumer_owner", Base64URL}
)

// sign returns the signature of obj by k, refusing when obj names a
// different signer (or none): the signature would be attributed to whoever
// the object names.
func (s selfSigned) sign(obj any, k keys.Signer) (string, error) {
	m, err := objectValue(obj)
	if err != nil {
		return "", fmt.Errorf("sign %s: %w", s.what, err)
	}
	if named, _ := m[s.member].(string); named != k.Public() {
		return "", errs.Newf(errs.IdentityMismatch, "%s %s is %q; it cannot be signed by %s", s.what, s.member, named, k.Public())
	}
	return SignObject(s.tag, m, k, s.enc)
}

// verify checks obj's sig member against the key its signer member names.
func (s selfSigned) verify(obj any) error {
	m, err := objectValue(obj)
	if err != nil {
		return errs.Wrap(errs.IdentityMismatch, s.what+" cannot be canonicalised for verification", err)
	}
	signer, ok := m[s.member].(string)
	if !ok || signer == "" {
		return errs.Newf(errs.IdentityMismatch, "%s has no %s naming its signer", s.what, s.member)
	}
	sig, ok := m["sig"].(string)
	if !ok || sig == "" {
		return errs.Newf(errs.IdentityMismatch, "%s is not signed", s.what)
	}
	if err := VerifyObject(s.tag, m, signer, sig, s.enc); err != nil {
		return sigErr(s.what, err)
	}
	return nil
}

// SignRoster signs an admission roster with its owner's key: TagAdmissionRoster,
// standard base64 with padding. The roster's owner_key must be owner.
// Any sig member already present is ignored; the caller stores the result
// as the new sig.
func SignRoster(roster any, owner keys.Signer) (string, error) { return rosterKind.sign(roster, owner) }

// VerifyRoster checks a roster's sig against its own owner_key. A roster
// that fails must be replaced by the safe defaults (hold/block, no
// entries), never used.
func VerifyRoster(roster any) error { return rosterKind.verify(roster) }

// SignRoomDescriptor signs a room descriptor with its creator's key:
// TagRoomDescriptor, base64url. The descriptor's creator must be creator.
func SignRoomDescriptor(desc any, creator keys.Signer) (string, error) {
	return descriptorKind.sign(desc, creator)
}

// VerifyRoomDescriptor checks a descriptor's sig against its own creator.
func VerifyRoomDescriptor(desc any) error { return descriptorKind.verify(desc) }

// SignAgreement signs an agreement with the consumer owner's key (an owner
// key, never an agent key): TagAgreement, base64url. The agreement's
// consumer_owner must be consumerOwner.
func SignAgreement(agreement any, consumerOwner keys.Signer) (string, error) {
	return agreementKind.sign(agreement, consumerOwner)
}

// VerifyAgreement checks an agreement's sig against its own consumer_owner.
// Coverage (seller, SKU, current digest, expiry) is the caller's check.
func VerifyAgreement(agreement any) error { return agreementKind.verify(agreement) }
