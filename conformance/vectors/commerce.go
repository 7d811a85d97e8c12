package vectors

import (
	"fmt"
	"net/url"
	"strings"
	"time"

	"agentmesh.dev/mesh/shared/commerce"
	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/metering"
	"agentmesh.dev/mesh/shared/protocol"
)

// checkCommerce: SKU and price shapes, the SKU digest, the agreement
// document and its signature, stale digests, the AGREEMENT_REQUIRED
// refusal through the admission decision, and rating arithmetic, all
// through shared/commerce.
func checkCommerce(t *T, doc map[string]any) {
	k, err := senderKey(doc)
	if err != nil {
		t.Run("identities", func() error { return err })
	}
	// skus collects every SKU the file publishes, for the sections that
	// name one by id or by digest.
	skus := catalog{byID: map[string]commerce.SKU{}, byDigest: map[string]commerce.SKU{}}
	if s, ok := doc["sku"].(map[string]any); ok {
		for i, v := range asArray(s["valid"]) {
			t.Run(fmt.Sprintf("sku/valid/%d", i), func() error {
				sku, err := commerce.SKUFromValue(v)
				if err != nil {
					return fmt.Errorf("a valid SKU was refused: %v", err)
				}
				if _, err := commerce.SKUsFromValue([]any{v}); err != nil {
					return fmt.Errorf("a manifest of this one SKU was refused: %v", err)
				}
				skus.add(sku)
				return nil
			})
		}
		for i, c := range asArray(s["invalid"]) {
			m := obj(c)
			t.Run("sku/invalid/"+caseName(m, fmt.Sprint(i)), func() error {
				_, err := commerce.SKUFromValue(m["sku"])
				return refused(err, errs.InvalidManifest, m)
			})
		}
	}
	if p, ok := doc["price"].(map[string]any); ok {
		for i, v := range asArray(p["valid"]) {
			t.Run(fmt.Sprintf("price/valid/%d", i), func() error {
				if _, err := commerce.PriceFromValue(v); err != nil {
					return fmt.Errorf("a valid price was refused: %v", err)
				}
				return nil
			})
		}
		for i, c := range asArray(p["invalid"]) {
			m := obj(c)
			t.Run("price/invalid/"+caseName(m, fmt.Sprint(i)), func() error {
				_, err := commerce.PriceFromValue(m["price"])
				return refused(err, errs.InvalidManifest, m)
			})
		}
	}
	if d, ok := doc["digest"].(map[string]any); ok {
		t.Run("digest", func() error { return checkSKUDigest(d, skus) })
		if mv, ok := d["one_micro_unit_moved"].(map[string]any); ok {
			t.Run("digest/one_micro_unit_moved", func() error { return checkDigestMoves(d, mv, skus) })
		}
	}
	if a, ok := doc["agreement"].(map[string]any); ok {
		checkAgreements(t, a, k, skus)
	}
	if e, ok := doc["enforcement"].(map[string]any); ok {
		checkEnforcement(t, e, skus)
	}
	if r, ok := doc["rating"].(map[string]any); ok {
		for i, c := range asArray(r["cases"]) {
			m := obj(c)
			t.Run("rating/"+caseName(m, fmt.Sprint(i)), func() error { return checkRating(m) })
		}
	}
}

// refused expects a refusal with code for the invalid case m.
func refused(err error, code errs.Code, m map[string]any) error {
	if err == nil {
		return fmt.Errorf("accepted, but it is invalid: %s", optStr(m, "why"))
	}
	if errs.CodeOf(err) != code {
		return fmt.Errorf("refused with %s, want %s: %v", errs.CodeOf(err), code, err)
	}
	return nil
}

// catalog is the SKUs a fixture file publishes.
type catalog struct{ byID, byDigest map[string]commerce.SKU }

func (c catalog) add(s commerce.SKU) {
	if _, dup := c.byID[s.ID]; !dup {
		c.byID[s.ID] = s
	}
	c.byDigest[s.Digest()] = s
}

func checkSKUDigest(d map[string]any, skus catalog) error {
	if p := optStr(d, "digest_bytes_prefix"); p != "" && p != protocol.TagSKU+"\n" {
		return fmt.Errorf("digest prefix %q, ours is %q", p, protocol.TagSKU+"\n")
	}
	if err := quoteDiff(canon(d["sku"]), str(d["canonical"])); err != nil {
		return fmt.Errorf("canonical SKU: %v", err)
	}
	s, err := commerce.SKUFromValue(d["sku"])
	if err != nil {
		return err
	}
	skus.add(s)
	if err := quoteDiff(s.Digest(), str(d["sku_digest"])); err != nil {
		return err
	}
	if ad := s.Advert(); ad.Digest != s.Digest() || ad.SKU != s.ID {
		return fmt.Errorf("the storefront advert %+v does not carry the digest", ad)
	}
	return nil
}

// checkDigestMoves applies the fixture's change ("path old -> new") and
// expects the pinned new digest, different from the old one.
func checkDigestMoves(d, mv map[string]any, skus catalog) error {
	moved, err := applyChange(d["sku"], str(mv["change"]))
	if err != nil {
		return err
	}
	s, err := commerce.SKUFromValue(moved)
	if err != nil {
		return err
	}
	if s.Digest() == str(d["sku_digest"]) {
		return fmt.Errorf("the digest did not move: %s", optStr(mv, "why"))
	}
	skus.add(s)
	return quoteDiff(s.Digest(), str(mv["sku_digest"]))
}

// applyChange copies v and sets the member at a dotted path from old to
// new, both JSON values, as in "price.amount_micro 1500 -> 1501".
func applyChange(v any, change string) (any, error) {
	lhs, rhs, ok := strings.Cut(change, " -> ")
	i := strings.LastIndex(lhs, " ")
	if !ok || i < 0 {
		return nil, fmt.Errorf("change %q is not \"path old -> new\"", change)
	}
	path, oldText := lhs[:i], lhs[i+1:]
	oldV, err1 := protocol.ParseJSON([]byte(oldText))
	newV, err2 := protocol.ParseJSON([]byte(rhs))
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("change %q: values are not JSON", change)
	}
	c := mustCopy(v)
	parts := strings.Split(path, ".")
	m := obj(c)
	for _, p := range parts[:len(parts)-1] {
		m = obj(m[p])
	}
	last := parts[len(parts)-1]
	if canon(m[last]) != canon(oldV) {
		return nil, fmt.Errorf("change %q: %s is %s", change, path, canon(m[last]))
	}
	m[last] = newV
	return c, nil
}

func checkAgreements(t *T, a map[string]any, k *keys.Agent, skus catalog) {
	signed, _ := a["signed"].(map[string]any)
	if signed != nil {
		t.Run("agreement/signed", func() error {
			if p := optStr(a, "signed_bytes_prefix"); p != "" && p != protocol.TagAgreement+"\n" {
				return fmt.Errorf("prefix %q, ours is %q", p, protocol.TagAgreement+"\n")
			}
			ag, err := commerce.ParseAgreement([]byte(canon(signed)))
			if err != nil {
				return fmt.Errorf("a signed agreement was refused: %v", err)
			}
			msg, err := protocol.SignedBytes(protocol.TagAgreement, ag)
			if err != nil {
				return err
			}
			if err := quoteDiff(string(msg), protocol.TagAgreement+"\n"+str(a["canonical"])); err != nil {
				return fmt.Errorf("signed bytes: %v", err)
			}
			if err := ag.Verify(); err != nil {
				return err
			}
			if k != nil && k.Public() == ag.ConsumerOwner {
				again := ag
				if err := commerce.Sign(&again, k); err != nil {
					return err
				}
				if again.Sig != ag.Sig {
					return fmt.Errorf("re-signing with the published seed gives %s, fixture has %s", again.Sig, ag.Sig)
				}
			}
			return nil
		})
	}
	for i, c := range asArray(a["invalid"]) {
		m := obj(c)
		t.Run("agreement/invalid/"+caseName(m, fmt.Sprint(i)), func() error {
			if m["document"] == nil {
				// Prose-only: the rule is that nothing but the
				// consumer_owner's own signature over these exact bytes
				// verifies. Run it against the signed vector.
				if signed == nil {
					return fmt.Errorf("no signed vector to run the rule against")
				}
				return agreementSignatureBinds(signed)
			}
			ag, err := commerce.ParseAgreement([]byte(canon(m["document"])))
			if err == nil {
				err = ag.Verify()
			}
			if err == nil {
				return fmt.Errorf("accepted, but it is invalid: %s", optStr(m, "why"))
			}
			return nil
		})
	}
	if sc, ok := a["stale_digest_case"].(map[string]any); ok && signed != nil {
		t.Run("agreement/stale_digest_case", func() error { return checkStale(sc, signed, k, skus) })
	}
}

// agreementSignatureBinds: one flipped character in any signed member, or
// the same document signed by any key but consumer_owner's, does not
// verify, and signing in another key's name is refused.
func agreementSignatureBinds(signed map[string]any) error {
	ag, err := commerce.ParseAgreement([]byte(canon(signed)))
	if err != nil {
		return err
	}
	if err := ag.Verify(); err != nil {
		return fmt.Errorf("the signed vector itself does not verify: %v", err)
	}
	for _, member := range members(signed) {
		s, ok := signed[member].(string)
		if !ok || s == "" || member == "sig" {
			continue
		}
		c := obj(mustCopy(signed))
		b := []byte(s)
		b[len(b)-1] ^= 1
		c[member] = string(b)
		if t, err := commerce.ParseAgreement([]byte(canon(c))); err == nil && t.Verify() == nil {
			return fmt.Errorf("a flipped %s still verifies", member)
		}
	}
	other, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		return err
	}
	forged := ag
	forged.Sig, err = protocol.SignObject(protocol.TagAgreement, ag, other, protocol.Base64URL)
	if err != nil {
		return err
	}
	if forged.Verify() == nil {
		return fmt.Errorf("a signature by a key other than consumer_owner verifies")
	}
	if _, err := protocol.SignAgreement(ag, other); err == nil {
		return fmt.Errorf("signing in consumer_owner's name with another key was allowed")
	}
	return nil
}

// checkStale: the seller re-priced, so its catalog carries the SKU at the
// case's current digest (one this file publishes); a standing agreement to
// the old digest is refused at admission with the expected code, while
// the same agreement covers the SKU as it was, and a re-approval to the
// current digest is admitted.
func checkStale(sc, signed map[string]any, k *keys.Agent, skus catalog) error {
	ag, err := commerce.ParseAgreement([]byte(canon(signed)))
	if err != nil {
		return err
	}
	if ag.SKUDigest != str(sc["holds_agreement_for"]) {
		return fmt.Errorf("the signed agreement is for %s, the case holds one for %s", ag.SKUDigest, sc["holds_agreement_for"])
	}
	was, ok := skus.byDigest[ag.SKUDigest]
	cur := skus.byDigest[str(sc["sku_current_digest"])]
	if !ok || cur.ID != ag.SKU || was.ID != ag.SKU {
		return fmt.Errorf("this file publishes no SKU %s at both digests %s and %s", ag.SKU, ag.SKUDigest, sc["sku_current_digest"])
	}
	at, _ := protocol.ParseTime(ag.AgreedAt)
	req := commerce.Request{Seller: ag.SellerAgent, ConsumerOwner: ag.ConsumerOwner, Offering: coveredOffering(cur), Now: at.Add(time.Hour)}
	approval := func(s commerce.SKU) string { return commerce.ApprovalURL("https://console.test", s) }
	if d := commerce.Admit([]commerce.SKU{was}, []commerce.Agreement{ag}, req, approval); d.Refusal != nil || d.Agreement == nil {
		return fmt.Errorf("before re-pricing the agreement does not cover the SKU: %v", d.Refusal)
	}
	d := commerce.Admit([]commerce.SKU{cur}, []commerce.Agreement{ag}, req, approval)
	if d.Refusal == nil || string(d.Refusal.Code) != str(sc["expect"]) {
		return fmt.Errorf("after re-pricing: %v, want %s (%s)", d.Refusal, sc["expect"], optStr(sc, "why"))
	}
	if got := d.Refusal.Details["sku_digest"]; got != cur.Digest() {
		return fmt.Errorf("the refusal names digest %v, not the current %s", got, cur.Digest())
	}
	if k != nil && k.Public() == ag.ConsumerOwner {
		renewed := ag
		renewed.SKUDigest = cur.Digest()
		if err := commerce.Sign(&renewed, k); err != nil {
			return err
		}
		if d := commerce.Admit([]commerce.SKU{cur}, []commerce.Agreement{ag, renewed}, req, approval); d.Refusal != nil {
			return fmt.Errorf("re-approval to the current digest is refused: %v", d.Refusal)
		}
	}
	return nil
}

// checkEnforcement: the seller publishes the SKU the refusal names; a
// request to an offering it covers, from an owner holding no agreement,
// is refused before any work with exactly the pinned details, recorded
// as a quantity-0 requests event; an offering no SKU covers is free.
func checkEnforcement(t *T, e map[string]any, skus catalog) {
	var sku commerce.SKU
	var origin string
	if r, ok := e["refusal"].(map[string]any); ok {
		details := obj(r["details"])
		t.Run("enforcement/refusal", func() error {
			var ok bool
			if sku, ok = skus.byID[str(details["sku"])]; !ok {
				return fmt.Errorf("the refusal names SKU %q, which this file does not publish", details["sku"])
			}
			u, err := url.Parse(str(details["approval_url"]))
			if err != nil || u.Host == "" {
				return fmt.Errorf("approval_url %q is not a URL", details["approval_url"])
			}
			origin = u.Scheme + "://" + u.Host // the deployment's console, configuration
			seller, owner := mustGenerate(), mustGenerate()
			d := commerce.Admit([]commerce.SKU{sku}, nil, commerce.Request{Seller: seller, ConsumerOwner: owner,
				Offering: coveredOffering(sku), Now: time.Now()}, func(s commerce.SKU) string { return commerce.ApprovalURL(origin, s) })
			if d.Refusal == nil {
				return fmt.Errorf("a paid offering was admitted without an agreement")
			}
			if string(d.Refusal.Code) != str(r["error_code"]) || d.Refusal.Retryable {
				return fmt.Errorf("refused with %s (retryable %v), want %s, not retryable", d.Refusal.Code, d.Refusal.Retryable, r["error_code"])
			}
			if err := sameJSON(d.Refusal.Details, details); err != nil {
				return fmt.Errorf("details: %v", err)
			}
			ev := metering.RefusalEvent(seller, owner, coveredOffering(sku), "0198c001-0000-7000-8000-000000000001",
				protocol.FormatTime(time.Now()), string(d.Refusal.Code))
			if _, err := metering.EventFromValue(mustParse(canon(ev))); err != nil {
				return fmt.Errorf("the refusal's meter event is refused: %v", err)
			}
			return nil
		})
	}
	if f, ok := e["free_offering_case"].(map[string]any); ok {
		t.Run("enforcement/free_offering_case", func() error {
			if sku.ID == "" {
				return fmt.Errorf("no SKU from the refusal case to publish")
			}
			d := commerce.Admit([]commerce.SKU{sku}, nil, commerce.Request{Seller: mustGenerate(), ConsumerOwner: mustGenerate(),
				Offering: str(f["offering"]), Now: time.Now()}, func(s commerce.SKU) string { return commerce.ApprovalURL(origin, s) })
			if d.Refusal != nil || d.Covered {
				return fmt.Errorf("an offering no SKU covers was %v (%s)", d.Refusal, optStr(f, "expect"))
			}
			return nil
		})
	}
}

func coveredOffering(s commerce.SKU) string {
	if len(s.Covers.Offerings) > 0 {
		return s.Covers.Offerings[0]
	}
	return "any-offering"
}

func mustGenerate() string {
	k, err := keys.Generate[keys.AgentRole]()
	if err != nil {
		panic(err)
	}
	return k.Public()
}

func mustParse(s string) any {
	v, err := protocol.ParseJSON([]byte(s))
	if err != nil {
		panic(err)
	}
	return v
}

func checkRating(m map[string]any) error {
	p, err := commerce.PriceFromValue(m["price"])
	if err != nil {
		return err
	}
	var events []metering.Event
	for _, e := range asArray(m["events"]) {
		em := obj(e)
		events = append(events, metering.Event{Meter: str(em["meter"]), Quantity: num(em["quantity"]), Refused: em["refused"] == true})
	}
	o := commerce.RateOptions{Agreed: true}
	if raw, present := m["agreement"]; present && raw == nil {
		o.Agreed = false
	}
	if c, ok := m["budget_cost_ceiling_micro"].(float64); ok {
		ceiling := int64(c)
		o.CeilingMicro = &ceiling
	}
	got, err := commerce.Rate(p, events, o)
	if err != nil {
		return err
	}
	if want := num(m["expect_charge_micro"]); got != want {
		return fmt.Errorf("charge %d, want %d (%s)", got, want, optStr(m, "why"))
	}
	return nil
}
