package vectors

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
	"agentmesh.dev/mesh/shared/sow"
)

// The Agent SoW fixtures (sow-*.json) run against shared/sow: every clause
// family's valid and invalid shapes and grades, the comparisons and
// arithmetic, and the signed bytes.

// clauseReaders maps a document member to the validator of its clause
// family (protocol knowledge: which member carries which clause).
var clauseReaders = map[string]func(any) error{
	"parties":         func(v any) error { _, err := sow.PartiesFromValue(v); return err },
	"scope":           func(v any) error { _, err := sow.ScopeFromValue(v); return err },
	"price":           func(v any) error { _, err := sow.PriceFromValue(v); return err },
	"volume":          func(v any) error { _, err := sow.VolumeFromValue(v); return err },
	"change_control":  func(v any) error { _, err := sow.ChangeControlFromValue(v); return err },
	"termination":     func(v any) error { _, err := sow.TerminationFromValue(v); return err },
	"disputes":        func(v any) error { _, err := sow.DisputesFromValue(v); return err },
	"confidentiality": func(v any) error { _, err := sow.ConfidentialityFromValue(v); return err },
	"reporting":       func(v any) error { _, err := sow.ReportingFromValue(v); return err },
	"qualifications":  func(v any) error { _, err := sow.QualificationsFromValue(v); return err },
	"liability":       func(v any) error { _, err := sow.LiabilityFromValue(v); return err },
	"service_floors":  func(v any) error { _, err := sow.ServiceFloorsFromValue(v); return err },
	"subcontracting":  func(v any) error { _, err := sow.SubcontractingFromValue(v); return err },
}

// clauseCases runs a section's valid list (each entry is a clause) and
// invalid list (each entry names the clause under member) through read.
func clauseCases(t *T, name string, sec map[string]any, member string, read func(any) error) {
	for i, v := range asArray(sec["valid"]) {
		t.Run(fmt.Sprintf("%s/valid/%d", name, i), func() error {
			if err := read(v); err != nil {
				return fmt.Errorf("a valid clause was refused: %v", err)
			}
			return nil
		})
	}
	for i, c := range asArray(sec["invalid"]) {
		m := obj(c)
		t.Run(name+"/invalid/"+caseName(m, fmt.Sprint(i)), func() error {
			v, present := m[member]
			if !present {
				return fmt.Errorf("the case carries no %q", member)
			}
			return refused(read(v), errs.InvalidEnvelope, m)
		})
	}
}

// bound compares a backstop the fixture pins with ours.
func bound(t *T, name string, sec map[string]any, member string, ours int) {
	if v, ok := sec[member].(float64); ok {
		t.Run(name+"/"+member, func() error {
			if int(v) != ours {
				return fmt.Errorf("the fixture pins %d, ours is %d", int(v), ours)
			}
			return nil
		})
	}
}

// sameSet compares two string lists as sets.
func sameSet(got, want []string) error {
	g, w := slices.Clone(got), slices.Clone(want)
	slices.Sort(g)
	slices.Sort(w)
	if !slices.Equal(g, w) {
		return fmt.Errorf("got %v, want %v", got, want)
	}
	return nil
}

// checkPartialSigning runs a "signing" section whose document carries the
// file's clause families beside prose placeholders: our signed bytes are
// the tag and the pinned canonical form, and each family's clause in it
// validates.
func checkPartialSigning(t *T, doc map[string]any, families ...string) {
	s, ok := doc["signing"].(map[string]any)
	if !ok || s["document"] == nil {
		return
	}
	t.Run("signing", func() error {
		d := obj(s["document"])
		if err := signedBytesAre(d, str(s["canonical"])); err != nil {
			return err
		}
		for _, f := range families {
			if _, present := d[f]; !present {
				return fmt.Errorf("the document carries no %s clause", f)
			}
			if err := clauseReaders[f](d[f]); err != nil {
				return fmt.Errorf("its %s clause is refused: %v", f, err)
			}
		}
		return nil
	})
}

func signedBytesAre(doc any, canonical string) error {
	msg, err := sow.SignedBytes(doc)
	if err != nil {
		return err
	}
	return quoteDiff(string(msg), sow.Tag+"\n"+canonical)
}

func checkSowTerms(t *T, doc map[string]any) {
	if l, ok := doc["liability"].(map[string]any); ok {
		bound(t, "liability", l, "prose_entries_max", sow.MaxLiabilityProseEntries)
		bound(t, "liability", l, "prose_chars_max", sow.MaxLiabilityProseChars)
		clauseCases(t, "liability", l, "liability", clauseReaders["liability"])
	}
	if f, ok := doc["service_floors"].(map[string]any); ok {
		bound(t, "service_floors", f, "floors_max", sow.MaxFloors)
		if r, ok := f["remedies"]; ok {
			t.Run("service_floors/remedies", func() error { return sameSet(sow.Remedies(), strs(r)) })
		}
		clauseCases(t, "service_floors", f, "service_floors", clauseReaders["service_floors"])
	}
	checkPartialSigning(t, doc, "liability", "service_floors")
}

func checkSowReporting(t *T, doc map[string]any) {
	if l, ok := doc["levels"].(map[string]any); ok {
		t.Run("levels", func() error {
			if !slices.Equal(sow.Levels(), strs(l["all"])) {
				return fmt.Errorf("levels %v, want %v in that order", sow.Levels(), l["all"])
			}
			for level, r := range obj(l["rank"]) {
				if sow.LevelRank(level) != int(num(r)) {
					return fmt.Errorf("rank of %s is %d, want %v", level, sow.LevelRank(level), r)
				}
			}
			if d := optStr(l, "default"); d != "" && d != sow.DefaultLevel {
				return fmt.Errorf("default %s, ours %s", d, sow.DefaultLevel)
			}
			if g := optStr(l, "grade"); g != "" && sow.Grade(g) != sow.ReportingGrade {
				return fmt.Errorf("grade %s, ours %s", g, sow.ReportingGrade)
			}
			return nil
		})
	}
	if m, ok := doc["meets"].(map[string]any); ok {
		for _, c := range asArray(m["cases"]) {
			cm := obj(c)
			t.Run(fmt.Sprintf("meets/%s_vs_%s", cm["offered"], cm["required"]), func() error {
				if got := sow.Meets(str(cm["offered"]), str(cm["required"])); got != (cm["meets"] == true) {
					return fmt.Errorf("meets %v, want %v", got, cm["meets"])
				}
				return nil
			})
		}
	}
	if c, ok := doc["clause"].(map[string]any); ok {
		bound(t, "clause", c, "additions_max", sow.MaxAdditions)
		bound(t, "clause", c, "addition_chars_max", sow.MaxAdditionChars)
		clauseCases(t, "clause", c, "reporting", clauseReaders["reporting"])
	}
	if e, ok := doc["every"].(map[string]any); ok {
		for _, c := range asArray(e["valid"]) {
			m := obj(c)
			t.Run("every/valid/"+str(m["value"]), func() error {
				ms, err := sow.DurationMillis(str(m["value"]))
				if err != nil {
					return err
				}
				if ms != num(m["ms"]) {
					return fmt.Errorf("%d ms, want %v", ms, m["ms"])
				}
				return nil
			})
		}
		for i, c := range asArray(e["invalid"]) {
			m := obj(c)
			t.Run(fmt.Sprintf("every/invalid/%d_%s", i, strconv.Quote(str(m["value"]))), func() error {
				_, err := sow.DurationMillis(str(m["value"]))
				return refused(err, errs.InvalidEnvelope, m)
			})
		}
	}
	if s, ok := doc["shortfall"].(map[string]any); ok {
		for i, c := range asArray(s["cases"]) {
			m := obj(c)
			t.Run("shortfall/"+caseName(m, fmt.Sprint(i)), func() error {
				want, _ := m["expected"].(string)
				return quoteDiff(sow.ReportingShortfall(str(m["required"]), m["document"]), want)
			})
		}
	}
	if cw, ok := doc["cadence_warning"].(map[string]any); ok {
		for i, c := range asArray(cw["cases"]) {
			m := obj(c)
			t.Run("cadence_warning/"+caseName(m, fmt.Sprint(i)), func() error {
				r, err := sow.ReportingFromValue(m["reporting"])
				if err != nil {
					return err
				}
				warns := sow.CadenceWarns(r, num(m["cap_remaining"]), num(m["spend_per_day"]))
				if warns != (m["warns"] == true) {
					return fmt.Errorf("warns %v, want %v", warns, m["warns"])
				}
				if (sow.CadenceWarning(r, num(m["cap_remaining"]), num(m["spend_per_day"])) != "") != warns {
					return fmt.Errorf("the warning sentence disagrees with the boolean")
				}
				return nil
			})
		}
	}
	checkPartialSigning(t, doc, "reporting")
}

func checkSowDataUse(t *T, doc map[string]any) {
	if p, ok := doc["promises"].(map[string]any); ok {
		t.Run("promises", func() error {
			if !slices.Equal(sow.Promises(), strs(p["all"])) {
				return fmt.Errorf("promises %v, want %v", sow.Promises(), p["all"])
			}
			return nil
		})
	}
	if c, ok := doc["clause"].(map[string]any); ok {
		bound(t, "clause", c, "processors_max", sow.MaxProcessors)
		bound(t, "clause", c, "service_chars_max", sow.MaxProcessorService)
		bound(t, "clause", c, "domain_chars_max", sow.MaxProcessorDomain)
		bound(t, "clause", c, "purpose_chars_max", sow.MaxProcessorPurpose)
		clauseCases(t, "clause", c, "confidentiality", clauseReaders["confidentiality"])
	}
	if s, ok := doc["shortfall"].(map[string]any); ok {
		for i, c := range asArray(s["cases"]) {
			m := obj(c)
			t.Run("shortfall/"+caseName(m, fmt.Sprint(i)), func() error {
				req, err := sow.RequirementFromValue(m["required"])
				if err != nil {
					return err
				}
				want, _ := m["expected"].(string)
				return quoteDiff(sow.ConfidentialityShortfall(req, m["document"]), want)
			})
		}
	}
	checkPartialSigning(t, doc, "confidentiality")
}

func checkSowDisputes(t *T, doc map[string]any) {
	k, err := senderKey(doc)
	if err != nil {
		t.Run("identities", func() error { return err })
	}
	if p, ok := doc["postures"].(map[string]any); ok {
		t.Run("postures", func() error {
			if !slices.Equal(sow.Postures(), strs(p["all"])) || !slices.Equal(sow.ArbiterFees(), strs(p["fees"])) {
				return fmt.Errorf("postures %v fees %v, want %v and %v", sow.Postures(), sow.ArbiterFees(), p["all"], p["fees"])
			}
			if r := optStr(p, "role"); r != "" && r != sow.RoleArbiter {
				return fmt.Errorf("role %s, ours %s", r, sow.RoleArbiter)
			}
			if g := optStr(p, "grade"); g != "" && sow.Grade(g) != sow.DisputesGrade {
				return fmt.Errorf("grade %s, ours %s", g, sow.DisputesGrade)
			}
			return nil
		})
	}
	if c, ok := doc["clause"].(map[string]any); ok {
		clauseCases(t, "clause", c, "disputes", clauseReaders["disputes"])
	}
	if v, ok := doc["verdict"].(map[string]any); ok {
		for i, c := range asArray(v["valid"]) {
			m := obj(c)
			t.Run("verdict/valid/"+caseName(m, fmt.Sprint(i)), func() error {
				if _, err := sow.VerdictFromValue(m["verdict"], expectation(m)); err != nil {
					return fmt.Errorf("a valid verdict was refused: %v", err)
				}
				return nil
			})
		}
		for i, c := range asArray(v["invalid"]) {
			m := obj(c)
			t.Run("verdict/invalid/"+caseName(m, fmt.Sprint(i)), func() error {
				_, err := sow.VerdictFromValue(m["verdict"], expectation(m))
				return refused(err, errs.InvalidEnvelope, m)
			})
		}
	}
	checkPartialSigning(t, doc, "disputes")
	if s, ok := doc["signing"].(map[string]any); ok && s["verdict"] != nil {
		t.Run("signing/verdict", func() error { return checkVerdictSigning(s, k) })
	}
}

func expectation(m map[string]any) *sow.Expectation {
	e, ok := m["expected"].(map[string]any)
	if !ok {
		return nil
	}
	exp := &sow.Expectation{Currency: optStr(e, "currency")}
	if a, ok := e["disputed_amount"].(float64); ok {
		n := int64(a)
		exp.DisputedAmount = &n
	}
	return exp
}

// checkVerdictSigning: the verdict's signed bytes are its own tag and the
// pinned canonical form; its arbiter's signature verifies and re-signs
// identically from the published seed; the basis digest is recomputed from
// the record ids; and every listed field, changed, breaks the signature.
func checkVerdictSigning(s map[string]any, k *keys.Agent) error {
	if p := optStr(s, "verdict_signed_bytes_prefix"); p != "" && p != sow.VerdictTag+"\n" {
		return fmt.Errorf("verdict prefix %q, ours %q", p, sow.VerdictTag+"\n")
	}
	if p := optStr(s, "signed_bytes_prefix"); p != "" && p != sow.Tag+"\n" {
		return fmt.Errorf("document prefix %q, ours %q", p, sow.Tag+"\n")
	}
	vv := obj(s["verdict"])
	msg, err := sow.VerdictSignedBytes(vv)
	if err != nil {
		return err
	}
	if err := quoteDiff(string(msg), sow.VerdictTag+"\n"+str(s["verdict_canonical"])); err != nil {
		return err
	}
	w, err := sow.VerdictFromValue(vv, nil)
	if err != nil {
		return err
	}
	if err := sow.VerifyVerdict(w); err != nil {
		return err
	}
	if k != nil && k.Public() == w.By && len(w.Signatures) > 0 {
		at, _ := protocol.ParseTime(w.Signatures[0].SignedAt)
		again, err := sow.SignVerdict(vv, k, at)
		if err != nil {
			return err
		}
		if again.Sig != w.Signatures[0].Sig {
			return fmt.Errorf("re-signing with the published seed gives %s, fixture has %s", again.Sig, w.Signatures[0].Sig)
		}
	}
	if ids, ok := s["basis_record_ids"]; ok {
		d, err := sow.BasisDigest(strs(ids))
		if err != nil {
			return err
		}
		if want := str(obj(vv["basis"])["ids_sha256"]); d != want {
			return fmt.Errorf("basis digest %s, verdict commits to %s", d, want)
		}
	}
	if tp, ok := s["tamper"].(map[string]any); ok {
		for _, path := range strs(tp["fields"]) {
			changed, err := mutate(vv, path)
			if err != nil {
				return err
			}
			w2, err := sow.VerdictFromValue(changed, nil)
			if err == nil && sow.VerifyVerdict(w2) == nil {
				return fmt.Errorf("a verdict with %s changed still verifies", path)
			}
		}
	}
	return nil
}

func checkSowSubcontracting(t *T, doc map[string]any) {
	if p, ok := doc["postures"].(map[string]any); ok {
		t.Run("postures", func() error {
			if !slices.Equal(sow.SubcontractingPostures(), strs(p["all"])) {
				return fmt.Errorf("postures %v, want %v", sow.SubcontractingPostures(), p["all"])
			}
			if g := optStr(p, "grade"); g != "" && sow.Grade(g) != sow.SubcontractingGrade {
				return fmt.Errorf("grade %s, ours %s", g, sow.SubcontractingGrade)
			}
			return nil
		})
	}
	if c, ok := doc["clause"].(map[string]any); ok {
		bound(t, "clause", c, "subcontractors_max", sow.MaxSubcontractors)
		bound(t, "clause", c, "scope_chars_max", sow.MaxSubcontractorScope)
		bound(t, "clause", c, "engagement_chars_max", sow.MaxSubcontractorEngagement)
		clauseCases(t, "clause", c, "subcontracting", clauseReaders["subcontracting"])
	}
	if cf, ok := doc["conformance"].(map[string]any); ok {
		for i, c := range asArray(cf["cases"]) {
			m := obj(c)
			t.Run("conformance/"+caseName(m, fmt.Sprint(i)), func() error {
				var o sow.ConformanceOptions
				if opts, ok := m["opts"].(map[string]any); ok {
					if r, ok := opts["prime_cap_remaining"].(float64); ok {
						n := int64(r)
						o.PrimeCapRemaining = &n
					}
					o.RequirePins = opts["require_pins"] == true
				}
				return sameJSON(sow.Conformance(m["prime"], m["sub"], o), m["violations"])
			})
		}
	}
	checkPartialSigning(t, doc, "subcontracting")
}

// mutate copies v and changes the value at a path such as
// "price.schedule[0].per_unit": a number moves by one, a string gains a
// character, a boolean flips.
func mutate(v any, path string) (any, error) {
	c := mustCopy(v)
	var parent any = c
	parts := strings.Split(path, ".")
	for i, p := range parts {
		name, index := p, -1
		if j := strings.IndexByte(p, '['); j >= 0 && strings.HasSuffix(p, "]") {
			n, err := strconv.Atoi(p[j+1 : len(p)-1])
			if err != nil {
				return nil, fmt.Errorf("path %s: bad index", path)
			}
			name, index = p[:j], n
		}
		m, ok := parent.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("path %s: %s is not inside an object", path, name)
		}
		last := i == len(parts)-1
		if index >= 0 {
			list, ok := m[name].([]any)
			if !ok || index >= len(list) {
				return nil, fmt.Errorf("path %s: %s[%d] does not exist", path, name, index)
			}
			if !last {
				parent = list[index]
				continue
			}
			list[index] = changed(list[index])
			continue
		}
		if _, ok := m[name]; !ok {
			return nil, fmt.Errorf("path %s: %s does not exist", path, name)
		}
		if last {
			m[name] = changed(m[name])
		} else {
			parent = m[name]
		}
	}
	return c, nil
}

func changed(v any) any {
	switch x := v.(type) {
	case float64:
		return x + 1
	case string:
		return x + "x"
	case bool:
		return !x
	}
	return "changed"
}
