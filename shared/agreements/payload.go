package agreements

import (
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/jsonv"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// The decoders of the verbs' payloads. Every payload comes from whoever
// holds a credential that may publish the subject, so each is refused,
// never trusted, when it says more or less than its shape: INVALID_REQUEST
// for the admit and list questions, INVALID_ENVELOPE for the signed
// revocation (like a malformed agreement).

// maxPayload bounds every payload this worker reads (an agreement is under
// a kilobyte; the bus's limit is a megabyte).
const maxPayload = 16 << 10

func parseObject(data []byte, what string) (map[string]any, error) {
	if len(data) > maxPayload {
		return nil, errs.Newf(errs.InvalidRequest, "%s is larger than %d bytes", what, maxPayload)
	}
	v, err := protocol.ParseJSON(data)
	if err != nil {
		return nil, errs.Wrap(errs.InvalidRequest, what+" is not valid JSON", err)
	}
	m, ok := jsonv.Object(v)
	if !ok {
		return nil, errs.Newf(errs.InvalidRequest, "%s must be a JSON object", what)
	}
	return m, nil
}

// AdmitRequest is the payload of mesh.commerce.admit: the seller's node
// asking, before the accept, whether Requester may have Offering. The
// seller is the verified sender of the question, never a member of it.
type AdmitRequest struct {
	Requester string           `json:"requester"`
	Offering  string           `json:"offering"`
	RequestID string           `json:"request_id"`
	Budget    *protocol.Budget `json:"budget,omitempty"`
}

// maxID bounds the offering and request ids an admit question carries (an
// offering id in a manifest is a short string; a request id is a UUID).
const maxID = 256

// DecodeAdmit decodes an admit question: requester an agent's public key,
// offering and request_id non-empty strings of at most 256 bytes, budget
// (optional) a budget block as envelopes carry it. Anything else is
// INVALID_REQUEST.
func DecodeAdmit(data []byte) (AdmitRequest, error) {
	m, err := parseObject(data, "the admit question")
	if err != nil {
		return AdmitRequest{}, err
	}
	bad := func(format string, args ...any) (AdmitRequest, error) {
		return AdmitRequest{}, errs.Newf(errs.InvalidRequest, "admit: "+format, args...)
	}
	if k, unknown := jsonv.Unknown(m, "requester", "offering", "request_id", "budget"); unknown {
		return bad("unknown member %q", k)
	}
	var r AdmitRequest
	if r.Requester, _ = m["requester"].(string); !keys.IsUserPublicKey(r.Requester) {
		return bad("requester must be the requesting agent's public key")
	}
	if r.Offering, _ = m["offering"].(string); r.Offering == "" || len(r.Offering) > maxID {
		return bad("offering must be the requested offering id (1 to %d bytes)", maxID)
	}
	if r.RequestID, _ = m["request_id"].(string); r.RequestID == "" || len(r.RequestID) > maxID {
		return bad("request_id must be the request envelope's id (1 to %d bytes)", maxID)
	}
	if raw, present := m["budget"]; present {
		b, err := protocol.BudgetFromValue(raw)
		if err != nil {
			return bad("budget: %s", errs.As(err).Message)
		}
		r.Budget = &b
	}
	return r, nil
}

// ListRequest is the payload of mesh.agreements.list: either filter may be
// empty; Limit (0: DefaultListLimit) and After (the next of the page
// before) page the answer.
type ListRequest struct {
	ConsumerOwner string `json:"consumer_owner,omitempty"`
	SellerAgent   string `json:"seller_agent,omitempty"`
	Limit         int    `json:"limit,omitempty"`
	After         string `json:"after,omitempty"`
}

// Page sizes of mesh.agreements.list.
const (
	DefaultListLimit = 100
	MaxListLimit     = 500
)

// DecodeList decodes a list question {consumer_owner?, seller_agent?,
// limit?, after?}: each filter a user public key when present, limit 1 to
// MaxListLimit, after the next a previous page gave (an agreement key). An
// empty payload is {}.
func DecodeList(data []byte) (ListRequest, error) {
	if len(data) == 0 || string(data) == "null" {
		return ListRequest{}, nil
	}
	m, err := parseObject(data, "the list question")
	if err != nil {
		return ListRequest{}, err
	}
	if k, unknown := jsonv.Unknown(m, "consumer_owner", "seller_agent", "limit", "after"); unknown {
		return ListRequest{}, errs.Newf(errs.InvalidRequest, "list: unknown member %q", k)
	}
	var r ListRequest
	if raw, present := m["limit"]; present {
		n, ok := jsonv.NonNegInt(raw)
		if !ok || n < 1 || n > MaxListLimit {
			return ListRequest{}, errs.Newf(errs.InvalidRequest, "list: limit, when present, is an integer from 1 to %d", MaxListLimit)
		}
		r.Limit = int(n)
	}
	if raw, present := m["after"]; present {
		if r.After, _ = raw.(string); !strings.HasPrefix(r.After, commerce.AgreementPrefix) || len(r.After) > 512 {
			return ListRequest{}, errs.New(errs.InvalidRequest, "list: after is not a cursor this service gave: pass back next as it came")
		}
	}
	for _, f := range []struct {
		name string
		dst  *string
	}{{"consumer_owner", &r.ConsumerOwner}, {"seller_agent", &r.SellerAgent}} {
		raw, present := m[f.name]
		if !present {
			continue
		}
		if *f.dst, _ = raw.(string); !keys.IsUserPublicKey(*f.dst) {
			return ListRequest{}, errs.Newf(errs.InvalidRequest, "list: %s, when present, must be a public key", f.name)
		}
	}
	return r, nil
}

// TagRevocation is the signature tag of an agreement revocation: the
// consumer's owner signs {v, consumer_owner, seller_agent, sku, agreed_at,
// revoked_at} under it, base64url, like the agreement itself. agreed_at is
// the revoked agreement's own: a revocation names the one agreement it
// withdraws, and cannot be replayed against a later one.
const TagRevocation = "agentmesh-agreement-revoke-v1"

// Revocation is an owner's signed withdrawal of its agreement to a
// seller's SKU. It removes future authority only.
type Revocation struct {
	V             int    `json:"v"`
	ConsumerOwner string `json:"consumer_owner"`
	SellerAgent   string `json:"seller_agent"`
	SKU           string `json:"sku"`
	AgreedAt      string `json:"agreed_at"`
	RevokedAt     string `json:"revoked_at"`
	Sig           string `json:"sig,omitempty"`
}

func revocationErr(format string, args ...any) *errs.Error {
	return errs.Newf(errs.InvalidEnvelope, "revocation: "+format, args...)
}

// ParseRevocation shape-checks a revocation given as JSON text, refusing
// as INVALID_ENVELOPE an unknown member, v other than 1, keys that are not
// public keys, a sku that is not a SKU id, agreed_at or revoked_at that is
// not an RFC 3339 instant, and a sig that is missing or empty. It does not verify the
// signature: see Verify.
func ParseRevocation(data []byte) (Revocation, error) {
	if len(data) > maxPayload {
		return Revocation{}, revocationErr("larger than %d bytes", maxPayload)
	}
	v, err := protocol.ParseJSON(data)
	if err != nil {
		return Revocation{}, errs.Wrap(errs.InvalidEnvelope, "revocation is not valid JSON", err)
	}
	m, ok := jsonv.Object(v)
	if !ok {
		return Revocation{}, revocationErr("must be a JSON object")
	}
	if k, bad := jsonv.Unknown(m, "v", "consumer_owner", "seller_agent", "sku", "agreed_at", "revoked_at", "sig"); bad {
		return Revocation{}, revocationErr("unknown member %q", k)
	}
	var r Revocation
	if n, ok := jsonv.NonNegInt(m["v"]); !ok || n != 1 {
		return Revocation{}, revocationErr("v must be the integer 1")
	}
	r.V = 1
	if r.ConsumerOwner, _ = m["consumer_owner"].(string); !keys.IsUserPublicKey(r.ConsumerOwner) {
		return Revocation{}, revocationErr("consumer_owner must be the owner key that signed the agreement")
	}
	if r.SellerAgent, _ = m["seller_agent"].(string); !keys.IsUserPublicKey(r.SellerAgent) {
		return Revocation{}, revocationErr("seller_agent must be the selling agent's public key")
	}
	if r.SKU, _ = m["sku"].(string); !commerce.ValidSKUID(r.SKU) {
		return Revocation{}, revocationErr("sku must be a SKU id, [a-z0-9-]{1,64}")
	}
	if r.AgreedAt, _ = m["agreed_at"].(string); !validTime(r.AgreedAt) {
		return Revocation{}, revocationErr("agreed_at must be the revoked agreement's agreed_at, an RFC 3339 instant")
	}
	if r.RevokedAt, _ = m["revoked_at"].(string); !validTime(r.RevokedAt) {
		return Revocation{}, revocationErr("revoked_at must be an RFC 3339 instant")
	}
	if r.Sig, _ = m["sig"].(string); r.Sig == "" {
		return Revocation{}, revocationErr("sig is required: the owner's signature under %s", TagRevocation)
	}
	return r, nil
}

func validTime(s string) bool {
	_, err := protocol.ParseTime(s)
	return err == nil
}

// Time is revoked_at as a time (ParseRevocation checked it).
func (r Revocation) Time() time.Time {
	t, _ := protocol.ParseTime(r.RevokedAt)
	return t
}

// Verify checks the signature against the revocation's own
// consumer_owner: IDENTITY_MISMATCH when it does not verify.
func (r Revocation) Verify() error {
	if r.Sig == "" {
		return errs.New(errs.IdentityMismatch, "revocation is not signed")
	}
	unsigned := r
	unsigned.Sig = ""
	if err := protocol.VerifyObject(TagRevocation, unsigned, r.ConsumerOwner, r.Sig, protocol.Base64URL); err != nil {
		return errs.Wrap(errs.IdentityMismatch, "the revocation's signature does not verify against its consumer_owner", err)
	}
	return nil
}

// SignRevocation signs r as owner: consumer_owner is set to owner's key
// and Sig replaced.
func SignRevocation(r *Revocation, owner keys.Signer) error {
	r.V = 1
	r.ConsumerOwner = owner.Public()
	r.Sig = ""
	sig, err := protocol.SignObject(TagRevocation, *r, owner, protocol.Base64URL)
	if err != nil {
		return err
	}
	r.Sig = sig
	return nil
}
