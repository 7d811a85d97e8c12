// Package commerce is what an agent sells and on what terms (upstream spec
// §19.1, §19.4-19.6; conformance fixture commerce.json; DESIGN §11): SKUs
// and their prices, the SKU digest that is the identity of the terms, the
// agreement a consumer's owner signs to a digest, the admission decision
// that refuses a paid offering with AGREEMENT_REQUIRED before any work, and
// the integer rating of metered usage.
//
// The digest binds everything: one moved micro-unit moves it, and every
// agreement signed to the old digest stops covering at once. There is no
// grandfathering to disagree about; re-approval is the rule.
package commerce

import (
	"net/url"
	"regexp"
	"slices"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/jsonv"
	"agentmesh.dev/mesh/shared/protocol"
)

// ProviderInternal names the deployment's own clearing as the biller.
const ProviderInternal = "internal"

var skuIDRE = regexp.MustCompile(`^[a-z0-9-]{1,64}$`)

// ValidSKUID reports whether id has the SKU id shape [a-z0-9-]{1,64}.
func ValidSKUID(id string) bool { return skuIDRE.MatchString(id) }

// SKU is one priced unit of sale in an agent's manifest.
type SKU struct {
	ID       string
	Covers   Covers
	Price    Price
	Provider Provider

	value  map[string]any // as published: the digest's input
	digest string
}

// Covers is what a SKU prices: the whole agent, or named offerings.
type Covers struct {
	Agent     bool
	Offerings []string
}

// Provider is who bills for a SKU (§19.4): "internal", the deployment's
// own clearing, or an external commerce provider's name.
type Provider struct {
	ID          string
	TermsURL    string
	CheckoutURL string
	AccountRef  string
}

// Digest is the SKU digest: base64url SHA-256 over "agentmesh-sku-v1\n" and
// the canonical JSON of the SKU as published.
func (s SKU) Digest() string { return s.digest }

// Value is the SKU as published, for rendering and storefronts. Callers
// must not modify it.
func (s SKU) Value() map[string]any { return s.value }

// Covering reports whether the SKU covers offering, and whether it does so
// by name (more specific than an agent-wide SKU).
func (s SKU) Covering(offering string) (covers, byName bool) {
	if slices.Contains(s.Covers.Offerings, offering) {
		return true, true
	}
	return s.Covers.Agent, false
}

func skuErr(format string, args ...any) *errs.Error {
	return errs.Newf(errs.InvalidManifest, "SKU: "+format, args...)
}

// ParseSKU shape-checks one SKU given as JSON text.
func ParseSKU(data []byte) (SKU, error) {
	v, err := protocol.ParseJSON(data)
	if err != nil {
		return SKU{}, errs.Wrap(errs.InvalidManifest, "SKU is not valid JSON", err)
	}
	return SKUFromValue(v)
}

// SKUFromValue shape-checks a decoded SKU {sku, covers, price, provider}
// and computes its digest. It refuses, as INVALID_MANIFEST: a member this
// version does not know; an id outside [a-z0-9-]{1,64}; covers that is not
// exactly one of {agent: true} or {offerings: [non-empty, distinct ids]};
// a price PriceFromValue refuses; and a provider without its id (every SKU
// names who bills for it), with unknown members, or with a terms or
// checkout URL that is not an absolute http(s) URL.
func SKUFromValue(v any) (SKU, error) {
	m, ok := jsonv.Object(v)
	if !ok {
		return SKU{}, skuErr("must be an object {sku, covers, price, provider}")
	}
	if k, bad := jsonv.Unknown(m, "sku", "covers", "price", "provider"); bad {
		return SKU{}, skuErr("unknown member %q", k)
	}
	var s SKU
	if s.ID, _ = m["sku"].(string); !ValidSKUID(s.ID) {
		return SKU{}, skuErr("sku must match [a-z0-9-]{1,64}")
	}
	c, ok := jsonv.Object(m["covers"])
	if !ok {
		return SKU{}, skuErr("%s: covers is required: {agent: true} or {offerings: [...]}", s.ID)
	}
	if k, bad := jsonv.Unknown(c, "agent", "offerings"); bad {
		return SKU{}, skuErr("%s: covers has unknown member %q", s.ID, k)
	}
	agent, hasAgent := c["agent"]
	list, hasList := c["offerings"]
	if hasAgent == hasList {
		return SKU{}, skuErr("%s: covers is agent XOR offerings", s.ID)
	}
	if hasAgent {
		if agent != true {
			return SKU{}, skuErr("%s: covers.agent, when present, is the literal true", s.ID)
		}
		s.Covers.Agent = true
	} else {
		offerings, ok := jsonv.Strings(list)
		if !ok || len(offerings) == 0 {
			return SKU{}, skuErr("%s: covers.offerings must be a non-empty list of offering ids: an empty list covers nothing", s.ID)
		}
		for i, o := range offerings {
			if o == "" || slices.Contains(offerings[:i], o) {
				return SKU{}, skuErr("%s: covers.offerings must name distinct, non-empty offering ids", s.ID)
			}
		}
		s.Covers.Offerings = offerings
	}
	var err error
	if s.Price, err = PriceFromValue(m["price"]); err != nil {
		return SKU{}, errs.Wrap(errs.InvalidManifest, "SKU "+s.ID+": "+errs.As(err).Message, err)
	}
	if s.Provider, err = providerFromValue(s.ID, m["provider"]); err != nil {
		return SKU{}, err
	}
	s.value = m
	if s.digest, err = protocol.SKUDigest(m); err != nil {
		return SKU{}, errs.Wrap(errs.InvalidManifest, "SKU "+s.ID+" cannot be digested", err)
	}
	return s, nil
}

func providerFromValue(id string, v any) (Provider, error) {
	m, ok := jsonv.Object(v)
	if !ok {
		return Provider{}, skuErr("%s: every SKU names who bills for it: provider {id} is required", id)
	}
	if k, bad := jsonv.Unknown(m, "id", "terms_url", "checkout_url", "account_ref"); bad {
		return Provider{}, skuErr("%s: provider has unknown member %q", id, k)
	}
	var p Provider
	if p.ID, _ = m["id"].(string); p.ID == "" {
		return Provider{}, skuErr("%s: every SKU names who bills for it: provider.id is required (\"internal\" or the provider's name)", id)
	}
	for _, f := range []struct {
		name, shape string
		dst         *string
	}{{"terms_url", "an absolute http(s) URL", &p.TermsURL}, {"checkout_url", "an absolute http(s) URL", &p.CheckoutURL},
		{"account_ref", "a non-empty string", &p.AccountRef}} {
		raw, present := m[f.name]
		if !present {
			continue
		}
		s, ok := raw.(string)
		if !ok || s == "" || (f.dst != &p.AccountRef && !httpURL(s)) {
			return Provider{}, skuErr("%s: provider.%s must be %s", id, f.name, f.shape)
		}
		*f.dst = s
	}
	return p, nil
}

func httpURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "https" || u.Scheme == "http") && u.Host != ""
}

// SKUsFromValue shape-checks a manifest's skus array: every SKU, ids unique
// in the manifest, and coverage unambiguous (no offering named by two SKUs,
// at most one agent-wide SKU), so "most specific wins" always has one
// answer.
func SKUsFromValue(v any) ([]SKU, error) {
	list, ok := jsonv.Array(v)
	if !ok {
		return nil, skuErr("skus must be an array")
	}
	out := make([]SKU, 0, len(list))
	named := map[string]string{}
	agentWide := ""
	for _, item := range list {
		s, err := SKUFromValue(item)
		if err != nil {
			return nil, err
		}
		for _, prev := range out {
			if prev.ID == s.ID {
				return nil, skuErr("duplicate sku id %q: ids are unique within the manifest", s.ID)
			}
		}
		if s.Covers.Agent {
			if agentWide != "" {
				return nil, skuErr("%s and %s both cover the whole agent; at most one SKU may", agentWide, s.ID)
			}
			agentWide = s.ID
		}
		for _, o := range s.Covers.Offerings {
			if other, dup := named[o]; dup {
				return nil, skuErr("offering %q is covered by both %s and %s", o, other, s.ID)
			}
			named[o] = s.ID
		}
		out = append(out, s)
	}
	return out, nil
}

// For returns the SKU covering offering: one naming it beats an agent-wide
// one. false means the offering is free: paid is the declared exception.
func For(skus []SKU, offering string) (SKU, bool) {
	var wide *SKU
	for i := range skus {
		covers, byName := skus[i].Covering(offering)
		if byName {
			return skus[i], true
		}
		if covers && wide == nil {
			wide = &skus[i]
		}
	}
	if wide == nil {
		return SKU{}, false
	}
	return *wide, true
}

// Advert is a SKU as a storefront advertises it (§8.7): the id, the price
// as published and the digest an agreement would bind to.
type Advert struct {
	SKU    string `json:"sku"`
	Price  any    `json:"price"`
	Digest string `json:"digest"`
}

// Advert returns the storefront advertisement of s.
func (s SKU) Advert() Advert { return Advert{SKU: s.ID, Price: s.value["price"], Digest: s.digest} }
