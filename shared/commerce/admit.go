package commerce

import (
	"net/url"
	"time"

	"agentmesh.dev/mesh/shared/errs"
)

// ApprovalPath is where the deployment's own console approves agreements
// for provider "internal"; ApprovalURL appends ?sku=<id>.
const ApprovalPath = "/agreements/approve"

// ApprovalURL is where a person goes to accept s: the provider's checkout
// URL when it names one, else the deployment's own approval page under
// consoleOrigin (scheme and host, no path).
func ApprovalURL(consoleOrigin string, s SKU) string {
	if s.Provider.CheckoutURL != "" {
		return s.Provider.CheckoutURL
	}
	return consoleOrigin + ApprovalPath + "?" + url.Values{"sku": {s.ID}}.Encode()
}

// Required is the details of an AGREEMENT_REQUIRED refusal. The member
// names are the protocol between implementations (commerce.json pins sku,
// sku_digest and approval_url); PriceCredits, when known, is the retail
// price in credits the service specification adds (§7.1).
type Required struct {
	SKU          string
	SKUDigest    string
	ApprovalURL  string
	PriceCredits *int64
}

// AgreementRequired is the admission refusal: not retryable (retrying
// changes nothing until a person approves), with the approval URL in the
// one-line message as well as in the details.
func AgreementRequired(r Required) *errs.Error {
	e := errs.Newf(errs.AgreementRequired,
		"%s is a paid offering and this account holds no agreement to its current terms; an owner must approve it at %s",
		r.SKU, r.ApprovalURL).WithDetails(map[string]any{
		"sku":          r.SKU,
		"sku_digest":   r.SKUDigest,
		"approval_url": r.ApprovalURL,
	})
	if r.PriceCredits != nil {
		e.Details["price_credits"] = *r.PriceCredits
	}
	e.Retryable = false
	return e
}

// Request is what admission knows about one request to a seller's agent.
type Request struct {
	// Seller is the selling agent: the request's addressee.
	Seller string
	// ConsumerOwner is the owner key of the requesting agent, "" when the
	// requester has none (it then holds no agreement anywhere).
	ConsumerOwner string
	Offering      string
	Now           time.Time
}

// Decision is the outcome of Admit.
type Decision struct {
	// SKU covers the offering (Covered false: the offering is free).
	SKU     SKU
	Covered bool
	// Agreement is the agreement that authorised the work, when one did.
	Agreement *Agreement
	// Refusal is non-nil when the request must be refused before any work
	// and before the accept.
	Refusal *errs.Error
}

// Admit decides whether a request may proceed: an offering covered by no
// SKU, or by a free one, is admitted; one covered by a paid SKU is admitted
// only under an agreement that verifies and covers the requester's owner,
// this seller, the SKU and its current digest, unexpired at now. Otherwise
// it is refused with AGREEMENT_REQUIRED naming the SKU, its current digest
// and where to approve. approval builds the approval URL for a SKU.
func Admit(skus []SKU, agreements []Agreement, r Request, approval func(SKU) string) Decision {
	s, ok := For(skus, r.Offering)
	if !ok {
		return Decision{}
	}
	d := Decision{SKU: s, Covered: true}
	if !s.Price.Paid() {
		return d
	}
	for i := range agreements {
		a := &agreements[i]
		if a.Covers(r.ConsumerOwner, r.Seller, s.ID, s.Digest(), r.Now) && a.Verify() == nil {
			d.Agreement = a
			return d
		}
	}
	d.Refusal = AgreementRequired(Required{SKU: s.ID, SKUDigest: s.Digest(), ApprovalURL: approval(s)})
	return d
}
