package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
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
	CommerceQuote  = "quote"
	CommerceAgree  = "agree"
	CommerceRevoke = "revoke"
	CommerceList   = "list"
)

// CommerceCommand is one agreements command: quote a seller's SKU (its
// current price and digest, nothing signed), agree to it (Expires
// optional, an RFC 3339 instant; Digest, when set, the terms digest the
// person saw: the agreement is refused when the seller's current terms
// differ), revoke that agreement, or list the owner's agreements. Seller
// is an agent id or a handle.
type CommerceCommand struct {
	Verb    string `json:"verb"`
	Seller  string `json:"seller,omitempty"`
	SKU     string `json:"sku,omitempty"`
	Digest  string `json:"digest,omitempty"`
	Expires string `json:"expires,omitempty"`
}

// ErrTermsChanged is agree's error when the seller's current terms are not
// the digest the person agreed to.
var ErrTermsChanged = errors.New("the seller's terms changed")

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
	case CommerceQuote:
		s, err := a.currentSKU(ctx, cmd)
		if err != nil {
			return nil, err
		}
		return &Agreed{Seller: cmd.Seller, SKU: s.ID, Digest: s.Digest(), Price: s.Advert().Price}, nil
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
// signs an agreement to them with the owner key and files it. With
// cmd.Digest set, terms whose digest differs are refused before anything
// is signed (ErrTermsChanged): the seller re-priced since the person saw
// them.
func (a *adapter) agree(ctx context.Context, cmd CommerceCommand) (*Agreed, error) {
	s, err := a.currentSKU(ctx, cmd)
	if err != nil {
		return nil, err
	}
	if cmd.Digest != "" && cmd.Digest != s.Digest() {
		return nil, fmt.Errorf("%w: %s of agent %s is now %s, terms digest %s, not %s as agreed; review the new terms, then run `mesh-adapter agree %s %s --digest %s`",
			ErrTermsChanged, s.ID, cmd.Seller, PriceText(s.Advert().Price), s.Digest(), cmd.Digest, cmd.Seller, s.ID, s.Digest())
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

// currentSKU reads the seller's current terms for cmd.SKU from the
// registry.
func (a *adapter) currentSKU(ctx context.Context, cmd CommerceCommand) (commerce.SKU, error) {
	var rec map[string]any
	if err := a.callService(ctx, protocol.RegistryGetSubject(cmd.Seller), protocol.TypeDiscover, map[string]any{}, &rec); err != nil {
		if errs.CodeOf(err) == errs.NotFound {
			return commerce.SKU{}, fmt.Errorf("agent %s is not registered (or not visible to this agent): there is nothing to agree to", cmd.Seller)
		}
		return commerce.SKU{}, fmt.Errorf("the seller's terms could not be read: %w", err)
	}
	// Decoded again through the protocol's parser: the digest is over the
	// SKU exactly as published.
	raw, _ := json.Marshal(rec["skus"])
	v, err := protocol.ParseJSON(raw)
	if err != nil {
		return commerce.SKU{}, err
	}
	var skus []commerce.SKU
	if v != nil {
		if skus, err = commerce.SKUsFromValue(v); err != nil {
			return commerce.SKU{}, fmt.Errorf("agent %s publishes SKUs this adapter cannot read: %w", cmd.Seller, err)
		}
	}
	ids := make([]string, 0, len(skus))
	for _, x := range skus {
		if x.ID == cmd.SKU {
			return x, nil
		}
		ids = append(ids, x.ID)
	}
	if len(ids) == 0 {
		return commerce.SKU{}, fmt.Errorf("agent %s sells nothing: its manifest publishes no SKU", cmd.Seller)
	}
	return commerce.SKU{}, fmt.Errorf("agent %s publishes no SKU %q; it publishes %s", cmd.Seller, cmd.SKU, strings.Join(ids, ", "))
}

// revokeAgreement signs a revocation of the owner's agreement to the
// seller's SKU, the one on file (named by its agreed_at, which the service
// lists), and files it.
func (a *adapter) revokeAgreement(ctx context.Context, cmd CommerceCommand) (*Agreed, error) {
	held, err := a.ownerAgreements(ctx, cmd.Seller)
	if err != nil {
		return nil, err
	}
	agreedAt := ""
	for _, e := range held {
		if e.SellerAgent == cmd.Seller && e.SKU == cmd.SKU {
			agreedAt = e.AgreedAt
		}
	}
	if agreedAt == "" {
		return nil, fmt.Errorf("owner %s holds no agreement to %s of agent %s: there is nothing to revoke", a.keys.Owner.Public(), cmd.SKU, cmd.Seller)
	}
	rv := agreements.Revocation{SellerAgent: cmd.Seller, SKU: cmd.SKU, AgreedAt: agreedAt, RevokedAt: protocol.FormatTime(time.Now())}
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
	return a.ownerAgreements(ctx, "")
}

// maxListPages bounds the pages read for one listing (the service keeps at
// most DefaultMaxPerOwner agreements of an owner).
const maxListPages = 20

// ownerAgreements reads the owner's agreements, those made to seller only
// when seller is set, page by page.
func (a *adapter) ownerAgreements(ctx context.Context, seller string) ([]agreements.Entry, error) {
	var all []agreements.Entry
	after := ""
	for range maxListPages {
		q := map[string]any{"consumer_owner": a.keys.Owner.Public(), "limit": agreements.MaxListLimit}
		if seller != "" {
			q["seller_agent"] = seller
		}
		if after != "" {
			q["after"] = after
		}
		var out struct {
			Agreements []agreements.Entry `json:"agreements"`
			Next       string             `json:"next"`
		}
		if err := a.callService(ctx, protocol.AgreementVerbSubject("list"), protocol.TypeRequest, q, &out); err != nil {
			if errs.CodeOf(err) == errs.Forbidden {
				return nil, fmt.Errorf("the agreements service does not take owner key %s as this agent's owner (the registry names another): %w", a.keys.Owner.Public(), err)
			}
			return nil, err
		}
		all = append(all, out.Agreements...)
		if after = out.Next; after == "" {
			break
		}
	}
	return all, nil
}

// PriceText is a SKU's price for people: "0.25 XCR per request", "0.10
// USD per 1000 tokens", "free".
func PriceText(v any) string {
	p, err := commerce.PriceFromValue(v)
	if err != nil {
		return "an unreadable price"
	}
	money := func(m int64) string { return protocol.Money{AmountMicro: m, Currency: p.Currency}.String() }
	per := func(n int64, meter string) string {
		if n <= 1 {
			return meter
		}
		return strconv.FormatInt(n, 10) + " " + meter
	}
	switch p.Model {
	case commerce.ModelFree:
		return "free"
	case commerce.ModelFlat:
		return money(p.AmountMicro) + " per request"
	case commerce.ModelPerUnit:
		return money(p.AmountMicro) + " per " + per(p.Divisor(), p.Meter)
	case commerce.ModelPackage:
		return money(p.AmountMicro) + " per " + per(p.Size, p.Meter) + " per " + p.Period
	case commerce.ModelTiered:
		if len(p.Tiers) > 0 {
			return "tiered, from " + money(p.Tiers[0].AmountMicro) + " per " + per(p.Divisor(), p.Meter)
		}
	}
	return p.Model
}

// AgreementRequiredLine is an AGREEMENT_REQUIRED refusal as one line: what
// to approve, where, and the command that approves it from here, pinned to
// the terms the refusal named (their digest: agree refuses terms that
// changed since).
func AgreementRequiredLine(seller string, e *errs.Error) string {
	skuID, _ := e.Details["sku"].(string)
	digest, _ := e.Details["sku_digest"].(string)
	url, _ := e.Details["approval_url"].(string)
	price := ""
	if p, ok := e.Details["price_credits"].(float64); ok {
		price = " (" + protocol.FormatMicro(int64(p)) + " credits per unit)"
	}
	return fmt.Sprintf("AGREEMENT_REQUIRED: %s is a paid offering%s and this account has not agreed to its current terms; approve at %s or run `mesh-adapter agree %s %s --digest %s`",
		OneLine(skuID), price, OneLine(url), seller, OneLine(skuID), OneLine(digest))
}
