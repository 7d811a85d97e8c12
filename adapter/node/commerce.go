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

// commerceAdmit is admission by the terms the agent sells on (DESIGN §11,
// docs/commerce.md "Agreements and admission on the seller's node"): an
// agent whose manifest publishes any SKU asks the agreements service
// whether the requester may have the offering, and a refusal is sent to
// the requester as the service worded it, before any accept and before
// the handler. An agent that publishes no SKU pays no round trip. When the
// service cannot answer, a paid offering fails closed (UNAVAILABLE,
// retryable) and a free one is admitted.
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
	case rep != nil && err != nil && errs.CodeOf(err) != errs.Unavailable:
		return errs.As(err) // the service's refusal, as it worded it
	case rep != nil && err == nil:
		return nil
	default:
		a.n.log.Warn("admission: the agreements service did not answer", "agent", a.id, "offering", c.Offering, "err", err)
	}
	if s, covered := commerce.For(sold.skus, c.Offering); !sold.ok || covered && s.Price.Paid() {
		return errs.Newf(errs.Unavailable, "%s is a paid offering and its terms cannot be checked right now (the mesh's agreements service did not answer); retry shortly", c.Offering).
			WithRetryAfter(5000)
	}
	return nil
}
