package commerce

import (
	"encoding/base64"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/jsonv"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// AgreementVersion is the only agreement document version.
const AgreementVersion = 1

// Agreement is a consumer owner's signed acceptance of one SKU's terms at
// one digest (§19.5). It is account-level: signed by the owner key, never an
// agent key, it covers every agent under that owner. Revoking it ends
// future authority only; usage already rated under it stays rated.
type Agreement struct {
	V             int       `json:"v"`
	ConsumerOwner string    `json:"consumer_owner"`
	SellerAgent   string    `json:"seller_agent"`
	SKU           string    `json:"sku"`
	SKUDigest     string    `json:"sku_digest"`
	AgreedAt      string    `json:"agreed_at"`
	ExpiresAt     string    `json:"expires_at,omitempty"`
	Evidence      *Evidence `json:"evidence,omitempty"`
	Sig           string    `json:"sig,omitempty"`
}

// Evidence is the billing provider's confirmation behind an agreement (a
// checkout session, a console approval): informative to the mesh,
// authoritative on the provider's own rail.
type Evidence struct {
	Provider string `json:"provider"`
	Ref      string `json:"ref,omitempty"`
}

func agreementErr(format string, args ...any) *errs.Error {
	return errs.Newf(errs.InvalidEnvelope, "agreement: "+format, args...)
}

// ParseAgreement shape-checks an agreement given as JSON text. It does not
// check the signature; see Verify.
func ParseAgreement(data []byte) (Agreement, error) {
	v, err := protocol.ParseJSON(data)
	if err != nil {
		return Agreement{}, errs.Wrap(errs.InvalidEnvelope, "agreement is not valid JSON", err)
	}
	return AgreementFromValue(v)
}

// validDigest reports whether d has the shape of a SKU digest: the unpadded
// base64url of 32 bytes.
func validDigest(d string) bool {
	b, err := base64.RawURLEncoding.Strict().DecodeString(d)
	return err == nil && len(b) == 32
}

// AgreementFromValue shape-checks a decoded agreement. It refuses, as
// INVALID_ENVELOPE: a member this version does not know (the signature
// covers the canonical struct, so one could not survive); v other than the
// integer 1; consumer_owner or seller_agent that is not a user public key;
// a sku that is not a SKU id; a sku_digest that is missing or not a
// digest (an agreement without a digest agrees to nothing); agreed_at, or
// expires_at when present, that is not an RFC 3339 instant; evidence
// without its provider; and a sig that is present but not a non-empty
// string. A missing sig is Verify's refusal.
func AgreementFromValue(v any) (Agreement, error) {
	m, ok := jsonv.Object(v)
	if !ok {
		return Agreement{}, agreementErr("must be a JSON object")
	}
	if k, bad := jsonv.Unknown(m, "v", "consumer_owner", "seller_agent", "sku", "sku_digest", "agreed_at", "expires_at", "evidence", "sig"); bad {
		return Agreement{}, agreementErr("unknown member %q", k)
	}
	var a Agreement
	if n, ok := jsonv.NonNegInt(m["v"]); !ok || n != AgreementVersion {
		return Agreement{}, agreementErr("v must be the integer %d", AgreementVersion)
	}
	a.V = AgreementVersion
	if a.ConsumerOwner, _ = m["consumer_owner"].(string); !keys.IsUserPublicKey(a.ConsumerOwner) {
		return Agreement{}, agreementErr("consumer_owner must be the consumer's owner key: the account, never an agent key")
	}
	if a.SellerAgent, _ = m["seller_agent"].(string); !keys.IsUserPublicKey(a.SellerAgent) {
		return Agreement{}, agreementErr("seller_agent must be the selling agent's public key")
	}
	if a.SKU, _ = m["sku"].(string); !ValidSKUID(a.SKU) {
		return Agreement{}, agreementErr("sku must be a SKU id, [a-z0-9-]{1,64}")
	}
	if a.SKUDigest, _ = m["sku_digest"].(string); !validDigest(a.SKUDigest) {
		return Agreement{}, agreementErr("sku_digest is required (an agreement without a digest agrees to nothing) and is an unpadded base64url SHA-256")
	}
	a.AgreedAt, _ = m["agreed_at"].(string)
	if _, err := protocol.ParseTime(a.AgreedAt); err != nil {
		return Agreement{}, agreementErr("agreed_at must be an RFC 3339 instant")
	}
	if raw, present := m["expires_at"]; present {
		s, _ := raw.(string)
		if _, err := protocol.ParseTime(s); err != nil {
			return Agreement{}, agreementErr("expires_at, when present, must be an RFC 3339 instant")
		}
		a.ExpiresAt = s
	}
	if raw, present := m["evidence"]; present {
		e, ok := jsonv.Object(raw)
		if !ok {
			return Agreement{}, agreementErr("evidence must be an object {provider, ref?}")
		}
		if k, bad := jsonv.Unknown(e, "provider", "ref"); bad {
			return Agreement{}, agreementErr("evidence has unknown member %q", k)
		}
		a.Evidence = &Evidence{}
		if a.Evidence.Provider, _ = e["provider"].(string); a.Evidence.Provider == "" {
			return Agreement{}, agreementErr("evidence names the provider that confirmed it")
		}
		if r, present := e["ref"]; present {
			if a.Evidence.Ref, _ = r.(string); a.Evidence.Ref == "" {
				return Agreement{}, agreementErr("evidence.ref, when present, is a non-empty string")
			}
		}
	}
	if raw, present := m["sig"]; present {
		if a.Sig, _ = raw.(string); a.Sig == "" {
			return Agreement{}, agreementErr("sig must be a non-empty string when present")
		}
	}
	return a, nil
}

// Verify checks the signature against the agreement's own consumer_owner:
// IDENTITY_MISMATCH when it is missing or does not verify. An agreement that
// fails is no agreement, which is the safe direction: it refuses work
// rather than authorising it.
func (a Agreement) Verify() error { return protocol.VerifyAgreement(a) }

// Sign signs a as owner: consumer_owner is set to owner's key (the signer
// IS the account), the shape is checked, and Sig is replaced.
func Sign(a *Agreement, owner keys.Signer) error {
	a.V = AgreementVersion
	a.ConsumerOwner = owner.Public()
	a.Sig = ""
	c, err := protocol.Canonical(a)
	if err != nil {
		return err
	}
	if _, err := ParseAgreement(c); err != nil {
		return err
	}
	sig, err := protocol.SignAgreement(a, owner)
	if err != nil {
		return err
	}
	a.Sig = sig
	return nil
}

// Covers reports whether the agreement authorises work for consumerOwner on
// seller's SKU whose digest is currently digest, at now. Every clause is a
// must: an agreement to yesterday's digest does not cover today's terms,
// and expiry has no skew tolerance (at expires_at it no longer covers).
// The signature is Verify's check; Covers assumes a verified agreement.
func (a Agreement) Covers(consumerOwner, seller, sku, digest string, now time.Time) bool {
	if a.ConsumerOwner != consumerOwner || a.SellerAgent != seller || a.SKU != sku || a.SKUDigest != digest {
		return false
	}
	if a.ExpiresAt != "" {
		exp, err := protocol.ParseTime(a.ExpiresAt)
		if err != nil || !now.Before(exp) {
			return false
		}
	}
	return true
}
