package agreements

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/metering"
	"agentmesh.dev/mesh/shared/protocol"
)

// Admitted is the answer to an admitted request: the SKU covering the
// offering and its current digest (absent for an offering no SKU covers)
// and the engagement whose volume it counted against (when one is in
// force).
type Admitted struct {
	Admitted  bool   `json:"admitted"`
	SKU       string `json:"sku,omitempty"`
	SKUDigest string `json:"sku_digest,omitempty"`
	SowID     string `json:"sow_id,omitempty"`
}

// admit answers the seller node's question (the verified sender is the
// seller). The order is the decision's (docs/commerce.md): the SKU
// covering the offering and the agreement (AGREEMENT_REQUIRED), the
// request's price cap (BUDGET_INSUFFICIENT), the consumer owner's credits
// (INSUFFICIENT_FUNDS), then the engagement's volume (RATE_LIMITED), which
// is last because it spends a unit of the window. A refusal is the error
// answer; the node sends it to the requester as it is.
func (w *Worker) admit(ctx context.Context, r *bus.Request) (any, error) {
	q, err := DecodeAdmit(r.Env.Payload)
	if err != nil {
		return nil, err
	}
	seller := r.Env.From
	out, refusal, err := w.decide(ctx, seller, q)
	if err != nil {
		return nil, err
	}
	if refusal != nil {
		w.recordRefusal(seller, q, refusal.Code)
		return nil, refusal
	}
	return out, nil
}

// decide is admit's decision: the answer, or the refusal to send, or an
// error when live state could not be read (the node then fails closed on
// a paid offering).
func (w *Worker) decide(ctx context.Context, seller string, q AdmitRequest) (*Admitted, *errs.Error, error) {
	skus, err := w.sellerSKUs(ctx, seller)
	if err != nil {
		return nil, nil, err
	}
	now := w.now()
	if refusal, err := w.scope(ctx, seller, q.Requester, q.Offering, now); err != nil || refusal != nil {
		return nil, refusal, err
	}
	out := &Admitted{Admitted: true}
	s, covered := commerce.For(skus, q.Offering)
	if covered {
		out.SKU, out.SKUDigest = s.ID, s.Digest()
	}
	var ticket *commerce.Ticket
	if covered && s.Price.Paid() {
		owner, err := w.ownerOf(ctx, q.Requester)
		if err != nil {
			return nil, nil, err
		}
		price, resale, err := w.retail(ctx, seller, s)
		if err != nil {
			return nil, nil, err
		}
		if refusal, err := w.agreed(ctx, skus, s, seller, owner, q.Offering, now, price); err != nil || refusal != nil {
			return nil, refusal, err
		}
		if refusal := priceCap(s, price, q.Budget); refusal != nil {
			return nil, refusal, nil
		}
		if refusal, err := w.funds(ctx, s, owner, price); err != nil || refusal != nil {
			return nil, refusal, err
		}
		if ticket, err = w.ticketFor(ctx, seller, q, s, owner, price, resale); err != nil {
			return nil, nil, err
		}
	}
	sow, refusal, err := w.volume(ctx, seller, q.Requester, q.Offering, now)
	if err != nil || refusal != nil {
		return nil, refusal, err
	}
	if refusal, err := w.writeTicket(ctx, ticket); err != nil || refusal != nil {
		return nil, refusal, err
	}
	out.SowID = sow
	return out, nil, nil
}

// agreed refuses with AGREEMENT_REQUIRED unless owner's agreement on file
// to s verifies, is not revoked, and covers this seller, the SKU's current
// digest and now (commerce.Admit). The refusal carries exactly {sku,
// sku_digest, approval_url, price_credits}; price_credits is price, the
// retail unit price (the markup included on the resale path).
func (w *Worker) agreed(ctx context.Context, skus []commerce.SKU, s commerce.SKU, seller, owner, offering string, now time.Time, price int64) (*errs.Error, error) {
	var held []commerce.Agreement
	if owner != "" {
		b, found, err := bus.LeaderGet(ctx, w.svc.NC, commerce.Bucket, commerce.AgreementKey(seller, owner, s.ID))
		if err != nil {
			return nil, errs.Wrap(errs.Unavailable, "the agreements could not be read just now; retry", err)
		}
		if found {
			var rec commerce.AgreementRecord
			if err := json.Unmarshal(b, &rec); err == nil && (rec.RevokedAt == nil || now.Before(*rec.RevokedAt)) {
				if a, err := commerce.ParseAgreement(rec.Agreement); err == nil {
					held = append(held, a)
				}
			}
		}
	}
	d := commerce.Admit(skus, held, commerce.Request{Seller: seller, ConsumerOwner: owner, Offering: offering, Now: now}, w.approvalURL)
	if d.Refusal == nil {
		return nil, nil
	}
	refusal := commerce.AgreementRequired(commerce.Required{SKU: s.ID, SKUDigest: s.Digest(), ApprovalURL: w.approvalURL(s), PriceCredits: &price})
	if owner == "" {
		// The same refusal and details; the words say why no approval by
		// this agent's own key can ever cover it.
		refusal.Message = fmt.Sprintf("%s is a paid offering and the requesting agent has no owner (a guest, an agent that is its own node, or one whose owner attestation has expired), so no agreement covers it; register it with its owner's attestation, and have that owner approve at %s",
			s.ID, w.approvalURL(s))
	}
	return refusal, nil
}

// PriceCredits is the retail unit price of s in micro-units of its
// currency, what AGREEMENT_REQUIRED quotes as price_credits: a flat
// price's amount per request, a per_unit price's per `per` units, a
// package's per package, a tiered price's first tier; 0 for a free one.
// Admission quotes the retail price: this plus the resale markup of an
// official catalog agent (spec §8; Worker.retail).
func PriceCredits(s commerce.SKU) int64 {
	p := s.Price
	switch p.Model {
	case commerce.ModelFlat, commerce.ModelPerUnit, commerce.ModelPackage:
		return p.AmountMicro
	case commerce.ModelTiered:
		if len(p.Tiers) > 0 {
			return p.Tiers[0].AmountMicro
		}
	}
	return 0
}

// priceCap refuses a flat-priced request whose budget's cost ceiling does
// not cover the price (spec §7.1: BUDGET_INSUFFICIENT with the estimate).
// A ceiling in another currency cannot be judged to cover it and refuses
// too. Metered prices are not known before the work, so the ceiling is the
// seller's to honour as it runs.
func priceCap(s commerce.SKU, price int64, b *protocol.Budget) *errs.Error {
	if b == nil || b.CostCeiling == nil || s.Price.Model != commerce.ModelFlat {
		return nil
	}
	ceiling := *b.CostCeiling
	if ceiling.Currency == s.Price.Currency && ceiling.AmountMicro >= price {
		return nil
	}
	est := protocol.Money{AmountMicro: price, Currency: s.Price.Currency}
	return protocol.BudgetInsufficient(est, fmt.Sprintf("%s costs %s per request, above the request's cost ceiling of %s", s.ID, est, ceiling)).
		WithDetail("sku", s.ID)
}

// funds refuses with INSUFFICIENT_FUNDS a request to an internal SKU in
// credits whose consumer owner's balance (bal.<owner>, kept by the
// clearing service) is below the price, or still owes part of an earlier
// sale (Balance.Unpaid). A missing balance is zero.
func (w *Worker) funds(ctx context.Context, s commerce.SKU, owner string, price int64) (*errs.Error, error) {
	if s.Provider.ID != commerce.ProviderInternal || s.Price.Currency != commerce.Credits || price == 0 {
		return nil, nil
	}
	b, found, err := bus.LeaderGet(ctx, w.svc.NC, commerce.Bucket, commerce.BalancePrefix+owner)
	if err != nil {
		return nil, errs.Wrap(errs.Unavailable, "the credit balance could not be read just now; retry", err)
	}
	var bal commerce.Balance
	if found {
		if err := json.Unmarshal(b, &bal); err != nil {
			return nil, errs.Wrap(errs.Unavailable, "the credit balance could not be read; retry later", err)
		}
	}
	if bal.Unpaid > 0 {
		return unpaidRefusal(s, owner, bal, price), nil
	}
	if bal.Credits >= price {
		return nil, nil
	}
	short := price - bal.Credits
	return errs.Newf(errs.InsufficientFunds, "%s costs %s XCR and owner %s has %s XCR: add credits, then retry",
		s.ID, protocol.FormatMicro(price), owner, protocol.FormatMicro(bal.Credits)).
		WithDetails(map[string]any{"sku": s.ID, "amount_micro": price, "currency": commerce.Credits, "shortfall_micro": short}), nil
}

// SubjRefused is where refusals are recorded as meter events: under
// mesh.internal.>, which only the mesh's services reach, since a refusal
// says who tried to buy what from whom.
const SubjRefused = "mesh.internal.metering.refused"

// recordRefusal publishes the refusal as a quantity-0 requests meter event
// (metering.RefusalEvent) on SubjRefused, an emit envelope {domain:
// "metering", event_type: "refused", data} signed by the services key:
// refusals rate to zero but stay on record. A failure is logged; the
// refusal stands.
func (w *Worker) recordRefusal(seller string, q AdmitRequest, code errs.Code) {
	ev := metering.RefusalEvent(seller, q.Requester, q.Offering, q.RequestID, protocol.FormatTime(w.now()), string(code))
	err := func() error {
		e, err := protocol.New(protocol.TypeEmit, w.svc.Key.Public(), map[string]any{"domain": "metering", "event_type": "refused", "data": ev})
		if err != nil {
			return err
		}
		if err := e.Sign(w.svc.Key); err != nil {
			return err
		}
		b, err := e.Marshal()
		if err != nil {
			return err
		}
		return w.svc.NC.Publish(SubjRefused, b)
	}()
	if err != nil {
		w.svc.Log.Warn("the refusal's meter event was not published", "seller", seller, "code", code, "err", err)
	}
}
