package node

import (
	"context"
	"encoding/json"
	"time"

	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// AdmitTimeout bounds the seller's question to the agreements service at
// admission (mesh.commerce.admit), before the accept.
const AdmitTimeout = 10 * time.Second

// sells is what a manifest publishes for sale: its SKUs, parsed as the
// registry holds them (a round trip through JSON, whatever Go values built
// the manifest), and whether it publishes any at all. A manifest whose
// skus do not parse here still sells (the registry validated them), and
// the node then takes every offering for paid when the service cannot be
// asked.
type sells struct {
	any  bool
	skus []commerce.SKU
	ok   bool // skus parsed
}

func manifestSKUs(m map[string]any) sells {
	raw, present := m["skus"]
	if !present || raw == nil {
		return sells{}
	}
	b, err := json.Marshal(raw)
	if err != nil {
		return sells{any: true}
	}
	v, err := protocol.ParseJSON(b)
	if err != nil {
		return sells{any: true}
	}
	if list, isList := v.([]any); isList && len(list) == 0 {
		return sells{}
	}
	skus, err := commerce.SKUsFromValue(v)
	return sells{any: true, skus: skus, ok: err == nil}
}

// registeredSKUs is what the manifest last registered sells.
func (a *Agent) registeredSKUs() sells {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.skus
}

// passedOn reports whether e is one of the service's refusals a seller's
// node sends to the requester as it is: the commerce refusals, an
// engagement's scope refusal (FORBIDDEN naming the engagement, Agent SoW
// §5.2), and a reused request id (CONFLICT naming it). Any other error of the service is about the service (or the
// node's question), not the request.
func passedOn(e *errs.Error) bool {
	switch e.Code {
	case errs.AgreementRequired, errs.BudgetInsufficient, errs.InsufficientFunds, errs.RateLimited:
		return true
	case errs.Forbidden:
		_, scope := e.Details["sow_id"]
		return scope
	case errs.Conflict:
		// A request id this seller already admitted for another request
		// (the admission ticket is one per seller and id): the requester
		// must send it again with a fresh id, not retry it.
		_, reused := e.Details["request_id"]
		return reused
	}
	return false
}

// undecidedRetryMS is the retry_after_ms of the refusal sent when the
// service could not decide.
const undecidedRetryMS = 5000

// commerceAdmit is admission by the terms the agent sells on (DESIGN §11,
// docs/commerce.md "Agreements and admission on the seller's node"): an
// agent whose manifest publishes any SKU asks the agreements service
// whether the requester may have the offering, and a commerce refusal
// (passedOn) is sent to the requester as the service worded it, before any
// accept and before the handler. An agent that publishes no SKU pays no
// round trip.
//
// An agent that publishes SKUs opted into commerce, and an engagement's
// volume is counted only by the service: when the service cannot decide
// (no answer, an answer not signed by the services key, or any error that
// is no commerce refusal) every request fails closed, free offerings
// included, with a retryable UNAVAILABLE, and c.undecided is set (serve
// then keeps a drained request in the mailbox for a later drain). The
// cause is logged here, never told to the requester.
func (a *Agent) commerceAdmit(c *Call) *errs.Error {
	sold := a.registeredSKUs()
	if !sold.any {
		return nil
	}
	q := map[string]any{"requester": c.Env.From, "offering": c.Offering, "request_id": c.Env.ID}
	if c.Budget != nil {
		q["budget"] = c.Budget
	}
	ctx, cancel := context.WithTimeout(c.ctx, AdmitTimeout)
	defer cancel()
	rep, err := bus.Call(ctx, a.n.nc, a.key, protocol.SubjCommerceAdmit, protocol.TypeRequest, "", q)
	pin := a.n.cfg.ServicesKey
	switch {
	case rep != nil && pin != "" && rep.From != pin:
		a.n.log.Warn("admission: the answer is not signed by the services key", "agent", a.id, "signer", rep.From)
	case rep != nil && err != nil && passedOn(errs.As(err)):
		return errs.As(err) // the service's refusal, as it worded it
	case rep != nil && err == nil:
		return nil
	default:
		a.n.log.Warn("admission: the agreements service did not decide", "agent", a.id, "offering", c.Offering, "err", err)
	}
	c.undecided = true
	return errs.Newf(errs.Unavailable, "%s is sold under terms that cannot be checked right now (the mesh's agreements service did not answer); retry shortly", c.Offering).
		WithRetryAfter(undecidedRetryMS)
}
