package sow

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"slices"
	"time"

	"agentmesh.dev/mesh/shared/errs"
	"agentmesh.dev/mesh/shared/jsonv"
	"agentmesh.dev/mesh/shared/keys"
	"agentmesh.dev/mesh/shared/protocol"
)

// Dispute postures (§5.10): exactly one, from a closed set, and no default
// for an absent clause (absent means the document has not said).
const (
	PostureNone               = "none"
	PostureRefundOnFailedTask = "refund_on_failed_task"
	PostureEscalateToOwners   = "escalate_to_owners"
	PostureArbiter            = "arbiter"
)

// Postures lists the closed set.
func Postures() []string {
	return []string{PostureNone, PostureRefundOnFailedTask, PostureEscalateToOwners, PostureArbiter}
}

// Who bears the arbiter's price (§5.10.1).
const (
	FeeSplit          = "split"
	FeeFollowsFinding = "follows_finding"
)

// ArbiterFees lists the closed set.
func ArbiterFees() []string { return []string{FeeSplit, FeeFollowsFinding} }

// RoleArbiter is the standard registry's name for the published arbiter
// contract; the clause's role is validated as a name, not pinned to it.
const RoleArbiter = "role-arbiter"

// DisputesGrade is the disputes clause's grade, flatly: what is enforced
// under §5.10 are actions clearing takes (the refund, the freeze, the split
// moving on a verified signature), never the clause's own grade.
const DisputesGrade = Evidence

const maxArbiterName = 64

// Disputes is the disputes clause.
type Disputes struct {
	Posture string
	Arbiter *Arbiter
}

// Arbiter is the forum the parties bind under the arbiter posture.
type Arbiter struct {
	Role             string
	Agent            string // "" when appointed at opening
	IndependenceDays int64
	DeadlineDays     int64
	Fee              string
	Fallback         string
}

// DisputesFromValue shape-checks the clause: the posture from the closed
// four, the grade evidence, the arbiter member required under the arbiter
// posture (naming no terms names no forum) and refused under any other;
// inside it a non-blank role and optional agent of at most 64 characters,
// positive whole independence and deadline days, a fee from its closed
// two, and a fallback from the other three postures (a dead forum cannot
// land on itself).
func DisputesFromValue(v any) (Disputes, error) {
	m, err := object(v, "the disputes clause is an object carrying posture and grade (§5.10)")
	if err != nil {
		return Disputes{}, err
	}
	if err := unknown(m, "the disputes clause", "posture", "arbiter", "grade"); err != nil {
		return Disputes{}, err
	}
	var d Disputes
	if d.Posture, _ = m["posture"].(string); !slices.Contains(Postures(), d.Posture) {
		return Disputes{}, invalid("the disputes posture is none, refund_on_failed_task, escalate_to_owners or arbiter: exactly one, from a closed set (§5.10)")
	}
	if err := flatGrade(m, DisputesGrade, "the disputes clause is graded evidence, flatly: what §5.10 enforces are actions clearing takes, never the clause's own grade, and no machine here judges whether work was good (§5.10, §4.2)"); err != nil {
		return Disputes{}, err
	}
	raw, present := m["arbiter"]
	switch {
	case d.Posture == PostureArbiter && !present:
		return Disputes{}, invalid("an arbiter posture naming no arbiter terms names no forum: role, independence_days, deadline_days, fee and fallback are required (§5.10.1)")
	case d.Posture != PostureArbiter && present:
		return Disputes{}, invalid("only the arbiter posture carries the arbiter member: a judge named under a posture that never convenes one is two clauses disagreeing (§5.10.1)")
	case !present:
		return d, nil
	}
	a, err := object(raw, "the arbiter member is an object {role, agent?, independence_days, deadline_days, fee, fallback} (§5.10.1)")
	if err != nil {
		return Disputes{}, err
	}
	if err := unknown(a, "the arbiter member", "role", "agent", "independence_days", "deadline_days", "fee", "fallback"); err != nil {
		return Disputes{}, err
	}
	var b Arbiter
	var ok bool
	if b.Role, ok = jsonv.Text(a["role"], maxArbiterName); !ok {
		return Disputes{}, invalid("the arbiter's role names the published contract the serving agent must hold (such as %s), not blank, at most %d characters (§5.10.1)", RoleArbiter, maxArbiterName)
	}
	if b.Agent, err = optText(a, "agent", maxArbiterName, "the arbiter's agent, when bound at formation, is the judge's public key, not blank (§5.10.1)"); err != nil {
		return Disputes{}, err
	}
	if b.IndependenceDays, ok = jsonv.PosInt(a["independence_days"]); !ok {
		return Disputes{}, invalid("independence_days is a positive whole number of days (§5.10.1)")
	}
	if b.DeadlineDays, ok = jsonv.PosInt(a["deadline_days"]); !ok {
		return Disputes{}, invalid("deadline_days is a positive whole number of days from the dispute's opening (§5.10.1)")
	}
	if b.Fee, _ = a["fee"].(string); !slices.Contains(ArbiterFees(), b.Fee) {
		return Disputes{}, invalid("the arbiter's fee is split or follows_finding (§5.10.1)")
	}
	if b.Fallback, _ = a["fallback"].(string); b.Fallback == PostureArbiter || !slices.Contains(Postures(), b.Fallback) {
		return Disputes{}, invalid("the fallback is one of the other three postures, never arbiter: a dead forum cannot land on itself (§5.10.1)")
	}
	d.Arbiter = &b
	return d, nil
}

// VerdictTag is the domain tag of an arbiter's verdict: its signatures
// cover "agent-arbiter-verdict-v1\n" and the canonical JSON of the verdict
// without signatures.
const VerdictTag = "agent-arbiter-verdict-v1"

var sha256HexRE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Verdict is the document an arbiter produces: how the disputed amount
// divides. Split and Attribution are the operative parts; Value keeps the
// verdict as received, which is what its signatures cover.
type Verdict struct {
	Engagement    string
	Dispute       string
	Currency      string
	Amount        int64
	SplitProvider int64
	SplitClient   int64
	Attribution   string
	By            string
	ProducedAt    string
	Signatures    []VerdictSignature
	Value         map[string]any
}

// VerdictSignature is the arbiter's signature on a verdict.
type VerdictSignature struct {
	Key      string `json:"key"`
	SignedAt string `json:"signed_at"`
	Sig      string `json:"sig"`
}

// Expectation is what the clause side knows when a verdict arrives: the
// amount and currency the dispute was opened against.
type Expectation struct {
	DisputedAmount *int64
	Currency       string
}

var verdictMembers = []string{"verdict", "role", "engagement", "dispute", "disputed", "split", "attribution", "basis",
	"heard", "reasons", "produced_at", "by", "signatures"}

// VerdictFromValue shape-checks a verdict and, when exp is given, that it
// is about the amount and currency the dispute froze. The load-bearing
// rule: split.provider + split.client equals disputed.amount exactly, each
// a non-negative integer. Also: basis.ids_sha256 is 64 lowercase hex, an
// excluded list is non-empty with a reason on every entry, heard carries
// both booleans (silence is recorded, never inferred), reasons and
// attribution are not blank, produced_at is an instant, and by is the
// arbiter's agent key.
func VerdictFromValue(v any, exp *Expectation) (Verdict, error) {
	m, err := object(v, "an arbiter verdict is an object")
	if err != nil {
		return Verdict{}, err
	}
	if err := unknown(m, "a verdict", verdictMembers...); err != nil {
		return Verdict{}, err
	}
	w := Verdict{Value: m}
	if m["verdict"] != "v1" || m["role"] != "arbiter" {
		return Verdict{}, invalid("a verdict is verdict v1 by role arbiter")
	}
	var ok bool
	if w.Engagement, ok = jsonv.Text(m["engagement"], maxArbiterName); !ok {
		return Verdict{}, invalid("a verdict names the engagement it was handed")
	}
	if w.Dispute, ok = jsonv.Text(m["dispute"], maxArbiterName); !ok {
		return Verdict{}, invalid("a verdict names the dispute it concludes")
	}
	disputed, err := object(m["disputed"], "disputed is an object {currency, amount}")
	if err != nil {
		return Verdict{}, err
	}
	if err := unknown(disputed, "disputed", "currency", "amount"); err != nil {
		return Verdict{}, err
	}
	if w.Currency, _ = disputed["currency"].(string); !protocol.IsCurrency(w.Currency) {
		return Verdict{}, invalid("disputed.currency is a three-letter uppercase code")
	}
	if w.Amount, ok = jsonv.NonNegInt(disputed["amount"]); !ok {
		return Verdict{}, invalid("disputed.amount is a non-negative integer in the smallest unit of the currency")
	}
	split, err := object(m["split"], "split is an object {provider, client}")
	if err != nil {
		return Verdict{}, err
	}
	if err := unknown(split, "split", "provider", "client"); err != nil {
		return Verdict{}, err
	}
	var okP, okC bool
	w.SplitProvider, okP = jsonv.NonNegInt(split["provider"])
	w.SplitClient, okC = jsonv.NonNegInt(split["client"])
	if !okP || !okC {
		return Verdict{}, invalid("split.provider and split.client are non-negative integers: the answer runs from full release to full refund, and a negative share is authority nobody granted")
	}
	if w.SplitProvider+w.SplitClient != w.Amount {
		return Verdict{}, invalid("split.provider + split.client must equal disputed.amount exactly: money divides by integers, nothing left over, nothing invented")
	}
	if exp != nil {
		if exp.DisputedAmount != nil && w.Amount != *exp.DisputedAmount {
			return Verdict{}, invalid("the verdict's disputed amount is not the amount this dispute was opened against; the parties granted authority over that amount and nothing else (§5.10.2)")
		}
		if exp.Currency != "" && w.Currency != exp.Currency {
			return Verdict{}, invalid("the verdict's currency is not the engagement's; a split in other money divides nothing this clause froze (§5.10.2)")
		}
	}
	if w.Attribution, ok = jsonv.Text(m["attribution"], maxArbiterName); !ok {
		return Verdict{}, invalid("attribution names a failure from the failure vocabulary, not blank")
	}
	if err := verdictBasis(m["basis"]); err != nil {
		return Verdict{}, err
	}
	heard, err := object(m["heard"], "heard is an object {provider, client}")
	if err != nil {
		return Verdict{}, err
	}
	if err := unknown(heard, "heard", "provider", "client"); err != nil {
		return Verdict{}, err
	}
	_, okP = heard["provider"].(bool)
	_, okC = heard["client"].(bool)
	if !okP || !okC {
		return Verdict{}, invalid("heard carries both booleans: an absent one is not a recorded silence, it is a verdict that did not say")
	}
	if _, ok := jsonv.Text(m["reasons"], 0); !ok {
		return Verdict{}, invalid("reasons is the prose a person reads, not blank")
	}
	w.ProducedAt, _ = m["produced_at"].(string)
	if _, err := protocol.ParseTime(w.ProducedAt); err != nil {
		return Verdict{}, invalid("produced_at is an RFC 3339 instant: a late verdict is not a verdict")
	}
	if w.By, _ = m["by"].(string); !keys.IsUserPublicKey(w.By) {
		return Verdict{}, invalid("by is the arbiter agent's public key")
	}
	if raw, present := m["signatures"]; present {
		list, ok := jsonv.Array(raw)
		if !ok {
			return Verdict{}, invalid("signatures is a list")
		}
		for _, item := range list {
			s, err := object(item, "a verdict signature is an object {key, signed_at, sig}")
			if err != nil {
				return Verdict{}, err
			}
			if err := unknown(s, "a verdict signature", "key", "signed_at", "sig"); err != nil {
				return Verdict{}, err
			}
			var vs VerdictSignature
			vs.Key, _ = s["key"].(string)
			vs.SignedAt, _ = s["signed_at"].(string)
			vs.Sig, _ = s["sig"].(string)
			if _, err := protocol.ParseTime(vs.SignedAt); !keys.IsUserPublicKey(vs.Key) || err != nil || vs.Sig == "" {
				return Verdict{}, invalid("a verdict signature carries the signer's key, an RFC 3339 signed_at and its sig")
			}
			w.Signatures = append(w.Signatures, vs)
		}
	}
	return w, nil
}

func verdictBasis(raw any) error {
	b, err := object(raw, "basis is an object {count, ids_sha256, excluded?}: no cited basis, no conforming verdict")
	if err != nil {
		return err
	}
	if err := unknown(b, "basis", "count", "ids_sha256", "excluded"); err != nil {
		return err
	}
	if _, ok := jsonv.NonNegInt(b["count"]); !ok {
		return invalid("basis.count is a non-negative integer")
	}
	if s, _ := b["ids_sha256"].(string); !sha256HexRE.MatchString(s) {
		return invalid("basis.ids_sha256 is exactly 64 lowercase hex characters: SHA-256 over the JCS array of the sorted record ids")
	}
	raw, present := b["excluded"]
	if !present {
		return nil
	}
	list, ok := jsonv.Array(raw)
	switch {
	case !ok:
		return invalid("excluded is a list of the records left out, each with its reason")
	case len(list) == 0:
		return invalid("an empty excluded list declares nothing, which omitting the member already means")
	}
	for _, item := range list {
		e, err := object(item, "each exclusion is an object {id, why}")
		if err != nil {
			return err
		}
		if err := unknown(e, "an exclusion", "id", "why"); err != nil {
			return err
		}
		if _, ok := jsonv.Text(e["id"], maxArbiterName); !ok {
			return invalid("an exclusion names the record it excludes")
		}
		if _, ok := jsonv.Text(e["why"], 0); !ok {
			return invalid("an exclusion carries its reason: excluded and unexplained is indistinguishable from suppressed")
		}
	}
	return nil
}

// BasisDigest is what basis.ids_sha256 commits to: lowercase hex SHA-256
// over the canonical JSON array of the record ids ruled from, sorted (in
// UTF-16 order, as every other implementation sorts).
func BasisDigest(ids []string) (string, error) {
	sorted := slices.Clone(ids)
	slices.SortFunc(sorted, protocol.CompareUTF16)
	c, err := protocol.Canonical(sorted)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(c)
	return hex.EncodeToString(sum[:]), nil
}

// VerdictSignedBytes are the bytes an arbiter signs.
func VerdictSignedBytes(verdict any) ([]byte, error) {
	return taggedBytes(VerdictTag, verdict, "signatures")
}

// SignVerdict signs a verdict with the arbiter's key.
func SignVerdict(verdict any, k keys.Signer, signedAt time.Time) (VerdictSignature, error) {
	msg, err := VerdictSignedBytes(verdict)
	if err != nil {
		return VerdictSignature{}, err
	}
	return VerdictSignature{Key: k.Public(), SignedAt: signedAt.UTC().Format(time.RFC3339), Sig: protocol.Base64URL.Encode(k.Sign(msg))}, nil
}

// VerifyVerdict checks that the verdict carries a signature by its own
// arbiter (by) over its bytes: where clearing honours the clause, this is
// what money moves on.
func VerifyVerdict(w Verdict) error {
	msg, err := VerdictSignedBytes(w.Value)
	if err != nil {
		return errs.Wrap(errs.IdentityMismatch, "verdict cannot be canonicalised for verification", err)
	}
	for _, s := range w.Signatures {
		if s.Key == w.By && protocol.VerifyString(s.Key, msg, s.Sig, protocol.Base64URL) == nil {
			return nil
		}
	}
	return errs.New(errs.IdentityMismatch, "the verdict carries no signature by its arbiter that verifies")
}
