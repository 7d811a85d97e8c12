package engagement

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/jsonv"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// The domain tags of the signed acts beside the document (our choice:
// upstream's Agent SoW names only the document's own tag, §6). Each
// signature covers the tag, one LF, then the canonical JSON (JCS) of the
// object without its sig member; sig is unpadded base64url Ed25519 by the
// key in by.
const (
	TagTerminate       = "agent-sow-terminate-v1"
	TagReview          = "agent-sow-review-v1"
	TagAmendment       = "agent-sow-amendment-v1"
	TagWithdraw        = "agent-sow-proposal-withdraw-v1"
	TagRequestWithdraw = "agent-sow-request-withdraw-v1"
)

// Verdicts of a review (§15).
const (
	VerdictAccepted = "accepted"
	VerdictRejected = "rejected"
)

// Acts of a signed amendment resolution other than approval (approval is
// the countersigned document itself).
const (
	ActDeny     = "deny"
	ActWithdraw = "withdraw"
)

// Bounds of the signed acts.
const (
	MaxActBytes  = 16 << 10
	maxReason    = 2000
	maxTaskID    = 200
	maxOffering  = 120
	signedActVer = 1
)

// Act is a signed act about one engagement, as received: its exact bytes
// and the members every act carries.
type Act struct {
	Raw      []byte
	Value    map[string]any
	Client   string
	Seller   string
	Offering string
	SowID    string
	By       string
	At       time.Time
	Sig      string
}

// Digest is the hex SHA-256 of the act's signature: two copies of one
// signed act share it, whatever their spacing.
func (a *Act) Digest() string {
	sum := sha256.Sum256([]byte(a.Sig))
	return hex.EncodeToString(sum[:])
}

func badAct(what, format string, args ...any) *errs.Error {
	return errs.Newf(errs.InvalidRequest, what+": "+format, args...)
}

// parseAct reads and verifies a signed act under tag: exactly the members
// common and extra, v 1, the three identifiers and the sow id, by an owner
// key, at an RFC 3339 instant, and a sig by by over tag + LF + JCS(object
// without sig).
func parseAct(raw []byte, tag, what string, extra ...string) (*Act, error) {
	if len(raw) > MaxActBytes {
		return nil, errs.Newf(errs.PayloadTooLarge, "%s is %d bytes; at most %d", what, len(raw), MaxActBytes)
	}
	v, err := protocol.ParseJSON(raw)
	if err != nil {
		return nil, errs.Wrap(errs.InvalidRequest, what+" is not valid JSON", err)
	}
	m, ok := jsonv.Object(v)
	if !ok {
		return nil, badAct(what, "it is a JSON object")
	}
	known := slices.Concat([]string{"v", "client", "seller", "offering", "sow_id", "by", "at", "sig"}, extra)
	if k, bad := jsonv.Unknown(m, known...); bad {
		return nil, badAct(what, "unknown member %q; a signed term nobody reads is a term nobody enforces", k)
	}
	if n, ok := jsonv.PosInt(m["v"]); !ok || n != signedActVer {
		return nil, badAct(what, "v must be 1")
	}
	a := &Act{Raw: raw, Value: m}
	a.Client, _ = m["client"].(string)
	a.Seller, _ = m["seller"].(string)
	if !keys.IsUserPublicKey(a.Client) || !keys.IsUserPublicKey(a.Seller) {
		return nil, badAct(what, "client and seller are the two agents' public keys")
	}
	if a.Offering, ok = jsonv.Text(m["offering"], maxOffering); !ok {
		return nil, badAct(what, "offering names an offering in the engagement's scope")
	}
	if a.SowID, _ = m["sow_id"].(string); a.SowID == "" || len(a.SowID) > 64 {
		return nil, badAct(what, "sow_id is the engagement document's id")
	}
	if a.By, _ = m["by"].(string); !keys.IsUserPublicKey(a.By) {
		return nil, badAct(what, "by is the signing owner's public key")
	}
	at, _ := m["at"].(string)
	if a.At, err = protocol.ParseTime(at); err != nil {
		return nil, badAct(what, "at must be an RFC 3339 instant")
	}
	if a.Sig, _ = m["sig"].(string); a.Sig == "" {
		return nil, badAct(what, "sig is required")
	}
	if err := protocol.VerifyObject(tag, m, a.By, a.Sig, protocol.Base64URL); err != nil {
		return nil, errs.Wrap(errs.IdentityMismatch, what+": the signature does not verify over \""+tag+"\\n\" and the canonical JSON without sig, by the key in by", err)
	}
	return a, nil
}

// reason reads an optional reason: a non-blank sentence of at most
// maxReason characters when present.
func reason(m map[string]any, what string) (string, error) {
	raw, present := m["reason"]
	if !present {
		return "", nil
	}
	s, ok := jsonv.Text(raw, maxReason)
	if !ok {
		return "", badAct(what, "reason is a sentence a person reads, not blank, at most %d characters", maxReason)
	}
	return s, nil
}

// Termination is a signed notice to terminate (§5.9):
//
//	{v:1, client, seller, offering, sow_id, version, by, at, for_cause, reason?, sig}
//
// signed under TagTerminate by the owner key of either seat. for_cause is
// inside the signed bytes; a reason is required with it.
type Termination struct {
	Act
	Version  int64
	ForCause bool
	Reason   string
}

// ParseTermination reads and verifies a termination notice.
func ParseTermination(raw []byte) (*Termination, error) {
	const what = "termination notice"
	a, err := parseAct(raw, TagTerminate, what, "version", "for_cause", "reason")
	if err != nil {
		return nil, err
	}
	t := &Termination{Act: *a}
	var ok bool
	if t.Version, ok = jsonv.PosInt(a.Value["version"]); !ok {
		return nil, badAct(what, "version is the version of the document it terminates")
	}
	if t.ForCause, ok = a.Value["for_cause"].(bool); !ok {
		return nil, badAct(what, "for_cause is true or false, inside the signed bytes (§5.9)")
	}
	if t.Reason, err = reason(a.Value, what); err != nil {
		return nil, err
	}
	if t.ForCause && t.Reason == "" {
		return nil, badAct(what, "a termination for cause states its reason; it goes on the public record (§5.9)")
	}
	return t, nil
}

// Review is a signed review by the client seat's owner (§15):
//
//	{v:1, client, seller, offering, sow_id, task_id?, verdict, reason?, at, by, sig}
//
// under TagReview. A rejection without a reason is not a review.
type Review struct {
	Act
	TaskID  string
	Verdict string
	Reason  string
}

// ParseReview reads and verifies a review.
func ParseReview(raw []byte) (*Review, error) {
	const what = "review"
	a, err := parseAct(raw, TagReview, what, "task_id", "verdict", "reason")
	if err != nil {
		return nil, err
	}
	r := &Review{Act: *a}
	if _, present := a.Value["task_id"]; present {
		var ok bool
		if r.TaskID, ok = jsonv.Text(a.Value["task_id"], maxTaskID); !ok {
			return nil, badAct(what, "task_id names the reviewed task, at most %d characters", maxTaskID)
		}
	}
	if r.Verdict, _ = a.Value["verdict"].(string); r.Verdict != VerdictAccepted && r.Verdict != VerdictRejected {
		return nil, badAct(what, "verdict is accepted or rejected (§15)")
	}
	if r.Reason, err = reason(a.Value, what); err != nil {
		return nil, err
	}
	if r.Verdict == VerdictRejected && r.Reason == "" {
		return nil, badAct(what, "a rejection states its reason; an unreasoned rejection is not a review and carries no weight (§15 rule 2)")
	}
	return r, nil
}

// Resolution is a signed denial or withdrawal of an open amendment (§5.8):
//
//	{v:1, client, seller, offering, sow_id, version, proposal_sha256, act: deny|withdraw, reason?, by, at, sig}
//
// under TagAmendment. proposal_sha256 is the hex SHA-256 of the proposal's
// exact bytes (open_amendment.document on the record): the act answers
// that proposal and no other at the same version. A denial carries a
// reason; an unreasoned one is refused.
type Resolution struct {
	Act
	Version        int64
	ProposalSHA256 string
	Kind           string
	Reason         string
}

// hexDigest reads a member holding a hex SHA-256.
func hexDigest(m map[string]any, member string) (string, bool) {
	s, _ := m[member].(string)
	if len(s) != 64 {
		return "", false
	}
	if _, err := hex.DecodeString(s); err != nil || strings.ToLower(s) != s {
		return "", false
	}
	return s, true
}

// ParseResolution reads and verifies a denial or withdrawal.
func ParseResolution(raw []byte) (*Resolution, error) {
	const what = "amendment resolution"
	a, err := parseAct(raw, TagAmendment, what, "version", "proposal_sha256", "act", "reason")
	if err != nil {
		return nil, err
	}
	r := &Resolution{Act: *a}
	var ok bool
	if r.Version, ok = jsonv.PosInt(a.Value["version"]); !ok || r.Version < 2 {
		return nil, badAct(what, "version is the proposed amendment's version (2 or more)")
	}
	if r.ProposalSHA256, ok = hexDigest(a.Value, "proposal_sha256"); !ok {
		return nil, badAct(what, "proposal_sha256 is the lowercase hex SHA-256 of the proposal's exact bytes, binding the act to the proposal it answers")
	}
	if r.Kind, _ = a.Value["act"].(string); r.Kind != ActDeny && r.Kind != ActWithdraw {
		return nil, badAct(what, "act is deny or withdraw")
	}
	if r.Reason, err = reason(a.Value, what); err != nil {
		return nil, err
	}
	if r.Kind == ActDeny && r.Reason == "" {
		return nil, badAct(what, "a denial carries its reason; an unreasoned denial is not recorded (§5.8)")
	}
	return r, nil
}

// SignAct fills obj's by and sig: obj signed under tag by k. It is what an
// owner's tooling (and the tests) use; the service only verifies.
func SignAct(tag string, obj map[string]any, k keys.Signer) error {
	obj["by"] = k.Public()
	delete(obj, "sig")
	sig, err := protocol.SignObject(tag, obj, k, protocol.Base64URL)
	if err != nil {
		return err
	}
	obj["sig"] = sig
	return nil
}

// ProposalWithdrawal is the provider owner's signed withdrawal of a
// standing proposal (§12.1: prospective, archived, for everyone):
//
//	{v:1, provider, sow_id, by, at, sig}
//
// under TagWithdraw.
type ProposalWithdrawal struct {
	Raw      []byte
	Provider string
	SowID    string
	By       string
	At       time.Time
	Sig      string
}

// ParseProposalWithdrawal reads and verifies a withdrawal.
func ParseProposalWithdrawal(raw []byte) (*ProposalWithdrawal, error) {
	const what = "proposal withdrawal"
	if len(raw) > MaxActBytes {
		return nil, errs.Newf(errs.PayloadTooLarge, "%s is %d bytes; at most %d", what, len(raw), MaxActBytes)
	}
	v, err := protocol.ParseJSON(raw)
	if err != nil {
		return nil, errs.Wrap(errs.InvalidRequest, what+" is not valid JSON", err)
	}
	m, ok := jsonv.Object(v)
	if !ok {
		return nil, badAct(what, "it is a JSON object")
	}
	if k, bad := jsonv.Unknown(m, "v", "provider", "sow_id", "by", "at", "sig"); bad {
		return nil, badAct(what, "unknown member %q", k)
	}
	if n, ok := jsonv.PosInt(m["v"]); !ok || n != signedActVer {
		return nil, badAct(what, "v must be 1")
	}
	w := &ProposalWithdrawal{Raw: raw}
	if w.Provider, _ = m["provider"].(string); !keys.IsUserPublicKey(w.Provider) {
		return nil, badAct(what, "provider is the provider agent's public key")
	}
	if w.SowID, _ = m["sow_id"].(string); w.SowID == "" || len(w.SowID) > 64 {
		return nil, badAct(what, "sow_id is the standing proposal's id")
	}
	if w.By, _ = m["by"].(string); !keys.IsUserPublicKey(w.By) {
		return nil, badAct(what, "by is the signing owner's public key")
	}
	at, _ := m["at"].(string)
	if w.At, err = protocol.ParseTime(at); err != nil {
		return nil, badAct(what, "at must be an RFC 3339 instant")
	}
	if w.Sig, _ = m["sig"].(string); w.Sig == "" {
		return nil, badAct(what, "sig is required")
	}
	if err := protocol.VerifyObject(TagWithdraw, m, w.By, w.Sig, protocol.Base64URL); err != nil {
		return nil, errs.Wrap(errs.IdentityMismatch, what+": the signature does not verify over \""+TagWithdraw+"\\n\" and the canonical JSON without sig, by the key in by", err)
	}
	return w, nil
}

// RequestWithdrawal is the client owner's signed withdrawal of its request
// to form (§12.1):
//
//	{v:1, client, seller, offering, sow_id, request_sha256, by, at, sig}
//
// under TagRequestWithdraw. request_sha256 is the hex SHA-256 of the
// countersign's exact bytes (requested on the record).
type RequestWithdrawal struct {
	Act
	RequestSHA256 string
}

// ParseRequestWithdrawal reads and verifies a withdrawal of a request to
// form.
func ParseRequestWithdrawal(raw []byte) (*RequestWithdrawal, error) {
	const what = "request withdrawal"
	a, err := parseAct(raw, TagRequestWithdraw, what, "request_sha256")
	if err != nil {
		return nil, err
	}
	w := &RequestWithdrawal{Act: *a}
	var ok bool
	if w.RequestSHA256, ok = hexDigest(a.Value, "request_sha256"); !ok {
		return nil, badAct(what, "request_sha256 is the lowercase hex SHA-256 of the countersign's exact bytes")
	}
	return w, nil
}
