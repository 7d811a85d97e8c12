package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"agentmesh.dev/mesh/adapter/control"
	"agentmesh.dev/mesh/shared/agreements"
	"agentmesh.dev/mesh/shared/bus"
	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/protocol"
)

// Commerce verbs of the control socket's "commerce" operation (and of
// Commerce without a running adapter).
const (
	CommerceAgree  = "agree"
	CommerceRevoke = "revoke"
	CommerceList   = "list"
)

// CommerceCommand is one agreements command: agree to a seller's SKU
// (Expires optional, an RFC 3339 instant), revoke that agreement, or list
// the owner's agreements. Seller is an agent id or a handle.
type CommerceCommand struct {
	Verb    string `json:"verb"`
	Seller  string `json:"seller,omitempty"`
	SKU     string `json:"sku,omitempty"`
	Expires string `json:"expires,omitempty"`
}

// Agreed is what agree and revoke answer: what was agreed to (or revoked),
// as the service keeps it.
type Agreed struct {
	Seller    string `json:"seller_agent"`
	Owner     string `json:"consumer_owner"`
	SKU       string `json:"sku"`
	Digest    string `json:"sku_digest"`
	Price     any    `json:"price,omitempty"`
	AgreedAt  string `json:"agreed_at"`
	ExpiresAt string `json:"expires_at,omitempty"`
	RevokedAt string `json:"revoked_at,omitempty"`
}

// commerceTimeout bounds each bus call of an agreements command.
const commerceTimeout = 15 * time.Second

// commerce runs an agreements command for the control socket.
func (a *adapter) commerce(ctx context.Context, r control.Request) (any, error) {
	var cmd CommerceCommand
	if err := json.Unmarshal(r.Commerce, &cmd); err != nil {
		return nil, fmt.Errorf("the agreements command is not readable: %w", err)
	}
	if a.guest != nil {
		return nil, errGuestCommerce
	}
	if err := a.notConnected(ctx); err != nil {
		return nil, err
	}
	if cmd.Seller != "" {
		cfg := a.cfg
		cfg.RegistrarURL = firstNonEmpty(r.RegistrarURL, cfg.RegistrarURL)
		to, err := resolveRecipient(ctx, cfg, cmd.Seller, SendOptions{AcceptNewBinding: r.AcceptNewBinding})
		if err != nil {
			return nil, err
		}
		cmd.Seller = to
	}
	return a.doCommerce(ctx, cmd)
}

var errGuestCommerce = errors.New("agreements are signed by an owner key: a guest identity has none; run `mesh-adapter up <agent-key>` first")

// Commerce runs one agreements command without a running adapter: the
// agent comes up for the length of the command, like Room.
func Commerce(ctx context.Context, cfg Config, cmd CommerceCommand, opt SendOptions) (any, error) {
	cfg.Mode = ModeInbox
	switch id, err := cfg.Dir.Identity(); {
	case err != nil:
		return nil, err
	case id.Guest:
		return nil, errGuestCommerce
	}
	conf, err := cfg.Dir.Config()
	if err != nil {
		return nil, err
	}
	if cmd.Seller != "" {
		rcfg := cfg
		rcfg.RegistrarURL = firstNonEmpty(opt.RegistrarURL, cfg.RegistrarURL, conf.RegistrarURL)
		if cmd.Seller, err = resolveRecipient(ctx, rcfg, cmd.Seller, opt); err != nil {
			return nil, err
		}
	}
	a, closeAll, err := open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	return a.doCommerce(ctx, cmd)
}

func (a *adapter) doCommerce(ctx context.Context, cmd CommerceCommand) (any, error) {
	switch cmd.Verb {
	case CommerceAgree:
		return a.agree(ctx, cmd)
	case CommerceRevoke:
		return a.revokeAgreement(ctx, cmd)
	case CommerceList:
		return a.listAgreements(ctx)
	}
	return nil, fmt.Errorf("unknown agreements verb %q", cmd.Verb)
}

// call makes one signed call of the agent to a service subject and
// decodes the answer's payload into out.
func (a *adapter) callService(ctx context.Context, subject string, typ protocol.Type, payload, out any) error {
	ctx, cancel := context.WithTimeout(ctx, commerceTimeout)
	defer cancel()
	rep, err := bus.Call(ctx, a.node.Conn(), a.keys.Agent, subject, typ, "", payload)
	if err != nil {
		return err
	}
	if out == nil {
		return nil
	}
	return rep.DecodePayload(out)
}

// agree reads the seller's current terms for the SKU from the registry,
// signs an agreement to them with the owner key and files it.
func (a *adapter) agree(ctx context.Context, cmd CommerceCommand) (*Agreed, error) {
	var rec map[string]any
	if err := a.callService(ctx, protocol.RegistryGetSubject(cmd.Seller), protocol.TypeDiscover, map[string]any{}, &rec); err != nil {
		if errs.CodeOf(err) == errs.NotFound {
			return nil, fmt.Errorf("agent %s is not registered (or not visible to this agent): there is nothing to agree to", cmd.Seller)
		}
		return nil, fmt.Errorf("the seller's terms could not be read: %w", err)
	}
	// Decoded again through the protocol's parser: the digest is over the
	// SKU exactly as published.
	raw, _ := json.Marshal(rec["skus"])
	v, err := protocol.ParseJSON(raw)
	if err != nil {
		return nil, err
	}
	var skus []commerce.SKU
	if v != nil {
		if skus, err = commerce.SKUsFromValue(v); err != nil {
			return nil, fmt.Errorf("agent %s publishes SKUs this adapter cannot read: %w", cmd.Seller, err)
		}
	}
	var s commerce.SKU
	found := false
	ids := make([]string, 0, len(skus))
	for _, x := range skus {
		ids = append(ids, x.ID)
		if x.ID == cmd.SKU {
			s, found = x, true
		}
	}
	if !found {
		if len(ids) == 0 {
			return nil, fmt.Errorf("agent %s sells nothing: its manifest publishes no SKU", cmd.Seller)
		}
		return nil, fmt.Errorf("agent %s publishes no SKU %q; it publishes %s", cmd.Seller, cmd.SKU, strings.Join(ids, ", "))
	}
	ag := commerce.Agreement{SellerAgent: cmd.Seller, SKU: s.ID, SKUDigest: s.Digest(), AgreedAt: protocol.FormatTime(time.Now()), ExpiresAt: cmd.Expires}
	if err := commerce.Sign(&ag, a.keys.Owner); err != nil {
		return nil, err
	}
	if err := a.callService(ctx, protocol.AgreementVerbSubject("file"), protocol.TypeRequest, ag, nil); err != nil {
		return nil, fmt.Errorf("the agreements service refused the agreement: %w", err)
	}
	return &Agreed{Seller: ag.SellerAgent, Owner: ag.ConsumerOwner, SKU: ag.SKU, Digest: ag.SKUDigest, Price: s.Advert().Price,
		AgreedAt: ag.AgreedAt, ExpiresAt: ag.ExpiresAt}, nil
}

// revokeAgreement signs a revocation of the owner's agreement to the
// seller's SKU and files it.
func (a *adapter) revokeAgreement(ctx context.Context, cmd CommerceCommand) (*Agreed, error) {
	rv := agreements.Revocation{SellerAgent: cmd.Seller, SKU: cmd.SKU, RevokedAt: protocol.FormatTime(time.Now())}
	if err := agreements.SignRevocation(&rv, a.keys.Owner); err != nil {
		return nil, err
	}
	var out struct {
		Agreement agreements.Entry `json:"agreement"`
	}
	if err := a.callService(ctx, protocol.AgreementVerbSubject("revoke"), protocol.TypeRequest, rv, &out); err != nil {
		return nil, fmt.Errorf("the agreements service refused the revocation: %w", err)
	}
	e := out.Agreement
	return &Agreed{Seller: e.SellerAgent, Owner: e.ConsumerOwner, SKU: e.SKU, Digest: e.SKUDigest, AgreedAt: e.AgreedAt,
		ExpiresAt: e.ExpiresAt, RevokedAt: e.RevokedAt}, nil
}

// listAgreements lists the owner's agreements with the state of each
// (active, stale, expired, revoked), as the service judges them now.
func (a *adapter) listAgreements(ctx context.Context) ([]agreements.Entry, error) {
	var out struct {
		Agreements []agreements.Entry `json:"agreements"`
	}
	if err := a.callService(ctx, protocol.AgreementVerbSubject("list"), protocol.TypeRequest,
		map[string]any{"consumer_owner": a.keys.Owner.Public()}, &out); err != nil {
		if errs.CodeOf(err) == errs.Forbidden {
			return nil, fmt.Errorf("the agreements service does not take owner key %s as this agent's owner (the registry names another): %w", a.keys.Owner.Public(), err)
		}
		return nil, err
	}
	return out.Agreements, nil
}

// AgreementRequiredLine is an AGREEMENT_REQUIRED refusal as one line: what
// to approve, where, and the command that approves it from here.
func AgreementRequiredLine(seller string, e *errs.Error) string {
	skuID, _ := e.Details["sku"].(string)
	url, _ := e.Details["approval_url"].(string)
	price := ""
	if p, ok := e.Details["price_credits"].(float64); ok {
		price = " (" + protocol.FormatMicro(int64(p)) + " per unit)"
	}
	return fmt.Sprintf("AGREEMENT_REQUIRED: %s is a paid offering%s and this account has not agreed to its current terms; approve at %s or run `mesh-adapter agree %s %s`",
		OneLine(skuID), price, OneLine(url), seller, OneLine(skuID))
}
