package vectors

import (
	"fmt"
	"slices"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/sow"
)

// taskStates are the protocol's task states (upstream-notes §3.4).
var taskStates = []string{protocol.StateSubmitted, protocol.StateWorking, protocol.StateInputRequired, protocol.StateAuthRequired,
	protocol.StateCompleted, protocol.StateFailed, protocol.StateCanceled, protocol.StateRejected, protocol.StateExhausted}

func checkSowPricing(t *T, doc map[string]any) {
	k, err := senderKey(doc)
	if err != nil {
		t.Run("identities", func() error { return err })
	}
	if a, ok := doc["arrangement"].(map[string]any); ok {
		t.Run("arrangement", func() error {
			if !slices.Equal(sow.Arrangements(), strs(a["values"])) {
				return fmt.Errorf("arrangements %v, want %v", sow.Arrangements(), a["values"])
			}
			return nil
		})
	}
	if p, ok := doc["price"].(map[string]any); ok {
		clauseCases(t, "price", p, "price", clauseReaders["price"])
	}
	if r, ok := doc["rating"].(map[string]any); ok {
		for i, c := range asArray(r["cases"]) {
			m := obj(c)
			t.Run("rating/"+caseName(m, fmt.Sprint(i)), func() error {
				got, err := rate(m)
				if err != nil {
					return err
				}
				if err := sameJSON(got, m["expect"]); err != nil {
					return fmt.Errorf("%v (%s)", err, optStr(m, "why"))
				}
				return nil
			})
		}
		for i, c := range asArray(r["refuses"]) {
			m := obj(c)
			t.Run("rating/refuses/"+caseName(m, fmt.Sprint(i)), func() error {
				_, err := rate(m)
				return refused(err, errs.InvalidEnvelope, m)
			})
		}
	}
	if s, ok := doc["settlement_line"].(map[string]any); ok {
		clauseCases(t, "settlement_line", s, "line", func(v any) error { _, err := sow.SettlementLineFromValue(v); return err })
	}
	if n, ok := doc["no_charge"].(map[string]any); ok {
		checkNoCharge(t, n, k)
	}
	if r, ok := doc["reservation"].(map[string]any); ok {
		for i, c := range asArray(r["cases"]) {
			m := obj(c)
			t.Run(fmt.Sprintf("reservation/%d_%vd", i, m["window_days"]), func() error {
				at, err := sow.ReleaseAt(num(m["window_days"]), str(m["starts_at"]))
				if err != nil {
					return err
				}
				want, _ := protocol.ParseTime(str(m["release_at"]))
				if !at.Equal(want) {
					return fmt.Errorf("release at %s, want %s", at, want)
				}
				within, err := sow.ReservationWithinTerm(num(m["window_days"]), str(m["starts_at"]), str(m["ends_at"]))
				if err != nil || within != (m["within_term"] == true) {
					return fmt.Errorf("within term %v (%v), want %v", within, err, m["within_term"])
				}
				return nil
			})
		}
	}
	if s, ok := doc["document_states"].(map[string]any); ok {
		t.Run("document_states", func() error { return checkDocumentStates(s) })
	}
	if s, ok := doc["task_state"].(map[string]any); ok {
		t.Run("task_state", func() error { return checkTaskState(s) })
	}
	if p, ok := doc["party"].(map[string]any); ok {
		clauseCases(t, "party", p, "party", func(v any) error { _, err := sow.PartyFromValue(v); return err })
	}
	if d, ok := doc["directed"].(map[string]any); ok {
		checkDirected(t, d)
	}
	if q, ok := doc["qualifications"].(map[string]any); ok {
		checkQualifications(t, q)
	}
	if a, ok := doc["approval"].(map[string]any); ok {
		checkApproval(t, a)
	}
	if s, ok := doc["signing"].(map[string]any); ok {
		t.Run("signing", func() error { return checkWholeDocument(s, k) })
	}
	if o, ok := doc["operator_fee"].(map[string]any); ok {
		var noCharge any
		if n, ok := doc["no_charge"].(map[string]any); ok {
			noCharge = n["clause"]
		}
		checkOperatorFee(t, o, noCharge)
	}
}

// rate runs a rating case: the clause, the raw counts, and its options.
func rate(m map[string]any) (sow.Rating, error) {
	p, err := sow.PriceFromValue(m["price"])
	if err != nil {
		return sow.Rating{}, err
	}
	var usage []sow.Count
	for _, u := range asArray(m["usage"]) {
		um := obj(u)
		usage = append(usage, sow.Count{Meter: str(um["meter"]), Count: num(um["count"])})
	}
	o := sow.RateOptions{Operator: optStr(m, "operator")}
	if b, ok := m["already_billed"].(float64); ok {
		o.AlreadyBilled = int64(b)
	}
	if r, ok := m["receipts"].(map[string]any); ok {
		o.Receipts = map[string]string{}
		for meter, receipt := range r {
			o.Receipts[meter] = str(receipt)
		}
	}
	if b, present := m["operator_fee_basis"]; present && b != nil {
		basis, err := sow.FeeBasisFromValue(b)
		if err != nil {
			return sow.Rating{}, err
		}
		o.FeeBasis = &basis
	}
	return sow.Rate(p, usage, o)
}

func checkNoCharge(t *T, n map[string]any, k *keys.Agent) {
	clause, err := sow.PriceFromValue(n["clause"])
	t.Run("no_charge/clause", func() error {
		if err != nil {
			return fmt.Errorf("the no_charge clause is refused: %v", err)
		}
		if s, ok := n["settles"].(bool); ok && clause.Settles() != s {
			return fmt.Errorf("settles %v, want %v", clause.Settles(), s)
		}
		if cp, ok := n["committed_price"].(float64); ok {
			if got, ok := clause.CommittedPrice(); !ok || got != int64(cp) {
				return fmt.Errorf("committed price %d (%v), want %v", got, ok, cp)
			}
		}
		if g := optStr(n, "grade"); g != "" && sow.Grade(g) != clause.Grade {
			return fmt.Errorf("grade %s, want %s", clause.Grade, g)
		}
		return nil
	})
	if r, ok := n["refuses_rating"].(map[string]any); ok {
		t.Run("no_charge/refuses_rating", func() error {
			_, err := rate(map[string]any{"price": n["clause"], "usage": r["usage"]})
			return refused(err, errs.InvalidEnvelope, r)
		})
	}
	if r, ok := n["refuses_settlement_record"].(map[string]any); ok {
		t.Run("no_charge/refuses_settlement_record", func() error {
			if _, err := sow.SettlementRecordFromValue(r["record"]); err != nil {
				return fmt.Errorf("the record is refused for its shape (%v), not for the engagement it cites", err)
			}
			if sow.AdmitSettlement(clause) == nil {
				return fmt.Errorf("a settlement record citing a no_charge engagement was admitted: %s", optStr(r, "why"))
			}
			return nil
		})
	}
	if n["document"] != nil {
		t.Run("no_charge/document", func() error {
			return checkWholeDocument(map[string]any{"document": n["document"], "canonical": n["canonical"], "signed": n["signed"]}, k)
		})
	}
}

// checkWholeDocument: a complete engagement document validates, its signed
// bytes are the tag and the pinned canonical form, a signed copy's
// signatures verify and re-sign identically from the published seed, and
// each listed field, changed, breaks them.
func checkWholeDocument(s map[string]any, k *keys.Agent) error {
	if p := optStr(s, "signed_bytes_prefix"); p != "" && p != sow.Tag+"\n" {
		return fmt.Errorf("prefix %q, ours %q", p, sow.Tag+"\n")
	}
	d, err := sow.Parse([]byte(canon(s["document"])))
	if err != nil {
		return fmt.Errorf("the document is refused: %v", err)
	}
	if err := signedBytesAre(d.Value, str(s["canonical"])); err != nil {
		return err
	}
	signed, ok := s["signed"].(map[string]any)
	if !ok {
		return nil
	}
	sd, err := sow.Parse([]byte(canon(signed)))
	if err != nil {
		return fmt.Errorf("the signed document is refused: %v", err)
	}
	if len(sd.Signatures) == 0 {
		return fmt.Errorf("the signed document carries no signature")
	}
	if err := sd.VerifySignatures(); err != nil {
		return err
	}
	if err := signedBytesAre(sd.Value, str(s["canonical"])); err != nil {
		return fmt.Errorf("the signed copy: %v", err)
	}
	for _, sig := range sd.Signatures {
		if k == nil || k.Public() != sig.Key {
			continue
		}
		at, _ := protocol.ParseTime(sig.SignedAt)
		again, err := sow.Sign(sd.Value, k, sig.Role, at)
		if err != nil {
			return err
		}
		if again != sig {
			return fmt.Errorf("re-signing with the published seed gives %+v, fixture has %+v", again, sig)
		}
	}
	if tp, ok := s["tamper"].(map[string]any); ok {
		for _, path := range strs(tp["fields"]) {
			c, err := mutate(signed, path)
			if err != nil {
				return err
			}
			if td, err := sow.Parse([]byte(canon(c))); err == nil && td.VerifySignatures() == nil {
				return fmt.Errorf("a document with %s changed still verifies", path)
			}
		}
	}
	return nil
}

func checkDocumentStates(s map[string]any) error {
	if err := sameSet(sow.States(), strs(s["all"])); err != nil {
		return fmt.Errorf("states: %v", err)
	}
	if err := sameSet(sow.EndStates(), strs(s["end_states"])); err != nil {
		return fmt.Errorf("end states: %v", err)
	}
	admits, unscored := strs(s["admits_work"]), strs(s["unscored"])
	for _, st := range sow.States() {
		if sow.AdmitsWork(st) != slices.Contains(admits, st) {
			return fmt.Errorf("%s admits work: %v", st, sow.AdmitsWork(st))
		}
		if sow.Scored(st) == slices.Contains(unscored, st) {
			return fmt.Errorf("%s scored: %v", st, sow.Scored(st))
		}
		if sow.IsEnd(st) != slices.Contains(strs(s["end_states"]), st) {
			return fmt.Errorf("%s is an end: %v", st, sow.IsEnd(st))
		}
	}
	return nil
}

func checkTaskState(s map[string]any) error {
	state := str(s["state"])
	if term, ok := s["terminal"].(bool); ok && protocol.Terminal(state) != term {
		return fmt.Errorf("%s terminal %v, want %v", state, protocol.Terminal(state), term)
	}
	if f, ok := s["is_failure"].(bool); ok && protocol.IsFailure(state) != f {
		return fmt.Errorf("%s is a failure: %v, want %v", state, protocol.IsFailure(state), f)
	}
	if protocol.Cancelable(state) {
		return fmt.Errorf("%s is cancelable", state)
	}
	from := strs(s["reachable_from"])
	for _, st := range taskStates {
		if protocol.LegalTransition(st, state) != slices.Contains(from, st) {
			return fmt.Errorf("%s -> %s legal: %v", st, state, protocol.LegalTransition(st, state))
		}
	}
	return nil
}

func checkDirected(t *T, d map[string]any) {
	if c, ok := d["clause"].(map[string]any); ok {
		clauseCases(t, "directed/clause", c, "offered_to", func(v any) error { _, err := sow.OfferedToFromValue(v); return err })
	}
	if l, ok := d["listing"].(map[string]any); ok {
		for i, c := range asArray(l["cases"]) {
			m := obj(c)
			t.Run("directed/listing/"+caseName(m, fmt.Sprint(i)), func() error {
				if err := clauseReaders["parties"](m["parties"]); err != nil {
					return err
				}
				if sow.Directed(m["parties"]) != (m["directed"] == true) || sow.ListingAllowed(m["parties"]) != (m["public_listing"] == true) {
					return fmt.Errorf("directed %v listed %v, want %v and %v", sow.Directed(m["parties"]), sow.ListingAllowed(m["parties"]), m["directed"], m["public_listing"])
				}
				return nil
			})
		}
	}
	if f, ok := d["formation"].(map[string]any); ok {
		for i, c := range asArray(f["cases"]) {
			m := obj(c)
			t.Run("directed/formation/"+caseName(m, fmt.Sprint(i)), func() error {
				now, err := protocol.ParseTime(str(m["now"]))
				if err != nil {
					return err
				}
				refusal := sow.DirectedRefusal(m["offered_to"], str(m["client_agent"]), now)
				return formed(refusal, m)
			})
		}
	}
	if s, ok := d["signing"].(map[string]any); ok {
		t.Run("directed/signing", func() error { return checkWholeDocument(s, nil) })
	}
}

// formed compares a formation gate's answer with the case's forms.
func formed(refusal *errs.Error, m map[string]any) error {
	forms := m["forms"] == true
	switch {
	case forms && refusal != nil:
		return fmt.Errorf("refused (%s), want formed: %s", refusal.Message, optStr(m, "why"))
	case !forms && refusal == nil:
		return fmt.Errorf("formed, want refused: %s", optStr(m, "why"))
	case refusal != nil && refusal.Code != errs.Forbidden:
		return fmt.Errorf("refused with %s, want a typed FORBIDDEN refusal", refusal.Code)
	}
	return nil
}

func checkQualifications(t *T, q map[string]any) {
	if kinds, ok := q["kinds"].(map[string]any); ok {
		t.Run("qualifications/kinds", func() error {
			if err := sameSet(sow.QualificationKinds(), strs(kinds["all"])); err != nil {
				return err
			}
			for _, kind := range sow.QualificationKinds() {
				if sow.Checkable(kind) != slices.Contains(strs(kinds["checkable"]), kind) {
					return fmt.Errorf("%s checkable: %v", kind, sow.Checkable(kind))
				}
			}
			for kind, g := range obj(kinds["grade_ceiling"]) {
				if sow.GradeCeiling(kind) != sow.Grade(str(g)) {
					return fmt.Errorf("ceiling of %s is %s, want %s", kind, sow.GradeCeiling(kind), g)
				}
			}
			return nil
		})
	}
	if c, ok := q["clause"].(map[string]any); ok {
		clauseCases(t, "qualifications/clause", c, "qualification", func(v any) error { _, err := sow.QualificationFromValue(v); return err })
	}
	if l, ok := q["list"].(map[string]any); ok {
		clauseCases(t, "qualifications/list", l, "qualifications", clauseReaders["qualifications"])
	}
	if f, ok := q["formation"].(map[string]any); ok {
		for i, c := range asArray(f["cases"]) {
			m := obj(c)
			t.Run("qualifications/formation/"+caseName(m, fmt.Sprint(i)), func() error {
				var facts *sow.Facts
				if fm, ok := m["facts"].(map[string]any); ok {
					facts = &sow.Facts{Subject: optStr(fm, "subject")}
					if b, ok := fm["registered"].(bool); ok {
						facts.Registered = &b
					}
					if b, ok := fm["account"].(bool); ok {
						facts.Account = &b
					}
					if o, ok := fm["offerings"]; ok {
						facts.Offerings = append([]string{}, strs(o)...)
					}
				}
				refusal := sow.QualificationRefusal(m["qualifications"], str(m["client_agent"]), strs(m["asserted"]), facts)
				return formed(refusal, m)
			})
		}
	}
	if s, ok := q["signing"].(map[string]any); ok {
		t.Run("qualifications/signing", func() error { return checkWholeDocument(s, nil) })
	}
}

func checkApproval(t *T, a map[string]any) {
	t.Run("approval/authorities", func() error {
		if err := sameSet(sow.Authorities(), strs(a["authorities"])); err != nil {
			return err
		}
		if d, ok := a["defaults"].(map[string]any); ok {
			if d["formation"] != sow.DefaultFormationAuthority || d["amendment"] != sow.DefaultAmendmentAuthority {
				return fmt.Errorf("defaults %v, ours formation %s amendment %s", d, sow.DefaultFormationAuthority, sow.DefaultAmendmentAuthority)
			}
			cc, err := sow.ChangeControlFromValue(map[string]any{"review_window_days": 7.0, "grade": "enforced"})
			if err != nil || cc.FormationAuthority != d["formation"] || cc.AmendmentAuthority != d["amendment"] {
				return fmt.Errorf("a clause stating no authority reads as %+v (%v)", cc, err)
			}
		}
		return nil
	})
	clauseCases(t, "approval", a, "approval", func(v any) error { _, err := sow.ApprovalFromValue(v); return err })
	if mv, ok := a["mandate_verified"].(map[string]any); ok {
		for i, c := range asArray(mv["cases"]) {
			m := obj(c)
			t.Run(fmt.Sprintf("approval/mandate_verified/%d", i), func() error {
				ap := sow.Approval{Act: sow.ActAmendment, Authority: sow.AuthorityPerson, Mandate: optStr(m, "mandate")}
				if got := sow.MandateVerified(ap, m["checks_performed"] == true); got != (m["expect"] == true) {
					return fmt.Errorf("mandate verified %v, want %v", got, m["expect"])
				}
				return nil
			})
		}
	}
}

func checkOperatorFee(t *T, o map[string]any, noCharge any) {
	fee := func(v any) error { _, err := sow.OperatorFeeFromValue(v); return err }
	for i, c := range asArray(o["valid"]) {
		m := obj(c)
		t.Run("operator_fee/valid/"+caseName(m, fmt.Sprint(i)), func() error {
			f, err := sow.OperatorFeeFromValue(m["fee"])
			if err != nil {
				return fmt.Errorf("a valid fee line was refused: %v", err)
			}
			return sow.CheckOperatorFee(f)
		})
	}
	for i, c := range asArray(o["invalid"]) {
		m := obj(c)
		t.Run("operator_fee/invalid/"+caseName(m, fmt.Sprint(i)), func() error { return refused(fee(m["fee"]), errs.InvalidEnvelope, m) })
	}
	if a, ok := o["arithmetic"].(map[string]any); ok {
		for i, c := range asArray(a["cases"]) {
			m := obj(c)
			t.Run("operator_fee/arithmetic/"+caseName(m, fmt.Sprint(i)), func() error {
				f, err := sow.OperatorFeeFromValue(m["fee"])
				if err != nil {
					return err
				}
				if closes := sow.CheckOperatorFee(f) == nil; closes != (m["closes"] == true) {
					return fmt.Errorf("closes %v, want %v", closes, m["closes"])
				}
				return nil
			})
		}
	}
	if c, ok := o["computed"].(map[string]any); ok {
		for i, x := range asArray(c["cases"]) {
			m := obj(x)
			t.Run(fmt.Sprintf("operator_fee/computed/%d", i), func() error {
				b, err := sow.FeeBasisFromValue(m["basis"])
				if err != nil {
					return err
				}
				got, err := sow.FeeAmount(b, num(m["base"]))
				if err != nil || got != num(m["amount"]) {
					return fmt.Errorf("amount %d (%v), want %v", got, err, m["amount"])
				}
				return nil
			})
		}
	}
	if c, ok := o["cap"].(map[string]any); ok {
		if r := optStr(c, "rule"); r != "" {
			t.Run("operator_fee/cap/rule", func() error {
				if r != sow.FitRule {
					return fmt.Errorf("the fixture's rule is %s; this implementation's is %s", r, sow.FitRule)
				}
				return nil
			})
		}
		for i, x := range asArray(c["cases"]) {
			m := obj(x)
			t.Run("operator_fee/cap/"+caseName(m, fmt.Sprint(i)), func() error {
				var basis *sow.FeeBasis
				if m["basis"] != nil {
					b, err := sow.FeeBasisFromValue(m["basis"])
					if err != nil {
						return err
					}
					basis = &b
				}
				fit := sow.MaxRatedTotal(num(m["cap_remaining"]), basis)
				var f int64
				if basis != nil && fit > 0 {
					var err error
					if f, err = sow.FeeAmount(*basis, fit); err != nil {
						return err
					}
				}
				got := map[string]any{"max_rated_total": fit, "fee": f, "client_total": fit + f}
				want := map[string]any{"max_rated_total": m["max_rated_total"], "fee": m["fee"], "client_total": m["client_total"]}
				return sameJSON(got, want)
			})
		}
	}
	if g, ok := o["grade"].(map[string]any); ok {
		t.Run("operator_fee/grade", func() error {
			if b := optStr(g, "basis"); b != "" && sow.Grade(b) != sow.OperatorFeeBasisGrade {
				return fmt.Errorf("basis grade %s, ours %s", b, sow.OperatorFeeBasisGrade)
			}
			for _, c := range asArray(g["cases"]) {
				m := obj(c)
				if got := sow.OperatorFeeGrade(m["operator_built_quote"] == true, m["operator_settled"] == true); got != sow.Grade(str(m["grade"])) {
					return fmt.Errorf("built %v settled %v: %s, want %s", m["operator_built_quote"], m["operator_settled"], got, m["grade"])
				}
			}
			return nil
		})
	}
	if s, ok := o["settlement"].(map[string]any); ok {
		for i, c := range asArray(s["cases"]) {
			m := obj(c)
			t.Run("operator_fee/settlement/"+caseName(m, fmt.Sprint(i)), func() error {
				q, err := sow.QuoteFromValue(m["quote"])
				if err != nil {
					return err
				}
				r, err := sow.SettlementRecordFromValue(m["record"])
				if err != nil {
					return err
				}
				d := sow.CheckSettlement(q, r)
				switch settled := m["settled"] == true; {
				case settled && d != nil:
					return fmt.Errorf("disputed (%v), want settled", d)
				case !settled && d == nil:
					return fmt.Errorf("settled, want disputed for %s", m["reason"])
				case !settled && d.Reason != str(m["reason"]):
					return fmt.Errorf("disputed for %s, want %s", d.Reason, m["reason"])
				}
				if net, ok := m["provider_net"].(float64); ok && r.ProviderNet() != int64(net) {
					return fmt.Errorf("provider net %d, want %v", r.ProviderNet(), net)
				}
				return nil
			})
		}
		if n, ok := s["refuse_further_work_after"].(float64); ok {
			t.Run("operator_fee/settlement/refuse_further_work_after", func() error {
				if !sow.RefuseFurtherWork(int(n)) || sow.RefuseFurtherWork(int(n)-1) {
					return fmt.Errorf("refusal after %v disputes is not where ours starts (%d)", n, sow.DisputesBeforeRefusing)
				}
				return nil
			})
		}
	}
	if nc, ok := o["no_charge"].(map[string]any); ok {
		t.Run("operator_fee/no_charge", func() error {
			if noCharge == nil {
				return fmt.Errorf("no no_charge clause in this file to test against")
			}
			carries := nc["carries_a_line"] == true
			basis := sow.PercentBasis(10)
			p, err := sow.PriceFromValue(noCharge)
			if err != nil {
				return err
			}
			r, err := sow.Rate(p, nil, sow.RateOptions{FeeBasis: &basis})
			if lines := err == nil && r.OperatorFee != nil; lines != carries {
				return fmt.Errorf("a no_charge engagement carries a fee line: %v (%v), want %v", lines, err, carries)
			}
			return nil
		})
	}
}
